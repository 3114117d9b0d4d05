"""--kv-cache-dtype fp8_e4m3 / fp8_e5m2 end to end on CPU (torch_native), tiny random Llama
and Qwen3 saved by transformers, against the same model with a float32 KV cache.

The Qwen3 checkpoint also carries KV cache scales (the deprecated `kv_scale` form on layer 0,
ModelOpt's `k_proj.k_scale` / `v_proj.v_scale` on layer 1); Llama has none, so its scales
are SGLang's default 1.0.

Tolerance. FP8 rounds each stored K/V value within u of itself (relative; u = 2^-4 for e4m3,
2^-3 for e5m2). Those errors move attention outputs and, through two layers, the logits by a
similar relative amount: logits may differ from the float32-KV run's by at most
TOL_UNITS * u * max|reference logit|. Greedy tokens must then be the reference's until a
step where the reference's own top two were within twice that (either may move by it),
after which the continuations may part. The models use initializer_range 0.1: at the
shared fixtures' 0.3 attention scores are so large that a few percent on a key flips the
softmax, which says more about the random weights than about the cache.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from tests.conftest import (
    assert_memory_all_free,
    build_tiny_model,
    make_scheduler,
    prefill_logits,
    run_prompts,
)

UNIT_ROUNDOFF = {"fp8_e4m3": 2.0**-4, "fp8_e5m2": 2.0**-3}
TOL_UNITS = 2
MAX_NEW = 16
PROMPTS = [
    "Hello world, this is",
    "The capital of France is Paris. The capital of Germany is Berlin. The capital of",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
]
# Qwen3's checkpoint scales: (k_scale, v_scale) of layers 0 and 1.
QWEN3_SCALES = [(0.5, 0.5), (0.25, 2.0)]


class Tiny:
    """One tiny model on disk, its prompts, and schedulers by --kv-cache-dtype (made once)."""

    def __init__(self, arch: str, path: str, prompts: list[list[int]]) -> None:
        self.arch, self.path, self.prompts = arch, path, prompts
        self._schedulers: dict[str, object] = {}

    def scheduler(self, kv_cache_dtype: str):
        if kv_cache_dtype not in self._schedulers:
            self._schedulers[kv_cache_dtype] = make_scheduler(
                self.path, kv_cache_dtype=kv_cache_dtype, skip_tokenizer_init=True
            )
        return self._schedulers[kv_cache_dtype]


def write_qwen3_kv_scales(model_dir: Path) -> None:
    """Save QWEN3_SCALES into model_dir as a checkpoint shard, in the three spellings a
    checkpoint may use (layer 0's deprecated kv_scale, layer 1's k_proj / v_proj form)."""
    (k0, _), (k1, v1) = QWEN3_SCALES
    scales = {
        "model.layers.0.self_attn.kv_scale": torch.tensor(k0),
        "model.layers.1.self_attn.k_proj.k_scale": torch.tensor(k1),
        "model.layers.1.self_attn.v_proj.v_scale": torch.tensor(v1),
    }
    save_file(scales, str(model_dir / "kv_scales.safetensors"))


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def tiny(request, tmp_path_factory: pytest.TempPathFactory, qwen_tokenizer) -> Tiny:
    arch = request.param
    path = tmp_path_factory.mktemp(f"fp8kv_{arch}")
    build_tiny_model(arch, path, qwen_tokenizer, initializer_range=0.1)
    if arch == "qwen3":
        write_qwen3_kv_scales(path)
    return Tiny(arch, str(path), [qwen_tokenizer.encode(p) for p in PROMPTS])


def _tolerance(kv: str, ref_logits: torch.Tensor) -> float:
    return TOL_UNITS * UNIT_ROUNDOFF[kv] * ref_logits.abs().max().item()


def test_fp8_pool_scales_and_size(tiny: Tiny) -> None:
    """The pool is FP8 with a quarter of float32's cell bytes (half of bf16's): the same
    memory budget holds four times the tokens; the checkpoint's scales reach the layers."""
    ref = tiny.scheduler("auto").tp_worker.model_runner
    for kv, dtype in (("fp8_e4m3", torch.float8_e4m3fn), ("fp8_e5m2", torch.float8_e5m2)):
        runner = tiny.scheduler(kv).tp_worker.model_runner
        assert runner.token_to_kv_pool.k_buffer[0].dtype == dtype
        assert runner.kv_cell_bytes() * 4 == ref.kv_cell_bytes()
        assert runner.profile_max_num_tokens() // 4 == ref.profile_max_num_tokens()
        attns = [layer.self_attn.attn for layer in runner.model.model.layers]
        got = [(a.k_scale, a.v_scale) for a in attns]
        assert got == (QWEN3_SCALES if tiny.arch == "qwen3" else [(1.0, 1.0)] * 2)


