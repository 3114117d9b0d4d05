"""GPU runs are often cut off by a time limit before pytest's closing summary, which is
where failures are explained. Here each failure's report (as --tb sets it) is written the
moment its test fails, so a cut-off run still says why (on a machine with CUDA, for every
test of the run; elsewhere the closing summary suffices)."""

from __future__ import annotations

import pytest
import torch

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
