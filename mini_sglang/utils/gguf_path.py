"""Recognising a GGUF checkpoint path without parsing it.

Tokenizer loading, the HF config reader and the weight loader all branch on this test, so it
lives below them and needs neither the ``gguf`` package nor the loader.
"""

from __future__ import annotations

import os

GGUF_MAGIC = b"GGUF"


def is_gguf_path(path: str) -> bool:
    """True if ``path`` names a GGUF checkpoint: a name ending in ``.gguf`` (existing or not,
    so a missing file still reaches the GGUF loader's clear error) or an existing file that
    starts with the GGUF magic bytes."""
    path = str(path)
    if path.lower().endswith(".gguf"):
        return True
    if not os.path.isfile(path):
        return False
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False
