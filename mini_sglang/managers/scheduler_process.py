"""The scheduler process: ZMQ wiring around a Scheduler, one process per TP rank.

Rank 0 owns the sockets: it drains everything the TokenizerManager sent since the last
iteration and, with tp_size > 1, broadcasts that list to the other ranks over the CPU group,
so every rank schedules identical batches. Token ids go to the DetokenizerManager; replies
to control requests go straight to the TokenizerManager.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import traceback
from typing import Any

import zmq

from mini_sglang.distributed.parallel_state import broadcast_pyobj
from mini_sglang.distributed.rank_setup import configure_cpu_threads, init_scheduler_tp_group
from mini_sglang.managers.scheduler_watchdog import start_watchdog
from mini_sglang.utils.process import (
    configure_logger,
    get_zmq_socket,
    set_parent_death_signal,
    set_process_title,
)

logger = logging.getLogger("mini_sglang")


def device_name(device: Any) -> str:
    """The card (or the host's CPU) this scheduler runs on, for the dashboard."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        return torch.cuda.get_device_name(device)
    import platform

    return f"CPU ({platform.processor() or platform.machine()})"


class SchedulerIO:
    """Rank 0's sockets; other ranks only take part in the broadcast."""

    def __init__(self, port_args, tp_rank: int, tp_size: int) -> None:
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.poller = None
        if tp_rank == 0:
            ctx = zmq.Context(2)
            self.recv_from_tokenizer = get_zmq_socket(
                ctx, zmq.PULL, port_args.scheduler_input_ipc_name, bind=False
            )
            self.send_to_detokenizer_sock = get_zmq_socket(
                ctx, zmq.PUSH, port_args.detokenizer_ipc_name, bind=False
            )
            self.send_to_tokenizer_sock = get_zmq_socket(
                ctx, zmq.PUSH, port_args.tokenizer_ipc_name, bind=False
            )
            self.poller = zmq.Poller()
            self.poller.register(self.recv_from_tokenizer, zmq.POLLIN)

    def recv_requests(self, block_ms: int = 0) -> list[Any]:
        reqs: list[Any] = []
        if self.tp_rank == 0:
            if block_ms:
                self.poller.poll(block_ms)  # whatever arrived is drained below
            while True:
                try:
                    reqs.append(self.recv_from_tokenizer.recv_pyobj(zmq.NOBLOCK))
                except zmq.Again:
                    break
        if self.tp_size > 1:
            reqs = broadcast_pyobj(reqs)
        return reqs

    def send_to_detokenizer(self, out: Any) -> None:
        if self.tp_rank == 0:
            self.send_to_detokenizer_sock.send_pyobj(out)

    def send_to_tokenizer(self, out: Any) -> None:
        if self.tp_rank == 0:
            self.send_to_tokenizer_sock.send_pyobj(out)


def run_scheduler_process(
    server_args, port_args, gpu_id: int, tp_rank: int, pipe_writer, dp_rank: int | None = None
) -> None:
    """Process entry. Reports readiness (or the startup error) through pipe_writer; on a
    crash it logs the traceback and signals the parent, which tears the server down."""
    set_parent_death_signal()
    faulthandler.enable()
    prefix = f" TP{tp_rank}" if server_args.tp_size > 1 else ""
    prefix = f" DP{dp_rank}{prefix}" if server_args.dp_size > 1 else prefix
    set_process_title(f"scheduler{prefix.replace(' ', '_')}")  # scheduler, scheduler_TP1, ...
    configure_logger(server_args, prefix=prefix)
    parent = os.getppid()
    try:
        configure_cpu_threads(server_args)
        if server_args.tp_size > 1:
            init_scheduler_tp_group(server_args, port_args, tp_rank)
        # Local: the launcher imports this module for the process target; the Scheduler's
        # model stack (model runner, Triton kernels) loads in the scheduler process only.
        from mini_sglang.managers.scheduler import Scheduler

        io = SchedulerIO(port_args, tp_rank, server_args.tp_size)
        scheduler = Scheduler(
            server_args,
            gpu_id=gpu_id,
            tp_rank=tp_rank,
            dp_rank=dp_rank,
            send_to_detokenizer=io.send_to_detokenizer,
            send_to_tokenizer=io.send_to_tokenizer,
        )
        start_watchdog(scheduler, server_args.watchdog_timeout, parent)
        pipe_writer.send(
            {
                "status": "ready",
                "max_total_num_tokens": scheduler.max_total_num_tokens,
                "max_req_input_len": scheduler.max_req_input_len,
                "context_len": scheduler.model_config.context_len,
                "internal_state": scheduler.internal_state(),
                "device_name": device_name(scheduler.device),
            }
        )
        scheduler.event_loop(io.recv_requests)
    except Exception:
        msg = traceback.format_exc()
        logger.error("Scheduler hit an exception: %s", msg)
        with contextlib.suppress(Exception):  # the parent may be gone already
            pipe_writer.send({"status": "error", "error": msg})
        os.kill(parent, signal.SIGQUIT)
