"""benchmarks/trace_kernel_summary.py charges each kernel the time by which it extends the
stream's busy span, so PDL-overlapped kernels are not counted twice (its docstring's worked
example, read from a gzipped Chrome trace as bench_one_batch --profile writes it)."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

_PATH = Path(__file__).parents[2] / "benchmarks" / "trace_kernel_summary.py"
_spec = importlib.util.spec_from_file_location("trace_kernel_summary", _PATH)
summary = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(summary)


def _kernel(name: str, ts: float, dur: float) -> dict:
    return {"cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"grid": [1, 1, 1]}}


def test_overlapping_kernels_are_charged_their_extension_of_the_span(tmp_path: Path) -> None:
    events = [
        _kernel("C", 15, 1),
        _kernel("A", 0, 10),
        {"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 50},  # not a kernel
        _kernel("B", 8, 7),
        _kernel("D", 11, 2),  # inside B: extends nothing
    ]
    path = tmp_path / "t.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    rows = summary.charge(summary.load_kernels(str(path)))
    grid = "[1, 1, 1]"
    assert {name: rows[(name, grid)] for name in "ABCD"} == {
        "A": [1, 10.0], "B": [1, 5.0], "C": [1, 1.0], "D": [1, 0.0],
    }  # fmt: skip


def test_timeline_starts_at_the_anchors_middle_launch() -> None:
    # two "layers" of A (PDL: B starts before A ends); the run starts at the second A,
    # charged from the first B's end (15)
    kernels = [
        _kernel("A", 0, 10), _kernel("B", 8, 7),
        _kernel("A", 20, 10), _kernel("B", 25, 10), _kernel("C", 40, 1),
    ]  # fmt: skip
    kernels[3]["args"].update(block=[128, 1, 1], **{"registers per thread": 64})
    rows = summary.timeline(kernels, "A", 2)
    assert [(r["name"], r["start"], r["end"], r["charge"]) for r in rows] == [
        ("A", 0, 10, 15.0), ("B", 5, 15, 5.0),
    ]  # fmt: skip
    assert (rows[1]["threads"], rows[1]["registers"]) == (128, 64)
    assert summary.timeline(kernels, "X", 3) == []
