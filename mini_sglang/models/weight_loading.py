"""The checkpoint-loading routine every model's `load_weights` calls with its name mappings.

A model maps HF tensor names onto its own (renaming prefixes, dropping tensors it has no
use for) and names the checkpoint pieces that load into one fused parameter; this routine
routes each tensor to its parameter and reports the parameters nothing filled.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn

from mini_sglang.layers.kv_quant import load_kv_scale


def load_checkpoint_weights(
    model: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    stacked_params_mapping: list[tuple[str, str, str | int]],
    tie_word_embeddings: bool,
    strict: bool = True,
    unstacked_prefixes: tuple[str, ...] = (),
    expert_loader: Callable[[dict[str, nn.Parameter], str, torch.Tensor], str | None] | None = None,
) -> None:
    """Route each (HF name, tensor) to its parameter: checkpoint pieces of a fused parameter
    (stacked_params_mapping) through its weight_loader with their shard id, the rest through
    the parameter's weight_loader or a plain copy. Names starting with one of
    `unstacked_prefixes` (modules kept unfused, e.g. a transformers vision tower) are never
    fused. KV cache scales (`*.k_scale` / `*.v_scale` / `*.kv_scale`) go to the layers'
    RadixAttention (layers/kv_quant.py). `expert_loader(params, name, tensor)` (MoE models)
    is tried first: it returns the parameter it filled, or None for a tensor that is not an
    expert's. Raises ValueError naming the parameters nothing filled, unless strict is False.
    """
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for name, tensor in weights:
        if "rotary_emb.inv_freq" in name or load_kv_scale(model, name, tensor):
            continue
        if tie_word_embeddings and name == "lm_head.weight":
            continue
        expert = expert_loader(params, name, tensor) if expert_loader else None
        if expert is not None:
            loaded.add(expert)
            continue
        stacked = () if name.startswith(unstacked_prefixes) else stacked_params_mapping
        for fused, part, shard_id in stacked:
            if f".{part}." in name:
                target = name.replace(f".{part}.", f".{fused}.")
                if target in params:
                    param = params[target]
                    param.weight_loader(param, tensor, shard_id)
                    loaded.add(target)
                break
        else:
            if name in params:
                load_tensor(params[name], tensor)
                loaded.add(name)
    # A scale that its weight's loader computes (online quantization) is in no checkpoint.
    missing = [
        n for n in set(params) - loaded if not getattr(params[n], "loaded_with_weight", False)
    ]
    if strict:
        check_nothing_missing(missing)


def load_tensor(param: nn.Parameter, tensor: torch.Tensor) -> None:
    """Fill `param` with the checkpoint tensor through its weight_loader (sharding,
    quantizing), or copy it as it is where the parameter has none."""
    loader = getattr(param, "weight_loader", None)
    if loader is None:
        param.data.copy_(tensor)
    else:
        loader(param, tensor)


def check_nothing_missing(missing: Iterable[str]) -> None:
    """Raise ValueError naming (the first five, sorted) of the parameters `missing` that no
    checkpoint tensor filled; nothing if there are none."""
    missing = sorted(missing)
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise ValueError(f"The checkpoint has no weights for {len(missing)} parameters: {shown}")
