"""RadixCache: share KV between requests through a radix tree of token ids (SGLang's).

Every edge holds a run of token ids (`key`) and the KV slots of those tokens (`value`),
so the path from the root to a node spells a token prefix whose KV is in the pool. With
page_size > 1 only whole pages live in the tree: every key length is a multiple of
page_size and children are keyed by their first page.

Sizes: each cached token is either evictable (no running request holds its node) or
protected (some request locked the node with inc_lock_ref, which locks every ancestor
too). The tree owns one reference to its slots: evict() returns them to the allocator;
reset() forgets them (the caller clears the allocator too, as flush_cache does).

Worked example (page_size 1): insert([1,2,3], kv=[10,11,12]) then insert([1,2,4,5],
kv=[20,21,22,23]) returns 2 (tokens 1,2 were already present: the caller frees its
duplicate slots 20,21) and splits the edge [1,2,3] into [1,2] -> {[3], [4,5]}.
match_prefix([1,2,4,9]) then gives slots [10,11,22] and the node of edge [4,5].
"""

from __future__ import annotations

import heapq
import itertools
from typing import TYPE_CHECKING, Any

import torch

from mini_sglang.mem_cache.base_prefix_cache import MatchResult

if TYPE_CHECKING:
    from mini_sglang.managers.schedule_batch import Req
    from mini_sglang.mem_cache.allocator import BaseTokenToKVPoolAllocator
    from mini_sglang.mem_cache.memory_pool import ReqToTokenPool

# A logical clock instead of time.monotonic(): back-to-back operations can read the same
# monotonic time, which makes LRU order ambiguous; only the order matters.
_clock = itertools.count()


class TreeNode:
    """One edge of the radix tree (the node at its lower end)."""

    _ids = itertools.count()

    def __init__(self) -> None:
        self.children: dict[Any, TreeNode] = {}
        self.parent: TreeNode | None = None
        self.key: list[int] = []
        self.value: torch.Tensor = torch.empty((0,), dtype=torch.int64)
        self.extra_key: str | None = None
        self.lock_ref = 0
        self.last_access_time = next(_clock)
        self.hit_count = 0
        self.id = next(TreeNode._ids)

    def touch(self) -> None:
        self.last_access_time = next(_clock)

    def __repr__(self) -> str:
        return f"TreeNode(id={self.id}, key={self.key[:8]}, lock_ref={self.lock_ref})"


