"""The MoE layer's pieces against the torch reference (layers/moe/).

- router: the one-program Triton top-k softmax equals torch's (softmax, topk, renormalise);
- moe_align_block_size: the Triton version equals the torch one, which satisfies the
  contract (every kept pair once, grouped by expert, groups block-aligned);
- the fused grouped-GEMM path equals fused_experts_torch across expert counts, top-k, batch
  sizes 1.. (experts left empty) and dropped (other-rank) pairs;
- FusedMoE's TP and EP splits: the ranks' partial outputs sum to the unsplit layer's, for the
  checkpoint loader (weight_loader per expert) and the dummy loader (load_full);
- the kernel-config lookup: nearest tuned batch size, clean fallback without or with a bad
  file;
- FP8 experts (w8a8): the kernel with per-channel and block-wise scales equals the torch
  reference on the dequantized weights with the same activation quantization (batch 1,
  empty experts, dropped pairs), and FusedMoE with the FP8 method loads online, per-tensor
  and block-wise checkpoint tensors into that function, split over TP / EP ranks;
- the small-batch GEMV path (fused_moe_gemv) equals the same references, bf16-free and FP8,
  top-2 and top-8, with dropped pairs, and fused_experts_triton sends a batch there exactly
  when MINI_SGLANG_MOE_SMALL_M's threshold allows.

Without CUDA the kernels run in Triton's interpreter (TRITON_INTERPRET=1, set by conftest
before triton is imported) on tiny shapes; with CUDA the same tests run compiled.
"""

from __future__ import annotations

import functools
import json
import logging
import os

import pytest
import torch

pytest.importorskip("triton")

from mini_sglang.distributed import parallel_state  # noqa: E402
from mini_sglang.environ import envs  # noqa: E402
from mini_sglang.layers.moe import fused_moe_gemv, kernel_config  # noqa: E402
from mini_sglang.layers.moe.align import (  # noqa: E402
    moe_align_block_size_torch,
    moe_align_block_size_triton,
)
from mini_sglang.layers.moe.experts_torch import fused_experts_torch  # noqa: E402
from mini_sglang.layers.moe.fused_moe_gemv import (  # noqa: E402
    GemvTiles,
    SmallMConfig,
    fused_experts_gemv,
)
from mini_sglang.layers.moe.fused_moe_triton import (  # noqa: E402
    Fp8Experts,
    fused_experts_triton,
    moe_sum,
)
from mini_sglang.layers.moe.layer import FusedMoE  # noqa: E402
from mini_sglang.layers.moe.router import select_experts_torch, select_experts_triton  # noqa: E402
from mini_sglang.layers.quantization.fp8 import Fp8Config  # noqa: E402
from mini_sglang.layers.quantization.fp8_kernels import (  # noqa: E402
    FP8_DTYPE,
    dequantize_blocks,
    dequantize_rows,
    quantize_blocks,
    quantize_rows,
    quantize_tensor,
)
from mini_sglang.layers.quantization.fp8_moe import (  # noqa: E402
    qdq_activations,
    quantize_activations,
    quantize_activations_in,
)
from mini_sglang.layers.quantization.methods import QuantSpec  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TILES = dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=16, BLOCK_SIZE_K=16, GROUP_SIZE_M=2)


