"""GPU: --quantization-param-path scales and longrope through the CUDA kernels and graphs.

- FP8 KV scales from SGLang's JSON file (tests/models/test_fp8_kv_scales_file.py on CPU):
  on flashinfer and Triton with CUDA graphs, the file's scales reach the layers before the
  graphs are captured, and prefill logits stay within FP8 tolerance of the bf16-KV run
  while differing from the scale-1.0 FP8 run; greedy decode (graphs) then runs to length
  and the idle memory check is clean.
- longrope (tests/models/test_longrope_vs_hf.py on CPU): a tiny bf16 Llama with longrope,
  flashinfer / Triton with CUDA graphs against torch_native eager on the same GPU: prefill
  logits of a short prompt, a long one (past original_max_position_embeddings) and both in
  one batch (the long rows for both) within bf16 noise; greedy decode across the boundary
  equal until the reference's own top two were within that noise.

Skipped without CUDA; run on the GPU machine by scripts/run_gpu_suite.sh.
"""

from __future__ import annotations

import gc
import json

import pytest
import torch

from tests.conftest import prefill_logits, run_prompts, tiny_config
from tests.gpu.test_gpu_correctness import (
    _backend_kwargs,
    _build_gpu_tiny_model,
    _collect_top_logprobs,
    _make_gpu_scheduler,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

BF16_NOISE = 5e-2  # as test_gpu_fp8_kv.py
E4M3_UNIT_ROUNDOFF = 2.0**-4
TOL_UNITS = 2
FILE_SCALES = [0.3, 0.7]
BACKENDS = ["flashinfer", "triton"]
PROMPTS = [list(range(100, 100 + n)) for n in (5, 17, 33)]
ORIGINAL = 16


@pytest.fixture(autouse=True)
def _release_gpu_memory():
    yield
    gc.collect()
    torch.cuda.empty_cache()


def _scheduler(model_path: str, **kw):
    sched, outputs = _make_gpu_scheduler(model_path, skip_tokenizer_init=True, **kw)
    sched.test_outputs = outputs
    return sched


@pytest.fixture(scope="module")
def llama_with_scales_file(tmp_path_factory, qwen_tokenizer) -> tuple[str, str]:
    out = tmp_path_factory.mktemp("gpu_kv_scales_file")
    _build_gpu_tiny_model("llama", out, qwen_tokenizer, perturb=False)
    layers = {str(i): s for i, s in enumerate(FILE_SCALES)}
    data = {
        "model_type": "llama",
        "kv_cache": {"dtype": "float8_e4m3fn", "scaling_factor": {"0": layers}},
    }
    path = out / "kv_scales.json"
    path.write_text(json.dumps(data))
    return str(out), str(path)


@pytest.mark.parametrize("backend", BACKENDS)
def test_scales_file_on_gpu(llama_with_scales_file, backend):
    model_path, scales = llama_with_scales_file
    kw = _backend_kwargs(backend)
    ref = _scheduler(model_path, **kw)
    unit = _scheduler(model_path, kv_cache_dtype="fp8_e4m3", **kw)
    sched = _scheduler(model_path, kv_cache_dtype="fp8_e4m3", quantization_param_path=scales, **kw)
    runner = sched.tp_worker.model_runner
    assert runner.graph_runner is not None
    attns = [layer.self_attn.attn for layer in runner.model.model.layers]
    assert [(a.k_scale, a.v_scale) for a in attns] == [(s, s) for s in FILE_SCALES]

    want = prefill_logits(ref, PROMPTS, all_positions=True).input_logits.float()
    got = prefill_logits(sched, PROMPTS, all_positions=True).input_logits.float()
    one = prefill_logits(unit, PROMPTS, all_positions=True).input_logits.float()
    tol = TOL_UNITS * E4M3_UNIT_ROUNDOFF * want.abs().max().item() + BF16_NOISE
    assert 0 < (got - want).abs().max().item() <= tol
    assert (got - one).abs().max().item() > 0  # the file's scales are applied

    outs = run_prompts(sched, PROMPTS, 16, rid_prefix="g")
    assert [len(r.output_ids) for r in outs] == [16] * len(PROMPTS)
    assert sched.stats.check_memory() and sched.stats.memory_check_failures == 0


@pytest.fixture(scope="module")
def longrope_llama(tmp_path_factory, qwen_tokenizer) -> str:
    from transformers import AutoModelForCausalLM

    half = 32  # head_dim 64
    cfg = tiny_config(
        "llama",
        len(qwen_tokenizer),
        hidden_size=256,
        intermediate_size=512,
        head_dim=64,
        initializer_range=0.02,
        max_position_embeddings=128,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "original_max_position_embeddings": ORIGINAL,
            "short_factor": [1.0 + 0.1 * i for i in range(half)],
            "long_factor": [1.0 + 2.0 * i for i in range(half)],
        },
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    out = tmp_path_factory.mktemp("gpu_longrope")
    model.save_pretrained(str(out), safe_serialization=True)
    qwen_tokenizer.save_pretrained(str(out))
    return str(out)


@pytest.mark.parametrize("backend", BACKENDS)
def test_longrope_kernels_match_torch_native(longrope_llama, backend):
    ref = _scheduler(longrope_llama, attention_backend="torch_native", disable_cuda_graph=True)
    sched = _scheduler(longrope_llama, **_backend_kwargs(backend))
    assert sched.tp_worker.model_runner.graph_runner is not None
    short, long = list(range(200, 200 + ORIGINAL - 4)), list(range(300, 300 + ORIGINAL + 9))
    for batch in ([short], [long], [short, long]):
        want = prefill_logits(ref, batch, all_positions=True).input_logits.float()
        got = prefill_logits(sched, batch, all_positions=True).input_logits.float()
        assert (got - want).abs().max().item() <= BF16_NOISE, batch

    # decode from below the boundary to past it (CUDA graphs on `sched`): the chosen
    # tokens' logprobs agree while the outputs do, and where they part the reference's own
    # top two were within the noise
    tops = []
    for s in (ref, sched):
        start = len(s.test_outputs)
        run_prompts(s, [short], 16, rid_prefix="d", return_logprob=True, top_logprobs_num=2)
        tops.append(_collect_top_logprobs(s.test_outputs[start:])["d0"])
    w, g = tops
    assert len(w["out"]) == len(g["out"]) == 16
    for step, (x, y) in enumerate(zip(w["out"], g["out"])):
        (wv, _), (gv, _) = w["out_top"][step], g["out_top"][step]
        if x != y:
            assert wv[0] - wv[1] <= 2 * BF16_NOISE, step
            break
        assert abs(wv[0] - gv[0]) <= BF16_NOISE, step
