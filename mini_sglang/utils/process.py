"""Process plumbing shared by every mini-sglang process: ZMQ sockets, process-tree
cleanup, and making children die with their parent (no orphans)."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import sys

import psutil
import zmq

logger = logging.getLogger("mini_sglang")

PR_SET_PDEATHSIG = 1


def get_zmq_socket(context: zmq.Context, socket_type: int, endpoint: str, bind: bool) -> zmq.Socket:
    sock = context.socket(socket_type)
    # Unlimited buffers: a burst of requests must queue, not block or drop.
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    if bind:
        sock.bind(endpoint)
    else:
        sock.connect(endpoint)
    return sock


def set_process_title(name: str) -> None:
    """Show this process as `mini_sglang::<name>` in ps/top (SGLang's `sglang::<name>`)."""
    import setproctitle

    setproctitle.setproctitle(f"mini_sglang::{name}")


def set_parent_death_signal(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to kill this process when its parent dies (prctl PR_SET_PDEATHSIG).

    The request only covers a death after it is made: a multiprocessing child whose parent
    died while it was still starting (a spawned child imports torch first, seconds on a busy
    machine) has been re-parented already, so it sends itself the signal instead."""
    if sys.platform != "linux":
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, sig)
    except OSError:
        return
    parent = multiprocessing.parent_process()
    if parent is not None and os.getppid() != parent.pid:
        os.kill(os.getpid(), sig)


def kill_process_tree(pid: int, include_parent: bool = True, sig: int = signal.SIGKILL) -> None:
    """Kill `pid`'s descendants (and `pid` itself unless include_parent is False)."""
    try:
        parent = psutil.Process(pid)
    except psutil.NoSuchProcess:
        return
    for child in parent.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            child.send_signal(sig)
    if include_parent:
        with contextlib.suppress(psutil.NoSuchProcess):
            if pid == os.getpid():
                sys.stdout.flush()
                sys.stderr.flush()
            parent.send_signal(sig)


def configure_logger(server_args, prefix: str = "") -> None:
    level = getattr(logging, str(getattr(server_args, "log_level", "info")).upper(), logging.INFO)
    fmt = f"[%(asctime)s{prefix}] %(message)s"
    logging.basicConfig(level=level, format=fmt, datefmt="%Y-%m-%d %H:%M:%S", force=True)
