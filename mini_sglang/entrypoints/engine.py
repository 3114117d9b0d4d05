"""Engine: the offline API, and the process launcher the HTTP server shares.

`Engine(model_path=..., **server_args)` starts the same subprocesses as the server (one
Scheduler per TP rank, one DetokenizerManager) and talks to them through an in-process
TokenizerManager, without HTTP. `generate` / `async_generate` take SGLang's arguments;
`score` / `async_score` are SGLang's decoder-only scoring (/v1/score).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

from mini_sglang.entrypoints.engine_weights import EngineWeightsMixin
from mini_sglang.entrypoints.launch import (
    plan_schedulers,
    serve_non_zero_node,
    start_dp_controller,
)
from mini_sglang.entrypoints.startup import (
    check_main_guard,
    check_model_path,
    check_quantization,
    check_tp_size,
    close_parent_ends,
    exit_if_bootstrapping_child,
    wait_for_children,
)
from mini_sglang.managers.detokenizer_manager import run_detokenizer_process
from mini_sglang.managers.io_struct.control import ExpertDistributionReqType, ProfileReqInput
from mini_sglang.managers.io_struct.generate import EmbeddingReqInput, GenerateReqInput
from mini_sglang.managers.scheduler_process import run_scheduler_process
from mini_sglang.managers.scoring import score_request
from mini_sglang.server_args import PortArgs, ServerArgs
from mini_sglang.utils.process import configure_logger, kill_process_tree

logger = logging.getLogger("mini_sglang")


def _watch_children(procs: list[mp.Process], stop: threading.Event) -> None:
    """A crashed child (even one killed without a traceback) takes the server down."""
    while not stop.wait(1.0):
        for p in procs:
            if not p.is_alive():
                logger.error(
                    "Child process %s (pid %s) died with exit code %s; shutting down.",
                    p.name,
                    p.pid,
                    p.exitcode,
                )
                kill_process_tree(os.getpid(), include_parent=False)
                os._exit(1)


# Set while Subprocesses.stop() tears the children down: a TP rank whose peer was killed a
# moment earlier fails its broadcast and sends SIGQUIT, which must not kill the parent then.
_stopping_children = threading.Event()


# Set while launch_subprocesses waits for the children: wait_for_children reports a child
# that fails then (with its name and exit code), so its SIGQUIT must not end the process.
_starting_children = threading.Event()


def _sigquit_handler(signum, frame) -> None:
    if _stopping_children.is_set() or _starting_children.is_set():
        return
    logger.error("Received sigquit from a child process. It usually means the child failed.")
    kill_process_tree(os.getpid(), include_parent=False)
    os._exit(1)


class Subprocesses:
    """The children of one server/engine; `stop()` ends exactly these (and their children)."""

    def __init__(self, procs: list[mp.Process], watcher_stop: threading.Event) -> None:
        self.procs = procs
        self.watcher_stop = watcher_stop

    def stop(self) -> None:
        self.watcher_stop.set()
        _stopping_children.set()
        try:
            for p in self.procs:
                if p.pid is not None:
                    kill_process_tree(p.pid)
            for p in self.procs:
                p.join(timeout=5)
        finally:
            _stopping_children.clear()


def launch_subprocesses(server_args: ServerArgs) -> tuple[Any, dict, Subprocesses]:
    """Start schedulers + detokenizer, build the TokenizerManager, wait until ready.

    Returns (tokenizer_manager, scheduler_info, children). A child that exits or fails
    before it is ready raises `StartupError` (naming it and its exit code) within about a
    second, after every child started has been killed; see entrypoints/startup.py.
    """

    exit_if_bootstrapping_child()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGQUIT, _sigquit_handler)
    # A child that fails during start-up also sends SIGQUIT; wait_for_children reports it.
    _starting_children.set()
    procs: list[mp.Process] = []
    try:
        return _launch(server_args, procs)
    except BaseException:
        for p in procs:
            kill_process_tree(p.pid)
        for p in procs:
            p.join(timeout=5)
        raise
    finally:
        _starting_children.clear()


def _launch(server_args: ServerArgs, procs: list[mp.Process]) -> tuple[Any, dict, Subprocesses]:
    """launch_subprocesses' work; every child started is appended to `procs` at once."""
    # Local: the TokenizerManager imports transformers (seconds), needed once a server starts.
    from mini_sglang.managers.tokenizer_manager import TokenizerManager

    check_model_path(server_args.model_path, server_args.load_format)
    check_tp_size(server_args)
    check_quantization(server_args)
    started = time.perf_counter()
    port_args = PortArgs.init_new(server_args)
    logger.info(f"{server_args=}")
    ctx = mp.get_context("spawn")
    readers, writers = [], []
    # One scheduler per (DP replica, TP rank) on this node; see launch.py.
    specs = plan_schedulers(server_args, port_args)
    for spec in specs:
        reader, writer = ctx.Pipe(duplex=False)
        proc = ctx.Process(
            target=run_scheduler_process,
            args=(server_args, spec.port_args, spec.gpu_id, spec.tp_rank, writer, spec.dp_rank),
            name=spec.name if server_args.dp_size > 1 else f"scheduler_TP{spec.tp_rank}",
            daemon=True,
        )
        proc.start()
        procs.append(proc)
        readers.append(reader)
        writers.append(writer)
    if server_args.node_rank >= 1:  # schedulers only, serving through node 0: never returns
        close_parent_ends(writers)
        _starting_children.clear()  # serve_non_zero_node watches its schedulers itself
        serve_non_zero_node(server_args, procs, readers)
    controller = start_dp_controller(ctx, server_args, port_args, specs)
    if controller is not None:
        procs.append(controller[0])
        readers.append(controller[1])
        writers.append(controller[2])
    detok = ctx.Process(
        target=run_detokenizer_process,
        args=(server_args, port_args),
        name="detokenizer",
        daemon=True,
    )
    detok.start()
    procs.append(detok)
    close_parent_ends(writers)
    tokenizer_start = time.perf_counter()
    tokenizer_manager = TokenizerManager(server_args, port_args)
    logger.info(
        "TokenizerManager ready in %.1f s (tokenizer: %s)",
        time.perf_counter() - tokenizer_start,
        server_args.tokenizer_path,
    )
    infos = wait_for_children(list(zip(procs, readers)), procs[len(readers) :])
    logger.info("%d child process(es) ready in %.1f s", len(procs), time.perf_counter() - started)
    stop = threading.Event()
    threading.Thread(target=_watch_children, args=(procs, stop), daemon=True).start()
    return tokenizer_manager, infos[0], Subprocesses(procs, stop)


