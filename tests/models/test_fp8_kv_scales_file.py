"""--quantization-param-path: FP8 KV cache scales from SGLang's JSON file
(model_loader/kv_cache_scales.py).

A tiny random Llama saved by transformers runs in-process with --kv-cache-dtype fp8_e4m3,
once without the file (every scale 1.0) and once with a file of per-layer scales. The
scales are not powers of two: FP8 is a floating-point format, so dividing by a power of two
only moves the exponent and would round exactly as scale 1.0 does; 0.3 and 0.7 change the
rounding, so the file's effect shows in the logits while staying within FP8 tolerance of
the float32-KV run (tolerance as in test_fp8_kv_end_to_end.py).

The error cases run the loader on a bare module of RadixAttention layers: as in SGLang, a
missing or invalid file is one error line plus one warning, and the scales stay as they were.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from torch import nn

from mini_sglang.layers.radix_attention import RadixAttention
from mini_sglang.model_loader.kv_cache_scales import load_quantization_param_path
from mini_sglang.server_args import prepare_server_args
from tests.conftest import build_tiny_model, make_scheduler, prefill_logits

FILE_SCALES = {0: 0.3, 1: 0.7}  # layer -> scale (K and V)
E4M3_UNIT_ROUNDOFF = 2.0**-4
TOL_UNITS = 2
PROMPTS = [
    "The capital of France is Paris. The capital of Germany is Berlin. The capital of",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
]


def scales_json(path: Path, scales: dict, model_type="llama", dtype="float8_e4m3fn") -> str:
    """Write SGLang's QuantParamSchema layout for TP size 1 and return the path."""
    data = {
        "model_type": model_type,
        "kv_cache": {
            "dtype": dtype,
            "scaling_factor": {"0": {str(i): s for i, s in scales.items()}},
        },
    }
    path.write_text(json.dumps(data))
    return str(path)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory, qwen_tokenizer):
    path = tmp_path_factory.mktemp("fp8kv_file")
    build_tiny_model("llama", path, qwen_tokenizer, initializer_range=0.1)
    scales = scales_json(path / "kv_scales.json", FILE_SCALES)
    return str(path), scales, [qwen_tokenizer.encode(p) for p in PROMPTS]


def _logits(model_path: str, prompts, caplog=None, **kw) -> tuple[torch.Tensor, object]:
    sched = make_scheduler(model_path, skip_tokenizer_init=True, **kw)
    return prefill_logits(sched, prompts, all_positions=True).input_logits, sched


def test_file_scales_reach_the_layers_and_the_logits(tiny, caplog):
    model_path, scales_path, prompts = tiny
    caplog.set_level(logging.INFO)
    ref, _ = _logits(model_path, prompts)
    unit, _ = _logits(model_path, prompts, kv_cache_dtype="fp8_e4m3")
    assert any("no scaling factors provided" in r.getMessage() for r in caplog.records)
    caplog.clear()
    got, sched = _logits(
        model_path, prompts, kv_cache_dtype="fp8_e4m3", quantization_param_path=scales_path
    )
    assert f"Loaded KV cache scaling factors from {scales_path}" in caplog.text
    assert "no scaling factors provided" not in caplog.text

    runner = sched.tp_worker.model_runner
    attns = [layer.self_attn.attn for layer in runner.model.model.layers]
    assert [(a.k_scale, a.v_scale) for a in attns] == [(s, s) for s in FILE_SCALES.values()]
    tol = TOL_UNITS * E4M3_UNIT_ROUNDOFF * ref.abs().max().item()
    assert (got - unit).abs().max().item() > 0  # the file's scales are really applied
    diff = (got - ref).abs().max().item()
    assert 0 < diff <= tol, (diff, tol)


def test_cli_flag_parses_into_server_args(tmp_path):
    base = ["--model-path", "/nonexistent/model", "--device", "cpu"]
    args = prepare_server_args([*base, "--quantization-param-path", "s.json"])
    assert args.quantization_param_path == "s.json"
    assert (
        prepare_server_args([*base, "--quantization-param-path", "None"]).quantization_param_path
        is None
    )
    assert prepare_server_args(base).quantization_param_path is None


