"""GPU: --kv-cache-dtype fp8_e4m3 / fp8_e5m2 on flashinfer and Triton (and flashinfer
prefill + Triton decode), with and without CUDA graphs, against the same backend with a
bf16 KV cache on the same bf16 model.

Checked as on CPU (tests/models/test_fp8_kv_end_to_end.py, whose tolerance reasoning this
shares): prefill logits within TOL_UNITS * u * max|reference logit| (plus bf16's own noise),
16 greedy tokens equal until the reference itself was within twice that of a tie, the radix
cache reusing FP8 KV with the same output up to such a tie, the idle memory check clean, and the pool really
FP8 with half the bf16 cell bytes. The Qwen3 checkpoint carries KV cache scales, so the
scaled paths of every kernel (quantized stores, flashinfer's k_scale / v_scale, Triton's
folded scales, the fused decode_from_qkv kernel) run too.

Skipped without CUDA; run on the GPU machine by scripts/run_gpu_suite.sh.
"""

from __future__ import annotations

import gc

import pytest
import torch

from tests.conftest import prefill_logits, run_prompts
from tests.gpu.test_gpu_correctness import (
    _backend_kwargs,
    _build_gpu_tiny_model,
    _make_gpu_scheduler,
)
from tests.models.test_fp8_kv_end_to_end import (
    QWEN3_SCALES,
    TOL_UNITS,
    UNIT_ROUNDOFF,
    write_qwen3_kv_scales,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

BF16_NOISE = 5e-2  # SGLang's bf16 logprob tolerance, for the two bf16 runs' own rounding
MAX_NEW = 16
# (kv dtype, backend, CUDA graphs). "flashinfer" alone decodes batches of up to 32 requests
# with the Triton kernel (ModelRunner.small_decode_max_bs), "flashinfer+flashinfer" always
# with flashinfer's; "a+b" is prefill on a, decode on b. e5m2 differs from e4m3 only in the
# conversions, so it runs on one case per decode kernel.
CASES = [
    ("fp8_e4m3", "flashinfer", True),
    ("fp8_e4m3", "flashinfer+flashinfer", True),
    ("fp8_e4m3", "flashinfer+flashinfer", False),
    ("fp8_e4m3", "triton", True),
    ("fp8_e4m3", "flashinfer+triton", True),
    ("fp8_e5m2", "flashinfer+flashinfer", True),
    ("fp8_e5m2", "triton", True),
]


@pytest.fixture(autouse=True)
def _release_gpu_memory():
    yield
    gc.collect()
    torch.cuda.empty_cache()


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def model_path(request, tmp_path_factory, qwen_tokenizer) -> str:
    """A tiny model flashinfer can run (head_dim 64) whose logits bf16 represents well
    (initializer_range 0.02, see test_gpu_correctness.py); Qwen3 with checkpoint KV scales."""
    arch = request.param
    out = tmp_path_factory.mktemp(f"gpu_fp8kv_{arch}")
    _build_gpu_tiny_model(arch, out, qwen_tokenizer, perturb=False)
    if arch == "qwen3":
        write_qwen3_kv_scales(out)
    return str(out)


def _scheduler(model_path: str, backend: str, graphs: bool, kv: str, **kw):
    sched, outputs = _make_gpu_scheduler(
        model_path,
        kv_cache_dtype=kv,
        disable_cuda_graph=not graphs,
        skip_tokenizer_init=True,
        **_backend_kwargs(backend),
        **kw,
    )
    sched.test_outputs = outputs
    return sched


PROMPTS = [list(range(100, 100 + n)) for n in (5, 17, 33, 64)]


def _assert_diverge_only_at_ties(judge, want: list[list[int]], got: list[list[int]], kv: str):
    """Each prompt's `got` tokens equal `want`'s up to the first step where they differ, and
    there want's token leads got's by at most twice the FP8 bound (plus bf16's noise) in
    judge's next-token logits after the prompt and want's earlier tokens: a near tie, which
    any rounding difference may flip (the tiny model's logits are flat enough for bf16 to
    round two of them to the same value)."""
    for prompt, wi, gi in zip(PROMPTS, want, got):
        step = next((i for i, (x, y) in enumerate(zip(wi, gi)) if x != y), None)
        if step is None:
            continue
        row = prefill_logits(judge, [prompt + wi[:step]], all_positions=False).next_token_logits[0]
        margin = (row[wi[step]] - row[gi[step]]).float().item()
        step_tol = TOL_UNITS * UNIT_ROUNDOFF[kv] * row.abs().max().item() + BF16_NOISE
        assert margin <= 2 * step_tol, (prompt[:3], step, margin, step_tol)


@pytest.mark.parametrize(
    "kv,backend,graphs", CASES, ids=[f"{k}-{b}-{'graphs' if g else 'eager'}" for k, b, g in CASES]
)
def test_fp8_kv_against_bf16_kv(model_path, backend, graphs, kv):
    # pages of 1 given, as an e4m3 pool decoded by flashinfer on sm90+ defaults to 16 (XQA,
    # the next test)
    ref = _scheduler(model_path, backend, graphs, "auto", page_size=1)
    sched = _scheduler(model_path, backend, graphs, kv, page_size=1)
    runner, ref_runner = sched.tp_worker.model_runner, ref.tp_worker.model_runner
    assert (
        runner.token_to_kv_pool.k_buffer[0].dtype
        == {
            "fp8_e4m3": torch.float8_e4m3fn,
            "fp8_e5m2": torch.float8_e5m2,
        }[kv]
    )
    assert runner.kv_cell_bytes() * 2 == ref_runner.kv_cell_bytes()
    assert (runner.graph_runner is not None) == graphs
    small = getattr(runner.attn_backend, "small_decode_max_bs", 0)
    assert (small > 0) == (backend == "flashinfer")
    attns = [layer.self_attn.attn for layer in runner.model.model.layers]
    scales = [(a.k_scale, a.v_scale) for a in attns]
    assert scales == (QWEN3_SCALES if "qwen3" in model_path else [(1.0, 1.0)] * 2)

    # prefill logits at every prompt position
    want = prefill_logits(ref, PROMPTS, all_positions=True).input_logits.float()
    got = prefill_logits(sched, PROMPTS, all_positions=True).input_logits.float()
    tol = TOL_UNITS * UNIT_ROUNDOFF[kv] * want.abs().max().item() + BF16_NOISE
    diff = (got - want).abs().max().item()
    assert 0 < diff <= tol, (diff, tol)

    _check_decode_and_radix_cache(ref, sched, kv)


def _check_decode_and_radix_cache(ref, sched, kv: str, page_size: int = 1) -> None:
    """Greedy decode (CUDA graphs where on) against the bf16-KV run, then the same prompts
    from the radix cache (all but each prompt's last token, in whole pages), then the idle
    memory check."""
    w = [r.output_ids for r in run_prompts(ref, PROMPTS, MAX_NEW, rid_prefix="a")]
    g = [r.output_ids for r in run_prompts(sched, PROMPTS, MAX_NEW, rid_prefix="a")]
    _assert_diverge_only_at_ties(ref, w, g, kv)
    start = len(sched.test_outputs)
    again = [r.output_ids for r in run_prompts(sched, PROMPTS, MAX_NEW, rid_prefix="b")]
    cached = {}
    for msg in sched.test_outputs[start:]:
        cached.update(zip(msg.rids, msg.cached_tokens))
    want_cached = [(len(p) - 1) // page_size * page_size for p in PROMPTS]
    assert [cached[f"b{i}"] for i in range(len(PROMPTS))] == want_cached
    # the cached prefix's FP8 KV against the KV the first run attended to (some backends
    # attend to a batch's own new tokens unquantized): the same tokens up to a near tie
    _assert_diverge_only_at_ties(sched, g, again, kv)
    m = sched.stats.memory_accounting()
    assert m["protected"] == 0 and m["free"] + m["evictable"] == m["capacity"], m
    assert sched.stats.check_memory() and sched.stats.memory_check_failures == 0


@pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
    reason="XQA's FP8 path: sm90+",
)
def test_fp8_e4m3_kv_defaults_to_xqa_decode(model_path, monkeypatch):
    """--kv-cache-dtype fp8_e4m3 alone, on flashinfer: pages of 16, and flashinfer's XQA
    kernel decodes the FP8 pool (in CUDA graphs), matching the bf16-KV run as the other
    decode kernels do."""
    monkeypatch.delenv("MINI_SGLANG_XQA_DECODE", raising=False)
    backend = "flashinfer+flashinfer"
    ref = _scheduler(model_path, backend, True, "auto", page_size=16)
    sched = _scheduler(model_path, backend, True, "fp8_e4m3")
    assert sched.page_size == 16
    be = sched.tp_worker.model_runner.attn_backend
    assert getattr(be, "decode_backend", be).xqa
    be = ref.tp_worker.model_runner.attn_backend
    assert not getattr(be, "decode_backend", be).xqa  # a bf16 pool keeps flashinfer's decode
    _check_decode_and_radix_cache(ref, sched, "fp8_e4m3", page_size=16)
