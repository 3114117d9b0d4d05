"""SGLang's extras that ask for features this server lacks, on the OpenAI routes: the same
400s as /generate (SGLang 0.5.4 passes them to the TokenizerManager, which refuses them),
in OpenAI's error envelope (a stream's error event), never silently ignored."""

from __future__ import annotations

import json

import pytest

from tests.server.conftest import ServerHandle, parse_sse

HIDDEN = (
    "The server is not configured to return the hidden states. "
    "Please set `--enable-return-hidden-states` to enable this feature."
)
LOGIT_PROCESSOR = (
    "The server is not configured to enable custom logit processor. "
    "Please set `--enable-custom-logit-processor` to enable this feature."
)
DONE = b"\n\ndata: [DONE]\n\n"
BODIES = {
    "/v1/completions": {"model": "m", "prompt": "hi", "max_tokens": 2},
    "/v1/chat/completions": {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
    },
}


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize(
    "field, message",
    [({"return_hidden_states": True}, HIDDEN), ({"custom_logit_processor": "{}"}, LOGIT_PROCESSOR)],
)
@pytest.mark.parametrize("stream", [False, True])
def test_unsupported_extras_are_400s(server: ServerHandle, path, field, message, stream):
    """Non-stream: HTTP 400. Stream: the error event SGLang sends once the stream has begun
    (HTTP 200), then [DONE] (parse_sse checks the framing)."""
    r = server.post(path, json={**BODIES[path], **field, "stream": stream})
    error = {
        "object": "error",
        "message": message,
        "type": "BadRequestError",
        "param": None,
        "code": 400,
    }
    if stream:
        # SGLang's bytes: json.dumps with its default ", " / ": " separators
        assert r.status_code == 200 and parse_sse(r.content) == [{"error": error}]
        assert r.content == b"data: " + json.dumps({"error": error}).encode() + DONE
    else:
        assert r.status_code == 400 and r.json() == error, r.text
    assert server.post(path, json=BODIES[path]).status_code == 200
