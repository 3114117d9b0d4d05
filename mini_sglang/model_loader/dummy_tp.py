"""`--load-format dummy` under tensor parallelism: every rank holds its shard of the very
tensors a tp=1 run would hold.

SGLang's dummy format fills each parameter uniformly in [-1e-3, 1e-3] from seed 1234. Filling
each rank's *shard* that way would give every rank the same values (the first rows of the
stream), i.e. a different model for every TP degree. Instead each sharded parameter's full
(tp=1) tensor is generated with the same seed and routed through the parameter's own
`weight_loader`, exactly as a checkpoint tensor would be, so tp=2 serves the tp=1 model.

Worked example (QKV, 4 q heads, 2 kv heads, head_dim 16, tp=2): the full fused tensor is
[(4 + 2 + 2) * 16, hidden] = [128, hidden]; it is split into q rows 0..63, k rows 64..95 and
v rows 96..127 and loaded with shard ids "q", "k", "v"; rank 1 keeps q rows 32..63, k rows
80..95, v rows 112..127.
"""

from __future__ import annotations

import torch
from torch import nn

from mini_sglang.layers.linear import (
    ColumnParallelLinear,
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from mini_sglang.layers.moe.layer import FusedMoE
from mini_sglang.layers.vocab_parallel_embedding import VocabParallelEmbedding, pad_vocab_size


def full_dummy(
    shape: tuple[int, ...], seed: int, low: float, high: float, device: torch.device
) -> torch.Tensor:
    """A float32 tensor uniform in [low, high] drawn from `seed` on `device`.

    Drawn where the parameter lives, as SGLang's dummy loader does: generating Llama-3.1-8B's
    8B values on the host took 40-56 s of every GPU start-up, on the device well under a
    second. The values depend on the device type (CPU and CUDA generators differ) but are
    the same on every rank of one machine, which is what tp > 1 needs.
    """
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.empty(shape, dtype=torch.float32, device=device).uniform_(low, high, generator=gen)


def _shards(module: nn.Module, pname: str, param: nn.Parameter) -> list[tuple[tuple, object]]:
    """[(full tp=1 shape of the piece, shard_id)] that make up `param`, or [] if the
    parameter is replicated (then it is filled like tp=1 directly)."""
    rest = tuple(param.shape[1:])
    if isinstance(module, QKVParallelLinear):
        d = module.head_size
        q, kv = module.total_num_heads * d, module.total_num_kv_heads * d
        return [((q, *rest), "q"), ((kv, *rest), "k"), ((kv, *rest), "v")]
    if isinstance(module, MergedColumnParallelLinear):
        return [((size, *rest), i) for i, size in enumerate(module.output_sizes)]
    if isinstance(module, ColumnParallelLinear):
        return [((param.shape[0] * module.tp_size, *rest), None)]
    if isinstance(module, RowParallelLinear) and pname == "weight":
        return [((param.shape[0], param.shape[1] * module.tp_size), None)]
    if isinstance(module, VocabParallelEmbedding):
        return [((pad_vocab_size(module.num_embeddings, 1), param.shape[1]), None)]
    return []


def _full_expert_shape(module: FusedMoE, param: nn.Parameter) -> tuple[int, int, int]:
    """The tp=1 shape of a FusedMoE parameter: w13 [E, 2I, H] or w2 [E, H, I]."""
    experts, inter = module.num_experts, module.intermediate_size
    if param is module.w2_weight:
        return (experts, param.shape[1], inter)
    return (experts, 2 * inter, param.shape[2])


@torch.no_grad()
def fill_dummy_weights_tp(
    model: nn.Module,
    seed: int,
    low: float = -1e-3,
    high: float = 1e-3,
    device: torch.device | None = None,
) -> None:
    """Fill `model` (built at tp > 1) so each rank holds its shard of the tp=1 dummy model.

    Contract: for every parameter, the values equal what `fill_dummy_weights` gives the
    same parameter at tp=1 with the same `device` (where values are drawn; default: the
    parameter's own), restricted to this rank's shard.
    """
    done: set[int] = set()
    for module in model.modules():
        for pname, param in module.named_parameters(recurse=False):
            if id(param) in done or not torch.is_floating_point(param):
                continue
            if getattr(param, "filled_by_weight", False):  # its weight's loader fills it
                continue
            done.add(id(param))
            where = param.device if device is None else device
            if isinstance(module, FusedMoE):  # experts split by expert and by intermediate
                full = full_dummy(_full_expert_shape(module, param), seed, low, high, where)
                if getattr(param, "quantize_into", None) is None:  # else quantized by its loader
                    full = full.to(param.dtype)
                module.load_full(param, full)
                continue
            pieces = _shards(module, pname, param)
            if not pieces:
                param.data.copy_(full_dummy(tuple(param.shape), seed, low, high, where))
                continue
            # A tp=1 fused parameter is one tensor drawn from the seed; its pieces are
            # consecutive row blocks of it.
            rows = sum(shape[0] for shape, _ in pieces)
            full_shape = (rows, *pieces[0][0][1:])
            full = full_dummy(full_shape, seed, low, high, where)
            if getattr(param, "quantize_into", None) is None:  # else quantized by its loader
                full = full.to(param.dtype)
            offset = 0
            for shape, shard_id in pieces:
                piece = full.narrow(0, offset, shape[0])
                offset += shape[0]
                if shard_id is None:
                    param.weight_loader(param, piece)
                else:
                    param.weight_loader(param, piece, shard_id)
