"""Timed kernel picks that outlive the process: one JSON table per GPU model.

Some layers time candidate kernels for each shape at start-up and keep the fastest
(small_m_gemm's cuBLAS-vs-Triton GEMV pick). On a fresh machine every pick compiles every
candidate (for Llama-3.1-8B about 200 Triton compiles, a minute or more); on a warm one it
still costs seconds of timed graph replays. A pick depends only on the card model, the
shape and the kernels' code, so it is kept:

- shipped with the package: ``mini_sglang/layers/kernel_configs/<table>_<device>.json``,
  tuned on that card by the same timing (the picks a start-up makes on it);
- cached per user: ``<MINI_SGLANG_CACHE_DIR or ~/.cache/mini_sglang>/kernel_choices/
  <table>_<device>.json``, written as soon as a start-up makes a new pick.

A cached entry wins over a shipped one. MINI_SGLANG_KERNEL_RETUNE=1 ignores both and times
again (the new picks overwrite the cache). `<device>` is torch's device name with every run
of characters other than letters and digits replaced by "_" ("NVIDIA H100 80GB HBM3" ->
"NVIDIA_H100_80GB_HBM3").

A table maps a key string chosen by the layer (e.g. "M8|N4096|K4096|bfloat16|plain") to a
JSON value (e.g. [2, 2048, 8, 3], or null for "the library kernel"). The layer validates
what it reads: a stale entry naming a config that no longer exists is treated as missing.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import tempfile
import threading
from typing import Any

import torch

from mini_sglang.environ import envs

logger = logging.getLogger(__name__)

SHIPPED_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel_configs")
MISSING = object()
_lock = threading.Lock()
# (table, device name) -> the merged table (shipped, then cached on top)
_tables: dict[tuple[str, str], dict[str, Any]] = {}


@functools.cache
def device_name(device: torch.device) -> str:
    """The file-name form of the card's model name (see the module docstring)."""
    return re.sub(r"[^A-Za-z0-9]+", "_", torch.cuda.get_device_name(device)).strip("_")


def cache_dir() -> str:
    root = envs.MINI_SGLANG_CACHE_DIR.get() or os.path.join(
        os.path.expanduser("~"), ".cache", "mini_sglang"
    )
    return os.path.join(root, "kernel_choices")


def _read(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:  # a torn or hand-edited file: time again
        logger.warning("Ignoring kernel choice file %s: %s", path, e)
        return {}
    return data if isinstance(data, dict) else {}


def _table(table: str, name: str) -> tuple[dict[str, Any], str]:
    cached_path = os.path.join(cache_dir(), f"{table}_{name}.json")
    key = (table, name)
    if key not in _tables:
        merged: dict[str, Any] = {}
        if not envs.MINI_SGLANG_KERNEL_RETUNE.get():
            merged.update(_read(os.path.join(SHIPPED_DIR, f"{table}_{name}.json")))
            merged.update(_read(cached_path))
        _tables[key] = merged
    return _tables[key], cached_path


def dumps(data: dict[str, Any]) -> str:
    """A table as JSON with one entry per line, keys sorted (diffs of shipped tables stay
    readable)."""
    rows = [f"  {json.dumps(k)}: {json.dumps(data[k])}" for k in sorted(data)]
    return "{\n" + ",\n".join(rows) + "\n}\n"


def lookup(table: str, device: str, key: str) -> Any:
    """The stored pick for `key` on the card `device` (device_name's form), or MISSING."""
    with _lock:
        return _table(table, device)[0].get(key, MISSING)


def record(table: str, device: str, key: str, value: Any) -> None:
    """Store a new pick and rewrite the user's cache file (atomically: ranks of one machine
    may write at once; the last writer wins, and a pick lost that way is timed again)."""
    with _lock:
        data, path = _table(table, device)
        data[key] = value
        if envs.MINI_SGLANG_KERNEL_RETUNE.get():
            # the table holds only this process's picks (_table read nothing): the cache
            # becomes exactly those, each new pick added to the ones before it
            on_disk = dict(data)
        else:
            on_disk = _read(path)
            on_disk[key] = value
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                f.write(dumps(on_disk))
            os.replace(tmp, path)
        except OSError as e:  # a read-only home: the pick still serves this process
            logger.debug("Could not write kernel choice cache %s: %s", path, e)
