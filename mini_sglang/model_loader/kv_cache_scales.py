"""--quantization-param-path: per-layer FP8 KV cache scaling factors from a JSON file.

SGLang 0.5.4's format (its QuantParamSchema, validated with the same pydantic schema), one
scale per layer and TP rank, used for both K and V:

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

from pydantic import (
    BaseModel,
    ConfigDict,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from torch import nn

from mini_sglang.layers.radix_attention import RadixAttention

logger = logging.getLogger("mini_sglang")

SCALES_KV_DTYPE = "fp8_e4m3"  # the only --kv-cache-dtype the file applies to
FILE_KV_DTYPE = "float8_e4m3fn"  # the file's kv_cache.dtype


class KVCacheQuantSchema(BaseModel):
    """The file's kv_cache object (SGLang's KVCacheQuantSchema). With a validation context
    (tp_size, tp_rank, num_hidden_layers) it also checks SGLang's rank and layer counts."""

    dtype: str
    # TP rank -> layer index -> the scale of that layer's K and V (JSON's string keys and
    # numeric strings are coerced, as pydantic does for SGLang)
    scaling_factor: dict[int, dict[int, float]]

    @field_validator("scaling_factor")
    @classmethod
    def _finite_positive(cls, v: dict[int, dict[int, float]]) -> dict[int, dict[int, float]]:
        # stricter than SGLang: a store divides by the scale
        for rank, layers in v.items():
            for layer, scale in layers.items():
                if not (math.isfinite(scale) and scale > 0.0):
                    raise ValueError(
                        f"the scale of layer {layer} in TP rank {rank} must be finite and "
                        f"positive, got {scale!r}"
                    )
        return v

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> KVCacheQuantSchema:
        if self.dtype != FILE_KV_DTYPE:
            raise ValueError(
                f"Loaded scaling factors intended for KV cache dtype = {self.dtype} "
                f"rather than {FILE_KV_DTYPE}!"
            )
        ctx = info.context
        if not ctx:
            return self
        tp_size, layers = ctx["tp_size"], ctx["num_hidden_layers"]
        if len(self.scaling_factor) != tp_size:
            raise ValueError(
                f"Loaded dictionary has TP size {len(self.scaling_factor)} but LLM engine is "
                f"currently running with TP size {tp_size}."
            )
        for rank, layer_maps in self.scaling_factor.items():
            if len(layer_maps) != layers:
                raise ValueError(
                    f"KV cache scales map for TP rank {rank} is malformed. Expected {layers} "
                    f"layers, got {len(layer_maps)}."
                )
        for rank in range(tp_size):
            if rank not in self.scaling_factor:
                raise ValueError(f"KV cache scales map for TP rank {rank} not found.")
        for i in range(layers):
            if i not in self.scaling_factor[ctx["tp_rank"]]:
                raise ValueError(
                    f"Could not find KV cache scales for layer {i} in TP rank {ctx['tp_rank']}."
                )
        return self


class QuantParamSchema(BaseModel):
    """The whole file (SGLang's QuantParamSchema); a context's model_type, when not None,
    must equal the file's."""

    model_config = ConfigDict(protected_namespaces=())
    model_type: str | None
    kv_cache: KVCacheQuantSchema

    @model_validator(mode="after")
    def _check_model_type(self, info: ValidationInfo) -> QuantParamSchema:
        model_type = (info.context or {}).get("model_type")
        if model_type is not None and model_type != self.model_type:
            raise ValueError(
                f"Model type is {model_type} but loaded scaling factors belonging to "
                f"different model type {self.model_type}!"
            )
        return self


def _one_line(e: ValidationError) -> str:
    """pydantic's errors as one line: "where: why; ..." ("file" for the whole document)."""
    return "; ".join(
        f"{'.'.join(map(str, err['loc'])) or 'file'}: {err['msg']}" for err in e.errors()
    )


def parse_kv_cache_scales(
    data: Any, tp_rank: int, tp_size: int, num_hidden_layers: int, model_type: str | None
) -> dict[int, float]:
    """{layer index: scale} for `tp_rank` from the decoded JSON `data`, checked as SGLang's
    schema checks it (see the module docstring). Raises ValueError with a one-line reason."""
    context = {
        "model_type": model_type,
        "num_hidden_layers": num_hidden_layers,
        "tp_rank": tp_rank,
        "tp_size": tp_size,
    }
    try:
        schema = QuantParamSchema.model_validate(data, context=context)
    except ValidationError as e:
        raise ValueError(_one_line(e)) from None
    return dict(schema.kv_cache.scaling_factor[tp_rank])


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
