"""Score-head models on the Llama / Qwen decoder: sequence classifiers and reward models.

Each runs the decoder, takes the last token's state (a LAST pooler, not normalized) and
applies its head; ``forward`` returns EmbeddingPoolerOutput whose row per request is the
scores (one per label, SGLang's contract: /classify and /v1/classify read them). HF's
heads: ``score`` is Linear(hidden, num_labels, bias=False) for *ForSequenceClassification,
Linear -> ReLU -> Linear(hidden, 1) for Qwen2ForRewardModel. The head runs on the pooled
rows only, which equals HF's head on every token followed by the last-token pick.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from mini_sglang.layers.pooler import EmbeddingPoolerOutput, Pooler, PoolingType
from mini_sglang.models.llama_embedding import LlamaPooledModel

if TYPE_CHECKING:
    from mini_sglang.model_executor.forward_batch_info import ForwardBatch


class LlamaForSequenceClassification(LlamaPooledModel):
    def __init__(self, config) -> None:
        super().__init__(config)
        self.score = self.build_head(config)
        self.pooler = Pooler(PoolingType.LAST, normalize=False)

    @staticmethod
    def build_head(config) -> nn.Module:
        return nn.Linear(config.hidden_size, config.num_labels, bias=False)

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        fb: ForwardBatch,
        get_embedding: bool = True,
    ) -> EmbeddingPoolerOutput:
        last = self.pooler(self.model(input_ids, positions, fb), fb).embeddings
        return EmbeddingPoolerOutput(self.score(last))


class Qwen2ForSequenceClassification(LlamaForSequenceClassification):
    qkv_bias_default = True


class Qwen3ForSequenceClassification(LlamaForSequenceClassification):
    qk_norm = True


class Qwen2ForRewardModel(Qwen2ForSequenceClassification):
    @staticmethod
    def build_head(config) -> nn.Module:
        return nn.Sequential(
            nn.Linear(config.hidden_size, config.hidden_size),
            nn.ReLU(),
            nn.Linear(config.hidden_size, 1),
        )
