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
from mini_sglang.models.weight_loading import load_checkpoint_weights

if TYPE_CHECKING:
    from mini_sglang.model_executor.forward_batch_info import ForwardBatch


class LlamaPooledModel(nn.Module):
    """The Llama decoder (`self.model`) without an LM head, for models that pool its states;
    subclasses add their pooler and head in `__init__` and define `forward`. `load_weights`
    takes HF names through `param_name`, skipping an LM head in the checkpoint."""

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

    @staticmethod
    def param_name(name: str) -> str:
        """This model's parameter name for the HF tensor `name` (the same by default)."""
        return name

    def load_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], strict: bool = True
    ) -> None:
        """HF names through `param_name`; an LM head in the file is skipped."""
        kept = ((self.param_name(n), t) for n, t in weights if not n.startswith("lm_head."))
        load_checkpoint_weights(self, kept, self.stacked_params_mapping, False, strict)


class LlamaEmbeddingModel(LlamaPooledModel):
    """Embedding only: ``forward`` returns EmbeddingPoolerOutput whatever get_embedding is."""

    def __init__(self, config) -> None:
        super().__init__(config)
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

    @staticmethod
    def param_name(name: str) -> str:
        """HF names with or without the "model." prefix."""
        return name if name.startswith("model.") else f"model.{name}"


class MistralModel(LlamaEmbeddingModel):
    pass
