"""Optional GPU kernel libraries, imported once and lazily.

Every caller keeps a torch path, so a missing library (always the case on CPU) only costs
speed. Set MINI_SGLANG_DISABLE_FLASHINFER_OPS=1 to force the torch paths on CUDA.
"""

from __future__ import annotations

import functools
import os
from types import ModuleType


@functools.cache
def _flashinfer() -> ModuleType | None:
    if os.environ.get("MINI_SGLANG_DISABLE_FLASHINFER_OPS") == "1":
        return None
    try:
        import flashinfer  # noqa: F401
    except Exception:
        return None
    return flashinfer


def flashinfer_norm() -> ModuleType | None:
    fi = _flashinfer()
    return fi.norm if fi is not None else None


def flashinfer_activation() -> ModuleType | None:
    fi = _flashinfer()
    return fi.activation if fi is not None else None


def flashinfer_sampling() -> ModuleType | None:
    fi = _flashinfer()
    return fi.sampling if fi is not None else None


def flashinfer_module() -> ModuleType | None:
    return _flashinfer()
