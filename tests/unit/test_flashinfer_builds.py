"""kernels.start_flashinfer_builds: flashinfer modules compiled one after another in a
background thread, each with its own ready check.

flashinfer's JIT specs are stood in for by _Spec (a name, is_compiled, and a build() that
waits until the test releases it), so the builds' order and the ready checks can be
watched without a compiler or a GPU.
"""

from __future__ import annotations

import logging
import threading

import pytest

from mini_sglang.layers import kernels
from mini_sglang.layers.kernels import (
    flashinfer_module_ready,
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
