"""RadixCache: tree operations against a reference model, and the request lifecycle."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from mini_sglang.mem_cache.allocator import get_allocator
from mini_sglang.mem_cache.memory_pool import ReqToTokenPool
from mini_sglang.mem_cache.radix_cache import RadixCache


def _t(xs: list[int]) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int64)


def test_insert_split_match_worked_example() -> None:
    c = RadixCache(None, get_allocator(64, 1), page_size=1)
    assert c.insert([1, 2, 3], _t([10, 11, 12])) == 0
    assert c.insert([1, 2, 4, 5], _t([20, 21, 22, 23])) == 2
    m = c.match_prefix([1, 2, 4, 9])
    assert m.device_indices.tolist() == [10, 11, 22] and m.last_device_node.key == [4]
    # The full key is matched: the "-1" is the caller's business.
    assert c.match_prefix([1, 2, 3]).device_indices.tolist() == [10, 11, 12]
    assert c.match_prefix([7]).device_indices.tolist() == []
    assert c.match_prefix([7]).last_device_node is c.root_node
    assert c.total_size() == c.evictable_size() == 5 and c.protected_size() == 0
    c.check_invariants()


def test_paged_match_only_whole_pages() -> None:
    c = RadixCache(None, get_allocator(64, 4), page_size=4)
    assert c.insert(list(range(8)), _t(list(range(8, 16)))) == 0
    assert c.match_prefix([0, 1, 2, 3, 4, 5, 6, 9]).device_indices.tolist() == [8, 9, 10, 11]
    assert c.match_prefix([0, 1, 2]).device_indices.numel() == 0  # less than a page
    # A 7-token key is truncated to one page even though all 7 tokens are cached.
    assert c.match_prefix(list(range(7))).device_indices.tolist() == [8, 9, 10, 11]
    # Same first token, different first page: a separate child of the root.
    assert c.insert([0, 1, 2, 7], _t([40, 41, 42, 43])) == 0
    assert len(c.root_node.children) == 2
    with pytest.raises(AssertionError):
        c.insert([1, 2, 3], _t([1, 2, 3]))
    c.check_invariants()


def test_lock_protects_path_and_evict_lru_order() -> None:
    alloc = get_allocator(64, 1, debug=True)
    c = RadixCache(None, alloc, page_size=1)
    slots = {name: alloc.alloc(3) for name in "abc"}
    for name, first in zip("abc", (1, 2, 3)):
        c.insert([first, 0, 0], slots[name])
    c.match_prefix([1, 0, 0])  # "a" becomes most recently used
    node_c = c.match_prefix([3, 0]).last_device_node  # splits "c" and touches it
    assert c.inc_lock_ref(node_c) == -2 and c.protected_size() == 2
    assert c.evict(1) == 3  # whole leaf "b" (least recent), not part of it
    assert c.match_prefix([2, 0, 0]).device_indices.numel() == 0
    # "c"'s unlocked tail [0] goes next (LRU), then "a"; the locked [3, 0] stays.
    assert c.evict(100) == 4 and c.evictable_size() == 0
    assert c.match_prefix([3, 0, 0]).device_indices.tolist() == slots["c"][:2].tolist()
    assert c.dec_lock_ref(node_c) == 2 and c.evictable_size() == 2
    assert c.evict(100) == 2 and c.total_size() == 0
    assert alloc.available_size() == 64
    c.check_invariants()


def test_lfu_evicts_least_matched_first() -> None:
    alloc = get_allocator(64, 1, debug=True)
    c = RadixCache(None, alloc, page_size=1, eviction_policy="lfu")
    for first in (1, 2):
        c.insert([first, 9], alloc.alloc(2))
    for _ in range(3):
        c.match_prefix([2, 9])
    c.match_prefix([1, 9])  # more recent, but matched fewer times
    assert c.evict(1) == 2
    assert c.match_prefix([1, 9]).device_indices.numel() == 0
    assert c.match_prefix([2, 9]).device_indices.numel() == 2
    with pytest.raises(ValueError):
        RadixCache(None, alloc, page_size=1, eviction_policy="belady")


def test_extra_key_namespaces_and_disable() -> None:
    c = RadixCache(None, get_allocator(64, 1), page_size=1)
    c.insert([1, 2], _t([5, 6]), extra_key="lora-a")
    assert c.match_prefix([1, 2]).device_indices.numel() == 0
    assert c.match_prefix([1, 2], extra_key="lora-a").device_indices.tolist() == [5, 6]
    assert c.insert([1, 2], _t([7, 8])) == 0 and c.total_size() == 4
    c.check_invariants()
    d = RadixCache(None, get_allocator(64, 1), page_size=1, disable=True)
    assert d.insert([1, 2], _t([5, 6])) == 0 and d.match_prefix([1, 2]).device_indices.numel() == 0
    assert d.evict(10) == 0 and d.total_size() == 0


class _RandomOps:
    """Random insert/match/lock/unlock/evict on a RadixCache, each checked against a
    reference: a dict of cached page-aligned prefixes -> the slots of their last page."""

    def __init__(self, ps: int) -> None:
        self.rng = random.Random(ps)
        self.ps, self.cap = ps, 96 * ps
        self.alloc = get_allocator(self.cap, ps, debug=True)
        policy = self.rng.choice(["lru", "lfu"])
        self.c = RadixCache(None, self.alloc, page_size=ps, eviction_policy=policy)
        self.ref: dict[tuple[int, ...], list[int]] = {}
        self.locks: list[tuple[Any, tuple[int, ...]]] = []  # (node, locked prefix)
        self.seqs: list[list[int]] = [[]]

    def rand_key(self) -> list[int]:
        # Extend a known sequence with tokens from a tiny vocabulary so that pages often
        # share a first token but differ later: the interesting case for page matching.
        rng, ps = self.rng, self.ps
        base = rng.choice(self.seqs)
        key = base[: rng.randint(0, len(base))] + [
            rng.randint(0, 2) for _ in range(rng.randint(0, 5 * ps))
        ]
        return key

    def ref_match(self, key: list[int]) -> tuple[int, list[int]]:
        ps, ref = self.ps, self.ref
        n, slots = 0, []
        while n + ps <= len(key) and tuple(key[: n + ps]) in ref:
            slots += ref[tuple(key[: n + ps])]
            n += ps
        return n, slots

    def evict_and_check(self, num_tokens: int) -> None:
        # Exactly whole unlocked leaves go, never a locked prefix.
        c, ps, ref = self.c, self.ps, self.ref
        before = c.evictable_size()
        freed = c.evict(num_tokens)
        alive = set(c.all_values_flatten().tolist())
        gone = [p for p, s in ref.items() if s[0] not in alive]
        assert freed == len(gone) * ps and min(num_tokens, before) <= freed <= before
        for p in gone:
            del ref[p]
        for _, locked in self.locks:
            assert all(locked[: i + ps] in ref for i in range(0, len(locked), ps))

    def insert(self) -> bool:
        """Insert, freeing duplicates as callers do; False if the pool had no room."""
        ps, alloc = self.ps, self.alloc
        key = self.rand_key()
        key = key[: len(key) // ps * ps]
        if alloc.available_size() < len(key):
            self.evict_and_check(len(key))
        value = alloc.alloc(len(key))
        if value is None:
            return False
        expect_prefix, _ = self.ref_match(key)
        assert self.c.insert(key, value) == expect_prefix
        alloc.free(value[:expect_prefix])
        for i in range(expect_prefix, len(key), ps):
            self.ref[tuple(key[: i + ps])] = value[i : i + ps].tolist()
        self.seqs.append(key)
        return True

    def match(self) -> None:
        """A full aligned key matches exactly the inserted slots."""
        key = self.rand_key()
        n, slots = self.ref_match(key)
        m = self.c.match_prefix(key)
        assert m.device_indices.tolist() == slots
        assert len(m.last_device_node.key) > 0 or n == 0

    def lock(self) -> None:
        """Lock the matched prefix."""
        key = self.rand_key()
        n, _ = self.ref_match(key)
        node = self.c.match_prefix(key).last_device_node
        self.c.inc_lock_ref(node)
        self.locks.append((node, tuple(key[:n])))

    def check_sizes(self) -> None:
        # Reference sizes: protected = pages on some locked path; the rest is evictable.
        c, ps, ref = self.c, self.ps, self.ref
        protected = {
            locked[: i + ps] for _, locked in self.locks for i in range(0, len(locked), ps)
        }
        assert c.protected_size() == len(protected) * ps
        assert c.evictable_size() == (len(ref) - len(protected)) * ps
        assert self.alloc.available_size() + c.evictable_size() + c.protected_size() == self.cap
        assert all(p[:-ps] in ref for p in ref if len(p) > ps)  # prefix-closed


@pytest.mark.parametrize("ps", [1, 4, 16])
def test_random_ops_against_reference(ps: int) -> None:
    """insert/match/lock/unlock/evict vs a dict of cached page-prefixes -> their slots."""
    t = _RandomOps(ps)
    rng, c, alloc, ref, locks, cap = t.rng, t.c, t.alloc, t.ref, t.locks, t.cap
    for _ in range(2500):
        op = rng.random()
        if op < 0.35:
            if not t.insert():
                continue
        elif op < 0.65:
            t.match()
        elif op < 0.8:
            t.lock()
        elif op < 0.92 and locks:
            node, _ = locks.pop(rng.randrange(len(locks)))
            c.dec_lock_ref(node)
        else:
            t.evict_and_check(rng.randint(1, 20 * ps))
        t.check_sizes()
    c.check_invariants()
    assert sorted(c.all_values_flatten().tolist()) == sorted(s for v in ref.values() for s in v)
    for node, _ in locks:
        c.dec_lock_ref(node)
    c.evict(cap)
    assert c.total_size() == 0 and alloc.available_size() == cap


# ----------------------------------------------------------------- request lifecycle


@dataclass
class FakeReq:
    """The Req fields the cache reads (see base_prefix_cache.py)."""

    origin_input_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    fill_ids: list[int] = field(default_factory=list)
    req_pool_idx: int = -1
    prefix_indices: torch.Tensor = field(default_factory=lambda: torch.empty(0, dtype=torch.int64))
    last_node: Any = None
    target_output_len: int = 1


class MiniScheduler:
    """Just enough of SGLang's scheduler flow to drive the cache like the real one does.

    kv_tok[slot] records which token's KV a slot holds, so every read of req_to_token can
    be checked against the request's own tokens.
    """

    def __init__(self, ps: int, cap: int, policy: str = "lru") -> None:
        self.ps, self.cap = ps, cap
        self.alloc = get_allocator(cap, ps, debug=True)
        self.pool = ReqToTokenPool(8, 512, "cpu")
        self.cache = RadixCache(self.pool, self.alloc, ps, eviction_policy=policy)
        self.kv_tok = torch.full((self.alloc.num_kv_slots,), -1, dtype=torch.int64)
        self.running: list[FakeReq] = []

    def _alloc_extend(self, req: FakeReq, end: int) -> None:
        p = len(req.prefix_indices)
        last_loc = int(req.prefix_indices[-1]) if p else -1
        need = end - p + self.ps  # SGLang over-estimates: one extra page per request
        if self.alloc.available_size() < need:
            self.cache.evict(need)
        out = self.alloc.alloc_extend(_t([p]), _t([end]), _t([last_loc]), end - p)
        assert out is not None, "test sized so that running requests always fit"
        self.pool.write((req.req_pool_idx, slice(p, end)), out)
        self.kv_tok[out] = _t(req.fill_ids[p:end])

    def admit(self, req: FakeReq, chunk: int | None = None) -> None:
        ids = req.origin_input_ids + req.output_ids
        m = self.cache.match_prefix(ids[: len(ids) - 1])  # SGLang's max_prefix_len
        req.prefix_indices, req.last_node = m.device_indices, m.last_device_node
        self.cache.inc_lock_ref(req.last_node)
        req.req_pool_idx = self.pool.alloc(1)[0]
        self.pool.write((req.req_pool_idx, slice(0, len(m.device_indices))), m.device_indices)
        end = len(ids) if chunk is None else min(len(ids), len(m.device_indices) + chunk)
        req.fill_ids = ids[:end]
        self._alloc_extend(req, end)
        self.running.append(req)
        self.after_extend(req, chunk)

    def after_extend(self, req: FakeReq, chunk: int | None) -> None:
        ids = req.origin_input_ids
        if len(req.fill_ids) < len(ids):  # a chunk of the prompt: cache it, extend again
            self.cache.cache_unfinished_req(req)
            self.check_req(req, len(req.fill_ids))
            req.fill_ids = ids[: len(req.fill_ids) + (chunk or len(ids))]
            self._alloc_extend(req, len(req.fill_ids))
            self.after_extend(req, chunk)
        else:
            req.output_ids.append(1000 + len(req.output_ids))  # sampled from the prefill

    def decode_step(self, req: FakeReq) -> None:
        seq_len = len(req.origin_input_ids) + len(req.output_ids)
        last = self.pool.req_to_token[req.req_pool_idx, seq_len - 2].long().view(1)
        need = self.ps
        if self.alloc.available_size() < need:
            self.cache.evict(need)
        out = self.alloc.alloc_decode(_t([seq_len]), last)
        assert out is not None
        self.pool.write((req.req_pool_idx, seq_len - 1), out)
        self.kv_tok[out] = req.output_ids[-1]
        req.output_ids.append(1000 + len(req.output_ids))

    def finish(self, req: FakeReq) -> None:
        self.check_req(req, len(req.origin_input_ids) + len(req.output_ids) - 1)
        self.running.remove(req)
        self.cache.cache_finished_req(req)

    def check_req(self, req: FakeReq, kv_len: int) -> None:
        slots = self.pool.req_to_token[req.req_pool_idx, :kv_len].long()
        assert self.kv_tok[slots].tolist() == (req.origin_input_ids + req.output_ids)[:kv_len]

    def in_use(self) -> int:
        """Slots owned by running requests, not the tree (whole pages)."""
        tree = set(self.cache.all_values_flatten().tolist())
        pages = set()
        for r in self.running:
            kv_len = len(r.origin_input_ids) + len(r.output_ids) - 1
            kv_len = kv_len if r.output_ids else len(r.fill_ids)  # mid-prefill: the chunks
            for s in self.pool.req_to_token[r.req_pool_idx, :kv_len].tolist():
                if s not in tree:
                    pages.add(s // self.ps)
        return len(pages) * self.ps

    def check_accounting(self) -> None:
        c = self.cache
        total = self.alloc.available_size() + c.evictable_size() + c.protected_size()
        assert total + self.in_use() == self.cap
        c.check_invariants()


@pytest.mark.parametrize("ps", [1, 4])
def test_concurrent_duplicates_are_freed(ps: int) -> None:
    s = MiniScheduler(ps, cap=64 * ps)
    prompt = list(range(3 * ps + 2))
    a, b = FakeReq(list(prompt)), FakeReq(list(prompt))
    s.admit(a)
    s.admit(b)  # nothing cached yet: b computes the same prompt again
    s.check_accounting()
    s.finish(a)
    aligned = len(prompt) // ps * ps
    assert s.cache.total_size() == aligned
    s.finish(b)  # b's copy is a duplicate: all of it goes back to the allocator
    assert s.cache.total_size() == aligned and s.cache.protected_size() == 0
    assert s.alloc.available_size() == s.cap - aligned
    s.check_accounting()
    c = FakeReq(list(prompt) + [7])
    s.admit(c)
    assert len(c.prefix_indices) == aligned  # the next request reuses the cached prompt
    s.finish(c)
    s.check_accounting()


@pytest.mark.parametrize("ps", [1, 4])
def test_chunked_request_adopts_tree_slots(ps: int) -> None:
    s = MiniScheduler(ps, cap=64 * ps)
    prompt = list(range(6 * ps + 1))
    a, b = FakeReq(list(prompt)), FakeReq(list(prompt))
    s.admit(a)
    b.req_pool_idx = s.pool.alloc(1)[0]
    b.fill_ids = prompt[: 2 * ps + 1]  # b's first chunk runs before a finishes
    s._alloc_extend(b, len(b.fill_ids))
    s.running.append(b)
    s.finish(a)
    own = s.pool.req_to_token[b.req_pool_idx, : 2 * ps].long().clone()
    s.cache.cache_unfinished_req(b)
    tree_slots = s.cache.match_prefix(prompt[: 2 * ps]).device_indices
    assert s.pool.req_to_token[b.req_pool_idx, : 2 * ps].long().tolist() == tree_slots.tolist()
    assert not set(own.tolist()) & set(tree_slots.tolist())
    assert len(b.prefix_indices) == 2 * ps + 1 and b.last_node.lock_ref == 1
    s.check_req(b, 2 * ps + 1)
    s.check_accounting()
    b.fill_ids = list(prompt)
    s._alloc_extend(b, len(prompt))
    b.output_ids.append(1000)
    s.decode_step(b)
    s.finish(b)
    s.check_accounting()
    assert s.cache.protected_size() == 0
    s.cache.evict(s.cap)
    assert s.alloc.available_size() == s.cap


@pytest.mark.parametrize("ps", [1, 4, 16])
def test_random_request_workload_never_leaks(ps: int) -> None:
    rng = random.Random(7 + ps)
    s = MiniScheduler(ps, cap=40 * ps + 256, policy=rng.choice(["lru", "lfu"]))
    systems = [[rng.randint(0, 50) for _ in range(rng.randint(0, 3 * ps + 5))] for _ in range(3)]
    for _ in range(120):
        if len(s.running) < 4 and rng.random() < 0.5:
            prompt = rng.choice(systems) + [rng.randint(0, 50) for _ in range(rng.randint(1, 20))]
            req = FakeReq(prompt, target_output_len=rng.randint(1, 2 * ps + 3))
            s.admit(req, chunk=rng.choice([None, ps, 3, 2 * ps + 1]))
        for req in list(s.running):
            if len(req.output_ids) >= req.target_output_len:
                s.finish(req)
            else:
                s.decode_step(req)
        for req in s.running:
            s.check_req(req, len(req.origin_input_ids) + len(req.output_ids) - 1)
        s.check_accounting()
    for req in list(s.running):
        s.finish(req)
    s.check_accounting()
    assert s.cache.protected_size() == 0 and s.pool.available_size() == 8
    s.cache.evict(s.cap)
    assert s.alloc.available_size() == s.cap and s.cache.total_size() == 0


def test_unaligned_chunk_tail_replaced_by_concurrent_insert() -> None:
    """b caches an unaligned chunk (tail of 2 own slots in a half page), then a inserts the
    same pages; b's next cache_unfinished_req must free its duplicate page (tail included)
    and re-point every position of it, not just those from len(prefix_indices) on."""
    ps = 4
    s = MiniScheduler(ps, cap=64 * ps)
    prompt = list(range(6 * ps + 1))
    b = FakeReq(list(prompt))
    b.req_pool_idx = s.pool.alloc(1)[0]
    b.fill_ids = prompt[:10]
    s._alloc_extend(b, 10)
    s.running.append(b)
    s.cache.cache_unfinished_req(b)  # inserts 8 tokens; positions 8, 9 stay b's own
    assert len(b.prefix_indices) == 10 and s.cache.total_size() == 8
    a = FakeReq(list(prompt))
    s.admit(a)
    s.finish(a)  # the tree now has 24 tokens, positions 8..11 in a's page
    b.fill_ids = prompt[:20]
    s._alloc_extend(b, 20)
    s.cache.cache_unfinished_req(b)
    tree = s.cache.match_prefix(prompt[:20]).device_indices
    assert s.pool.req_to_token[b.req_pool_idx, :20].long().tolist() == tree.tolist()
    s.check_req(b, 20)
    s.check_accounting()
    b.fill_ids = list(prompt)
    s._alloc_extend(b, len(prompt))
    b.output_ids.append(1000)
    s.finish(b)
    s.check_accounting()
    s.cache.evict(s.cap)
    assert s.alloc.available_size() == s.cap
