"""Writes an FP8 checkpoint of an unquantized model directory, in a format mini-sglang loads
(docs/quantization.md), for quality runs (benchmarks/fp8_quality.py --quantized-path) and
for the tests that check each format against its emulation:

- `fp8-block`: `quant_method: fp8`, dynamic activations, `weight_block_size` [bn, bk] (the
  layout of Qwen3-*-FP8 and DeepSeek): float8_e4m3fn weights and one `weight_scale_inv`
  per block;
- `compressed-tensors`: per-channel FP8 weights (`weight_scale` [N, 1], bf16-representable)
  with per-token dynamic activations and `lm_head` ignored (the layout of the widely used
  Llama-3.1-8B-Instruct-FP8 checkpoints);
- `fp8-tensor`: `quant_method: fp8`, one `weight_scale` per tensor and the static activation
  scheme (an `input_scale` is written; mini-sglang reads past it).

The decoder's linear weights (`*.{q,k,v,o,gate,up,down}_proj.weight`, per-expert ones
included; not the MoE router) are quantized, except the modules named with `--ignore`
(recorded as the format's ignored layers); everything else is copied. Usage:

    python benchmarks/make_fp8_checkpoint.py MODEL_DIR OUT_DIR --format fp8-block \
        [--block 128 128] [--ignore model.layers.0.mlp.down_proj ...]

A block must divide every projection's output and input size where the projections of a
fused layer meet (q/k/v, gate/up): SmolLM2-135M (q 576, k and v 192) needs [64, 64].
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from mini_sglang.layers.quantization.fp8_kernels import (
    dequantize_blocks,
    dequantize_rows,
    quantize_blocks,
    quantize_rows,
    quantize_tensor,
)

FORMATS = ("fp8-block", "compressed-tensors", "fp8-tensor")
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def linear_weight_names(state: dict[str, torch.Tensor], ignored: tuple[str, ...] = ()) -> list[str]:
    """The weights a format quantizes: every `<module>.weight` whose module is a projection
    (PROJECTIONS) and not in `ignored` (module names, without ".weight")."""
    return [
        n
        for n in state
        if n.endswith(".weight")
        and n.split(".")[-2] in PROJECTIONS
        and n.removesuffix(".weight") not in ignored
    ]


def quantization_config(
    fmt: str, block: tuple[int, int], ignored: tuple[str, ...] = ()
) -> dict[str, object]:
    """config.json's `quantization_config` for a format."""
    if fmt == "fp8-block":
        return {
            "quant_method": "fp8",
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "weight_block_size": list(block),
            "ignored_layers": list(ignored),
        }
    if fmt == "compressed-tensors":
        return {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                    "input_activations": {"num_bits": 8, "type": "float", "strategy": "token"},
                }
            },
            "ignore": ["lm_head", *ignored],
        }
    if fmt == "fp8-tensor":
        return {
            "quant_method": "fp8",
            "activation_scheme": "static",
            "ignored_layers": list(ignored),
        }
    raise ValueError(f"unknown format {fmt!r}; one of {FORMATS}")


def quantize_state(
    state: dict[str, torch.Tensor],
    fmt: str,
    block: tuple[int, int] = (128, 128),
    ignored: tuple[str, ...] = (),
) -> dict[str, torch.Tensor]:
    """Replace state's linear weights (linear_weight_names) by their FP8 values and add the
    format's scale tensors, in place; returns the dequantized weight each stores (float32,
    by weight name): the weights an engine computes with."""
    deq = {}
    for name in linear_weight_names(state, ignored):
        w, base = state[name], name[: -len("weight")]
        if fmt == "fp8-block":
            q, s = quantize_blocks(w, block)
            state[base + "weight_scale_inv"] = s
            deq[name] = dequantize_blocks(q, s, block)
        elif fmt == "compressed-tensors":
            q, s = quantize_rows(w)
            # stored as the published checkpoints store it: [N, 1], bf16-representable
            state[base + "weight_scale"] = s[:, None].to(torch.bfloat16).float()
            deq[name] = dequantize_rows(q, state[base + "weight_scale"])
        elif fmt == "fp8-tensor":
            q, s = quantize_tensor(w)
            state[base + "weight_scale"] = s
            state[base + "input_scale"] = torch.tensor(0.05)  # static: read past, not used
            deq[name] = q.float() * s
        else:
            raise ValueError(f"unknown format {fmt!r}; one of {FORMATS}")
        state[name] = q
    return deq


def write_fp8_checkpoint(
    src: Path,
    out: Path,
    fmt: str,
    block: tuple[int, int] = (128, 128),
    ignored: tuple[str, ...] = (),
    state: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """The FP8 checkpoint of model directory `src` (its safetensors, or `state` when given:
    the same model's weights in memory) at `out`: every non-weight file copied, the
    quantized weights in one model.safetensors, config.json with the format's
    quantization_config. Returns quantize_state's dequantized weights."""
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name != "model.safetensors.index.json":
            shutil.copy(f, out / f.name)
    config = json.loads((src / "config.json").read_text())
    if state is None:
        state = {}
        for f in sorted(src.glob("*.safetensors")):
            state.update(load_file(str(f)))
    state = dict(state)
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)  # transformers ties it back at load
    deq = quantize_state(state, fmt, block, ignored)
    config["quantization_config"] = quantization_config(fmt, block, ignored)
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return deq


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--format", choices=FORMATS, default="fp8-block")
    parser.add_argument("--block", type=int, nargs=2, default=(128, 128), metavar=("BN", "BK"))
    parser.add_argument("--ignore", nargs="*", default=[], help="module names left unquantized")
    args = parser.parse_args()
    deq = write_fp8_checkpoint(
        args.model_dir, args.out_dir, args.format, tuple(args.block), tuple(args.ignore)
    )
    print(f"{args.out_dir}: {len(deq)} weights quantized ({args.format})")


if __name__ == "__main__":
    main()
