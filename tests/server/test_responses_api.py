"""The OpenAI Responses API (/v1/responses) of the real server on the default model, through
the official `openai` client (streamed and not) and raw httpx (SGLang's status codes, error
bodies and SSE framing). The shared default-model server (conftest `default_model_server`);
generations are greedy and short."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from tests.server.conftest import ServerHandle

GREEDY = {"model": "default", "temperature": 0}


@pytest.fixture(scope="module")
def server(default_model_server: ServerHandle) -> ServerHandle:
    return default_model_server


@pytest.fixture(scope="module")
def client(server: ServerHandle) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120
    )


def _chat(client: openai.OpenAI, messages: list[dict], max_tokens: int):
    return client.chat.completions.create(messages=messages, max_tokens=max_tokens, **GREEDY)


def test_create_equals_chat_and_is_stored(server: ServerHandle, client: openai.OpenAI):
    resp = client.responses.create(input="Name a colour.", max_output_tokens=8, **GREEDY)
    chat = _chat(client, [{"role": "user", "content": "Name a colour."}], 8)
    assert resp.object == "response" and resp.status == "completed"
    assert resp.id.startswith("resp_")
    assert resp.output_text == chat.choices[0].message.content
    assert [item.type for item in resp.output] == ["message"]
    assert resp.output[0].id.startswith("msg_") and resp.output[0].role == "assistant"
    assert resp.text.format.type == "text" and resp.max_output_tokens == 8
    assert resp.usage.input_tokens == chat.usage.prompt_tokens
    assert resp.usage.output_tokens == chat.usage.completion_tokens == 8
    assert resp.usage.total_tokens == chat.usage.total_tokens
    assert resp.usage.input_tokens_details.cached_tokens >= 0
    assert resp.usage.output_tokens_details.reasoning_tokens == 0

    # GET answers the stored object, byte for byte what POST answered.
    raw = server.post(
        "/v1/responses", json={"input": "Name a colour.", "max_output_tokens": 8, **GREEDY}
    )
    assert raw.status_code == 200 and raw.headers["content-type"] == "application/json"
    body = raw.json()
    got = server.get(f"/v1/responses/{body['id']}")
    assert got.status_code == 200 and got.content == raw.content
    assert list(body)[:7] == [
        "id",
        "object",
        "created_at",
        "model",
        "output",
        "status",
        "usage",
    ]
    assert body["usage"] == {
        "input_tokens": chat.usage.prompt_tokens,
        "input_tokens_details": {
            "cached_tokens": body["usage"]["input_tokens_details"]["cached_tokens"]
        },
        "output_tokens": 8,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": chat.usage.prompt_tokens + 8,
    }
    # A finished response cannot be cancelled (SGLang's answer).
    cancel = server.post(f"/v1/responses/{body['id']}/cancel")
    assert cancel.status_code == 400
    assert cancel.json() == {
        "error": {
            "message": "Cannot cancel a synchronous response.",
            "type": "invalid_request_error",
            "param": None,
            "code": 400,
        }
    }
    # store=false keeps nothing.
    unstored = client.responses.create(input="Hi", max_output_tokens=2, store=False, **GREEDY)
    assert server.get(f"/v1/responses/{unstored.id}").status_code == 404


def test_stream_events(server: ServerHandle, client: openai.OpenAI):
    plain = client.responses.create(input="Name a colour.", max_output_tokens=8, **GREEDY)
    events = list(
        client.responses.create(input="Name a colour.", max_output_tokens=8, stream=True, **GREEDY)
    )
    types = [e.type for e in events]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert types == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * len(deltas),
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    final = events[-1].response
    assert final.status == "completed"
    assert "".join(deltas) == final.output_text == plain.output_text
    assert events[-2].item.id == final.output[0].id == events[2].item.id
    assert final.usage.output_tokens == plain.usage.output_tokens
    assert final.usage.input_tokens == plain.usage.input_tokens
    stored = server.get(f"/v1/responses/{final.id}").json()
    assert stored["status"] == "completed" and stored["output"][0]["id"] == final.output[0].id

    # SSE framing: `event: <type>` and one compact JSON line per event, no [DONE].
    body = {"input": "Name a colour.", "max_output_tokens": 8, "stream": True, **GREEDY}
    raw = server.post("/v1/responses", json=body)
    assert raw.headers["content-type"].startswith("text/event-stream")
    chunks = raw.content.split(b"\n\n")
    assert chunks[-1] == b""
    for chunk in chunks[:-1]:
        head, data = chunk.split(b"\n")
        payload = json.loads(data.removeprefix(b"data: "))
        assert head == b"event: " + payload["type"].encode()
        assert list(payload) == sorted(payload)


def test_previous_response_id_continues_the_conversation(client: openai.OpenAI):
    first = client.responses.create(input="My name is Ada.", max_output_tokens=6, **GREEDY)
    second = client.responses.create(
        input="What is my name?",
        previous_response_id=first.id,
        max_output_tokens=6,
        **GREEDY,
    )
    alone = client.responses.create(input="What is my name?", max_output_tokens=6, **GREEDY)
    assert second.previous_response_id == first.id
    conversation = [
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"},
    ]
    chat = _chat(client, conversation, 6)
    assert second.usage.input_tokens == chat.usage.prompt_tokens > alone.usage.input_tokens
    assert second.output_text == chat.choices[0].message.content
    # instructions become the system message
    told = client.responses.create(
        input="Hi", instructions="You are terse.", max_output_tokens=4, **GREEDY
    )
    system_chat = _chat(
        client,
        [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi"}],
        4,
    )
    assert told.output_text == system_chat.choices[0].message.content
    assert told.usage.input_tokens == system_chat.usage.prompt_tokens


def test_errors(server: ServerHandle, client: openai.OpenAI):
    mark = len(server.log())
    r = server.post("/v1/responses", json={"input": "Hi", "previous_response_id": "unknown"})
    assert r.status_code == 400
    assert r.content == (
        b'{"error":{"message":"Invalid \'response_id\': \'unknown\'. Expected an ID that '
        b'begins with \'resp\'.","type":"invalid_request_error","param":"response_id",'
        b'"code":400}}'
    )
    r = server.post("/v1/responses", json={"input": "Hi", "previous_response_id": "resp_gone"})
    assert r.status_code == 404
    assert r.json() == {
        "error": {
            "message": "Response with id 'resp_gone' not found.",
            "type": "invalid_request_error",
            "param": "response_id",
            "code": 404,
        }
    }
    for path in ("/v1/responses/resp_gone", "/v1/responses/resp_gone/cancel"):
        r = server.get(path) if not path.endswith("cancel") else server.post(path)
        assert r.status_code == 404 and r.json()["error"]["param"] == "response_id"
    assert server.get("/v1/responses/nope").status_code == 400
    # A body that fails validation: the nested envelope, type "Bad Request".
    r = server.post("/v1/responses", json={"model": "default"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "Bad Request" and error["code"] == 400 and error["param"] is None
    assert "input" in error["message"]
    r = server.post("/v1/responses", data=b"{}", headers={"content-type": "text/plain"})
    assert r.status_code == 400
    assert "Unsupported Media Type" in r.json()["error"]["message"]
    # An input item this server cannot render is a 400 before anything runs.
    r = server.post("/v1/responses", json={"input": [{"type": "function_call_output"}]})
    assert r.status_code == 400
    assert r.json()["error"] == {
        "message": "Input items of type 'function_call_output' are not supported.",
        "type": "invalid_request_error",
        "param": None,
        "code": 400,
    }
    # Refused by the TokenizerManager before it runs: a 400, and nothing stored.
    body = {"input": "Hi", "max_output_tokens": 100_000, "request_id": "resp_too_long"}
    r = server.post("/v1/responses", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"].startswith("Requested token count exceeds")
    assert server.get("/v1/responses/resp_too_long").status_code == 404
    with pytest.raises(openai.BadRequestError) as exc:
        client.responses.create(input="Hi", previous_response_id="unknown", **GREEDY)
    assert exc.value.body["message"].startswith("Invalid 'response_id': 'unknown'.")
    log = server.log()[mark:]
    assert '"POST /v1/responses HTTP/1.1" 400' in log, log[-3000:]
    assert '"POST /v1/responses HTTP/1.1" 404' in log, log[-3000:]
    assert "Error in preprocessing prompt inputs" in log, log[-3000:]


def test_background_and_cancel(server: ServerHandle):
    body = {"input": "Name a colour.", "max_output_tokens": 4, "background": True, **GREEDY}
    r = server.post("/v1/responses", json=body)
    assert r.status_code == 200 and r.json()["status"] == "queued"
    rid = r.json()["id"]
    deadline = time.time() + 60
    while (got := server.get(f"/v1/responses/{rid}").json())["status"] != "completed":
        assert got["status"] in ("queued", "in_progress") and time.time() < deadline, got
        time.sleep(0.1)
    assert got["usage"]["output_tokens"] == 4 and got["output"][0]["type"] == "message"

    # Cancelling an in-flight stream aborts its generation.
    body = {"input": "Tell me a long story.", "max_output_tokens": 400, "stream": True, **GREEDY}
    with httpx.stream("POST", f"{server.base_url}/v1/responses", json=body, timeout=120) as s:
        lines = s.iter_lines()
        rid = None
        for line in lines:
            if line.startswith("data: ") and rid is None:
                rid = json.loads(line[6:])["response"]["id"]
            if line == "event: response.output_text.delta":
                break
        cancel = server.post(f"/v1/responses/{rid}/cancel")
        assert cancel.status_code == 200 and cancel.json()["status"] == "cancelled"
        rest = [json.loads(ln[6:]) for ln in lines if ln.startswith("data: ")]
    final = rest[-1]
    assert final["type"] == "response.completed"
    assert final["response"]["status"] == "cancelled"
    assert 0 < final["response"]["usage"]["output_tokens"] < 400
    assert server.get(f"/v1/responses/{rid}").json()["status"] == "cancelled"
    server.wait_memory_all_free()
