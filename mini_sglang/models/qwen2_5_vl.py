"""Qwen2_5_VLForConditionalGeneration: a windowed-ViT vision tower over our Qwen2 decoder.

The language model is LlamaModel with Qwen2's q/k/v bias and paged KV; its rope parameters
carry `mrope_section`, so get_rope builds an MRotaryEmbedding. Positions:
- extend: ForwardBatch.mrope_positions [3, T] (temporal / height / width of image tokens,
  the text position repeated elsewhere), computed per request at tokenization
  (multimodal/mrope.py) and sliced per extend chunk here (mrope_extend_positions).
  forward() turns them into one cos/sin row per token (fb.rope_cos_sin) and runs the
  decoder with positions 0..T-1 into those rows, so every RoPE kernel, fused or not,
  applies M-RoPE unchanged.
- decode: the three positions of a generated token are equal, seq position +
  mrope_position_delta (the scheduler adds the delta), so decode is plain RoPE and runs in
  the CUDA graphs as any text model.

Image tokens: the processor expands each `<|image_pad|>` to t * h * w / merge**2 tokens
(image_grid_thw); pad_input_ids replaces them by the image's hash-derived pad value, and
general_mm_embed_routine puts get_image_feature's rows there.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
from torch import nn

from mini_sglang.layers.logits_processor import LogitsProcessor, LogitsProcessorOutput
from mini_sglang.layers.rotary_embedding import MRotaryEmbedding
from mini_sglang.layers.vocab_parallel_embedding import ParallelLMHead
from mini_sglang.models.llama import LlamaModel
from mini_sglang.models.qwen2 import Qwen2ForCausalLM
from mini_sglang.models.weight_loading import load_checkpoint_weights
from mini_sglang.multimodal.mm_inputs import MultimodalDataItem, MultimodalInputs
from mini_sglang.multimodal.mm_utils import (
    MultiModalityDataPaddingPatternMultimodalTokens,
    general_mm_embed_routine,
)

if TYPE_CHECKING:
    from mini_sglang.model_executor.forward_batch_info import ForwardBatch


def build_vision_tower(vision_config) -> nn.Module:
    """transformers' Qwen2_5_VisionTransformerPretrainedModel (patch embed, windowed and full
    attention blocks with 2-D RoPE, patch merger), replicated on every TP rank.

    Reused rather than rewritten: the tower is a small share of the FLOPs (it runs once per
    image, during prefill; ~0.7B of Qwen2.5-VL-7B's 8B parameters) and the HF module is the
    reference its outputs are checked against. Built in the current default dtype and device
    (model_loader.get_model sets both); its parameter names are the checkpoint's `visual.*`.
    """
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import (
        Qwen2_5_VisionTransformerPretrainedModel,
    )

    if getattr(vision_config, "_attn_implementation", None) is None:
        vision_config._attn_implementation = "sdpa"
    return Qwen2_5_VisionTransformerPretrainedModel._from_config(
        vision_config, dtype=torch.get_default_dtype()
    )


class Qwen2_5_VLForConditionalGeneration(nn.Module):
    """Qwen2.5-VL: `config` is the whole Qwen2_5_VLConfig (text_config, vision_config,
    image_token_id, ...). Checkpoint names: `model.*` (decoder), `lm_head.*`, `visual.*`."""

    stacked_params_mapping = Qwen2ForCausalLM.stacked_params_mapping

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config
        text = getattr(config, "text_config", None) or config
        self.text_config = text
        self.visual = build_vision_tower(config.vision_config)
        self.model = LlamaModel(text, qkv_bias=True, qk_norm=False)
        self.rotary_emb = self.model.layers[0].self_attn.rotary_emb
        if not isinstance(self.rotary_emb, MRotaryEmbedding):
            raise ValueError(
                "Qwen2.5-VL needs `mrope_section` in the text config's rope parameters"
            )
        self.tie_word_embeddings = bool(getattr(text, "tie_word_embeddings", False)) or bool(
            getattr(config, "tie_word_embeddings", False)
        )
        if self.tie_word_embeddings:
            self.lm_head = self.model.embed_tokens
        else:
            self.lm_head = ParallelLMHead(text.vocab_size, text.hidden_size)
        self.logits_processor = LogitsProcessor(text.vocab_size)
        self.image_token_id = config.image_token_id
        self.spatial_merge_size = config.vision_config.spatial_merge_size

    # ---- multimodal interface (multimodal/mm_utils.py) --------------------------------
    def pad_input_ids(self, input_ids: list[int], mm_inputs: MultimodalInputs) -> list[int]:
        """The prompt with each image's placeholder tokens set to its pad value."""
        return MultiModalityDataPaddingPatternMultimodalTokens().pad_input_tokens(
            input_ids, mm_inputs
        )

    def get_image_feature(self, items: list[MultimodalDataItem]) -> torch.Tensor:
        """[sum of t * h * w / merge**2 over items, hidden] vision features, items in order
        (each item: feature = pixel_values [t * h * w patches, C * T * P * P],
        image_grid_thw [1, 3])."""
        param = self.visual.patch_embed.proj.weight
        pixel_values = torch.cat([item.feature for item in items], dim=0)
        grid_thw = torch.cat([_grid_thw(item) for item in items], dim=0)
        out = self.visual(
            pixel_values.to(param.device, param.dtype), grid_thw=grid_thw.to(param.device)
        )
        return getattr(out, "pooler_output", out)

    # ---- forward ---------------------------------------------------------------------
    @torch.no_grad()
    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch
    ) -> LogitsProcessorOutput:
        mrope = mrope_extend_positions(fb, positions)
        if mrope is not None:
            fb.mrope_positions = mrope
            fb.rope_cos_sin = self.rotary_emb.cos_sin_rows(mrope)
            positions = torch.arange(mrope.shape[1], device=positions.device)
        hidden = general_mm_embed_routine(input_ids, fb, self.model, self, positions)
        return self.logits_processor(hidden, self.lm_head, fb)

    def load_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], strict: bool = True
    ) -> None:
        """Checkpoint tensors (HF names) into the decoder's fused, sharded parameters and the
        vision tower's (copied as they are). Raises ValueError naming unfilled parameters
        unless strict is False."""
        load_checkpoint_weights(
            self,
            _hf_names(weights),
            self.stacked_params_mapping,
            self.tie_word_embeddings,
            strict,
            unstacked_prefixes=("visual.",),
        )


