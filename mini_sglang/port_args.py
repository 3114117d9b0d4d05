"""PortArgs: the ZMQ endpoints and torch.distributed port of one server instance."""

from __future__ import annotations

import random
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mini_sglang.server_args_cli import is_port_available

if TYPE_CHECKING:
    from mini_sglang.server_args import ServerArgs


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
