"""Benchmark client pieces behind ``python -m mini_sglang.bench_serving``.

Mirrors SGLang 0.5.4 ``sglang.bench_serving``: ``datasets`` builds the workload,
``backends`` speaks each server protocol, ``metrics`` turns timings into the report.
``tp_group`` runs an offline benchmark on one process per TP rank (bench_one_batch).
"""

from __future__ import annotations
