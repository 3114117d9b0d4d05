"""The KV cache dtype (--kv-cache-dtype) and its per-layer k/v scales.

"auto" keeps K/V in the model dtype; "fp8_e4m3" / "fp8_e5m2" store them as FP8 with one
float scale per layer for K and one for V (SGLang's per-tensor scheme):

    store:  q = fp8(clamp(x / scale, -max, max))      (max = the format's largest finite)
    read:   x ~= q.to(dtype) * scale

The scales come from the checkpoint when it has them (`*.k_scale` / `*.v_scale`, or the
older single `*.kv_scale` for both), then from --quantization-param-path's JSON file
(model_loader/kv_cache_scales.py), else 1.0, as SGLang. Kernels may fold them instead of
dequantizing element by element: softmax(q.k * sm_scale * k_scale) and output * v_scale are
the same attention. A pool in the model dtype ignores the scales.
"""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger("mini_sglang")

FP8_KV_DTYPES: dict[str, torch.dtype] = {
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}
_NAMED_KV_DTYPES: dict[str, torch.dtype] = {
    **FP8_KV_DTYPES,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
}


def resolve_kv_cache_dtype(name: str | None, model_dtype: torch.dtype) -> torch.dtype:
    """The pool's torch dtype for --kv-cache-dtype `name` ("auto"/None: the model's)."""
    if name in (None, "auto"):
        return model_dtype
    if name not in _NAMED_KV_DTYPES:
        raise ValueError(f"Unsupported --kv-cache-dtype {name!r}")
    return _NAMED_KV_DTYPES[name]


def is_fp8(dtype: torch.dtype) -> bool:
    """Whether `dtype` is one of the FP8 KV cache dtypes (the pool then holds scaled values)."""
    return dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def fp8_max(dtype: torch.dtype) -> float:
    """The largest finite value of an FP8 pool dtype; 0.0 for any other dtype (kernels take
    0 as "no quantization")."""
    return float(torch.finfo(dtype).max) if is_fp8(dtype) else 0.0


def triton_supports_kv(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether Triton kernels can load and store K/V of `dtype` on `device`: all but
    float8_e4m3fn on CUDA GPUs before compute capability 8.9, where Triton has no e4m3
    conversion (e5m2 it emulates). There the pool stores with torch and attention needs
    flashinfer or torch_native."""
    if dtype != torch.float8_e4m3fn or device.type != "cuda":
        return True
    return torch.cuda.get_device_capability(device) >= (8, 9)


def quantize_kv(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """x in the pool's dtype: FP8 pools get x / scale clamped to the finite range (computed
    in float32), others a plain cast (the scale is ignored)."""
    if not is_fp8(dtype):
        return x if x.dtype == dtype else x.to(dtype)
    y = x.float()
    if scale != 1.0:
        y = y * (1.0 / scale)  # as the Triton store kernels compute it
    m = fp8_max(dtype)
    return y.clamp_(-m, m).to(dtype)


def dequantize_kv(x: torch.Tensor, scale: float, dtype: torch.dtype) -> torch.Tensor:
    """Pool values x as `dtype`: FP8 ones times their scale, others a plain cast."""
    y = x.to(dtype)
    if is_fp8(x.dtype) and scale != 1.0:
        y = y * scale
    return y


def read_scales(layer, dtype: torch.dtype) -> dict[str, float]:
    """{"k_scale", "v_scale"} that a kernel reading a pool of `dtype` applies for `layer` (a
    RadixAttention): the layer's scales for an FP8 pool, 1.0 for any other, whose values
    were stored unscaled."""
    if is_fp8(dtype):
        return {"k_scale": layer.k_scale, "v_scale": layer.v_scale}
    return {"k_scale": 1.0, "v_scale": 1.0}


def gather_kv(buf: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """buf[idx] for a pool buffer of any dtype. FP8 rows are gathered as bytes: indexing
    kernels for the float8 dtypes are missing on some torch builds."""
    if is_fp8(buf.dtype):
        return buf.view(torch.uint8)[idx].view(buf.dtype)
    return buf[idx]


def scatter_kv(buf: torch.Tensor, loc: torch.Tensor, values: torch.Tensor) -> None:
    """buf[loc] = values (already in buf's dtype), bytewise for FP8 as gather_kv."""
    if is_fp8(buf.dtype):
        buf.view(torch.uint8)[loc] = values.view(torch.uint8)
    else:
        buf[loc] = values


# ---- checkpoint scales ------------------------------------------------------------------
_SCALE_SUFFIXES = (".k_scale", ".v_scale", ".kv_scale")


def kv_scale_target(name: str) -> tuple[str, tuple[str, ...]] | None:
    """For a checkpoint tensor name that holds a KV cache scale: (the attention block's
    module path, the RadixAttention attributes it sets); None for any other name.

    model.layers.3.self_attn.k_scale          -> ("model.layers.3.self_attn", ("k_scale",))
    model.layers.3.self_attn.v_proj.v_scale   -> ("model.layers.3.self_attn", ("v_scale",))
    model.layers.3.self_attn.kv_scale         -> ("model.layers.3.self_attn", ("k_scale", "v_scale"))
    (ModelOpt writes the k_proj / v_proj form; the kv_scale form is the deprecated one.)
    """
    for suffix in _SCALE_SUFFIXES:
        if name.endswith(suffix):
            block = name[: -len(suffix)]
            for proj in (".k_proj", ".v_proj", ".attn"):
                if block.endswith(proj):
                    block = block[: -len(proj)]
                    break
            attrs = ("k_scale", "v_scale") if suffix == ".kv_scale" else (suffix[1:],)
            return block, attrs
    return None


def load_kv_scale(model: torch.nn.Module, name: str, tensor: torch.Tensor) -> bool:
    """Set the scale(s) that checkpoint tensor `name` holds on its layer's RadixAttention
    (the `attn` child of the attention block). True when `name` is a KV scale, used or not:
    one whose layer this model lacks (another pipeline or TP slice) is logged and skipped,
    as SGLang. Only per-tensor (one-element) scales exist for the KV cache."""
    target = kv_scale_target(name)
    if target is None:
        return False
    block, attrs = target
    try:
        attn = model.get_submodule(block + ".attn")
    except AttributeError:
        logger.warning("KV cache scale %s has no attention layer in this model; skipped", name)
        return True
    if tensor.numel() != 1:
        raise ValueError(
            f"Only per-tensor KV cache scales are supported; {name} has {tensor.shape}"
        )
    value = float(tensor.reshape(()).item())
    if value <= 0.0:
        raise ValueError(f"KV cache scale {name} must be positive, got {value}")
    for attr in attrs:
        setattr(attn, attr, value)
    return True
