"""Batch-1 decode's weight stream in one CUDA graph, with and without programmatic dependent
launch (PDL) between its kernels.

    python benchmarks/bench_decode_chain.py --model llama-3.1-8b [--layers 32] [--sweep] [--out r.jsonl]
        [--attention-us 6] [--sweep-shapes o gate_up] [--extra-configs 8,4096,8,1 ...]

Per layer: add-RMSNorm, qkv GEMV, o GEMV (fed by the first columns of qkv, standing in for
attention; with --attention-us a kernel that holds 128 programs that long first, as batch-1
decode attention does: latency, next to no DRAM traffic), add-RMSNorm, gate_up GEMV,
SiLU-mul, down GEMV; then the final norm and the LM head. Each arm captures the whole chain
in one graph and reports ms per replay and the weight bytes over that time. Arms:

- cublas: F.linear and flashinfer's norm / activation (the path without small-M GEMMs)
- picked: small_m_gemm's pick per shape without PDL (Triton or cuBLAS), flashinfer ops
- picked_pdl: the same, Triton GEMVs launched with PDL
- ours / ours_pdl: the picks small_m_gemm makes when PDL is on, fused_kernels' RMSNorm and
  SiLU-mul: the decode path without / with PDL
- triton / triton_pdl: the best Triton GEMV on every shape
- qkv_fused / qkv_fused_pdl: the decode path at batch 1 (llama.norms_in_gemvs): down adds
  into the residual in its epilogue and qkv normalises it as it loads it (g loaded beside x);
  the post-attention add-RMSNorm stays a kernel
- fused / fused_pdl: both add-RMSNorms folded into the GEMVs (o adds into the residual too,
  gate_up normalises it); no norm kernel runs inside a layer
- folded / folded_pdl: the same with g folded into the qkv and gate_up weights beforehand, so
  those GEMVs load no g (the timing of that layout; the weights here are random anyway)

Each *_pdl arm's logits are compared with its twin's (same kernels, same order, no PDL):
they must match exactly, so a missing wait shows up as a difference, not as a speed-up.
--sweep then times the ours_pdl chain with each GEMV config (and cuBLAS) on one shape at a
time: whether the standalone cold-L2 picks are also the best picks inside a PDL chain.
--extra-configs adds configs to that sweep, e.g. wide row blocks whose whole weight slice
(BLOCK_K = K) a program loads before its PDL wait, i.e. during the attention stand-in.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from bench_linear import config, projections
from triton.language.extra.cuda import globaltimer

from mini_sglang.layers import fused_kernels, small_m_gemm
from mini_sglang.layers.kernels import (
    flashinfer_activation,
    flashinfer_norm,
    gdc_launch_dependents,
    gdc_wait,
)

# decode_from_qkv's grid for Llama-3.1-8B at batch 1: 8 KV heads x 16 splits
_STAND_IN_PROGRAMS = 128


@triton.jit
def _attention_stand_in(qkv, out, n, ns, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """Holds every program ns nanoseconds after the PDL wait (the globaltimer ticks in ~1 us
    steps on Hopper), then copies qkv[0, :n] to out."""
    if PDL:
        gdc_launch_dependents()
        gdc_wait()
    start = globaltimer()
    now = start
    while now - start < ns:
        now = globaltimer()
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out + offs, tl.load(qkv + offs, mask=offs < n), mask=offs < n)


def attention(qkv: torch.Tensor, n: int, us: float, pdl: bool) -> torch.Tensor:
    """o_proj's input from the qkv projection (batch 1): its first n columns, after us
    microseconds of a stand-in for decode attention (us = 0: a plain copy). Like the attention
    kernels, the stand-in lets its dependents launch at once under PDL."""
    if us <= 0:
        return qkv[:, :n].contiguous()
    out = qkv.new_empty((1, n))
    block = triton.next_power_of_2(triton.cdiv(n, _STAND_IN_PROGRAMS))
    _attention_stand_in[(_STAND_IN_PROGRAMS,)](
        qkv, out, n, int(us * 1000), BLOCK=block, PDL=pdl, num_warps=4, launch_pdl=pdl
    )
    return out


def build(model: str, layers: int, dev: str = "cuda") -> tuple[list[dict], torch.Tensor, int]:
    shapes = projections(model)
    torch.manual_seed(0)

    def weight(name: str) -> torch.Tensor:
        n, k = shapes[name]
        return torch.randn(n, k, dtype=torch.bfloat16, device=dev) * (k**-0.5)

    ws = [{name: weight(name) for name in ("qkv", "o", "gate_up", "down")} for _ in range(layers)]
    return ws, weight("lm_head"), config(model)["hidden_size"]


# arm -> (GEMV choice, small ops, PDL). GEMV choice: "cublas" (no configs), "picked" (small_m_gemm's
# pick as made without PDL), "pdl_picked" (with the credit PDL earns, small_m_gemm.pick_rule),
# "triton" (the best Triton config on every shape), "variant_picked" (small_m_gemm's pick for
# each fused variant, made on first use). Small ops: flashinfer's or fused_kernels'.
_TWINNED = {
    "picked": ("picked", "flashinfer"),
    "ours": ("pdl_picked", "ours"),
    "triton": ("triton", "ours"),
    "qkv_fused": ("variant_picked", "qkv_fused"),
    "fused": ("variant_picked", "fused"),
    "folded": ("variant_picked", "folded"),
}
# small ops of the norms-in-GEMVs dataflows (make_step's fused_step)
_FUSED_OPS = ("qkv_fused", "fused", "folded")
# every arm but cublas also runs as <arm>_pdl, the same chain launched with PDL
ARMS = {"cublas": ("cublas", "flashinfer", False)} | {
    name + suffix: (*choice, pdl)
    for name, choice in _TWINNED.items()
    for suffix, pdl in (("", False), ("_pdl", True))
}


def make_step(
    ws, lm_head, hidden: int, gemv_cfgs: dict, ops: str, pdl: bool, attention_us: float = 0.0
):
    """The chain as a callable; gemv_cfgs maps a weight shape to its Triton config (None or
    missing: cuBLAS)."""
    fi_norm, fi_act = flashinfer_norm(), flashinfer_activation()
    ones = torch.ones(hidden, dtype=torch.bfloat16, device="cuda")

    fused_ops = ops in _FUSED_OPS

    def lin(x, w):
        cfg = gemv_cfgs.get(tuple(w.shape))
        if cfg is None and fused_ops:  # as the model: the plain GEMV's pick
            cfg = small_m_gemm._config(x, w)
        return F.linear(x, w) if cfg is None else small_m_gemm.gemv(x, w, cfg, pdl=pdl)

    def norm(x, res):
        if ops == "ours":
            return fused_kernels.rmsnorm(x, ones, 1e-5, res, pdl=pdl)
        fi_norm.fused_add_rmsnorm(x, res, ones, 1e-5)
        return x

    def act(x):
        return fused_kernels.silu_and_mul(x, pdl=pdl) if ops == "ours" else fi_act.silu_and_mul(x)

    gen = torch.Generator(device="cuda").manual_seed(1)
    h0 = torch.randn(1, hidden, dtype=torch.bfloat16, device="cuda", generator=gen)
    h, res = h0.clone(), torch.zeros_like(h0)

    if fused_ops:
        return _make_fused_step(ws, lm_head, gemv_cfgs, ops, pdl, attention_us, h0, res, lin)

    def step() -> torch.Tensor:
        h.copy_(h0)
        res.zero_()
        x = h
        for lw in ws:
            xn = norm(x, res)
            qkv = lin(xn, lw["qkv"])
            o = lin(attention(qkv, lw["o"].shape[1], attention_us, pdl), lw["o"])
            xn = norm(o, res)
            x = lin(act(lin(xn, lw["gate_up"])), lw["down"])
        return lin(norm(x, res), lm_head)

    return step


def _make_fused_step(ws, lm_head, gemv_cfgs, ops, pdl, attention_us, h0, res, lin):
    """make_step's chain for the norms-in-GEMVs dataflows (ops in _FUSED_OPS), from h0 with
    the residual in res; lin is the chain's plain GEMV."""
    ones = torch.ones(h0.shape[1], dtype=torch.bfloat16, device="cuda")

    def fused_lin(x, w, residual=None, norm=False, silu_mul=False):
        """One GEMV of the norms-in-GEMVs dataflows (ops "qkv_fused", "fused", "folded"), with
        gemv_cfgs' config for its shape (a --sweep) or else the model's pick for the variant."""
        variant = (
            ("norm",) * norm + ("silu_mul",) * silu_mul + ("residual",) * (residual is not None)
        )
        pick = () if variant == ("silu_mul",) else variant  # as linear_silu_mul picks
        cfg = gemv_cfgs.get(tuple(w.shape)) or small_m_gemm._config(x, w, pick)
        assert cfg is not None, f"cuBLAS picked for {tuple(w.shape)} {variant}"
        g = ones if ops != "folded" and norm else None
        eps = 1e-5 if norm else None
        return small_m_gemm.gemv(
            x, w, cfg, pdl=pdl, silu_mul=silu_mul, residual=residual, norm_weight=g, eps=eps
        )

    def fused_step() -> torch.Tensor:
        res.copy_(h0)
        for lw in ws:
            qkv = fused_lin(res, lw["qkv"], norm=True)
            attn = attention(qkv, lw["o"].shape[1], attention_us, pdl)
            if ops == "qkv_fused":
                xn = fused_kernels.rmsnorm(lin(attn, lw["o"]), ones, 1e-5, res, pdl=pdl)
                act = fused_lin(xn, lw["gate_up"], silu_mul=True)
            else:
                fused_lin(attn, lw["o"], residual=res)
                act = fused_lin(res, lw["gate_up"], norm=True, silu_mul=True)
            fused_lin(act, lw["down"], residual=res)
        return fused_lin(fused_kernels.rmsnorm(res, ones, 1e-5, pdl=pdl), lm_head)

    return fused_step


