"""PortArgs: the ZMQ endpoints and torch.distributed port of one server instance."""

from __future__ import annotations

import random
import socket
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mini_sglang.server_args import ServerArgs


def is_port_available(port: int) -> bool:
    """True if a TCP socket can bind `port` on all interfaces right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("", port))
            return True
        except OSError:
            return False


def _ipc_name() -> str:
    # A fresh file name per endpoint: two servers on one machine can never collide.
    return f"ipc://{tempfile.NamedTemporaryFile(delete=False).name}"


@dataclass
class PortArgs:
    """The ZMQ endpoints and NCCL port of one server instance (SGLang's names)."""

    tokenizer_ipc_name: str  # detokenizer (and scheduler control replies) -> TokenizerManager
    scheduler_input_ipc_name: str  # TokenizerManager (or DP controller) -> scheduler rank 0
    detokenizer_ipc_name: str  # scheduler -> DetokenizerManager
    nccl_port: int  # torch.distributed init port
    rpc_ipc_name: str  # Engine <-> scheduler RPC
    metrics_ipc_name: str  # scheduler -> metrics collector
    tokenizer_worker_ipc_name: str | None = None

    @staticmethod
    def init_new(server_args: ServerArgs, dp_rank: int | None = None) -> PortArgs:
        """Fresh `ipc://` temp-file endpoints plus an NCCL port.

        nccl_port: --nccl-port if given, else port + rand(100..1000) probed until free.
        `dp_rank` is accepted for SGLang's signature; without DP attention every rank uses
        its own fresh IPC names, so it changes nothing.
        """
        nccl_port = server_args.nccl_port
        if nccl_port is None:
            nccl_port = server_args.port + random.randint(100, 1000)
            while not is_port_available(nccl_port):
                nccl_port = nccl_port + 42 if nccl_port < 60000 else nccl_port - 43
        return PortArgs(
            tokenizer_ipc_name=_ipc_name(),
            scheduler_input_ipc_name=_ipc_name(),
            detokenizer_ipc_name=_ipc_name(),
            nccl_port=nccl_port,
            rpc_ipc_name=_ipc_name(),
            metrics_ipc_name=_ipc_name(),
        )