def _grid_thw(item: MultimodalDataItem) -> torch.Tensor:
    return torch.as_tensor(item.image_grid_thw, dtype=torch.int64).reshape(-1, 3)


def mrope_extend_positions(fb: ForwardBatch, positions: torch.Tensor) -> torch.Tensor | None:
    """int64 [3, extend tokens] M-RoPE positions of this extend, or None when no row has
    mrope_positions (decode, text-only batches: `positions` then serve all three axes).

    Row i extends prompt positions prefix_i .. prefix_i + extend_i - 1: those inside its
    prompt take its MultimodalInputs.mrope_positions columns (a chunk takes its slice),
    those past it (output tokens re-run after a retraction) p + mrope_position_delta; a
    row without them (text requests, MIXED decode rows, whose positions the scheduler has
    already shifted) repeats its `positions` entries."""
    rows = fb.mm_inputs
    if not fb.forward_mode.is_extend() or rows is None:
        return None
    if all(m is None or m.mrope_positions is None for m in rows):
        return None
    pieces, start = [], 0
    for m, p, e in zip(rows, fb.extend_prefix_lens_cpu, fb.extend_seq_lens_cpu):
        if m is None or m.mrope_positions is None:
            pieces.append(positions[start : start + e].expand(3, -1))
        else:
            prompt = m.mrope_positions
            pieces.append(prompt[:, p : p + e].to(positions.device))
            past = max(p, prompt.shape[1])
            if p + e > past:
                tail = torch.arange(past, p + e) + int(m.mrope_position_delta)
                pieces.append(tail.to(positions.device).expand(3, -1))
        start += e
    return torch.cat(pieces, dim=1)


def _hf_names(weights: Iterable[tuple[str, torch.Tensor]]):
    """transformers >= 5 saves `model.language_model.*` / `model.visual.*`; published
    checkpoints use `model.*` / `visual.*`. Yield the latter."""
    for name, tensor in weights:
        if name.startswith("model.language_model."):
            name = "model." + name[len("model.language_model.") :]
        elif name.startswith("model.visual."):
            name = name[len("model.") :]
        yield name, tensor
