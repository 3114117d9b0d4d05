"""Custom logit processors: the to_str/from_str wire format (SGLang's, including strings made
by SGLang's own class), and the per-batch bookkeeping that runs them in the sampler."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

from mini_sglang.layers.sampler import Sampler
from mini_sglang.managers.req import Req
from mini_sglang.sampling.custom_logit_batch import CustomLogitBatch
from mini_sglang.sampling.custom_logit_processor import (
    CustomLogitProcessor,
    DisallowedTokensLogitsProcessor,
    _cache_from_str,
)
from mini_sglang.sampling.sampling_batch_info import SamplingBatchInfo
from mini_sglang.sampling.sampling_params import SamplingParams

V = 8


class ForceToken(CustomLogitProcessor):
    """Forces custom_params["token_id"] on every row."""

    def __call__(self, logits, custom_param_list=None):
        for i, params in enumerate(custom_param_list):
            logits[i, :] = -float("inf")
            logits[i, params["token_id"]] = 0.0
        return logits


class Raises(CustomLogitProcessor):
    def __call__(self, logits, custom_param_list=None):
        raise RuntimeError("boom")


def by_value_processor(tag: str = "") -> type[CustomLogitProcessor]:
    """A class dill cannot find by name (defined in a function), so it is pickled by value
    as a client's `__main__` class is; `tag` makes its string distinct."""

    class CountOutputs(CustomLogitProcessor):
        TAG = tag

        def __call__(self, logits, custom_param_list=None):
            for i, params in enumerate(custom_param_list):
                logits[i, :] = -float("inf")
                logits[i, len(params["__req__"].output_ids) % logits.shape[1]] = 0.0
            return logits

    return CountOutputs


def make_req(rid: str, processor: str | None = None, params: dict | None = None) -> Req:
    sp = SamplingParams(max_new_tokens=4, temperature=0.0, custom_params=params)
    sp.normalize(None)
    return Req(rid, "", [1, 2, 3], sp, vocab_size=V, custom_logit_processor=processor)


def test_round_trip_by_reference_and_by_value():
    s = ForceToken.to_str()
    assert set(json.loads(s)) == {"callable"}
    assert type(CustomLogitProcessor.from_str(s)) is ForceToken
    cls = by_value_processor()
    loaded = CustomLogitProcessor.from_str(cls.to_str())
    assert type(loaded).__name__ == "CountOutputs" and isinstance(loaded, CustomLogitProcessor)
    req = make_req("a", params={})
    req.output_ids = [5, 5]
    out = loaded(torch.zeros(1, V), [{"__req__": req}])
    assert out.argmax(-1).tolist() == [2]


def test_from_str_deserialises_once_per_string():
    s = by_value_processor("once").to_str()
    before = _cache_from_str.cache_info()
    first, second = CustomLogitProcessor.from_str(s), CustomLogitProcessor.from_str(s)
    after = _cache_from_str.cache_info()
    assert type(first) is type(second) and first is not second
    assert (after.misses - before.misses, after.hits - before.hits) == (1, 1)


@pytest.mark.parametrize("bad", ["{}", '{"callable": "zz"}', "[1]", "not json"])
def test_bad_strings_raise(bad):
    with pytest.raises(Exception):  # noqa: B017 - whatever decoding raises
        CustomLogitProcessor.from_str(bad)


FAKE_SGLANG = """
import json, dill
class CustomLogitProcessor:
    @classmethod
    def to_str(cls):
        return json.dumps({"callable": dill.dumps(cls).hex()})
class DisallowedTokensLogitsProcessor(CustomLogitProcessor):
    pass
"""


def sglang_strings(tmp_path, body: str) -> list[str]:
    """Strings made by a stand-in of SGLang's module (same module path and to_str), in a
    process where it is importable, as a client with SGLang installed makes them."""
    pkg = tmp_path / "sglang" / "srt" / "sampling"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "sglang", tmp_path / "sglang" / "srt", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "custom_logit_processor.py").write_text(FAKE_SGLANG)
    script = tmp_path / "client.py"
    script.write_text(textwrap.dedent(body))
    out = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.splitlines()


