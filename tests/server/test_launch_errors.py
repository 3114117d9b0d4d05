"""User errors at launch end with one line on stderr that says what is wrong and what to
do, and exit code 1, before any model is loaded; the traceback only with --log-level debug.

Every launch below is started at once by the module's `launches` fixture (each one spends
seconds importing on one core before it fails), and each test checks one of them.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.server.conftest import REPO_ROOT, TinyModel

# All launches share the CPU, so each may take several times as long as alone.
LAUNCH_TIMEOUT_S = 300.0


def _launch_all(cases: dict[str, list[str]]) -> dict[str, subprocess.CompletedProcess]:
    """Run `launch_server` with each case's arguments, all at the same time, and return each
    case's finished process (output captured). A launch still running after
    LAUNCH_TIMEOUT_S is killed and fails the module."""
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-m", "mini_sglang.launch_server", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=str(REPO_ROOT),
        )
        for name, args in cases.items()
    }

    def finish(proc: subprocess.Popen) -> subprocess.CompletedProcess:
        try:
            out, err = proc.communicate(timeout=LAUNCH_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    try:
        with ThreadPoolExecutor(len(procs)) as pool:
            done = dict(zip(procs, pool.map(finish, procs.values())))
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return done


def _no_weights_dir(tiny_model: TinyModel, tmp_path: Path) -> str:
    tmp_path.mkdir()
    shutil.copy(Path(tiny_model.path) / "config.json", tmp_path / "config.json")
    return str(tmp_path)


def _three_experts_dir(tiny_model: TinyModel, tmp_path: Path) -> str:
    """The tiny model's files with a config.json declaring a Mixtral of 3 experts (the
    check reads only the config; no weights load)."""
    shutil.copytree(tiny_model.path, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg.update(architectures=["MixtralForCausalLM"], model_type="mixtral",
               num_local_experts=3, num_experts_per_tok=2)  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    return str(tmp_path)


def _corrupt_gguf(tmp_path: Path) -> str:
    path = tmp_path / "model.gguf"
    path.write_bytes(b"GGUF" + b"\x00" * 64)  # the magic, then a truncated header
    return str(path)


@pytest.fixture(scope="module")
def launches(
    tiny_model: TinyModel, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, subprocess.CompletedProcess]]:
    """Each case's finished `launch_server` process, by case name."""
    tmp = tmp_path_factory.mktemp("launch_errors")
    missing = str(tmp / "missing")
    with socket.socket() as busy:  # listening (in use) until every launch has ended
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        moe = _three_experts_dir(tiny_model, tmp / "three_experts")
        cases = {
            "port-in-use": ["--model-path", tiny_model.path, "--port", str(port)],
            "missing-path": ["--model-path", missing],
            "hub-id": ["--model-path", "Qwen/Qwen3-0.6B"],
            "no-weights": ["--model-path", _no_weights_dir(tiny_model, tmp / "no_weights")],
            "corrupt-gguf": ["--model-path", _corrupt_gguf(tmp)],
            "tp-size-3": ["--model-path", tiny_model.path, "--tp-size", "3", "--device", "cpu"],
            "ep-size-2": ["--model-path", moe, "--tp-size=2", "--ep-size=2", "--device=cpu"],
            "invalid-value": ["--mem-fraction-static", "2", "--device", "cpu"],
            "debug-level": ["--model-path", missing, "--log-level", "debug"],
            "unsupported-flag": ["--enable-p2p-check", "--model-path", missing],
        }
        yield _launch_all(cases)


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 1, (proc.returncode, proc.stderr[-3000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == errors[0]
    assert "Load weight" not in proc.stderr + proc.stdout
    return errors[0]


def test_port_in_use_exits_before_loading(launches: dict[str, subprocess.CompletedProcess]):
    proc = launches["port-in-use"]
    port = proc.args[proc.args.index("--port") + 1]
    line = _one_error_line(proc)
    assert f"--port {port}" in line and "in use" in line, line


@pytest.mark.parametrize(
    "case, expected",
    [
        ("missing-path", "no such file or directory"),
        ("hub-id", "does not download from a model hub"),
        ("no-weights", "no model weights"),
        ("corrupt-gguf", "cannot read it as GGUF"),
    ],
    ids=["missing-path", "hub-id", "no-weights", "corrupt-gguf"],
)
def test_bad_model_path_is_one_line(launches, case: str, expected: str):
    line = _one_error_line(launches[case])
    assert line.startswith("launch_server: error: --model-path") and expected in line, line


def test_tp_size_that_does_not_divide_the_heads_is_one_line(launches):
    # The tiny model has 4 attention heads (the default model 9: --tp-size 2 says so too).
    line = _one_error_line(launches["tp-size-3"])
    assert line == "launch_server: error: --tp-size 3 does not divide the model's 4 attention heads"


def test_ep_size_that_does_not_divide_the_experts_is_one_line(launches):
    line = _one_error_line(launches["ep-size-2"])
    assert line == "launch_server: error: --ep-size 2 does not divide the model's 3 experts"


def test_invalid_value_is_one_line(launches):
    line = _one_error_line(launches["invalid-value"])
    assert "--mem-fraction-static" in line, line


def test_traceback_at_debug_level(launches):
    proc = launches["debug-level"]
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr
    assert "no such file or directory" in proc.stderr.strip().splitlines()[-1]


def test_unsupported_flag_is_one_timestamped_warning(launches):
    proc = launches["unsupported-flag"]
    assert proc.returncode == 1
    warnings = [line for line in proc.stderr.splitlines() if "--enable-p2p-check" in line]
    assert len(warnings) == 1, proc.stderr[-3000:]
    assert re.fullmatch(
        r"\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] --enable-p2p-check=True is not supported by "
        r"mini-sglang and is ignored \(using False\)\.",
        warnings[0],
    ), warnings[0]
