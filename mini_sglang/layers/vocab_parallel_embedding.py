"""Vocabulary-parallel embedding and LM head: each rank owns a contiguous slice of the vocab.

The vocab is padded to a multiple of 64 * tp_size (as SGLang does) so every rank's slice has
the same size; padded rows are zero and their logits are cut off before sampling.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mini_sglang.distributed.parallel_state import (
    get_tp_rank,
    get_tp_size,
    tensor_model_parallel_all_reduce,
)

PAD_MULTIPLE = 64


def pad_vocab_size(vocab_size: int, tp_size: int) -> int:
    multiple = PAD_MULTIPLE * tp_size
    return (vocab_size + multiple - 1) // multiple * multiple


class VocabParallelEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_size()
        self.num_embeddings = num_embeddings
        self.padded_num_embeddings = pad_vocab_size(num_embeddings, self.tp_size)
        self.shard_size = self.padded_num_embeddings // self.tp_size
        self.vocab_start = self.tp_rank * self.shard_size
        self.vocab_end = min(self.vocab_start + self.shard_size, num_embeddings)
        self.weight = nn.Parameter(torch.empty(self.shard_size, embedding_dim), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        rows = self.vocab_end - self.vocab_start
        param.data.zero_()
        param.data[:rows].copy_(loaded[self.vocab_start : self.vocab_end])

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        mask = (input_ids < self.vocab_start) | (input_ids >= self.vocab_end)
        local = torch.where(mask, 0, input_ids - self.vocab_start)
        out = F.embedding(local, self.weight)
        out.masked_fill_(mask.unsqueeze(-1), 0)
        return tensor_model_parallel_all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection; its weight has the embedding's layout (and may be tied to it)."""

    def __init__(self, num_embeddings: int, embedding_dim: int) -> None:
        super().__init__(num_embeddings, embedding_dim)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("ParallelLMHead is applied by LogitsProcessor, not called directly")
