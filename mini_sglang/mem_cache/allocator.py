"""KV-slot allocators: hand out indices into the token-to-KV pool.

Contract (shared by every allocator):
- Slot 0 is never handed out: it is the padding sink that dummy rows (CUDA-graph padding,
  idle decode rows) write their KV into, so real slots are 1..size.
- `alloc(n)` returns an int64 tensor of n distinct free slots, or None when fewer than n
  are free (the caller then evicts from the tree cache or retracts; nothing is taken).
- `free(indices)` returns slots; freeing inside `free_group_begin/end` batches the work.
- `available_size()` counts free slots (tokens, not pages).
"""

from __future__ import annotations

import torch


class TokenToKVPoolAllocator:
    """page_size == 1 allocator over slots 1..size, a free list kept as one tensor."""

    page_size = 1

    def __init__(self, size: int, device: str | torch.device = "cpu") -> None:
        self.size = size
        self.device = device
        self._group: list[torch.Tensor] | None = None
        self.clear()

    def clear(self) -> None:
        # Slot 0 is reserved as the padding sink (see module docstring).
        self.free_slots = torch.arange(1, self.size + 1, dtype=torch.int64, device=self.device)
        self._pending: list[torch.Tensor] = []
        self._group = None

    def available_size(self) -> int:
        return len(self.free_slots) + sum(len(p) for p in self._pending)

    def _merge_pending(self) -> None:
        if self._pending:
            self.free_slots = torch.cat([self.free_slots, *self._pending])
            self._pending = []

    def alloc(self, need_size: int) -> torch.Tensor | None:
        if need_size > len(self.free_slots):
            self._merge_pending()
            if need_size > len(self.free_slots):
                return None
        out = self.free_slots[:need_size]
        self.free_slots = self.free_slots[need_size:]
        return out

    def free(self, indices: torch.Tensor) -> None:
        if indices.numel() == 0:
            return
        indices = indices.to(device=self.device, dtype=torch.int64)
        if self._group is not None:
            self._group.append(indices)
        else:
            self._pending.append(indices)

    def free_group_begin(self) -> None:
        self._group = []

    def free_group_end(self) -> None:
        group, self._group = self._group, None
        if group:
            self._pending.append(torch.cat(group))
