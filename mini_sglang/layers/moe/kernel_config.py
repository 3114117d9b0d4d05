"""Tile sizes of the fused MoE kernel, per problem shape and batch size.

Tuned configurations ship as JSON files in `configs/` (written by
benchmarks/tune_fused_moe.py on the GPU): one file per (E, N, top-k, dtype, device) named
`E={E},N={N},topk={k},dtype={dtype},device_name={name}.json`, where E is the number of
experts a rank holds, N its intermediate size per expert (after TP) and name the CUDA device
name with spaces as underscores (FP8 experts: dtype=float8_e4m3fn, and block-wise scales
add `,block_shape=[bn,bk]` before the device). Each file maps a batch size M (tokens, as a string) to
{"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps",
"num_stages"}, the tiles of both grouped GEMMs, optionally with "down": the same keys but
BLOCK_SIZE_M, for the second GEMM (w2) where its best tiles differ from the first's (its K
is the intermediate size, the first's the hidden size; both share BLOCK_SIZE_M, as they
share one alignment of the pairs into blocks). SGLang's files have no "down"; ours are named
apart (topk=, dtype=) so neither reads the other's. A batch takes the entry of the nearest
M. Without a file the heuristic `default_config` is used, so a missing or unreadable file
only costs speed.
MINI_SGLANG_MOE_CONFIG_DIR names a folder searched first (a card or shape tuned locally).
"""

from __future__ import annotations

import functools
import json
import logging
import os

import torch

from mini_sglang.environ import envs

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
# what a "down" entry may set: every key but the block rows the two GEMMs share
DOWN_KEYS = CONFIG_KEYS[1:]


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def config_file_name(
    E: int,
    N: int,
    top_k: int,
    dtype: torch.dtype,
    device_name: str,
    block_shape: tuple[int, int] | None = None,
) -> str:
    """The file of one shape: dtype is the GEMMs' (float8_e4m3fn for FP8 experts), and
    block-wise FP8 scales add `,block_shape=[bn,bk]` (their K tiles must divide bk)."""
    block = "" if block_shape is None else f",block_shape=[{block_shape[0]},{block_shape[1]}]"
    return (
        f"E={E},N={N},topk={top_k},dtype={dtype_name(dtype)}{block},"
        f"device_name={device_name.replace(' ', '_')}.json"
    )


def default_config(M: int, E: int, top_k: int) -> dict[str, int]:
    """The heuristic, by the pairs an expert gets on average (M * top_k / E): block rows
    that few pairs fill (decode: 16-row blocks, wide K tiles; the GEMMs are bound by reading
    the touched experts' weights), larger square tiles and grouped block order (L2 reuse)
    as batches grow. Every choice keeps the first GEMM's shared memory (stages x (A tile +
    gate and up tiles), bf16) under 160 KB, so it launches on A100, H100 and H200 alike."""
    per_expert = M * top_k / E
    if per_expert <= 16:
        bm, bn, bk, group, warps, stages = 16, 64, 128, 1, 4, 4
    elif per_expert <= 48:
        bm, bn, bk, group, warps, stages = 32, 64, 128, 8, 4, 3
    elif per_expert <= 128:
        bm, bn, bk, group, warps, stages = 64, 128, 64, 8, 4, 3
    else:
        bm, bn, bk, group, warps, stages = 128, 128, 64, 16, 8, 3
    return dict(
        BLOCK_SIZE_M=bm,
        BLOCK_SIZE_N=bn,
        BLOCK_SIZE_K=bk,
        GROUP_SIZE_M=group,
        num_warps=warps,
        num_stages=stages,
    )


@functools.cache
def load_configs(file_name: str, config_dir: str) -> dict[int, dict] | None:
    """The tuned table {M: config} of one shipped file, or None (absent or malformed: logged
    once, and the caller falls back to default_config)."""
    path = os.path.join(config_dir, file_name)
    if not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            raw = json.load(f)
        table = {int(m): _parse_entry(cfg) for m, cfg in raw.items()}
    except (OSError, ValueError, KeyError, TypeError) as e:
        logger.warning("Ignoring fused MoE config %s: %s", path, e)
        return None
    if table:
        logger.info("Using fused MoE kernel configs from %s", path)
    return table or None


def _parse_entry(cfg: dict) -> dict:
    entry: dict = {k: int(cfg[k]) for k in CONFIG_KEYS}
    if "down" in cfg:
        entry["down"] = {k: int(cfg["down"][k]) for k in DOWN_KEYS}
    return entry


def gemm_configs(config: dict) -> tuple[dict[str, int], dict[str, int]]:
    """(first GEMM's, second GEMM's) flat tile sizes of one entry: the second takes the
    entry's "down" keys over the first's, e.g. {"BLOCK_SIZE_M": 32, "BLOCK_SIZE_N": 64, ...,
    "down": {"BLOCK_SIZE_N": 128, ...}} runs w2 with 128-column tiles of 32-row blocks. An
    entry without "down" is returned as both, uncopied (it runs per eager forward)."""
    if "down" not in config:
        return config, config
    first = {k: v for k, v in config.items() if k != "down"}
    return first, {**first, **config["down"]}


def config_dirs() -> tuple[str, ...]:
    """Where tuned files are looked up, in order: MINI_SGLANG_MOE_CONFIG_DIR (if set), then
    the shipped CONFIG_DIR."""
    override = envs.MINI_SGLANG_MOE_CONFIG_DIR.get()
    if override and not os.path.isdir(override):
        _warn_missing_dir(override)
    return tuple(d for d in (override, CONFIG_DIR) if d)


@functools.cache
def _warn_untuned(name: str, dirs: tuple[str, ...]) -> None:
    """Once per shape and card, as SGLang warns: the heuristic tiles serve, often slower."""
    logger.warning(
        "Using the default fused MoE kernel config; performance might be sub-optimal. No %s "
        "in %s: tune one with benchmarks/tune_fused_moe.py (docs/moe.md)",
        name,
        " or ".join(dirs),
    )


@functools.cache
def _warn_missing_dir(path: str) -> None:
    logger.warning("MINI_SGLANG_MOE_CONFIG_DIR=%s is not a folder; using the shipped configs", path)


@functools.cache
def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


@functools.lru_cache(maxsize=4096)
def get_config(
    M: int,
    E: int,
    N: int,
    top_k: int,
    dtype: torch.dtype,
    device: torch.device,
    block_shape: tuple[int, int] | None = None,
) -> dict:
    """The kernel configuration for M tokens (a file entry: see gemm_configs): the tuned
    entry of the nearest batch size from the first file for this shape and device in
    config_dirs(), else default_config. Cached: callers must not modify it."""
    name = config_file_name(E, N, top_k, dtype, device_name(device), block_shape)
    dirs = config_dirs()
    table = next(filter(None, (load_configs(name, d) for d in dirs)), None)
    if table is None:
        _warn_untuned(name, dirs)
        return default_config(M, E, top_k)
    return table[min(table, key=lambda m: (abs(m - M), m))]
