"""Pooling: one vector per request out of a prefill's hidden states (SGLang's embedding path).

The embedding contract (SGLang 0.5.4's, see layers/pooler.py, models/llama_embedding.py,
managers/tp_worker.py there):

- A model's ``forward(input_ids, positions, fb, get_embedding=False)``. A generation model
  (LlamaForCausalLM and its subclasses) returns logits unless ``get_embedding`` is True,
  then ``self.pooler(hidden, fb)``. An embedding-only class (LlamaEmbeddingModel, the
  score-head classifiers, the encoders) returns ``EmbeddingPoolerOutput`` always.
- ``EmbeddingPoolerOutput.embeddings`` has one row per request of the batch, in batch
  order: the pooled (and, when the pooler normalizes, L2-normalized) hidden state, or for a
  classifier / reward model the row of scores (one per label; SGLang's name is kept).
- Pooling reads the ForwardBatch of an EXTEND forward: request i's tokens are rows
  ``extend_start_loc[i] .. extend_start_loc[i] + extend_seq_lens[i] - 1`` of the hidden
  states. LAST takes the last of them, CLS the first, MEAN their average.
- Only the tokens computed in this forward are seen. A causal model may reuse a cached
  prefix (the radix cache) and prefill a long input in chunks: the last token is always
  computed in the final chunk and attends to the whole input, so LAST pooling is exact;
  the scheduler keeps only the final chunk's row (SGLang 0.5.4 does the same). CLS and MEAN
  need every token in one forward: such a model, and any model class whose
  ``supports_prefix_reuse`` is False (the non-causal encoders), runs without prefix sharing
  and without chunked prefill (``supports_prefix_reuse(model, is_generation)``).
- ``TpModelWorker.forward_batch_embedding(batch)`` runs the forward with
  ``get_embedding=True`` and returns the embeddings as a float32 CPU tensor.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from enum import IntEnum
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from mini_sglang.model_executor.forward_batch_info import ForwardBatch


class PoolingType(IntEnum):
    """Which of a request's token states becomes its embedding (SGLang's LAST = 0, CLS = 1)."""

    LAST = 0
    CLS = 1
    MEAN = 2


@dataclass(frozen=True)
class PoolingConfig:
    """How a model directory says to pool (sentence-transformers' 1_Pooling and Normalize)."""

    pooling_type: PoolingType
    normalize: bool


# sentence-transformers' Pooling config keys, in the order a mode is taken when several are on.
_POOLING_MODES = (
    ("pooling_mode_lasttoken", PoolingType.LAST),
    ("pooling_mode_cls_token", PoolingType.CLS),
    ("pooling_mode_mean_tokens", PoolingType.MEAN),
)


def read_sentence_transformers_pooling(model_dir: str) -> PoolingConfig | None:
    """The pooling that sentence-transformers' ``modules.json`` (its Pooling module's
    ``config.json``, a Normalize module) gives, or None without a readable modules.json or
    Pooling module. Raises ValueError for a pooling mode this server lacks (max, weighted
    mean): silently pooling otherwise would give wrong vectors."""
    path = os.path.join(model_dir, "modules.json") if os.path.isdir(model_dir) else ""
    if not path or not os.path.isfile(path):
        return None
    with open(path) as f:
        modules = json.load(f)
    types = {m.get("type", ""): m.get("path", "") for m in modules if isinstance(m, dict)}
    pooling_dir = next((p for t, p in types.items() if t.endswith("models.Pooling")), None)
    if pooling_dir is None:
        return None
    with open(os.path.join(model_dir, pooling_dir, "config.json")) as f:
        cfg = json.load(f)
    normalize = any(t.endswith("models.Normalize") for t in types)
    for key, pooling_type in _POOLING_MODES:
        if cfg.get(key):
            return PoolingConfig(pooling_type, normalize)
    on = sorted(k for k, v in cfg.items() if k.startswith("pooling_mode") and v)
    raise ValueError(f"Unsupported sentence-transformers pooling in {model_dir}: {on}")


def supports_prefix_reuse(model: nn.Module, is_generation: bool) -> bool:
    """Whether the scheduler may share cached prefixes and chunk prefills for `model`: a
    generation model or a LAST-pooling embedder whose class does not opt out
    (``supports_prefix_reuse = False``, the non-causal encoders). CLS and MEAN pooling need
    every token's state in one forward."""
    if not getattr(model, "supports_prefix_reuse", True):
        return False
    pooler = getattr(model, "pooler", None)
    return is_generation or pooler is None or pooler.pooling_type == PoolingType.LAST


@dataclass
class EmbeddingPoolerOutput:
    """``embeddings``: [batch, dim], one row per request (scores for a classifier)."""

    embeddings: torch.Tensor


class Pooler(nn.Module):
    """Pools hidden states [tokens, dim] of an EXTEND forward into [batch, dim]; with
    ``normalize`` each row gets unit L2 norm (sentence-transformers' Normalize module)."""

    def __init__(self, pooling_type: PoolingType, normalize: bool) -> None:
        super().__init__()
        self.pooling_type = PoolingType(pooling_type)
        self.normalize = normalize

    def forward(self, hidden: torch.Tensor, fb: ForwardBatch) -> EmbeddingPoolerOutput:
        lens = fb.extend_seq_lens.to(hidden.device).long()
        starts = fb.extend_start_loc.to(hidden.device).long()
        if self.pooling_type == PoolingType.LAST:
            pooled = hidden[starts + lens - 1]
        elif self.pooling_type == PoolingType.CLS:
            pooled = hidden[starts]
        else:
            row_of_token = torch.repeat_interleave(
                torch.arange(len(lens), device=hidden.device), lens
            )
            sums = torch.zeros(
                len(lens), hidden.shape[-1], dtype=torch.float32, device=hidden.device
            )
            sums.index_add_(0, row_of_token, hidden.float())
            pooled = (sums / lens.unsqueeze(1).float()).to(hidden.dtype)
        if self.normalize:
            pooled = nn.functional.normalize(pooled, p=2, dim=1)
        return EmbeddingPoolerOutput(embeddings=pooled)
