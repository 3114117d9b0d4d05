"""The two-level KV memory: request slots -> token positions -> KV slots.

`ReqToTokenPool` maps (request slot, position in the sequence) to a KV slot index;
`MHATokenToKVPool` holds the K and V tensors of every layer, indexed by KV slot.

Worked example: a request in request slot 3 whose first 5 tokens live in KV slots
[17, 18, 40, 41, 42] has req_to_token[3, :5] == [17, 18, 40, 41, 42]; its layer-L keys are
k_buffer[L][[17, 18, 40, 41, 42]], each of shape [num_kv_heads, head_dim].

With an FP8 KV cache (--kv-cache-dtype fp8_e4m3 / fp8_e5m2) the buffers hold FP8 and
`set_kv_buffer` quantizes with the layer's k/v scales (layers/kv_quant.py); readers
dequantize with the same scales.
"""

from __future__ import annotations

import torch

from mini_sglang.layers.kv_quant import is_fp8, quantize_kv, scatter_kv, triton_supports_kv


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
    """Per-layer K/V buffers of shape [size + 1, num_kv_heads, head_dim] (slot 0 = padding),
    of `dtype`: the model's, or an FP8 dtype (one byte a value, with per-layer scales that
    the caller of set_kv_buffer and the readers hold). `triton_ok`: Triton kernels can read
    and write these buffers (kv_quant.triton_supports_kv)."""

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
        self.triton_ok = triton_supports_kv(dtype, torch.device(device))
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
        self,
        layer_id: int,
        loc: torch.Tensor,
        cache_k: torch.Tensor,
        cache_v: torch.Tensor,
        k_scale: float = 1.0,
        v_scale: float = 1.0,
    ) -> None:
        """Write the K/V of len(loc) tokens ([T, heads, head_dim]) at KV slots `loc`. An FP8
        pool stores k / k_scale and v / v_scale, clamped to the format's range; a pool in
        another dtype casts and ignores the scales."""
        k_buf, v_buf = self.k_buffer[layer_id], self.v_buffer[layer_id]
        if cache_k.is_cuda and self.triton_ok:
            # Local: the kernel module imports triton, which only CUDA pools use.
            from mini_sglang.layers.fused_kernels import store_kv, triton

            if triton is not None:
                if cache_k.dtype != self.dtype and not is_fp8(self.dtype):
                    cache_k, cache_v = cache_k.to(self.dtype), cache_v.to(self.dtype)
                store_kv(cache_k, cache_v, loc, k_buf, v_buf, k_scale, v_scale)
                return
        scatter_kv(k_buf, loc, quantize_kv(cache_k, k_scale, self.dtype))
        scatter_kv(v_buf, loc, quantize_kv(cache_v, v_scale, self.dtype))
