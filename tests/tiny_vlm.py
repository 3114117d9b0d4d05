"""A tiny random LLaVA (CLIP tower + Llama) saved with transformers, with a processor
built in code and a chat template that places image tokens; plus test images.

The Qwen3 tokenizer serves as the text tokenizer; its "<|image_pad|>" special token is the
image placeholder. Images are 32x32 after the processor (patch 8), so each image is 16
placeholder tokens whatever size it is sent at.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path

import torch

from tests.conftest import randomize_norms_and_biases, tiny_config

IMAGE_TOKEN = "<|image_pad|>"
IMAGE_SIZE = 32
PATCH = 8
TOKENS_PER_IMAGE = (IMAGE_SIZE // PATCH) ** 2  # CLS dropped ("default" strategy)
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}"
    "{% if p['type'] == 'image' %}" + IMAGE_TOKEN + "{% else %}{{ p['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tiny_llava(
    out_dir: str | Path, tokenizer, seed: int = 0, text_overrides: dict | None = None
):
    """Save a tiny random LlavaForConditionalGeneration (float32) with its processor and
    chat template into out_dir; return the transformers model in eval mode.
    text_overrides change the language model's config (e.g. a GPU-sized head_dim)."""
    from transformers import (
        CLIPImageProcessor,
        CLIPVisionConfig,
        LlavaConfig,
        LlavaForConditionalGeneration,
        LlavaProcessor,
    )

    image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    vision = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        image_size=IMAGE_SIZE,
        patch_size=PATCH,
        projection_dim=32,
    )
    cfg = LlavaConfig(
        vision_config=vision,
        text_config=tiny_config("llama", len(tokenizer), **(text_overrides or {})),
        image_token_id=image_token_id,
        image_seq_length=TOKENS_PER_IMAGE,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",
        projector_hidden_act="gelu",
    )
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(cfg).to(torch.float32)
    randomize_norms_and_biases(model, seed)
    with torch.no_grad():  # a visible image signal: the projector's output is not tiny
        for p in model.model.multi_modal_projector.parameters():
            p.mul_(4.0)
    model.eval()
    model.save_pretrained(str(out_dir), safe_serialization=True)
    image_processor = CLIPImageProcessor(
        size={"shortest_edge": IMAGE_SIZE},
        crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=PATCH,
        vision_feature_select_strategy="default",
        image_token=IMAGE_TOKEN,
        chat_template=CHAT_TEMPLATE,
        num_additional_image_tokens=1,
    )
    # Saves the tokenizer files too; AutoTokenizer reads the template from
    # chat_template.jinja (the shared tokenizer object is left as it is).
    processor.save_pretrained(str(out_dir))
    return model


def make_image(width: int, height: int, seed: int):
    """A random RGB PIL image."""
    from PIL import Image

    gen = torch.Generator().manual_seed(seed)
    pixels = torch.randint(0, 256, (height, width, 3), generator=gen, dtype=torch.uint8)
    return Image.fromarray(pixels.numpy(), "RGB")


def png_bytes(image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def data_url(image) -> str:
    return "data:image/png;base64," + base64.b64encode(png_bytes(image)).decode()
