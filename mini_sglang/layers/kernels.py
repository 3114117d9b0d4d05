"""Optional GPU kernel libraries, imported once and lazily.

Every caller keeps a torch path, so a missing library (always the case on CPU) only costs
speed. Set MINI_SGLANG_DISABLE_FLASHINFER_OPS=1 to force the torch paths on CUDA.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from types import ModuleType
from typing import Any

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
    serialize_flashinfer_ninja()
    return flashinfer


@contextlib.contextmanager
def _file_lock(path: str | os.PathLike[str]) -> Iterator[None]:
    # flock locks an open file description, so two threads of one process that each open
    # the file exclude each other as two processes do.
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def serialize_ninja(run_ninja: Callable[..., Any], lock_path: str | os.PathLike[str]):
    """run_ninja wrapped so that at most one call runs at a time across every thread and
    process that wraps it with the same lock_path.

    ninja keeps its build log (.ninja_log) and dependency log (.ninja_deps) in its working
    directory, and they are not safe for concurrent writers: two ninja processes building
    different targets in one directory at the same time leave a dependency log that the
    next ninja truncates ("premature end of file; recovering"), and every object whose
    dependencies it lost is compiled again (tests/unit/test_flashinfer_builds.py shows it)."""

    @functools.wraps(run_ninja)
    def run(*args: Any, **kwargs: Any) -> Any:
        with _file_lock(lock_path):
            return run_ninja(*args, **kwargs)

    run.serialized = True  # type: ignore[attr-defined]
    return run


def serialize_flashinfer_ninja() -> None:
    """Make flashinfer's JIT run one ninja at a time per JIT cache (serialize_ninja).

    flashinfer builds every module with `ninja -C <its cache>/cached_ops`, one working
    directory for all modules, under a lock per module only. Modules that build at the
    same time in one cache (the background builds of start_flashinfer_builds beside a first
    use, or the ranks of tp > 1 reaching different modules) would otherwise corrupt ninja's
    logs there, and the next start recompiles those modules on its first requests: on an
    H200 a warm start then stalled over a minute (docs/performance/startup.md). Idempotent
    and thread-safe (wrapped twice, a call would wait on its own lock forever); does nothing
    where flashinfer's JIT is not the one expected."""
    try:
        from flashinfer.jit import core, cpp_ext
    except Exception:
        return
    with _serialize_lock:
        if getattr(core.run_ninja, "serialized", False) or not callable(
            getattr(core, "get_tmpdir", None)
        ):
            return
        run = serialize_ninja(cpp_ext.run_ninja, core.get_tmpdir() / "mini_sglang_ninja.lock")
        core.run_ninja = cpp_ext.run_ninja = run


_serialize_lock = threading.Lock()


def flashinfer_norm() -> ModuleType | None:
    fi = _flashinfer()
    return fi.norm if fi is not None else None


def flashinfer_activation() -> ModuleType | None:
    fi = _flashinfer()
    return fi.activation if fi is not None else None


def flashinfer_sampling() -> ModuleType | None:
    fi = _flashinfer()
    return fi.sampling if fi is not None else None


def flashinfer_sampling_spec() -> Any:
    """flashinfer's JIT spec of its sampling module (what flashinfer.sampling loads on first
    use); raises where flashinfer or its JIT API is not the one expected."""
    from flashinfer.jit.sampling import gen_sampling_module

    return gen_sampling_module()


# flashinfer JIT module name -> an event set once its background build
# (start_flashinfer_builds) ends. Holds only the modules whose build was started.
_builds: dict[str, threading.Event] = {}


def start_flashinfer_builds(
    make_specs: Sequence[Callable[[], Any]], after: threading.Event | None = None
) -> list[str | None]:
    """Compile the flashinfer modules of `make_specs` that are not built yet, one after
    another in the given order, in one background thread.

    Each entry returns flashinfer's JIT spec of one module (a flashinfer.jit JitSpec: `name`,
    `is_compiled`, `build`); the specs are made here, in the caller's thread. flashinfer
    compiles a module on its first use: up to a minute each on a machine whose flashinfer
    cache is empty (docs/performance/startup.md), spent by the first request that needs it.
    The caller serves that need another way while flashinfer_module_ready(name) is False.
    The thread only runs flashinfer's compiler under flashinfer's own per-module file lock,
    so it never touches the GPU, and a first use elsewhere waits on that lock as it would on
    any build in flight. One module at a time: flashinfer's ninja already spreads one
    module's compile over every core.
    With `after`, the thread waits for that event before its first compile: the caller
    sets it once its own first uses are done (graph capture), since a build in flight holds
    flashinfer's ninja lock (serialize_flashinfer_ninja) and any first use would wait for
    it.

    Returns, per entry, the module's name when its build is in flight or was started by an
    earlier call, else None: the module is built already, or making its spec raised (another
    flashinfer: the module builds on first use, as without this call). A failed build logs a
    warning and counts as ended; the first use then builds (and reports) it again."""
    names: list[str | None] = []
    todo: list[tuple[Any, threading.Event]] = []
    for make in make_specs:
        try:
            spec = make()
            name = str(spec.name)
            if name not in _builds and spec.is_compiled:
                name = None
        except Exception:
            name = None
        names.append(name)
        if name is not None and name not in _builds:
            _builds[name] = threading.Event()
            todo.append((spec, _builds[name]))
    if not todo:
        return names

    def build() -> None:
        if after is not None:
            after.wait()
        for spec, done in todo:
            t0 = time.perf_counter()
            try:
                spec.build(False)
                logger.info(
                    "flashinfer module %s built in %.1f s", spec.name, time.perf_counter() - t0
                )
            except Exception as e:
                logger.warning("flashinfer module %s: build failed: %s", spec.name, e)
            finally:
                done.set()

    logger.info(
        "flashinfer modules compiling in the background: %s", ", ".join(s.name for s, _ in todo)
    )
    threading.Thread(target=build, name="flashinfer-build", daemon=True).start()
    return names


def flashinfer_module_ready(name: str | None) -> bool:
    """False only while the background build of flashinfer module `name`
    (start_flashinfer_builds) is in flight; True for None."""
    done = _builds.get(name) if name is not None else None
    return done is None or done.is_set()


def wait_flashinfer_builds() -> None:
    """Block until every build start_flashinfer_builds started has ended: for benchmarks,
    which must time the kernels a warm start runs, not their stand-ins."""
    for done in list(_builds.values()):
        done.wait()


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
# The largest batch (rows) the small-batch kernels serve: small_m_gemm's Triton GEMV and the
# norm and SiLU-mul kernels that fused_kernels runs between such GEMVs.
SMALL_M_MAX_ROWS = 8


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
