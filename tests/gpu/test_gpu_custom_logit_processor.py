"""Custom logit processors on the GPU server (the tiny random Llama on CUDA, Triton
attention, CUDA graphs and overlap scheduling on): the processors run on the logits the decode
graph produced, per request, in batches that mix them with plain requests.

Skipped without CUDA.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import pytest
import torch

from tests.server.conftest import (
    GPU_STARTUP_TIMEOUT_S,
    ServerHandle,
    build_tiny_model_dir,
    launch_server,
)
from tests.server.test_custom_logit_processor_api import client_processor_strings

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
PROMPTS = ["The capital of France is", "Once upon a time", "1, 2, 3,", "Dear friend,"]


@pytest.fixture(scope="module")
def gpu_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerHandle]:
    model = build_tiny_model_dir(tmp_path_factory.mktemp("gpu_clp_tiny_llama"))
    handle = launch_server(
        model.path,
        "--device",
        "cuda",
        "--attention-backend",
        "triton",
        "--sampling-backend",
        "pytorch",
        "--enable-custom-logit-processor",
        log_dir=tmp_path_factory.mktemp("gpu_clp_logs"),
        startup_timeout=GPU_STARTUP_TIMEOUT_S,
    )
    yield handle
    handle.stop()


def generate(server: ServerHandle, text: str, proc=None, params=None, n: int = 12) -> list[int]:
    sp = {"temperature": 0, "max_new_tokens": n, "ignore_eos": True}
    if params is not None:
        sp["custom_params"] = params
    body = {"text": text, "sampling_params": sp}
    if proc is not None:
        body["custom_logit_processor"] = proc
    r = server.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()["output_ids"]


def test_processors_under_graphs_and_overlap(gpu_server: ServerHandle) -> None:
    assert gpu_server.get("/get_server_info").json()["disable_cuda_graph"] is False
    procs = client_processor_strings()
    forced = [101, 202, 303]
    assert generate(gpu_server, PROMPTS[0], procs["force"], {"tokens": forced}, 7) == [
        101,
        202,
        303,
        101,
        202,
        303,
        101,
    ]
    plain = [generate(gpu_server, p) for p in PROMPTS]
    ban = {"token_ids": [plain[1][0]]}
    cases = [
        (PROMPTS[0], procs["force"], {"tokens": forced}),
        (PROMPTS[1], procs["ban"], ban),
        (PROMPTS[2], None, None),
        (PROMPTS[3], None, None),
    ]
    alone = [generate(gpu_server, t, p, c) for t, p, c in cases]
    assert alone[1][0] != plain[1][0] and alone[2:] == plain[2:]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda c: generate(gpu_server, *c), cases * 2))
    # bf16 kernels may round differently at other batch sizes, so only what the processors
    # decide is compared exactly: the forced sequence, and the banned token's absence.
    for out in together[0::4]:
        assert out == (forced * 4)[:12]
    for out in together[1::4]:
        assert ban["token_ids"][0] not in out and len(out) == 12
