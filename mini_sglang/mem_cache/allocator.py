"""KV-slot allocators: hand out indices into the token-to-KV pool.

Contract (shared by every allocator):
- Slot 0 is never handed out: it is the padding sink that dummy rows (CUDA-graph padding,
  idle decode rows) write their KV into. With page_size > 1 the whole page 0 (slots
  0..page_size-1) is reserved, so slot 0 stays the sink and every real page is whole.
- Real pages are 1..num_pages (num_pages = size // page_size); page p holds the slots
  p*page_size .. p*page_size + page_size - 1. So the KV pool needs `num_kv_slots`
  = (num_pages + 1) * page_size rows (size + 1 for page_size 1; SGLang sizes its buffers
  size + page_size for the same reason).
- `alloc(n)` returns an int64 tensor of n distinct free slots, or None when fewer than n
  are free (the caller then evicts from the tree cache or retracts; nothing is taken).
  For page_size > 1, n must be a multiple of page_size (whole pages).
- `alloc_extend` / `alloc_decode` (SGLang's names) allocate for a batch of requests that
  may continue a partially filled last page; both return None, taking nothing, when short.
- `free(indices)` returns slots. With page_size > 1, `indices` must be the slots of
  consecutive positions of one request starting at a page-aligned position (a request's
  KV from position 0 or from the end of its tree prefix, its unaligned tail, a tree
  node's value, a slot that opened a page): every caller frees such a range. Position i
  lives at offset i % page_size of its page, so the range's pages are exactly its slots
  at offsets 0, page_size, 2 * page_size, ...: taking those is a strided view, where
  deduplicating `indices // page_size` (torch.unique, as SGLang does) has a data-dependent
  size and so waits for the GPU queue, which stalls overlap scheduling at every step
  where a request finishes. Frees made between `free_group_begin()` and
  `free_group_end()` are batched into one.
- `available_size()` counts free slots (tokens, not pages), including lazily released ones.
"""

from __future__ import annotations

import torch

from mini_sglang.utils.device import to_device


