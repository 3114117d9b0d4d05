"""Attention backends; importing this package registers the ones usable here."""

from __future__ import annotations

from mini_sglang.layers.attention import torch_native_backend  # noqa: F401
