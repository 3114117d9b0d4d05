"""The scheduler's profiler state machine (SchedulerProfiler alone, no model),
the trace merger and the /start_profile body parser.

Step counting follows SGLang: the hook runs before each forward, so num_steps=N traces N
forwards and the trace is written when the (N+1)-th one begins.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from mini_sglang.entrypoints.control_routes import parse_profile_body
from mini_sglang.managers.io_struct.control import ProfileReq, ProfileReqInput, ProfileReqType
from mini_sglang.managers.scheduler_profiler import SchedulerProfiler
from mini_sglang.model_executor.forward_batch_info import ForwardMode
from mini_sglang.utils.profile_merger import merge_chrome_traces

E, D = ForwardMode.EXTEND, ForwardMode.DECODE


class StubScheduler(SchedulerProfiler):
    """The profiler as one TP rank's scheduler drives it, `step` standing for a forward."""

    def __init__(self, tp_rank: int = 0) -> None:
        super().__init__(tp_rank=tp_rank, tp_size=1, dp_size=1, dp_rank=None)

    def step(self, mode: ForwardMode) -> None:
        self.on_step(SimpleNamespace(forward_mode=mode))


def start(s: StubScheduler, out: Path, **kw) -> object:
    kw.setdefault("activities", ["CPU"])
    kw.setdefault("with_stack", False)
    req = ProfileReq(type=ProfileReqType.START_PROFILE, output_dir=str(out), **kw)
    return s.profile(req)


def stop(s: StubScheduler) -> object:
    return s.profile(ProfileReq(type=ProfileReqType.STOP_PROFILE))


def traces(out: Path) -> list[str]:
    return sorted(os.listdir(out)) if out.exists() else []


def test_start_step_and_num_steps(tmp_path: Path):
    s = StubScheduler()
    s.step(D)
    assert start(s, tmp_path, profile_id="a", start_step=3, num_steps=2).success
    assert not s.profile_in_progress  # waits for forward step 3
    s.step(D)
    assert not s.profile_in_progress
    s.step(D)  # forward 3
    assert s.profile_in_progress
    s.step(D)  # forward 4
    assert s.profile_in_progress and traces(tmp_path) == []
    s.step(D)  # forward 5 = 3 + 2: written before it runs
    assert not s.profile_in_progress
    assert traces(tmp_path) == ["a-TP-0.trace.json.gz"]
    s.step(D)  # a finished auto-stop does not fire again
    out = stop(s)
    assert not out.success and "not in progress" in out.message


def test_num_steps_from_now_and_errors(tmp_path: Path):
    s = StubScheduler(tp_rank=1)
    assert stop(s).message == "Profiling is not in progress. Call /start_profile first."
    assert start(s, tmp_path, profile_id="b", num_steps=1).success
    assert s.profile_in_progress
    again = start(s, tmp_path, profile_id="c")
    assert not again.success
    assert again.message == "Profiling is already in progress. Call /stop_profile first."
    s.step(E)  # forward 1 = target: stopped before it runs (SGLang counts the same way)
    assert traces(tmp_path) == ["b-TP-1.trace.json.gz"]


def test_stop_cancels_a_pending_start(tmp_path: Path):
    s = StubScheduler()
    assert start(s, tmp_path, profile_id="p", start_step=2).success
    assert not stop(s).success
    s.step(D)
    s.step(D)
    assert not s.profile_in_progress and traces(tmp_path) == []


def test_by_stage(tmp_path: Path):
    s = StubScheduler()
    assert start(s, tmp_path, profile_id="s", profile_by_stage=True, num_steps=2).success
    assert not s.profile_in_progress
    for mode in (E, E):
        s.step(mode)
    assert s.profile_in_progress
    s.step(E)  # third prefill: the EXTEND trace (2 batches) is written
    assert traces(tmp_path) == ["s-TP-0-EXTEND.trace.json.gz"]
    s.step(D)
    s.step(D)
    assert s.profile_in_progress
    s.step(D)
    assert not s.profile_in_progress and not s.profile_by_stage
    assert traces(tmp_path) == ["s-TP-0-DECODE.trace.json.gz", "s-TP-0-EXTEND.trace.json.gz"]
    s.step(E)  # nothing restarts
    assert not s.profile_in_progress


