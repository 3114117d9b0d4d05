"""KV allocators: slot 0 reserved, exhaustion, whole pages, alloc_extend/alloc_decode."""

from __future__ import annotations

import random

import pytest
import torch

from mini_sglang.mem_cache.allocator import (
    PagedTokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
    get_allocator,
)


def test_token_allocator_alloc_free_exhaustion() -> None:
    a = TokenToKVPoolAllocator(8, debug=True)
    assert a.available_size() == 8 and a.num_kv_slots == 9
    x = a.alloc(5)
    assert x.dtype == torch.int64 and sorted(x.tolist()) == [1, 2, 3, 4, 5]
    assert a.alloc(4) is None and a.available_size() == 3  # nothing taken on failure
    y = a.alloc(3)
    assert 0 not in y.tolist() and a.available_size() == 0
    a.free(x[:2].to(torch.int32))  # req_to_token rows are int32
    assert a.available_size() == 2
    assert sorted(a.alloc(2).tolist()) == sorted(x[:2].tolist())
    a.clear()
    assert a.available_size() == 8


def test_free_group_batches_frees() -> None:
    a = get_allocator(8, 1, debug=True)
    x = a.alloc(6)
    a.free_group_begin()
    a.free(x[:2])
    a.free(x[2:3])
    assert a.available_size() == 2  # grouped frees land at free_group_end
    a.free_group_end()
    assert a.available_size() == 5


def test_debug_mode_catches_double_free() -> None:
    a = get_allocator(8, 1, debug=True)
    x = a.alloc(2)
    a.free(x)
    with pytest.raises(AssertionError):
        a.free(x[:1])
    p = get_allocator(16, 4, debug=True)
    y = p.alloc(4)
    with pytest.raises(AssertionError, match="not a page-aligned range"):
        p.free(y[1:2])  # paged frees start at a page's first position
    p.free(y[:1])  # ... and free that page whole
    assert p.available_size() == 16
    with pytest.raises(AssertionError, match="double free"):
        p.free(y)


def test_paged_free_takes_each_ranges_pages_without_deduplicating() -> None:
    """A request's tail from an aligned position frees exactly its pages (the docstring's
    example, page_size 4: positions 8..13 in slots [36..39, 12, 13] -> pages 9 and 3);
    ranges freed in one group keep their own page boundaries."""
    a = PagedTokenToKVPoolAllocator(40, 4, debug=True)  # pages 1..10
    assert len(a.alloc(40)) == 40 and a.available_size() == 0
    a.free(torch.tensor([36, 37, 38, 39, 12, 13]))
    assert a.available_size() == 8 and sorted(a.alloc(8).tolist()) == [
        12,
        13,
        14,
        15,
        36,
        37,
        38,
        39,
    ]
    a.free_group_begin()
    a.free(torch.tensor([20, 21]))  # a 2-token tail: page 5
    a.free(torch.tensor([8, 9, 10, 11, 28]))  # positions 0..4 of a request: pages 2 and 7
    assert a.available_size() == 0  # a group takes effect at its end
    a.free_group_end()
    assert a.available_size() == 12
    assert sorted(a.alloc(12).tolist()) == [*range(8, 12), *range(20, 24), *range(28, 32)]


def test_paged_alloc_whole_pages_and_page0_reserved() -> None:
    a = PagedTokenToKVPoolAllocator(30, 4, debug=True)  # rounded down to 7 pages
    assert a.size == 28 and a.available_size() == 28 and a.num_kv_slots == 32
    with pytest.raises(ValueError):
        a.alloc(3)
    x = a.alloc(28)
    assert sorted(x.tolist()) == list(range(4, 32))  # page 0 (slots 0..3) never handed out
    assert a.alloc(4) is None
    a.free(x[8:12])
    assert a.available_size() == 4
    assert sorted(a.alloc(4).tolist()) == sorted(x[8:12].tolist())


