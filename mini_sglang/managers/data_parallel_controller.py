"""DataParallelController: one process between the TokenizerManager and N scheduler replicas
(--dp-size N), SGLang 0.5.4's routing.

- Generate requests go to one replica: the one named by `data_parallel_rank` if given, else
  by --load-balance-method: `round_robin`, or `shortest_queue` (SGLang's DPBudget: replicas
  below the busiest one's load get that many requests first, then round robin).
- Every other message (abort, flush_cache, weight updates, internal state, ...) goes to every
  replica; each replica answers the TokenizerManager itself, which waits for all N replies
  (see tokenizer_communicator).
- Loads: SGLang's TokenizerManager polls replicas every 0.1 s and forwards the loads here.
  This controller asks the replicas itself (GetLoadReqInput whose `http_worker_ipc` names a
  socket of the controller's), so the TokenizerManager stays unaware of DP. Only
  shortest_queue polls.

The replicas are started by the engine (like every other child) with their own input socket
each; the controller binds those sockets and only routes.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import signal
import tempfile
import time
import traceback
from collections import deque
from typing import Any

import zmq

from mini_sglang.managers.io_struct.control import (
    GetLoadReqInput,
    GetLoadReqOutput,
    WatchLoadUpdateReq,
)
from mini_sglang.managers.io_struct.generate import (
    BatchTokenizedGenerateReqInput,
    TokenizedEmbeddingReqInput,
    TokenizedGenerateReqInput,
)
from mini_sglang.utils.process import (
    configure_logger,
    get_zmq_socket,
    set_parent_death_signal,
    set_process_title,
)

logger = logging.getLogger("mini_sglang")

LOAD_WATCH_INTERVAL_S = 0.1  # SGLang's --load-watch-interval default


class DPBudget:
    """SGLang's shortest-queue budget: after a load report, the least loaded replicas are
    owed requests until every replica would have the busiest one's num_reqs.

    Worked example: num_reqs [3, 1, 0] -> queue [2, 1, 2, 1, 2] (replica 2 gets 1 to reach
    replica 1, then both get 2 more, alternating, to reach 3).
    """

    def __init__(self) -> None:
        self.budget_queue: deque[int] = deque()

    def update_budget(self, loads: list[GetLoadReqOutput]) -> None:
        self.budget_queue.clear()
        num_reqs = [load.num_reqs for load in loads]
        if not num_reqs:
            return
        while any(x != num_reqs[0] for x in num_reqs):
            low = min(num_reqs)
            lows = [i for i, x in enumerate(num_reqs) if x == low]
            second = min(x for x in num_reqs if x > low)
            self.budget_queue.extend([loads[i].dp_rank for i in lows] * (second - low))
            for i in lows:
                num_reqs[i] = second

    def dispatch(self) -> int | None:
        return self.budget_queue.popleft() if self.budget_queue else None


class DataParallelController:
    def __init__(self, server_args, input_ipc_name: str, replica_ipc_names: list[str]) -> None:
        self.server_args = server_args
        self.context = zmq.Context(2)
        self.recv_from_tokenizer = get_zmq_socket(
            self.context, zmq.PULL, input_ipc_name, bind=False
        )
        self.workers = [
            get_zmq_socket(self.context, zmq.PUSH, name, bind=True) for name in replica_ipc_names
        ]
        self.round_robin_counter = 0
        self.budget = DPBudget()
        self.watch_loads = server_args.load_balance_method == "shortest_queue"
        with tempfile.NamedTemporaryFile(delete=False) as f:  # a fresh name per server
            self.load_ipc_name = f"ipc://{f.name}"
        self.recv_loads = get_zmq_socket(self.context, zmq.PULL, self.load_ipc_name, bind=True)
        self.pending_loads: dict[int, GetLoadReqOutput] = {}
        self.poller = zmq.Poller()
        self.poller.register(self.recv_from_tokenizer, zmq.POLLIN)
        self.poller.register(self.recv_loads, zmq.POLLIN)
        self._dispatch = {
            TokenizedGenerateReqInput: self.dispatch_generate,
            TokenizedEmbeddingReqInput: self.dispatch_generate,
            BatchTokenizedGenerateReqInput: self.dispatch_batch,
            WatchLoadUpdateReq: lambda req: self.budget.update_budget(req.loads),
        }

    # ---- routing -----------------------------------------------------------------------
    def pick_replica(self, req: TokenizedGenerateReqInput) -> int:
        rank = getattr(req, "data_parallel_rank", None)
        if rank is not None:
            if not 0 <= rank < len(self.workers):
                logger.error("data_parallel_rank %s out of range; using round robin", rank)
            else:
                return rank
        if self.watch_loads:
            target = self.budget.dispatch()
            if target is not None:
                return target
        target = self.round_robin_counter
        self.round_robin_counter = (target + 1) % len(self.workers)
        return target

    def dispatch_generate(self, req: TokenizedGenerateReqInput) -> None:
        self.workers[self.pick_replica(req)].send_pyobj(req)

    def dispatch_batch(self, batch: BatchTokenizedGenerateReqInput) -> None:
        for req in batch.batch:
            self.dispatch_generate(req)

    def broadcast(self, msg: Any) -> None:
        for worker in self.workers:
            worker.send_pyobj(msg)

    # ---- loads -------------------------------------------------------------------------
    def poll_loads(self) -> None:
        self.broadcast(GetLoadReqInput(http_worker_ipc=self.load_ipc_name))

    def on_load(self, load: GetLoadReqOutput) -> None:
        self.pending_loads[load.dp_rank] = load
        if len(self.pending_loads) == len(self.workers):
            self.budget.update_budget([self.pending_loads[i] for i in sorted(self.pending_loads)])
            self.pending_loads.clear()

    def event_loop(self) -> None:
        next_poll = time.monotonic()
        while True:
            timeout_ms = int(LOAD_WATCH_INTERVAL_S * 1000) if self.watch_loads else None
            events = dict(self.poller.poll(timeout_ms))
            if self.recv_loads in events:
                while True:
                    try:
                        self.on_load(self.recv_loads.recv_pyobj(zmq.NOBLOCK))
                    except zmq.Again:
                        break
            if self.recv_from_tokenizer in events:
                while True:
                    try:
                        msg = self.recv_from_tokenizer.recv_pyobj(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    self._dispatch.get(type(msg), self.broadcast)(msg)
            if self.watch_loads and time.monotonic() >= next_poll:
                self.poll_loads()
                next_poll = time.monotonic() + LOAD_WATCH_INTERVAL_S


def run_data_parallel_controller_process(
    server_args, input_ipc_name: str, replica_ipc_names: list[str], pipe_writer
) -> None:
    """Process entry: reports {"status": "ready"} (or the error) through pipe_writer, then
    routes forever; on a crash it signals the parent, which tears the server down."""
    set_parent_death_signal()
    set_process_title("data_parallel_controller")
    faulthandler.enable()
    configure_logger(server_args, prefix=" DP")
    parent = os.getppid()
    try:
        controller = DataParallelController(server_args, input_ipc_name, replica_ipc_names)
        pipe_writer.send({"status": "ready"})
        controller.event_loop()
    except Exception:
        msg = traceback.format_exc()
        logger.error("DataParallelController hit an exception: %s", msg)
        with contextlib.suppress(Exception):
            pipe_writer.send({"status": "error", "error": msg})
        os.kill(parent, signal.SIGQUIT)
