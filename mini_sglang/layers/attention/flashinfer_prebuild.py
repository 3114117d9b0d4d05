"""Build the flashinfer JIT modules a server will use side by side, in a helper process.

flashinfer compiles each kernel module the first time it is used, so on a machine whose
flashinfer cache is empty the compiles fall one after another on the path to the first
token. On an H200 serving Llama-3.1-8B: the decode modules during CUDA-graph capture, then
batch prefill (fa3, about 50 s) at the first request and the sampling module (about 55 s)
at the first sampled token (docs/performance/startup.md).

`start_prebuild` starts one process that compiles every module of the plan at once, each
under flashinfer's own per-module file lock, while the scheduler loads weights and captures
graphs. The scheduler's own first use of a module then finds the library built, or waits on
that lock for the build in flight (flashinfer's build_and_load takes the same lock), and
never compiles a module twice. When every module is already built nothing is started: a warm
start pays only the existence checks.

A process rather than threads: its work never holds the scheduler's interpreter, and it
stops its compilers when the scheduler process goes away.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

logger = logging.getLogger("mini_sglang")


@dataclass(frozen=True)
class PrebuildPlan:
    """The modules to build, by the plan() arguments that select them in flashinfer.

    Dtypes are torch dtype names ("bfloat16", "float8_e4m3fn"); the index dtype is int32, no
    sliding window, no logits soft cap and no positional encoding in the kernel, as the
    flashinfer attention backend plans them."""

    q_dtype: str
    kv_dtype: str
    head_dim: int
    prefill_backend: str  # "fa2" or "fa3": what flashinfer's "auto" picks on this device
    tensor_core_decode: bool  # decode through the fa2 batch prefill module
    cuda_core_decode: bool  # decode through the batch decode module
    activation: str | None = "silu"  # the model's <act>_and_mul module, if flashinfer has it


def jit_specs(plan: PrebuildPlan) -> list[Any]:
    """flashinfer JitSpecs of every module in `plan` (batch prefill, decode, sampling, RMSNorm,
    the activation, rope); each spec's name is the module's cache entry."""
    import torch
    from flashinfer.jit import (
        gen_act_and_mul_module,
        gen_batch_decode_module,
        gen_batch_prefill_module,
    )
    from flashinfer.jit.norm import gen_norm_module
    from flashinfer.jit.rope import gen_rope_module
    from flashinfer.jit.sampling import gen_sampling_module

    q, kv = getattr(torch, plan.q_dtype), getattr(torch, plan.kv_dtype)
    # (dtype_q, dtype_kv, dtype_o, dtype_idx, head_dim_qk, head_dim_vo, pos_encoding_mode,
    # use_sliding_window, use_logits_soft_cap): the order of flashinfer's plan() calls
    common = (q, kv, q, torch.int32, plan.head_dim, plan.head_dim, 0, False, False)
    specs = [gen_batch_prefill_module(plan.prefill_backend, *common, False)]
    if plan.tensor_core_decode and plan.prefill_backend != "fa2":
        specs.append(gen_batch_prefill_module("fa2", *common, False))
    if plan.cuda_core_decode:
        specs.append(gen_batch_decode_module(*common))
    specs += [gen_sampling_module(), gen_norm_module(), gen_rope_module()]
    if plan.activation is not None:
        specs.append(gen_act_and_mul_module(plan.activation))
    return specs


def start_prebuild(plan: PrebuildPlan) -> subprocess.Popen | None:
    """Start the helper process for the modules of `plan` not built yet; None when all are
    built (or flashinfer cannot describe them: then each module builds on first use, as
    without this). Never raises."""
    try:
        missing = [spec.name for spec in jit_specs(plan) if not spec.is_compiled]
    except Exception as e:  # a flashinfer whose JIT API differs: build on first use
        logger.debug("flashinfer prebuild skipped: %s", e)
        return None
    if not missing:
        return None
    logger.info(
        "flashinfer JIT: building %d modules in the background (%s)",
        len(missing),
        ", ".join(missing),
    )
    cmd = [sys.executable, "-m", __name__, json.dumps(asdict(plan)), str(os.getpid())]
    # its own process group, so that it can stop its compilers with itself
    return subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )


def _build_all(plan: PrebuildPlan, parent_pid: int) -> None:
    specs = [spec for spec in jit_specs(plan) if not spec.is_compiled]
    threads = [threading.Thread(target=spec.build, args=(False,), daemon=True) for spec in specs]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        if os.getppid() != parent_pid:  # the scheduler is gone: stop compiling for it
            os.killpg(0, signal.SIGTERM)
        time.sleep(0.5)


if __name__ == "__main__":
    _build_all(PrebuildPlan(**json.loads(sys.argv[1])), int(sys.argv[2]))
