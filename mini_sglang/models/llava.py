"""LlavaForConditionalGeneration: a CLIP or SigLIP vision tower, a two-layer projector and a
Llama / Mistral / Qwen2 language model (our own class, with paged KV and TP).

An image becomes the projector's output rows for the tower's patch features (the CLS row
dropped under vision_feature_select_strategy "default"); those rows replace the image's
placeholder tokens in the prompt (multimodal/mm_utils.py general_mm_embed_routine), and the
language model runs on the merged embeddings as on any prompt.

The vision tower is transformers' own module (AutoModel for the vision_config:
CLIPVisionModel, SiglipVisionModel), replicated on every TP rank: it is a small share of a
request's FLOPs (one pass per image, at prefill only), and the HF module is the reference
its outputs are checked against. The projector is TP-split like an MLP (column then row
parallel); the language model shards as it does alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from mini_sglang.layers.linear import ColumnParallelLinear, RowParallelLinear
from mini_sglang.layers.logits_processor import LogitsProcessorOutput
from mini_sglang.models.llama import LlamaForCausalLM
from mini_sglang.models.qwen2 import Qwen2ForCausalLM
from mini_sglang.models.qwen3 import Qwen3ForCausalLM
from mini_sglang.models.weight_loading import check_nothing_missing, load_tensor
from mini_sglang.multimodal.mm_inputs import MultimodalDataItem, MultimodalInputs
from mini_sglang.multimodal.mm_utils import (
    MultiModalityDataPaddingPatternMultimodalTokens,
    general_mm_embed_routine,
)

if TYPE_CHECKING:
    from mini_sglang.model_executor.forward_batch_info import ForwardBatch

# text_config.model_type -> our language model class
LANGUAGE_MODELS: dict[str, type[nn.Module]] = {
    "llama": LlamaForCausalLM,
    "mistral": LlamaForCausalLM,
    "qwen2": Qwen2ForCausalLM,
    "qwen3": Qwen3ForCausalLM,
}


def _feature_layers(config) -> list[int]:
    layer = config.vision_feature_layer
    return [layer] if isinstance(layer, int) else list(layer)


class LlavaMultiModalProjector(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        from transformers.activations import ACT2FN

        vision_hidden = config.vision_config.hidden_size * len(_feature_layers(config))
        text_hidden = config.text_config.hidden_size
        bias = getattr(config, "multimodal_projector_bias", True)
        self.linear_1 = ColumnParallelLinear(vision_hidden, text_hidden, bias=bias)
        self.act = ACT2FN[config.projector_hidden_act]
        self.linear_2 = RowParallelLinear(text_hidden, text_hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_2(self.act(self.linear_1(x)))


class LlavaForConditionalGeneration(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        from transformers import AutoModel

        self.config = config
        text_type = config.text_config.model_type
        if text_type not in LANGUAGE_MODELS:
            raise ValueError(
                f"LLaVA with a {text_type!r} language model is not supported "
                f"(supported: {', '.join(sorted(LANGUAGE_MODELS))})."
            )
        self.vision_tower = AutoModel.from_config(config.vision_config)
        self.multi_modal_projector = LlavaMultiModalProjector(config)
        self.language_model = LANGUAGE_MODELS[text_type](config.text_config)
        self.feature_layers = _feature_layers(config)
        self.drop_cls = config.vision_feature_select_strategy == "default"
        self.padding = MultiModalityDataPaddingPatternMultimodalTokens()

    # ---- the multimodal model interface (multimodal/mm_utils.py) ---------------------
    def pad_input_ids(self, input_ids: list[int], mm_inputs: MultimodalInputs) -> list[int]:
        return self.padding.pad_input_tokens(input_ids, mm_inputs)

    def get_image_feature(self, items: list[MultimodalDataItem]) -> torch.Tensor:
        """[images x features per image, text hidden]: the projected tower features."""
        param = self.multi_modal_projector.linear_1.weight
        pixels = torch.cat([item.feature for item in items]).to(param.device, param.dtype)
        out = self.vision_tower(pixels, output_hidden_states=True)
        states = [out.hidden_states[i] for i in self.feature_layers]
        if self.drop_cls:
            states = [s[:, 1:] for s in states]
        return self.multi_modal_projector(torch.cat(states, dim=-1)).flatten(0, 1)

    @torch.no_grad()
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch
    ) -> LogitsProcessorOutput:
        lm = self.language_model
        hidden = general_mm_embed_routine(input_ids, fb, lm.model, self, positions)
        return lm.logits_processor(hidden, lm.lm_head, fb)

    # ---- weights -----------------------------------------------------------------------
    def load_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], strict: bool = True
    ) -> None:
        """Checkpoint names of both transformers layouts: "model.language_model.*",
        "model.vision_tower.*", "model.multi_modal_projector.*", "lm_head.*" (v5) and
        "language_model.model.*", "language_model.lm_head.*", "vision_tower.*",
        "multi_modal_projector.*" (earlier). ValueError naming unfilled parameters unless
        strict is False."""
        own = {f"vision_tower.{n}": p for n, p in self.vision_tower.named_parameters()}
        own.update(
            {
                f"multi_modal_projector.{n}": p
                for n, p in self.multi_modal_projector.named_parameters()
            }
        )
        loaded: set[str] = set()

        def language_weights() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                lm_name = _language_model_name(name)
                if lm_name is not None:
                    yield lm_name, tensor
                    continue
                target = _vision_name(name, own)
                if target is None:
                    continue
                load_tensor(own[target], tensor)
                loaded.add(target)

        self.language_model.load_weights(language_weights(), strict=strict)
        if strict:
            check_nothing_missing(set(own) - loaded)


def _language_model_name(name: str) -> str | None:
    """The language model's own name for a checkpoint name of it, else None."""
    for prefix, replacement in (
        ("model.language_model.", "model."),
        ("language_model.model.", "model."),
        ("language_model.lm_head.", "lm_head."),
        ("lm_head.", "lm_head."),
    ):
        if name.startswith(prefix):
            return replacement + name[len(prefix) :]
    return None


def _vision_name(name: str, own: dict[str, nn.Parameter]) -> str | None:
    """Our parameter name for a tower / projector checkpoint name (with or without the
    tower's "vision_model." level), else None."""
    if name.startswith("model."):
        name = name[len("model.") :]
    if name in own:
        return name
    for a, b in (
        ("vision_tower.vision_model.", "vision_tower."),
        ("vision_tower.", "vision_tower.vision_model."),
    ):
        if name.startswith(a):
            alt = b + name[len(a) :]
            if alt in own:
                return alt
    return None
