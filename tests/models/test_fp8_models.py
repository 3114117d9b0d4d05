"""FP8 weights end to end on CPU: tiny random Llama and Qwen3 (saved by transformers) run
with `--quantization fp8`, and FP8 checkpoints of each supported format written here.

The reference is transformers' model with FP8 numerics emulated in float32: each decoder
linear weight replaced by the dequantized FP8 weight the format stores, and each such
layer's input quantized and dequantized as the format quantizes activations (per token, or
per token and group for block-wise weights). mini-sglang's CPU path computes exactly that
function, so the logits agree to float32 summation noise (LOGITS_ATOL, as for the
unquantized models; measured ~5e-6); the unquantized model is checked to be much further
away (> 10 x LOGITS_ATOL, measured 2-3), so the emulation is what is being matched.

In bfloat16 (the GPU dtype) the logits cannot match the emulation that closely: see
fp8_effect_reproduced, which tests/gpu/test_gpu_fp8.py checks and the bfloat16 test here
shows a correct engine passing.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from benchmarks import make_fp8_checkpoint
from mini_sglang.layers.quantization.fp8_kernels import (
    FP8_DTYPE,
    dequantize_rows,
    per_token_group_quant,
    per_token_quant,
    quantize_rows,
)
from mini_sglang.model_executor.weight_updates import get_weights_by_name, load_named_tensors
from tests.conftest import make_scheduler, prefill_logits, randomize_norms_and_biases, tiny_config

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LOGITS_ATOL = 1e-3
BLOCK = (32, 32)
VOCAB = 512
# bfloat16 engines (tests/gpu/test_gpu_fp8.py, and the bf16 test here): logits within
# BF16_TOL_UNITS FP8 half-steps (2^-4) of max |logit| plus BF16_NOISE of the emulation, and
# more than MIN_EFFECT_REPRODUCED of the FP8 effect reproduced (fp8_effect_reproduced)
BF16_TOL_UNITS = 2
BF16_NOISE = 5e-2
MIN_EFFECT_REPRODUCED = 0.5
# token ids (no tokenizer: the models have a small vocabulary): one token, short, long
PROMPTS = [[7], list(range(3, 20)), [(i * 37) % VOCAB for i in range(1, 60)]]


def _linear_names(hf_model, ignored: tuple[str, ...] = ()) -> list[str]:
    return [
        n
        for n, _ in hf_model.named_parameters()
        if n.endswith(".weight")
        and n.split(".")[-2] in LINEARS
        and n[: -len(".weight")] not in ignored
    ]


def _act_qdq(x: torch.Tensor, group: int | None) -> torch.Tensor:
    flat = x.reshape(-1, x.shape[-1])
    if group is None:
        q, s = per_token_quant(flat)
        out = q.float() * s
    else:
        q, s = per_token_group_quant(flat, group)
        out = q.float() * s.repeat_interleave(group, dim=1)[:, : flat.shape[1]]
    return out.reshape(x.shape).to(x.dtype)


def emulated_model(hf_model, weights: dict[str, torch.Tensor], group: int | None):
    """A copy of hf_model with `weights` (dequantized FP8, HF names) swapped in and the
    inputs of those layers quantized and dequantized like activations (per token, or per
    token and `group` columns)."""
    model = copy.deepcopy(hf_model)
    with torch.no_grad():
        for name, w in weights.items():
            model.get_parameter(name).copy_(w)
            module = model.get_submodule(name[: -len(".weight")])
            module.register_forward_pre_hook(lambda m, args: (_act_qdq(args[0], group),))
    return model


@torch.no_grad()
def emulated_logits(hf_model, prompts, weights: dict[str, torch.Tensor], group: int | None):
    """Last-position logits of emulated_model for each prompt."""
    model = emulated_model(hf_model, weights, group)
    return torch.stack([model(torch.tensor([ids])).logits[0, -1].float() for ids in prompts])


@torch.no_grad()
def _hf_logits(hf_model, prompts):
    return torch.stack([hf_model(torch.tensor([ids])).logits[0, -1].float() for ids in prompts])


def bf16_tolerance(want: torch.Tensor) -> float:
    """The max |logit difference| a bfloat16 FP8 engine may have from the emulation's
    logits `want` (see BF16_TOL_UNITS)."""
    return BF16_TOL_UNITS * 2**-4 * want.abs().max().item() + BF16_NOISE


def fp8_effect_reproduced(got: torch.Tensor, want: torch.Tensor, plain: torch.Tensor) -> float:
    """The share of the FP8 effect on the logits that `got` reproduces: the least-squares
    coefficient of got - plain on want - plain, where want is the FP8 emulation's logits and
    plain the unquantized model's (float32). 1 is the emulation, 0 an engine that does not
    quantize.

    A correct bfloat16 engine does not reach 1, and the gap is not small: it quantizes bf16
    activations, whose rounding (2^-9 relative) moves a value across an FP8 rounding
    midpoint (FP8 steps are 2^-4..2^-3 relative) for a few percent of the elements, each
    then off by a whole FP8 step. Rounding only the quantized layers' inputs of the float32
    emulation to bf16 already leaves it 0.6-0.8 x the FP8 effect away in max |logit
    difference| (tiny Llama / Qwen3, every format), so "closer than half the FP8 effect"
    fails for any bf16 engine; the share reproduced stays ~0.8 (0.81 for that rounded
    emulation, 0.78-0.84 for mini-sglang's CPU bf16 path): a flip turns an element's FP8
    rounding error into about its negative, so flips only lower the share, slowly: with
    uniform relative noise of up to 16 x bf16's rounding on those inputs instead, the share
    stays >= 0.6 and the max |difference| <= 0.6 x bf16_tolerance (same models). An
    unquantized engine scores ~0 (measured |share| < 0.01); one quantizing weights only
    0.55-0.65, which MIN_EFFECT_REPRODUCED does not tell from W8A8 with bf16 noise. Above
    ~1 the engine's effect is larger than the format's (flips only lower the share)."""
    effect = (want - plain).flatten().double()
    return float((got - plain).flatten().double() @ effect / (effect @ effect))


class Case:
    """One tiny model on disk and its transformers model."""

    def __init__(self, arch: str, path: Path, hf_model, prompts) -> None:
        self.arch, self.path, self.hf_model, self.prompts = arch, path, hf_model, prompts


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def case(request, tmp_path_factory) -> Case:
    from transformers import AutoModelForCausalLM

    path = tmp_path_factory.mktemp(f"fp8_{request.param}")
    torch.manual_seed(0)
    cfg = tiny_config(request.param, VOCAB)
    hf_model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    randomize_norms_and_biases(hf_model)
    hf_model.save_pretrained(str(path), safe_serialization=True)
    return Case(request.param, path, hf_model, PROMPTS)


def write_fp8_checkpoint(
    case: Case, out: Path, fmt: str, block: tuple[int, int] = BLOCK
) -> tuple[dict, tuple[str, ...]]:
    """An FP8 checkpoint of case's weights in `fmt` (benchmarks/make_fp8_checkpoint.py) at
    out; returns the dequantized weights it stores (HF names) and its ignored layers (one,
    for fp8-block)."""
    ignored = ("model.layers.1.mlp.down_proj",) if fmt == "fp8-block" else ()
    state = case.hf_model.state_dict()
    deq = make_fp8_checkpoint.write_fp8_checkpoint(case.path, out, fmt, block, ignored, state)
    return deq, ignored


def _linears(model):
    for layer in model.model.layers:
        a, m = layer.self_attn, layer.mlp
        yield from (a.qkv_proj, a.o_proj, m.gate_up_proj, m.down_proj)


def test_online_fp8_matches_the_fp8_emulation(case: Case) -> None:
    sched = make_scheduler(str(case.path), quantization="fp8", skip_tokenizer_init=True)
    model = sched.tp_worker.model_runner.model
    assert all(lin.weight.dtype == FP8_DTYPE for lin in _linears(model))
    assert all(lin.weight_scale.shape == (lin.weight.shape[0],) for lin in _linears(model))
    assert model.model.embed_tokens.weight.dtype == model.lm_head.weight.dtype == torch.float32
    got = prefill_logits(sched, case.prompts, all_positions=False).next_token_logits
    weights = {
        n: dequantize_rows(*quantize_rows(case.hf_model.get_parameter(n)))
        for n in _linear_names(case.hf_model)
    }
    ref = emulated_logits(case.hf_model, case.prompts, weights, group=None)
    assert (got - ref).abs().max().item() <= LOGITS_ATOL
    # FP8 really changed the model: the unquantized logits are far away.
    assert (got - _hf_logits(case.hf_model, case.prompts)).abs().max().item() > 10 * LOGITS_ATOL

    # An online update (bf16 tensor) is quantized by the same loaders; get_weights_by_name
    # returns the dequantized weight.
    runner = sched.tp_worker.model_runner
    name = "model.layers.0.mlp.down_proj.weight"
    new = torch.randn(case.hf_model.get_parameter(name).shape) * 0.1
    load_named_tensors(runner, [(name, new.to(torch.bfloat16))])
    assert model.model.layers[0].mlp.down_proj.weight.dtype == FP8_DTYPE
    back = torch.tensor(get_weights_by_name(runner, name, truncate_size=10**6))
    expected = dequantize_rows(*quantize_rows(new.to(torch.bfloat16)))
    torch.testing.assert_close(back, expected, rtol=0, atol=0)


# Each format runs on one of the two models (a scheduler start each).
FORMATS = {"llama": ["fp8-tensor"], "qwen3": ["compressed-tensors", "fp8-block"]}


def test_fp8_checkpoints_match_their_emulation(case: Case, tmp_path: Path) -> None:
    for fmt in FORMATS[case.arch]:
        out = tmp_path / fmt
        out.mkdir()
        deq, ignored = write_fp8_checkpoint(case, out, fmt)
        sched = make_scheduler(str(out), skip_tokenizer_init=True)
        model = sched.tp_worker.model_runner.model
        ignored_layer = model.model.layers[1].mlp.down_proj
        assert (ignored_layer.weight.dtype == torch.float32) == bool(ignored), fmt
        got = prefill_logits(sched, case.prompts, all_positions=False).next_token_logits
        group = BLOCK[1] if fmt == "fp8-block" else None
        ref = emulated_logits(case.hf_model, case.prompts, deq, group=group)
        diff = (got - ref).abs().max().item()
        assert diff <= LOGITS_ATOL, (fmt, diff)


def test_bf16_engine_reproduces_the_fp8_effect(tmp_path: Path) -> None:
    """The GPU test's checks (tests/gpu/test_gpu_fp8.py) on the CPU bfloat16 path, with its
    model shape (initializer_range 0.02, so bf16 represents the logits well; a small
    vocabulary): a correct bf16 engine is within bf16_tolerance of the emulation at every
    prompt position and reproduces most of the FP8 effect (fp8_effect_reproduced)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = tiny_config(
        "llama",
        VOCAB,
        hidden_size=256,
        intermediate_size=512,
        head_dim=64,
        initializer_range=0.02,
    )
    hf_model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    hf_model.save_pretrained(str(tmp_path), safe_serialization=True)
    prompts = [list(range(100, 100 + n)) for n in (5, 17, 33, 64)]
    sched = make_scheduler(
        str(tmp_path), quantization="fp8", dtype="bfloat16", skip_tokenizer_init=True
    )
    got = prefill_logits(sched, prompts, all_positions=True).input_logits.float()
    weights = {
        n: dequantize_rows(*quantize_rows(hf_model.get_parameter(n)))
        for n in _linear_names(hf_model)
    }
    with torch.no_grad():
        emulated = emulated_model(hf_model, weights, group=None)
        want = torch.cat([emulated(torch.tensor([p])).logits[0] for p in prompts])
        plain = torch.cat([hf_model(torch.tensor([p])).logits[0] for p in prompts])
    diff = (got - want).abs().max().item()
    assert diff <= bf16_tolerance(want), (diff, bf16_tolerance(want))
    share = fp8_effect_reproduced(got, want, plain)
    print(f"max|bf16 fp8 - emulated| {diff:.4f}, FP8 effect "
          f"{(want - plain).abs().max().item():.4f} (max), share reproduced {share:.3f}")  # fmt: skip
    assert MIN_EFFECT_REPRODUCED < share <= 1.1, share
