"""DetokenizerManager process: BatchTokenIDOutput (token ids) in, BatchStrOutput (text) out.

The decoding logic lives in incremental_detok.IncrementalDetokenizer; this module is only
the process and its sockets, dispatching on message type.
"""

from __future__ import annotations

import logging
import os
import signal
import traceback
from typing import Any

import zmq

from mini_sglang.managers.incremental_detok import IncrementalDetokenizer
from mini_sglang.managers.io_struct.control import FreezeGCReq
from mini_sglang.managers.io_struct.output import (
    PASSTHROUGH_FIELDS,
    BatchEmbeddingOutput,
    BatchStrOutput,
    BatchTokenIDOutput,
)
from mini_sglang.utils.gc_utils import freeze_gc
from mini_sglang.utils.hf_tokenizer import get_tokenizer
from mini_sglang.utils.process import (
    configure_logger,
    get_zmq_socket,
    set_parent_death_signal,
    set_process_title,
)

logger = logging.getLogger("mini_sglang")


class DetokenizerManager:
    def __init__(self, server_args, port_args) -> None:
        ctx = zmq.Context(2)
        self.recv_from_scheduler = get_zmq_socket(
            ctx, zmq.PULL, port_args.detokenizer_ipc_name, bind=True
        )
        self.send_to_tokenizer = get_zmq_socket(
            ctx, zmq.PUSH, port_args.tokenizer_ipc_name, bind=False
        )
        tokenizer = None
        if not server_args.skip_tokenizer_init:
            tokenizer = get_tokenizer(server_args.tokenizer_path, server_args)
        self.detok = IncrementalDetokenizer(tokenizer) if tokenizer is not None else None
        self._dispatch = {
            BatchTokenIDOutput: self.handle_batch_token_id_out,
            FreezeGCReq: lambda recv: freeze_gc("Detokenizer Manager"),
            BatchEmbeddingOutput: lambda recv: recv,  # nothing to decode: passed on as is
        }

    def handle_batch_token_id_out(self, recv: BatchTokenIDOutput) -> Any:
        if self.detok is None:
            # --skip-tokenizer-init: ids only, no text.
            return BatchStrOutput(
                output_strs=[""] * len(recv.rids),
                output_ids=recv.output_ids,
                **{k: getattr(recv, k) for k in PASSTHROUGH_FIELDS},
            )
        return self.detok.handle_batch_token_id_out(recv)

    def event_loop(self) -> None:
        while True:
            recv = self.recv_from_scheduler.recv_pyobj()
            handler = self._dispatch.get(type(recv))
            out = handler(recv) if handler is not None else recv
            if out is not None:  # a handler without a reply (freeze_gc) returns None
                self.send_to_tokenizer.send_pyobj(out)


def run_detokenizer_process(server_args, port_args) -> None:
    set_parent_death_signal()
    set_process_title("detokenizer")
    configure_logger(server_args, prefix=" Detokenizer")
    try:
        DetokenizerManager(server_args, port_args).event_loop()
    except Exception:
        logger.error("DetokenizerManager hit an exception: %s", traceback.format_exc())
        os.kill(os.getppid(), signal.SIGQUIT)
