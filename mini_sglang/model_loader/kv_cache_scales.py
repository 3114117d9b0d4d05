"""--quantization-param-path: per-layer FP8 KV cache scaling factors from a JSON file.

SGLang 0.5.4's format (its QuantParamSchema), one scale per layer and TP rank, used for
both K and V:

    {"model_type": "llama",
     "kv_cache": {"dtype": "float8_e4m3fn",
                  "scaling_factor": {"0": {"0": 0.25, "1": 0.5, ...}, "1": {...}}}}

`scaling_factor` maps every TP rank 0..tp_size-1 to a map of every layer 0..L-1 to its
scale (JSON keys are strings; they are read as integers). `model_type` must be the
model's config type (null skips the check); `dtype` must be "float8_e4m3fn". Scales must
be finite and positive (a store divides by them).

Behaviour is SGLang's (ModelRunner.load_model and kv_cache_scales_loader):
- Only with --kv-cache-dtype fp8_e4m3; the file is read after the checkpoint, so its
  scales win over the checkpoint's own (layers/kv_quant.py).
- A missing, undecodable or invalid file is not fatal: one error line says why, one
  warning says the scales stay as they were (1.0 unless the checkpoint set them), and the
  server starts.
- fp8_e4m3 without the file warns that the scales default to 1.0, unless the checkpoint
  gave some layer a scale (SGLang warns then too, wrongly).
- The file with any other KV cache dtype is ignored; SGLang says nothing, here a warning
  says so.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

from torch import nn

from mini_sglang.layers.radix_attention import RadixAttention

logger = logging.getLogger("mini_sglang")

SCALES_KV_DTYPE = "fp8_e4m3"  # the only --kv-cache-dtype the file applies to
FILE_KV_DTYPE = "float8_e4m3fn"  # the file's kv_cache.dtype


def _int_keyed(mapping: Any, what: str) -> dict[int, Any]:
    if not isinstance(mapping, dict):
        raise ValueError(f"{what} must be an object, got {type(mapping).__name__}")
    out: dict[int, Any] = {}
    for key, value in mapping.items():
        try:
            out[int(key)] = value
        except (TypeError, ValueError):
            raise ValueError(f"{what} has a key that is not an integer: {key!r}") from None
    return out


def _scale(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"the scale of {where} is not a number: {value!r}")
    try:
        scale = float(value)
    except ValueError:
        raise ValueError(f"the scale of {where} is not a number: {value!r}") from None
    if not (math.isfinite(scale) and scale > 0.0):
        raise ValueError(f"the scale of {where} must be finite and positive, got {value!r}")
    return scale


def _rank_layer_maps(
    scaling_factor: Any, tp_size: int, num_hidden_layers: int
) -> dict[int, dict[int, Any]]:
    """scaling_factor as {rank: {layer: value}}: one map per TP rank 0..tp_size-1, each
    with num_hidden_layers entries (SGLang's check_tp_ranks)."""
    ranks = _int_keyed(scaling_factor, "scaling_factor")
    if len(ranks) != tp_size:
        raise ValueError(
            f"Loaded dictionary has TP size {len(ranks)} but LLM engine is currently "
            f"running with TP size {tp_size}."
        )
    per_rank = {r: _int_keyed(m, f"scaling_factor[{r}]") for r, m in ranks.items()}
    for rank, layers in per_rank.items():
        if len(layers) != num_hidden_layers:
            raise ValueError(
                f"KV cache scales map for TP rank {rank} is malformed. Expected "
                f"{num_hidden_layers} layers, got {len(layers)}."
            )
    for rank in range(tp_size):
        if rank not in per_rank:
            raise ValueError(f"KV cache scales map for TP rank {rank} not found.")
    return per_rank


def parse_kv_cache_scales(
    data: Any, tp_rank: int, tp_size: int, num_hidden_layers: int, model_type: str | None
) -> dict[int, float]:
    """{layer index: scale} for `tp_rank` from the decoded JSON `data`, checked as SGLang's
    schema checks it (see the module docstring). Raises ValueError with a one-line reason."""
    if not isinstance(data, dict):
        raise ValueError(f"the file must hold a JSON object, got {type(data).__name__}")
    if "model_type" not in data or "kv_cache" not in data:
        raise ValueError("the file must have the keys 'model_type' and 'kv_cache'")
    if model_type is not None and data["model_type"] != model_type:
        raise ValueError(
            f"Model type is {model_type} but loaded scaling factors belonging to "
            f"different model type {data['model_type']}!"
        )
    kv = data["kv_cache"]
    if not isinstance(kv, dict) or "dtype" not in kv or "scaling_factor" not in kv:
        raise ValueError("'kv_cache' must be an object with 'dtype' and 'scaling_factor'")
    if kv["dtype"] != FILE_KV_DTYPE:
        raise ValueError(
            f"Loaded scaling factors intended for KV cache dtype = {kv['dtype']} "
            f"rather than {FILE_KV_DTYPE}!"
        )
    per_rank = _rank_layer_maps(kv["scaling_factor"], tp_size, num_hidden_layers)
    layers = per_rank[tp_rank]
    for i in range(num_hidden_layers):
        if i not in layers:
            raise ValueError(f"Could not find KV cache scales for layer {i} in TP rank {tp_rank}.")
    return {
        i: _scale(layers[i], f"layer {i} in TP rank {tp_rank}") for i in range(num_hidden_layers)
    }


def kv_cache_scales_loader(
    filename: str, tp_rank: int, tp_size: int, num_hidden_layers: int, model_type: str | None
) -> dict[int, float]:
    """SGLang's loader: the scales of `tp_rank` from `filename`, or {} after logging one
    error line (why) and one warning (nothing is loaded) when the file is missing,
    undecodable or invalid."""
    try:
        with open(filename) as f:
            data = json.load(f)
        return parse_kv_cache_scales(data, tp_rank, tp_size, num_hidden_layers, model_type)
    except FileNotFoundError:
        logger.error("File or directory '%s' not found.", filename)
    except json.JSONDecodeError as e:
        logger.error("Error decoding JSON in file '%s': %s", filename, e)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        logger.error("An error occurred while reading '%s': %s", filename, e)
    logger.warning(
        "Defaulting to KV cache scaling factors = 1.0 for all layers in TP rank %d as an "
        "error occurred during loading.",
        tp_rank,
    )
    return {}


def attention_layers(model: nn.Module) -> dict[int, RadixAttention]:
    """The model's RadixAttention layers by layer_id (those this rank holds)."""
    return {m.layer_id: m for m in model.modules() if isinstance(m, RadixAttention)}


def apply_kv_cache_scales(model: nn.Module, scales: dict[int, float]) -> None:
    """Set k_scale and v_scale of each layer in `scales` to its scale (one factor for both,
    as SGLang's file holds). Layers this rank lacks are skipped."""
    layers = attention_layers(model)
    if not layers:
        raise RuntimeError(
            "Using FP8 KV cache and scaling factors provided but model "
            f"{type(model).__name__} does not support loading scaling factors."
        )
    for layer_id, scale in scales.items():
        attn = layers.get(layer_id)
        if attn is not None:
            attn.k_scale = attn.v_scale = scale


def load_quantization_param_path(
    model: nn.Module,
    path: str | None,
    kv_cache_dtype: str,
    tp_rank: int,
    tp_size: int,
    num_hidden_layers: int,
    model_type: str | None,
) -> None:
    """ModelRunner's step after the weights load (SGLang's rules, module docstring)."""
    if kv_cache_dtype != SCALES_KV_DTYPE:
        if path is not None:
            logger.warning(
                "--quantization-param-path %s is ignored: KV cache scaling factors apply only "
                "with --kv-cache-dtype %s (got %s).",
                path,
                SCALES_KV_DTYPE,
                kv_cache_dtype,
            )
        return
    if path is None:
        if all(a.k_scale == a.v_scale == 1.0 for a in attention_layers(model).values()):
            logger.warning(
                "Using FP8 KV cache but no scaling factors provided. Defaulting to scaling "
                "factors of 1.0. This may lead to less accurate results!"
            )
        return
    scales = kv_cache_scales_loader(path, tp_rank, tp_size, num_hidden_layers, model_type)
    if scales:
        apply_kv_cache_scales(model, scales)
        logger.info("Loaded KV cache scaling factors from %s", path)