def _ids(tokens: int, experts: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """Distinct experts per token (as top-k gives), drawn from the first experts only when
    there are few tokens, so some experts get no pair."""
    return torch.stack([torch.randperm(experts, generator=gen)[:k] for _ in range(tokens)]).to(
        torch.int32
    )


TIES = {12: ([3, 9], [2, 5, 7]), 40: ([9, 33], [2, 21, 37])}


def _tied_logits(gen: torch.Generator, experts: int) -> torch.Tensor:
    """Five rows of logits of 12 or 40 experts; row 1 ties the experts TIES[e][0] for first
    place and row 2 ties TIES[e][1] below expert 0, so the lower index must win each tie."""
    first, second = TIES[experts]
    logits = torch.randn(5, experts, generator=gen)
    logits[1, first] = 5.0
    logits[2, 0] = 6.0
    logits[2, second] = 4.0
    return logits


@pytest.mark.parametrize("experts", [12, 40])
@pytest.mark.parametrize("k", [3, 4])
@pytest.mark.parametrize("renormalize", [True, False])
def test_router_triton_matches_torch(renormalize: bool, k: int, experts: int) -> None:
    """The one-warp argmax rounds (any k, not only powers of two; 40 experts padded to 64)
    pick torch.topk's experts in its order, ties to the lower index."""
    logits = _tied_logits(torch.Generator().manual_seed(0), experts).to(DEVICE)
    ref_w, ref_ids = select_experts_torch(logits, k, renormalize)
    w, ids = select_experts_triton(logits, k, renormalize)
    assert torch.equal(ids, ref_ids)
    first, second = TIES[experts]
    assert ids[1, :2].tolist() == first[:2] and ids[2, 1:3].tolist() == second[:2]
    torch.testing.assert_close(w, ref_w, atol=1e-6, rtol=1e-6)
    untied = [0, 3, 4]  # where torch.topk's order is defined, it is the same
    topk_ids = torch.topk(logits.float(), k, dim=-1).indices.to(torch.int32)
    assert torch.equal(ids[untied], topk_ids[untied])
    assert torch.allclose(w.sum(-1), torch.ones(5, device=DEVICE)) == renormalize


# (tokens, experts, k, block): one chunk of pairs; then 5, 28 and 75 chunks of 64 (the
# counts read in blocks of 16 chunks), with Qwen2-MoE's 60 and Qwen3-MoE's 128 experts
ALIGN_ONE_CHUNK = [(1, 8, 2, 16), (6, 5, 2, 4), (9, 16, 4, 16)]
ALIGN_CHUNKS = [(40, 16, 8, 16), (220, 60, 8, 32), (600, 128, 8, 64)]


# (chunk, sub, warps) forced: large chunks ranked SUB pairs at a time (launch_shape picks
# them only above 8,192 pairs), and a chunk ranked by comparison that a tail leaves partial
ALIGN_SHAPES = [(600, 128, 8, 64, (256, 64, 8)), (220, 60, 8, 32, (512, 32, 8))]
ALIGN_SHAPES += [(33, 16, 8, 16, (128, 0, 4))]


@pytest.mark.parametrize(
    "tokens,experts,k,block,shape",
    [(*case, None) for case in ALIGN_ONE_CHUNK + ALIGN_CHUNKS] + ALIGN_SHAPES,
)
def test_align_block_size(tokens: int, experts: int, k: int, block: int, shape) -> None:
    gen = torch.Generator().manual_seed(tokens)
    ids = _ids(tokens, experts, k, gen)
    ids[0, 0] = -1  # a pair of an expert another rank holds
    ids = ids.to(DEVICE)
    ref = moe_align_block_size_torch(ids, block, experts)
    got = moe_align_block_size_triton(ids, block, experts, shape=shape)
    for a, b in zip(ref, got):
        assert torch.equal(a, b)
    sorted_ids, expert_ids, post_pad = (t.cpu() for t in ref)
    n = ids.numel()
    flat = ids.reshape(-1).cpu()
    end = int(post_pad)
    assert end % block == 0 and sorted_ids.numel() % block == 0
    kept = sorted_ids[sorted_ids < n]
    assert sorted(kept.tolist()) == [i for i in range(n) if flat[i] >= 0]
    assert (sorted_ids[end:] == n).all()
    for b in range(end // block):
        rows = sorted_ids[b * block : (b + 1) * block]
        rows = rows[rows < n]
        assert (flat[rows.long()] == expert_ids[b]).all() and rows.tolist() == sorted(rows.tolist())
    assert (expert_ids[end // block :] == -1).all()
    assert expert_ids[: end // block].tolist() == sorted(expert_ids[: end // block].tolist())


@pytest.mark.parametrize(
    "tokens,experts,k,hidden,inter",
    [(1, 8, 2, 32, 16), (3, 4, 1, 16, 48), (5, 16, 4, 16, 16)],
)
def test_fused_experts_match_reference(tokens, experts, k, hidden, inter) -> None:
    gen = torch.Generator().manual_seed(experts)
    x = torch.randn(tokens, hidden, generator=gen)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) * 0.2
    w2 = torch.randn(experts, hidden, inter, generator=gen) * 0.2
    weights = torch.rand(tokens, k, generator=gen)
    ids = _ids(tokens, experts, k, gen)
    x, w13, w2, weights, ids = (t.to(DEVICE) for t in (x, w13, w2, weights, ids))
    ref = fused_experts_torch(x, w13, w2, weights, ids)
    out = fused_experts_triton(x, w13, w2, weights, ids, config=TILES)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    dropped = torch.where(ids % 2 == 1, -1, ids)
    ref = fused_experts_torch(x, w13, w2, weights, dropped)
    out = fused_experts_triton(x, w13, w2, weights, dropped, dropped_pairs=True, config=TILES)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    # A "down" entry: w2's GEMM on its own tiles over the same 16-row blocks
    split = dict(TILES, down=dict(BLOCK_SIZE_N=32, BLOCK_SIZE_K=16, GROUP_SIZE_M=1,
                                  num_warps=4, num_stages=2))  # fmt: skip
    out = fused_experts_triton(x, w13, w2, weights, dropped, dropped_pairs=True, config=split)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("k", [1, 8])
def test_moe_sum_matches_torch_in_bf16(k: int) -> None:
    """moe_sum: a token's k rows summed in fp32 and rounded once, as torch's sum over them,
    over a hidden size no block divides; with a residual the rounded sum is added into it in
    place. Within one bf16 step: the summation order may differ, and Triton's interpreter
    truncates where the GPU rounds to nearest."""
    gen = torch.Generator().manual_seed(k)
    src = torch.randn(3 * k, 1500, generator=gen).to(DEVICE, torch.bfloat16)
    want = src.view(3, k, 1500).sum(dim=1)
    torch.testing.assert_close(moe_sum(src, k), want, atol=0, rtol=2**-7)
    residual = torch.randn(3, 1500, generator=gen).to(DEVICE, torch.bfloat16)
    base, want = residual.float(), want.float()
    assert moe_sum(src, k, residual) is residual
    # two roundings (the sum's, then the add's), each within one step of its value
    bound = 2**-7 * (want.abs() + (base + want).abs()) + 1e-6
    assert ((residual.float() - (base + want)).abs() <= bound).all()


def _set_rank(monkeypatch, rank: int, tp: int, ep: int) -> None:
    """Build the next layer as TP rank `rank` of `tp` with `ep` expert groups (the layer
    reads its split from the TP group state when it is built)."""
    monkeypatch.setattr(parallel_state, "_TP", parallel_state.TPGroup(rank, tp))
    parallel_state.set_expert_parallel_size(ep)


@pytest.mark.parametrize("tp,ep", [(2, 1), (2, 2), (4, 2)])
@pytest.mark.parametrize("loader", ["checkpoint", "full"])
def test_tp_and_ep_splits_sum_to_the_whole(monkeypatch, tp: int, ep: int, loader: str) -> None:
    E, k, H, inter, T = 4, 2, 16, 8, 5
    gen = torch.Generator().manual_seed(tp * 10 + ep)
    gate = torch.randn(E, inter, H, generator=gen)
    up = torch.randn(E, inter, H, generator=gen)
    down = torch.randn(E, H, inter, generator=gen)
    x = torch.randn(T, H, generator=gen)
    logits = torch.randn(T, E, generator=gen)

    def build(rank: int, size: int, groups: int) -> FusedMoE:
        _set_rank(monkeypatch, rank, size, groups)
        layer = FusedMoE(E, k, H, inter, renormalize=True, reduce_results=False)
        if loader == "full":
            layer.load_full(layer.w13_weight, torch.cat([gate, up], dim=1))
            layer.load_full(layer.w2_weight, down)
            return layer
        for e in range(E):
            layer.weight_loader(layer.w13_weight, gate[e], "w1", e)
            layer.weight_loader(layer.w13_weight, up[e], "w3", e)
            layer.weight_loader(layer.w2_weight, down[e], "w2", e)
        return layer

    whole = build(0, 1, 1)(x, logits)
    parts = [build(r, tp, ep) for r in range(tp)]
    assert parts[0].num_local_experts == E // ep
    assert parts[0].intermediate_per_partition == inter * ep // tp
    total = sum(p(x, logits) for p in parts)
    torch.testing.assert_close(total, whole, atol=1e-5, rtol=1e-5)
    monkeypatch.setattr(parallel_state, "_TP", parallel_state.TPGroup())


def test_expert_params_mapping_names() -> None:
    mapping = FusedMoE.make_expert_params_mapping("w1", "w2", "w3", 2)
    assert ("experts.w13_", "experts.1.w3.", 1, "w3") in mapping
    assert ("experts.w2_", "experts.0.w2.", 0, "w2") in mapping
    assert len(mapping) == 6


def test_kernel_config_lookup_and_fallback(tmp_path, monkeypatch, caplog) -> None:
    name = kernel_config.config_file_name(8, 32, 2, torch.bfloat16, "NVIDIA H200")
    assert name == "E=8,N=32,topk=2,dtype=bfloat16,device_name=NVIDIA_H200.json"
    fp8 = kernel_config.config_file_name(8, 32, 2, torch.float8_e4m3fn, "H", (128, 128))
    assert fp8 == "E=8,N=32,topk=2,dtype=float8_e4m3fn,block_shape=[128,128],device_name=H.json"
    tuned = {
        "1": dict(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=64, GROUP_SIZE_M=1,
                  num_warps=4, num_stages=3),
        "64": dict(BLOCK_SIZE_M=32, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64, GROUP_SIZE_M=8,
                   num_warps=8, num_stages=2),
    }  # fmt: skip
    (tmp_path / name).write_text(json.dumps(tuned))
    table = kernel_config.load_configs(name, str(tmp_path))
    assert table[1]["BLOCK_SIZE_N"] == 32 and table[64]["num_warps"] == 8
    assert kernel_config.gemm_configs(table[64]) == (tuned["64"], tuned["64"])
    # A "down" entry sets the second GEMM's tiles; its block rows stay the first's
    down = dict(BLOCK_SIZE_N=128, BLOCK_SIZE_K=32, GROUP_SIZE_M=1, num_warps=4, num_stages=3)
    (tmp_path / "split.json").write_text(json.dumps({"8": dict(tuned["64"], down=down)}))
    first, second = kernel_config.gemm_configs(
        kernel_config.load_configs("split.json", str(tmp_path))[8]
    )
    assert first == tuned["64"] and second == dict(down, BLOCK_SIZE_M=32)
    (tmp_path / "bad_down.json").write_text(
        json.dumps({"8": dict(tuned["64"], down={"num_warps": 4})})
    )
    assert kernel_config.load_configs("bad_down.json", str(tmp_path)) is None
    (tmp_path / "bad.json").write_text("{not json")
    assert kernel_config.load_configs("bad.json", str(tmp_path)) is None
    assert kernel_config.load_configs("absent.json", str(tmp_path)) is None
    # Nearest batch size; without a shipped file, the heuristic default.
    monkeypatch.setattr(kernel_config, "CONFIG_DIR", str(tmp_path))
    kernel_config.load_configs.cache_clear()
    kernel_config.get_config.cache_clear()
    monkeypatch.setattr(kernel_config, "device_name", lambda device: "NVIDIA H200")
    cfg = kernel_config.get_config(40, 8, 32, 2, torch.bfloat16, torch.device("cpu"))
    assert cfg == tuned["64"]
    with caplog.at_level(logging.WARNING, logger="mini_sglang"):
        for m in (40, 41):  # no file for N=64: the heuristic, and one warning naming the file
            cfg = kernel_config.get_config(m, 8, 64, 2, torch.bfloat16, torch.device("cpu"))
            assert cfg == kernel_config.default_config(m, 8, 2)
    warned = [r.getMessage() for r in caplog.records if "default fused MoE" in r.getMessage()]
    assert len(warned) == 1 and "E=8,N=64,topk=2,dtype=bfloat16" in warned[0], warned
    # MINI_SGLANG_MOE_CONFIG_DIR: its file wins over the shipped one; a card (or shape) it
    # lacks still finds the shipped file, as does a folder that does not exist
    local = tmp_path / "local"
    local.mkdir()
    (local / name).write_text(json.dumps({"64": tuned["1"]}))
    monkeypatch.setenv("MINI_SGLANG_MOE_CONFIG_DIR", str(local))
    kernel_config.get_config.cache_clear()
    assert kernel_config.get_config(40, 8, 32, 2, torch.bfloat16, torch.device("cpu")) == tuned["1"]
    monkeypatch.setattr(kernel_config, "device_name", lambda device: "NVIDIA H100")
    kernel_config.get_config.cache_clear()
    (tmp_path / name.replace("H200", "H100")).write_text(json.dumps(tuned))
    assert (
        kernel_config.get_config(40, 8, 32, 2, torch.bfloat16, torch.device("cpu")) == tuned["64"]
    )
    monkeypatch.setenv("MINI_SGLANG_MOE_CONFIG_DIR", str(tmp_path / "absent"))
    monkeypatch.setattr(kernel_config, "device_name", lambda device: "NVIDIA H200")
    kernel_config.get_config.cache_clear()
    assert (
        kernel_config.get_config(40, 8, 32, 2, torch.bfloat16, torch.device("cpu")) == tuned["64"]
    )
    kernel_config.load_configs.cache_clear()
    kernel_config.get_config.cache_clear()


def test_shipped_kernel_configs_load() -> None:
    """Every tuned file that ships parses (a malformed one would fall back to the defaults
    silently) and covers the tuner's batch sizes, with the tile sizes the kernel accepts."""
    names = sorted(f for f in os.listdir(kernel_config.CONFIG_DIR) if f.endswith(".json"))
    for card in ("NVIDIA_H100_80GB_HBM3", "NVIDIA_H200"):
        for shape in (
            "E=128,N=768,topk=8,dtype=bfloat16",  # Qwen3-30B-A3B at tp 1
            "E=128,N=384,topk=8,dtype=bfloat16",  # at tp 2
            "E=128,N=768,topk=8,dtype=float8_e4m3fn",  # its experts with --quantization fp8
        ):
            assert f"{shape},device_name={card}.json" in names
    assert "E=8,N=14336,topk=2,dtype=bfloat16,device_name=NVIDIA_H200.json" in names  # Mixtral
    # Mixtral-8x7B at tp 2, as it is served on two H100s
    assert "E=8,N=7168,topk=2,dtype=bfloat16,device_name=NVIDIA_H100_80GB_HBM3.json" in names
    block = "E=128,N=768,topk=8,dtype=float8_e4m3fn,block_shape=[128,128]"  # Qwen3-30B-A3B-FP8
    for card in ("NVIDIA_H100_80GB_HBM3", "NVIDIA_H200"):
        assert f"{block},device_name={card}.json" in names
    for name in names:
        table = kernel_config.load_configs(name, kernel_config.CONFIG_DIR)
        assert table is not None, name
        assert {1, 8, 64, 256, 4096} <= set(table), name
        for entry in table.values():
            for cfg in kernel_config.gemm_configs(entry):
                assert all(cfg[k] & (cfg[k] - 1) == 0 for k in ("BLOCK_SIZE_M", "BLOCK_SIZE_N",
                                                                  "BLOCK_SIZE_K"))  # fmt: skip


# ---- FP8 experts ---------------------------------------------------------------------------
FP8_BLOCK = (16, 16)


def _fp8_experts(w: torch.Tensor, block: tuple[int, int] | None):
    """Per-expert FP8 quantization of stacked weights [E, N, K] -> (values, scales,
    dequantized float32)."""
    pairs = [quantize_rows(e) if block is None else quantize_blocks(e, block) for e in w]
    q = torch.stack([p[0] for p in pairs])
    s = torch.stack([p[1] for p in pairs])
    if block is None:
        deq = torch.stack([dequantize_rows(a, b) for a, b in pairs])
    else:
        deq = torch.stack([dequantize_blocks(a, b, block) for a, b in pairs])
    return q, s, deq


def _fp8_problem(
    tokens: int,
    block: tuple[int, int] | None,
    experts: int = 8,
    k: int = 2,
    act_quant: bool = True,
    fp8_values: bool = False,
):
    """(x, w13 FP8, w2 FP8, weights, ids, Fp8Experts, reference(ids) -> [tokens, H]) on
    DEVICE: the reference is fused_experts_torch on the dequantized weights, with the
    grouped kernel's activation quantization where act_quant (the GEMV path reads the
    activations unquantized). hidden 40: a short last group of columns. On the CPU the
    weights are float32 tensors holding the FP8 values, unless fp8_values (for the GEMV
    kernels' integer decoding, which reads them as int32 words)."""
    hidden, inter = 40, 32
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, hidden, generator=gen)
    w13q, w13s, w13d = _fp8_experts(torch.randn(experts, 2 * inter, hidden, generator=gen), block)
    w2q, w2s, w2d = _fp8_experts(torch.randn(experts, hidden, inter, generator=gen), block)
    weights = torch.rand(tokens, k, generator=gen)
    ids = _ids(tokens, experts, k, gen)  # batch 1: most experts get no pair
    group = block[1] if block is not None else None

    def reference(case: torch.Tensor) -> torch.Tensor:
        qdq = functools.partial(qdq_activations, group=group) if act_quant else None
        return fused_experts_torch(x, w13d, w2d, weights, case, act_qdq=qdq)

    # the interpreter has no FP8: the FP8 values in float32, as pre-sm89 GPUs get them
    quantize = (
        quantize_activations
        if DEVICE.type == "cuda"
        else functools.partial(quantize_activations_in, dtype=torch.float32)
    )
    if DEVICE.type == "cpu" and not fp8_values:
        w13q, w2q = w13q.float(), w2q.float()
    fp8 = Fp8Experts(w13s.to(DEVICE), w2s.to(DEVICE), block, quantize)
    on_device = (t.to(DEVICE) for t in (x, w13q, w2q, weights, ids))
    return *on_device, fp8, reference


needs_fp8 = pytest.mark.skipif(
    DEVICE.type == "cuda" and torch.cuda.get_device_capability() < (8, 9),
    reason="FP8 Triton kernels need sm89+",
)


# compiled tl.dot needs K tiles of at least 32 for FP8 operands, so blocks of 32 columns
FP8_TILES = dict(TILES, BLOCK_SIZE_K=32)


@needs_fp8
@pytest.mark.parametrize("block", [None, (32, 32)], ids=["channel", "block"])
@pytest.mark.parametrize("tokens", [1, 5])
def test_fp8_fused_experts_match_dequantized_reference(block, tokens) -> None:
    x, w13q, w2q, weights, ids, fp8, reference = _fp8_problem(tokens, block)
    for case in (ids, torch.where(ids % 2 == 1, -1, ids)):  # all pairs, then some dropped
        out = fused_experts_triton(
            x, w13q, w2q, weights, case, dropped_pairs=True, config=FP8_TILES, fp8=fp8
        )
        torch.testing.assert_close(out.cpu(), reference(case.cpu()), atol=1e-4, rtol=1e-4)


def _checkpoint_tensor(fmt: str, w: torch.Tensor):
    """(checkpoint tensor, its scale or None, the dequantized weight the layer must use)."""
    if fmt == "online":
        return w, None, dequantize_rows(*quantize_rows(w))
    if fmt == "tensor":
        q, s = quantize_tensor(w)
        return q, s, q.float() * s
    q, s = quantize_blocks(w, FP8_BLOCK)
    return q, s, dequantize_blocks(q, s, FP8_BLOCK)


FP8_SPECS = {
    "online": QuantSpec("fp8"),
    "tensor": QuantSpec("fp8", checkpoint_fp8=True),
    "block": QuantSpec("fp8", checkpoint_fp8=True, weight_block_size=FP8_BLOCK),
}


@pytest.mark.parametrize("fmt,tp,ep", [("online", 2, 2), ("tensor", 2, 2), ("block", 2, 1)])
def test_fp8_layer_loads_each_format_and_splits(monkeypatch, fmt: str, tp: int, ep: int) -> None:
    """The unsplit FP8 layer computes the reference on the dequantized checkpoint weights;
    the ranks' partial outputs sum to it (block-wise: the intermediate dimension split in
    whole blocks, so each rank's activation groups are the unsplit layer's)."""
    E, k, H, inter, T = 4, 2, 40, 32, 5
    gen = torch.Generator().manual_seed(len(fmt))
    ckpt = {
        (e, shard): _checkpoint_tensor(fmt, torch.randn(shape, generator=gen))
        for e in range(E)
        for shard, shape in (("w1", (inter, H)), ("w3", (inter, H)), ("w2", (H, inter)))
    }
    x = torch.randn(T, H, generator=gen)
    logits = torch.randn(T, E, generator=gen)
    scale_name = "weight_scale_inv" if fmt == "block" else "weight_scale"

    def build(rank: int, size: int, groups: int) -> FusedMoE:
        _set_rank(monkeypatch, rank, size, groups)
        config = Fp8Config(FP8_SPECS[fmt])
        layer = FusedMoE(E, k, H, inter, True, reduce_results=False, quant_config=config)
        for (e, shard), (tensor, scale, _) in ckpt.items():
            part = "w2_" if shard == "w2" else "w13_"
            layer.weight_loader(getattr(layer, part + "weight"), tensor, shard, e)
            if scale is not None:
                layer.weight_loader(getattr(layer, part + scale_name), scale, shard, e)
        return layer

    whole = build(0, 1, 1)
    assert whole.w13_weight.dtype == whole.w2_weight.dtype == FP8_DTYPE
    w13 = torch.stack([torch.cat([ckpt[e, "w1"][2], ckpt[e, "w3"][2]]) for e in range(E)])
    w2 = torch.stack([ckpt[e, "w2"][2] for e in range(E)])
    group = FP8_BLOCK[1] if fmt == "block" else None
    weights, ids = select_experts_torch(logits, k, True)
    ref = fused_experts_torch(x, w13, w2, weights, ids, act_qdq=lambda t: qdq_activations(t, group))
    out = whole(x, logits)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    # FP8 changed the function: the unquantized activations give another result
    plain = fused_experts_torch(x, w13, w2, weights, ids)
    assert (plain - ref).abs().max() > 100 * 1e-5
    parts = [build(r, tp, ep) for r in range(tp)]
    total = sum(p(x, logits) for p in parts)
    torch.testing.assert_close(total, out, atol=1e-4, rtol=1e-5)
    monkeypatch.setattr(parallel_state, "_TP", parallel_state.TPGroup())


# ---- the small-batch GEMV path -------------------------------------------------------------
# Small tiles keep the interpreter's program count low; the 16-wide K tiles of kernel 1 run
# several steps over hidden 40 (a short last one), kernel 2's one step covers inter 16..32
# (launched with an explicit num_stages).
GEMV_TILES = SmallMConfig(GemvTiles(16, 16, 4), GemvTiles(16, 32, 4, 2))


@pytest.mark.parametrize(
    "tokens,experts,k,hidden,inter",
    [(1, 8, 2, 40, 16), (3, 16, 8, 32, 24), (3, 8, 2, 40, 32), (1, 8, 3, 32, 16)],
)
def test_small_m_gemv_matches_reference(tokens, experts, k, hidden, inter) -> None:
    """Both kernels against fused_experts_torch (top-3: kernel 2 pads the token's experts to
    4 slots); then with one token's first pair and every odd expert's pairs dropped (EP),
    which must add nothing."""
    gen = torch.Generator().manual_seed(tokens * experts + k)
    x = torch.randn(tokens, hidden, generator=gen)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) * 0.2
    w2 = torch.randn(experts, hidden, inter, generator=gen) * 0.2
    weights = torch.rand(tokens, k, generator=gen)
    ids = _ids(tokens, experts, k, gen)
    x, w13, w2, weights, ids = (t.to(DEVICE) for t in (x, w13, w2, weights, ids))
    dropped = torch.where(ids % 2 == 1, -1, ids)
    dropped[0, 0] = -1
    for case in (ids, dropped):
        ref = fused_experts_torch(x, w13, w2, weights, case)
        out = fused_experts_gemv(x, w13, w2, weights, case, config=GEMV_TILES)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_experts_add_into_the_residual() -> None:
    """With a residual, both Triton paths (the GEMV's down kernel adding in its epilogue, the
    grouped path after its sum) and FusedMoE.forward add the experts' output into it in
    place and return it; dropped pairs still add nothing."""
    gen = torch.Generator().manual_seed(5)
    tokens, experts, k, hidden, inter = 3, 8, 2, 40, 16
    x = torch.randn(tokens, hidden, generator=gen)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=gen) * 0.2
    w2 = torch.randn(experts, hidden, inter, generator=gen) * 0.2
    weights = torch.rand(tokens, k, generator=gen)
    ids = _ids(tokens, experts, k, gen)
    base = torch.randn(tokens, hidden, generator=gen)
    x, w13, w2, weights, ids, base = (t.to(DEVICE) for t in (x, w13, w2, weights, ids, base))
    dropped = torch.where(ids % 2 == 1, -1, ids)
    for case in (ids, dropped):
        want = base + fused_experts_torch(x, w13, w2, weights, case)
        residual = base.clone()
        got = fused_experts_gemv(x, w13, w2, weights, case, config=GEMV_TILES, residual=residual)
        assert got is residual
        torch.testing.assert_close(residual, want, atol=1e-5, rtol=1e-5)
        residual = base.clone()
        grouped = fused_experts_triton(
            x, w13, w2, weights, case, dropped_pairs=True, config=TILES, residual=residual
        )
        assert grouped is residual
        torch.testing.assert_close(residual, want, atol=1e-5, rtol=1e-5)
    layer = FusedMoE(experts, k, hidden, inter, renormalize=True).to(DEVICE)
    with torch.no_grad():
        layer.w13_weight.copy_(w13)
        layer.w2_weight.copy_(w2)
    logits = torch.randn(tokens, experts, generator=gen).to(DEVICE)
    residual = base.clone()
    assert layer(x, logits, residual=residual) is residual
    torch.testing.assert_close(residual, base + layer(x, logits), atol=1e-5, rtol=1e-5)


def test_small_m_threshold_selects_the_gemv_path(monkeypatch) -> None:
    """Batches of up to 4 tokens by default; with a threshold, fused_experts_triton (no
    config) returns exactly the GEMV path's result for batches up to it, launched with the
    tiles tuned for the batch's bucket (bf16/fp16 and block-wise FP8 experts, the latter for
    the weights' decoding: int32 words by default, MINI_SGLANG_FP8_GEMV_INT_DECODE=0 Triton's
    cast), per-channel FP8 experts' under the decoding beyond one token, or the default tiles
    (per-channel FP8 at one token, or under the cast), unless MINI_SGLANG_MOE_GEMV_TILES forces
    a bucket's."""
    assert envs.MINI_SGLANG_MOE_SMALL_M.default == 4
    assert envs.MINI_SGLANG_FP8_GEMV_INT_DECODE.default is True
    monkeypatch.setattr(fused_moe_gemv, "_DECODE_E4M3", False)
    cast = fused_moe_gemv.default_config(1, "fp8-block")
    monkeypatch.setattr(fused_moe_gemv, "_DECODE_E4M3", True)
    assert cast == fused_moe_gemv.TUNED_FP8_BLOCK[1]  # the cast's own tiles
    assert fused_moe_gemv.default_config(1, "fp8-block") == fused_moe_gemv.TUNED_FP8_BLOCK_WORDS[1]
    for quant, tuned in (
        (None, fused_moe_gemv.TUNED),
        ("fp8-block", fused_moe_gemv.TUNED_FP8_BLOCK_WORDS),
    ):
        assert [fused_moe_gemv.default_config(m, quant) for m in (1, 2, 3, 4)] == [
            tuned[1],
            tuned[2],
            tuned[4],
            tuned[4],
        ]
        assert fused_moe_gemv.default_config(8, quant) == fused_moe_gemv.DEFAULT_CONFIG
    words = fused_moe_gemv.TUNED_FP8_WORDS
    assert [fused_moe_gemv.default_config(m, "fp8") for m in (1, 2, 3, 4)] == [
        fused_moe_gemv.DEFAULT_CONFIG,
        words[2],
        words[4],
        words[4],
    ]
    assert words[2] != fused_moe_gemv.DEFAULT_CONFIG != words[4]
    monkeypatch.setattr(fused_moe_gemv, "_DECODE_E4M3", False)
    assert fused_moe_gemv.default_config(4, "fp8") == fused_moe_gemv.DEFAULT_CONFIG
    monkeypatch.setattr(fused_moe_gemv, "_DECODE_E4M3", True)
    # MINI_SGLANG_MOE_GEMV_TILES replaces kernel 1's tiles, or both, for its buckets
    forced = fused_moe_gemv._parse_forced("1=2,2048,8,1/4=4,512,1:8,128,8,3")
    monkeypatch.setattr(fused_moe_gemv, "_FORCED", forced)
    one = fused_moe_gemv.default_config(1, None)
    assert one == SmallMConfig(GemvTiles(2, 2048, 8, 1), fused_moe_gemv.TUNED[1].down)
    assert fused_moe_gemv.default_config(3, "fp8") == SmallMConfig(
        GemvTiles(4, 512, 1), GemvTiles(8, 128, 8, 3)
    )
    assert fused_moe_gemv.default_config(2, None) == fused_moe_gemv.TUNED[2]
    monkeypatch.setattr(fused_moe_gemv, "_FORCED", {})
    monkeypatch.setattr(fused_moe_gemv, "MAX_TOKENS", 2)
    assert [fused_moe_gemv.use_small_m(m) for m in (0, 1, 2, 3)] == [False, True, True, False]
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 32, generator=gen)
    w13 = torch.randn(4, 32, 32, generator=gen) * 0.2
    w2 = torch.randn(4, 32, 16, generator=gen) * 0.2
    weights = torch.rand(2, 2, generator=gen)
    ids = _ids(2, 4, 2, gen)
    x, w13, w2, weights, ids = (t.to(DEVICE) for t in (x, w13, w2, weights, ids))
    out = fused_experts_triton(x, w13, w2, weights, ids)
    assert torch.equal(out, fused_experts_gemv(x, w13, w2, weights, ids))
    torch.testing.assert_close(out, fused_experts_torch(x, w13, w2, weights, ids))


