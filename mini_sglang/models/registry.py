"""Maps HF `architectures` names to model classes."""

from __future__ import annotations

from torch import nn

from mini_sglang.models.llama import LlamaForCausalLM
from mini_sglang.models.qwen2 import Qwen2ForCausalLM
from mini_sglang.models.qwen3 import Qwen3ForCausalLM

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
}


def resolve_model_class(architectures: list[str] | None) -> type[nn.Module]:
    for arch in architectures or []:
        if arch in MODEL_REGISTRY:
            return MODEL_REGISTRY[arch]
    raise ValueError(
        f"Model architectures {architectures} are not supported. "
        f"Supported architectures: {', '.join(sorted(MODEL_REGISTRY))}"
    )