# ---- SGLang's rules, on a bare module of attention layers ------------------------------
def _attn_stack(checkpoint_scale: float = 1.0) -> nn.Module:
    layers = nn.ModuleList(RadixAttention(2, 16, 0.25, 2, layer_id=i) for i in range(2))
    for a in layers:
        a.k_scale = a.v_scale = checkpoint_scale
    return layers


def _load(model: nn.Module, path, kv="fp8_e4m3", tp_rank=0, tp_size=1, model_type="llama"):
    load_quantization_param_path(model, path, kv, tp_rank, tp_size, 2, model_type)
    return [(a.k_scale, a.v_scale) for a in model]


def test_file_wins_over_checkpoint_scales_and_picks_the_tp_rank(tmp_path):
    path = tmp_path / "tp2.json"
    data = {
        "model_type": "llama",
        "kv_cache": {
            "dtype": "float8_e4m3fn",
            "scaling_factor": {"0": {"0": 1.5, "1": 2.5}, "1": {"0": 3, "1": "0.125"}},
        },
    }
    path.write_text(json.dumps(data))
    assert _load(_attn_stack(0.5), str(path), tp_rank=1, tp_size=2) == [(3.0, 3.0), (0.125, 0.125)]
    assert _load(_attn_stack(0.5), str(path), tp_rank=0, tp_size=2) == [(1.5, 1.5), (2.5, 2.5)]


def _error_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


@pytest.mark.parametrize(
    "content,reason",
    [
        (None, "not found"),
        ("{not json", "Error decoding JSON"),
        ("[1, 2]", "file: Input should be a valid dictionary"),
        ({"wrong_type": True}, "Model type is llama"),
        ({"dtype": "float8_e5m2"}, "rather than float8_e4m3fn"),
        ({"tp": 2}, "TP size 2 but LLM engine is currently running with TP size 1"),
        ({"layers": 1}, "Expected 2 layers, got 1"),
        ({"scale": -1.0}, "must be finite and positive"),
        ({"scale": "big"}, "kv_cache.scaling_factor.0.0: Input should be a valid number"),
    ],
)
def test_bad_file_is_one_error_line_and_scales_stay(tmp_path, caplog, content, reason):
    caplog.set_level(logging.WARNING)
    path = tmp_path / "scales.json"
    if isinstance(content, str):
        path.write_text(content)
    elif isinstance(content, dict):
        scales = {0: content.get("scale", 0.3), 1: 0.3}
        if content.get("layers") == 1:
            scales = {0: 0.3}
        data = json.loads(
            Path(scales_json(path, scales, dtype=content.get("dtype", "float8_e4m3fn"))).read_text()
        )
        if content.get("wrong_type"):
            data["model_type"] = "qwen2"
        if content.get("tp") == 2:
            data["kv_cache"]["scaling_factor"]["1"] = data["kv_cache"]["scaling_factor"]["0"]
        path.write_text(json.dumps(data))
    assert _load(_attn_stack(0.5), str(path)) == [(0.5, 0.5)] * 2
    errors = _error_lines(caplog)
    assert len(errors) == 1 and reason in errors[0] and "\n" not in errors[0], errors
    assert "Defaulting to KV cache scaling factors = 1.0" in caplog.text


def test_file_is_ignored_with_a_warning_without_fp8_e4m3(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    path = scales_json(tmp_path / "s.json", FILE_SCALES)
    for kv in ("auto", "fp8_e5m2"):
        caplog.clear()
        assert _load(_attn_stack(), path, kv=kv) == [(1.0, 1.0)] * 2
        assert f"--quantization-param-path {path} is ignored" in caplog.text
        assert not _error_lines(caplog)
    caplog.clear()
    assert _load(_attn_stack(0.5), None) == [(0.5, 0.5)] * 2  # checkpoint scales: no warning
    assert not caplog.records
