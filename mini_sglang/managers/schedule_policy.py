"""SchedulePolicy (which waiting request goes first) and PrefillAdder (how many fit).

Policies (SGLang's): fcfs (arrival order), lof (longest output first), random, and the
cache-aware lpm (longest cached prefix first) and dfs-weight (walk the radix tree, most
waiting requests per subtree first). Cache-aware policies fall back to fcfs without a radix
cache, and lpm also beyond 128 queued requests (prefix matching every request is costly).

PrefillAdder admits requests under three budgets:
  rem_total_tokens  free + evictable KV minus what running requests are expected to still
                    need: min(max_new - generated, CLIP) * new_token_ratio each
  rem_input_tokens  --max-prefill-tokens per batch (the first request always fits)
  rem_chunk_tokens  --chunked-prefill-size; a longer prompt is truncated to a chunk and
                    becomes the (single) chunked request, continued next round
With --enable-mixed-chunk the running decodes ride in the same forward, one token each:
`mixed_with_decode_tokens` (their count) comes off the input and chunk budgets and is held
back from both memory budgets (SGLang's accounting).
"""

from __future__ import annotations

import random
from collections import defaultdict
from enum import Enum, auto
from typing import TYPE_CHECKING

from mini_sglang.environ import envs

if TYPE_CHECKING:
    from mini_sglang.managers.req import Req
    from mini_sglang.managers.schedule_batch import ScheduleBatch

CLIP_MAX_NEW_TOKENS = envs.SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION.get()
LPM_FALLBACK_QUEUE_LEN = 128

CACHE_AWARE = ("lpm", "dfs-weight")
CACHE_AGNOSTIC = ("fcfs", "lof", "random", "priority")


class AddReqResult(Enum):
    CONTINUE = auto()  # there is budget for more
    NO_TOKEN = auto()  # out of KV memory
    OTHER = auto()  # out of prefill / chunk budget


class SchedulePolicy:
    def __init__(self, policy: str, tree_cache) -> None:
        if policy not in CACHE_AWARE + CACHE_AGNOSTIC:
            raise ValueError(f"Unknown schedule policy {policy!r}")
        if policy in CACHE_AWARE and getattr(tree_cache, "disable", False):
            policy = "fcfs"
        self.policy = policy
        self.tree_cache = tree_cache

    def calc_priority(self, waiting_queue: list[Req]) -> bool:
        """Reorder waiting_queue in place; True if prefixes were matched on the way."""
        policy = self.policy
        if policy == "lpm" and len(waiting_queue) > LPM_FALLBACK_QUEUE_LEN:
            policy = "fcfs"
        if policy == "fcfs":
            return False
        if policy == "lof":
            waiting_queue.sort(key=lambda r: -(r.sampling_params.max_new_tokens or 0))
            return False
        if policy == "random":
            random.shuffle(waiting_queue)
            return False
        if policy == "priority":
            return False
        for r in waiting_queue:
            r.init_next_round_input(self.tree_cache)
        if policy == "lpm":
            waiting_queue.sort(key=lambda r: -len(r.prefix_indices))
        else:
            self._sort_by_dfs_weight(waiting_queue)
        return True

    def _sort_by_dfs_weight(self, waiting_queue: list[Req]) -> None:
        by_node = defaultdict(list)
        for r in waiting_queue:
            by_node[r.last_node].append(r)
        weight: dict = defaultdict(int)
        for node, reqs in by_node.items():
            weight[node] += len(reqs)
        root = self.tree_cache.root_node

        # Weights flow up so a subtree's weight counts every request waiting below it.
        def accumulate(node) -> int:
            total = weight.get(node, 0) + sum(accumulate(c) for c in node.children.values())
            weight[node] = total
            return total

        accumulate(root)
        ordered: list[Req] = []

        def visit(node) -> None:
            ordered.extend(by_node.get(node, []))
            for child in sorted(node.children.values(), key=lambda c: -weight[c]):
                visit(child)

        visit(root)
        waiting_queue[:] = ordered


