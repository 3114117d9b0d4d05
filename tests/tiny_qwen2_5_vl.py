"""A tiny random Qwen2.5-VL saved with transformers (windowed vision tower with a
full-attention block, M-RoPE decoder) beside the Qwen tokenizer, a chat template placing
image tokens and the Qwen2-VL image processor; prompts with 0, 1 and 2 images of different
sizes, and transformers' outputs for them (the reference of the model and server tests).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tests.conftest import TINY_DECODER, randomize_norms_and_biases

MAX_NEW_TOKENS = 16
# A chat template in the shape of Qwen2.5-VL's: each image part becomes
# <|vision_start|><|image_pad|><|vision_end|>, which the processor expands.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] in ('image', 'image_url') %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# (height, width) of each prompt's images: 0, 1 and 2 images of different sizes. With
# patch 14, merge 2 and window 56 each image spans several attention windows.
IMAGE_SIZES = [[], [(84, 112)], [(56, 140), (112, 84)], [(140, 56)]]


def tiny_qwen2_5_vl_config(tokenizer, **text_overrides: Any) -> Any:
    """A two-layer Qwen2.5-VL (hidden 64, head_dim 16, mrope_section [2, 3, 3]; text config
    fields overridable) with a two-block vision tower (hidden 32, window 56: block 0
    windowed, block 1 full)."""
    from transformers import Qwen2_5_VLConfig

    ids = tokenizer.convert_tokens_to_ids
    text = dict(
        TINY_DECODER,
        vocab_size=len(tokenizer),
        intermediate_size=128,
        max_position_embeddings=1024,
        rope_theta=10000.0,
        rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
        eos_token_id=ids("<|im_end|>"),
        tie_word_embeddings=False,
    )
    text.update(text_overrides)
    return Qwen2_5_VLConfig(
        text_config=text,
        vision_config=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=text["hidden_size"],
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=56,
            fullatt_block_indexes=[1],
            initializer_range=text["initializer_range"],
        ),
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=False,
    )


def build_tiny_qwen2_5_vl(path, tokenizer, **text_overrides: Any) -> Any:
    """Save the tiny model, tokenizer (with CHAT_TEMPLATE) and image processor into path;
    return the float32 transformers model."""
    from transformers import Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    torch.manual_seed(0)
    config = tiny_qwen2_5_vl_config(tokenizer, **text_overrides)
    hf = Qwen2_5_VLForConditionalGeneration(config).float()
    randomize_norms_and_biases(hf)
    hf.eval()
    hf.save_pretrained(str(path))
    old_template = tokenizer.chat_template  # the session's tokenizer: leave it as it was
    tokenizer.chat_template = CHAT_TEMPLATE
    try:
        tokenizer.save_pretrained(str(path))
    finally:
        tokenizer.chat_template = old_template
    Qwen2VLImageProcessorPil(
        size={"shortest_edge": 28 * 28 * 2, "longest_edge": 28 * 28 * 64}
    ).save_pretrained(str(path))
    return hf


def random_images(sizes: list[tuple[int, int]], seed: int) -> list[Any]:
    from PIL import Image

    rng = np.random.default_rng(seed)
    return [
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB") for h, w in sizes
    ]


def build_prompts(processor) -> list[tuple[str, list, dict]]:
    """(chat-templated text, images, our processor's output) for each IMAGE_SIZES entry."""
    tok = processor.tokenizer
    out = []
    for k, sizes in enumerate(IMAGE_SIZES):
        content = [{"type": "image"} for _ in sizes] + [{"type": "text", "text": f"Photo {k}?"}]
        if k == 2:  # text between the two images
            content = [content[0], {"type": "text", "text": " and "}, content[1], content[2]]
        text = tok.apply_chat_template(
            [{"role": "user", "content": content}],
            add_generation_prompt=True,
            tokenize=False,
            chat_template=CHAT_TEMPLATE,
        )
        images = random_images(sizes, seed=k)
        if images:
            processed = processor.process_mm_data(images, text, None)
        else:
            processed = {"input_ids": tok.encode(text)}
        out.append((text, images, processed))
    return out


@dataclass
class Prompt:
    text: str
    images: list[Any]
    processed: dict  # our processor's output (input_ids, mm_items, mrope_*)
    hf_logits: torch.Tensor  # [len, vocab]
    hf_output: list[int]


@dataclass
class TinyVL:
    path: str
    hf: Any
    processor: Any  # QwenVLImageProcessor
    prompts: list[Prompt]


def hf_inputs(hf, processed: dict) -> dict:
    ids = torch.tensor([processed["input_ids"]])
    kw: dict[str, Any] = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    items = processed.get("mm_items") or []
    if items:
        kw["pixel_values"] = torch.cat([it.feature for it in items])
        kw["image_grid_thw"] = torch.cat([it.image_grid_thw for it in items])
        kw["mm_token_type_ids"] = (ids == hf.config.image_token_id).int()
    return kw


@torch.no_grad()
def hf_reference(hf, processed: dict) -> tuple[torch.Tensor, list[int]]:
    from transformers import GenerationConfig

    kw = hf_inputs(hf, processed)
    hf.model.rope_deltas = None  # cached per call by transformers: never reuse another's
    logits = hf(**kw).logits[0].float()
    hf.model.rope_deltas = None
    gen = GenerationConfig(
        max_new_tokens=MAX_NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    out = hf.generate(**kw, generation_config=gen)
    return logits, out[0, kw["input_ids"].shape[1] :].tolist()


def build_tiny_vl(path, tokenizer) -> TinyVL:
    """Save the tiny model into path and run every IMAGE_SIZES prompt through our processor
    (over `tokenizer`) and transformers (prefill logits, MAX_NEW_TOKENS greedy tokens)."""
    from transformers import AutoConfig, AutoImageProcessor

    from mini_sglang.multimodal.processors import TokenizerAndImageProcessor
    from mini_sglang.multimodal.processors.qwen_vl import QwenVLImageProcessor

    hf = build_tiny_qwen2_5_vl(path, tokenizer)
    parts = TokenizerAndImageProcessor(tokenizer, AutoImageProcessor.from_pretrained(path))
    processor = QwenVLImageProcessor(AutoConfig.from_pretrained(str(path)), None, parts)
    prompts = []
    for text, images, processed in build_prompts(processor):
        logits, output = hf_reference(hf, processed)
        # Guards the tests' power: one repeated token would match almost any model.
        assert len(set(output)) >= 4, output
        prompts.append(Prompt(text, images, processed, logits, output))
    return TinyVL(str(path), hf, processor, prompts)
