"""Online weight updates on a real tp=2 server (two scheduler processes, gloo on CPU).

One server serves checkpoint A (the shared tiny Llama). A separate trainer process
(torch.distributed gloo, rank 0 of a 3-rank group whose ranks 1-2 are the server's TP ranks)
broadcasts checkpoint B's tensors through /init_weights_update_group +
/update_weights_from_distributed; the server must then answer with B's transformers greedy
output and /get_weights_by_name must return B's tensors (gathered across the TP shards).
/update_weights_from_disk then switches A -> B -> A, matching each checkpoint's transformers
output. The tp=2 server's plain correctness (greedy == transformers, sampled == tp=1 with the
same --random-seed) is checked first, since that server is already up.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.server.conftest import (
    REPO_ROOT,
    ServerHandle,
    TinyModel,
    _root_conftest,
    free_port,
    launch_server,
)

MAX_NEW = 8
SEED = 7

TRAINER = textwrap.dedent(
    """
    import json, sys
    import torch.distributed as dist
    from safetensors.torch import load_file
    from mini_sglang.model_executor.weight_updates import init_custom_process_group

    port, world, ckpt, names = sys.argv[1], int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
    group = init_custom_process_group(
        "gloo", f"tcp://127.0.0.1:{port}", world, 0, "weight_update_group"
    )
    print("joined", flush=True)
    weights = load_file(f"{ckpt}/model.safetensors")
    for name in names:
        dist.broadcast(weights[name].contiguous(), src=0, group=group)
    print("sent", flush=True)
    # A real trainer keeps running; this one leaves at once. Skipping interpreter teardown
    # avoids gloo aborting ("terminate called without an active exception") when its
    # threads are destroyed while the server side of the group is still alive.
    import os
    os._exit(0)
    """
)


@pytest.fixture(scope="module")
def ckpt_b(tmp_path_factory: pytest.TempPathFactory, tiny_model: TinyModel):
    """Checkpoint B: same architecture as A, other random weights; (path, HF model)."""
    from transformers import AutoTokenizer

    root = _root_conftest()
    tok = AutoTokenizer.from_pretrained(root.qwen_tokenizer_dir())
    out = tmp_path_factory.mktemp("tiny_llama_b")
    return str(out), root.build_tiny_model("llama", out, tok, seed=1)


@pytest.fixture(scope="module")
def tp2_server(tiny_model: TinyModel, server_logs: Path) -> Iterator[ServerHandle]:
    handle = launch_server(
        tiny_model.path, "--tp-size", "2", "--random-seed", str(SEED), log_dir=server_logs
    )
    yield handle
    handle.stop()


def _greedy(handle: ServerHandle, ids: list[int], n: int = MAX_NEW) -> dict:
    r = handle.post(
        "/generate",
        json={
            "input_ids": ids,
            "sampling_params": {"temperature": 0, "max_new_tokens": n, "ignore_eos": True},
        },
    )
    assert r.status_code == 200, r.text
    return r.json()


def _hf_greedy(model, ids: list[int], n: int = MAX_NEW) -> list[int]:
    return _root_conftest().hf_greedy(model, ids, n, ignore_eos=True)


def _weights(handle: ServerHandle, name: str, truncate: int = 100) -> torch.Tensor:
    r = handle.post("/get_weights_by_name", json={"name": name, "truncate_size": truncate})
    assert r.status_code == 200, r.text
    return torch.tensor(r.json())


def test_tp2_matches_transformers_and_tp1_sampling(tp2_server: ServerHandle, tiny_model):
    assert (
        _greedy(tp2_server, tiny_model.eos_prompt_ids)["output_ids"]
        == (tiny_model.greedy_ids[:MAX_NEW])
    )
    # Unseeded random sampling: both ranks must draw the same token every step, and with the
    # same --random-seed they draw what a tp=1 scheduler draws.
    body = {"temperature": 0.9, "max_new_tokens": 6, "ignore_eos": True}
    r = tp2_server.post("/generate", json={"input_ids": [5, 6, 7, 8], "sampling_params": body})
    assert r.status_code == 200, r.text
    root = _root_conftest()
    sched = root.make_scheduler(tiny_model.path, random_seed=SEED)
    from mini_sglang.managers.io_struct.generate import TokenizedGenerateReqInput
    from mini_sglang.sampling.sampling_params import SamplingParams

    sp = SamplingParams(**body)
    sp.normalize(None)
    sched.add_request(TokenizedGenerateReqInput("s0", "", [5, 6, 7, 8], sp))
    sched.run_until_idle()
    ref_ids = root.collect_outputs(sched.test_outputs)["s0"].output_ids
    assert r.json()["output_ids"] == ref_ids


def test_get_weights_by_name_gathers_tp_shards(tp2_server: ServerHandle, tiny_model):
    from safetensors.torch import load_file

    full = load_file(f"{tiny_model.path}/model.safetensors")
    for name in (
        "model.layers.0.self_attn.k_proj.weight",  # QKV shard, dim 0
        "model.layers.1.mlp.up_proj.weight",  # merged gate/up shard
        "model.layers.0.self_attn.o_proj.weight",  # row-parallel, dim 1
        "model.embed_tokens.weight",  # vocab-parallel
        "model.norm.weight",  # replicated
    ):
        got = _weights(tp2_server, name, truncate=5)
        torch.testing.assert_close(got, full[name][:5].float(), rtol=0, atol=0, msg=name)


def test_trainer_pushes_weights_then_disk_switches_back_and_forth(
    tp2_server: ServerHandle, tiny_model: TinyModel, ckpt_b
):
    path_b, hf_b = ckpt_b
    from safetensors.torch import load_file

    weights_b = load_file(f"{path_b}/model.safetensors")
    names = sorted(weights_b)
    port = free_port()
    trainer = subprocess.Popen(
        [sys.executable, "-c", TRAINER, str(port), "3", path_b, json.dumps(names)],
        cwd=str(REPO_ROOT),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        r = tp2_server.post(
            "/init_weights_update_group",
            json={
                "master_address": "127.0.0.1",
                "master_port": port,
                "rank_offset": 1,
                "world_size": 3,
                "group_name": "weight_update_group",
                "backend": "gloo",
            },
        )
        assert r.status_code == 200 and r.json()["success"], r.text
        r = tp2_server.post(
            "/update_weights_from_distributed",
            json={
                "names": names,
                "dtypes": [str(weights_b[n].dtype).removeprefix("torch.") for n in names],
                "shapes": [list(weights_b[n].shape) for n in names],
                "group_name": "weight_update_group",
                "weight_version": "trained-1",
            },
        )
        assert r.status_code == 200 and r.json()["success"], r.text
        assert trainer.wait(timeout=60) == 0, trainer.stdout.read()
    finally:
        if trainer.poll() is None:
            trainer.kill()
    r = tp2_server.post("/destroy_weights_update_group", json={"group_name": "weight_update_group"})
    assert r.json()["success"], r.text

    prompt = tiny_model.eos_prompt_ids
    out_b = _hf_greedy(hf_b, prompt)
    assert out_b != tiny_model.greedy_ids[:MAX_NEW]  # B really is another model
    res = _greedy(tp2_server, prompt)
    assert res["output_ids"] == out_b
    assert res["meta_info"]["weight_version"] == "trained-1"
    assert tp2_server.get("/get_model_info").json()["weight_version"] == "trained-1"
    got = _weights(tp2_server, "model.layers.1.self_attn.v_proj.weight", truncate=3)
    torch.testing.assert_close(got, weights_b["model.layers.1.self_attn.v_proj.weight"][:3])

    # From disk: A, then B, then A again; each matches its own transformers output.
    for path, expected in (
        (tiny_model.path, tiny_model.greedy_ids[:MAX_NEW]),
        (path_b, out_b),
        (tiny_model.path, tiny_model.greedy_ids[:MAX_NEW]),
    ):
        r = tp2_server.post(
            "/update_weights_from_disk", json={"model_path": path, "weight_version": path[-6:]}
        )
        assert r.status_code == 200, r.text
        assert r.json()["success"] and r.json()["num_paused_requests"] == 0, r.text
        res = _greedy(tp2_server, prompt)
        assert res["output_ids"] == expected, path
        assert res["meta_info"]["weight_version"] == path[-6:]
        # the info routes report the checkpoint now loaded, not the launch one
        info = tp2_server.get("/get_server_info").json()
        assert (info["model_path"], info["weight_version"]) == (path, path[-6:])
        assert info["internal_states"][0]["model_path"] == path
        assert tp2_server.get("/get_model_info").json()["model_path"] == path
    info = tp2_server.get("/get_model_info").json()
    assert info["model_path"] == tiny_model.path


def test_update_from_disk_waits_for_in_flight_request(tp2_server: ServerHandle, tiny_model):
    """A request already running when the update arrives finishes on the old weights
    (SGLang holds the update until in-flight requests are done); a bad path is a 400 that
    leaves the served model unchanged."""
    long_out: dict = {}

    def run() -> None:
        long_out.update(_greedy(tp2_server, tiny_model.eos_prompt_ids, n=24))

    t = threading.Thread(target=run)
    t.start()
    r = tp2_server.post("/update_weights_from_disk", json={"model_path": tiny_model.path})
    t.join(timeout=120)
    assert r.status_code == 200 and r.json()["success"], r.text
    assert long_out["output_ids"][:12] == tiny_model.greedy_ids
    bad = tp2_server.post("/update_weights_from_disk", json={"model_path": "/nonexistent/x"})
    assert bad.status_code == 400 and not bad.json()["success"], bad.text
    assert (
        _greedy(tp2_server, tiny_model.eos_prompt_ids)["output_ids"]
        == (tiny_model.greedy_ids[:MAX_NEW])
    )


def test_update_weight_version_is_reported_everywhere(tp2_server: ServerHandle, tiny_model):
    r = tp2_server.post("/update_weight_version", json={"new_version": "v-next"})
    assert r.status_code == 200 and r.json()["new_version"] == "v-next", r.text
    assert tp2_server.get("/get_weight_version").json() == {"weight_version": "v-next"}
    assert tp2_server.get("/get_model_info").json()["weight_version"] == "v-next"
    info = tp2_server.get("/get_server_info").json()
    assert info["weight_version"] == info["internal_states"][0]["weight_version"] == "v-next"
    res = _greedy(tp2_server, tiny_model.eos_prompt_ids, n=2)
    assert res["meta_info"]["weight_version"] == "v-next"
