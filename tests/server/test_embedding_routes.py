"""The embedding-model endpoints on a generation model: SGLang 0.5.4's exact 400s.

/encode and /classify answer `{"error": {"message"}}`, the OpenAI routes (/v1/embeddings,
/v1/classify, /v1/rerank) OpenAI's error envelope; a malformed body gets the message SGLang
gives it before it finds out the model is no embedding model. The server keeps serving.
"""

from __future__ import annotations

import pytest
import requests

from mini_sglang.entrypoints.embedding_routes import NOT_AN_EMBEDDING_MODEL
from tests.server.conftest import openai_error

NATIVE_CASES = [
    ("post", "/encode", {"text": "hello"}, NOT_AN_EMBEDDING_MODEL),
    ("put", "/encode", {"input_ids": [[1, 2], [3]]}, NOT_AN_EMBEDDING_MODEL),
    ("post", "/classify", {"text": ["a", "b"]}, NOT_AN_EMBEDDING_MODEL),
    ("post", "/encode", {}, "At least one of text, input_ids, or image should be provided"),
    (
        "post",
        "/classify",
        {"text": "a", "input_ids": [1]},
        "text and input_ids cannot be provided at the same time",
    ),
]


@pytest.mark.parametrize("method, path, body, message", NATIVE_CASES)
def test_native_routes(server, method, path, body, message):
    r = requests.request(method, server.base_url + path, json=body, timeout=60)
    assert r.status_code == 400
    assert r.content == b'{"error":{"message":"' + message.encode() + b'"}}'


OPENAI_CASES = [
    ("/v1/embeddings", {"input": "hello"}, NOT_AN_EMBEDDING_MODEL),
    ("/v1/embeddings", {"input": [[1, 2], [3]], "model": "x"}, NOT_AN_EMBEDDING_MODEL),
    ("/v1/embeddings", {"input": ""}, "Input cannot be empty"),
    ("/v1/embeddings", {"input": "   "}, "Input cannot be empty or whitespace only"),
    (
        "/v1/embeddings",
        {"input": ["a", " "]},
        "Input at index 1 cannot be empty or whitespace only",
    ),
    ("/v1/embeddings", {"input": [1, -2]}, "Token ID at index 1 must be non-negative"),
    ("/v1/classify", {"input": "hello"}, NOT_AN_EMBEDDING_MODEL),
    ("/v1/classify", {"input": []}, "Input cannot be empty"),
    ("/v1/rerank", {"query": "q", "documents": ["a", "b"]}, NOT_AN_EMBEDDING_MODEL),
    ("/v1/rerank", {"query": " ", "documents": ["a"]}, "Query cannot be empty or whitespace only"),
    ("/v1/rerank", {"query": "q", "documents": []}, "Documents cannot be empty"),
    (
        "/v1/rerank",
        {"query": "q", "documents": ["a", ""]},
        "Each document must be a non-empty string",
    ),
]


@pytest.mark.parametrize("path, body, message", OPENAI_CASES)
def test_openai_routes(server, path, body, message):
    r = server.post(path, json=body)
    assert r.status_code == 400
    assert r.json() == openai_error(message)


@pytest.mark.parametrize("path", ["/v1/embeddings", "/v1/classify", "/v1/rerank"])
def test_openai_routes_validate_the_body_first(server, path):
    r = server.post(path, json={"model": "x"})  # the required fields are missing
    assert r.status_code == 400
    assert r.json()["type"] == "Bad Request" and r.json()["code"] == 400
    r = server.post(path, data="{}", headers={"Content-Type": "text/plain"})
    assert r.status_code == 400
    assert "application/json" in r.json()["message"]


def test_server_keeps_serving(server):
    for path, body, _ in OPENAI_CASES:
        server.post(path, json=body)
    r = server.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 200 and len(r.json()["output_ids"]) == 2