@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2"])
def test_prefill_logits_within_fp8_tolerance(tiny: Tiny, kv: str) -> None:
    ref = prefill_logits(tiny.scheduler("auto"), tiny.prompts, all_positions=True)
    got = prefill_logits(tiny.scheduler(kv), tiny.prompts, all_positions=True)
    tol = _tolerance(kv, ref.input_logits)
    diff = (got.input_logits - ref.input_logits).abs().max().item()
    assert 0 < diff <= tol, (diff, tol)  # > 0: the FP8 pool is really in use
    assert_memory_all_free(tiny.scheduler(kv))


@pytest.mark.parametrize("kv", ["fp8_e4m3", "fp8_e5m2"])
def test_greedy_tokens_within_fp8_tolerance(tiny: Tiny, kv: str) -> None:
    ref_sched, sched = tiny.scheduler("auto"), tiny.scheduler(kv)
    for s in (ref_sched, sched):
        s.flush_cache()
    want = [r.output_ids for r in run_prompts(ref_sched, tiny.prompts, MAX_NEW, rid_prefix=kv)]
    got = [r.output_ids for r in run_prompts(sched, tiny.prompts, MAX_NEW, rid_prefix=kv)]
    for prompt, w, g in zip(tiny.prompts, want, got):
        assert len(g) == MAX_NEW
        step = next((i for i, (a, b) in enumerate(zip(w, g)) if a != b), None)
        if step is None:
            continue
        # Where they part, the reference itself was nearly tied between the two tokens.
        logits = prefill_logits(ref_sched, [prompt + w[:step]], all_positions=False)
        row = logits.next_token_logits[0]
        assert int(row.argmax()) == w[step]
        margin = (row[w[step]] - row[g[step]]).item()
        tol = _tolerance(kv, row)
        assert margin <= 2 * tol, (step, margin, tol)
    assert_memory_all_free(sched)


def test_radix_cache_reuses_fp8_kv(tiny: Tiny) -> None:
    """A second round of the same prompts prefills from the FP8 KV the first one cached
    (cached_tokens = all but the last prompt token) and decodes the same tokens; afterwards
    nothing is held and the idle memory check is clean."""
    sched = tiny.scheduler("fp8_e4m3")
    sched.flush_cache()
    first = run_prompts(sched, tiny.prompts, MAX_NEW, rid_prefix="first")
    start = len(sched.test_outputs)
    again = run_prompts(sched, tiny.prompts, MAX_NEW, rid_prefix="again")
    cached = {}
    for msg in sched.test_outputs[start:]:
        cached.update(zip(msg.rids, msg.cached_tokens))
    assert [cached[f"again{i}"] for i in range(len(tiny.prompts))] == [
        len(p) - 1 for p in tiny.prompts
    ]
    assert [r.output_ids for r in again] == [r.output_ids for r in first]
    assert_memory_all_free(sched)
    assert sched.stats.memory_check_failures == 0  # the idle checks run by the scheduler