class BaseTokenToKVPoolAllocator:
    """Shared free-page bookkeeping; a "page" is one slot when page_size == 1.

    Freed pages go to a release list and are merged (sorted, for locality) into the free
    list only when an allocation would otherwise fall short: frees stay O(1) appends.
    `debug=True` tracks a per-page free bit and raises on double frees or on handing out
    a page that is not free (cheap on CPU; meant for tests and debugging).
    """

    def __init__(
        self, size: int, page_size: int, device: str | torch.device = "cpu", debug: bool = False
    ) -> None:
        if page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {page_size}")
        self.page_size = page_size
        self.num_pages = size // page_size
        # Capacity in tokens; a size that is not a multiple of page_size is rounded down
        # (SGLang's model runner rounds max_total_num_tokens the same way).
        self.size = self.num_pages * page_size
        self.device = device
        self.debug = debug
        self.clear()

    @property
    def num_kv_slots(self) -> int:
        """Rows the KV buffers need: page 0 (reserved) plus every real page."""
        return (self.num_pages + 1) * self.page_size

    def clear(self) -> None:
        """Forget every allocation: all pages 1..num_pages are free again."""
        # Page 0 is reserved as the padding sink (see module docstring).
        self.free_pages = torch.arange(1, self.num_pages + 1, dtype=torch.int64, device=self.device)
        self._released: list[torch.Tensor] = []
        self._group: list[torch.Tensor] | None = None
        if self.debug:
            self._page_is_free = torch.ones(self.num_pages + 1, dtype=torch.bool)
            self._page_is_free[0] = False

    def available_size(self) -> int:
        """Free slots (tokens), counting released-but-unmerged pages."""
        n = len(self.free_pages) + sum(len(p) for p in self._released)
        return n * self.page_size

    def _merge_released(self) -> None:
        if self._released:
            merged = torch.cat([self.free_pages, *self._released])
            self.free_pages = torch.sort(merged).values
            self._released = []

    def _take_pages(self, num_pages: int) -> torch.Tensor | None:
        """Remove and return num_pages free page ids, or None (taking nothing) if short."""
        if num_pages > len(self.free_pages):
            self._merge_released()
            if num_pages > len(self.free_pages):
                return None
        out = self.free_pages[:num_pages]
        self.free_pages = self.free_pages[num_pages:]
        if self.debug and num_pages:
            if not bool(self._page_is_free[out.cpu()].all()):
                raise AssertionError("allocator handed out a page that is not free")
            self._page_is_free[out.cpu()] = False
        return out

    def free(self, indices: torch.Tensor) -> None:
        """Return the slots `indices` (any int dtype; with page_size > 1 a page-aligned
        range of one request, see the module docstring); a page is freed as a whole.
        E.g. page_size 4, a request's tail at positions 8..13 in slots [36..39, 12, 13]:
        the slots at offsets 0 and 4 of the range, 36 and 12, give pages 9 and 3."""
        if indices.numel() == 0:
            return
        indices = indices.to(device=self.device, dtype=torch.int64)
        ps = self.page_size
        pages = indices if ps == 1 else indices[::ps] // ps
        if self.debug and ps > 1:
            cpu = indices.cpu()
            if not (
                bool((cpu[::ps] % ps == 0).all())
                and torch.equal(cpu // ps, pages.cpu().repeat_interleave(ps)[: len(cpu)])
            ):
                raise AssertionError(
                    f"free() of slots that are not a page-aligned range: {cpu.tolist()}"
                )
        if self._group is not None:
            self._group.append(pages)
            return
        self._release(pages)

    def _release(self, pages: torch.Tensor) -> None:
        if self.debug:
            cpu_pages = pages.cpu()
            if len(torch.unique(cpu_pages)) != len(cpu_pages):
                raise AssertionError("double free within one free() call")
            if bool((cpu_pages <= 0).any()) or bool((cpu_pages > self.num_pages).any()):
                raise AssertionError(f"freeing pages outside the pool: {cpu_pages.tolist()}")
            if bool(self._page_is_free[cpu_pages].any()):
                raise AssertionError(f"double free of pages {cpu_pages.tolist()}")
            self._page_is_free[cpu_pages] = True
        self._released.append(pages)

    def free_group_begin(self) -> None:
        """Start batching frees; they take effect (and count as available) at the end."""
        self._group = []

    def free_group_end(self) -> None:
        group, self._group = self._group, None
        if group:
            self._release(torch.cat(group))


class TokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    """page_size == 1 allocator over slots 1..size (a page is one slot)."""

    def __init__(self, size: int, device: str | torch.device = "cpu", debug: bool = False) -> None:
        super().__init__(size, 1, device, debug)

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """need_size distinct free slots, or None when short."""
        return self._take_pages(need_size)

    def alloc_extend(
        self,
        prefix_lens: torch.Tensor,
        seq_lens: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
    ) -> torch.Tensor | None:
        """With one-slot pages there is no partial page to continue: just alloc(n)."""
        return self.alloc(extend_num_tokens)

    def alloc_decode(self, seq_lens: torch.Tensor, *_: torch.Tensor | None) -> torch.Tensor | None:
        """One slot per request (last_loc and host lengths do not matter with one-slot pages)."""
        return self.alloc(len(seq_lens))


class PagedTokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    """Allocator handing out whole pages of page_size slots (SGLang semantics).

    A request's KV slots are laid out so that position i of the sequence lives at offset
    i % page_size of some page: every page belongs to one request, and the last page of a
    request may be partially filled and is continued by the next extend/decode.
    """

    def __init__(
        self, size: int, page_size: int, device: str | torch.device = "cpu", debug: bool = False
    ) -> None:
        super().__init__(size, page_size, device, debug)

    def _pages_to_slots(self, pages: torch.Tensor) -> torch.Tensor:
        offsets = torch.arange(self.page_size, dtype=torch.int64, device=self.device)
        return (pages[:, None] * self.page_size + offsets).reshape(-1)

    def alloc(self, need_size: int) -> torch.Tensor | None:
        """need_size // page_size whole pages as slots; need_size must be page-aligned."""
        if need_size % self.page_size != 0:
            raise ValueError(f"paged alloc needs a multiple of {self.page_size}, got {need_size}")
        pages = self._take_pages(need_size // self.page_size)
        return None if pages is None else self._pages_to_slots(pages)

    def alloc_extend(
        self,
        prefix_lens: torch.Tensor,
        seq_lens: torch.Tensor,
        last_loc: torch.Tensor,
        extend_num_tokens: int,
    ) -> torch.Tensor | None:
        """Slots for positions prefix_lens[r] .. seq_lens[r]-1 of every request r, concatenated.

        last_loc[r] is the KV slot of request r's last existing token (position
        prefix_lens[r]-1), or -1 when prefix_lens[r] == 0 (SGLang's get_last_loc
        convention). It is only read when prefix_lens[r] is not page-aligned: then the
        request first fills the rest of its last page (last_loc+1, last_loc+2, ...), and
        only after that takes new pages. extend_num_tokens == sum(seq_lens - prefix_lens).

        Worked example, page_size 4: prefix_len 6, seq_len 13, last_loc 21 (positions 4,5
        live in page 5 at slots 20,21). Part 1: positions 6,7 -> slots 22,23 (rest of page
        5). Then ceil(13/4) - ceil(6/4) = 4 - 2 = 2 new pages, say 9 and 3: positions
        8..11 -> 36..39 and position 12 -> 12 (page 3 stays partially filled).
        """
        ps = self.page_size
        # Page counts come from host copies of the lengths: counting them on the device
        # would sync the host with the GPU queue (stalling overlap scheduling), as would a
        # repeat_interleave without output_size.
        prefix_cpu = prefix_lens.to(device="cpu", dtype=torch.int64)
        extend_cpu = seq_lens.to(device="cpu", dtype=torch.int64) - prefix_cpu
        if int(extend_cpu.sum()) != extend_num_tokens:
            raise ValueError(f"extend_num_tokens {extend_num_tokens} != sum(seq - prefix)")
        # Pages each request already has (its last may be partial) and newly needs.
        pages_before_cpu = (prefix_cpu + ps - 1) // ps
        new_pages_cpu = (prefix_cpu + extend_cpu + ps - 1) // ps - pages_before_cpu
        pages = self._take_pages(int(new_pages_cpu.sum()))
        if pages is None:
            return None

        per_req = torch.stack([prefix_cpu, extend_cpu, pages_before_cpu, new_pages_cpu])
        prefix_lens, extend_lens, pages_before, new_pages_per_req = to_device(
            per_req, self.device
        ).unbind(0)  # one host->device copy
        last_loc = last_loc.to(device=self.device, dtype=torch.int64)
        # Vectorised over tokens: req id, position and the request's first new page.
        req_ids = torch.repeat_interleave(
            torch.arange(len(extend_cpu), device=self.device),
            extend_lens,
            output_size=extend_num_tokens,
        )
        out_start = torch.cumsum(extend_lens, 0) - extend_lens
        page_start = torch.cumsum(new_pages_per_req, 0) - new_pages_per_req
        token_idx = torch.arange(extend_num_tokens, device=self.device)
        pos = prefix_lens[req_ids] + (token_idx - out_start[req_ids])
        # Positions below pages_before*ps fall in the old partial page: continue last_loc.
        in_old_page = pos < pages_before[req_ids] * ps
        old_slot = last_loc[req_ids] + (pos - prefix_lens[req_ids]) + 1
        page_ord = page_start[req_ids] + pos // ps - pages_before[req_ids]
        # Clamp only guards the gather for old-page rows, which where() discards.
        page_ord = page_ord.clamp(0, max(len(pages) - 1, 0))
        new_slot = pages[page_ord] * ps + pos % ps if len(pages) else old_slot
        return torch.where(in_old_page, old_slot, new_slot)

    def alloc_decode(
        self,
        seq_lens: torch.Tensor,
        last_loc: torch.Tensor,
        seq_lens_cpu: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """One slot per request for position seq_lens[r]-1 (seq_lens are the NEW lengths).

        last_loc[r] is the slot of position seq_lens[r]-2. A request whose new token starts
        a page (seq_len % page_size == 1) takes a fresh page; the others write last_loc+1.
        Example, page_size 4: seq_len 6, last_loc 21 -> 22; seq_len 5 -> first slot of a new
        page (its previous page ended at position 3). seq_lens_cpu (the same lengths on the
        host) lets the page count be taken without waiting for the GPU, as SGLang does;
        without it, counting syncs when seq_lens lives on the GPU.
        """
        ps = self.page_size
        seq_lens = seq_lens.to(device=self.device, dtype=torch.int64)
        last_loc = last_loc.to(device=self.device, dtype=torch.int64)
        host_lens = seq_lens if seq_lens_cpu is None else seq_lens_cpu
        num_new_pages = int(((host_lens - 1) % ps == 0).sum())
        pages = self._take_pages(num_new_pages)
        if pages is None:
            return None
        if num_new_pages == 0:
            return last_loc + 1
        needs_page = (seq_lens - 1) % ps == 0
        page_ord = (torch.cumsum(needs_page.to(torch.int64), 0) - 1).clamp(min=0)
        return torch.where(needs_page, pages[page_ord] * ps, last_loc + 1)


def get_allocator(
    size: int, page_size: int = 1, device: str | torch.device = "cpu", debug: bool = False
) -> TokenToKVPoolAllocator | PagedTokenToKVPoolAllocator:
    """The allocator SGLang would build for this page size."""
    if page_size == 1:
        return TokenToKVPoolAllocator(size, device, debug)
    return PagedTokenToKVPoolAllocator(size, page_size, device, debug)