@needs_fp8
@pytest.mark.parametrize("decode", ["words", "cast"])
@pytest.mark.parametrize("block", [None, FP8_BLOCK], ids=["channel", "block"])
def test_small_m_gemv_fp8_matches_dequantized_reference(block, decode, monkeypatch) -> None:
    """FP8 experts on the GEMV path: the dequantized experts applied to unquantized
    activations (per-channel scales in the epilogue, block-wise ones folded into the 16- or
    32-column K tiles of x, 40 columns ending in a short group), two tokens' top-4 of 16
    experts, all pairs and then some dropped; with fixed tiles and with the tuned ones
    (config None: default_config's, whose BLOCK_K exceeds the row). The weights decoded
    as int32 words (e4m3_decode) and converted by Triton's cast."""
    monkeypatch.setattr(fused_moe_gemv, "_DECODE_E4M3", decode == "words")
    x, w13q, w2q, weights, ids, fp8, reference = _fp8_problem(
        2, block, experts=16, k=4, act_quant=False, fp8_values=decode == "words"
    )
    assert fp8.kind == ("fp8" if block is None else "fp8-block")  # which tuned tiles it gets
    for config in (GEMV_TILES, None):
        for case in (ids, torch.where(ids % 2 == 1, -1, ids)):
            out = fused_experts_gemv(x, w13q, w2q, weights, case, fp8=fp8, config=config)
            torch.testing.assert_close(out.cpu(), reference(case.cpu()), atol=1e-4, rtol=1e-4)
    # bf16 activations (with "words": read as int64 words of four bf16), the SiLU-mul output
    # rounded to bf16 between the kernels: within bf16's rounding of the float32 result
    # (x itself is rounded to bf16 here, so the reference's x differs by as much)
    out = fused_experts_gemv(x.bfloat16(), w13q, w2q, weights, ids, fp8=fp8, config=GEMV_TILES)
    want = reference(ids.cpu())
    assert ((out.float().cpu() - want).norm() / want.norm()).item() < 2e-2


