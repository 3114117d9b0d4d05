"""Tokenizer loading (transformers' AutoTokenizer), shared by every process."""

from __future__ import annotations

import os
from typing import Any

from mini_sglang.utils.gguf_path import is_gguf_path


def get_tokenizer(tokenizer_path: str, server_args: Any = None) -> Any:
    """AutoTokenizer for a directory (or a .gguf file, whose tokenizer transformers reads)."""
    from transformers import AutoTokenizer

    trust = bool(getattr(server_args, "trust_remote_code", False))
    use_fast = getattr(server_args, "tokenizer_mode", "auto") != "slow"
    if is_gguf_path(tokenizer_path):
        directory, name = os.path.split(os.path.abspath(tokenizer_path))
        return AutoTokenizer.from_pretrained(directory, gguf_file=name, use_fast=use_fast)
    return AutoTokenizer.from_pretrained(tokenizer_path, trust_remote_code=trust, use_fast=use_fast)
