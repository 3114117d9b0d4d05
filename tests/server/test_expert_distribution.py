"""/start_expert_distribution_record, /stop_expert_distribution_record and
/dump_expert_distribution_record on the real multi-process server.

With `--expert-distribution-recorder-mode stat` (a tiny random Qwen3-MoE, top-4 of 8, no
overlap): SGLang 0.5.4's 200 text replies for GET and POST, and the dump is a .pt file in
$SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR whose counts hold k choices per token the model
ran while recording, in every layer (what they are per expert is checked against
transformers' routing in tests/models/test_moe_models.py). Without a recorder (the shared
tiny-Llama server) each route is a 400 that says which flag to set, and the server serves on.
"""

from __future__ import annotations

import glob
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.server.conftest import ServerHandle, launch_server

TOP_K = 4
NEW_TOKENS = 6


@pytest.fixture(scope="module")
def moe_server(
    tmp_path_factory: pytest.TempPathFactory, qwen_tokenizer: Any, server_logs: Path
) -> Iterator[tuple[ServerHandle, Path]]:
    from transformers import AutoModelForCausalLM

    from tests.models.test_moe_models import tiny_moe_config

    model_dir = tmp_path_factory.mktemp("tiny_qwen3_moe")
    torch.manual_seed(0)
    config = tiny_moe_config("qwen3_moe", len(qwen_tokenizer))
    assert config.num_experts_per_tok == TOP_K
    AutoModelForCausalLM.from_config(config).save_pretrained(str(model_dir))
    qwen_tokenizer.save_pretrained(str(model_dir))
    records = tmp_path_factory.mktemp("expert_records")
    handle = launch_server(
        str(model_dir),
        "--expert-distribution-recorder-mode", "stat",
        "--expert-distribution-recorder-buffer-size", "-1",
        "--disable-overlap-schedule",
        log_dir=server_logs,
        env={"SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR": str(records)},
    )  # fmt: skip
    yield handle, records
    handle.stop()


def _generate(handle: ServerHandle, input_ids: list[int]) -> list[int]:
    r = handle.post(
        "/generate",
        json={
            "input_ids": input_ids,
            "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True},
        },
    )
    assert r.status_code == 200, r.text
    return r.json()["output_ids"]


def test_record_start_stop_dump(moe_server: tuple[ServerHandle, Path]) -> None:
    handle, records = moe_server
    r = handle.get("/start_expert_distribution_record")
    assert (r.status_code, r.text) == (200, "Start recording the expert distribution.\n")
    prompt = [11, 22, 33, 44, 55, 66, 77]
    assert len(_generate(handle, prompt)) == NEW_TOKENS
    r = handle.post("/stop_expert_distribution_record")
    assert (r.status_code, r.text) == (200, "Stop recording the expert distribution.\n")
    _generate(handle, [99, 98, 97])  # after the stop: not recorded
    assert glob.glob(str(records / "*.pt")) == []
    r = handle.post("/dump_expert_distribution_record")
    assert (r.status_code, r.text) == (200, "Dump expert distribution record.\n")
    (path,) = glob.glob(str(records / "expert_distribution_recorder_*.pt"))
    count = torch.load(path)["logical_count"]
    # One prefill pass, then a decode pass per output token but the last.
    assert count.shape == (NEW_TOKENS, 2, 8)
    ran = len(prompt) + NEW_TOKENS - 1
    assert count.sum((0, 2)).tolist() == [ran * TOP_K] * 2
    assert count[0].sum(1).tolist() == [len(prompt) * TOP_K] * 2
    # GET works for every route, and the dump reset the record.
    r = handle.get("/dump_expert_distribution_record")
    assert (r.status_code, r.text) == (200, "Dump expert distribution record.\n")
    paths = set(glob.glob(str(records / "*.pt"))) - {path}
    assert [torch.load(p)["logical_count"].shape[0] for p in paths] == [0]
    assert handle.post("/stop_expert_distribution_record").status_code == 200
    handle.wait_memory_all_free()


@pytest.mark.parametrize("verb", ["start", "stop", "dump"])
def test_without_a_recorder_is_a_400(server: ServerHandle, verb: str) -> None:
    r = server.post(f"/{verb}_expert_distribution_record")
    assert r.status_code == 400
    assert r.json() == {
        "error": {
            "message": "No expert distribution recorder: start the server with "
            "--expert-distribution-recorder-mode stat."
        }
    }
    r = server.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 200, r.text
