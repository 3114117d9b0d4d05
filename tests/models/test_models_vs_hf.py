"""Tiny random Llama / Qwen2 / Qwen3 models: mini-sglang against HF transformers.

Each model is saved with `save_pretrained` (safetensors) and loaded by both. Checked:
prefill logits (last and every position) within 1e-3 in float32, and greedy generation
token-identical to transformers' `generate` through the real Scheduler: all requests at
once, requests joining while others decode, without the radix cache, with page_size 4, and
with a KV pool so small that prompts are chunked and running requests get retracted.
After every run all KV and request slots must be free again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from mini_sglang.managers.io_struct.control import AbortReq
from mini_sglang.sampling.sampling_params import SamplingParams
from tests.conftest import (
    assert_memory_all_free,
    build_tiny_model,
    collect_outputs,
    hf_greedy,
    make_req,
    make_scheduler,
    prefill_logits,
    run_prompts,
    use_interpreted_gemvs,
)

ARCHS = ["llama", "qwen2", "qwen3"]
MAX_NEW_TOKENS = 32
LOGITS_ATOL = 1e-3

# Varied lengths on purpose: a single token, short, long (> the chunk size used below),
# multi-byte UTF-8, and a repeated prefix so the radix cache gets a hit.
PROMPTS = [
    "Hello world, this is",
    "x",
    "The capital of France is Paris. The capital of Germany is Berlin. The capital of "
    "Italy is Rome. The capital of Spain is Madrid. The capital of Japan is",
    "中文测试：今天天气很好 😀🚀",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "Hello world, this is a longer variant of the first prompt",
]


@dataclass
class TinyModel:
    """One tiny model on disk plus the transformers reference outputs for PROMPTS."""

    arch: str
    path: str
    hf_model: Any
    prompts: list[list[int]]
    hf_outputs: list[list[int]]


@pytest.fixture(scope="module", params=ARCHS)
def tiny(request, tmp_path_factory: pytest.TempPathFactory, qwen_tokenizer) -> TinyModel:
    arch = request.param
    path = tmp_path_factory.mktemp(f"tiny_{arch}")
    hf_model = build_tiny_model(arch, path, qwen_tokenizer)
    prompts = [qwen_tokenizer.encode(p) for p in PROMPTS]
    assert len({len(p) for p in prompts}) >= 5, "prompt lengths should differ"
    hf_outputs = [hf_greedy(hf_model, p, MAX_NEW_TOKENS, ignore_eos=True) for p in prompts]
    for out in hf_outputs:
        # Guards the test's power: one repeated token would match almost any model.
        assert len(out) == MAX_NEW_TOKENS and len(set(out)) >= 8, out
    return TinyModel(arch, str(path), hf_model, prompts, hf_outputs)


@pytest.fixture(scope="module")
def scheduler(tiny: TinyModel):
    """The unconstrained configuration (radix cache, page size 1, a roomy pool)."""
    return make_scheduler(tiny.path)


def test_config_features_reach_the_model(tiny: TinyModel, scheduler) -> None:
    """The features under test are really on in the loaded model (not silently dropped)."""
    model = scheduler.tp_worker.model_runner.model
    attn = model.model.layers[0].self_attn
    if tiny.arch == "llama":
        assert model.lm_head is not model.model.embed_tokens  # untied head
        assert tiny.hf_model.config.rope_scaling["rope_type"] == "llama3"
    if tiny.arch == "qwen2":
        assert attn.qkv_proj.bias is not None
    if tiny.arch == "qwen3":
        assert attn.qk_norm and attn.head_dim == 32 != 64 // 4


# ---- prefill logits ----------------------------------------------------------------------


@torch.no_grad()
def _hf_logits(hf_model, ids: list[int]) -> torch.Tensor:
    """transformers' logits for every position of one prompt, [len, vocab] float32."""
    return hf_model(torch.tensor([ids])).logits[0].float()


def test_prefill_last_logits_match_hf(tiny: TinyModel, scheduler) -> None:
    out = prefill_logits(scheduler, tiny.prompts, all_positions=False)
    assert out.next_token_logits.shape == (len(tiny.prompts), scheduler.model_config.vocab_size)
    for i, ids in enumerate(tiny.prompts):
        ref = _hf_logits(tiny.hf_model, ids)[-1]
        diff = (out.next_token_logits[i] - ref).abs().max().item()
        assert diff <= LOGITS_ATOL, f"prompt {i} (len {len(ids)}): max |diff| {diff}"
    assert_memory_all_free(scheduler)


def test_prefill_all_position_logits_match_hf(tiny: TinyModel, scheduler) -> None:
    out = prefill_logits(scheduler, tiny.prompts, all_positions=True)
    assert out.input_logits_lens == [len(p) for p in tiny.prompts]
    offset = 0
    for i, ids in enumerate(tiny.prompts):
        ref = _hf_logits(tiny.hf_model, ids)
        got = out.input_logits[offset : offset + len(ids)]
        offset += len(ids)
        diff = (got - ref).abs().max().item()
        assert diff <= LOGITS_ATOL, f"prompt {i} (len {len(ids)}): max |diff| {diff}"
        assert torch.allclose(out.next_token_logits[i], ref[-1], atol=LOGITS_ATOL)
    assert_memory_all_free(scheduler)


