"""README's quick start: the server on the embedded default model, no flags. Its chat
requests that set no sampling params get the model card's (temperature 0.2, top_p 0.9, from
the converted generation_config.json via --sampling-defaults model) all the way into the
request the scheduler samples with."""

from __future__ import annotations

import re

import pytest

from tests.server.conftest import ServerHandle


@pytest.fixture(scope="module")
def default_server(default_model_server: ServerHandle) -> ServerHandle:
    """The shared default-model server; it logs each request's inputs (--log-requests)."""
    return default_model_server


def test_chat_without_sampling_params_uses_the_card_defaults(default_server: ServerHandle):
    r = default_server.post(
        "/v1/chat/completions",
        json={
            "model": "default",
            "messages": [{"role": "user", "content": "Hi!"}],
            "max_tokens": 4,
        },
    )
    assert r.status_code == 200, r.text
    log = default_server.log()
    assert (
        "Using default chat sampling params from model generation config: "
        "{'temperature': 0.2, 'top_p': 0.9}" in log
    ), log[-3000:]
    received = [ln for ln in default_server.log().splitlines() if "Receive: obj=" in ln]
    assert received, default_server.log_tail()
    params = re.search(r"sampling_params=(\{[^}]*\})", received[-1])
    assert params, received[-1]
    assert "'temperature': 0.2" in params.group(1) and "'top_p': 0.9" in params.group(1)
