"""GenerateReqInput normalisation, FINISH_* wire dicts, and picklability of messages."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
import re

import orjson
import pytest

from mini_sglang.managers.finish_reason import (
    FINISH_ABORT,
    FINISH_LENGTH,
    FINISH_MATCHED_STR,
    FINISH_MATCHED_TOKEN,
    FINISHED_MATCHED_REGEX,
)
from mini_sglang.managers.io_struct import control, generate, output, weights
from mini_sglang.managers.io_struct.control import (
    AbortReq,
    FlushCacheReqOutput,
    GetInternalStateReqOutput,
)
from mini_sglang.managers.io_struct.generate import GenerateReqInput, TokenizedGenerateReqInput
from mini_sglang.managers.io_struct.output import BatchStrOutput, BatchTokenIDOutput
from mini_sglang.sampling.sampling_params import SamplingParams

HEX32 = re.compile(r"^[0-9a-f]{32}$")


def normalized(**kwargs) -> GenerateReqInput:
    req = GenerateReqInput(**kwargs)
    req.normalize_batch_and_arguments()
    return req


# ---------------------------------------------------------------- finish reasons
def test_finish_reason_json_shapes():
    # Shapes from SGLANG_INTERFACE.md §4c (meta_info.finish_reason), key order included.
    assert orjson.dumps(FINISH_LENGTH(16).to_json()) == b'{"type":"length","length":16}'
    assert orjson.dumps(FINISH_MATCHED_TOKEN(151645).to_json()) == (
        b'{"type":"stop","matched":151645}'
    )
    assert (
        orjson.dumps(FINISH_MATCHED_STR("\n\n").to_json()) == b'{"type":"stop","matched":"\\n\\n"}'
    )
    assert FINISHED_MATCHED_REGEX(r"\d+").to_json() == {"type": "stop", "matched": r"\d+"}
    assert orjson.dumps(FINISH_ABORT("Abort before prefill").to_json()) == (
        b'{"type":"abort","message":"Abort before prefill","status_code":null,"err_type":null}'
    )
    assert FINISH_ABORT().to_json()["message"] == "Aborted"
    assert FINISH_ABORT("bad", 400, "BadRequestError").to_json() == {
        "type": "abort",
        "message": "bad",
        "status_code": 400,
        "err_type": "BadRequestError",
    }


def test_finish_reason_flags_equality_and_pickle():
    assert FINISH_ABORT().is_error and not FINISH_LENGTH(1).is_error
    assert not FINISH_MATCHED_TOKEN(2).is_error and not FINISH_MATCHED_STR("x").is_error
    for reason in (
        FINISH_LENGTH(3),
        FINISH_MATCHED_TOKEN(5),
        FINISH_MATCHED_STR("s"),
        FINISH_ABORT(),
    ):
        assert pickle.loads(pickle.dumps(reason)) == reason
    assert FINISH_MATCHED_TOKEN(5) != FINISH_MATCHED_TOKEN(6)
    assert FINISH_MATCHED_STR("5") != FINISH_MATCHED_TOKEN(5)


# ---------------------------------------------------------------- GenerateReqInput
def test_single_text_defaults():
    req = normalized(text="Hello")
    assert req.is_single and req.batch_size == 1 and len(req) == 1
    assert HEX32.match(req.rid)
    assert req.sampling_params == {}
    assert (req.return_logprob, req.logprob_start_len, req.top_logprobs_num) == (False, -1, 0)
    assert req.token_ids_logprob is None and req.stream is False
    assert req[0] is req


def test_single_input_ids_and_given_rid_kept():
    req = normalized(input_ids=[1, 2, 3], rid="my-id", token_ids_logprob=[])
    assert req.is_single and req.rid == "my-id" and req.input_ids == [1, 2, 3]
    assert req.token_ids_logprob is None  # [] means none


@pytest.mark.parametrize("kwargs", [{}, {"text": "a", "input_ids": [1], "input_embeds": [[0.1]]}])
def test_none_or_all_three_inputs_rejected(kwargs):
    with pytest.raises(
        ValueError, match=r"^Either text, input_ids or input_embeds should be provided\.$"
    ):
        normalized(**kwargs)


def test_text_beside_input_ids_or_embeds_is_sglangs():
    """SGLang takes text with input_ids (the ids are the prompt, the text stays as its input
    text) and drops input_embeds given beside text or input_ids."""
    req = normalized(text="a", input_ids=[1, 2])
    assert req.is_single and req.text == "a" and req.input_ids == [1, 2]
    req = normalized(text="a", input_embeds=[[0.1]])
    assert req.input_embeds is None and req.text == "a"
    req = normalized(input_ids=[[1], [2, 3]], input_embeds=[[0.1]])
    assert req.input_embeds is None and req.batch_size == 2


@pytest.mark.parametrize("input_ids", [[], [[1], []]])
def test_empty_input_ids_rejected(input_ids):
    with pytest.raises(ValueError, match="input_ids cannot be empty"):
        normalized(input_ids=input_ids)


def test_batch_of_texts_broadcasts_fields_and_unique_rids():
    req = normalized(
        text=["a", "b", "c"],
        sampling_params={"max_new_tokens": 4},
        return_logprob=True,
        top_logprobs_num=[1, 2, 3],
        token_ids_logprob=[5, 6],
    )
    assert not req.is_single and req.batch_size == 3 and len(req) == 3
    assert len(set(req.rid)) == 3 and all(HEX32.match(r) for r in req.rid)
    subs = [req[i] for i in range(3)]
    assert [s.text for s in subs] == ["a", "b", "c"]
    assert all(s.is_single for s in subs)
    assert [s.top_logprobs_num for s in subs] == [1, 2, 3]
    assert all(s.return_logprob is True and s.logprob_start_len == -1 for s in subs)
    assert all(s.sampling_params == {"max_new_tokens": 4} for s in subs)
    assert all(s.token_ids_logprob == [5, 6] for s in subs)
    # Broadcast values are copies: editing one sub-request's params leaves the others alone.
    subs[0].sampling_params["max_new_tokens"] = 99
    assert subs[1].sampling_params == {"max_new_tokens": 4}
    assert [s.rid for s in subs] == req.rid


def test_batch_input_ids_and_str_rid_suffixes():
    req = normalized(input_ids=[[1, 2], [3]], rid="x")
    assert req.rid == ["x_0", "x_1"]
    assert req[1].input_ids == [3] and req[-1].input_ids == [3]
    with pytest.raises(IndexError):
        req[2]


def test_batch_rid_list_must_match_batch_size():
    assert normalized(text=["a", "b"], rid=["r1", "r2"]).rid == ["r1", "r2"]
    with pytest.raises(ValueError, match="rids length mismatch"):
        normalized(text=["a", "b"], rid=["r1"])


def test_parent_rids_name_the_client_rid_of_each_sub_request():
    # /abort_request with the client's rid aborts exactly these sub-requests.
    assert normalized(text="a", rid="r").parent_rids == [None]
    assert normalized(text=["a", "b"], rid="x").parent_rids == ["x", "x"]
    assert normalized(text=["a", "b"], rid=["r1", "r2"]).parent_rids == [None, None]
    req = normalized(text=["a", "b"], rid=["r1", "r2"], sampling_params={"n": 2})
    assert req.rid == ["r1_0", "r1_1", "r2_0", "r2_1"]
    assert req.parent_rids == ["r1", "r1", "r2", "r2"]
    assert normalized(text=["a"]).parent_rids == [None]


@pytest.mark.parametrize("rid", ["", ["a", ""]])
def test_empty_rid_refused(rid):
    text = "a" if isinstance(rid, str) else ["a", "b"]
    with pytest.raises(ValueError, match="The rid should be a non-empty string."):
        normalized(text=text, rid=rid)
    with pytest.raises(ValueError, match="The rid should be a non-empty string."):
        normalized(text=["a", "b"], rid="")


def test_per_request_list_length_checked():
    with pytest.raises(ValueError, match=r"return_logprob \(1\).*batch size \(2\)"):
        normalized(text=["a", "b"], return_logprob=[True])


def test_n_expands_single_prompt_into_batch():
    req = normalized(text="p", sampling_params={"n": 3, "temperature": 0.5})
    assert not req.is_single and req.batch_size == 1 and req.parallel_sample_num == 3
    assert len(req) == 3 and req.text == ["p", "p", "p"]
    assert len(set(req.rid)) == 3
    assert all(req[i].sampling_params == {"n": 3, "temperature": 0.5} for i in range(3))


def test_n_expands_batch_prompt_major():
    req = normalized(
        text=["a", "b"],
        sampling_params=[{"n": 2, "max_new_tokens": 1}, {"n": 2, "max_new_tokens": 2}],
        rid=["ra", "rb"],
        top_logprobs_num=[1, 2],
    )
    assert len(req) == 4
    subs = [req[i] for i in range(4)]
    assert [s.text for s in subs] == ["a", "a", "b", "b"]
    assert [s.sampling_params["max_new_tokens"] for s in subs] == [1, 1, 2, 2]
    assert [s.top_logprobs_num for s in subs] == [1, 1, 2, 2]
    assert [s.rid for s in subs] == ["ra_0", "ra_1", "rb_0", "rb_1"]


def test_n_must_agree_across_sampling_params():
    with pytest.raises(ValueError, match="parallel_sample_num should be the same"):
        normalized(text=["a", "b"], sampling_params=[{"n": 2}, {"n": 1}])
    with pytest.raises(ValueError, match="n must be at least 1"):
        normalized(text="a", sampling_params={"n": 0})


def test_custom_logit_processor_per_prompt_and_with_n():
    """One processor string is shared by every sub-request; a list gives one per prompt,
    which SGLang refuses together with n > 1."""
    req = normalized(text=["a", "b"], custom_logit_processor=["P", None])
    assert [req[i].custom_logit_processor for i in range(2)] == ["P", None]
    req = normalized(text="a", sampling_params={"n": 2}, custom_logit_processor="P")
    assert [req[i].custom_logit_processor for i in range(2)] == ["P", "P"]
    with pytest.raises(ValueError, match="^Cannot use list custom_logit_processor with para"):
        normalized(text=["a"], sampling_params={"n": 2}, custom_logit_processor=["P"])


def test_from_json_dict_ignores_unknown_keys():
    req = GenerateReqInput.from_json_dict(
        {
            "text": "hi",
            "stream": True,
            "model": "x",
            "is_single": False,
            "unknown": [1],
            "http_worker_ipc": "ipc://elsewhere",
        }
    )
    assert req.http_worker_ipc is None
    req.normalize_batch_and_arguments()
    assert req.text == "hi" and req.stream is True and req.is_single
    with pytest.raises(ValueError):
        GenerateReqInput.from_json_dict(["hi"])  # type: ignore[arg-type]


def test_regenerate_rid():
    req = normalized(text=["a", "b"])
    old = list(req.rid)
    new = req.regenerate_rid()
    assert len(new) == 2 and not set(new) & set(old)


# ---------------------------------------------------------------- picklability
def _message_classes():
    classes = []
    for module in (generate, output, control, weights):
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if dataclasses.is_dataclass(cls) and cls.__module__ == module.__name__:
                classes.append(cls)
    return classes


def _dummy(cls):
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.init and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            kwargs[f.name] = SamplingParams() if f.name == "sampling_params" else [1]
    return cls(**kwargs)


@pytest.mark.parametrize("cls", _message_classes(), ids=lambda c: c.__name__)
def test_every_message_pickles(cls):
    obj = _dummy(cls)
    assert pickle.loads(pickle.dumps(obj)) == obj


def test_specific_messages():
    assert AbortReq().rid == "" and AbortReq(rid="abc", abort_all=False).rid == "abc"
    assert FlushCacheReqOutput(success=True).success
    assert GetInternalStateReqOutput(internal_state={"a": 1}).internal_state == {"a": 1}
    t = TokenizedGenerateReqInput(
        rid="r", input_text="hi", input_ids=[1], sampling_params=SamplingParams(max_new_tokens=3)
    )
    assert pickle.loads(pickle.dumps(t)).sampling_params.max_new_tokens == 3
    b = BatchTokenIDOutput(
        rids=["r"],
        finished_reasons=[FINISH_LENGTH(1).to_json()],
        decoded_texts=[""],
        decode_ids=[[1]],
        read_offsets=[0],
        output_ids=[[1]],
        skip_special_tokens=[True],
        spaces_between_special_tokens=[True],
        no_stop_trim=[False],
        prompt_tokens=[1],
        completion_tokens=[1],
        cached_tokens=[0],
    )
    assert pickle.loads(pickle.dumps(b)) == b
    assert {f.name for f in dataclasses.fields(BatchStrOutput)} >= set(output.PASSTHROUGH_FIELDS)
