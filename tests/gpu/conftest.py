"""GPU runs are often cut off by a time limit before pytest's closing summary, which is
where failures are explained. Here each failure's report (as --tb sets it) is written the
moment its test fails, so a cut-off run still says why (on a machine with CUDA, for every
test of the run; elsewhere the closing summary suffices).

The GPU tests compare runs and engines kernel by kernel, so flashinfer's modules build on
first use here (MINI_SGLANG_DISABLE_BACKGROUND_FLASHINFER_BUILD): a fresh cache would
otherwise serve a test's first prefills with Triton's kernel and its later ones with
flashinfer's. test_gpu_prefill_build.py tests the switch itself."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("MINI_SGLANG_DISABLE_BACKGROUND_FLASHINFER_BUILD", "1")

_config: pytest.Config | None = None
_EARLY = torch.cuda.is_available()


def pytest_configure(config: pytest.Config) -> None:
    global _config
    _config = config


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not (_EARLY and report.failed) or _config is None:
        return
    terminal = _config.pluginmanager.get_plugin("terminalreporter")
    if terminal is None:
        return
    terminal.write_line("")
    terminal.write_line(f"FAILED {report.nodeid} ({report.when}):")
    terminal.write_line(report.longreprtext[-4000:])