def time_step(step, replays: int) -> tuple[float, torch.Tensor]:
    """(best-of-3 ms per replay, output) of the chain captured in one CUDA graph."""
    step()  # compile outside the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = step()
    g.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(3):
        start.record()
        for _ in range(replays):
            g.replay()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / replays)
    return best, out.clone()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--sweep", action="store_true", help="each GEMV config per shape in the chain")
    ap.add_argument("--sweep-arm", default="ours_pdl", help="the chain --sweep varies")
    ap.add_argument("--arms", nargs="*", default=list(ARMS), help="arms to time")
    ap.add_argument(
        "--attention-us",
        type=float,
        default=0.0,
        help="per layer, hold this long before o_proj (a stand-in for decode attention)",
    )
    ap.add_argument(
        "--sweep-shapes",
        nargs="*",
        default=None,
        help="projections --sweep varies (qkv, o, gate_up, down, lm_head; default all)",
    )
    ap.add_argument(
        "--extra-configs",
        nargs="*",
        default=[],
        help="more GEMV configs for --sweep: BLOCK_N,BLOCK_K,warps[,stages]",
    )
    ap.add_argument("--out")
    args = ap.parse_args()
    layers = args.layers or config(args.model)["num_hidden_layers"]
    ws, lm_head, hidden = build(args.model, layers)
    configs: dict[str, dict] = {"picked": {}, "pdl_picked": {}, "triton": {}}
    for w in (*ws[0].values(), lm_head):
        x = torch.zeros(1, w.shape[1], dtype=w.dtype, device="cuda")
        times = small_m_gemm.time_candidates(x, w)
        key = tuple(w.shape)
        configs["picked"][key] = small_m_gemm.choose(times)
        configs["pdl_picked"][key] = small_m_gemm.choose(times, **small_m_gemm.pick_rule(x))
        configs["triton"][key] = small_m_gemm.choose(times, float("inf"))
        triton_us = 1000 * times[configs["triton"][key]]
        print(f"{key}: picks {configs['picked'][key]} / {configs['pdl_picked'][key]} (with PDL);"
              f" best Triton {configs['triton'][key]} {triton_us:.1f} us, cuBLAS {1000 * times[None]:.1f} us")  # fmt: skip
    weight_bytes = sum(w.numel() * 2 for lw in ws for w in lw.values()) + lm_head.numel() * 2
    logits: dict[str, torch.Tensor] = {}
    rows = []
    for arm in args.arms:
        gemvs, ops, pdl = ARMS[arm]
        step = make_step(ws, lm_head, hidden, configs.get(gemvs, {}), ops, pdl, args.attention_us)
        try:
            ms, out = time_step(step, args.replays)
        except Exception as e:  # noqa: BLE001 - report the arm and go on
            print(f"{arm}: failed: {type(e).__name__}: {e}")
            continue
        logits[arm] = out.float()
        row = {"arm": arm, "model": args.model, "layers": layers, "ms": round(ms, 4),
               "attention_us": args.attention_us,
               "TBps": round(weight_bytes / ms / 1e9, 3), "device": torch.cuda.get_device_name()}  # fmt: skip
        # a PDL arm runs its twin's kernels in the same order: any difference is a race
        twin = arm.removesuffix("_pdl")
        if twin != arm and twin in logits:
            row["max_abs_diff_vs_" + twin] = (logits[arm] - logits[twin]).abs().max().item()
        print(json.dumps(row))
        rows.append(row)
    for key, cfg in small_m_gemm._choice.items():
        if key[-1]:  # a fused variant's pick
            print(f"variant pick {key[1:3]} {key[-1]}: {cfg}")
    if args.sweep:
        rows += sweep(args, ws, lm_head, hidden, configs)
    if args.out:
        with Path(args.out).open("a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")


