"""What a TP rank's process does before it builds its model: take its share of the CPU
cores and join its replica's TP group (the layout is planned in entrypoints/launch.py).

TP groups meet at --dist-init-addr (host:port of node 0) when given and there is one
replica, else at 127.0.0.1:<nccl_port>; each DP replica has its own port.
"""

from __future__ import annotations

import os

import torch

from mini_sglang.distributed.parallel_state import init_distributed_environment


def dist_init_method(server_args, port_args) -> str:
    """Where a replica's TP ranks meet: --dist-init-addr (the same string on every node),
    unless several replicas need several groups; else this machine's nccl_port."""
    if server_args.dist_init_addr and server_args.dp_size == 1:
        return f"tcp://{server_args.dist_init_addr}"
    return f"tcp://127.0.0.1:{port_args.nccl_port}"


def configure_cpu_threads(server_args) -> None:
    """On CPU, split the cores between this node's scheduler processes: each one's OpenMP
    pool spinning on every core makes tp=2 on 2 cores several times slower."""
    sa = server_args
    local = sa.dp_size * sa.tp_size // sa.nnodes
    if sa.device != "cpu" or local <= 1:
        return
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // local))


def init_scheduler_tp_group(server_args, port_args, tp_rank: int) -> None:
    """Join this replica's TP group: gloo on CPU, NCCL (plus a gloo CPU group) on CUDA."""
    backend = "nccl" if server_args.device == "cuda" else "gloo"
    init_distributed_environment(
        tp_rank,
        server_args.tp_size,
        backend,
        dist_init_method(server_args, port_args),
        server_args.dist_timeout,
        server_args.ep_size,
    )
