"""The two-level KV memory: request slots -> token positions -> KV slots.

`ReqToTokenPool` maps (request slot, position in the sequence) to a KV slot index;
`MHATokenToKVPool` holds the K and V tensors of every layer, indexed by KV slot.

Worked example: a request in request slot 3 whose first 5 tokens live in KV slots
[17, 18, 40, 41, 42] has req_to_token[3, :5] == [17, 18, 40, 41, 42]; its layer-L keys are
k_buffer[L][[17, 18, 40, 41, 42]], each of shape [num_kv_heads, head_dim].
"""

from __future__ import annotations

import torch


class ReqToTokenPool:
    """Fixed table of `size` request slots, each `max_context_len` positions long."""

    def __init__(self, size: int, max_context_len: int, device: str | torch.device) -> None:
        self.size = size
        self.max_context_len = max_context_len
        self.device = device
        self.req_to_token = torch.zeros((size, max_context_len), dtype=torch.int32, device=device)
        self.free_slots: list[int] = list(range(size))

    def available_size(self) -> int:
        return len(self.free_slots)

    def alloc(self, need_size: int) -> list[int] | None:
        if need_size > len(self.free_slots):
            return None
        out, self.free_slots = self.free_slots[:need_size], self.free_slots[need_size:]
        return out

    def free(self, req_pool_idx: int | list[int]) -> None:
        if isinstance(req_pool_idx, int):
            self.free_slots.append(req_pool_idx)
        else:
            self.free_slots.extend(req_pool_idx)

    def write(self, index: tuple, values: torch.Tensor) -> None:
        self.req_to_token[index] = values.to(torch.int32)

    def clear(self) -> None:
        self.free_slots = list(range(self.size))


class MHATokenToKVPool:
    """Per-layer K/V buffers of shape [size + 1, num_kv_heads, head_dim] (slot 0 = padding)."""

    def __init__(
        self,
        size: int,
        dtype: torch.dtype,
        head_num: int,
        head_dim: int,
        layer_num: int,
        device: str | torch.device,
        v_head_dim: int | None = None,
    ) -> None:
        self.size = size
        self.dtype = dtype
        self.head_num = head_num
        self.head_dim = head_dim
        self.v_head_dim = v_head_dim or head_dim
        self.layer_num = layer_num
        self.device = device
        self.k_buffer = [
            torch.zeros((size + 1, head_num, head_dim), dtype=dtype, device=device)
            for _ in range(layer_num)
        ]
        self.v_buffer = [
            torch.zeros((size + 1, head_num, self.v_head_dim), dtype=dtype, device=device)
            for _ in range(layer_num)
        ]

    @staticmethod
    def bytes_per_token(
        head_num: int,
        head_dim: int,
        layer_num: int,
        dtype: torch.dtype,
        v_head_dim: int | None = None,
    ) -> int:
        elem = torch.tensor([], dtype=dtype).element_size()
        return head_num * (head_dim + (v_head_dim or head_dim)) * layer_num * elem

    def mem_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.k_buffer + self.v_buffer)

    def get_kv_buffer(self, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_buffer[layer_id], self.v_buffer[layer_id]

    def set_kv_buffer(
        self, layer_id: int, loc: torch.Tensor, cache_k: torch.Tensor, cache_v: torch.Tensor
    ) -> None:
        if cache_k.dtype != self.dtype:
            cache_k, cache_v = cache_k.to(self.dtype), cache_v.to(self.dtype)
        if cache_k.is_cuda:
            # Local: the kernel module imports triton, which only CUDA pools use.
            from mini_sglang.layers.fused_kernels import store_kv, triton

            if triton is not None:
                store_kv(cache_k, cache_v, loc, self.k_buffer[layer_id], self.v_buffer[layer_id])
                return
        self.k_buffer[layer_id][loc] = cache_k
        self.v_buffer[layer_id][loc] = cache_v
