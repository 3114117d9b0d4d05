"""User errors at launch end with one line on stderr that says what is wrong and what to
do, and exit code 1, before any model is loaded; the traceback only with --log-level debug."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server.conftest import REPO_ROOT, TinyModel


def _launch(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mini_sglang.launch_server", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=str(REPO_ROOT),
    )


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == errors[0]
    assert "Load weight" not in proc.stderr + proc.stdout
    return errors[0]


def test_port_in_use_exits_before_loading(tiny_model: TinyModel):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = _launch("--model-path", tiny_model.path, "--port", str(port))
    line = _one_error_line(proc)
    assert f"--port {port}" in line and "in use" in line, line


def _no_weights_dir(tiny_model: TinyModel, tmp_path: Path) -> str:
    shutil.copy(Path(tiny_model.path) / "config.json", tmp_path / "config.json")
    return str(tmp_path)


def _corrupt_gguf(tiny_model: TinyModel, tmp_path: Path) -> str:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + b"\x00" * 64)  # the magic, then a truncated header
    return str(path)


@pytest.mark.parametrize(
    "make_path, expected",
    [
        (lambda m, t: str(t / "missing"), "no such file or directory"),
        (lambda m, t: "Qwen/Qwen3-0.6B", "does not download from a model hub"),
        (_no_weights_dir, "no model weights"),
        (_corrupt_gguf, "cannot read it as GGUF"),
    ],
    ids=["missing-path", "hub-id", "no-weights", "corrupt-gguf"],
)
def test_bad_model_path_is_one_line(tiny_model: TinyModel, tmp_path: Path, make_path, expected):
    path = make_path(tiny_model, tmp_path)
    line = _one_error_line(_launch("--model-path", path))
    assert line.startswith("launch_server: error: --model-path") and expected in line, line


def test_tp_size_that_does_not_divide_the_heads_is_one_line(tiny_model: TinyModel):
    # The tiny model has 4 attention heads (the default model 9: --tp-size 2 says so too).
    proc = _launch("--model-path", tiny_model.path, "--tp-size", "3", "--device", "cpu")
    line = _one_error_line(proc)
    assert line == "launch_server: error: --tp-size 3 does not divide the model's 4 attention heads"


def test_invalid_value_is_one_line():
    line = _one_error_line(_launch("--mem-fraction-static", "2", "--device", "cpu"))
    assert "--mem-fraction-static" in line, line


def test_traceback_at_debug_level(tmp_path: Path):
    proc = _launch("--model-path", str(tmp_path / "missing"), "--log-level", "debug")
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr
    assert "no such file or directory" in proc.stderr.strip().splitlines()[-1]


def test_unsupported_flag_is_one_timestamped_warning(tmp_path: Path):
    proc = _launch("--enable-p2p-check", "--model-path", str(tmp_path / "missing"))
    assert proc.returncode == 1
    warnings = [line for line in proc.stderr.splitlines() if "--enable-p2p-check" in line]
    assert len(warnings) == 1, proc.stderr[-3000:]
    assert re.fullmatch(
        r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] --enable-p2p-check=True is not supported by "
        r"mini-sglang and is ignored \(using False\)\.",
        warnings[0],
    ), warnings[0]
