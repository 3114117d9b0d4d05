"""Maps HF `architectures` names to model classes.

A model class may set ``supports_prefix_reuse = False`` (non-causal encoders): the
scheduler then runs it without the radix cache's prefix sharing and without chunked
prefill (see layers/pooler.py); the default is True.
"""

from __future__ import annotations

from torch import nn

from mini_sglang.models.bert import BertForSequenceClassification, BertModel
from mini_sglang.models.llama import LlamaForCausalLM
from mini_sglang.models.llama_embedding import LlamaEmbeddingModel, MistralModel
from mini_sglang.models.llava import LlavaForConditionalGeneration
from mini_sglang.models.mixtral import MixtralForCausalLM
from mini_sglang.models.qwen2 import Qwen2ForCausalLM
from mini_sglang.models.qwen2_5_vl import Qwen2_5_VLForConditionalGeneration
from mini_sglang.models.qwen2_moe import Qwen2MoeForCausalLM
from mini_sglang.models.qwen3 import Qwen3ForCausalLM
from mini_sglang.models.qwen3_moe import Qwen3MoeForCausalLM
from mini_sglang.models.sequence_classification import (
    LlamaForSequenceClassification,
    Qwen2ForRewardModel,
    Qwen2ForSequenceClassification,
    Qwen3ForSequenceClassification,
)
from mini_sglang.models.xlm_roberta import XLMRobertaForSequenceClassification, XLMRobertaModel

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "LlavaForConditionalGeneration": LlavaForConditionalGeneration,
    "MistralForCausalLM": LlamaForCausalLM,
    "MixtralForCausalLM": MixtralForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen2MoeForCausalLM": Qwen2MoeForCausalLM,
    "Qwen2_5_VLForConditionalGeneration": Qwen2_5_VLForConditionalGeneration,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
    "Qwen3MoeForCausalLM": Qwen3MoeForCausalLM,
    # Embedding and score models (model_config.EMBEDDING_ARCHITECTURES).
    "LlamaEmbeddingModel": LlamaEmbeddingModel,
    "MistralModel": MistralModel,
    "LlamaForSequenceClassification": LlamaForSequenceClassification,
    "Qwen2ForSequenceClassification": Qwen2ForSequenceClassification,
    "Qwen3ForSequenceClassification": Qwen3ForSequenceClassification,
    "Qwen2ForRewardModel": Qwen2ForRewardModel,
    # Encoders (non-causal; supports_prefix_reuse False).
    "BertModel": BertModel,
    "BertForSequenceClassification": BertForSequenceClassification,
    "XLMRobertaModel": XLMRobertaModel,
    "XLMRobertaForSequenceClassification": XLMRobertaForSequenceClassification,
}


def resolve_model_class(architectures: list[str] | None) -> type[nn.Module]:
    for arch in architectures or []:
        if arch in MODEL_REGISTRY:
            return MODEL_REGISTRY[arch]
    raise ValueError(
        f"Model architectures {architectures} are not supported. "
        f"Supported architectures: {', '.join(sorted(MODEL_REGISTRY))}"
    )