# SGLang 0.5.4 Engine.generate's keyword arguments beyond the ones spelled out below.
_ENGINE_GENERATE_FIELDS = frozenset(
    {
        "image_data", "audio_data", "video_data", "lora_path", "custom_logit_processor",
        "return_hidden_states", "bootstrap_host", "bootstrap_port", "bootstrap_room",
        "data_parallel_rank",
    }
)  # fmt: skip


class Engine(EngineWeightsMixin):
    """The offline engine. Use as a context manager or call shutdown()."""

    def __init__(self, server_args: ServerArgs | None = None, **kwargs: Any) -> None:
        """Start the children and wait until they are ready; a child that cannot start
        raises `StartupError` (one line naming it and its exit code)."""
        exit_if_bootstrapping_child()  # before ServerArgs resolves anything
        check_main_guard()
        if server_args is None:
            kwargs.setdefault("log_level", "error")
            server_args = ServerArgs(**kwargs)
        configure_logger(server_args)
        self.server_args = server_args
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.tokenizer_manager, self.scheduler_info, self._children = launch_subprocesses(
            server_args
        )
        self._closed = False
        atexit.register(self.shutdown)

    # ---- generation ----------------------------------------------------------------
    def _make_obj(self, prompt, sampling_params, input_ids, stream, **kw) -> GenerateReqInput:
        return GenerateReqInput(
            text=prompt, input_ids=input_ids, sampling_params=sampling_params, stream=stream, **kw
        )

    def generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict | list[dict] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        return_logprob: bool | list[bool] | None = False,
        logprob_start_len: int | list[int] | None = None,
        top_logprobs_num: int | list[int] | None = None,
        token_ids_logprob: list[int] | list[list[int]] | None = None,
        stream: bool = False,
        rid: str | list[str] | None = None,
        return_text_in_logprobs: bool = False,
        **sglang_fields: Any,
    ) -> dict | list[dict] | Iterator[dict]:
        """SGLang's Engine.generate: a dict (one prompt), a list (a batch), or with
        stream=True an iterator of incremental dicts. sglang_fields: SGLang's other keyword
        arguments (data_parallel_rank, image_data, lora_path, return_hidden_states, ...),
        handled as the same /generate fields are (a ValueError where that is a 400)."""
        unknown = set(sglang_fields) - _ENGINE_GENERATE_FIELDS
        if unknown:
            raise TypeError(f"generate() got unexpected keyword arguments {sorted(unknown)}")
        obj = self._make_obj(
            prompt,
            sampling_params,
            input_ids,
            stream,
            return_logprob=return_logprob,
            logprob_start_len=logprob_start_len,
            top_logprobs_num=top_logprobs_num,
            token_ids_logprob=token_ids_logprob,
            rid=rid,
            return_text_in_logprobs=return_text_in_logprobs,
            **sglang_fields,
        )
        gen = self.tokenizer_manager.generate_request(obj, None)
        if stream:
            return self._iterate(gen)
        return self.loop.run_until_complete(gen.__anext__())

    def _iterate(self, agen) -> Iterator[dict]:
        while True:
            try:
                yield self.loop.run_until_complete(agen.__anext__())
            except StopAsyncIteration:
                return

    async def async_generate(
        self,
        prompt: str | list[str] | None = None,
        sampling_params: dict | list[dict] | None = None,
        input_ids: list[int] | list[list[int]] | None = None,
        stream: bool = False,
        **kw: Any,
    ):
        """Awaitable result, or with stream=True an async iterator of dicts."""
        obj = self._make_obj(prompt, sampling_params, input_ids, stream, **kw)
        gen = self.tokenizer_manager.generate_request(obj, None)
        if stream:
            return gen
        return await gen.__anext__()

    # ---- embedding -----------------------------------------------------------------
    def encode(
        self,
        prompt: str | list[str] | None = None,
        image_data: Any = None,
        input_ids: list[int] | list[list[int]] | None = None,
    ) -> dict | list[dict]:
        """SGLang's Engine.encode on an embedding / score model: {"embedding": [...],
        "meta_info": {...}} for one input, a list of them for a batch (text or input_ids).
        Bad input, or a generation model, raises ValueError."""
        return self.loop.run_until_complete(self.async_encode(prompt, image_data, input_ids))

    async def async_encode(
        self,
        prompt: str | list[str] | None = None,
        image_data: Any = None,
        input_ids: list[int] | list[list[int]] | None = None,
    ) -> dict | list[dict]:
        """encode, awaitable."""
        obj = EmbeddingReqInput(text=prompt, image_data=image_data, input_ids=input_ids)
        return await self.tokenizer_manager.generate_request(obj, None).__anext__()

    def rerank(self, prompt: list[list[str]]) -> list[dict]:
        """SGLang's Engine.rerank on a cross-encoder: one {"embedding": score, "meta_info"}
        per [query, document] pair, in the given order (unsorted; /v1/rerank sorts). Bad
        pairs, or a generation model, raise ValueError."""
        obj = EmbeddingReqInput(text=prompt, is_cross_encoder_request=True)
        return self.loop.run_until_complete(
            self.tokenizer_manager.generate_request(obj, None).__anext__()
        )

    def score(self, *args: Any, **kwargs: Any) -> list[list[float]]:
        """async_score, waited for."""
        return self.loop.run_until_complete(self.async_score(*args, **kwargs))

    async def async_score(
        self,
        query: str | list[int] | None = None,
        items: str | list[str] | list[list[int]] | None = None,
        label_token_ids: list[int] | None = None,
        apply_softmax: bool = False,
        item_first: bool = False,
    ) -> list[list[float]]:
        """Per item, the probability of each of label_token_ids as the token after
        query + item (item + query with item_first), or their softmax with apply_softmax;
        see managers/scoring.py (/v1/score). Bad input raises ValueError."""
        return await score_request(
            self.tokenizer_manager, query, items, label_token_ids, apply_softmax, item_first
        )

    def flush_cache(self) -> bool:
        return self.loop.run_until_complete(
            self.tokenizer_manager.communicator.flush_cache()
        ).success

    def start_profile(self, **kwargs: Any) -> None:
        """/start_profile's body as keyword arguments (output_dir, num_steps, activities, ...)."""
        communicator = self.tokenizer_manager.communicator
        self.loop.run_until_complete(communicator.start_profile(ProfileReqInput(**kwargs)))

    def stop_profile(self) -> None:
        """Stop the profiler; every rank's trace is written when this returns."""
        self.loop.run_until_complete(self.tokenizer_manager.communicator.stop_profile())

    def _expert_distribution(self, action: ExpertDistributionReqType) -> None:
        communicator = self.tokenizer_manager.communicator
        out = self.loop.run_until_complete(communicator.expert_distribution(action))
        if not out.success:
            raise ValueError(out.message)

    def start_expert_distribution_record(self) -> None:
        """Start counting each MoE layer's expert choices per forward pass (a server
        started with expert_distribution_recorder_mode="stat"; else ValueError)."""
        self._expert_distribution(ExpertDistributionReqType.START_RECORD)

    def stop_expert_distribution_record(self) -> None:
        self._expert_distribution(ExpertDistributionReqType.STOP_RECORD)

    def dump_expert_distribution_record(self) -> None:
        """Write the record to $SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR and reset it
        (docs/moe.md)."""
        self._expert_distribution(ExpertDistributionReqType.DUMP_RECORD)

    def freeze_gc(self) -> None:
        """gc.freeze() in this process, the scheduler and the detokenizer (/freeze_gc); call
        it after a few warm-up requests so that long-lived objects leave the collections."""
        self.loop.run_until_complete(self.tokenizer_manager.communicator.freeze_gc())

    def get_server_info(self) -> dict:
        states = self.loop.run_until_complete(
            self.tokenizer_manager.communicator.get_internal_state()
        )
        return {
            **self.tokenizer_manager.runtime_state.server_args_view(self.server_args),
            **self.scheduler_info,
            "internal_states": states,  # one per DP replica
        }

    # ---- lifetime ------------------------------------------------------------------
    def shutdown(self) -> None:
        if getattr(self, "_closed", True):
            return
        self._closed = True
        task = self.tokenizer_manager.handle_loop_task
        if task is not None and not task.done() and not self.loop.is_running():
            task.cancel()
            with contextlib.suppress(RuntimeError):
                self.loop.run_until_complete(asyncio.gather(task, return_exceptions=True))
        self._children.stop()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