@needs_fp8
@pytest.mark.parametrize("decode", ["words", "cast"])
@pytest.mark.parametrize("rows", [1, 3])
def test_block_fp8_gemv_matches_dequantized_linear(rows, decode, monkeypatch) -> None:
    """A dense layer with block-wise FP8 weights (Fp8BlockLinearMethod's few-row path): x @
    the dequantized weight^T, 40 output rows (two whole 16-row blocks and a short one) and
    72 columns (a short last group), for tiles narrower and wider than a block; then added
    into a residual in place. The weight decoded as int32 words and by Triton's cast."""
    monkeypatch.setattr(fused_moe_gemv, "_DECODE_E4M3", decode == "words")
    gen = torch.Generator().manual_seed(rows)
    block = (16, 16)
    w = torch.randn(40, 72, generator=gen)
    q, scale = quantize_blocks(w, block)
    ref_w = dequantize_blocks(q, scale, block)
    x = torch.randn(rows, 72, generator=gen)
    if DEVICE.type == "cpu" and decode == "cast":  # the interpreter has no FP8 cast
        q = q.float()
    xd, qd, sd = x.to(DEVICE), q.to(DEVICE), scale.to(DEVICE)
    for tiles in (GemvTiles(8, 16, 4), GemvTiles(32, 64, 4)):
        out = fused_moe_gemv.block_fp8_gemv(xd, qd, sd, block, tiles=tiles)
        torch.testing.assert_close(out.cpu(), x @ ref_w.T, atol=1e-4, rtol=1e-4)
    out = fused_moe_gemv.block_fp8_gemv(xd.bfloat16(), qd, sd, block)  # int64 words of x
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float().cpu(), x @ ref_w.T, atol=0.1, rtol=2e-2)
    residual = torch.randn(rows, 40, generator=gen)
    got = fused_moe_gemv.block_fp8_gemv(xd, qd, sd, block, residual=residual.to(DEVICE, copy=True))
    torch.testing.assert_close(got.cpu(), residual + x @ ref_w.T, atol=1e-4, rtol=1e-4)


