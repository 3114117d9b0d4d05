"""The small-batch gated MLP as one kernel: residual += down(silu(x @ gate^T) * (x @ up^T)).

Why one kernel: at batch 1 every GEMV pays ~3.4 us of ramp-up and tail around a weight
stream that runs at the card's bandwidth whatever the config (docs/benchmarks.md, session
21). Run as two GEMVs, the MLP pays that edge twice per layer and down_proj cannot start
until the last gate_up program has stored its share of h. Here both kinds of tile share one
grid and down tiles start on the blocks of h that are ready while gate_up's tail drains.

The grid is a small dataflow graph of two tile kinds:
- gate_up tiles: BN1 rows of gate and of up give BN1 entries of h = silu(x @ g^T) * (x @ u^T)
  (rounded as small_m_gemm.gemv's SiLU-mul epilogue rounds), stored to a workspace; the tile
  then counts itself into the flag of its h block (HB entries of h);
- down tiles, one of two kinds per config:
  - whole rows (split 0): BN2 rows of down dotted with all of h block by block, each block
    read once its flag says all its gate_up tiles are stored; the result is added into the
    residual. Every such tile needs the last h block, stored last;
  - split by h block (split 1): BN2 rows over one h block, partial sums stored to a float32
    workspace; the last of a row tile's blocks to arrive adds the partials in block order
    and the residual. Items come block-major, so those that start while gate_up's tail
    drains need the early blocks, which are stored.

Every gate_up tile must be running or done before a down tile waits on it, or down tiles
spinning on every SM would wait forever on gate_up tiles that cannot be dispatched. gate_up
tiles have the lower program ids, which NVIDIA GPUs dispatch first (the assumption CUTLASS's
serial split-K semaphores make too). The result is deterministic: each partial and each
sum runs in the same order every run; the flags decide only when h is read.

Worked example, Llama-3.1-8B at batch 1 (I = 14336, H = 4096), BN1 = 4, HB = 1024: 3584
gate_up tiles; tile 300 computes h[1200:1204] and counts into flag 1 (1200 // 1024), which
down tiles wait to reach 1024 / 4 = 256. Whole rows with BN2 = 4: 1024 down tiles, tile
3584 + 5 computes outputs 20..23 from down rows 20..23 (all 14336 columns). Split with BN2
= 16: 256 row tiles x 14 blocks = 3584 items; item 3584 + 300 is block 1 (300 // 256) of
row tile 44 (300 % 256), outputs 704..719 over h[1024:2048].

The sync buffer (int32, one per call site, zeroed once) holds [1] the finished down tiles
(split: row tiles), [2 + b] the stored gate_up tiles of h block b and [258 + r] the blocks
of row tile r done (split). Each counter is zeroed by the program that completes it, so the
next launch finds zeros. Two launches on one sync buffer must
therefore not overlap: with early_ticket (the PDL wait after the first weight tiles are
loaded, so they load while the previous kernel drains) they must not be back-to-back
programmatic dependents.
"""

from __future__ import annotations

import logging
import os

import torch

from mini_sglang.layers import small_m_gemm
from mini_sglang.layers.kernels import gdc_launch_dependents, gdc_wait, pdl_enabled, silu_mul
from mini_sglang.utils.cuda_timing import cuda_time_ms

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU installs
    triton = None

logger = logging.getLogger(__name__)

