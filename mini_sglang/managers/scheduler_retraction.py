"""Decode-time memory: make room for the next decode step, retracting requests when the
KV pool runs out (SGLang's policy and its new_token_ratio re-estimate)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from mini_sglang.environ import envs
from mini_sglang.mem_cache.chunk_cache import ChunkCache

if TYPE_CHECKING:
    from mini_sglang.managers.req import Req
    from mini_sglang.managers.schedule_batch import ScheduleBatch

logger = logging.getLogger("mini_sglang")

RETRACT_DECODE_STEPS = envs.SGLANG_RETRACT_DECODE_STEPS.get()


class SchedulerRetractionMixin:
    def update_running_batch(self, batch: ScheduleBatch) -> None:
        """Make room for one more token per request (retracting if needed), then prepare."""
        if not batch.check_decode_mem():
            retracted, self.new_token_ratio = self.retract_decode(batch)
            self.num_retracted_reqs += len(retracted)
            logger.warning(
                "KV cache pool is full. Retract requests. #retracted_reqs: %d, "
                "#new_token_ratio: %.4f -> %.4f",
                len(retracted),
                self.init_new_token_ratio,
                self.new_token_ratio,
            )
            self.waiting_queue = retracted + self.waiting_queue
            if batch.is_empty():
                return
        batch.prepare_for_decode()

    def retract_decode(self, batch: ScheduleBatch) -> tuple[list[Req], float]:
        """SGLang's retraction: drop requests with the fewest output tokens (the longest
        prompt first among equals) until the next decode step fits; at least one goes.
        Returns the retracted requests and the new new_token_ratio estimate."""
        reqs = batch.reqs
        order = sorted(
            range(len(reqs)),
            key=lambda i: (len(reqs[i].output_ids), -len(reqs[i].origin_input_ids)),
            reverse=True,
        )
        retracted: list[Req] = []
        first = True
        while first or not self._decode_fits(len(order)):
            if len(order) == 1:
                break
            first = False
            idx = order.pop()
            req = reqs[idx]
            self.release_req_kv(req, int(batch.seq_lens[idx]))
            # Use what the release made evictable right away.
            self.tree_cache.evict(len(order) * RETRACT_DECODE_STEPS)
            req.reset_for_retract()
            retracted.append(req)
        batch.filter_batch(sorted(order))
        total_decoded = sum(len(r.output_ids) for r in batch.reqs)
        total_max_new = sum(r.sampling_params.max_new_tokens for r in batch.reqs)
        ratio = (total_decoded + RETRACT_DECODE_STEPS * len(batch.reqs)) / max(total_max_new, 1)
        return retracted, min(1.0, ratio)

    def _decode_fits(self, num_reqs: int) -> bool:
        need = num_reqs * self.page_size
        if self.allocator.available_size() < need:
            self.tree_cache.evict(need)
        return self.allocator.available_size() >= need

    def release_req_kv(self, req: Req, kv_len: int) -> None:
        """Free a running request's own KV (beyond its cached prefix) and its slot."""
        table = self.req_to_token_pool.req_to_token
        start = len(req.prefix_indices) // self.page_size * self.page_size
        if isinstance(self.tree_cache, ChunkCache):
            start = 0
        self.allocator.free(table[req.req_pool_idx, start:kv_len].to(torch.int64))
        self.req_to_token_pool.free(req.req_pool_idx)
        self.tree_cache.dec_lock_ref(req.last_node)