def test_strings_made_with_sglangs_class_load_here(tmp_path):
    """dill pickles the client's `__main__` class by value but its base by reference to
    sglang's module; those references resolve to this module's classes of the same name."""
    mine, builtin = sglang_strings(
        tmp_path,
        """
        from sglang.srt.sampling.custom_logit_processor import (
            CustomLogitProcessor, DisallowedTokensLogitsProcessor)
        class BanFirst(CustomLogitProcessor):
            def __call__(self, logits, custom_param_list=None):
                logits[:, 0] = -float("inf")
                return logits
        print(BanFirst.to_str())
        print(DisallowedTokensLogitsProcessor.to_str())
        """,
    )
    proc = CustomLogitProcessor.from_str(mine)
    assert isinstance(proc, CustomLogitProcessor)
    assert proc(torch.zeros(2, V), [None, None])[:, 0].tolist() == [-float("inf")] * 2
    assert type(CustomLogitProcessor.from_str(builtin)) is DisallowedTokensLogitsProcessor


def test_references_to_other_sglang_modules_do_not_load(tmp_path):
    """The documented limit: only sglang's custom_logit_processor module is mapped."""
    [s] = sglang_strings(
        tmp_path,
        """
        import pathlib
        pathlib.Path("sglang/srt/utils.py").write_text("def helper(x):\\n    return x\\n")
        from sglang.srt.utils import helper
        from sglang.srt.sampling.custom_logit_processor import CustomLogitProcessor
        class UsesHelper(CustomLogitProcessor):
            fn = staticmethod(helper)
            def __call__(self, logits, custom_param_list=None):
                return self.fn(logits)
        print(UsesHelper.to_str())
        """,
    )
    with pytest.raises(ModuleNotFoundError, match="sglang"):
        CustomLogitProcessor.from_str(s)


def test_batch_groups_rows_and_follows_filter_and_concat():
    p, q = ForceToken.to_str(), DisallowedTokensLogitsProcessor.to_str()
    reqs = [
        make_req("a", p, {"token_id": 1}),
        make_req("b"),
        make_req("c", q, {"token_ids": [0]}),
        make_req("d", p, {"token_id": 2}),
    ]
    batch = CustomLogitBatch.from_reqs(reqs)
    assert {k: rows for k, (_, rows) in batch.groups.items()} == {p: [0, 3], q: [2]}
    assert batch.params[0]["__req__"] is reqs[0] and batch.params[1] is None
    assert reqs[0].sampling_params.custom_params == {"token_id": 1}  # not edited
    kept = batch.filter([1, 2, 3])
    assert {k: rows for k, (_, rows) in kept.groups.items()} == {p: [2], q: [1]}
    assert kept.filter([0]) is None
    merged = CustomLogitBatch.concat(None, kept, 2, 3)
    assert {k: rows for k, (_, rows) in merged.groups.items()} == {p: [4], q: [3]}
    assert merged.params[:2] == [None, None] and merged.params[4]["__req__"] is reqs[3]
    assert CustomLogitBatch.concat(None, None, 1, 1) is None
    assert CustomLogitBatch.from_reqs([make_req("e")]) is None


def test_sampler_runs_processors_per_row_and_reports_failures():
    reqs = [
        make_req("a", ForceToken.to_str(), {"token_id": 3}),
        make_req("b"),
        make_req("c", Raises.to_str(), {}),
        make_req("d", ForceToken.to_str(), {"token_id": 6}),
    ]
    info = SamplingBatchInfo.from_reqs(reqs, V, "cpu")
    logits = torch.arange(V, dtype=torch.float32).repeat(4, 1)  # argmax 7 everywhere
    original = logits.clone()
    out = Sampler("pytorch")(logits, info, torch.zeros(4, dtype=torch.int64))
    assert out.next_token_ids.tolist() == [3, 7, 7, 6]
    assert [(f.row, f.message) for f in out.processor_failures] == [
        (2, "Custom logit processor Raises failed: RuntimeError: boom")
    ]
    assert torch.equal(logits, original)  # the caller's logits are not edited


def test_sampling_info_filter_and_merge_carry_processors():
    p = ForceToken.to_str()
    first = SamplingBatchInfo.from_reqs(
        [make_req("a"), make_req("b", p, {"token_id": 1})], V, "cpu"
    )
    second = SamplingBatchInfo.from_reqs([make_req("c", p, {"token_id": 2})], V, "cpu")
    first.filter(torch.tensor([1]))
    reqs = [make_req("b", p, {"token_id": 1}), make_req("c", p, {"token_id": 2})]
    first.merge(second, reqs)
    out = Sampler("pytorch")(torch.zeros(2, V), first, torch.zeros(2, dtype=torch.int64))
    assert out.next_token_ids.tolist() == [1, 2]
    first.filter(torch.tensor([0]))
    without = SamplingBatchInfo.from_reqs([make_req("e")], V, "cpu")
    first.merge(without, reqs[:1] + [make_req("e")])
    assert list(first.custom_logit.groups.values())[0][1] == [0]
    assert first.custom_logit.params[1] is None
