"""An embedding server (`--is-embedding` on a tiny random Qwen3) end to end.

One server start for the module. Checked against transformers (last token, normalized,
1e-4): /encode (text, input_ids, batches; SGLang's {"embedding", "meta_info"} shape and key
order), /v1/embeddings through the official openai client (float and base64, lists in
order, usage), /classify and /v1/classify shapes, /model_info; every bad input's 400 (empty,
over the context length, wrong types, out-of-vocab ids, too many items, encoding_format,
dimensions without Matryoshka, /generate on an embedding model); and afterwards no KV or
request slot is held.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import openai
import pytest
import requests
import torch

from mini_sglang.managers.input_checks import NOT_A_GENERATION_MODEL
from mini_sglang.managers.io_struct.generate import MAX_EMBEDDING_BATCH_SIZE
from tests.server.conftest import ServerHandle, _root_conftest, launch_server

TEXTS = ["The capital of France is", "Embeddings map text to vectors.", "hi"]
TOL = 1e-4


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory, qwen_tokenizer) -> tuple[Path, Any, Any]:
    root = _root_conftest()
    path = tmp_path_factory.mktemp("tiny_qwen3_embed")
    tok = qwen_tokenizer
    model = root.build_tiny_model("qwen3", path, tok)
    cfg = json.loads((path / "config.json").read_text())
    cfg["max_position_embeddings"] = 64  # a small context for the length checks
    (path / "config.json").write_text(json.dumps(cfg))
    return path, tok, model


@pytest.fixture(scope="module")
def emb_server(model_dir, server_logs: Path) -> Iterator[ServerHandle]:
    handle = launch_server(str(model_dir[0]), "--is-embedding", log_dir=server_logs)
    yield handle
    handle.stop()


@torch.no_grad()
def reference(model_dir, ids: list[int]) -> list[float]:
    hidden = model_dir[2].model(torch.tensor([ids])).last_hidden_state[0, -1]
    return torch.nn.functional.normalize(hidden, dim=0).tolist()


def close(a: list[float], b: list[float]) -> bool:
    return np.allclose(np.array(a), np.array(b), atol=TOL, rtol=0)


def test_encode_native(emb_server, model_dir):
    tok = model_dir[1]
    r = emb_server.post("/encode", json={"text": TEXTS[0]})
    assert r.status_code == 200, r.text
    out = r.json()
    assert list(out) == ["embedding", "meta_info"]
    meta = out["meta_info"]
    assert list(meta) == ["id", "finish_reason", "prompt_tokens", "weight_version", "e2e_latency"]
    ids = tok.encode(TEXTS[0])
    assert meta["prompt_tokens"] == len(ids)
    assert meta["finish_reason"] == {"type": "length", "length": 0}
    assert close(out["embedding"], reference(model_dir, ids))
    assert abs(np.linalg.norm(out["embedding"]) - 1.0) < 1e-5
    # A batch of token ids, answered in order; /classify answers the same shape.
    batch = [tok.encode(t) for t in TEXTS]
    for path in ("/encode", "/classify"):
        outs = emb_server.post(path, json={"input_ids": batch}).json()
        assert isinstance(outs, list) and len(outs) == len(TEXTS)
        for ids, o in zip(batch, outs):
            assert o["meta_info"]["prompt_tokens"] == len(ids)
            assert close(o["embedding"], reference(model_dir, ids))
    info = emb_server.get("/model_info").json()
    assert info["is_generation"] is False


def test_openai_embeddings(emb_server, model_dir):
    tok = model_dir[1]
    client = openai.OpenAI(base_url=f"{emb_server.base_url}/v1", api_key="x", max_retries=0)
    # Without encoding_format the client asks for base64 and decodes it itself.
    for kw in ({"encoding_format": "float"}, {}):
        res = client.embeddings.create(model="m", input=TEXTS, **kw)
        assert [d.index for d in res.data] == [0, 1, 2]
        for text, d in zip(TEXTS, res.data):
            assert close(d.embedding, reference(model_dir, tok.encode(text)))
        n = sum(len(tok.encode(t)) for t in TEXTS)
        assert res.usage.prompt_tokens == n and res.usage.total_tokens == n
    # Raw bytes: SGLang's field order; base64 is little-endian float32.
    ids = tok.encode(TEXTS[1])
    body = emb_server.post("/v1/embeddings", json={"input": ids}).json()
    assert list(body) == ["data", "model", "object", "usage"]
    assert body["object"] == "list" and list(body["data"][0]) == ["embedding", "index", "object"]
    assert body["usage"] == {
        "prompt_tokens": len(ids),
        "total_tokens": len(ids),
        "completion_tokens": 0,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
    }
    b64 = emb_server.post(
        "/v1/embeddings", json={"input": [ids, ids[:3]], "encoding_format": "base64"}
    ).json()
    vec = np.frombuffer(base64.b64decode(b64["data"][0]["embedding"]), dtype="<f4")
    assert close(vec.tolist(), body["data"][0]["embedding"])
    assert close(b64_list(b64["data"][1]["embedding"]), reference(model_dir, ids[:3]))


def b64_list(s: str) -> list[float]:
    return np.frombuffer(base64.b64decode(s), dtype="<f4").tolist()


def test_v1_classify_shape(emb_server):
    body = emb_server.post("/v1/classify", json={"input": TEXTS[:2]}).json()
    assert list(body) == ["id", "object", "created", "model", "data", "usage"]
    assert body["id"].startswith("classify-") and [d["index"] for d in body["data"]] == [0, 1]
    for d in body["data"]:
        assert list(d) == ["index", "label", "probs", "num_classes"]
        assert d["num_classes"] == len(d["probs"])


def _native_error(r: requests.Response) -> str:
    assert r.status_code == 400, r.text
    return r.json()["error"]["message"]


def _openai_error(r: requests.Response) -> str:
    assert r.status_code == 400, r.text
    body = r.json()
    assert body["object"] == "error" and body["code"] == 400
    return body["message"]


def test_bad_inputs(emb_server):
    long_ids = list(range(100, 200))  # over the 64-token context
    assert "context length" in _native_error(
        emb_server.post("/encode", json={"input_ids": long_ids})
    )
    assert _native_error(emb_server.post("/encode", json={"text": ""})) == "The input is empty."
    assert "input_ids cannot be empty" in _native_error(
        emb_server.post("/encode", json={"input_ids": [[1], []]})
    )
    assert "[0, " in _native_error(emb_server.post("/encode", json={"input_ids": [10**7]}))
    too_many = {"input_ids": [[5]] * (MAX_EMBEDDING_BATCH_SIZE + 1)}
    assert "at most" in _native_error(emb_server.post("/encode", json=too_many))
    assert emb_server.post("/encode", json={"text": 5}).status_code == 400
    gen = emb_server.post("/generate", json={"text": "hi"})
    assert _native_error(gen) == NOT_A_GENERATION_MODEL
    assert "context length" in _openai_error(
        emb_server.post("/v1/embeddings", json={"input": long_ids})
    )
    assert _openai_error(emb_server.post("/v1/embeddings", json={"input": [" "]})).startswith(
        "Input at index 0"
    )
    assert "encoding_format" in _openai_error(
        emb_server.post("/v1/embeddings", json={"input": "a", "encoding_format": "hex"})
    )
    assert "matryoshka" in _openai_error(
        emb_server.post("/v1/embeddings", json={"input": "a", "dimensions": 8})
    )
    assert emb_server.post("/v1/embeddings", json={"input": {"a": 1}}).status_code == 400
    # Nothing is held after all of that (nor after the good requests before).
    emb_server.wait_memory_all_free()
    assert emb_server.memory_accounting()["failures"] == 0