# ---- greedy generation through the scheduler ---------------------------------------------
def _assert_same_as_hf(tiny: TinyModel, results) -> None:
    for i, (res, ref) in enumerate(zip(results, tiny.hf_outputs)):
        assert res.output_ids == ref, f"prompt {i}: mini-sglang {res.output_ids} != HF {ref}"
        assert res.finish_reason == {"type": "length", "length": MAX_NEW_TOKENS}


def test_greedy_batch_matches_hf(tiny: TinyModel, scheduler) -> None:
    results = run_prompts(scheduler, tiny.prompts, MAX_NEW_TOKENS)
    _assert_same_as_hf(tiny, results)
    assert_memory_all_free(scheduler)
    # Again: now the prompts (and outputs) are in the radix cache and prefill reuses them.
    before = scheduler.tree_cache.evictable_size()
    assert before > 0
    results = run_prompts(scheduler, tiny.prompts, MAX_NEW_TOKENS, rid_prefix="again")
    _assert_same_as_hf(tiny, results)
    assert_memory_all_free(scheduler)


def test_greedy_staggered_arrivals_match_hf(tiny: TinyModel, scheduler) -> None:
    """Requests join while earlier ones are mid-decode: two at once, then one every few
    steps, so prefill batches are interleaved with (and merged into) the running batch."""
    scheduler.flush_cache()  # no prefix hits: this is about batching, not caching
    results = run_prompts(
        scheduler, tiny.prompts, MAX_NEW_TOKENS, stagger=lambda i: 0 if i < 2 else 3
    )
    _assert_same_as_hf(tiny, results)
    assert_memory_all_free(scheduler)


