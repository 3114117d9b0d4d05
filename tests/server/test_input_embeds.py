"""input_embeds prompts on the real server (SGLang 0.5.4's GenerateReqInput.input_embeds and
/generate_from_file), on a --disable-radix-cache server as SGLang requires: the prompt's own
embeddings, taken from the checkpoint's embedding table, give exactly the greedy output of
its token ids, one prompt or a batch of two of the same length (no cache confusion between
them), also when chunked prefill splits the prompt; a misfit vector is a 400 and the
server keeps serving."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from safetensors.torch import load_file

from tests.server.conftest import ServerHandle, TinyModel, launch_server

PROMPTS = [[5, 17, 99, 1234, 42, 7], [8, 17, 300, 1234, 42, 9]]
GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
CONTEXT_LEN = 32


@pytest.fixture(scope="module")
def embeds_server(tiny_model: TinyModel, server_logs) -> Iterator[ServerHandle]:
    # auto-truncate: /generate_from_file asks for 512 new tokens, more than the context; a
    # short context keeps that generation short. Chunks of 4 split each 6-token prompt, so
    # a chunk takes its slice of the embeddings.
    args = (
        "--disable-radix-cache",
        "--allow-auto-truncate",
        "--chunked-prefill-size",
        "4",
        "--context-length",
        str(CONTEXT_LEN),
    )
    handle = launch_server(tiny_model.path, *args, log_dir=server_logs)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def embeds(tiny_model: TinyModel) -> list[list[list[float]]]:
    """Each prompt's rows of the checkpoint's embed_tokens weight."""
    (shard,) = Path(tiny_model.path).glob("*.safetensors")
    table = load_file(shard)["model.embed_tokens.weight"].float()
    return [table[ids].tolist() for ids in PROMPTS]


def _generate(server: ServerHandle, **body) -> dict | list:
    r = server.post("/generate", json={"sampling_params": GREEDY, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_embeddings_give_the_ids_greedy_output(embeds_server: ServerHandle, embeds) -> None:
    by_ids = [_generate(embeds_server, input_ids=ids)["output_ids"] for ids in PROMPTS]
    assert by_ids[0] != by_ids[1]
    one = _generate(embeds_server, input_embeds=embeds[0])
    assert one["output_ids"] == by_ids[0]
    assert one["meta_info"]["prompt_tokens"] == len(PROMPTS[0])
    batch = _generate(embeds_server, input_embeds=embeds)
    assert [out["output_ids"] for out in batch] == by_ids
    # Once more: nothing of the first embedding prompt is reused for the second.
    assert _generate(embeds_server, input_embeds=embeds[1])["output_ids"] == by_ids[1]
    assert embeds_server.wait_memory_all_free()["failures"] == 0


def test_generate_from_file(embeds_server: ServerHandle, embeds) -> None:
    """SGLang's upload route: greedy, up to 512 new tokens, /generate's reply."""
    body = {"max_new_tokens": 512, "temperature": 0.0}
    by_ids = _generate(embeds_server, input_ids=PROMPTS[0], sampling_params=body)
    files = {"file": ("embeds.json", json.dumps(embeds[0]), "application/json")}
    r = embeds_server.post("/generate_from_file", files=files)
    assert r.status_code == 200, r.text
    assert r.json()["output_ids"] == by_ids["output_ids"]
    bad = embeds_server.post("/generate_from_file", files={"file": ("e.json", "[[1.0, 2.0]]")})
    assert bad.status_code == 400 and "hidden size" in bad.json()["error"]["message"]


def test_misfit_embeddings_are_400s(embeds_server: ServerHandle, embeds) -> None:
    hidden = len(embeds[0][0])
    message = f"input_embeds must be a list of vectors of {hidden} numbers (the hidden size)."
    for bad in ([[0.5] * (hidden + 1)], [[0.5] * hidden, [0.5]]):
        r = embeds_server.post("/generate", json={"input_embeds": bad, "sampling_params": GREEDY})
        assert r.status_code == 400 and r.json() == {"error": {"message": message}}, r.text
    # a non-number fails the body's validation, as SGLang's pydantic
    r = embeds_server.post("/generate", json={"input_embeds": [["x"] * hidden]})
    assert r.status_code == 400 and r.json()["type"] == "Bad Request", r.text
    assert _generate(embeds_server, input_embeds=embeds[0])["output_ids"]
