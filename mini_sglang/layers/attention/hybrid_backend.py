"""HybridAttnBackend: one backend for prefill/extend, another for decode, and optionally a
third for decode batches of at most `small_decode_max_bs` requests.

Built when --prefill-attention-backend and --decode-attention-backend differ (SGLang's
behaviour), when small decode batches get their own backend (see
ModelRunner.create_attention_backend: flashinfer's decode spends ~12 us per layer on one
request's keys, the Triton split-KV kernel ~7 us), or when prefill needs a fallback
(below). Each forward goes wholly to one side, chosen by the batch's mode and size, so the
sides never share metadata; CUDA graphs (decode only) belong to the decode sides, each
capturing the batch sizes it serves.

A `prefill_fallback` serves extend batches while `prefill_ready()` is False (ModelRunner:
the Triton extend kernel while flashinfer's batch-prefill module compiles in the
background). The side of an extend batch is picked once, in init_forward_metadata, and
every layer's forward_extend of that batch goes to it, so a build that ends mid-batch
switches at the next batch. Once prefill_ready() is True the fallback is dropped for good.
"""

from __future__ import annotations

from collections.abc import Callable

from mini_sglang.layers.attention.base_attn_backend import AttentionBackend


class HybridAttnBackend(AttentionBackend):
    def __init__(
        self,
        prefill: AttentionBackend,
        decode: AttentionBackend,
        small_decode: AttentionBackend | None = None,
        small_decode_max_bs: int = 0,
        prefill_fallback: AttentionBackend | None = None,
        prefill_ready: Callable[[], bool] | None = None,
    ) -> None:
        self.prefill_backend = prefill
        self.prefill_fallback = prefill_fallback if prefill_ready is not None else None
        self.prefill_ready = prefill_ready
        # The side serving the current extend batch (set by init_forward_metadata).
        self.extend_backend = prefill
        self.decode_backend = decode
        self.small_decode_backend = small_decode
        self.small_decode_max_bs = small_decode_max_bs if small_decode is not None else 0
        self.supports_cuda_graph = decode.supports_cuda_graph and (
            small_decode is None or small_decode.supports_cuda_graph
        )

    def _decode_side(self, bs: int) -> AttentionBackend:
        if bs <= self.small_decode_max_bs:
            return self.small_decode_backend  # type: ignore[return-value]
        return self.decode_backend

    def _extend_side(self) -> AttentionBackend:
        if self.prefill_fallback is not None:
            if not self.prefill_ready():  # type: ignore[misc]
                return self.prefill_fallback
            self.prefill_fallback = None
        return self.prefill_backend

    def init_forward_metadata(self, fb) -> None:
        if fb.forward_mode.is_decode():
            self._decode_side(fb.batch_size).init_forward_metadata(fb)
            return
        self.extend_backend = self._extend_side()
        self.extend_backend.init_forward_metadata(fb)

    def forward_extend(self, q, k, v, layer, fb, save_kv_cache=True):
        return self.extend_backend.forward_extend(q, k, v, layer, fb, save_kv_cache)

    def forward_decode(self, q, k, v, layer, fb, save_kv_cache=True):
        return self._decode_side(fb.batch_size).forward_decode(q, k, v, layer, fb, save_kv_cache)

    def forward_decode_from_qkv(self, qkv, positions, rope, layer, fb):
        side = self._decode_side(fb.batch_size)
        return side.forward_decode_from_qkv(qkv, positions, rope, layer, fb)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self.decode_backend.init_cuda_graph_state(max_bs, max_num_tokens)
        if self.small_decode_max_bs:
            small = min(max_bs, self.small_decode_max_bs)
            self.small_decode_backend.init_cuda_graph_state(small, small)  # type: ignore[union-attr]

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb) -> None:
        self._decode_side(bs).init_forward_metadata_capture_cuda_graph(bs, fb)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb) -> None:
        self._decode_side(bs).init_forward_metadata_replay_cuda_graph(bs, fb)
