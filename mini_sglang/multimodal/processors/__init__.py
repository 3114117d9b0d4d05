"""The multimodal processor registry, keyed by HF architecture name.

A model family adds its processor module here (a BaseMultimodalProcessor subclass whose
``models`` lists the architectures it serves); ``get_mm_processor`` picks it for a config.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from mini_sglang.multimodal.processors.base_processor import BaseMultimodalProcessor
from mini_sglang.multimodal.processors.llava import LlavaImageProcessor
from mini_sglang.multimodal.processors.qwen_vl import QwenVLImageProcessor

PROCESSOR_CLASSES: list[type[BaseMultimodalProcessor]] = [
    LlavaImageProcessor,
    QwenVLImageProcessor,
]
PROCESSOR_REGISTRY: dict[str, type[BaseMultimodalProcessor]] = {
    arch: cls for cls in PROCESSOR_CLASSES for arch in cls.models
}


def is_multimodal_architecture(architectures: list[str] | None) -> bool:
    return any(arch in PROCESSOR_REGISTRY for arch in architectures or [])


@dataclass
class TokenizerAndImageProcessor:
    """The two parts of an HF processor that image prompts need (get_processor's stand-in)."""

    tokenizer: Any
    image_processor: Any


def get_processor(model_path: str, trust_remote_code: bool = False, tokenizer: Any = None) -> Any:
    """The model's HF processor (AutoProcessor: tokenizer + image processor). Where
    transformers cannot build it because a component's optional dependency is missing
    (ImportError; e.g. Qwen2.5-VL's AutoProcessor also builds a video processor, which
    needs torchvision), its tokenizer and AutoImageProcessor, which is all images need.
    A `tokenizer` already loaded is reused with AutoImageProcessor (loading the tokenizer
    a second time costs seconds at start-up)."""
    from transformers import AutoImageProcessor, AutoProcessor, AutoTokenizer

    if tokenizer is not None:
        image_processor = AutoImageProcessor.from_pretrained(
            model_path, trust_remote_code=trust_remote_code
        )
        if not getattr(tokenizer, "chat_template", None):
            tokenizer.chat_template = processor_chat_template(model_path)
        return TokenizerAndImageProcessor(tokenizer, image_processor)
    try:
        return AutoProcessor.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    except ImportError:
        return TokenizerAndImageProcessor(
            AutoTokenizer.from_pretrained(model_path, trust_remote_code=trust_remote_code),
            AutoImageProcessor.from_pretrained(model_path, trust_remote_code=trust_remote_code),
        )


def processor_chat_template(model_path: str) -> str | None:
    """The chat template a processor keeps beside the tokenizer (chat_template.json, as
    llava-hf checkpoints ship it), or None."""
    path = os.path.join(model_path, "chat_template.json")
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        template = json.load(f).get("chat_template")
    return template if isinstance(template, str) else None


def get_mm_processor(
    hf_config: Any, server_args: Any, processor: Any
) -> BaseMultimodalProcessor | None:
    """The processor for hf_config's architecture, or None for a text-only model."""
    for arch in getattr(hf_config, "architectures", None) or []:
        cls = PROCESSOR_REGISTRY.get(arch)
        if cls is not None:
            return cls(hf_config, server_args, processor)
    return None
