"""SGLang's hosted-platform routes on the real server: /ping (SageMaker health, 200 empty),
/invocations (SageMaker: /v1/chat/completions under another path) and /vertex_generate
(Vertex AI: instances + parameters in, {"predictions": [...]} out, the same results as the
/generate batch they stand for; no instances is []; bad input is /generate's 400)."""

from __future__ import annotations

from tests.server.conftest import ServerHandle

GREEDY = {"temperature": 0, "max_new_tokens": 5}


def test_ping(server: ServerHandle):
    r = server.get("/ping")
    assert r.status_code == 200 and r.content == b""


def test_invocations_is_chat_completions(server: ServerHandle):
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "Hello there"}],
        "max_tokens": 5,
        "temperature": 0,
    }
    a = server.post("/invocations", json=body)
    b = server.post("/v1/chat/completions", json=body)
    assert a.status_code == 200 and b.status_code == 200, (a.text, b.text)
    assert a.json()["object"] == "chat.completion"
    assert a.json()["choices"] == b.json()["choices"]


def test_vertex_generate(server: ServerHandle):
    prompts = ["The weather today", "Hello world"]
    body = {"instances": [{"text": p} for p in prompts], "parameters": {"sampling_params": GREEDY}}
    r = server.post("/vertex_generate", json=body)
    assert r.status_code == 200, r.text
    predictions = r.json()["predictions"]
    batch = server.post("/generate", json={"text": prompts, "sampling_params": GREEDY}).json()
    assert [p["text"] for p in predictions] == [g["text"] for g in batch]
    assert [p["output_ids"] for p in predictions] == [g["output_ids"] for g in batch]
    ids = {"instances": [{"input_ids": [11, 22, 33]}], "parameters": {"sampling_params": GREEDY}}
    (one,) = server.post("/vertex_generate", json=ids).json()["predictions"]
    same = server.post("/generate", json={"input_ids": [11, 22, 33], "sampling_params": GREEDY})
    assert one["output_ids"] == same.json()["output_ids"]
    empty = server.post("/vertex_generate", json={"instances": []})
    assert empty.status_code == 200 and empty.json() == []
    for bad in ({"instances": "text"}, {"instances": [{"text": "a"}], "parameters": [1]}):
        r = server.post("/vertex_generate", json=bad)
        assert r.status_code == 400 and "must be" in r.json()["error"]["message"], r.text
    bad_params = {"instances": [{"text": "a"}], "parameters": {"sampling_params": {"top_p": 2}}}
    r = server.post("/vertex_generate", json=bad_params)
    assert r.status_code == 400, r.text
    assert server.wait_memory_all_free()["failures"] == 0
