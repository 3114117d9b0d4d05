"""HybridAttnBackend: one backend for prefill/extend, another for decode.

Built when --prefill-attention-backend and --decode-attention-backend differ (SGLang's
behaviour). Each forward goes wholly to one side, chosen by the batch's mode, so the two
backends never share metadata; CUDA graphs (decode only) belong to the decode side.
"""

from __future__ import annotations

from mini_sglang.layers.attention.base_attn_backend import AttentionBackend


class HybridAttnBackend(AttentionBackend):
    def __init__(self, prefill: AttentionBackend, decode: AttentionBackend) -> None:
        self.prefill_backend = prefill
        self.decode_backend = decode
        self.supports_cuda_graph = decode.supports_cuda_graph

    def _side(self, fb) -> AttentionBackend:
        return self.decode_backend if fb.forward_mode.is_decode() else self.prefill_backend

    def init_forward_metadata(self, fb) -> None:
        self._side(fb).init_forward_metadata(fb)

    def forward_extend(self, q, k, v, layer, fb, save_kv_cache=True):
        return self.prefill_backend.forward_extend(q, k, v, layer, fb, save_kv_cache)

    def forward_decode(self, q, k, v, layer, fb, save_kv_cache=True):
        return self.decode_backend.forward_decode(q, k, v, layer, fb, save_kv_cache)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        self.decode_backend.init_cuda_graph_state(max_bs, max_num_tokens)

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb) -> None:
        self.decode_backend.init_forward_metadata_capture_cuda_graph(bs, fb)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb) -> None:
        self.decode_backend.init_forward_metadata_replay_cuda_graph(bs, fb)
