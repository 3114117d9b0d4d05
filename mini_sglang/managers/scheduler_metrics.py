"""SchedulerStats: the scheduler's counters and SGLang's scheduler log lines ("Prefill
batch.", "Decode batch."), the idle memory self-check, and the internal state for
/get_server_info.

Contract: the stats read the KV pools and the prefix cache but change nothing the scheduler
schedules with; what they need of the queues (their lengths, the running count) is passed
in. The scheduler bumps the counters (num_generated_tokens, num_retracted_reqs, ...) and
calls `on_step(batch, waiting_queue)` after every step.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from mini_sglang.managers.schedule_policy import PrefillAdder

logger = logging.getLogger("mini_sglang")


class SchedulerStats:
    def __init__(
        self,
        decode_log_interval: int,
        model_runner: Any,
        req_to_token_pool: Any,
        allocator: Any,
        tree_cache: Any,
        max_total_num_tokens: int,
        max_req_input_len: int,
        device: torch.device,
    ) -> None:
        self.decode_log_interval = decode_log_interval
        self.model_runner = model_runner
        self.req_to_token_pool = req_to_token_pool
        self.allocator = allocator
        self.tree_cache = tree_cache
        self.max_total_num_tokens = max_total_num_tokens
        self.max_req_input_len = max_req_input_len
        self.device = device
        self.num_generated_tokens = 0  # decode tokens since the last "Decode batch." line
        self.num_retracted_reqs = 0
        self.num_mixed_batches = 0  # forwards that ran prefill and decode rows together
        self.num_mixed_decode_rows = 0  # decode rows those forwards carried
        self.last_gen_throughput = 0.0
        self.memory_check_failures = 0
        self._last_decode_log = time.perf_counter()
        self._decode_steps = 0
        self._logged_no_token = False

    def available_mem_str(self) -> str:
        if self.device.type == "cuda":
            return f"{torch.cuda.mem_get_info(self.device)[0] / (1 << 30):.2f} GB"
        return "n/a (cpu)"

    def token_usage(self) -> float:
        return self.num_used_tokens() / self.max_total_num_tokens

    def log_no_token_once(self) -> None:
        if not self._logged_no_token:
            logger.debug("Prefill is waiting: not enough KV memory for the next request.")
            self._logged_no_token = True

    def log_prefill(self, adder: PrefillAdder, running_bs: int, num_queue_reqs: int) -> None:
        self._logged_no_token = False
        logger.info(
            "Prefill batch. #new-seq: %d, #new-token: %d, #cached-token: %d, "
            "token usage: %.2f, #running-req: %d, #queue-req: %d",
            len(adder.can_run_list),
            adder.log_input_tokens,
            adder.log_hit_tokens,
            self.token_usage(),
            running_bs,
            num_queue_reqs,
        )

    def on_step(self, batch: Any, waiting_queue: list) -> None:
        """After each step (`batch` None when idle): every decode_log_interval decode steps,
        the "Decode batch." line with the throughput since the last one."""
        if batch is None or not batch.forward_mode.is_decode():
            return
        self._decode_steps += 1
        if self._decode_steps % self.decode_log_interval:
            return
        now = time.perf_counter()
        self.last_gen_throughput = self.num_generated_tokens / max(
            now - self._last_decode_log, 1e-9
        )
        self.num_generated_tokens = 0
        self._last_decode_log = now
        logger.info(
            "Decode batch. #running-req: %d, #token: %d, token usage: %.2f, "
            "gen throughput (token/s): %.2f, #queue-req: %d",
            len(batch.reqs),
            self.num_used_tokens(),
            self.token_usage(),
            self.last_gen_throughput,
            len(waiting_queue),
        )

    def num_used_tokens(self) -> int:
        """KV slots held by requests (neither free nor evictable cache)."""
        return (
            self.max_total_num_tokens
            - self.allocator.available_size()
            - self.tree_cache.evictable_size()
        )

    def memory_accounting(self) -> dict[str, int]:
        return {
            "free": self.allocator.available_size(),
            "evictable": self.tree_cache.evictable_size(),
            "protected": self.tree_cache.protected_size(),
            "capacity": self.max_total_num_tokens,
            "free_req_slots": self.req_to_token_pool.available_size(),
            "req_slots": self.req_to_token_pool.size,
        }

    def check_memory(self) -> bool:
        """Idle self-check: with nothing running, free + evictable + protected == capacity
        and every request slot is free. A violation is a leak, logged loudly."""
        m = self.memory_accounting()
        ok = m["free"] + m["evictable"] + m["protected"] == m["capacity"]
        ok = ok and m["protected"] == 0 and m["free_req_slots"] == m["req_slots"]
        if not ok:
            self.memory_check_failures += 1
            logger.error(
                "Memory leak detected when idle! free=%d, evictable=%d, protected=%d, "
                "capacity=%d, free req slots=%d/%d",
                m["free"],
                m["evictable"],
                m["protected"],
                m["capacity"],
                m["free_req_slots"],
                m["req_slots"],
            )
        return ok

    def internal_state(self, num_running_reqs: int, num_queue_reqs: int) -> dict[str, Any]:
        r = self.model_runner
        return {
            "last_gen_throughput": self.last_gen_throughput,
            "memory_usage": {
                "weight": round(r.weight_gib, 2),
                "kvcache": round(r.kv_cache_gib, 2),
                "token_capacity": self.max_total_num_tokens,
                "graph": round(getattr(r, "graph_mem_gib", 0.0), 2),
            },
            "num_retracted_reqs": self.num_retracted_reqs,
            "num_running_reqs": num_running_reqs,
            "num_queue_reqs": num_queue_reqs,
            "num_used_tokens": self.num_used_tokens(),
            "token_usage": round(self.token_usage(), 4),
            "memory_check_failures": self.memory_check_failures,
            "max_total_num_tokens": self.max_total_num_tokens,
            "max_req_input_len": self.max_req_input_len,
            "memory_accounting": self.memory_accounting(),
        }
