"""Sessions on the real server (SGLang 0.5.4's /open_session, /close_session and
session_params): a request continuing another one in its session generates exactly what a
plain request with the built prompt generates (that prompt's context served from the
radix cache), offset / drop_previous_output / replace shape that prompt as documented in
managers/session_controller.py, and every misuse is a 400 that says what is wrong."""

from __future__ import annotations

import re

from tests.server.conftest import ServerHandle

GREEDY = {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}
P1, P2 = [21, 22, 23, 24, 25, 26], [31, 32, 33]


def gen(server: ServerHandle, ids: list[int], req_id: str | None = None, **session) -> dict:
    """/generate of ids (as request req_id), in a session when session_params are given."""
    body: dict = {"input_ids": ids, "sampling_params": GREEDY}
    if req_id is not None:
        body["rid"] = req_id
    if session:
        body["session_params"] = session
    r = server.post("/generate", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def error(server: ServerHandle, path: str, body: dict) -> str:
    r = server.post(path, json=body)
    assert r.status_code == 400, r.text
    data = r.json()
    return data["error"]["message"] if "error" in data else data["message"]


def test_session_requests_continue_their_parent(server: ServerHandle):
    sid = server.post("/open_session", json={"capacity_of_str_len": 1000}).json()
    assert re.fullmatch(r"[0-9a-f]{32}", sid), sid
    taken = {"capacity_of_str_len": 10, "session_id": sid}
    assert error(server, "/open_session", taken).startswith("Failed to open the session.")
    out1 = gen(server, P1, f"{sid}-r1", id=sid)["output_ids"]
    # rid's prompt + its output + the new ids, as one plain request would give them
    cont = gen(server, P2, f"{sid}-r2", id=sid, rid=f"{sid}-r1")
    plain = gen(server, P1 + out1 + P2)
    assert cont["output_ids"] == plain["output_ids"]
    assert cont["meta_info"]["prompt_tokens"] == len(P1) + len(out1) + len(P2)
    assert cont["meta_info"]["cached_tokens"] >= len(P1)  # r1's KV, from the radix cache
    dropped = gen(server, P2, id=sid, rid=f"{sid}-r1", drop_previous_output=True)
    assert dropped["output_ids"] == gen(server, P1 + P2)["output_ids"]
    cut = gen(server, P2, id=sid, rid=f"{sid}-r1", offset=2)
    assert cut["output_ids"] == gen(server, P1[:2] + P2)["output_ids"]
    # validated as SGLang's pydantic does: a numeric string is an int
    assert gen(server, P2, id=sid, rid=f"{sid}-r1", offset="2")["output_ids"] == cut["output_ids"]
    # replace: r3 takes the place of r1's continuations, so r2 is no longer in the session
    gen(server, P2, f"{sid}-r3", id=sid, rid=f"{sid}-r1", replace=True)
    gone = error(
        server, "/generate", {"input_ids": P2, "session_params": {"id": sid, "rid": f"{sid}-r2"}}
    )
    assert gone == f"Request {sid}-r2 is not in session {sid}."
    assert server.post("/close_session", json={"session_id": sid}).status_code == 200
    closed = error(server, "/generate", {"input_ids": P2, "session_params": {"id": sid}})
    assert closed == f"Invalid request: session id {sid} does not exist"
    assert server.wait_memory_all_free()["failures"] == 0


def test_session_misuse_is_a_400(server: ServerHandle):
    assert error(server, "/open_session", {}) == "body.capacity_of_str_len: Field required"
    assert error(server, "/close_session", {}) == "body.session_id: Field required"
    bad = {"input_ids": P1, "session_params": {"id": 5}}
    assert (
        error(server, "/generate", bad) == "body.session_params.id: Input should be a valid string"
    )
    bad = {"input_ids": P1, "session_params": {"id": "x", "turn": 1}}
    assert error(server, "/generate", bad) == "session_params: unknown field 'turn'."
    named = server.post("/open_session", json={"capacity_of_str_len": 5, "session_id": "mine"})
    assert named.status_code == 200 and named.json() == "mine"
    missing = {"input_ids": P1, "session_params": {"id": "mine", "rid": "nope"}}
    assert error(server, "/generate", missing) == "Request nope is not in session mine."
    assert server.post("/close_session", json={"session_id": "mine"}).status_code == 200


def test_session_logprob_start_len_counts_the_built_prompt(server: ServerHandle):
    """SGLang checks logprob_start_len against the prompt the session builds (history plus
    the new ids), not the new ids alone: 7 fits P1 + output + P2 (13 tokens) though P2 has
    3; past the built prompt it is SGLang's scheduler 400."""
    sid = server.post("/open_session", json={"capacity_of_str_len": 1000}).json()
    out1 = gen(server, P1, f"{sid}-r1", id=sid)["output_ids"]
    built = P1 + out1 + P2
    body = {
        "input_ids": P2,
        "sampling_params": GREEDY,
        "return_logprob": True,
        "logprob_start_len": 7,
        "session_params": {"id": sid, "rid": f"{sid}-r1"},
    }
    r = server.post("/generate", json=body)
    assert r.status_code == 200, r.text
    logprobs = r.json()["meta_info"]["input_token_logprobs"]
    assert [t for _, t, _ in logprobs] == built[7:]
    too_far = {**body, "logprob_start_len": len(built)}
    assert error(server, "/generate", too_far) == (
        f"req.logprob_start_len={len(built)} is higher than the number of input tokens "
        f"len(req.origin_input_ids)={len(built)}. Please use a smaller logprob_start_len."
    )
    assert server.post("/close_session", json={"session_id": sid}).status_code == 200
    assert server.wait_memory_all_free()["failures"] == 0
