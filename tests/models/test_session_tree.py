"""The scheduler's session tree (managers/session_controller.py) on CPU: replace without a
rid drops the whole tree, aborting a continuation still running; a continuation of a
running request is refused; a BOS at the start of an appended prompt is dropped; KV and
request slots all come back."""

from __future__ import annotations

from mini_sglang.managers.io_struct.control import OpenSessionReqInput
from tests.conftest import assert_memory_all_free, collect_outputs, make_req, make_scheduler


def test_replace_without_rid_drops_the_tree_and_aborts_what_runs(tiny_llama_path):
    sched = make_scheduler(tiny_llama_path)
    assert sched.sessions.open_session(
        OpenSessionReqInput(capacity_of_str_len=10, session_id="s")
    ).success
    assert not sched.sessions.open_session(OpenSessionReqInput(10, session_id="s")).success  # taken
    sched.add_request(make_req("a", [5, 6, 7], 4, True, session_params={"id": "s"}))
    sched.run_until_idle()
    long = make_req("b", [8, 9], 50, True, session_params={"id": "s", "rid": "a"})
    sched.add_request(long)
    for _ in range(3):
        sched.run_step()
    # b is still running: continuing it is refused, replacing the tree aborts it
    early = make_req("x", [1], 2, True, session_params={"id": "s", "rid": "b"})
    sched.add_request(early)
    sched.add_request(make_req("c", [10, 11], 3, True, session_params={"id": "s", "replace": True}))
    sched.run_until_idle()
    out = collect_outputs(sched.test_outputs)
    a_ids = out["a"].output_ids
    assert len(a_ids) == 4 and len(out["c"].output_ids) == 3
    assert out["b"].finish_reason["type"] == "abort", out["b"]
    assert out["b"].finish_reason["message"] == "Replaced in its session"
    assert out["x"].finish_reason["message"] == "Request b has not finished yet."
    assert list(sched.sessions["s"].nodes) == ["c"]
    assert_memory_all_free(sched)


def test_appended_prompt_drops_a_leading_bos(tiny_llama_path):
    sched = make_scheduler(tiny_llama_path)
    sched.sessions.open_session(OpenSessionReqInput(capacity_of_str_len=10, session_id="s"))
    sched.model_config.hf_config.bos_token_id = 1
    sched.add_request(make_req("a", [1, 5, 6], 2, True, session_params={"id": "s"}))
    sched.run_until_idle()
    sched.add_request(make_req("b", [1, 7], 2, True, session_params={"id": "s", "rid": "a"}))
    sched.run_until_idle()
    a, b = (sched.sessions["s"].nodes[r].req for r in "ab")
    assert b.origin_input_ids == [1, 5, 6, *a.output_ids, 7]  # a's own BOS stays
