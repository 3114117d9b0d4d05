"""XLM-RoBERTa encoders: XLMRobertaModel (embeddings) and XLMRobertaForSequenceClassification
(cross-encoder scores, e.g. bge-reranker).

The encoder is BERT's (models/bert.py); only the positions differ. RoBERTa numbers positions
from padding_idx + 1 and gives padding tokens padding_idx itself (transformers'
create_position_ids_from_input_ids): with pad id 1, a sequence [0, 57, 1, 9] has positions
[2, 3, 1, 4]. The position table therefore has padding_idx + 1 more rows than the longest
input (514 for 512 tokens).

Pooling, as SGLang 0.5.4's models: XLMRobertaModel pools CLS with normalization unless the
model directory's sentence-transformers config says otherwise (ModelConfig.pooling); the
classifier takes the first token through dense + tanh + out_proj, SGLang's
CrossEncodingPooler without a pooler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from mini_sglang.layers.pooler import PoolingType
from mini_sglang.models.bert import BertEmbedding, BertModel, EncoderCrossEncoder

if TYPE_CHECKING:
    from mini_sglang.model_executor.forward_batch_info import ForwardBatch


class XLMRobertaEmbedding(BertEmbedding):
    def __init__(self, config) -> None:
        super().__init__(config)
        self.padding_idx = config.pad_token_id

    def position_ids(
        self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch
    ) -> torch.Tensor:
        """padding_idx + the count of non-padding tokens up to and including each token of
        its sequence, or padding_idx for a padding token. The extend holds whole sequences
        (encoders have no cached prefix), each starting at extend_start_loc."""
        not_pad = (input_ids != self.padding_idx).long()
        count = torch.cumsum(not_pad, 0)
        lens = fb.extend_seq_lens.to(count.device).long()
        starts = fb.extend_start_loc.to(count.device).long()
        before = (count - not_pad)[starts]  # non-padding tokens before each sequence
        count = count - torch.repeat_interleave(before, lens, output_size=len(input_ids))
        return count * not_pad + self.padding_idx


class XLMRobertaModel(BertModel):
    """Sentence embeddings from an XLM-RoBERTa encoder (one pooled row per request)."""

    checkpoint_prefix = "roberta"
    default_pooling = (PoolingType.CLS, True)  # SGLang 0.5.4's XLMRobertaModel
    embedding_cls = XLMRobertaEmbedding


class XLMRobertaClassificationHead(nn.Module):
    """out_proj(tanh(dense(first token))) per request: [batch, num_labels]."""

    def __init__(self, config) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.out_proj = nn.Linear(config.hidden_size, config.num_labels)

    def forward(self, hidden: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        return self.out_proj(torch.tanh(self.dense(hidden[fb.extend_start_loc.long()])))


class XLMRobertaForSequenceClassification(EncoderCrossEncoder):
    """An XLM-RoBERTa cross-encoder: the classification head over the first token."""

    checkpoint_prefix = "roberta"

    def __init__(self, config) -> None:
        super().__init__(config)
        self.roberta = XLMRobertaModel(config)
        self.classifier = XLMRobertaClassificationHead(config)

    def head(self, hidden: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        return self.classifier(hidden, fb)
