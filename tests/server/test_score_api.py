"""/v1/score (SGLang 0.5.4's decoder-only scoring) and the prefill-only logprobs under it.

Scores are checked against HF transformers on the same tiny model: per item, the
probabilities of the label tokens right after query + item (or item + query), or their
softmax over the labels. The body is checked byte for byte against SGLang's serialisation
(FastAPI's default JSONResponse: json.dumps, compact), errors against its 400 envelope.
"""

from __future__ import annotations

import json
import math
import uuid

import pytest
import torch

from tests.server.conftest import ServerHandle

ATOL = 1e-4


def next_token_logprobs(hf_model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(hf_model(torch.tensor([ids])).logits[0, -1].float(), -1)


def score(server: ServerHandle, body: dict):
    return server.post("/v1/score", json=body)


def test_text_items_score_label_probabilities(server, tokenizer, hf_model):
    query = f"Question {uuid.uuid4().hex}: is the sky blue? Answer:"
    items = [" yes", " no", " maybe so"]
    labels = [tokenizer.encode(" yes")[0], tokenizer.encode(" no")[0], 100]
    r = score(server, {"query": query, "items": items, "label_token_ids": labels})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    # SGLang's bytes: json.dumps of the response model, compact, in its field order
    assert r.text == json.dumps(body, ensure_ascii=False, separators=(",", ":"))
    assert list(body) == ["scores", "model", "usage", "object"]
    assert body["model"] == "default" and body["usage"] is None and body["object"] == "scoring"
    assert len(body["scores"]) == len(items)
    for item, scores in zip(items, body["scores"]):
        lp = next_token_logprobs(hf_model, tokenizer.encode(query + item))
        # relative: a random model's probabilities are ~1e-5, below any useful absolute bound
        assert scores == pytest.approx([math.exp(lp[t].item()) for t in labels], rel=1e-3)
    server.wait_memory_all_free()


def test_token_ids_item_first_with_softmax(server, hf_model):
    query = [11, 22, 33, 44]
    items = [[5, 6], [7], [8, 9, 10]]
    labels = [3, 17, 250]
    r = score(
        server,
        {
            "query": query,
            "items": items,
            "label_token_ids": labels,
            "apply_softmax": True,
            "item_first": True,
            "model": "my-model",
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "my-model"
    for item, scores in zip(items, body["scores"]):
        lp = next_token_logprobs(hf_model, item + query)
        expected = torch.softmax(lp[labels], 0).tolist()
        assert scores == pytest.approx(expected, abs=ATOL)
        assert sum(scores) == pytest.approx(1.0, abs=1e-5)


def test_single_text_item_and_no_items(server):
    r = score(server, {"query": "Hello", "items": " world", "label_token_ids": [1, 2]})
    assert r.status_code == 200, r.text
    assert len(r.json()["scores"]) == 1 and len(r.json()["scores"][0]) == 2
    r = score(server, {"query": "Hello", "items": [], "label_token_ids": [1, 2]})
    assert r.status_code == 200, r.text
    assert r.json()["scores"] == []


@pytest.mark.parametrize(
    "body, message",
    [
        ({"query": "q", "items": ["a"]}, "label_token_ids must be provided"),
        (
            {"query": "q", "items": ["a"], "label_token_ids": [10**6]},
            "Token ID 1000000 is out of vocabulary (vocab size: {vocab})",
        ),
        (
            {"query": "q", "items": [[1, 2]], "label_token_ids": [1]},
            "Invalid combination of query/items types for score_request.",
        ),
        (
            {"query": [1, 2], "items": ["a"], "label_token_ids": [1]},
            "Invalid combination of query/items types for score_request.",
        ),
    ],
)
def test_bad_requests_get_sglangs_400(server, tokenizer, body, message):
    r = score(server, body)
    assert r.status_code == 400
    assert r.json() == {
        "object": "error",
        "message": message.format(vocab=tokenizer.vocab_size),
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }


def test_over_long_item_is_a_400_and_the_server_stays_up(server):
    r = score(server, {"query": [1] * 5000, "items": [[2]], "label_token_ids": [3]})
    assert r.status_code == 400, r.text
    assert "context length" in r.json()["message"]
    r = score(server, {"query": [1, 2], "items": [[2]], "label_token_ids": [3]})
    assert r.status_code == 200, r.text
    server.wait_memory_all_free()


def test_prefill_only_generate_reports_next_position_logprobs(server, tokenizer, hf_model):
    """max_new_tokens 0 with logprobs (what /v1/score sends): no output or prompt logprobs,
    but the position after the prompt reports top_logprobs_num and token_ids_logprob,
    exactly as SGLang 0.5.4's prefill-only path."""
    ids = tokenizer.encode(f"Prefill only {uuid.uuid4().hex}")
    body = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": 0},
        "return_logprob": True,
        "top_logprobs_num": 2,
        "token_ids_logprob": [5, 100],
    }
    r = server.post("/generate", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["text"] == "" and out["output_ids"] == []
    meta = out["meta_info"]
    assert meta["completion_tokens"] == 0
    for name in ("input_token_logprobs", "input_top_logprobs", "input_token_ids_logprobs"):
        assert meta[name] == [], name
    assert meta["output_token_logprobs"] == []
    lp = next_token_logprobs(hf_model, ids)
    (top,) = meta["output_top_logprobs"]
    assert [t[1] for t in top] == lp.topk(2).indices.tolist()
    assert [t[0] for t in top] == pytest.approx(lp.topk(2).values.tolist(), abs=ATOL)
    (watched,) = meta["output_token_ids_logprobs"]
    assert [t[1] for t in watched] == [5, 100]
    assert [t[0] for t in watched] == pytest.approx(lp[[5, 100]].tolist(), abs=ATOL)
    assert all(t[2] is None for t in top + watched)
