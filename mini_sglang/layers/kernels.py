"""Optional GPU kernel libraries, imported once and lazily.

Every caller keeps a torch path, so a missing library (always the case on CPU) only costs
speed. Set MINI_SGLANG_DISABLE_FLASHINFER_OPS=1 to force the torch paths on CUDA.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from types import ModuleType

import torch

from mini_sglang.environ import envs

logger = logging.getLogger("mini_sglang")

try:  # grid dependency control for programmatic dependent launch (Hopper+); Triton >= 3.4
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # no Triton (CPU installs) or an older one
    gdc_launch_dependents = gdc_wait = None

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs
    triton = silu_mul = kv_to_pool_units = None

if triton is not None:

    @triton.jit
    def silu_mul(g, u):
        """silu(g) * u inside a Triton kernel, g float32 and u in the model dtype: silu is
        rounded to u's dtype before the product, as flashinfer and HF round. One definition
        for fused_kernels.silu_and_mul and the GEMV epilogue (small_m_gemm), which must agree
        bit for bit."""
        return (g / (1.0 + tl.exp(-g))).to(u.dtype) * u

    @triton.jit
    def kv_to_pool_units(x, inv_scale, FP8_MAX: tl.constexpr):
        """K or V values x on their way into an FP8 pool (FP8_MAX > 0, its largest finite
        value; layers/kv_quant.py): float32 x * inv_scale clamped to +-FP8_MAX, for the
        store's cast. With FP8_MAX == 0 (a pool in the model dtype) x is returned as is."""
        if FP8_MAX > 0:
            x = x.to(tl.float32) * inv_scale
            x = tl.minimum(tl.maximum(x, -FP8_MAX), FP8_MAX)
        return x


@functools.cache
def _flashinfer() -> ModuleType | None:
    if envs.MINI_SGLANG_DISABLE_FLASHINFER_OPS.get():
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


# Set once a background build of flashinfer's sampling module (start_sampling_build) ends;
# None while no such build was started.
_sampling_built: threading.Event | None = None


def start_sampling_build() -> None:
    """Compile flashinfer's sampling module in a background thread when it is not built yet.

    flashinfer compiles it on first use: about a minute on a machine whose flashinfer cache
    is empty, spent by the first request that samples (docs/performance/startup.md). While
    the build runs, flashinfer_sampling_ready() is False and the sampler draws with its
    torch path instead (unseeded draws, random either way); afterwards everything is as
    without this call. The thread only runs flashinfer's compiler under flashinfer's own
    per-module lock (a first use elsewhere waits on that lock, as it would on any build in
    flight), so it never touches the GPU. Does nothing when flashinfer is absent, the module
    is built, or flashinfer's JIT API is not the one expected."""
    global _sampling_built
    if _flashinfer() is None or _sampling_built is not None:
        return
    try:
        from flashinfer.jit.sampling import gen_sampling_module

        spec = gen_sampling_module()
        if spec.is_compiled:
            return
    except Exception:  # another flashinfer: it builds the module on first use, as before
        return
    done = threading.Event()

    def build() -> None:
        t0 = time.perf_counter()
        try:
            spec.build(False)
            logger.info("flashinfer sampling module built in %.1f s", time.perf_counter() - t0)
        except Exception as e:  # the first use builds (and reports) it again
            logger.warning("flashinfer sampling module build failed: %s", e)
        finally:
            done.set()

    _sampling_built = done
    logger.info(
        "flashinfer sampling module: compiling in the background; until it is built, sampling takes the torch path"
    )
    threading.Thread(target=build, name="flashinfer-sampling-build", daemon=True).start()


def flashinfer_sampling_ready() -> bool:
    """False only while start_sampling_build's compile is in flight."""
    return _sampling_built is None or _sampling_built.is_set()


def flashinfer_module() -> ModuleType | None:
    return _flashinfer()


@functools.cache
def _pdl_on_device(index: int) -> bool:
    # griddepcontrol is PTX: NVIDIA only (ROCm reports MI300 as capability 9.x too)
    if envs.MINI_SGLANG_DISABLE_PDL.get() or torch.version.hip is not None:
        return False
    return gdc_wait is not None and torch.cuda.get_device_capability(index)[0] >= 9


# PDL pays where a step is many short kernels: decode at small batch. At larger batches it
# has nothing to hide, and with it on at every size a set of nano-vllm runs on an H100
# came out ~1% lower (docs/performance/decode-gemv.md).
PDL_MAX_ROWS = 32


def pdl_enabled(x: torch.Tensor) -> bool:
    """Whether our Triton kernels working on x (rows = tokens or requests) launch as
    programmatic dependents (PDL): at most PDL_MAX_ROWS rows, a Hopper or newer GPU, a Triton
    with grid dependency control, and MINI_SGLANG_DISABLE_PDL unset. Such a kernel starts
    while the previous kernel on the stream drains and waits on the device (gdc_wait) before
    reading that kernel's output."""
    return (
        x.is_cuda
        and x.shape[0] <= PDL_MAX_ROWS
        and _pdl_on_device(x.device.index if x.device.index is not None else 0)
    )
