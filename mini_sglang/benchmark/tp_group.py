"""One process per TP rank for an offline benchmark (bench_one_batch --tp-size N).

run_tp_group spawns tp_size processes; each joins the TP group, runs `run_rank(server_args,
args, tp_rank)` (the same batches in lockstep on every rank) and reports to the parent
through a pipe before it leaves the group. The parent returns rank 0's report, or raises the
first rank's error. A rank still leaving the group TEARDOWN_TIMEOUT_S after every report is
killed: the numbers are complete by then, and a stuck teardown must not hold the run.
"""

from __future__ import annotations

import faulthandler
import logging
import multiprocessing
import multiprocessing.connection
import time
import traceback
from collections.abc import Callable
from typing import Any

from mini_sglang.distributed.parallel_state import destroy_distributed_environment
from mini_sglang.distributed.rank_setup import configure_cpu_threads, init_scheduler_tp_group
from mini_sglang.model_executor.cuda_graph_runner import release_cuda_graphs
from mini_sglang.server_args import PortArgs, ServerArgs
from mini_sglang.utils.process import set_parent_death_signal

logger = logging.getLogger("mini_sglang")
# how long a TP rank that has reported may take to leave the group before it is killed
TEARDOWN_TIMEOUT_S = 60

RunRank = Callable[[ServerArgs, Any, int], Any]


def _rank_process(
    run_rank: RunRank, server_args: ServerArgs, args: Any, port_args: PortArgs, tp_rank: int, conn
) -> None:
    # A killed or timed-out benchmark must not leave ranks holding the GPUs (and skewing
    # the next run's numbers), as the server's scheduler processes do not.
    set_parent_death_signal()
    try:
        configure_cpu_threads(server_args)
        init_scheduler_tp_group(server_args, port_args, tp_rank)
        out = run_rank(server_args, args, tp_rank)
        # report first: the numbers are complete, whatever the group's teardown does
        conn.send(out if tp_rank == 0 else None)
        # where a teardown that outlives half the parent's patience is stuck, in the log
        faulthandler.dump_traceback_later(TEARDOWN_TIMEOUT_S / 2)
        release_cuda_graphs()  # else NCCL's teardown waits for them forever
        destroy_distributed_environment()
        faulthandler.cancel_dump_traceback_later()
    except BaseException:
        conn.send(RuntimeError(f"TP rank {tp_rank} failed:\n{traceback.format_exc()}"))
        raise


def run_tp_group(run_rank: RunRank, server_args: ServerArgs, args: Any) -> Any:
    """Run `run_rank` (a module-level function, so that spawn can pickle it) on tp_size
    spawned rank processes; returns rank 0's result, or raises the first rank's error
    (ending the other ranks, which would wait forever in a collective)."""
    port_args = PortArgs.init_new(server_args)
    ctx = multiprocessing.get_context("spawn")
    ranks = []
    for tp_rank in range(server_args.tp_size):
        reader, writer = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=_rank_process, args=(run_rank, server_args, args, port_args, tp_rank, writer)
        )
        proc.start()
        writer.close()  # so a rank that dies without reporting reads as EOF here
        ranks.append((proc, reader))
    report, pending = None, {reader: proc for proc, reader in ranks}
    try:
        while pending:
            for reader in multiprocessing.connection.wait(list(pending)):
                proc = pending.pop(reader)
                try:
                    msg = reader.recv()
                except EOFError:
                    msg = RuntimeError(f"TP rank process exited with code {proc.exitcode}")
                if isinstance(msg, BaseException):
                    raise msg
                report = msg if msg is not None else report
    finally:
        deadline = time.monotonic() + TEARDOWN_TIMEOUT_S
        for proc, _ in ranks:
            if not pending:  # every rank reported: all that is left is leaving the group
                proc.join(timeout=max(deadline - time.monotonic(), 0.0))
                if proc.is_alive():
                    logger.warning("TP rank process %d still leaving the group; killed", proc.pid)
            if proc.is_alive():  # or a rank failed, and this one would wait in a collective
                proc.kill()
            proc.join()
    assert report is not None
    return report
