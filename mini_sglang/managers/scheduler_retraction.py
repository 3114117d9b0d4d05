"""Retraction: the scheduler's decode-memory policy (SGLang's). It owns the new_token_ratio
estimate, the fraction of each running request's remaining max_new_tokens that prefill
admission holds back for it, and retracts requests when the next decode step does not fit.

Contract: `retract(batch)` picks requests of the running `batch` to give way (their KV
freed, their state reset for a re-prefill) and returns them with the rows to keep; the
scheduler filters the batch to those rows and puts the retracted requests back at the head
of its waiting queue. The ratio starts at its initial value, `decay()` lowers it by one step
after each decode step down to its floor, a retraction re-estimates it from what the remaining
requests need, and `reset()` restores it (idle, flush_cache).

Worked example (defaults, schedule_conservativeness 1): the ratio starts at 0.7 with a floor
of 0.7 * 0.14 = 0.098, and decays by (0.7 - 0.098) / 600 per decode step. A retraction
that leaves 2 requests with 30 decoded of 200 max_new_tokens in total sets it to
(30 + 20 * 2) / 200 = 0.35.
"""

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

INIT_NEW_TOKEN_RATIO = envs.SGLANG_INIT_NEW_TOKEN_RATIO.get()
MIN_NEW_TOKEN_RATIO_FACTOR = envs.SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR.get()
NEW_TOKEN_RATIO_DECAY_STEPS = envs.SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS.get()
RETRACT_DECODE_STEPS = envs.SGLANG_RETRACT_DECODE_STEPS.get()


class Retraction:
    def __init__(
        self,
        schedule_conservativeness: float,
        req_to_token_pool,
        allocator,
        tree_cache,
        page_size: int,
    ) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.allocator = allocator
        self.tree_cache = tree_cache
        self.page_size = page_size
        self.init_new_token_ratio = min(INIT_NEW_TOKEN_RATIO * schedule_conservativeness, 1.0)
        self.min_new_token_ratio = self.init_new_token_ratio * MIN_NEW_TOKEN_RATIO_FACTOR
        self.new_token_ratio_decay = (
            self.init_new_token_ratio - self.min_new_token_ratio
        ) / NEW_TOKEN_RATIO_DECAY_STEPS
        self.new_token_ratio = self.init_new_token_ratio

    def decay(self) -> None:
        """After a decode step (SGLang decays on decode steps only; mixed steps leave it)."""
        self.new_token_ratio = max(
            self.new_token_ratio - self.new_token_ratio_decay, self.min_new_token_ratio
        )

    def reset(self) -> None:
        self.new_token_ratio = self.init_new_token_ratio

    def retract(self, batch: ScheduleBatch) -> tuple[list[Req], list[int]]:
        """SGLang's retraction: drop requests with the fewest output tokens (the longest
        prompt first among equals) until the next decode step fits; at least one goes.
        Returns the retracted requests and the batch rows to keep (ascending), and
        re-estimates new_token_ratio from the kept requests."""
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
            self._release_req_kv(req, int(batch.seq_lens[idx]))
            # Use what the release made evictable right away.
            self.tree_cache.evict(len(order) * RETRACT_DECODE_STEPS)
            req.reset_for_retract()
            retracted.append(req)
        keep = sorted(order)
        kept = [reqs[i] for i in keep]
        total_decoded = sum(len(r.output_ids) for r in kept)
        total_max_new = sum(r.sampling_params.max_new_tokens for r in kept)
        ratio = (total_decoded + RETRACT_DECODE_STEPS * len(kept)) / max(total_max_new, 1)
        self.new_token_ratio = min(1.0, ratio)
        logger.warning(
            "KV cache pool is full. Retract requests. #retracted_reqs: %d, "
            "#new_token_ratio: %.4f -> %.4f",
            len(retracted),
            self.init_new_token_ratio,
            self.new_token_ratio,
        )
        return retracted, keep

    def _decode_fits(self, num_reqs: int) -> bool:
        need = num_reqs * self.page_size
        if self.allocator.available_size() < need:
            self.tree_cache.evict(need)
        return self.allocator.available_size() >= need

    def _release_req_kv(self, req: Req, kv_len: int) -> None:
        """Free a running request's own KV (beyond its cached prefix) and its slot."""
        table = self.req_to_token_pool.req_to_token
        start = len(req.prefix_indices) // self.page_size * self.page_size
        if isinstance(self.tree_cache, ChunkCache):
            start = 0
        self.allocator.free(table[req.req_pool_idx, start:kv_len].to(torch.int64))
        self.req_to_token_pool.free(req.req_pool_idx)
        self.tree_cache.dec_lock_ref(req.last_node)
