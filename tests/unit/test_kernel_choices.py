"""Kernel picks kept across starts (layers/kernel_choices.py): shipped tables, the user's
cache, precedence, retuning, and files that cannot be read."""

from __future__ import annotations

import json

import pytest

from mini_sglang.layers import kernel_choices as kc


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty user cache and shipped folder, and no table read yet in this process."""
    monkeypatch.setenv("MINI_SGLANG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("MINI_SGLANG_KERNEL_RETUNE", raising=False)
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    monkeypatch.setattr(kc, "SHIPPED_DIR", str(shipped))
    monkeypatch.setattr(kc, "_tables", {})
    return tmp_path


def restart(monkeypatch) -> None:
    """What a new process sees: the tables are read from disk again."""
    monkeypatch.setattr(kc, "_tables", {})


def test_record_survives_a_restart_as_json(fresh, monkeypatch):
    assert kc.lookup("gemv", "Card_X", "M1|N8|K8|bfloat16|plain") is kc.MISSING
    kc.record("gemv", "Card_X", "M1|N8|K8|bfloat16|plain", [2, 2048, 8, 3])
    kc.record("gemv", "Card_X", "M2|N8|K8|bfloat16|plain", None)
    path = fresh / "cache" / "kernel_choices" / "gemv_Card_X.json"
    assert json.loads(path.read_text()) == {
        "M1|N8|K8|bfloat16|plain": [2, 2048, 8, 3],
        "M2|N8|K8|bfloat16|plain": None,
    }
    restart(monkeypatch)
    assert kc.lookup("gemv", "Card_X", "M1|N8|K8|bfloat16|plain") == [2, 2048, 8, 3]
    assert kc.lookup("gemv", "Card_X", "M2|N8|K8|bfloat16|plain") is None
    assert kc.lookup("gemv", "Card_Y", "M1|N8|K8|bfloat16|plain") is kc.MISSING


def test_cached_pick_wins_over_shipped_and_retune_ignores_both(fresh, monkeypatch):
    (fresh / "shipped" / "gemv_Card_X.json").write_text(json.dumps({"a": [1], "b": [2]}))
    kc.record("gemv", "Card_X", "b", [3])
    restart(monkeypatch)
    assert kc.lookup("gemv", "Card_X", "a") == [1]
    assert kc.lookup("gemv", "Card_X", "b") == [3]
    monkeypatch.setenv("MINI_SGLANG_KERNEL_RETUNE", "1")
    restart(monkeypatch)
    assert kc.lookup("gemv", "Card_X", "a") is kc.MISSING
    kc.record("gemv", "Card_X", "a", [4])  # a retune rewrites the cache from scratch
    cached = fresh / "cache" / "kernel_choices" / "gemv_Card_X.json"
    assert json.loads(cached.read_text()) == {"a": [4]}
    kc.record("gemv", "Card_X", "c", [6])  # ... and keeps every pick it makes
    assert json.loads(cached.read_text()) == {"a": [4], "c": [6]}


def test_unreadable_cache_is_ignored_and_rewritten(fresh, monkeypatch):
    cached = fresh / "cache" / "kernel_choices" / "gemv_Card_X.json"
    cached.parent.mkdir(parents=True)
    cached.write_text('{"a": [1')  # torn write
    assert kc.lookup("gemv", "Card_X", "a") is kc.MISSING
    kc.record("gemv", "Card_X", "a", [5])
    assert json.loads(cached.read_text()) == {"a": [5]}


def _shipped_tables(table: str) -> list[tuple[str, dict]]:
    """(path, contents) of each shipped kernel_configs/<table>_<card>.json; at least one,
    none empty."""
    import glob
    import os

    files = sorted(glob.glob(os.path.join(kc.SHIPPED_DIR, f"{table}_*.json")))
    assert files, f"no shipped {table} tables"
    tables = []
    for path in files:
        with open(path) as f:
            tables.append((path, json.load(f)))
        assert tables[-1][1], path
    return tables


def test_shipped_gemv_tables_name_current_candidates():
    """Every shipped pick is cuBLAS (null) or a Triton config among its variant's candidates
    (small_m_gemm.candidates: the FP8 variants add tensor-core configs), under a key
    small_m_gemm builds; a stale entry would be timed again at every start."""
    import re

    import torch

    from mini_sglang.layers.small_m_gemm import _choice_key, candidates

    key = re.compile(r"^M(1|2|4|8)\|N\d+\|K\d+\|(bfloat16|float16)\|[a-z0-9_]+(\+[a-z0-9_]+)*$")
    # the pattern admits every variant small_m_gemm builds, the FP8 ones included
    for variant in [(), ("silu_mul",), ("norm", "fp8"), ("residual", "fp8"), ("silu_mul", "fp8")]:
        assert key.match(_choice_key((8, 4096, 4096, torch.bfloat16, variant))), variant
    for path, table in _shipped_tables("gemv"):
        for name, value in table.items():
            assert key.match(name), (path, name)
            variant = name.rsplit("|", 1)[1]  # "plain" or "norm+fp8", ...
            allowed = candidates(() if variant == "plain" else tuple(variant.split("+")))
            assert value is None or tuple(value) in allowed, (path, name, value)


def test_shipped_expert_tile_tables_decode():
    """Every shipped entry of fused_moe_gemv's per-card expert tiles has a key card_key
    builds and a value its reader accepts (a stale entry would fall back to TUNED silently)."""
    import re

    import torch

    from mini_sglang.layers.moe import fused_moe_gemv as fmg

    dtypes = (torch.bfloat16, torch.float16, torch.float32)
    key = re.compile(
        r"^M(1|2|4)\|E\d+\|H\d+\|I\d+\|k\d+\|(bf16|fp16|fp32|fp8(-block)?\+words|fp8(-block)?)$"
    )
    for fmt in [fmg.card_format(q, d) for q in (None, "fp8", "fp8-block") for d in dtypes]:
        assert key.match(fmg.card_key(3, fmt, (128, 2048, 768, 8))), fmt
    for path, table in _shipped_tables(fmg.CARD_TABLE):
        for name, value in table.items():
            assert key.match(name), (path, name)
            config = fmg._decode_card_config(value)
            assert config is not None and fmg.encode_card_config(config) == value, (path, name)


def test_card_expert_tiles_win_over_tuned_and_lose_to_forced(fresh, monkeypatch):
    """fused_moe_gemv.default_config on a CUDA device reads the card's table for the batch's
    bucket, shape and format; another shape or bucket, a CPU tensor or an entry it cannot
    read gets the tuned tiles, and MINI_SGLANG_MOE_GEMV_TILES still wins."""
    import functools

    import torch

    from mini_sglang.layers.moe import fused_moe_gemv as fmg

    card = "Test_Card"
    monkeypatch.setattr(kc, "device_name", lambda device: card)
    # a cache of its own: the process-wide one would keep this test's fake card's entries
    monkeypatch.setattr(fmg, "_card_config", functools.cache(fmg._card_config.__wrapped__))
    qwen = (128, 2048, 768, 8)
    mine = fmg.SmallMConfig(fmg.GemvTiles(1, 2048, 1), fmg.GemvTiles(16, 128, 16, 3))
    table = {
        fmg.card_key(2, "bf16", qwen): fmg.encode_card_config(mine),
        fmg.card_key(1, "bf16", qwen): [[1, 2048, 1, None], [0, 128, 8, None]],  # block_n 0
    }
    (fresh / "shipped" / f"{fmg.CARD_TABLE}_{card}.json").write_text(json.dumps(table))
    cuda, bf16 = torch.device("cuda", 0), torch.bfloat16
    assert fmg.default_config(2, None, qwen, cuda, bf16) == mine
    assert fmg.default_config(2, None, qwen, torch.device("cpu"), bf16) == fmg.TUNED[2]
    assert fmg.default_config(2, None, (64, 2048, 768, 8), cuda, bf16) == fmg.TUNED[2]
    assert fmg.default_config(2, "fp8-block", qwen, cuda, bf16) != mine
    assert fmg.default_config(4, None, qwen, cuda, bf16) == fmg.TUNED[4]
    assert fmg.default_config(2, None, qwen, cuda, torch.float16) == fmg.TUNED[2]  # tuned for bf16
    assert fmg.default_config(1, None, qwen, cuda, bf16) == fmg.TUNED[1]  # unreadable: tuned
    monkeypatch.setattr(fmg, "_FORCED", fmg._parse_forced("2=4,512,4"))
    assert fmg.default_config(2, None, qwen, cuda, bf16) == fmg.SmallMConfig(
        fmg.GemvTiles(4, 512, 4), mine.down
    )
