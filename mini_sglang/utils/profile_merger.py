"""Merge the per-rank Chrome traces of one profile into one file (SGLang's ProfileMerger).

Input: ``{profile_id}*-TP-*.trace.json.gz`` in the output directory. Output:
``merged-{profile_id}.trace.json.gz`` whose events keep their data but whose ``pid`` is
prefixed with the rank label (``[TP00-DP01] 1234``) so ranks appear as separate process rows,
ordered DP, then TP, then the original pid.
"""

from __future__ import annotations

import glob
import gzip
import json
import os
import re
from typing import Any

RANK_KINDS = ("dp", "tp")
# Process-row order: DP replica, then TP rank, then the original pid (pids < 2**20 only).
SORT_MULTIPLIERS = {"dp": 10**9, "tp": 10**6}
PID_SORT_LIMIT = 10**6


def _rank_info(path: str) -> dict[str, int]:
    base = os.path.basename(path)
    info = {}
    for kind in RANK_KINDS:
        m = re.search(rf"{kind.upper()}-(\d+)", base)
        if m:
            info[kind] = int(m.group(1))
    return info


def _label(info: dict[str, int]) -> str:
    parts = [f"{k.upper()}{info[k]:02d}" for k in RANK_KINDS if k in info]
    return f"[{'-'.join(parts)}]" if parts else "[Unknown]"


def _relabel(events: list[dict[str, Any]], info: dict[str, int]) -> None:
    label = _label(info)
    for ev in events:
        pid = ev.get("pid")
        if ev.get("name") == "process_sort_index" and isinstance(pid, int) and pid < PID_SORT_LIMIT:
            extra = sum(info.get(k, 0) * m for k, m in SORT_MULTIPLIERS.items())
            ev.setdefault("args", {})["sort_index"] = pid + extra
        ev["pid"] = f"{label} {pid}"


def merge_chrome_traces(output_dir: str, profile_id: str) -> tuple[str, int, int]:
    """Write the merged trace; returns (path, number of events, number of files merged).
    Raises ValueError when no trace of `profile_id` is there."""
    merged_path = os.path.join(output_dir, f"merged-{profile_id}.trace.json.gz")
    files = [
        f
        for f in set(
            glob.glob(os.path.join(glob.escape(output_dir), f"{profile_id}*.trace.json.gz"))
        )
        if "TP-" in os.path.basename(f) and f != merged_path
    ]
    if not files:
        raise ValueError(f"No trace files found for profile_id: {profile_id}")
    files.sort(key=lambda f: tuple(_rank_info(f).get(k, 0) for k in RANK_KINDS))
    merged: dict[str, Any] = {"traceEvents": []}
    device_props: list[Any] = []
    for path in files:
        with gzip.open(path, "rt", encoding="utf-8") as fh:
            trace = json.load(fh)
        events = trace.pop("traceEvents", [])
        _relabel(events, _rank_info(path))
        merged["traceEvents"].extend(events)
        device_props.extend(trace.pop("deviceProperties", []) or [])
        for key, value in trace.items():
            merged.setdefault(key, value)
    if device_props:
        merged["deviceProperties"] = device_props
    with gzip.open(merged_path, "wb") as fh:
        fh.write(json.dumps(merged).encode("utf-8"))
    return merged_path, len(merged["traceEvents"]), len(files)
