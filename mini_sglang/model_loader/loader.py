"""Build a model and fill its weights: safetensors (streamed), pt, gguf or dummy.

Weights stream one file (one tensor) at a time into `model.load_weights`, which routes each
tensor to its parameter's `weight_loader`; nothing holds a second full copy of the model.
With a CPU offload budget (--cpu-offload-gb, layers/cpu_offload.py) the model is built
under that budget, so the first decoder layers move to pinned host memory as they are
created, before any weight is loaded; the loaders then write those layers' weights straight
into host memory, and the device never holds the whole model.
"""

from __future__ import annotations

import glob
import inspect
import logging
import os
import time
from collections.abc import Iterator

import torch
from torch import nn

from mini_sglang.distributed.parallel_state import get_tp_size
from mini_sglang.layers.cpu_offload import GiB, cpu_offload
from mini_sglang.layers.pooler import Pooler
from mini_sglang.layers.quantization.registry import get_quant_config
from mini_sglang.model_loader.dummy_tp import fill_dummy_weights_tp, full_dummy
from mini_sglang.model_loader.gguf_loader import iterate_gguf_weights
from mini_sglang.model_loader.progress import progress
from mini_sglang.models.registry import resolve_model_class
from mini_sglang.utils.gguf_path import is_gguf_path

logger = logging.getLogger("mini_sglang")

DUMMY_SEED = 1234


def iterate_safetensors(files: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    for path in progress(files, "Loading safetensors checkpoint shards", total=len(files)):
        with safe_open(path, framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118  # safe_open is not iterable
                yield name, f.get_tensor(name)


def iterate_pt(files: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
    for path in progress(files, "Loading pt checkpoint shards", total=len(files)):
        state = torch.load(path, map_location="cpu", weights_only=True)
        yield from state.items()
        del state


def weight_iterator(model_path: str, load_format: str) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, tensor) pairs for the checkpoint at model_path in the given format."""
    if load_format == "gguf" or is_gguf_path(model_path):
        return iterate_gguf_weights(model_path)
    if not os.path.isdir(model_path):
        raise ValueError(f"Model path {model_path!r} is not a directory")
    st_files = sorted(glob.glob(os.path.join(model_path, "*.safetensors")))
    pt_files = sorted(glob.glob(os.path.join(model_path, "*.bin")))
    if load_format in ("auto", "safetensors") and st_files:
        return iterate_safetensors(st_files)
    if load_format in ("auto", "pt") and pt_files:
        return iterate_pt(pt_files)
    raise ValueError(
        f"No model weights found in {model_path!r} for --load-format {load_format} "
        "(expected *.safetensors or *.bin files; use --load-format dummy for random weights)"
    )


@torch.no_grad()
def fill_dummy_weights(
    model: nn.Module,
    low: float = -1e-3,
    high: float = 1e-3,
    device: torch.device | None = None,
) -> None:
    """SGLang's dummy format: every float parameter uniform in [low, high], seeded per param.

    Values are drawn on `device` (default: each parameter's own), the device the model
    computes on, so parameters offloaded to host memory get the values they would have on
    the device. Norm weights get the same fill as everything else, so activations stay
    small and finite.
    """
    for param in model.parameters():
        if torch.is_floating_point(param) and not getattr(param, "filled_by_weight", False):
            where = param.device if device is None else device
            param.data.copy_(full_dummy(tuple(param.shape), DUMMY_SEED, low, high, where))


def available_memory_gib(device: str | torch.device) -> float:
    """Free memory of `device` in GiB (system memory on CPU), as SGLang reports it."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0] / (1 << 30)
    import psutil

    return psutil.virtual_memory().available / (1 << 30)


def get_model(
    model_config, load_format: str, device: str | torch.device, cpu_offload_bytes: int = 0
) -> nn.Module:
    """Instantiate the model class for the config on `device` and load its weights.

    With `cpu_offload_bytes` > 0 (a CUDA device; see layers/cpu_offload.py) decoder layers
    totalling at most that many bytes keep their weights in pinned host memory."""
    device = torch.device(device)
    model_cls = resolve_model_class(model_config.architectures)
    quant_config = get_quant_config(model_config.quantization)
    # Only quantized models pass quant_config, so model classes without it still load.
    kwargs = {} if quant_config is None else {"quant_config": quant_config}
    if kwargs and "quant_config" not in inspect.signature(model_cls.__init__).parameters:
        raise ValueError(f"{model_cls.__name__} does not support quantization")
    logger.info("Load weight begin. avail mem=%.2f GB", available_memory_gib(device))
    t0 = time.perf_counter()
    old_dtype = torch.get_default_dtype()
    torch.set_default_dtype(model_config.dtype)
    try:
        with torch.device(device), cpu_offload(cpu_offload_bytes, device) as offloader:
            model = model_cls(model_config.model_class_config, **kwargs)
    finally:
        torch.set_default_dtype(old_dtype)
    if offloader is not None:
        logger.info(
            "CPU offload: %d decoder layers (%.2f GB of weights) in pinned host memory, "
            "budget %.2f GB.",
            offloader.num_offloaded,
            offloader.offloaded_bytes / GiB,
            cpu_offload_bytes / GiB,
        )
    if load_format == "dummy":
        # dummy_tp shards the tp=1 dummy model; it also routes each tensor through the
        # weight loaders, which quantize it where the model is quantized online.
        if get_tp_size() > 1 or quant_config is not None:
            fill_dummy_weights_tp(model, DUMMY_SEED, device=device)
        else:
            fill_dummy_weights(model, device=device)
    else:
        model.load_weights(weight_iterator(model_config.model_path, load_format))
    pooling = getattr(model_config, "pooling", None)
    if pooling is not None and hasattr(model, "pooler"):
        # sentence-transformers' files in the model directory decide (ModelConfig.pooling).
        model.pooler = Pooler(pooling.pooling_type, pooling.normalize)
    # RoPE caches are buffers computed in float32; keep them so (the dtype switch above
    # only affects parameters created under it, which is what we want).
    model.eval()
    logger.info(
        "Load weight end. type=%s, dtype=%s, load_format=%s, elapsed=%.2f s",
        model_cls.__name__,
        model_config.dtype
        if quant_config is None
        else f"{model_config.dtype}, quantization={quant_config.name}",
        load_format,
        time.perf_counter() - t0,
    )
    return model
