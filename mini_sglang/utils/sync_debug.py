"""Find host<->device synchronisations on a code path (CUDA only).

With overlap scheduling the host prepares step N+1 while the GPU runs step N, so any
implicit sync on that path (`.item()`, `int(device_tensor)`, a pageable copy, an op whose
output size depends on device data such as `nonzero` or `repeat_interleave` without
`output_size`) makes the host wait for the GPU queue to drain. torch's sync debug mode
reports those; this groups its reports by the innermost mini_sglang frame.
"""

from __future__ import annotations

import collections
import traceback
import warnings
from collections.abc import Callable

import torch


def find_syncs(fn: Callable[[], object]) -> collections.Counter[str]:
    """Run fn() with torch's sync debug mode on; count reported syncs per call site
    ("file.py:line in function" of the innermost mini_sglang frame)."""
    sites: collections.Counter[str] = collections.Counter()

    def record(message, category, filename, lineno, file=None, line=None) -> None:
        if "synchronizing" not in str(message) or "prototype" in str(message):
            return
        frames = [f for f in traceback.extract_stack()[:-1] if "mini_sglang" in f.filename]
        f = frames[-1] if frames else None
        sites[f"{f.filename.split('mini_sglang/')[-1]}:{f.lineno} in {f.name}" if f else "?"] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sites