class PrefillAdder:
    def __init__(
        self,
        page_size: int,
        tree_cache,
        allocator,
        running_batch: ScheduleBatch | None,
        new_token_ratio: float,
        rem_input_tokens: int,
        rem_chunk_tokens: int | None,
        mixed_with_decode_tokens: int = 0,
    ) -> None:
        self.page_size = page_size
        self.tree_cache = tree_cache
        self.allocator = allocator
        self.new_token_ratio = new_token_ratio
        self.rem_input_tokens = rem_input_tokens - mixed_with_decode_tokens
        self.rem_chunk_tokens = rem_chunk_tokens
        if rem_chunk_tokens is not None:
            self.rem_chunk_tokens = rem_chunk_tokens - mixed_with_decode_tokens
        self.rem_total_token_offset = float(mixed_with_decode_tokens)
        self.cur_rem_token_offset = mixed_with_decode_tokens
        self.can_run_list: list[Req] = []
        self.new_chunked_req: Req | None = None
        self.log_hit_tokens = 0
        self.log_input_tokens = 0
        if running_batch is not None:
            self.rem_total_token_offset += sum(
                min(r.sampling_params.max_new_tokens - len(r.output_ids), CLIP_MAX_NEW_TOKENS)
                * new_token_ratio
                for r in running_batch.reqs
            )

    def _available(self) -> int:
        return self.allocator.available_size() + self.tree_cache.evictable_size()

    @property
    def rem_total_tokens(self) -> float:
        return self._available() - self.rem_total_token_offset

    @property
    def cur_rem_tokens(self) -> int:
        return self._available() - self.cur_rem_token_offset

    def ceil_paged_tokens(self, tokens: int) -> int:
        return -(-tokens // self.page_size) * self.page_size

    def budget_state(self) -> AddReqResult:
        if self.rem_total_tokens <= 0 or self.cur_rem_tokens <= 0:
            return AddReqResult.NO_TOKEN
        if self.rem_input_tokens <= 0 or (
            self.rem_chunk_tokens is not None and self.rem_chunk_tokens <= 0
        ):
            return AddReqResult.OTHER
        return AddReqResult.CONTINUE

    def _update_budget(self, prefix_len: int, extend_len: int, max_new_tokens: int) -> None:
        extend_len = self.ceil_paged_tokens(extend_len)
        self.rem_total_token_offset += extend_len + max_new_tokens
        self.cur_rem_token_offset += extend_len
        self.rem_input_tokens -= extend_len
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= extend_len
        self.log_hit_tokens += prefix_len
        self.log_input_tokens += extend_len

    def add_chunked_req(self, req: Req) -> Req | None:
        """Continue the chunked request; returns it again if it still is not done."""
        budget = int(min(self.rem_chunk_tokens, self.rem_total_tokens))
        truncated = req.extend_input_len > budget
        req.extend_input_len = min(req.extend_input_len, budget)
        req.fill_ids = req.fill_ids[: len(req.prefix_indices) + req.extend_input_len]
        self.can_run_list.append(req)
        self._update_budget(
            0,
            req.extend_input_len,
            0 if truncated else min(req.sampling_params.max_new_tokens, CLIP_MAX_NEW_TOKENS),
        )
        return req if truncated else None

    def add_waiting_reqs(self, waiting_queue: list[Req], max_new_reqs: int) -> bool:
        """Admit requests from the head of `waiting_queue` (not changed here) until a budget
        runs out, the batch holds `max_new_reqs` requests, or one gets chunked. True when
        KV memory stopped it before anything was admitted."""
        for req in waiting_queue:
            if len(self.can_run_list) >= max_new_reqs:
                break
            req.init_next_round_input(self.tree_cache)
            result = self.add_one_req(req)
            if result != AddReqResult.CONTINUE:
                return result == AddReqResult.NO_TOKEN and not self.can_run_list
            if self.new_chunked_req is not None:
                break
        return False

    def add_one_req(self, req: Req) -> AddReqResult:
        max_new = req.sampling_params.max_new_tokens
        total_tokens = req.extend_input_len + min(
            max(max_new - len(req.output_ids), 0), CLIP_MAX_NEW_TOKENS
        )
        input_tokens = self.ceil_paged_tokens(req.extend_input_len)
        prefix_len = len(req.prefix_indices)
        if total_tokens >= self.rem_total_tokens:
            return AddReqResult.NO_TOKEN
        if input_tokens >= self.rem_input_tokens and self.can_run_list:
            return AddReqResult.OTHER
        # Lock first so the matched prefix cannot be evicted by what we admit next; the
        # lock is released by cache_(un)finished_req when the request moves on.
        self.tree_cache.inc_lock_ref(req.last_node)
        if total_tokens >= self.rem_total_tokens:
            self.tree_cache.dec_lock_ref(req.last_node)
            return AddReqResult.NO_TOKEN
        if self.rem_chunk_tokens is None or input_tokens <= self.rem_chunk_tokens:
            self.can_run_list.append(req)
            self._update_budget(prefix_len, input_tokens, min(max_new, CLIP_MAX_NEW_TOKENS))
        else:
            trunc_len = self.rem_chunk_tokens // self.page_size * self.page_size
            if trunc_len <= 0:
                self.tree_cache.dec_lock_ref(req.last_node)
                return AddReqResult.OTHER
            req.extend_input_len = trunc_len
            req.fill_ids = req.fill_ids[: prefix_len + trunc_len]
            self.can_run_list.append(req)
            self.new_chunked_req = req
            self._update_budget(prefix_len, trunc_len, 0)
        return self.budget_state()