@needs_fp8
@pytest.mark.parametrize("decode", ["words", "cast"])
@pytest.mark.parametrize("rows", [1, 3])
def test_channel_fp8_gemv_matches_dequantized_linear(rows, decode, monkeypatch) -> None:
    """The same kernel for per-channel FP8 weights (one scale per row, --quantization fp8):
    x @ the dequantized weight^T, 40 output rows for tiles that leave a short last block,
    then added into a residual in place."""
    monkeypatch.setattr(fused_moe_gemv, "_DECODE_E4M3", decode == "words")
    gen = torch.Generator().manual_seed(rows + 10)
    q, scale = quantize_rows(torch.randn(40, 72, generator=gen) * torch.rand(40, 1, generator=gen))
    ref_w = dequantize_rows(q, scale)
    x = torch.randn(rows, 72, generator=gen)
    if DEVICE.type == "cpu" and decode == "cast":  # the interpreter has no FP8 cast
        q = q.float()
    xd, qd, sd = x.to(DEVICE), q.to(DEVICE), scale.to(DEVICE)
    for tiles in (GemvTiles(8, 16, 4), GemvTiles(32, 64, 4)):
        out = fused_moe_gemv.channel_fp8_gemv(xd, qd, sd, tiles=tiles)
        torch.testing.assert_close(out.cpu(), x @ ref_w.T, atol=1e-4, rtol=1e-4)
    residual = torch.randn(rows, 40, generator=gen)
    got = fused_moe_gemv.channel_fp8_gemv(xd, qd, sd, residual=residual.to(DEVICE, copy=True))
    torch.testing.assert_close(got.cpu(), residual + x @ ref_w.T, atol=1e-4, rtol=1e-4)
