"""Process launch for --tp-size, --dp-size and --nnodes (SGLang's layout), used by the engine.

- One scheduler process per (DP replica, TP rank) hosted on this node. With N nodes each
  node hosts tp_size / N consecutive TP ranks (node k: ranks k*tp/N .. (k+1)*tp/N - 1).
- Node 0 also runs the TokenizerManager (with HTTP), the DetokenizerManager and, with
  --dp-size > 1, the DataParallelController. Nodes >= 1 run only their schedulers, which
  take part through torch.distributed alone (rank 0's broadcast of every received
  message), plus a dummy /health server, and block until killed.
- TP groups meet at --dist-init-addr (host:port of node 0) when given, else at
  127.0.0.1:<nccl_port>; each DP replica has its own TP group and its own port (what a
  scheduler process does to join it is in distributed/rank_setup.py).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import threading
from dataclasses import dataclass
from typing import Any

from mini_sglang.managers.data_parallel_controller import run_data_parallel_controller_process
from mini_sglang.server_args import PortArgs
from mini_sglang.utils.process import kill_process_tree

logger = logging.getLogger("mini_sglang")


@dataclass
class SchedulerSpec:
    dp_rank: int
    tp_rank: int
    gpu_id: int
    port_args: Any  # PortArgs of the replica (its own scheduler input socket and TP port)

    @property
    def name(self) -> str:
        return f"scheduler_DP{self.dp_rank}_TP{self.tp_rank}"


def plan_schedulers(server_args, port_args) -> list[SchedulerSpec]:
    """The scheduler processes this node runs, replicas in order, ranks in order.

    With dp_size == 1 the replica uses `port_args` itself; otherwise each replica gets fresh
    input/NCCL endpoints but shares the TokenizerManager's and detokenizer's sockets.
    """
    sa = server_args
    tp_per_node = sa.tp_size // sa.nnodes
    first = tp_per_node * sa.node_rank
    specs = []
    for dp_rank in range(sa.dp_size):
        replica_args = port_args
        if sa.dp_size > 1:
            replica_args = PortArgs.init_new(sa)
            replica_args = dataclasses.replace(
                replica_args,
                tokenizer_ipc_name=port_args.tokenizer_ipc_name,
                detokenizer_ipc_name=port_args.detokenizer_ipc_name,
                # Distinct TP rendezvous ports even when --nccl-port pins the first.
                nccl_port=port_args.nccl_port + dp_rank
                if sa.nccl_port is not None
                else replica_args.nccl_port,
            )
        for tp_rank in range(first, first + tp_per_node):
            gpu_id = (
                sa.base_gpu_id
                + dp_rank * tp_per_node * sa.gpu_id_step
                + (tp_rank - first) * sa.gpu_id_step
            )
            specs.append(SchedulerSpec(dp_rank, tp_rank, gpu_id, replica_args))
    return specs


def start_dp_controller(ctx, server_args, port_args, specs: list[SchedulerSpec]):
    """Start the DataParallelController (node 0, dp_size > 1); returns (process, reader,
    writer) or None (the caller closes its copy of the writer once every child started)."""
    if server_args.dp_size == 1:
        return None
    names = [s.port_args.scheduler_input_ipc_name for s in specs if s.tp_rank == 0]
    reader, writer = ctx.Pipe(duplex=False)
    proc = ctx.Process(
        target=run_data_parallel_controller_process,
        args=(server_args, port_args.scheduler_input_ipc_name, names, writer),
        name="data_parallel_controller",
        daemon=True,
    )
    proc.start()
    return proc, reader, writer


def serve_non_zero_node(server_args, procs: list, readers: list) -> None:
    """Node >= 1: wait for its schedulers to be ready (raising RuntimeError if one fails),
    answer /health with 200 (a dummy server, as SGLang) and block until a scheduler exits;
    then end this node's processes and exit (never returns)."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    for reader, proc in zip(readers, procs):
        try:
            info = reader.recv()
        except EOFError:
            info = {"error": f"exit code {proc.exitcode}"}
        if info.get("status") != "ready":
            for p in procs:
                kill_process_tree(p.pid)
            raise RuntimeError(f"{proc.name} failed to start:\n{info.get('error')}")

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            ok = self.path.startswith("/health")
            self.send_response(200 if ok else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    def on_term(signum, frame) -> None:
        logger.info("Node %d received signal %d; shutting down.", server_args.node_rank, signum)
        kill_process_tree(os.getpid(), include_parent=False)
        os._exit(0)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_term)
    try:
        httpd = ThreadingHTTPServer((server_args.host, server_args.port), Health)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
    except OSError as e:
        logger.warning("Node %d: no dummy health server (%s)", server_args.node_rank, e)
    logger.info(
        "Node %d: %d scheduler(s) ready; serving through node 0.",
        server_args.node_rank,
        len(procs),
    )
    for p in procs:
        p.join()
        logger.error("Scheduler %s exited with code %s; node exits.", p.name, p.exitcode)
        kill_process_tree(os.getpid(), include_parent=False)
        os._exit(1)
