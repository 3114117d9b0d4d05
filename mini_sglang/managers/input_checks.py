"""Generate-request fields that ask for features this server lacks: a 400 with SGLang
0.5.4's message (checked by the TokenizerManager before tokenizing).

Fields SGLang itself ignores in the same situation stay ignored: video_data and audio_data,
lora_path without --enable-lora. image_data on a text-only model is refused (400) by the
TokenizerManager, which owns the multimodal processor.
"""

from __future__ import annotations

from typing import Any

# An embedding request on a generation model (SGLang 0.5.4's text).
NOT_AN_EMBEDDING_MODEL = (
    "This model does not appear to be an embedding model by default. "
    "Please add `--is-embedding` when launching the server or try another model."
)
# A generate request on an embedding / score model (SGLang 0.5.4 has no check there).
NOT_A_GENERATION_MODEL = (
    "This model is an embedding model, not a generation model "
    "(launched with `--is-embedding` or an embedding architecture). "
    "Use /encode, /classify, /v1/embeddings or /v1/classify instead."
)


def check_generate_features(obj: Any, server_args: Any) -> None:
    """Raise ValueError for input_embeds with the radix cache on, return_hidden_states or
    custom_logit_processor."""
    if obj.input_embeds is not None and not server_args.disable_radix_cache:
        # The prefix cache keys on token ids, which an embedding prompt lacks (SGLang).
        raise ValueError(
            "input_embeds is provided while disable_radix_cache is False. "
            "Please add `--disable-radix-cache` when you launch the server "
            "if you want to use input_embeds as inputs."
        )
    if obj.return_hidden_states and not server_args.enable_return_hidden_states:
        raise ValueError(
            "The server is not configured to return the hidden states. "
            "Please set `--enable-return-hidden-states` to enable this feature."
        )
    if obj.custom_logit_processor and not server_args.enable_custom_logit_processor:
        raise ValueError(
            "The server is not configured to enable custom logit processor. "
            "Please set `--enable-custom-logit-processor` to enable this feature."
        )