def _reference_extend(prefix_lens, seq_lens, last_loc, pages, ps):
    """Per-request, per-token reference: continue the old page, then take pages in order."""
    out, it = [], iter(pages)
    for p, s, last in zip(prefix_lens, seq_lens, last_loc):
        page = None
        for pos in range(p, s):
            if pos < -(-p // ps) * ps:  # still inside the partially filled last page
                out.append(last + 1 + (pos - p))
            else:
                if pos % ps == 0:
                    page = next(it)
                out.append(page * ps + pos % ps)
    return out


@pytest.mark.parametrize("ps", [1, 4, 16])
def test_alloc_extend_and_decode_match_reference_on_fresh_pool(ps: int) -> None:
    rng = random.Random(ps)
    a = get_allocator(64 * ps, ps, debug=True)
    pages = list(range(1, 65))
    # Existing prefixes live in made-up pages 40.. so last_loc is page-consistent.
    prefix_lens = [0, 3, ps, 2 * ps + 1, 5]
    seq_lens = [p + rng.randint(0, 2 * ps + 3) for p in prefix_lens]
    last_loc = [-1 if p == 0 else (40 + i) * ps + (p - 1) % ps for i, p in enumerate(prefix_lens)]
    n = sum(s - p for p, s in zip(prefix_lens, seq_lens))
    out = a.alloc_extend(
        torch.tensor(prefix_lens), torch.tensor(seq_lens), torch.tensor(last_loc), n
    )
    if ps == 1:
        assert out.tolist() == pages[:n]
    else:
        assert out.tolist() == _reference_extend(prefix_lens, seq_lens, last_loc, pages, ps)
    used = 64 * ps - a.available_size()
    new_pages = sum(-(-s // ps) - -(-p // ps) for p, s in zip(prefix_lens, seq_lens))
    assert used == (n if ps == 1 else new_pages * ps)

    # Decode: requests whose new token starts a page take one, the rest continue.
    a = get_allocator(64 * ps, ps, debug=True)
    seq_lens = [1, 2, ps + 1, 2 * ps, 7]
    last_loc = [-1] + [(40 + i) * ps + (s - 2) % ps for i, s in enumerate(seq_lens[1:])]
    out = a.alloc_decode(torch.tensor(seq_lens), torch.tensor(last_loc))
    expect = _reference_extend([s - 1 for s in seq_lens], seq_lens, last_loc, pages, ps)
    assert out.tolist() == (pages[:5] if ps == 1 else expect)
    # The scheduler passes host copies of the lengths (the page count is taken from them,
    # so it never waits for the GPU): same slots.
    b = get_allocator(64 * ps, ps, debug=True)
    host = torch.tensor(seq_lens)
    assert b.alloc_decode(host.clone(), torch.tensor(last_loc), host).tolist() == out.tolist()


@pytest.mark.parametrize("ps", [4, 16])
def test_alloc_extend_returns_none_and_takes_nothing_when_short(ps: int) -> None:
    a = get_allocator(4 * ps, ps, debug=True)
    args = (torch.tensor([0, 0]), torch.tensor([2 * ps, 2 * ps + 1]), torch.tensor([-1, -1]))
    assert a.alloc_extend(*args, 4 * ps + 1) is None
    assert a.available_size() == 4 * ps
    assert a.alloc_decode(torch.tensor([1] * 5), torch.tensor([-1] * 5)) is None
    assert a.available_size() == 4 * ps


@pytest.mark.parametrize("ps", [1, 4, 16])
def test_random_request_lifecycles_keep_pages_private_and_aligned(ps: int) -> None:
    """Random extends/decodes/frees of many requests; check layout and accounting."""
    rng = random.Random(1000 + ps)
    cap = 48 * ps
    a = get_allocator(cap, ps, debug=True)
    reqs: list[list[int]] = []  # each request's slots, by position
    for _ in range(1500):
        op = rng.random()
        if op < 0.3 and len(reqs) < 8:  # new request or a second chunk of an existing one
            if not reqs or rng.random() < 0.5:
                grow: list[int] = []
                reqs.append(grow)
            else:
                grow = rng.choice(reqs)
            p = len(grow)
            s = p + rng.randint(1, 3 * ps)
            last = grow[-1] if grow else -1
            out = a.alloc_extend(torch.tensor([p]), torch.tensor([s]), torch.tensor([last]), s - p)
            if out is None:
                assert -(-s // ps) - -(-p // ps) > a.available_size() // ps
                continue
            grow.extend(out.tolist())
        elif op < 0.8 and reqs:  # one decode step for a random subset
            batch = rng.sample(reqs, rng.randint(1, len(reqs)))
            seq = torch.tensor([len(r) + 1 for r in batch])
            last = torch.tensor([r[-1] if r else -1 for r in batch])
            out = a.alloc_decode(seq, last)
            if out is None:
                continue
            for r, slot in zip(batch, out.tolist()):
                r.append(slot)
        elif reqs:  # finish a request: free all its slots
            r = reqs.pop(rng.randrange(len(reqs)))
            if r:
                a.free(torch.tensor(r))
        owned_pages: set[int] = set()
        for r in reqs:
            assert all(slot % ps == pos % ps and slot >= ps for pos, slot in enumerate(r))
            pages = {slot // ps for slot in r}
            # Positions of one page share one KV page; no page is shared by two requests.
            assert len(pages) == -(-len(r) // ps) and not pages & owned_pages
            owned_pages |= pages
        assert a.available_size() + len(owned_pages) * ps == cap
