"""SGLang's scheduler log lines, the idle memory self-check and internal state for
/get_server_info."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from mini_sglang.managers.schedule_policy import PrefillAdder

logger = logging.getLogger("mini_sglang")


class SchedulerMetricsMixin:
    def init_metrics(self) -> None:
        self.num_generated_tokens = 0
        self.num_retracted_reqs = 0
        self.last_gen_throughput = 0.0
        self._last_decode_log = time.perf_counter()
        self._decode_steps = 0
        self._logged_no_token = False
        self.is_idle_checked = True
        self.memory_check_failures = 0
        self.cur_batch = None

    def available_mem_str(self) -> str:
        if self.device.type == "cuda":
            return f"{torch.cuda.mem_get_info(self.device)[0] / (1 << 30):.2f} GB"
        return "n/a (cpu)"

    def token_usage(self) -> float:
        used = self.max_total_num_tokens - self.allocator.available_size()
        used -= self.tree_cache.evictable_size()
        return used / self.max_total_num_tokens

    def log_no_token_once(self) -> None:
        if not self._logged_no_token:
            logger.debug("Prefill is waiting: not enough KV memory for the next request.")
            self._logged_no_token = True

    def log_prefill_stats(self, adder: PrefillAdder, running_bs: int) -> None:
        self._logged_no_token = False
        logger.info(
            "Prefill batch. #new-seq: %d, #new-token: %d, #cached-token: %d, "
            "token usage: %.2f, #running-req: %d, #queue-req: %d",
            len(adder.can_run_list),
            adder.log_input_tokens,
            adder.log_hit_tokens,
            self.token_usage(),
            running_bs,
            len(self.waiting_queue),
        )

    def maybe_report_metrics(self) -> None:
        batch = self.cur_batch
        if batch is None or not batch.forward_mode.is_decode():
            return
        self._decode_steps += 1
        if self._decode_steps % self.server_args.decode_log_interval:
            return
        now = time.perf_counter()
        self.last_gen_throughput = self.num_generated_tokens / max(
            now - self._last_decode_log, 1e-9
        )
        self.num_generated_tokens = 0
        self._last_decode_log = now
        num_used = self.max_total_num_tokens - self.allocator.available_size()
        num_used -= self.tree_cache.evictable_size()
        logger.info(
            "Decode batch. #running-req: %d, #token: %d, token usage: %.2f, "
            "gen throughput (token/s): %.2f, #queue-req: %d",
            len(batch.reqs),
            num_used,
            self.token_usage(),
            self.last_gen_throughput,
            len(self.waiting_queue),
        )

    def num_running_reqs(self) -> int:
        """Requests holding KV between steps: the running batch plus the last prefill (or
        mixed) batch's unfinished, non-chunked requests, which join it when the next batch
        forms (after a mixed step that is every running request)."""
        n = len(self.running_batch.reqs) if self.running_batch is not None else 0
        last = self.last_batch
        if last is not None and last.forward_mode.is_extend():
            n += sum(1 for r in last.reqs if not r.finished() and r is not self.chunked_req)
        return n

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

    def internal_state(self) -> dict[str, Any]:
        r = self.tp_worker.model_runner
        return {
            "last_gen_throughput": self.last_gen_throughput,
            "memory_usage": {
                "weight": round(r.weight_gib, 2),
                "kvcache": round(r.kv_cache_gib, 2),
                "token_capacity": self.max_total_num_tokens,
                "graph": round(getattr(r, "graph_mem_gib", 0.0), 2),
            },
            "num_retracted_reqs": self.num_retracted_reqs,
            "num_running_reqs": self.num_running_reqs(),
            "num_queue_reqs": len(self.waiting_queue),
            "num_used_tokens": self.max_total_num_tokens
            - self.allocator.available_size()
            - self.tree_cache.evictable_size(),
            "token_usage": round(self.token_usage(), 4),
            "memory_check_failures": self.memory_check_failures,
            "max_total_num_tokens": self.max_total_num_tokens,
            "max_req_input_len": self.max_req_input_len,
            "memory_accounting": self.memory_accounting(),
        }
