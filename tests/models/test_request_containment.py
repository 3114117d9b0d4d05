"""A fault while the scheduler admits or prepares one request ends that request with an
error (an abort reason with status 500); the requests batched with it and the scheduler go
on as if it had not been sent."""

from __future__ import annotations

import pytest

from mini_sglang.managers.io_struct.generate import TokenizedGenerateReqInput
from mini_sglang.sampling import sampling_batch_info
from mini_sglang.sampling.sampling_params import SamplingParams
from tests.conftest import assert_memory_all_free, collect_outputs, make_req, make_scheduler

PROMPTS = [[11, 12, 13], [14, 15, 16, 17], [18, 19]]
MAX_NEW = 6


@pytest.fixture(scope="module")
def scheduler(tiny_llama_path: str):
    return make_scheduler(tiny_llama_path)


def _run(sched, reqs: list) -> dict:
    start = len(sched.test_outputs)
    for req in reqs:
        sched.add_request(req)
    sched.run_until_idle()
    return collect_outputs(sched.test_outputs[start:])


def _reference(sched) -> list[list[int]]:
    reqs = [make_req(f"ref{i}", p, MAX_NEW, ignore_eos=True) for i, p in enumerate(PROMPTS)]
    out = _run(sched, reqs)
    return [out[f"ref{i}"].output_ids for i in range(len(PROMPTS))]


def test_failure_preparing_one_request_of_a_batch(scheduler, monkeypatch):
    expected = _reference(scheduler)
    # The test hook: building the sampling tensors of a batch holding "bad" raises.
    monkeypatch.setattr(sampling_batch_info, "_FAIL_PREPARE_RID", "bad")
    rids = ["ok0", "bad", "ok2"]  # added together: one prefill batch of three
    out = _run(scheduler, [make_req(r, p, MAX_NEW, True) for r, p in zip(rids, PROMPTS)])
    assert out["ok0"].output_ids == expected[0] and out["ok2"].output_ids == expected[2]
    assert out["ok0"].finish_reason == {"type": "length", "length": MAX_NEW}
    assert out["bad"].finish_reason == {
        "type": "abort",
        "message": "Internal server error: test hook: preparing request bad fails",
        "status_code": 500,
        "err_type": "InternalServerError",
    }
    assert_memory_all_free(scheduler)
    monkeypatch.setattr(sampling_batch_info, "_FAIL_PREPARE_RID", None)
    assert _reference(scheduler) == expected  # the scheduler serves on, unchanged


def test_failure_admitting_one_request(scheduler):
    expected = _reference(scheduler)
    # A malformed message (no input ids) fails while its Req is built.
    sp = SamplingParams(max_new_tokens=MAX_NEW)
    sp.normalize(None)
    broken = TokenizedGenerateReqInput(
        rid="broken", input_text="", input_ids=None, sampling_params=sp
    )  # type: ignore[arg-type]
    reqs = [make_req("ok0", PROMPTS[0], MAX_NEW, True), broken]
    out = _run(scheduler, [*reqs, make_req("ok2", PROMPTS[2], MAX_NEW, True)])
    assert out["broken"].finish_reason["status_code"] == 500
    assert out["broken"].finish_reason["message"].startswith("Internal server error: ")
    assert out["ok0"].output_ids == expected[0] and out["ok2"].output_ids == expected[2]
    assert_memory_all_free(scheduler)


def test_failure_filling_one_requests_grammar_mask(scheduler, monkeypatch):
    pytest.importorskip("xgrammar")
    from mini_sglang.constrained import xgrammar_backend

    expected = _reference(scheduler)

    def broken_fill(self, vocab_mask, row):
        raise RuntimeError("grammar state lost")

    monkeypatch.setattr(xgrammar_backend.XGrammarGrammar, "fill_vocab_mask", broken_fill)
    constrained = make_req("regex", PROMPTS[1], MAX_NEW, True)
    constrained.sampling_params.regex = "(yes|no)+"
    reqs = [make_req("ok0", PROMPTS[0], MAX_NEW, True), constrained]
    out = _run(scheduler, [*reqs, make_req("ok2", PROMPTS[2], MAX_NEW, True)])
    assert out["regex"].finish_reason["status_code"] == 500
    assert out["regex"].finish_reason["message"] == "Internal server error: grammar state lost"
    assert out["ok0"].output_ids == expected[0] and out["ok2"].output_ids == expected[2]
    assert_memory_all_free(scheduler)
