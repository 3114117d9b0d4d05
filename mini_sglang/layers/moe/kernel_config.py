"""Tile sizes of the fused MoE kernel, per problem shape and batch size.

Tuned configurations ship as JSON files in `configs/` (written by
benchmarks/tune_fused_moe.py on the GPU): one file per (E, N, top-k, dtype, device) named
`E={E},N={N},topk={k},dtype={dtype},device_name={name}.json`, where E is the number of
experts a rank holds, N its intermediate size per expert (after TP) and name the CUDA device
name with spaces as underscores. Each file maps a batch size M (tokens, as a string) to
{"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps",
"num_stages"}; a batch takes the entry of the nearest M. Without a file the heuristic
`default_config` is used, so a missing or unreadable file only costs speed.
"""

from __future__ import annotations

import functools
import json
import logging
import os

import torch

logger = logging.getLogger("mini_sglang")

CONFIG_DIR = os.path.join(os.path.dirname(__file__), "configs")
CONFIG_KEYS = (
    "BLOCK_SIZE_M",
    "BLOCK_SIZE_N",
    "BLOCK_SIZE_K",
    "GROUP_SIZE_M",
    "num_warps",
    "num_stages",
)


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def config_file_name(E: int, N: int, top_k: int, dtype: torch.dtype, device_name: str) -> str:
    return (
        f"E={E},N={N},topk={top_k},dtype={dtype_name(dtype)},"
        f"device_name={device_name.replace(' ', '_')}.json"
    )


def default_config(M: int, E: int, top_k: int) -> dict[str, int]:
    """The heuristic: with few pairs per expert (decode) the GEMMs read weights once and are
    memory bound, so 16-row blocks and wide K tiles; larger batches get square 64 tiles and
    grouped block order for L2 reuse (SGLang's defaults, plus warps and stages)."""
    if M * top_k <= 2 * E:
        return dict(
            BLOCK_SIZE_M=16,
            BLOCK_SIZE_N=64,
            BLOCK_SIZE_K=128,
            GROUP_SIZE_M=1,
            num_warps=4,
            num_stages=4,
        )
    return dict(
        BLOCK_SIZE_M=64,
        BLOCK_SIZE_N=64 if M <= 1024 else 128,
        BLOCK_SIZE_K=64,
        GROUP_SIZE_M=8,
        num_warps=4,
        num_stages=3,
    )


@functools.cache
def load_configs(file_name: str, config_dir: str) -> dict[int, dict[str, int]] | None:
    """The tuned table {M: config} of one shipped file, or None (absent or malformed: logged
    once, and the caller falls back to default_config)."""
    path = os.path.join(config_dir, file_name)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            raw = json.load(f)
        table = {int(m): {k: int(cfg[k]) for k in CONFIG_KEYS} for m, cfg in raw.items()}
    except (OSError, ValueError, KeyError, TypeError) as e:
        logger.warning("Ignoring fused MoE config %s: %s", path, e)
        return None
    return table or None


@functools.cache
def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


@functools.lru_cache(maxsize=4096)
def get_config(
    M: int, E: int, N: int, top_k: int, dtype: torch.dtype, device: torch.device
) -> dict[str, int]:
    """The kernel configuration for M tokens: the tuned entry of the nearest batch size when
    a file for this shape and device ships, else default_config."""
    table = load_configs(config_file_name(E, N, top_k, dtype, device_name(device)), CONFIG_DIR)
    if table is None:
        return default_config(M, E, top_k)
    return table[min(table, key=lambda m: (abs(m - M), m))]
