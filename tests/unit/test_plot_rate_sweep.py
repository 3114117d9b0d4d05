"""benchmarks/plot_rate_sweep.py: bench_serving JSONL rows grouped into one figure per
workload, one series per input label (and engine / revision), inf rates left out."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).parents[2] / "benchmarks" / "plot_rate_sweep.py"
_spec = importlib.util.spec_from_file_location("plot_rate_sweep", _PATH)
plot_rate_sweep = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(plot_rate_sweep)


def _row(rate: float, out_len: int = 256, **kw) -> dict:
    return {
        "dataset_name": "random-ids",
        "completed": 100,
        "random_input_len": 1024,
        "random_output_len": out_len,
        "random_range_ratio": 0.0,
        "request_rate": rate,
        "output_throughput": 100.0 * min(rate, 1e6),
        "median_ttft_ms": 30.0,
        "p99_ttft_ms": 60.0,
        "median_itl_ms": 5.0,
        "p99_itl_ms": 9.0,
        **kw,
    }


def _write(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_load_groups_by_workload_and_series(tmp_path: Path) -> None:
    a = _write(tmp_path / "a.jsonl", [_row(1), _row(2), _row(float("inf")), _row(1, out_len=64)])
    b = _write(tmp_path / "b.jsonl", [_row(1, revision="r1"), _row(2, revision="r2")])
    workloads = plot_rate_sweep.load([f"main={a}", b])
    assert len(workloads) == 2
    main_key = plot_rate_sweep.workload_key(_row(1))
    series = workloads[main_key]
    assert sorted(series) == ["b r1", "b r2", "main"]
    assert [r["request_rate"] for r in series["main"]] == [1, 2]  # inf left out


def test_plot_writes_one_figure_per_workload(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("matplotlib")
    rows = [_row(1), _row(2), _row(4), _row(1, out_len=64), _row(2, out_len=64)]
    src = _write(tmp_path / "sweep.jsonl", rows)
    out = tmp_path / "fig.png"
    monkeypatch.setattr(sys, "argv", ["plot_rate_sweep", f"x={src}", "-o", str(out)])
    plot_rate_sweep.main()
    written = sorted(p.name for p in tmp_path.glob("fig_*.png"))
    assert written == ["fig_in1024_out256_n100.png", "fig_in1024_out64_n100.png"]
    assert all((tmp_path / n).stat().st_size > 10_000 for n in written)
