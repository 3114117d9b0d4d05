"""Bad model inputs fail fast, with a message that names the problem.

Each case builds the Scheduler (what the server process does at start-up) on a broken model
path and expects a ValueError within seconds, before any KV cache is allocated.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
import torch

from mini_sglang.managers.scheduler import Scheduler
from mini_sglang.server_args import ServerArgs, prepare_server_args

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 128,
    "max_position_embeddings": 64,
}


def _write_config(folder: Path, **changes: object) -> Path:
    """A tiny Llama config.json in `folder`, with `changes` applied."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**TINY_LLAMA, **changes}))
    return folder


def _start_error(model_path: str | Path) -> str:
    """Start a Scheduler on `model_path`; return the ValueError's message (must be fast)."""
    t0 = time.perf_counter()
    with pytest.raises(ValueError) as info:
        args = ServerArgs(
            model_path=str(model_path),
            device="cpu",
            max_total_tokens=64,
            skip_tokenizer_init=True,
            random_seed=0,
        )
        Scheduler(args)
    assert time.perf_counter() - t0 < 10, "bad input should fail fast"
    return str(info.value)


def test_unknown_architecture(tmp_path: Path) -> None:
    msg = _start_error(_write_config(tmp_path / "m", architectures=["FooBarForCausalLM"]))
    assert "FooBarForCausalLM" in msg and "not supported" in msg
    assert "LlamaForCausalLM" in msg  # says what is supported


def test_unknown_model_type(tmp_path: Path) -> None:
    msg = _start_error(_write_config(tmp_path / "m", model_type="foobar"))
    assert "foobar" in msg


def test_directory_without_weights(tmp_path: Path) -> None:
    msg = _start_error(_write_config(tmp_path / "m"))
    assert "No model weights found" in msg and str(tmp_path / "m") in msg
    assert "safetensors" in msg


def test_directory_without_config(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    msg = _start_error(tmp_path / "m")
    assert "config.json" in msg


def test_missing_path(tmp_path: Path) -> None:
    msg = _start_error(tmp_path / "does-not-exist")
    assert "does-not-exist" in msg


def test_checkpoint_missing_tensors(tmp_path: Path) -> None:
    """A checkpoint that lacks some weights names them instead of running uninitialised."""
    from safetensors.torch import save_file

    folder = _write_config(tmp_path / "m")
    save_file({"model.embed_tokens.weight": torch.zeros(128, 32)}, folder / "model.safetensors")
    msg = _start_error(folder)
    assert "no weights for" in msg and "model.layers.0" in msg


@pytest.mark.parametrize(
    "content, expect",
    [
        (b"GGUF" + bytes(range(60)), "not a valid GGUF file"),  # right magic, garbage after
        (b"NOPE" + bytes(60), "bad magic"),
        (b"", "not a valid GGUF file"),
    ],
    ids=["truncated", "bad_magic", "empty"],
)
def test_corrupt_gguf(tmp_path: Path, content: bytes, expect: str) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    msg = _start_error(path)
    assert expect in msg and "model.gguf" in msg


def test_unknown_cli_flag_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _write_config(tmp_path / "m")
    with pytest.raises(SystemExit) as info:
        prepare_server_args(["--model-path", str(folder), "--bogus-flag", "3"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments" in err and "--bogus-flag" in err


def test_known_flags_still_parse(tmp_path: Path) -> None:
    """The flag test above is not passing merely because every argv fails."""
    folder = _write_config(tmp_path / "m")
    args = prepare_server_args(["--model-path", str(folder), "--device", "cpu", "--page-size", "4"])
    assert args.page_size == 4 and os.path.samefile(args.model_path, folder)
