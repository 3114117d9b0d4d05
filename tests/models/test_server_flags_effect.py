"""Flags that act as in SGLang 0.5.4 (accepting them without acting would be silent):
--decode-log-interval N logs "Decode batch." every N decode steps; --sampling-defaults
openai ignores generation_config.json's sampling values (model: uses them);
--completion-template, --enable-return-hidden-states and --multi-item-scoring-delimiter, whose
features mini-sglang lacks, are named in a warning and reset. (--sampling-backend pytorch: tests/gpu/test_gpu_sampler.py.)
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from mini_sglang.model_config import ModelConfig
from mini_sglang.server_args import ServerArgs
from tests.conftest import make_req, make_scheduler


@pytest.mark.parametrize("interval", [1, 3])
def test_decode_log_interval(tiny_llama_path, caplog, interval):
    caplog.set_level(logging.INFO, logger="mini_sglang")
    # Without overlap exactly 9 decode forwards run (overlap adds one surplus forward).
    sched = make_scheduler(
        tiny_llama_path, decode_log_interval=interval, disable_overlap_schedule=True
    )
    sched.add_request(make_req("a", [5, 6, 7], 10, True))
    sched.run_until_idle()
    lines = [r for r in caplog.records if r.getMessage().startswith("Decode batch. #running-req")]
    assert len(lines) == 9 // interval  # 10 tokens: 1 from the prefill, 9 decode steps


@pytest.mark.parametrize(
    "mode,expected", [("model", {"temperature": 0.6, "top_k": 20}), ("openai", {})]
)
def test_sampling_defaults(tiny_llama_path, tmp_path, mode, expected):
    model = tmp_path / "m"
    model.mkdir()
    for f in Path(tiny_llama_path).iterdir():
        (model / f.name).write_bytes(f.read_bytes())
    gen = {"temperature": 0.6, "top_k": 20, "eos_token_id": 7}
    (model / "generation_config.json").write_text(json.dumps(gen))
    args = ServerArgs(model_path=str(model), device="cpu", sampling_defaults=mode)
    cfg = ModelConfig.from_server_args(args)
    assert cfg.generation_defaults == expected
    assert 7 in cfg.eos_token_ids  # eos ids come from generation_config either way


@pytest.mark.parametrize(
    "kw",
    [
        {"completion_template": "deepseek_coder"},
        {"enable_return_hidden_states": True},
        {"multi_item_scoring_delimiter": 50},
    ],
)
def test_flags_for_missing_features_warn_and_reset(tiny_llama_path, caplog, kw):
    caplog.set_level(logging.WARNING, logger="mini_sglang")
    args = ServerArgs(model_path=tiny_llama_path, device="cpu", **kw)
    (name,) = kw
    assert getattr(args, name) in (None, False)
    flag = "--" + name.replace("_", "-")
    assert any(
        r.getMessage().startswith(f"{flag}=")
        and "is not supported by mini-sglang" in r.getMessage()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]
