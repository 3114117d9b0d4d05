"""Where the time of a profiled decode goes, kernel by kernel, from the Chrome trace that
`bench_one_batch --profile PATH` writes to PATH.trace.json (gzip it or not).

    python benchmarks/trace_kernel_summary.py p_fused.trace.json.gz p_plain.trace.json.gz [--steps 20]

Under programmatic dependent launch (PDL) a kernel starts while the one before it drains and
then waits, so its own duration counts the wait too and durations overlap. This charges each
kernel only the time by which it moves the stream's last kernel end forward (its end minus the
latest end before it; 0 if it ends earlier), which adds up to the stream's busy span. Worked
example: A runs 0-10 us, B (PDL) starts at 8 and ends at 15, C starts at 15 and ends at 16:
A is charged 10, B 5 (not 7), C 1: 16 us in all. Rows group kernels by name and grid.

    python benchmarks/trace_kernel_summary.py p.trace.json.gz --timeline _decode_stage2 --count 10

prints instead one run of kernels in launch order from the middle launch of the kernel
whose name starts with the given prefix (a layer of a steady step): grid, threads and
registers as the trace lists them, start and end relative to that launch, and the charge.
Under PDL that shows what the totals hide: which kernels are launched while another still
runs (and hold SM resources while they wait), and when each one's work really ends.
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


def timeline(kernels: list[dict], anchor: str, count: int) -> list[dict]:
    """`count` kernels from the middle launch of the first kernel named with prefix `anchor`
    (none: []): name, grid, threads, registers, start and end in us from that launch's
    start, and the charge of `charge`, counted from the latest end before that launch."""
    hits = [i for i, k in enumerate(kernels) if k["name"].startswith(anchor)]
    if not hits:
        return []
    i0 = hits[len(hits) // 2]
    base = kernels[i0]["ts"]
    last_end = max((k["ts"] + k["dur"] for k in kernels[:i0]), default=base)
    rows = []
    for k in kernels[i0 : i0 + count]:
        args = k.get("args", {})
        end = k["ts"] + k["dur"]
        rows.append({
            "name": k["name"][:32], "grid": args.get("grid"), "threads": (args.get("block") or [None])[0],
            "registers": args.get("registers per thread"), "start": k["ts"] - base,
            "end": end - base, "charge": max(0.0, end - last_end),
        })  # fmt: skip
        last_end = max(last_end, end)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--steps", type=int, default=20, help="decode steps in the trace")
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument(
        "--timeline", metavar="PREFIX", help="one run of kernels from PREFIX's middle launch"
    )
    ap.add_argument("--count", type=int, default=12, help="kernels in --timeline's run")
    args = ap.parse_args()
    for path in args.traces:
        if args.timeline:
            print(path)
            for r in timeline(load_kernels(path), args.timeline, args.count):
                print(f"  {r['name']:32s} grid={str(r['grid']):14s} threads={r['threads']} "
                      f"registers={r['registers']} start={r['start']:8.2f} end={r['end']:8.2f} "
                      f"charge={r['charge']:6.2f}")  # fmt: skip
            continue
        rows = charge(load_kernels(path))
        total = sum(us for _, us in rows.values())
        print(f"{path}: {total / args.steps / 1000:.3f} ms per step")
        for (name, grid), (n, us) in sorted(rows.items(), key=lambda r: -r[1][1])[: args.top]:
            print(
                f"  {us / n:8.2f} us x {n:5d}  {us / args.steps / 1000:7.3f} ms/step  {name} {grid}"
            )


if __name__ == "__main__":
    main()
