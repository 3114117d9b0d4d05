"""LlamaEmbeddingModel / MistralModel: the Llama decoder without an LM head, pooled.

SGLang 0.5.4's embedding architectures for e5-mistral-style checkpoints: the decoder's
last-token state, L2-normalized (a sentence-transformers directory may override the
pooling, see layers/pooler.py). Such checkpoints are saved from HF's bare LlamaModel /
MistralModel, so their tensor names have no "model." prefix; both spellings load.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
from torch import nn

from mini_sglang.layers.pooler import EmbeddingPoolerOutput, Pooler, PoolingType
from mini_sglang.models.llama import LlamaForCausalLM, LlamaModel

if TYPE_CHECKING:
    from mini_sglang.model_executor.forward_batch_info import ForwardBatch


class LlamaEmbeddingModel(nn.Module):
    """Embedding only: ``forward`` returns EmbeddingPoolerOutput whatever get_embedding is."""

    qkv_bias_default = False
    qk_norm = False
    supports_prefix_reuse = True
    tie_word_embeddings = False  # no LM head (read by the shared weight loader)
    stacked_params_mapping = LlamaForCausalLM.stacked_params_mapping

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config
        qkv_bias = getattr(config, "attention_bias", self.qkv_bias_default) or self.qkv_bias_default
        self.model = LlamaModel(config, qkv_bias=qkv_bias, qk_norm=self.qk_norm)
        self.pooler = Pooler(PoolingType.LAST, normalize=True)

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        fb: ForwardBatch,
        get_embedding: bool = True,
    ) -> EmbeddingPoolerOutput:
        return self.pooler(self.model(input_ids, positions, fb), fb)

    def load_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], strict: bool = True
    ) -> None:
        """HF names with or without the "model." prefix; an LM head in the file is skipped."""
        renamed = (
            (name if name.startswith("model.") else f"model.{name}", tensor)
            for name, tensor in weights
            if not name.startswith("lm_head.")
        )
        LlamaForCausalLM.load_weights(self, renamed, strict)  # type: ignore[arg-type]


class MistralModel(LlamaEmbeddingModel):
    pass