_ENABLED = os.environ.get("MINI_SGLANG_DISABLE_FUSED_MLP") != "1"
# for experiments and tests: "BN1,BK1,BN2,HB,warps,split" replaces the timed pick for every shape
_FORCED = os.environ.get("MINI_SGLANG_FUSED_MLP_CONFIG")
SYNC_SIZE = 2 + 256 + 4096  # room for 256 h blocks and 4096 down row tiles
# (BN1, BK1, BN2, HB, num_warps, split[, num_stages]): gate_up tile rows, its K tile, down
# tile rows, the h block (the down tiles' K tile and the flag granularity), warps, whether
# down is split by h block (1) or runs whole rows (0), and the software pipelining depth
# (Triton's default without it). HB must be a multiple of BN1.
_CONFIGS = [
    (4, 2048, 4, 2048, 4, 0, 2),
    (4, 2048, 16, 1024, 4, 1),
    (4, 2048, 8, 1024, 4, 1),
    (4, 2048, 16, 2048, 4, 1),
    (4, 2048, 8, 2048, 4, 1, 2),
]
# the fused kernel must beat the two GEMVs it replaces by this factor (graph timings repeat
# within ~1%)
_MARGIN = 0.99
_choice: dict[tuple, tuple | None] = {}


if triton is not None:

    @triton.jit
    def _dot_tile(acc, xt, wt):
        """acc [BM, BN] += xt [BM, BK] @ wt [BN, BK]^T in float32."""
        return acc + tl.sum(xt.to(tl.float32)[:, None, :] * wt.to(tl.float32)[None, :, :], axis=2)

    @triton.jit
    def _wait_until(flag, target):
        """Spin until the int32 at flag reaches target, then acquire, so the stores counted
        into it are visible to the loads that follow. The spin reads with plain (volatile)
        loads: hundreds of waiting programs polling with atomics would queue on the one
        address ahead of the increments they wait for."""
        while tl.load(flag, volatile=True) < target:
            pass
        tl.atomic_add(flag, 0, sem="acquire", scope="gpu")

    @triton.jit
    def _gate_up_tile(tile, x, w_gu, h, sync, M, INTER, HIDDEN, sxm, shm,
                      BM: tl.constexpr, BN1: tl.constexpr, BK1: tl.constexpr, HB: tl.constexpr,
                      PDL_WAIT: tl.constexpr):  # fmt: skip
        """h[:, rn] = silu(x @ gate[rn]^T) * (x @ up[rn]^T) for rn the tile's BN1 rows, then
        counted into the flag of its h block. PDL_WAIT: wait for the previous kernel after
        the first weight tiles are loaded (the weights are never written in a step)."""
        rm = tl.arange(0, BM)
        m_mask = rm[:, None] < M
        rn = tile * BN1 + tl.arange(0, BN1)
        rk = tl.arange(0, BK1)
        g_rows = w_gu + rn[:, None] * HIDDEN
        u_rows = g_rows + INTER * HIDDEN
        w_mask = rn[:, None] < INTER
        wg = tl.load(g_rows + rk[None, :], mask=w_mask & (rk[None, :] < HIDDEN), other=0.0)
        wu = tl.load(u_rows + rk[None, :], mask=w_mask & (rk[None, :] < HIDDEN), other=0.0)
        if PDL_WAIT:
            gdc_launch_dependents()
            gdc_wait()
        x_rows = x + rm[:, None] * sxm
        xt = tl.load(x_rows + rk[None, :], mask=m_mask & (rk[None, :] < HIDDEN), other=0.0)
        acc_g = _dot_tile(tl.zeros([BM, BN1], tl.float32), xt, wg)
        acc_u = _dot_tile(tl.zeros([BM, BN1], tl.float32), xt, wu)
        for k0 in range(BK1, HIDDEN, BK1):
            rk = k0 + tl.arange(0, BK1)
            k_mask = rk[None, :] < HIDDEN
            xt = tl.load(x_rows + rk[None, :], mask=m_mask & k_mask, other=0.0)
            wg = tl.load(g_rows + rk[None, :], mask=w_mask & k_mask, other=0.0)
            acc_g = _dot_tile(acc_g, xt, wg)
            wu = tl.load(u_rows + rk[None, :], mask=w_mask & k_mask, other=0.0)
            acc_u = _dot_tile(acc_u, xt, wu)
        # rounded as gemv's output, then silu_mul: small_m_gemm.gemv(silu_mul=True) bit for bit
        up = acc_u.to(h.dtype.element_ty)
        y = silu_mul(acc_g.to(h.dtype.element_ty).to(tl.float32), up)
        tl.store(h + rm[:, None] * shm + rn[None, :], y, mask=m_mask & (rn[None, :] < INTER))
        tl.debug_barrier()  # every thread's h stores precede the release below
        tl.atomic_add(sync + 2 + (tile * BN1) // HB, 1, sem="release", scope="gpu")

    @triton.jit
    def _down_tile(tile, w_down, h, res, sync, M, INTER, HIDDEN, shm, srm,
                   BM: tl.constexpr, BN1: tl.constexpr, BN2: tl.constexpr, HB: tl.constexpr,
                   NB_POW2: tl.constexpr, PDL_WAIT: tl.constexpr):  # fmt: skip
        """res[:, rn] += h @ down[rn]^T for rn the tile's BN2 rows, h read block by block as
        the flags release it; the last down tile to finish zeroes the flags."""
        n_blocks = tl.cdiv(INTER, HB)
        rm = tl.arange(0, BM)
        m_mask = rm[:, None] < M
        rn = tile * BN2 + tl.arange(0, BN2)
        rk = tl.arange(0, HB)
        d_rows = w_down + rn[:, None] * INTER
        w_mask = rn[:, None] < HIDDEN
        wt = tl.load(d_rows + rk[None, :], mask=w_mask & (rk[None, :] < INTER), other=0.0)
        if PDL_WAIT:
            gdc_launch_dependents()
            gdc_wait()
        h_rows = h + rm[:, None] * shm
        # all of h stored already (the usual case once gate_up's tiles are dispatched): no
        # flag to read per block
        # (every flag read at once: one shared counter of stored tiles would take an atomic
        # from each of thousands of gate_up tiles on one address)
        nb = tl.arange(0, NB_POW2)
        flags = tl.atomic_add(sync + 2 + nb, tl.zeros([NB_POW2], tl.int32), mask=nb < n_blocks,
                              sem="acquire", scope="gpu")  # fmt: skip
        need = tl.cdiv(tl.minimum(HB, INTER - nb * HB), BN1)
        all_stored = tl.min(tl.where(nb < n_blocks, flags - need, 0)) >= 0
        # .cg loads of h: from L2, where the other programs stored it, never a stale L1 line
        acc = tl.zeros([BM, BN2], tl.float32)
        if all_stored:  # a plain GEMV loop, which the compiler can software-pipeline
            ht = tl.load(h_rows + rk[None, :], mask=m_mask & (rk[None, :] < INTER), other=0.0,
                         cache_modifier=".cg")  # fmt: skip
            acc = _dot_tile(acc, ht, wt)
            for k0 in range(HB, INTER, HB):
                k_mask = (k0 + rk)[None, :] < INTER
                wt = tl.load(d_rows + k0 + rk[None, :], mask=w_mask & k_mask, other=0.0)
                ht = tl.load(h_rows + k0 + rk[None, :], mask=m_mask & k_mask, other=0.0,
                             cache_modifier=".cg")  # fmt: skip
                acc = _dot_tile(acc, ht, wt)
        else:
            for b in range(0, n_blocks):
                k0 = b * HB
                k_mask = (k0 + rk)[None, :] < INTER
                if b > 0:  # block 0's weight tile was loaded before the PDL wait
                    wt = tl.load(d_rows + k0 + rk[None, :], mask=w_mask & k_mask, other=0.0)
                # gate_up tiles of block b: HB / BN1, fewer in a last, partial block
                _wait_until(sync + 2 + b, tl.cdiv(tl.minimum(HB, INTER - k0), BN1))
                ht = tl.load(h_rows + k0 + rk[None, :], mask=m_mask & k_mask, other=0.0,
                             cache_modifier=".cg")  # fmt: skip
                acc = _dot_tile(acc, ht, wt)
        out_mask = m_mask & (rn[None, :] < HIDDEN)
        out = res + rm[:, None] * srm + rn[None, :]
        # rounded as small_m_gemm.gemv(residual=...) rounds: the GEMV, then the add
        r = tl.load(out, mask=out_mask, other=0.0).to(tl.float32)
        y = (acc.to(res.dtype.element_ty).to(tl.float32) + r).to(res.dtype.element_ty)
        tl.store(out, y, mask=out_mask)
        # every down tile counted here is past its waits, so the last one may zero the flags
        done = tl.atomic_add(sync + 1, 1, sem="acq_rel", scope="gpu")
        if done == tl.cdiv(HIDDEN, BN2) - 1:
            tl.store(sync + 2 + nb, tl.zeros([NB_POW2], tl.int32), mask=nb < n_blocks)
            tl.atomic_xchg(sync + 1, 0, sem="relaxed", scope="gpu")

    @triton.jit
    def _down_item(item, w_down, h, part, res, sync, M, INTER, HIDDEN, shm, srm,
                   BM: tl.constexpr, BN1: tl.constexpr, BN2: tl.constexpr, HB: tl.constexpr,
                   NB_POW2: tl.constexpr, PDL_WAIT: tl.constexpr):  # fmt: skip
        """Split down: the partial sums of BN2 output rows over one h block, stored to part;
        the last of a row tile's blocks to arrive adds the partials in block order (a fixed
        order, so the result does not depend on which one that is) and the residual."""
        n_rt = tl.cdiv(HIDDEN, BN2)
        n_blocks = tl.cdiv(INTER, HB)
        b = item // n_rt  # block-major: items of h block 0 (stored first) come first
        r = item % n_rt
        rm = tl.arange(0, BM)
        m_mask = rm[:, None] < M
        rn = r * BN2 + tl.arange(0, BN2)
        rk = b * HB + tl.arange(0, HB)
        k_mask = rk[None, :] < INTER
        wt = tl.load(w_down + rn[:, None] * INTER + rk[None, :],
                     mask=(rn[:, None] < HIDDEN) & k_mask, other=0.0)  # fmt: skip
        if PDL_WAIT:
            gdc_launch_dependents()
            gdc_wait()
        _wait_until(sync + 2 + b, tl.cdiv(tl.minimum(HB, INTER - b * HB), BN1))
        ht = tl.load(h + rm[:, None] * shm + rk[None, :], mask=m_mask & k_mask, other=0.0,
                     cache_modifier=".cg")  # fmt: skip
        out_mask = m_mask & (rn[None, :] < HIDDEN)
        p_rows = part + rm[:, None] * HIDDEN + rn[None, :]  # part is [n_blocks, M, HIDDEN]
        tl.store(p_rows + b * M * HIDDEN, _dot_tile(tl.zeros([BM, BN2], tl.float32), ht, wt),
                 mask=out_mask)  # fmt: skip
        tl.debug_barrier()  # every thread's partials precede the release below
        if tl.atomic_add(sync + 2 + 256 + r, 1, sem="acq_rel", scope="gpu") == n_blocks - 1:
            acc = tl.zeros([BM, BN2], tl.float32)
            for bb in range(0, n_blocks):
                acc += tl.load(p_rows + bb * M * HIDDEN, mask=out_mask, other=0.0,
                               cache_modifier=".cg")  # fmt: skip
            out = res + rm[:, None] * srm + rn[None, :]
            y = acc.to(res.dtype.element_ty).to(tl.float32)
            y += tl.load(out, mask=out_mask, other=0.0).to(tl.float32)
            tl.store(out, y.to(res.dtype.element_ty), mask=out_mask)
            tl.atomic_xchg(sync + 2 + 256 + r, 0, sem="relaxed", scope="gpu")
            # every row tile finished: every item is past its wait, so the flags may go
            if tl.atomic_add(sync + 1, 1, sem="acq_rel", scope="gpu") == n_rt - 1:
                nb = tl.arange(0, NB_POW2)
                tl.store(sync + 2 + nb, tl.zeros([NB_POW2], tl.int32), mask=nb < n_blocks)
                tl.atomic_xchg(sync + 1, 0, sem="relaxed", scope="gpu")

    @triton.jit
    def _fused_mlp_kernel(x, w_gu, w_down, h, part, res, sync, M, INTER, HIDDEN, sxm, shm, srm,
                          BM: tl.constexpr, BN1: tl.constexpr, BK1: tl.constexpr,
                          BN2: tl.constexpr, HB: tl.constexpr, NB_POW2: tl.constexpr,
                          PDL_WAIT_FIRST: tl.constexpr, PDL_WAIT_LATE: tl.constexpr,
                          SPLIT: tl.constexpr):  # fmt: skip
        # PDL_WAIT_FIRST: wait for the previous kernel before anything else; PDL_WAIT_LATE:
        # after the first weight tiles are loaded (early_ticket)
        n_gu = tl.cdiv(INTER, BN1)
        if PDL_WAIT_FIRST:
            gdc_launch_dependents()
            gdc_wait()
        pid = tl.program_id(0)
        if pid < n_gu:
            _gate_up_tile(pid, x, w_gu, h, sync, M, INTER, HIDDEN, sxm, shm,
                          BM, BN1, BK1, HB, PDL_WAIT_LATE)  # fmt: skip
        elif SPLIT:
            _down_item(pid - n_gu, w_down, h, part, res, sync, M, INTER, HIDDEN, shm, srm,
                       BM, BN1, BN2, HB, NB_POW2, PDL_WAIT_LATE)  # fmt: skip
        else:
            _down_tile(pid - n_gu, w_down, h, res, sync, M, INTER, HIDDEN, shm, srm,
                       BM, BN1, BN2, HB, NB_POW2, PDL_WAIT_LATE)  # fmt: skip


def new_sync_buffer(device: torch.device | str) -> torch.Tensor:
    """A zeroed sync buffer for one fused_mlp_add_ call site (see the module docstring)."""
    return torch.zeros(SYNC_SIZE, dtype=torch.int32, device=device)


def fused_mlp_add_(
    x: torch.Tensor,
    w_gate_up: torch.Tensor,
    w_down: torch.Tensor,
    residual: torch.Tensor,
    sync: torch.Tensor,
    cfg: tuple,
    pdl: bool = False,
    early_ticket: bool = False,
) -> torch.Tensor:
    """residual += silu(x @ gate^T) * (x @ up^T) @ w_down^T in place (returned), for
    w_gate_up = [gate; up] [2I, H] and w_down [H, I], both row-major, x [M, H] and
    residual [M, H] with M <= small_m_gemm.MAX_M; cfg is (BN1, BK1, BN2, HB, num_warps,
    split[, num_stages]) (see _CONFIGS). pdl launches it as a programmatic dependent of the previous kernel;
    early_ticket also draws the tickets and loads the first weight tiles before the wait,
    which is only safe where the previous kernel is not a launch on the same sync buffer."""
    m, hidden = x.shape
    inter = w_down.shape[1]
    assert w_gate_up.shape == (2 * inter, hidden) and w_down.shape == (hidden, inter)
    assert w_gate_up.is_contiguous() and w_down.is_contiguous() and x.stride(1) == 1
    assert residual.shape == (m, hidden) and residual.stride(1) == 1, residual.shape
    bn1, bk1, bn2, hb, warps, split = cfg[:6]
    extra = {"num_stages": cfg[6]} if len(cfg) > 6 else {}
    bm = max(1, triton.next_power_of_2(m))
    if bm > 1:  # keep the per-thread register tiles bounded, as small_m_gemm.gemv does
        bk1, hb = max(32, bk1 // bm), max(bn1, hb // bm)
    n_blocks, row_tiles = triton.cdiv(inter, hb), triton.cdiv(hidden, bn2)
    assert hb % bn1 == 0 and n_blocks <= 256 and row_tiles <= SYNC_SIZE - 258, (cfg, inter)
    h = torch.empty((m, inter), dtype=x.dtype, device=x.device)
    part = torch.empty((n_blocks, m, hidden) if split else (1,), dtype=torch.float32,
                       device=x.device)  # fmt: skip
    grid = (triton.cdiv(inter, bn1) + row_tiles * (n_blocks if split else 1),)
    _fused_mlp_kernel[grid](
        x, w_gate_up, w_down, h, part, residual, sync, m, inter, hidden,
        x.stride(0), h.stride(0), residual.stride(0),
        BM=bm, BN1=bn1, BK1=bk1, BN2=bn2, HB=hb,
        NB_POW2=triton.next_power_of_2(triton.cdiv(inter, hb)),
        PDL_WAIT_FIRST=pdl and not early_ticket, PDL_WAIT_LATE=pdl and early_ticket,
        SPLIT=bool(split),
        num_warps=warps, launch_pdl=pdl, **extra,
    )  # fmt: skip
    return residual


def _unfused(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, residual) -> None:
    """The two small_m_gemm GEMVs (or cuBLAS where they lose) this kernel replaces."""
    act = small_m_gemm.linear_silu_mul(x, w_gate_up)
    if act is None:
        from mini_sglang.layers.fused_kernels import silu_and_mul

        act = silu_and_mul(small_m_gemm.linear(x, w_gate_up))
    if not small_m_gemm.linear_add_(act, w_down, residual):
        residual.add_(small_m_gemm.linear(act, w_down))


def _pick(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor) -> tuple | None:
    residual = torch.zeros_like(x)
    sync = new_sync_buffer(x.device)
    pdl = pdl_enabled(x)
    # the L2 flush between calls keeps launches on one sync buffer apart (see the docstring)
    unfused_ms = cuda_time_ms(lambda: _unfused(x, w_gate_up, w_down, residual), cold_l2=True)
    times = {}
    for cfg in _CONFIGS:
        try:
            times[cfg] = cuda_time_ms(
                lambda cfg=cfg: fused_mlp_add_(
                    x, w_gate_up, w_down, residual, sync, cfg, pdl=pdl, early_ticket=True
                ),
                cold_l2=True,
            )
        except Exception:  # a config the compiler rejects on this card
            continue
    best = min(times, key=times.__getitem__, default=None)
    if best is None or times[best] > unfused_ms * _MARGIN:
        best = None
    logger.debug(
        "fused MLP M=%d I=%d H=%d: %s (%.1f us; two GEMVs %.1f us)",
        x.shape[0], w_down.shape[1], x.shape[1], best or "unfused",
        1000 * times.get(best, unfused_ms), 1000 * unfused_ms,
    )  # fmt: skip
    return best


def fused_mlp_config(
    x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor
) -> tuple | None:
    """The config to run the MLP of x as one kernel with, or None where the two GEMVs serve:
    whatever small_m_gemm.eligible rejects (CPU, float32, more than MAX_M rows),
    MINI_SGLANG_DISABLE_FUSED_MLP=1 or MINI_SGLANG_DISABLE_GEMV_NORM_FUSION=1, or the fused
    kernel timed slower than the two GEMVs (cold L2, once per power-of-two bucket of M and
    shape, outside CUDA-graph capture). MINI_SGLANG_FUSED_MLP_CONFIG forces a config."""
    if not (_ENABLED and small_m_gemm.FUSE_NORM and small_m_gemm.eligible(x)):
        return None
    bucket = triton.next_power_of_2(x.shape[0])
    key = (bucket, *w_down.shape, x.dtype)
    if key not in _choice:
        if torch.cuda.is_current_stream_capturing():
            return None
        if _FORCED:
            _choice[key] = tuple(int(v) for v in _FORCED.split(","))
        else:
            _choice[key] = _pick(x.new_zeros((bucket, x.shape[1])), w_gate_up, w_down)
    return _choice[key]
