"""Every flag of SGLang 0.5.4's parser parses; a value mini-sglang cannot honour is one
warning naming the flag; an unknown flag is one line with a suggestion. The flag table
(mini_sglang/server_args_sglang_flags.py) is checked against SGLang 0.5.4's own
server_args.py when it can be found: $SGLANG_SERVER_ARGS_PY, an installed sglang 0.5.4, or
the sglang==0.5.4 wheel from PyPI (skipped when none is reachable)."""

from __future__ import annotations

import argparse
import glob
import importlib.util
import logging
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from mini_sglang.server_args import ServerArgs, prepare_server_args
from mini_sglang.server_args_cli import SGLANG_ONLY_FLAGS, FlagParser, add_cli_args
from mini_sglang.server_args_sglang_flags import SGLANG_FLAGS

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL = "/nonexistent/model"  # ServerArgs resolution does not read the model
BASE = ["--model-path", MODEL, "--device", "cpu"]


def _parser() -> argparse.ArgumentParser:
    parser = FlagParser(prog="launch_server")
    add_cli_args(parser, ServerArgs)
    return parser


def _sample_argv(parser: argparse.ArgumentParser, option: str, kind: str) -> list[str]:
    action = parser._option_string_actions[option]
    if action.nargs == 0:
        return [option]
    if action.choices:
        value = str(next(iter(action.choices)))
    else:
        value = {"int": "1", "float": "0.5", "json_list": "[1, 2]"}.get(kind, "x")
    return [option, value]


def test_table_holds_all_of_sglang_054():
    assert len(SGLANG_FLAGS) == 273
    assert sum(len(f.options) for f in SGLANG_FLAGS) == 281
    assert len(SGLANG_ONLY_FLAGS) > 150


@pytest.mark.parametrize("flag", SGLANG_FLAGS, ids=lambda f: f.options[0])
def test_every_sglang_flag_parses(flag):
    parser = _parser()
    defaults = parser.parse_args([])
    for option in flag.options:
        argv = _sample_argv(parser, option, flag.kind)
        if flag.kind == "deprecated":
            with pytest.raises(ValueError, match="deprecated"):
                parser.parse_args(argv)
            continue
        parser.parse_args(argv)
    if flag in SGLANG_ONLY_FLAGS:  # SGLang's default, since mini-sglang has no field for it
        assert getattr(defaults, flag.options[0].lstrip("-").replace("-", "_")) == flag.default


def test_unsupported_values_warn_once_each_and_are_dropped(caplog):
    argv = [*BASE, "--enable-p2p-check", "--revision", "main", "--tokenizer-worker-num", "2"]
    with caplog.at_level(logging.WARNING):
        args = prepare_server_args(argv)
    assert isinstance(args, ServerArgs) and not hasattr(args, "revision")
    lines = [r.getMessage() for r in caplog.records if "not supported" in r.getMessage()]
    assert sorted(lines) == [
        "--enable-p2p-check=True is not supported by mini-sglang and is ignored (using False).",
        "--revision='main' is not supported by mini-sglang and is ignored (using None).",
        "--tokenizer-worker-num=2 is not supported by mini-sglang and is ignored (using 1).",
    ]


def test_defaults_warn_about_nothing(caplog):
    with caplog.at_level(logging.WARNING):
        prepare_server_args([*BASE, "--tokenizer-worker-num", "1"])
    assert not [r for r in caplog.records if "not supported" in r.getMessage()]


def test_unknown_flag_is_one_line_with_a_suggestion(capsys):
    with pytest.raises(SystemExit) as exc:
        prepare_server_args([*BASE, "--enable-p2p-chek"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "unrecognized arguments: --enable-p2p-chek; did you mean --enable-p2p-check?" in err


def test_bad_value_is_one_line(capsys):
    with pytest.raises(SystemExit):
        prepare_server_args([*BASE, "--tokenizer-worker-num", "two"])
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "invalid int value: 'two'" in err, err


def _sglang_server_args_py(tmp_path: Path) -> str | None:
    path = os.environ.get("SGLANG_SERVER_ARGS_PY")
    if path:
        return path
    spec = importlib.util.find_spec("sglang")
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / "srt" / "server_args.py"
            version = Path(location) / "version.py"
            if candidate.is_file() and '"0.5.4"' in version.read_text():
                return str(candidate)
    try:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
            + ["-q", "-d", str(tmp_path), "sglang==0.5.4"],
            check=True,
            capture_output=True,
            timeout=120,
        )
    except (subprocess.SubprocessError, OSError):
        return None
    wheels = glob.glob(str(tmp_path / "sglang-0.5.4-*.whl"))
    if not wheels:
        return None
    with zipfile.ZipFile(wheels[0]) as wheel:
        out = tmp_path / "server_args.py"
        out.write_bytes(wheel.read("sglang/srt/server_args.py"))
    return str(out)


def test_table_matches_sglang_054_server_args(tmp_path: Path):
    path = _sglang_server_args_py(tmp_path)
    if path is None:
        pytest.skip("SGLang 0.5.4's server_args.py is not available (no wheel, no network)")
    spec = importlib.util.spec_from_file_location(
        "gen_sglang_flags", REPO_ROOT / "scripts" / "gen_sglang_flags.py"
    )
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    expected = [tuple(f) for f in gen.sglang_flags(path)]
    assert [tuple(f) for f in SGLANG_FLAGS] == expected
