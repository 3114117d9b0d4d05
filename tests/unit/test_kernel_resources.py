"""benchmarks/kernel_resources.py compiles the MoE decode kernels (and the decode attention
kernel) for sm90 without a GPU and reports their registers, the programs per SM those allow
and the loads issued before the PDL wait (run in a subprocess: this test process runs
Triton in interpreter mode, which the compile must not)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

triton = pytest.importorskip("triton")

_SCRIPT = Path(__file__).parents[2] / "benchmarks" / "kernel_resources.py"


def _rows(tmp_path: Path, *args: str) -> tuple[list[dict], str]:
    """kernel_resources.py's JSONL rows for these arguments, compiled in a subprocess, and
    what it printed."""
    nvidia = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    if not (nvidia / "ptxas").exists() or not (nvidia / "cuobjdump").exists():
        pytest.skip("this Triton install has no bundled ptxas / cuobjdump")
    out = tmp_path / "rows.jsonl"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run(
        [sys.executable, str(_SCRIPT), *args, "--out", str(out)],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    return [json.loads(line) for line in out.read_text().splitlines()], run.stdout


def test_reports_registers_and_occupancy_of_each_kernel(tmp_path: Path) -> None:
    rows, stdout = _rows(tmp_path, "--tiles", "8,128,8")
    assert [(r["kernel"], r["warps"]) for r in rows] == [
        ("gate_up", 8), ("down", 8), ("topk_softmax", 1), ("topk_softmax", 4),
    ]  # fmt: skip
    for r in rows:
        warps, allocated = r["warps"], -(-r["regs"] // 8) * 8
        assert 0 < r["regs"] <= 255 and r["arch"] == 90
        assert r["ctas_per_sm"] == min(65536 // (allocated * 32 * warps), 64 // warps, 32)
    # the one-warp top-k kernel reduces with shuffles only; four warps need barriers
    assert rows[2]["barriers"] == 0 < rows[3]["barriers"]
    # each kernel waits on the one before it (PDL); down issues its ids, routing weights and
    # first w2 tiles before that wait, and the compiled code keeps them there
    assert all(r["loads_after_wait"] > 0 for r in rows)
    assert rows[1]["loads_before_wait"] > 0
    assert stdout.strip().splitlines()[1:] and len(stdout.strip().splitlines()) == len(rows) + 1


def test_attention_kernel_loads_before_its_wait(tmp_path: Path) -> None:
    """--attention: the fused decode attention kernel, one row, issues global loads before
    its PDL wait (the request's length, slots and position and its first key block, while
    the qkv GEMV before it still runs) and reads qkv after it."""
    (row,), stdout = _rows(tmp_path, "--attention")
    assert (row["kernel"], row["warps"], row["arch"]) == ("decode_from_qkv", 4, 90)
    assert row["loads_before_wait"] > 0 and row["loads_after_wait"] > 0
    assert 0 < row["regs"] <= 255 and row["ctas_per_sm"] > 0
    assert stdout.startswith(f"Triton {triton.__version__}, sm90\n") and row["triton"]
    assert len(stdout.strip().splitlines()) == 2


def test_align_kernels_spill_only_when_ranking_large_chunks_by_comparison(
    tmp_path: Path,
) -> None:
    """--align: moe_align_block_size's counting kernel and its placing kernel (one chunk,
    several) per CHUNK,WARPS[,SUB]; ranking 256 pairs by comparison spills (its [CHUNK,
    CHUNK] step; align.py's comment), the shipped shapes (64 pairs by comparison, larger
    chunks 64 pairs at a time) do not."""
    rows, stdout = _rows(tmp_path, "--align", "256,8", "64,4", "512,8,64")
    assert [(r["kernel"], r["tiles"], r["warps"]) for r in rows] == [
        (kernel, tiles, warps)
        for tiles, warps in (([256], 8), ([64], 4), ([512, 64], 8))
        for kernel in ("align count", "align place, one chunk", "align place, chunks")
    ]
    assert [r["stack"] > 0 for r in rows] == [False, True, True] + [False] * 6
    assert len(stdout.strip().splitlines()) == len(rows) + 1


def test_persistent_gemv_occupancy_against_its_launch(tmp_path: Path) -> None:
    """--gemv: small_m_gemm's persistent one-row GEMV per shape and config, bf16 with the
    norm folded and block-scaled FP8 (integer decoding), with the programs an SM holds set
    against the programs per SM the config launches: a launch beyond them is flagged as
    two waves. The weight's first row block is loaded before the PDL wait."""
    cfgs = ["2,0,8,1,2,4", "2,0,4,1,3,32"]  # 32 programs per SM: more than any SM holds
    rows, stdout = _rows(
        tmp_path, "--gemv", "qkv:5120:2048:norm", "o:2048:4096:fp8block128x128",
        "--gemv-configs", *cfgs,
    )  # fmt: skip
    assert [(r["kernel"], r["tiles"]) for r in rows] == [
        (f"gemv {name}", [int(v) for v in c.split(",")])
        for name in ("qkv 5120x2048 norm", "o 2048x4096 fp8block128x128")
        for c in cfgs
    ]
    for r in rows:
        allocated = -(-r["regs"] // 8) * 8
        assert r["ctas_per_sm"] == min(65536 // (allocated * 32 * r["warps"]), 64 // r["warps"], 32)
        assert r["loads_before_wait"] > 0 and r["loads_after_wait"] > 0
    lines = stdout.strip().splitlines()[1:]
    assert len(lines) == len(rows)
    for r, line in zip(rows, lines):
        assert ("TWO WAVES" in line) == (r["ctas_per_sm"] < r["per_sm"])
    assert "TWO WAVES" in lines[1] and "TWO WAVES" in lines[3]


def test_grid_gemv_waves_at_several_rows(tmp_path: Path) -> None:
    """--gemv with --gemv-rows: small_m_gemm's grid GEMV compiled as gemv launches a config
    at that many rows of x (grid_launch), its programs set against what the SMs hold at once.
    Per-channel FP8 qkv at four rows: (8, 2048, 4, 2, 3) launches 640 programs of BLOCK_N 8;
    with 4 SMs they need several waves."""
    cfgs = ["8,2048,4,2,3", "64,64,4"]
    rows, stdout = _rows(
        tmp_path, "--gemv", "qkv:5120:2048:norm+fp8", "--gemv-rows", "4", "--sms", "4",
        "--gemv-configs", *cfgs,
    )  # fmt: skip
    assert [(r["tiles"], r["rows"], r["programs"]) for r in rows] == [
        ([8, 2048, 4, 2, 3], 4, 640), ([64, 64, 4], 4, 80),
    ]  # fmt: skip
    for r, line in zip(rows, stdout.strip().splitlines()[1:]):
        assert r["waves"] == -(-r["programs"] // (r["ctas_per_sm"] * 4)) > 1
        assert f"{r['waves']} WAVES" in line and r["loads_after_wait"] > 0
