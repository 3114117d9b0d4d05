"""ChunkCache: the prefix cache used with --disable-radix-cache.

It shares nothing between requests; it only keeps a chunked request's own KV between its
prefill chunks, and frees everything when the request finishes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from mini_sglang.mem_cache.base_prefix_cache import MatchResult

if TYPE_CHECKING:
    from mini_sglang.managers.schedule_batch import Req
    from mini_sglang.mem_cache.allocator import TokenToKVPoolAllocator
    from mini_sglang.mem_cache.memory_pool import ReqToTokenPool


class ChunkCache:
    def __init__(
        self,
        req_to_token_pool: ReqToTokenPool,
        token_to_kv_pool_allocator: TokenToKVPoolAllocator,
        page_size: int = 1,
    ) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.page_size = page_size
        self.disable = True

    def reset(self) -> None:
        pass

    def match_prefix(self, key: list[int]) -> MatchResult:
        return MatchResult(torch.empty((0,), dtype=torch.int64), None)

    def cache_finished_req(self, req: Req) -> None:
        # The KV of every token but the last sampled one was written (that one never ran).
        kv_len = len(req.origin_input_ids) + max(len(req.output_ids) - 1, 0)
        kv_indices = self.req_to_token_pool.req_to_token[req.req_pool_idx, :kv_len]
        self.token_to_kv_pool_allocator.free(kv_indices.to(torch.int64))
        self.req_to_token_pool.free(req.req_pool_idx)

    def cache_unfinished_req(self, req: Req) -> None:
        kv_indices = self.req_to_token_pool.req_to_token[req.req_pool_idx, : len(req.fill_ids)]
        req.prefix_indices = kv_indices.to(torch.int64)

    def evict(self, num_tokens: int) -> int:
        return 0

    def inc_lock_ref(self, node: object) -> int:
        return 0

    def dec_lock_ref(self, node: object) -> int:
        return 0

    def evictable_size(self) -> int:
        return 0

    def protected_size(self) -> int:
        return 0

    def total_size(self) -> int:
        return 0
