"""Which quantization a model uses, from `--quantization` and the checkpoint's
`quantization_config` (config.json), as SGLang's ModelConfig decides it. Pure Python (no
torch), so the launcher can check it before any process starts.

`parse_quantization(flag, hf_quant_config)` returns None (unquantized; also `gguf`, whose
weights are dequantized at load) or a `QuantSpec`, and raises ValueError, one line naming
the method, for a quantization mini-sglang cannot serve or a flag that contradicts the
checkpoint.
"""

from __future__ import annotations

from dataclasses import dataclass

# Method names, as --quantization and quantization_config.quant_method spell them.
SUPPORTED_METHODS = ("fp8", "compressed-tensors")


@dataclass(frozen=True)
class QuantSpec:
    """method: a SUPPORTED_METHODS name; checkpoint_fp8: the checkpoint's weights are FP8
    (else an unquantized checkpoint is quantized while it loads); weight_block_size:
    (rows, cols) of block-wise weight scales, else per-channel/per-tensor scales;
    ignored_layers: checkpoint names (or `re:` patterns) of linear layers left unquantized."""

    method: str
    checkpoint_fp8: bool = False
    weight_block_size: tuple[int, int] | None = None
    ignored_layers: tuple[str, ...] = ()


def _unsupported(method: str) -> ValueError:
    return ValueError(
        f"Unsupported quantization method: {method} (mini-sglang serves "
        f"{', '.join(SUPPORTED_METHODS)} FP8 weights)"
    )


def _fp8_spec(cfg: dict) -> QuantSpec:
    block = cfg.get("weight_block_size")
    if block is not None and (len(block) != 2 or min(block) < 1):
        raise ValueError(f"fp8 weight_block_size must be [rows, cols], got {block}")
    return QuantSpec(
        "fp8",
        checkpoint_fp8=True,
        weight_block_size=(int(block[0]), int(block[1])) if block is not None else None,
        ignored_layers=tuple(cfg.get("ignored_layers") or ()),
    )


def _compressed_tensors_spec(cfg: dict) -> QuantSpec:
    groups = cfg.get("config_groups") or {}
    if not groups:
        raise ValueError("compressed-tensors quantization_config has no config_groups")
    for name, group in groups.items():
        weights = group.get("weights") or {}
        fp8 = weights.get("num_bits") == 8 and weights.get("type") == "float"
        if not fp8 or weights.get("strategy") not in ("channel", "tensor"):
            raise ValueError(
                f"Unsupported quantization method: compressed-tensors group {name!r} with "
                f"weights {weights} (mini-sglang serves FP8 weights with a channel or tensor "
                "strategy)"
            )
    return QuantSpec(
        "compressed-tensors", checkpoint_fp8=True, ignored_layers=tuple(cfg.get("ignore") or ())
    )


def parse_quantization(flag: str | None, hf_quant_config: dict | None) -> QuantSpec | None:
    """The model's quantization (see the module doc). The checkpoint's method wins; a flag
    naming another method is an error, as in SGLang."""
    method = (hf_quant_config or {}).get("quant_method")
    if method is not None:
        method = str(method).replace("_", "-")
        if flag not in (None, method):
            raise ValueError(
                f"Quantization method specified in the model config ({method}) does not "
                f"match the quantization method specified in the `quantization` argument "
                f"({flag})."
            )
        if method == "fp8":
            return _fp8_spec(hf_quant_config)
        if method == "compressed-tensors":
            return _compressed_tensors_spec(hf_quant_config)
        raise _unsupported(method)
    if flag in (None, "gguf"):
        return None
    if flag == "fp8":
        return QuantSpec("fp8")
    if flag == "compressed-tensors":
        raise ValueError("--quantization compressed-tensors needs a compressed-tensors checkpoint")
    raise _unsupported(flag)
