"""/v1/rerank and /encode on a BERT cross-encoder, through the real server.

One server (module scope) on a tiny random BertForSequenceClassification with a WordPiece
tokenizer whose pairs carry token types 0 / 1, started with a chunk size below the pairs'
length and the radix cache on: an encoder input must still run whole and alone. Every score
is compared with transformers on the same (query, document) pair; the answer is SGLang's
list of {"score", "document", "index", "meta_info"}, best first, in FastAPI's compact JSON.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.server.conftest import launch_server, openai_error
from tests.tiny_encoders import build_tiny_encoder, build_tokenizer

QUERY = "what is the capital of france?"
DOCS = [
    "the cat sat on the mat.",
    "paris is the capital of france.",
    "a river in the city.",
    "the dog and the cat.",
]


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory, server_logs):
    """(server, transformers model) for one tiny BERT cross-encoder."""
    path = tmp_path_factory.mktemp("bert_cross_encoder")
    hf = build_tiny_encoder("BertForSequenceClassification", path, seed=3)
    handle = launch_server(str(path), "--chunked-prefill-size", "8", log_dir=server_logs)
    yield handle, hf
    handle.stop()


def _hf_score(hf, query: str, doc: str) -> float:
    enc = build_tokenizer("bert")(query, doc, return_tensors="pt")
    with torch.no_grad():
        return float(hf(**enc).logits[0, 0])


def _compact(body) -> bytes:
    """FastAPI's default JSON bytes for `body` (SGLang's /v1/rerank response)."""
    return json.dumps(body, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


def test_rerank_sorts_documents_by_cross_encoder_score(cross_encoder):
    server, hf = cross_encoder
    r = server.post("/v1/rerank", json={"query": QUERY, "documents": DOCS})
    assert r.status_code == 200, r.text
    results = r.json()
    assert r.content == _compact(results)
    assert [list(item) for item in results] == [["score", "document", "index", "meta_info"]] * 4
    assert sorted(item["index"] for item in results) == [0, 1, 2, 3]
    scores = [item["score"] for item in results]
    assert scores == sorted(scores, reverse=True)
    pair_lens = build_tokenizer("bert")([QUERY] * 4, DOCS)["input_ids"]
    for item in results:
        i = item["index"]
        assert item["document"] == DOCS[i]
        assert item["score"] == pytest.approx(_hf_score(hf, QUERY, DOCS[i]), abs=1e-4)
        assert item["meta_info"]["prompt_tokens"] == len(pair_lens[i])
        assert len(pair_lens[i]) > 8  # longer than a chunk: it ran whole all the same

    # top_n keeps the best N in the same order; return_documents false drops `document`.
    r = server.post(
        "/v1/rerank",
        json={"query": QUERY, "documents": DOCS, "top_n": 2, "return_documents": False},
    )
    assert r.status_code == 200, r.text
    top = r.json()
    assert [list(item) for item in top] == [["score", "index", "meta_info"]] * 2
    assert [t["index"] for t in top] == [item["index"] for item in results[:2]]
    for t, item in zip(top, results):  # other batch compositions: float-rounding apart
        assert t["score"] == pytest.approx(item["score"], abs=1e-5)


def test_encode_text_pair_and_single_text(cross_encoder):
    """/encode of one text gives the model's score for it (token types all 0); with
    is_cross_encoder_request, a list of [query, document] pairs gives each pair's score."""
    server, hf = cross_encoder
    r = server.post("/encode", json={"text": DOCS[1]})
    assert r.status_code == 200, r.text
    enc = build_tokenizer("bert")(DOCS[1], return_tensors="pt")
    with torch.no_grad():
        ref = float(hf(**enc).logits[0, 0])
    assert r.json()["embedding"] == pytest.approx(ref, abs=1e-4)
    body = {"text": [[QUERY, DOCS[0]], [QUERY, DOCS[1]]], "is_cross_encoder_request": True}
    r = server.post("/encode", json=body)
    assert r.status_code == 200, r.text
    got = [item["embedding"] for item in r.json()]
    assert got == pytest.approx([_hf_score(hf, QUERY, d) for d in DOCS[:2]], abs=1e-4)
    r = server.post("/encode", json={"text": ["a", "b"], "is_cross_encoder_request": True})
    assert r.status_code == 400
    assert "[query, document] pairs" in r.json()["error"]["message"]


def test_classify_single_label_cross_encoder(cross_encoder):
    """/v1/classify on a one-label cross-encoder: one class, probability 1."""
    server, _ = cross_encoder
    r = server.post("/v1/classify", json={"input": [DOCS[0], DOCS[1]]})
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert [(d["index"], d["label"], d["probs"], d["num_classes"]) for d in data] == [
        (0, "LABEL_0", [1.0], 1),
        (1, "LABEL_0", [1.0], 1),
    ]


@pytest.mark.parametrize(
    "body, message",
    [
        ({"query": "", "documents": ["a"]}, "Query cannot be empty"),
        ({"query": "  ", "documents": ["a"]}, "Query cannot be empty or whitespace only"),
        ({"query": "q", "documents": []}, "Documents cannot be empty"),
        ({"query": "q", "documents": ["a", ""]}, "Each document must be a non-empty string"),
        ({"query": "q", "documents": [" "]}, "Each document cannot be empty or whitespace only"),
        ({"query": "q", "documents": ["a"], "top_n": 0}, "top_n must be a positive integer"),
    ],
)
def test_rerank_bad_inputs_are_400(cross_encoder, body, message):
    server, _ = cross_encoder
    r = server.post("/v1/rerank", json=body)
    assert r.status_code == 400
    assert r.json() == openai_error(message)


def test_idle_kv_is_all_free(cross_encoder):
    server, _ = cross_encoder
    m = server.wait_memory_all_free()
    assert m["failures"] == 0 and m["evictable"] == 0  # encoders cache no prefixes
