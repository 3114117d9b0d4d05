"""ReqState builds a request's client output: cumulative text, the output ids (new ones per
stream event, all of them otherwise) and meta_info in SGLang's key order."""

from __future__ import annotations

from mini_sglang.managers.io_struct.generate import GenerateReqInput
from mini_sglang.managers.io_struct.output import BatchStrOutput
from mini_sglang.managers.req_state import ReqState


def _output(text: str, ids: list[int], finished: bool, **logprobs) -> BatchStrOutput:
    return BatchStrOutput(
        rids=["r"],
        finished_reasons=[{"type": "length", "length": 3} if finished else None],
        output_strs=[text],
        output_ids=[ids],
        prompt_tokens=[4],
        completion_tokens=[len(ids)],
        cached_tokens=[1],
        **logprobs,
    )


def _state(**kwargs) -> ReqState:
    obj = GenerateReqInput(text="hi", rid="r", **kwargs)
    obj.normalize_batch_and_arguments()
    return ReqState(obj, created_time=0.0)


def test_stream_events_carry_new_ids_and_cumulative_text():
    state = _state(stream=True)
    state.add_output(_output("a", [1, 2], False), 0, "v1", None)
    assert state.event.is_set() and not state.finished
    first = state.take_output(with_text=True)
    assert first == {
        "text": "a",
        "output_ids": [1, 2],
        "meta_info": {
            "id": "r",
            "finish_reason": None,
            "prompt_tokens": 4,
            "weight_version": "v1",
            "completion_tokens": 2,
            "cached_tokens": 1,
        },
    }
    assert not state.event.is_set()
    meta = state.add_output(_output("b", [3], True), 0, "v1", None)
    assert state.finished and list(meta)[-1] == "e2e_latency"
    last = state.take_output(with_text=False)
    assert "text" not in last and last["output_ids"] == [3]


def test_non_stream_output_has_every_id():
    state = _state()
    state.add_output(_output("a", [1, 2], False), 0, None, None)
    state.add_output(_output("b", [3], True), 0, None, None)
    out = state.take_output(with_text=True)
    assert out["text"] == "ab" and out["output_ids"] == [1, 2, 3]


def test_logprobs_accumulate_as_triples():
    state = _state(return_logprob=True)
    lp = dict(output_token_logprobs_val=[[-0.5]], output_token_logprobs_idx=[[7]])
    state.add_output(_output("a", [7], False, **lp), 0, None, None)
    lp = dict(output_token_logprobs_val=[[-1.0]], output_token_logprobs_idx=[[8]])
    meta = state.add_output(_output("b", [8], True, **lp), 0, None, None)
    assert meta["output_token_logprobs"] == [[-0.5, 7, None], [-1.0, 8, None]]
    keys = list(meta)
    assert keys.index("output_token_logprobs") < keys.index("completion_tokens")
    assert "output_top_logprobs" not in meta  # only with top_logprobs_num