def test_by_stage_decode_ends_the_prefill_trace(tmp_path: Path):
    s = StubScheduler()
    start(s, tmp_path, profile_id="t", profile_by_stage=True, num_steps=5)
    s.step(E)
    s.step(D)  # decoding begins before 5 prefills: the EXTEND trace ends here
    assert traces(tmp_path) == ["t-TP-0-EXTEND.trace.json.gz"]
    assert s.profile_in_progress
    assert stop(s).success  # a manual stop has no stage suffix (SGLang)
    assert "t-TP-0.trace.json.gz" in traces(tmp_path)


def test_activities(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    s = StubScheduler()
    out = start(s, tmp_path, activities=["GPU"])
    assert not out.success and "GPU" in out.message
    assert start(s, tmp_path, activities=["CPU", "RPD"], profile_id="u").success
    assert s.profiler_activities == ["CPU"]
    assert stop(s).success
    s2 = StubScheduler()
    assert start(s2, tmp_path, activities=None, profile_id="v").success  # default CPU+GPU
    assert s2.profiler_activities == ["CPU"]
    stop(s2)


def _write_trace(path: Path, pid: int) -> None:
    trace = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": pid}],
        "traceEvents": [
            {"ph": "X", "name": "op", "pid": pid, "tid": 1, "ts": 0, "dur": 1},
            {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}},
        ],
    }
    with gzip.open(path, "wt") as fh:
        json.dump(trace, fh)


def test_merge_chrome_traces(tmp_path: Path):
    _write_trace(tmp_path / "m-TP-1.trace.json.gz", 7)
    _write_trace(tmp_path / "m-TP-0.trace.json.gz", 5)
    _write_trace(tmp_path / "other-TP-0.trace.json.gz", 9)
    path, n_events, n_files = merge_chrome_traces(str(tmp_path), "m")
    assert os.path.basename(path) == "merged-m.trace.json.gz"
    assert (n_events, n_files) == (4, 2)
    with gzip.open(path, "rt") as fh:
        merged = json.load(fh)
    assert [e["pid"] for e in merged["traceEvents"]] == ["[TP00] 5"] * 2 + ["[TP01] 7"] * 2
    assert merged["traceEvents"][3]["args"]["sort_index"] == 7 + 10**6
    assert merged["deviceProperties"] == [{"id": 5}, {"id": 7}]
    assert merged["schemaVersion"] == 1
    with pytest.raises(ValueError):
        merge_chrome_traces(str(tmp_path), "none")


def test_parse_profile_body():
    assert parse_profile_body(b"") == ProfileReqInput()
    assert parse_profile_body(b"null") == ProfileReqInput()
    obj = parse_profile_body(b'{"num_steps": 3, "activities": ["CPU"], "x": 1, "rid": "r"}')
    assert obj == ProfileReqInput(num_steps=3, activities=["CPU"])
    assert parse_profile_body(b'{"start_step": null}') == ProfileReqInput()
    # SGLang's pydantic validation is lax: numeric strings, bools and 0/1 are coerced.
    obj = parse_profile_body(b'{"start_step": "15", "num_steps": true, "with_stack": 1}')
    assert obj == ProfileReqInput(start_step=15, num_steps=1, with_stack=True)
    for bad in (b'{"num_steps": "x"}', b'{"num_steps": 1.5}', b'{"output_dir": 3}', b"[1]"):
        with pytest.raises(ValueError):
            parse_profile_body(bad)
    with pytest.raises(ValueError):
        parse_profile_body(b'{"activities": ["CPU", 1]}')
    with pytest.raises(ValueError):
        parse_profile_body(b"{bad json")