def sweep(args: argparse.Namespace, ws, lm_head, hidden: int, configs: dict) -> list[dict]:
    """--sweep's rows: one shape's config at a time in the sweep arm's chain, the others as
    picked."""
    rows = []
    sweep_gemvs, sweep_ops, _ = ARMS[args.sweep_arm]
    names = {shape: name for name, shape in projections(args.model).items()}
    extra = [tuple(int(v) for v in c.split(",")) for c in args.extra_configs]
    for key in configs["pdl_picked"]:
        if args.sweep_shapes is not None and names.get(key) not in args.sweep_shapes:
            continue
        fused = sweep_ops in _FUSED_OPS
        for cfg in (None, *small_m_gemm._CONFIGS, *extra)[fused:]:
            cfgs = {**configs.get(sweep_gemvs, {}), key: cfg}
            try:
                ms, _ = time_step(
                    make_step(ws, lm_head, hidden, cfgs, sweep_ops, True, args.attention_us),
                    args.replays,
                )
            except Exception:  # noqa: BLE001 - a config the compiler rejects
                continue
            row = {"arm": "sweep " + args.sweep_arm, "model": args.model, "shape": key, "config": cfg,
                   "ms": round(ms, 4), "attention_us": args.attention_us,
                   "device": torch.cuda.get_device_name()}  # fmt: skip
            print(json.dumps(row))
            rows.append(row)
    return rows


if __name__ == "__main__":
    main()
