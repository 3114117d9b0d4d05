"""kernels.start_flashinfer_builds: flashinfer modules compiled one after another in a
background thread, each with its own ready check.

flashinfer's JIT specs are stood in for by _Spec (a name, is_compiled, and a build() that
waits until the test releases it), so the builds' order and the ready checks can be
watched without a compiler or a GPU.
"""

from __future__ import annotations

import logging
import shutil
import threading

import pytest

from mini_sglang.layers import kernels
from mini_sglang.layers.kernels import (
    flashinfer_module_ready,
    serialize_ninja,
    start_flashinfer_builds,
    wait_flashinfer_builds,
)

WAIT = 10.0


class _Spec:
    """flashinfer's JitSpec as start_flashinfer_builds uses it; build() blocks until
    `release` is set, then raises `error` or marks the module compiled."""

    def __init__(self, name: str, compiled: bool = False, error: Exception | None = None):
        self.name = name
        self.is_compiled = compiled
        self.error = error
        self.started = threading.Event()
        self.release = threading.Event()
        self.builds = 0

    def build(self, verbose: bool) -> None:
        self.builds += 1
        self.started.set()
        assert self.release.wait(WAIT)
        if self.error is not None:
            raise self.error
        self.is_compiled = True


def _wait_ready(name: str) -> None:
    done = kernels._builds[name]
    assert done.wait(WAIT), f"{name} never finished"


@pytest.fixture(autouse=True)
def _no_builds(monkeypatch):
    monkeypatch.setattr(kernels, "_builds", {})


def _unexpected_api():
    raise ImportError("no flashinfer.jit here")


def test_modules_build_in_order_each_with_its_own_ready_check(caplog):
    caplog.set_level(logging.INFO, logger="mini_sglang")
    first, second, built = _Spec("first"), _Spec("second"), _Spec("built", compiled=True)
    names = start_flashinfer_builds([lambda: first, lambda: built, _unexpected_api, lambda: second])
    # A built module and one whose spec cannot be made start nothing and never wait.
    assert names == ["first", None, None, "second"]
    assert flashinfer_module_ready(None) and flashinfer_module_ready("built")
    assert first.started.wait(WAIT)
    assert not flashinfer_module_ready("first") and not flashinfer_module_ready("second")
    # One compile at a time: the second waits for the first.
    assert not second.started.is_set()
    first.release.set()
    _wait_ready("first")
    assert flashinfer_module_ready("first") and not flashinfer_module_ready("second")
    assert second.started.wait(WAIT)
    # Asked again while in flight: the same name back, no second build.
    assert start_flashinfer_builds([lambda: _Spec("second")]) == ["second"]
    second.release.set()
    _wait_ready("second")
    assert flashinfer_module_ready("second")
    assert (first.builds, second.builds, built.builds) == (1, 1, 0)
    assert "compiling in the background: first, second" in caplog.text
    assert "flashinfer module first built in" in caplog.text


def test_a_failed_build_is_reported_and_ends_the_wait(caplog):
    caplog.set_level(logging.INFO, logger="mini_sglang")
    spec = _Spec("broken", error=RuntimeError("nvcc exploded"))
    spec.release.set()
    assert start_flashinfer_builds([lambda: spec]) == ["broken"]
    _wait_ready("broken")
    assert flashinfer_module_ready("broken")
    assert "flashinfer module broken: build failed: nvcc exploded" in caplog.text


def test_a_warm_start_waits_for_nothing():
    assert start_flashinfer_builds([lambda: _Spec("warm", compiled=True)]) == [None]
    assert kernels._builds == {} and flashinfer_module_ready("warm")


def test_benchmarks_can_wait_for_the_builds():
    spec = _Spec("slow")
    assert start_flashinfer_builds([lambda: spec]) == ["slow"]
    threading.Timer(0.2, spec.release.set).start()
    wait_flashinfer_builds()
    assert flashinfer_module_ready("slow") and spec.is_compiled


def test_the_startup_bench_reads_when_the_builds_end(caplog):
    """benchmarks/bench_startup.py keeps a server up until its log says every background
    build ended; it reads these log lines."""
    from benchmarks.bench_startup import builds_pending

    caplog.set_level(logging.INFO, logger="mini_sglang")
    ok, broken = _Spec("ok"), _Spec("broken", error=RuntimeError("nvcc exploded"))
    start_flashinfer_builds([lambda: ok, lambda: broken])
    assert ok.started.wait(WAIT)
    assert builds_pending(caplog.text) == 2
    ok.release.set()
    assert broken.started.wait(WAIT)
    _wait_ready("ok")
    assert builds_pending(caplog.text) == 1
    broken.release.set()
    _wait_ready("broken")
    assert builds_pending(caplog.text) == 0


def test_the_builds_wait_for_the_callers_go():
    spec, go = _Spec("held"), threading.Event()
    spec.release.set()
    assert start_flashinfer_builds([lambda: spec], after=go) == ["held"]
    # Not started until the caller's own first uses are done.
    assert not spec.started.wait(0.3) and not flashinfer_module_ready("held")
    go.set()
    _wait_ready("held")
    assert spec.builds == 1 and flashinfer_module_ready("held")


def _ninja_project(root, name: str, delay: float):
    """One flashinfer-style module: a C file compiled with a depfile (deps = gcc) and
    linked, its ninja file naming outputs relative to the shared working directory."""
    (root / "src").mkdir(exist_ok=True)
    (root / "src" / "common.h").write_text("#define ONE 1\n")
    (root / "src" / f"{name}.c").write_text(
        f'#include "common.h"\nint {name}(void){{return ONE;}}\n'
    )
    ninja = root / f"{name}.ninja"
    ninja.write_text(
        "ninja_required_version = 1.3\n"
        f"name = {name}\n"
        "rule compile\n"
        f"  command = sleep {delay}; cc -MMD -MF $out.d -c $in -o $out\n"
        "  depfile = $out.d\n  deps = gcc\n"
        "rule link\n  command = cc -shared $in -o $out\n"
        f"build $name/{name}.o: compile {root / 'src' / f'{name}.c'}\n"
        f"build $name/$name.so: link $name/{name}.o\n"
        "default $name/$name.so\n"
    )
    return ninja


def _run_ninja(workdir, ninja_file, verbose: bool) -> str:
    # flashinfer.jit.cpp_ext.run_ninja's command
    import subprocess

    cmd = ["ninja", "-v", "-d", "explain", "-C", str(workdir), "-f", str(ninja_file)]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


@pytest.mark.skipif(
    not (shutil.which("ninja") and shutil.which("cc")), reason="needs ninja and a C compiler"
)
def test_serialized_ninja_keeps_concurrent_module_builds_up_to_date(tmp_path):
    """Two modules built at the same time in one working directory (as flashinfer's
    cached_ops is for every module): through serialize_ninja the next ninja finds both up
    to date; a warm start recompiles nothing."""
    slow, fast = _ninja_project(tmp_path, "slow", 1.0), _ninja_project(tmp_path, "fast", 0.1)
    run = serialize_ninja(_run_ninja, tmp_path / "ninja.lock")
    started = threading.Event()

    def build_slow() -> None:
        started.set()
        run(tmp_path, slow, False)

    t = threading.Thread(target=build_slow)
    t.start()
    assert started.wait(WAIT)
    run(tmp_path, fast, False)
    t.join(WAIT)
    for ninja in (slow, fast):
        out = _run_ninja(tmp_path, ninja, False)
        assert "no work to do" in out, out
