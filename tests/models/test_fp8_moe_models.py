"""FP8 experts end to end on CPU: a tiny random Qwen3-MoE (saved by transformers) run with
`--quantization fp8`, and FP8 checkpoints of it written here (block-wise 32 x 32, the
Qwen3-30B-A3B-FP8 layout, and per-tensor with static input scales).

The reference is transformers' model with FP8 numerics emulated in float32, as in
test_fp8_models.py: every linear weight the format quantizes (attention projections and
each expert's gate / up / down) replaced by the dequantized FP8 weight, and the input of
each such GEMM (the experts' input and their SiLU-and-mul output included) quantized and
dequantized as the format quantizes activations. mini-sglang's CPU path computes that
function, so the logits agree to float32 noise (LOGITS_ATOL); the unquantized model is
checked to be much further away, so FP8 experts are what is being matched. The router
(`gate`) and the LM head stay unquantized.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from benchmarks import make_fp8_checkpoint
from mini_sglang.layers.quantization.fp8_kernels import (
    FP8_DTYPE,
    dequantize_rows,
    quantize_rows,
)
from tests.conftest import make_scheduler, prefill_logits, randomize_norms_and_biases
from tests.models.test_fp8_models import LOGITS_ATOL, PROMPTS, VOCAB, _act_qdq, _hf_logits
from tests.models.test_moe_models import tiny_moe_config

BLOCK = (32, 32)


class Tiny:
    """The tiny Qwen3-MoE on disk, its transformers model and its checkpoint tensors."""

    def __init__(self, path: Path, hf_model) -> None:
        self.path, self.hf_model = path, hf_model
        self.state = load_file(str(path / "model.safetensors"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Tiny:
    from transformers import AutoModelForCausalLM

    path = tmp_path_factory.mktemp("fp8_qwen3_moe")
    torch.manual_seed(0)
    hf_model = AutoModelForCausalLM.from_config(tiny_moe_config("qwen3_moe", VOCAB)).float()
    hf_model.eval()
    randomize_norms_and_biases(hf_model)
    hf_model.save_pretrained(str(path), safe_serialization=True)
    return Tiny(path, hf_model)


def _experts_forward(experts, group: int | None):
    """transformers' Qwen3MoeExperts.forward with each GEMM's input quantized and
    dequantized as FP8 activations are (per token, or per token and `group` columns)."""

    def forward(hidden_states, top_k_index, top_k_weights):
        out = torch.zeros_like(hidden_states)
        for e in range(experts.num_experts):
            tokens, slots = torch.where(top_k_index == e)
            if len(tokens) == 0:
                continue
            x = _act_qdq(hidden_states[tokens], group)
            gate, up = F.linear(x, experts.gate_up_proj[e]).chunk(2, dim=-1)
            y = F.linear(_act_qdq(experts.act_fn(gate) * up, group), experts.down_proj[e])
            out.index_add_(0, tokens, y * top_k_weights[tokens, slots, None])
        return out

    return forward


@torch.no_grad()
def emulated_model(tiny: Tiny, deq: dict[str, torch.Tensor], group: int | None):
    """transformers' model (float32) with the dequantized checkpoint weights `deq`
    (checkpoint names) swapped in and FP8 activations emulated."""
    model = copy.deepcopy(tiny.hf_model)
    for name, w in deq.items():
        parts = name.split(".")
        if "experts" not in parts:  # an attention projection
            model.get_parameter(name).copy_(w)
            module = model.get_submodule(name[: -len(".weight")])
            module.register_forward_pre_hook(lambda m, args: (_act_qdq(args[0], group),))
            continue
        experts = model.get_submodule(".".join(parts[: parts.index("experts") + 1]))
        e, proj = int(parts[-3]), parts[-2]
        inter = experts.intermediate_dim
        if proj == "down_proj":
            experts.down_proj[e].copy_(w)
        else:
            experts.gate_up_proj[e, (0 if proj == "gate_proj" else inter) :][:inter].copy_(w)
        experts.forward = _experts_forward(experts, group)
    return model


@torch.no_grad()
def emulated_logits(tiny: Tiny, deq: dict[str, torch.Tensor], group: int | None):
    """Last-position logits of emulated_model for each prompt."""
    model = emulated_model(tiny, deq, group)
    return torch.stack([model(torch.tensor([p])).logits[0, -1].float() for p in PROMPTS])


def online_fp8_weights(tiny: Tiny) -> dict[str, torch.Tensor]:
    """The dequantized weights `--quantization fp8` gives tiny (per output channel)."""
    return {
        n: dequantize_rows(*quantize_rows(tiny.state[n]))
        for n in make_fp8_checkpoint.linear_weight_names(tiny.state)
    }


def _experts(model):
    return [layer.mlp.experts for layer in model.model.layers]


def test_online_fp8_experts_match_the_fp8_emulation(tiny: Tiny) -> None:
    sched = make_scheduler(str(tiny.path), quantization="fp8", skip_tokenizer_init=True)
    model = sched.tp_worker.model_runner.model
    cfg = tiny.hf_model.config
    E, inter, H = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size
    for moe in _experts(model):
        assert moe.w13_weight.dtype == moe.w2_weight.dtype == FP8_DTYPE
        assert moe.w13_weight_scale.shape == (E, 2 * inter) and moe.w2_weight_scale.shape == (E, H)
    assert model.model.layers[0].mlp.gate.weight.dtype == torch.float32  # the router
    assert model.lm_head.weight.dtype == torch.float32
    got = prefill_logits(sched, PROMPTS, all_positions=False).next_token_logits
    deq = online_fp8_weights(tiny)
    ref = emulated_logits(tiny, deq, group=None)
    assert (got - ref).abs().max().item() <= LOGITS_ATOL
    # FP8 experts really changed the model: the unquantized logits, and those with only
    # the attention projections in FP8, are far away.
    assert (got - _hf_logits(tiny.hf_model, PROMPTS)).abs().max().item() > 10 * LOGITS_ATOL
    attention_only = {n: w for n, w in deq.items() if ".experts." not in n}
    plain_experts = emulated_logits(tiny, attention_only, group=None)
    assert (got - plain_experts).abs().max().item() > 10 * LOGITS_ATOL

    # An online update of one expert's up projection (a bf16 tensor) is quantized by the
    # same loader into that expert's rows, with its own scales.
    from mini_sglang.model_executor.weight_updates import load_named_tensors

    moe = _experts(model)[1]
    new = torch.randn(inter, H) * 0.1
    load_named_tensors(
        sched.tp_worker.model_runner,
        [("model.layers.1.mlp.experts.3.up_proj.weight", new.to(torch.bfloat16))],
    )
    w13, _ = moe.quant_method.dequantized_weights(moe)
    want = dequantize_rows(*quantize_rows(new.to(torch.bfloat16)))
    torch.testing.assert_close(w13[3, inter:], want, rtol=0, atol=0)
    torch.testing.assert_close(w13[3, :inter], deq["model.layers.1.mlp.experts.3.gate_proj.weight"])


def write_fp8_checkpoint(
    tiny: Tiny, out: Path, fmt: str, block: tuple[int, int] = BLOCK
) -> dict[str, torch.Tensor]:
    """An FP8 checkpoint of tiny's weights at out (benchmarks/make_fp8_checkpoint.py),
    block-wise (`block`, Qwen3-*-FP8) or per tensor with static input scales (`tensor`);
    returns the dequantized weights it stores."""
    fmt = "fp8-block" if fmt == "block" else "fp8-tensor"
    return make_fp8_checkpoint.write_fp8_checkpoint(tiny.path, out, fmt, block, state=tiny.state)


def test_fp8_checkpoints_match_their_emulation(tiny: Tiny, tmp_path: Path) -> None:
    cfg = tiny.hf_model.config
    E, inter, H = cfg.num_experts, cfg.moe_intermediate_size, cfg.hidden_size
    for fmt in ("block", "tensor"):
        out = tmp_path / fmt
        out.mkdir()
        deq = write_fp8_checkpoint(tiny, out, fmt)
        sched = make_scheduler(str(out), skip_tokenizer_init=True)
        moe = _experts(sched.tp_worker.model_runner.model)[0]
        assert moe.w13_weight.dtype == FP8_DTYPE
        if fmt == "block":
            bn, bk = BLOCK
            assert moe.w13_weight_scale_inv.shape == (E, 2 * inter // bn, H // bk)
            assert moe.w2_weight_scale_inv.shape == (E, H // bn, inter // bk)
        got = prefill_logits(sched, PROMPTS, all_positions=False).next_token_logits
        ref = emulated_logits(tiny, deq, group=BLOCK[1] if fmt == "block" else None)
        diff = (got - ref).abs().max().item()
        assert diff <= LOGITS_ATOL, (fmt, diff)


def test_dummy_weights_are_quantized_in_the_model_format(tiny: Tiny) -> None:
    """--load-format dummy draws the usual dummy experts and quantizes them as they load,
    so benchmarks read realistic FP8 weights and scales."""
    from mini_sglang.model_loader.dummy_tp import full_dummy
    from mini_sglang.model_loader.loader import DUMMY_SEED

    sched = make_scheduler(
        str(tiny.path), quantization="fp8", load_format="dummy", skip_tokenizer_init=True
    )
    moe = _experts(sched.tp_worker.model_runner.model)[0]
    full = full_dummy(tuple(moe.w13_weight.shape), DUMMY_SEED, -1e-3, 1e-3, torch.device("cpu"))
    want = torch.stack([dequantize_rows(*quantize_rows(w)) for w in full])
    got, _ = moe.quant_method.dequantized_weights(moe)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