VARIANTS = {
    "no_overlap": dict(disable_overlap_schedule=True),
    "no_radix_cache": dict(disable_radix_cache=True),
    "page_size_4": dict(page_size=4),
    # 160 KV slots for ~330 tokens of work and 16-token chunks: prompts are prefilled in
    # chunks and the decode batch runs out of KV, so requests get retracted and re-run.
    "tiny_pool_chunked": dict(max_total_tokens=160, chunked_prefill_size=16),
    "tiny_pool_chunked_page_size_4": dict(
        max_total_tokens=160, chunked_prefill_size=16, page_size=4
    ),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_greedy_variants_match_hf(tiny: TinyModel, variant: str) -> None:
    kw = VARIANTS[variant]
    sched = make_scheduler(tiny.path, **kw)
    results = run_prompts(sched, tiny.prompts, MAX_NEW_TOKENS)
    _assert_same_as_hf(tiny, results)
    if "max_total_tokens" in kw:
        assert sched.stats.num_retracted_reqs > 0, "the tiny pool should force retraction"
    assert_memory_all_free(sched)
    # Staggered arrivals under the same constraints.
    results = run_prompts(
        sched, tiny.prompts, MAX_NEW_TOKENS, stagger=lambda i: 2, rid_prefix="stagger"
    )
    _assert_same_as_hf(tiny, results)
    assert_memory_all_free(sched)


def test_tiny_model_files_are_safetensors(tiny: TinyModel) -> None:
    """The models under test were really loaded from safetensors (the format in question)."""
    assert list(Path(tiny.path).glob("*.safetensors"))
    assert not list(Path(tiny.path).glob("*.bin"))


# ---- logprobs through the scheduler --------------------------------------------------------
@pytest.mark.parametrize("variant", ["default", "tiny_pool_chunked"])
def test_prompt_and_output_logprobs_match_hf(tiny: TinyModel, variant: str) -> None:
    """return_logprob with logprob_start_len=0: every prompt token's logprob (the first is
    None) and every output token's logprob equal transformers' log_softmax, also when the
    prompt is prefilled in chunks and when requests are retracted and re-prefilled."""
    sched = make_scheduler(tiny.path, **VARIANTS.get(variant, {}))
    results = run_prompts(
        sched, tiny.prompts, MAX_NEW_TOKENS, return_logprob=True, logprob_start_len=0
    )
    _assert_same_as_hf(tiny, results)
    if variant != "default":
        assert sched.stats.num_retracted_reqs > 0
    for i, (res, prompt, out) in enumerate(zip(results, tiny.prompts, tiny.hf_outputs)):
        full = prompt + out
        ref = torch.log_softmax(_hf_logits(tiny.hf_model, full), dim=-1)
        # Position k's logprob comes from the logits row k - 1.
        ref_in = [ref[k - 1, prompt[k]].item() for k in range(1, len(prompt))]
        ref_out = [ref[len(prompt) - 1 + k, t].item() for k, t in enumerate(out)]
        assert len(res.input_logprobs) == len(prompt), (i, len(res.input_logprobs))
        assert res.input_logprobs[0] is None
        assert res.input_logprobs[1:] == pytest.approx(ref_in, abs=LOGITS_ATOL), i
        assert res.output_logprobs == pytest.approx(ref_out, abs=LOGITS_ATOL), i
    assert_memory_all_free(sched)


# ---- early finishes: lengths, stop tokens, abort ------------------------------------------
@pytest.mark.parametrize("variant", ["page_size_4", "tiny_pool_chunked_page_size_4"])
def test_early_finishes_match_hf_and_free_memory(tiny: TinyModel, variant: str) -> None:
    """Requests that end at different steps (max_new_tokens 1..32, a stop token, an abort
    mid-decode) return HF's greedy prefix and leave no KV or request slot behind; with
    overlap scheduling these are the steps that launch surplus decode slots."""

    sched = make_scheduler(tiny.path, **VARIANTS[variant])
    lengths = [1, 2, 3, 7, MAX_NEW_TOKENS, MAX_NEW_TOKENS]
    stop_req, abort_req = 4, 5
    # A token that first appears mid-way through HF's output of request stop_req.
    ref_stop = tiny.hf_outputs[stop_req]
    stop_token = ref_stop[5]
    expected_stop = ref_stop[: ref_stop.index(stop_token) + 1]
    for i, ids in enumerate(tiny.prompts):
        req = make_req(f"e{i}", ids, lengths[i], ignore_eos=True)
        if i == stop_req:
            sp = SamplingParams(
                max_new_tokens=MAX_NEW_TOKENS, temperature=0.0, stop_token_ids=[stop_token]
            )
            sp.normalize(None)
            req.sampling_params = sp
        sched.add_request(req)
    for _ in range(8):
        sched.run_step()
    sched.add_request(AbortReq(rid=f"e{abort_req}"))
    sched.run_until_idle()
    results = collect_outputs(sched.test_outputs)
    for i in range(len(tiny.prompts)):
        res, ref = results[f"e{i}"], tiny.hf_outputs[i]
        if i == stop_req:
            assert res.output_ids == expected_stop
            assert res.finish_reason == {"type": "stop", "matched": stop_token}
        elif i == abort_req:
            assert res.finish_reason["type"] == "abort"
            assert 0 < len(res.output_ids) < MAX_NEW_TOKENS
            assert res.output_ids == ref[: len(res.output_ids)]
        else:
            assert res.output_ids == ref[: lengths[i]], i
            assert res.finish_reason == {"type": "length", "length": lengths[i]}
    assert_memory_all_free(sched)


@pytest.mark.parametrize("gemvs", ["fallbacks", "triton", "persistent"])
def test_norms_in_gemvs_dataflow_matches_hf(tiny: TinyModel, gemvs: str, monkeypatch) -> None:
    """The decoder's small-batch dataflow where down_proj adds into the residual and the next
    qkv_proj normalises it itself (llama.norms_in_gemvs), forced on for every batch.
    "fallbacks": on CPU each fused step takes its unfused kernel, which checks the dataflow
    itself (the residual stream handed from layer to layer, the final norm). "triton": the
    fused GEMVs (small_m_gemm.linear_rmsnorm, linear_add_) serve every batch of <= 8 rows, in
    Triton's interpreter on CPU; prefill batches take the fallbacks. "persistent" (Llama
    only: the interpreter runs it slowly): one prompt alone, so its decode steps are one
    row, where the persistent GEMV serves and gate_up_proj folds the post-attention norm
    (o_proj adds into the residual instead); its first 12 tokens against transformers'."""
    import mini_sglang.models.llama as llama
    from mini_sglang.layers import small_m_gemm
    from mini_sglang.layers.linear import MergedColumnParallelLinear

    if gemvs == "persistent" and tiny.arch != "llama":
        pytest.skip("the one-row persistent dataflow is the same for every decoder here")
    monkeypatch.setattr(llama, "norms_in_gemvs", lambda x: True)
    folds = []  # what each layer's decision returned: the fold must have served
    if gemvs == "triton":
        use_interpreted_gemvs(monkeypatch)
    elif gemvs == "persistent":
        fold = MergedColumnParallelLinear.rmsnorm_silu_mul_fold
        monkeypatch.setattr(small_m_gemm, "_FUSE_SILU_MUL", True)
        monkeypatch.setattr(small_m_gemm, "_FOLD_MLP_NORM", True)
        monkeypatch.setattr(
            MergedColumnParallelLinear,
            "rmsnorm_silu_mul_fold",
            lambda *a: folds.append(f := fold(*a)) or f,
        )
        use_interpreted_gemvs(monkeypatch, one_row=(4, 0, 4, 1, small_m_gemm.PERSISTENT, 2))
    sched = make_scheduler(tiny.path)
    if gemvs == "persistent":
        (res,) = run_prompts(sched, tiny.prompts[:1], 12)
        assert any(f is not None for f in folds) and any(f is None for f in folds)
        assert res.output_ids == tiny.hf_outputs[0][:12]
    else:
        _assert_same_as_hf(tiny, run_prompts(sched, tiny.prompts, MAX_NEW_TOKENS))
    assert_memory_all_free(sched)
