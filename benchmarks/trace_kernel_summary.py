"""Where the time of a profiled decode goes, kernel by kernel, from the Chrome trace that
`bench_one_batch --profile PATH` writes to PATH.trace.json (gzip it or not).

    python benchmarks/trace_kernel_summary.py p_fused.trace.json.gz p_plain.trace.json.gz [--steps 20]

Under programmatic dependent launch (PDL) a kernel starts while the one before it drains and
then waits, so its own duration counts the wait too and durations overlap. This charges each
kernel only the time by which it moves the stream's last kernel end forward (its end minus the
latest end before it; 0 if it ends earlier), which adds up to the stream's busy span. Worked
example: A runs 0-10 us, B (PDL) starts at 8 and ends at 15, C starts at 15 and ends at 16:
A is charged 10, B 5 (not 7), C 1: 16 us in all. Rows group kernels by name and grid.
"""

from __future__ import annotations

import argparse
import gzip
import json
from collections import defaultdict


def load_kernels(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])


def charge(kernels: list[dict]) -> dict[tuple[str, str], list[float]]:
    """(name, grid) -> [launches, charged us] (see the module docstring)."""
    rows: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    last_end = kernels[0]["ts"] if kernels else 0.0
    for k in kernels:
        end = k["ts"] + k["dur"]
        row = rows[(k["name"][:48], str(k.get("args", {}).get("grid")))]
        row[0] += 1
        row[1] += max(0.0, end - last_end)
        last_end = max(last_end, end)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--steps", type=int, default=20, help="decode steps in the trace")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    for path in args.traces:
        rows = charge(load_kernels(path))
        total = sum(us for _, us in rows.values())
        print(f"{path}: {total / args.steps / 1000:.3f} ms per step")
        for (name, grid), (n, us) in sorted(rows.items(), key=lambda r: -r[1][1])[: args.top]:
            print(
                f"  {us / n:8.2f} us x {n:5d}  {us / args.steps / 1000:7.3f} ms/step  {name} {grid}"
            )


if __name__ == "__main__":
    main()
