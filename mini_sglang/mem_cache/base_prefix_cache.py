"""The interface every prefix cache (RadixCache, ChunkCache) offers the scheduler.

A request (`managers.schedule_batch.Req`) exposes to the cache:
  origin_input_ids, output_ids  token lists
  fill_ids                      tokens whose KV is (or is about to be) in the pool
  req_pool_idx                  its row in ReqToTokenPool.req_to_token
  prefix_indices                int64 tensor: KV slots of the cached prefix it reuses
  last_node                     tree node locked on its behalf (None for ChunkCache)
  cached_tokens                 prompt tokens served from the cache (meta_info)

Accounting contract (checked when the scheduler is idle):
  allocator.available_size() + evictable_size() + protected_size() + in-use == capacity
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

if TYPE_CHECKING:
    from mini_sglang.managers.schedule_batch import Req


@dataclass
class MatchResult:
    """device_indices: KV slots of the longest cached prefix; last_device_node: its node."""

    device_indices: torch.Tensor
    last_device_node: Any


class BasePrefixCache(Protocol):
    page_size: int

    def reset(self) -> None: ...

    def match_prefix(self, key: list[int]) -> MatchResult:
        """Longest cached prefix of `key` (at most len(key)-1 tokens, page-aligned)."""
        ...

    def cache_finished_req(self, req: Req) -> None:
        """Insert the finished request's KV, free its duplicate slots and its request slot,
        and unlock its node."""
        ...

    def cache_unfinished_req(self, req: Req) -> None:
        """Insert the KV of req.fill_ids (a finished prefill chunk), then re-point
        req.prefix_indices / req.last_node at the tree so the next chunk builds on it."""
        ...

    def evict(self, num_tokens: int) -> int:
        """Free at least num_tokens slots from unlocked leaves if possible; returns freed."""
        ...

    def inc_lock_ref(self, node: Any) -> int: ...

    def dec_lock_ref(self, node: Any) -> int: ...

    def evictable_size(self) -> int: ...

    def protected_size(self) -> int: ...

    def total_size(self) -> int: ...
