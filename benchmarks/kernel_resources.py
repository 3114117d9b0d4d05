"""Registers, spills, shared memory, barriers and pre-wait loads of the MoE decode kernels,
compiled for a GPU target on any machine: Triton compiles a kernel to a cubin with its
bundled ptxas and needs no GPU for that, so a tile config's occupancy is known before a GPU
run.

    python benchmarks/kernel_resources.py                      # tuned / default tiles, sm90
    python benchmarks/kernel_resources.py --tiles 8,128,8 8,128,16 --arch 90 --out rows.jsonl
    python benchmarks/kernel_resources.py --attention   # the fused decode attention kernel
    python benchmarks/kernel_resources.py --align 256,8 128,8 64,4   # moe_align_block_size
    python benchmarks/kernel_resources.py --gemv [qkv:5120:2048:norm ...]   # persistent GEMV
    python benchmarks/kernel_resources.py --gemv qkv:5120:2048:norm+fp8 --gemv-rows 4   # grid

Rows: the expert kernels of layers/moe/fused_moe_gemv.py (gate_up, down) per tile config,
and the router's top-k kernel at its launch's warps and at 4, at Qwen3-30B-A3B's shapes by
default (E 128, top-8). `barriers` counts bar.sync in the PTX (a reduction across warps
needs one; within a warp it is register shuffles). `ctas_per_sm` is what registers and warps
allow: 65,536 registers, 64 warps and 32 programs per SM (sm80-sm90), registers allocated
in units of 8 a thread; fewer programs per SM keep fewer bytes in flight, which is what a
decode GEMV's bandwidth depends on. Worked example: 66 registers are allocated as 72, x 256
threads (8 warps) = 18,432, so 65,536 // 18,432 = 3 programs per SM; at 64 it would be 4,
and at 32 the warps bound it: 64 // 8 = 8. `loads_before_wait` / `loads_after_wait` count
the global loads (SASS LDG) on either side of the PDL wait (ACQBULK): what a kernel has in
flight while the one before it drains, as the compiler actually placed it. Every runtime
argument is compiled as 16-divisible (aligned pointers, sizes and strides), as the JIT
specializes these models' shapes; without that hint no load is vectorized and the counts
are far higher.

The counts are this Triton's: another version compiles the same kernel differently (the
persistent qkv GEMV (2, 0, 8, 1, 2, 4) of Qwen3-30B-A3B: 32 registers with Triton 3.9 here,
65 in a profile of the GPU machine's 3.6), so compare them with the GPU's own (a profile's
trace lists each kernel's registers) before reading occupancy off them. The first line
printed names the version.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

# Compiling needs Triton's JIT functions, which its interpreter mode would replace; this must
# be unset before mini_sglang's kernels are defined.
os.environ.pop("TRITON_INTERPRET", None)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from mini_sglang.layers.moe import fused_moe_gemv, router  # noqa: E402

# per SM on sm80-sm90; registers are allocated to a thread in units of 8
REGS_PER_SM, WARPS_PER_SM, CTAS_PER_SM, REG_UNIT = 65536, 64, 32, 8
_USAGE = re.compile(r"REG:(\d+) STACK:(\d+) SHARED:(\d+)")


def resources(
    fn, args: dict, constants: dict, num_warps: int, arch: int, num_stages: int | None = None
) -> dict:
    """Compile fn for sm<arch> with `args` (name -> Triton type, e.g. "*bf16", "i32") and
    `constants` (constexpr values); {"regs", "stack", "shared", "barriers", "ctas_per_sm",
    "loads_before_wait", "loads_after_wait"}: the last two count the global loads (SASS
    LDG) before and after the PDL wait (ACQBULK, from gdc_wait), the loads a programmatic
    dependent has in flight while the kernel before it drains (None without a wait)."""
    used = {name: v for name, v in constants.items() if name in fn.arg_names}
    signature = {name: "constexpr" if name in used else args[name] for name in fn.arg_names}
    # Every runtime argument 16-divisible (aligned pointers, sizes and strides), as the JIT
    # specializes them for these models' shapes: without it no load is vectorized.
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, name in enumerate(fn.arg_names)
        if signature[name] != "constexpr"
    }
    kernel = triton.compile(
        ASTSource(fn, signature, used, attrs),
        target=GPUTarget("cuda", arch, 32),
        options={
            "num_warps": num_warps,
            **({} if num_stages is None else {"num_stages": num_stages}),
        },
    )
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        dump, sass = (
            subprocess.run(
                [str(cuobjdump), flag, f.name], capture_output=True, text=True, check=True
            ).stdout
            for flag in ("--dump-resource-usage", "--dump-sass")
        )
    regs, stack, shared = (int(v) for v in _USAGE.search(dump).groups())
    before, wait, after = sass.partition("ACQBULK")
    loads = (before.count("LDG"), after.count("LDG")) if wait else (None, None)
    threads = 32 * num_warps
    allocated = -(-max(regs, 1) // REG_UNIT) * REG_UNIT
    ctas = min(REGS_PER_SM // (allocated * threads), WARPS_PER_SM // num_warps, CTAS_PER_SM)
    barriers = kernel.asm["ptx"].count("bar.sync")
    return {"regs": regs, "stack": stack, "shared": shared, "barriers": barriers,
            "ctas_per_sm": ctas, "loads_before_wait": loads[0],
            "loads_after_wait": loads[1]}  # fmt: skip


def _arg_types(fn, fp8: bool) -> dict:
    """Triton types of an MoE kernel's arguments (resources() takes the constexpr ones from
    its constants): pointers by name (FP8 weights and activations where `fp8`), integers
    elsewhere."""
    special = {"ids_ptr": "*i32", "topk_weights_ptr": "*fp32", "weights_ptr": "*fp32"}
    types = {}
    for name in fn.arg_names:
        if not name.endswith("_ptr"):
            types[name] = "i32"
        elif name in special:
            types[name] = special[name]
        elif fp8 and name == "w_ptr":  # as launched: int32 words of four (e4m3_decode) or FP8
            types[name] = "*i32" if fused_moe_gemv._DECODE_E4M3 else "*fp8e4nv"
        elif fp8 and "scale" in name:
            types[name] = "*fp32"
        else:
            types[name] = "*bf16"
    return types


def _attention_rows(arch: int) -> list[dict]:
    """The fused decode attention kernel (decode_from_qkv's stage 1) at Qwen3-30B-A3B's heads
    (32 query, 4 KV, head_dim 128, q/k norm; 16 splits), launched as decode_from_qkv_fwd
    launches it."""
    from mini_sglang.layers.attention.triton_ops import decode_from_qkv as m

    fn = m._decode_from_qkv_stage1
    types = {name: "i32" if name.startswith("stride") else "*bf16" for name in fn.arg_names}
    for name in ("positions", "loc", "req_to_token", "req_pool_indices", "seq_lens"):
        types[name] = "*i64"
    for name in ("cos_sin", "Mid_O", "Mid_Lse"):
        types[name] = "*fp32"
    for name in ("eps", "qk_scale", "inv_k_scale", "inv_v_scale"):
        types[name] = "fp32"
    consts = dict(
        NUM_Q=32, NUM_KV=4, GROUP=8, HEAD_BLOCKS=1, NUM_SPLITS=16, D=128, BLOCK_H=m.BLOCK_H,
        BLOCK_N=64, MIN_KV=m.MIN_BLOCK_KV, HAS_NORM=True, FP8_MAX=0, IEEE=False, PDL=True,
    )  # fmt: skip
    res = resources(fn, types, consts, m._NUM_WARPS, arch, 1)
    row = {"kernel": "decode_from_qkv", "warps": m._NUM_WARPS, "stages": 1, "tiles": None}
    return [row | res]


# --gemv: the persistent one-row GEMV (small_m_gemm._gemv_rows_kernel) as a model launches it,
# "NAME:N:K:VARIANT" with VARIANT "+"-joined from small_m_gemm's (norm, silu_mul, residual,
# fp8, fp8block128x128; plain for none); default Qwen3-30B-A3B's attention projections.
GEMV_SHAPES = [
    "qkv:5120:2048:norm", "o:2048:4096:plain",
    "qkv:5120:2048:norm+fp8block128x128", "o:2048:4096:fp8block128x128",
]  # fmt: skip


def _gemv_rows(
    arch: int, shapes: list[str], configs: list[str] | None, m: int = 1, sms: int = 132
) -> list[dict]:
    """small_m_gemm's GEMV per shape and config (its candidates for the variant at m rows of
    x by default): at one row the persistent _gemv_rows_kernel, registers and the programs
    an SM holds against the programs per SM the config launches (a persistent grid beyond
    that runs in two waves); the grid _gemv_kernel at any m, its programs against what
    `sms` SMs hold at once (waves)."""
    from mini_sglang.layers import small_m_gemm

    fn = small_m_gemm._gemv_rows_kernel
    rows = []
    for spec in shapes:
        name, n, k, variant = spec.split(":")
        n, k, var = int(n), int(k), tuple(v for v in variant.split("+") if v != "plain")
        block = small_m_gemm.block_of(var)
        fp8 = block is not None or "fp8" in var
        cfgs = [tuple(map(int, c.split(","))) for c in configs] if configs else None
        for cfg in cfgs or small_m_gemm.candidates(var, m):
            if small_m_gemm.is_dense_down(cfg):  # fused_moe_gemv's kernel, not reported here
                continue
            if not small_m_gemm.is_persistent(cfg):
                rows.append(_gemv_grid_row(arch, name, n, k, variant, var, cfg, m, sms))
                continue
            if m != 1:
                continue
            bn, _, warps, stages, kind, per_sm = cfg
            bits = kind == small_m_gemm.PERSISTENT_BITS
            silu = "silu_mul" in var
            types = _gemv_types(fn, "*i32" if bits else ("*fp8e4nv" if fp8 else "*bf16"))
            consts = dict(
                BN=max(1, bn // 2) if silu else bn,
                BK=triton.next_power_of_2(k // 4 if bits else k), PDL=True, SILU_MUL=silu,
                ADD_RES="residual" in var, NORM="norm" in var, NORM_G="norm" in var,
                W_SCALE=fp8 and block is None, BITS=bits, W_BLOCK=block is not None,
                SB_N=block[0] if block else 1,
                SB_K=(block[1] // 4 if bits else block[1]) if block else 1,
            )  # fmt: skip
            res = resources(fn, types, consts, warps, arch, stages)
            rows.append({"kernel": f"gemv {name} {n}x{k} {variant}", "warps": warps,
                         "stages": stages, "tiles": list(cfg), "per_sm": per_sm, **res})  # fmt: skip
    for r in rows:
        if "programs" in r:
            waves = "one wave" if r["waves"] == 1 else f"{r['waves']} WAVES"
            print(f"sm{arch} {r['kernel']} {tuple(r['tiles'])} at {m} rows: {r['regs']} "
                  f"registers, {r['ctas_per_sm']} per SM held, {r['programs']} programs on "
                  f"{sms} SMs ({waves}), {r['loads_before_wait']} loads before the PDL wait")  # fmt: skip
            continue
        waves = "one wave" if r["ctas_per_sm"] >= r["per_sm"] else "TWO WAVES"
        print(f"sm{arch} {r['kernel']} {tuple(r['tiles'])}: {r['regs']} registers, "
              f"{r['ctas_per_sm']} per SM held against {r['per_sm']} launched ({waves}), "
              f"{r['loads_before_wait']} loads before the PDL wait")  # fmt: skip
    return rows


def _gemv_types(fn, w_type: str) -> dict:
    """Triton types of a small_m_gemm GEMV kernel's arguments, as a bf16 model launches it
    with a weight of type w_type."""
    types = {a: "i32" for a in fn.arg_names}
    types.update(x="*bf16", out="*bf16", norm_w="*bf16", w_scale="*fp32", eps="fp32", w=w_type)
    return types


def _gemv_grid_row(
    arch: int, name: str, n: int, k: int, variant: str, var: tuple, cfg: tuple, m: int, sms: int
) -> dict:
    """small_m_gemm._gemv_kernel compiled as gemv launches cfg at m rows (grid_launch), with
    its programs and the waves they take on `sms` SMs."""
    from mini_sglang.layers import small_m_gemm

    fn = small_m_gemm._gemv_kernel
    silu = "silu_mul" in var
    launch = small_m_gemm.grid_launch(cfg, m, n, silu)
    programs = launch.pop("programs")
    types = _gemv_types(fn, "*i32" if launch["BITS"] else ("*fp8e4nv" if "fp8" in var else "*bf16"))
    consts = dict(
        launch, PDL=True, SILU_MUL=silu, ADD_RES="residual" in var, NORM="norm" in var,
        NORM_G="norm" in var, W_SCALE="fp8" in var, IEEE=False, X_WORDS=False,
    )  # fmt: skip
    stages = cfg[3] if len(cfg) > 3 else None
    res = resources(fn, types, consts, cfg[2], arch, stages)
    waves = -(-programs // max(1, res["ctas_per_sm"] * sms))
    return {"kernel": f"gemv {name} {n}x{k} {variant}", "warps": cfg[2], "stages": stages,
            "tiles": list(cfg), "rows": m, "programs": programs, "waves": waves, **res}  # fmt: skip


def _align_rows(arch: int, experts: int, variants: list[str]) -> list[dict]:
    """moe_align_block_size's two kernels (layers/moe/align.py) per CHUNK,NUM_WARPS[,SUB]
    variant (SUB: pairs ranked at a time, 0 or left out ranks by comparison):
    the counting kernel, and the placing kernel for one chunk and for several, with 16-pair
    blocks and `experts` experts."""
    from mini_sglang.layers.moe import align

    count, place = align._kernels()
    block_e = max(16, triton.next_power_of_2(experts))
    rows = []
    for variant in variants:
        chunk, warps, sub = (list(map(int, variant.split(","))) + [0])[:3]
        kernels = [("count", count, {})]
        kernels += [(f"place, {'one chunk' if one else 'chunks'}", place,
                     {"SINGLE": one, "SUB": min(sub, chunk)}) for one in (True, False)]  # fmt: skip
        for name, fn, extra in kernels:
            types = {n: "*i32" if n.endswith("_ptr") else "i32" for n in fn.arg_names}
            consts = dict(BLOCK_M=16, CHUNK=chunk, BLOCK_E=block_e, BLOCK_G=16, FILL=256, **extra)
            res = resources(fn, types, consts, warps, arch)
            rows.append({"kernel": f"align {name}", "warps": warps, "stages": None,
                         "tiles": [chunk, sub] if sub else [chunk], **res})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 for sm90")
    p.add_argument("--experts", type=int, default=128)
    p.add_argument("--top-k", type=int, default=8)
    p.add_argument(
        "--tiles", nargs="*", default=None,
        help="BLOCK_N,BLOCK_K,num_warps[,num_stages] of both expert kernels (default: TUNED's and the default)",
    )  # fmt: skip
    p.add_argument("--fp8", action="store_true", help="FP8 experts, block-wise [128, 128] scales")
    p.add_argument("--out", default=None, help="append the rows to this JSONL file")
    p.add_argument(
        "--attention", action="store_true",
        help="the fused decode attention kernel instead",
    )  # fmt: skip
    p.add_argument(
        "--align", nargs="+", default=None, metavar="CHUNK,WARPS[,SUB]",
        help="moe_align_block_size's kernels at these pairs per program and warps instead",
    )  # fmt: skip
    p.add_argument(
        "--gemv", nargs="*", default=None, metavar="NAME:N:K:VARIANT",
        help="small_m_gemm's GEMV instead, persistent and grid configs (default: GEMV_SHAPES)",
    )  # fmt: skip
    p.add_argument(
        "--gemv-configs", nargs="+", default=None, metavar="CONFIG",
        help="with --gemv: these configs (persistent BN,0,WARPS,STAGES,KIND,PER_SM or grid) "
        "instead of the variant's candidates",
    )  # fmt: skip
    p.add_argument("--gemv-rows", type=int, default=1,
                   help="with --gemv: rows of x (grid configs only above 1)")  # fmt: skip
    p.add_argument("--sms", type=int, default=132,
                   help="with --gemv: SMs a grid config's programs spread over")  # fmt: skip
    args = p.parse_args(argv)
    common = {"arch": args.arch, "triton": triton.__version__}
    print(f"Triton {triton.__version__}, sm{args.arch}")
    if args.gemv is not None:
        rows = _gemv_rows(
            args.arch, args.gemv or GEMV_SHAPES, args.gemv_configs, args.gemv_rows, args.sms
        )
    elif args.align:
        rows = _align_rows(args.arch, args.experts, args.align)
        for r in rows:
            print(f"sm{args.arch} E={args.experts} {r['kernel']} chunk,sub={r['tiles']} "
                  f"warps={r['warps']}: {r['regs']} registers, {r['stack']} B stack, "
                  f"{r['barriers']} barriers")  # fmt: skip
    elif args.attention:
        rows = _attention_rows(args.arch)
        for r in rows:
            print(f"sm{args.arch} {r['kernel']}: {r['regs']} registers, {r['ctas_per_sm']} per SM, "
                  f"{r['loads_before_wait']} loads before the PDL wait")  # fmt: skip
    else:
        rows = _expert_rows(args)
        common |= {"experts": args.experts, "top_k": args.top_k, "fp8": args.fp8}
    if args.out:
        with open(args.out, "a") as f:
            f.writelines(json.dumps(common | r) + "\n" for r in rows)
    return rows


def _expert_rows(args: argparse.Namespace) -> list[dict]:
    """The expert kernels per tile config and the top-k kernel (module docstring), printed."""
    if args.tiles:
        tiles = [fused_moe_gemv.GemvTiles(*map(int, t.split(","))) for t in args.tiles]
    else:
        tuned = fused_moe_gemv.tuned_configs("fp8-block" if args.fp8 else None)
        configs = [*tuned.values(), fused_moe_gemv.DEFAULT_CONFIG]
        tiles = list(dict.fromkeys(t for c in configs for t in (c.gate_up, c.down)))
    gate_up, down = fused_moe_gemv._build_kernels()
    k, e = args.top_k, args.experts
    group = (128, 128) if args.fp8 else (1, 0)
    bits = args.fp8 and fused_moe_gemv._DECODE_E4M3  # MINI_SGLANG_FP8_GEMV_INT_DECODE
    consts = dict(
        TOP_K=k, TOP_K_POW2=triton.next_power_of_2(k), FP8=args.fp8, GROUP_N=group[0],
        GROUP_K=group[1], ADD_OUT=True, DENSE=False, BITS=bits, X_WORDS=bits, PDL=True,
    )  # fmt: skip
    rows = []
    for t in tiles:
        for name, fn in (("gate_up", gate_up), ("down", down)):
            bn, bk = fused_moe_gemv.launch_tiles(t, group if args.fp8 else None, bits)
            c = dict(consts, BLOCK_N=bn, BLOCK_K=bk)
            res = resources(fn, _arg_types(fn, args.fp8), c, t.num_warps, args.arch, t.num_stages)
            rows.append({"kernel": name, "warps": t.num_warps, "stages": t.num_stages,
                         "tiles": [bn, bk], **res})  # fmt: skip
    topk = router.topk_softmax_kernel
    consts = dict(TOP_K=k, RENORMALIZE=True, PDL=True, **router.topk_constants(k, e))
    for warps in dict.fromkeys((router.TOPK_NUM_WARPS, 4)):
        res = resources(topk, _arg_types(topk, False), consts, warps, args.arch)
        rows.append(
            {"kernel": "topk_softmax", "warps": warps, "stages": None, "tiles": None, **res}
        )
    for r in rows:
        print(
            f"sm{args.arch} E={e} top-{k}{' fp8' if args.fp8 else ''} {r['kernel']:>12} "
            f"tiles={r['tiles']} warps={r['warps']} stages={r['stages']}: {r['regs']} registers, "
            f"{r['stack']} B stack, {r['shared']} B shared, {r['barriers']} barriers, "
            f"{r['ctas_per_sm']} per SM, global loads {r['loads_before_wait']} before / "
            f"{r['loads_after_wait']} after the PDL wait"
        )
    return rows


if __name__ == "__main__":
    main()