class RadixCache:
    """SGLang's radix prefix cache; implements the BasePrefixCache protocol.

    Keys are token-id lists; `extra_key` (e.g. a LoRA id or cache salt, read from
    req.extra_key when present) namespaces them: keys with different extra keys never
    share nodes. eviction_policy "lru" evicts the least recently used unlocked leaf
    first; "lfu" the least often matched one, ties broken by LRU.
    """

    def __init__(
        self,
        req_to_token_pool: ReqToTokenPool,
        token_to_kv_pool_allocator: BaseTokenToKVPoolAllocator,
        page_size: int,
        disable: bool = False,
        eviction_policy: str = "lru",
    ) -> None:
        if eviction_policy.lower() not in ("lru", "lfu"):
            raise ValueError(f"Unknown eviction policy: {eviction_policy!r} (lru, lfu)")
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.page_size = page_size
        self.disable = disable
        self.eviction_policy = eviction_policy.lower()
        self.device = token_to_kv_pool_allocator.device if token_to_kv_pool_allocator else "cpu"
        self.reset()

    # ------------------------------------------------------------------ public API

    def reset(self) -> None:
        """Drop the whole tree (its slots are not freed: the caller clears the allocator)."""
        self.root_node = TreeNode()
        self.root_node.lock_ref = 1  # the root is never evicted
        self.evictable_size_ = 0
        self.protected_size_ = 0

    def match_prefix(self, key: list[int], extra_key: str | None = None) -> MatchResult:
        """Longest cached prefix of the whole `key`, in whole pages.

        The caller limits the key: the scheduler passes at most len(fill_ids)-1 tokens
        (SGLang's max_prefix_len) so the last token is always recomputed for its logits.
        A match ending inside an edge splits it, so the returned node ends exactly at the
        match; lock it with inc_lock_ref before relying on the slots.
        """
        if self.disable or len(key) < self.page_size:
            return MatchResult(self._empty(), self.root_node)
        # Worked example, page_size 4: a 10-token key is truncated to 8 tokens (2 pages).
        key = list(key[: len(key) // self.page_size * self.page_size])
        values, node = self._match_prefix_helper(key, extra_key)
        return MatchResult(torch.cat(values) if values else self._empty(), node)

    def insert(
        self, key: list[int], value: torch.Tensor | None = None, extra_key: str | None = None
    ) -> int:
        """Insert key -> value (KV slots, one per token; len(key) page-aligned).

        Returns how many leading tokens were already cached: the caller owns
        value[:returned] and must free those duplicate slots (the tree keeps its own).
        """
        if self.disable:
            return 0
        if value is None:
            value = torch.tensor(key, dtype=torch.int64)
        assert len(key) == len(value), f"{len(key)=} != {len(value)=}"
        assert len(key) % self.page_size == 0, f"unaligned insert of {len(key)} tokens"
        return self._insert_helper(list(key), value.to(torch.int64), extra_key)

    def cache_finished_req(self, req: Req) -> None:
        """Hand a finished request's KV to the tree, free duplicates, its slot and lock.

        KV exists for origin_input_ids + output_ids[:-1] (the last sampled token never
        ran through the model). Only the page-aligned part is inserted; the unaligned tail
        (one partial page) is freed.
        """
        all_token_len = len(req.origin_input_ids) + max(len(req.output_ids) - 1, 0)
        kv_indices = self.req_to_token_pool.req_to_token[req.req_pool_idx, :all_token_len]
        kv_indices = kv_indices.to(dtype=torch.int64, copy=True)
        allocator = self.token_to_kv_pool_allocator
        if self.disable:
            allocator.free(kv_indices)
            self.req_to_token_pool.free(req.req_pool_idx)
            return

        token_ids = (req.origin_input_ids + req.output_ids)[:all_token_len]
        # Worked example, page_size 4: 14 tokens -> insert 12, free the page of tokens 12,13.
        aligned_len = all_token_len // self.page_size * self.page_size
        old_prefix_len = self._tree_prefix_len(req)
        new_prefix_len = self.insert(
            token_ids[:aligned_len], kv_indices[:aligned_len], getattr(req, "extra_key", None)
        )
        # Slots old_prefix_len..new_prefix_len duplicate what another request inserted
        # meanwhile (below old_prefix_len they came from the tree in the first place).
        allocator.free(kv_indices[old_prefix_len:new_prefix_len])
        allocator.free(kv_indices[aligned_len:])

        self.req_to_token_pool.free(req.req_pool_idx)
        self.dec_lock_ref(req.last_node)

    def cache_unfinished_req(self, req: Req) -> None:
        """Insert the KV of req.fill_ids (a finished prefill chunk) and re-point the request.

        Afterwards req.prefix_indices covers all of fill_ids (tree slots for the aligned
        part, then the request's own unaligned tail, which stays with the request and is
        freed by a later cache_*_req), req.last_node is the locked node of the aligned
        part, and req_to_token uses the tree's slots wherever they replaced duplicates.
        """
        if self.disable:
            return
        token_ids = req.fill_ids
        all_token_len = len(token_ids)
        kv_indices = self.req_to_token_pool.req_to_token[req.req_pool_idx, :all_token_len]
        kv_indices = kv_indices.to(dtype=torch.int64, copy=True)
        extra_key = getattr(req, "extra_key", None)

        aligned_len = all_token_len // self.page_size * self.page_size
        aligned_ids = token_ids[:aligned_len]
        old_prefix_len = self._tree_prefix_len(req)
        new_prefix_len = self.insert(aligned_ids, kv_indices[:aligned_len], extra_key)
        self.token_to_kv_pool_allocator.free(kv_indices[old_prefix_len:new_prefix_len])

        # The freed duplicates must not stay in req_to_token: point it at the tree's slots.
        match = self.match_prefix(aligned_ids, extra_key)
        new_indices = match.device_indices
        if len(new_indices) > old_prefix_len:
            self.req_to_token_pool.write(
                (req.req_pool_idx, slice(old_prefix_len, len(new_indices))),
                new_indices[old_prefix_len:],
            )

        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(match.last_device_node)
        # With page_size 1, aligned_len == all_token_len and the tail is empty.
        req.prefix_indices = torch.cat([new_indices, kv_indices[len(new_indices) :]])
        req.last_node = match.last_device_node

    def evict(self, num_tokens: int) -> int:
        """Free at least num_tokens slots from unlocked leaves, oldest (per policy) first.

        Evicting a leaf can expose its parent as a new leaf, which then competes too.
        Returns the number freed (less than asked when everything else is locked).
        """
        if self.disable or num_tokens <= 0:
            return 0
        heap = [(self._priority(n), n.id, n) for n in self._collect_leaves()]
        heapq.heapify(heap)
        num_evicted = 0
        while num_evicted < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            if node.lock_ref > 0:
                continue
            self.token_to_kv_pool_allocator.free(node.value)
            num_evicted += len(node.value)
            parent = self._delete_leaf(node)
            if parent is not self.root_node and not parent.children and parent.lock_ref == 0:
                heapq.heappush(heap, (self._priority(parent), parent.id, parent))
        return num_evicted

    def inc_lock_ref(self, node: TreeNode | None) -> int:
        """Lock node and its ancestors; returns the change in evictable size (<= 0)."""
        if self.disable or node is None:
            return 0
        delta = 0
        while node is not self.root_node:
            if node.lock_ref == 0:
                self.evictable_size_ -= len(node.key)
                self.protected_size_ += len(node.key)
                delta -= len(node.key)
            node.lock_ref += 1
            node = node.parent
        return delta

    def dec_lock_ref(self, node: TreeNode | None) -> int:
        """Undo one inc_lock_ref; returns the change in evictable size (>= 0)."""
        if self.disable or node is None:
            return 0
        delta = 0
        while node is not self.root_node:
            assert node.lock_ref > 0, f"dec_lock_ref below zero on {node}"
            if node.lock_ref == 1:
                self.evictable_size_ += len(node.key)
                self.protected_size_ -= len(node.key)
                delta += len(node.key)
            node.lock_ref -= 1
            node = node.parent
        return delta

    def evictable_size(self) -> int:
        return self.evictable_size_

    def protected_size(self) -> int:
        return self.protected_size_

    def total_size(self) -> int:
        """Tokens cached in the tree (evictable + protected), by walking it."""
        return sum(len(n.value) for n in self._iter_nodes())

    def all_values_flatten(self) -> torch.Tensor:
        """Every KV slot the tree owns (order unspecified)."""
        values = [n.value for n in self._iter_nodes()]
        return torch.cat(values) if values else self._empty()

    def check_invariants(self) -> None:
        """Recompute sizes from the tree and assert the bookkeeping agrees (debugging)."""
        evictable = protected = 0
        for node in self._iter_nodes():
            assert len(node.key) == len(node.value) > 0
            assert len(node.key) % self.page_size == 0
            assert node.parent.children[self._child_key(node.key, node.extra_key)] is node
            if node.parent is not self.root_node:
                assert node.lock_ref <= node.parent.lock_ref, "child locked more than parent"
            if node.lock_ref > 0:
                protected += len(node.key)
            else:
                evictable += len(node.key)
        assert evictable == self.evictable_size_, (evictable, self.evictable_size_)
        assert protected == self.protected_size_, (protected, self.protected_size_)

    # ------------------------------------------------------------------ internals

    def _tree_prefix_len(self, req: Req) -> int:
        """How many leading slots of the request come from the tree (page-aligned).

        req.prefix_indices is tree slots, then (after an unaligned chunk, page_size > 1)
        the request's own partial page. SGLang uses len(prefix_indices) here, which is the
        same whenever chunks are page-aligned (its PrefillAdder truncates them so). Rounding
        down also handles unaligned chunks: e.g. page_size 4, prefix_indices of 10 = 8 tree
        slots + own slots for positions 8,9. If another request meanwhile inserted positions
        8..15, the duplicate range to free and re-point is 8..16, not 10..16: freeing slot 10
        frees the whole page under positions 8,9 too, so those must be re-pointed as well.
        """
        return len(req.prefix_indices) // self.page_size * self.page_size

    def _empty(self) -> torch.Tensor:
        return torch.empty((0,), dtype=torch.int64, device=self.device)

    def _child_key(self, key: list[int], extra_key: str | None) -> Any:
        # Children are told apart by their first token (page_size 1) or first page.
        plain = key[0] if self.page_size == 1 else tuple(key[: self.page_size])
        return plain if extra_key is None else (extra_key, plain)

    def _match_len(self, a: list[int], b: list[int]) -> int:
        """Common prefix length of a and b, rounded down to whole pages."""
        i = 0
        for x, y in zip(a, b):
            if x != y:
                break
            i += 1
        # Worked example, page_size 4: a 6-token common run shares only page 0 -> 4.
        return i // self.page_size * self.page_size

    def _priority(self, node: TreeNode) -> Any:
        if self.eviction_policy == "lfu":
            return (node.hit_count, node.last_access_time)
        return node.last_access_time

    def _match_prefix_helper(
        self, key: list[int], extra_key: str | None
    ) -> tuple[list[torch.Tensor], TreeNode]:
        node = self.root_node
        node.touch()
        values: list[torch.Tensor] = []
        while key:
            child = node.children.get(self._child_key(key, extra_key))
            if child is None:
                break
            child.touch()
            child.hit_count += 1
            prefix_len = self._match_len(child.key, key)
            if prefix_len < len(child.key):
                node = self._split_node(child, prefix_len)
                values.append(node.value)
                break
            values.append(child.value)
            node = child
            key = key[prefix_len:]
        return values, node

    def _split_node(self, child: TreeNode, split_len: int) -> TreeNode:
        """Cut child's edge after split_len tokens; returns the new upper node.

        parent -> child(key=k) becomes parent -> new(k[:split_len]) -> child(k[split_len:]).
        The new node inherits child's lock count, so the size accounting is unchanged.
        """
        new_node = TreeNode()
        new_node.parent = child.parent
        new_node.extra_key = child.extra_key
        new_node.key = child.key[:split_len]
        new_node.value = child.value[:split_len]
        new_node.lock_ref = child.lock_ref
        new_node.hit_count = child.hit_count
        new_node.last_access_time = child.last_access_time
        child.key = child.key[split_len:]
        child.value = child.value[split_len:]
        child.parent = new_node
        new_node.children = {self._child_key(child.key, child.extra_key): child}
        new_node.parent.children[self._child_key(new_node.key, new_node.extra_key)] = new_node
        return new_node

    def _insert_helper(self, key: list[int], value: torch.Tensor, extra_key: str | None) -> int:
        node = self.root_node
        node.touch()
        total_prefix_len = 0
        while key:
            child = node.children.get(self._child_key(key, extra_key))
            if child is None:
                break
            child.touch()
            prefix_len = self._match_len(child.key, key)
            total_prefix_len += prefix_len
            key, value = key[prefix_len:], value[prefix_len:]
            node = self._split_node(child, prefix_len) if prefix_len < len(child.key) else child
        if key:
            new_node = TreeNode()
            new_node.parent = node
            new_node.extra_key = extra_key
            new_node.key = key
            new_node.value = value.clone()
            node.children[self._child_key(key, extra_key)] = new_node
            self.evictable_size_ += len(key)
        return total_prefix_len

    def _delete_leaf(self, node: TreeNode) -> TreeNode:
        parent = node.parent
        del parent.children[self._child_key(node.key, node.extra_key)]
        self.evictable_size_ -= len(node.key)
        return parent

    def _iter_nodes(self) -> list[TreeNode]:
        """Every node but the root."""
        out: list[TreeNode] = []
        stack = list(self.root_node.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def _collect_leaves(self) -> list[TreeNode]:
        return [n for n in self._iter_nodes() if not n.children]
