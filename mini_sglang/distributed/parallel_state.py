"""Tensor-parallel process groups and the collectives the layers call.

At tp_size == 1 every collective is the identity, so layers are written once for any TP
degree. The CPU group (gloo) carries Python objects between ranks (rank 0 broadcasts the
scheduler's received requests); the device group (NCCL on CUDA, gloo on CPU) carries tensors.

Mixture-of-experts layers split the TP group further (SGLang's moe_ep / moe_tp): with
ep_size E the experts form E groups of whole experts, and each group's experts are tensor
parallel over tp_size / E ranks (their intermediate dimension is sharded). Rank r holds
expert group r // (tp_size / E) and intermediate shard r % (tp_size / E); the MoE output is
a partial sum that the TP group's all-reduce completes, so no other group is needed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class TPGroup:
    rank: int = 0
    world_size: int = 1
    device_group: dist.ProcessGroup | None = None
    cpu_group: dist.ProcessGroup | None = None
    ep_size: int = 1  # MoE expert groups; divides world_size


_TP = TPGroup()


def init_distributed_environment(
    tp_rank: int,
    tp_size: int,
    backend: str,
    init_method: str,
    timeout_s: int | None = None,
    ep_size: int = 1,
) -> None:
    """Join the world of `tp_size` ranks (a no-op at tp_size == 1); MoE layers built
    afterwards split their experts into `ep_size` groups (see set_expert_parallel_size)."""
    global _TP
    if tp_size == 1:
        _TP = TPGroup()
        set_expert_parallel_size(ep_size)
        return
    import datetime

    kwargs = {}
    if timeout_s:
        kwargs["timeout"] = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(
        backend=backend, init_method=init_method, rank=tp_rank, world_size=tp_size, **kwargs
    )
    ranks = list(range(tp_size))
    cpu_group = dist.new_group(ranks, backend="gloo") if backend != "gloo" else dist.group.WORLD
    _TP = TPGroup(tp_rank, tp_size, dist.group.WORLD, cpu_group)
    set_expert_parallel_size(ep_size)


def set_expert_parallel_size(ep_size: int) -> None:
    """How MoE layers built from now on split their experts over the TP group: `ep_size`
    groups of whole experts (1: every rank holds a shard of every expert). It must divide
    the TP world size; models already built keep their split."""
    if ep_size < 1 or _TP.world_size % ep_size:
        raise ValueError(f"--ep-size {ep_size} must divide --tp-size {_TP.world_size}")
    _TP.ep_size = ep_size


def destroy_distributed_environment() -> None:
    """Leave the TP world, all ranks together: rank 0 hosts the rendezvous store, and a rank
    still running (e.g. NCCL's watchdog polling that store) when rank 0 exits logs connection
    errors; destroying the group also stops the warning that it was never destroyed."""
    global _TP
    if _TP.world_size > 1 and dist.is_initialized():
        dist.barrier(group=_TP.cpu_group)
        dist.destroy_process_group()
    _TP = TPGroup()


def get_tp_group() -> TPGroup:
    return _TP


def get_tp_rank() -> int:
    return _TP.rank


def get_tp_size() -> int:
    return _TP.world_size


def get_moe_ep_size() -> int:
    """The number of expert groups (--ep-size)."""
    return _TP.ep_size


def get_moe_ep_rank() -> int:
    """This rank's expert group, in [0, get_moe_ep_size())."""
    return _TP.rank // get_moe_tp_size()


def get_moe_tp_size() -> int:
    """How many ranks shard each expert's intermediate dimension (tp_size / ep_size)."""
    return _TP.world_size // _TP.ep_size


def get_moe_tp_rank() -> int:
    """This rank's shard of each of its experts, in [0, get_moe_tp_size())."""
    return _TP.rank % get_moe_tp_size()


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    if _TP.world_size == 1:
        return x
    dist.all_reduce(x, group=_TP.device_group)
    return x


def tensor_model_parallel_all_gather(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Concatenate each rank's `x` along `dim` (ranks in order)."""
    if _TP.world_size == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(_TP.world_size)]
    dist.all_gather(parts, x.contiguous(), group=_TP.device_group)
    return torch.cat(parts, dim=dim)


def broadcast_pyobj(obj: object, src: int = 0) -> object:
    """Send a picklable object from rank `src` to all TP ranks over the CPU group."""
    if _TP.world_size == 1:
        return obj
    box = [obj if _TP.rank == src else None]
    dist.broadcast_object_list(box, src=src, group=_TP.cpu_group)
    return box[0]


def divide(numerator: int, denominator: int) -> int:
    if numerator % denominator != 0:
        raise ValueError(f"{numerator} is not divisible by {denominator}")
    return numerator // denominator
