"""GPU tests check flashinfer's kernels where they name flashinfer: its modules build on
first use here, not in the background with Triton / torch stand-ins serving meanwhile
(test_gpu_prefill_build.py tests that switch on its own)."""

from __future__ import annotations

import os

os.environ["MINI_SGLANG_DISABLE_BACKGROUND_FLASHINFER_BUILD"] = "1"
