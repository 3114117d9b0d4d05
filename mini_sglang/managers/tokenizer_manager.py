"""TokenizerManager: the asyncio front of the server (runs in the HTTP / Engine process).

`generate_request(obj)` validates and tokenizes a GenerateReqInput, sends each sub-request
to the scheduler, and yields SGLang's output dicts as the detokenizer's BatchStrOutput
messages arrive:  {"text": cumulative text, "output_ids": ..., "meta_info": {...}} (built
by ReqState, req_state.py). Control requests (flush_cache, internal state, profiling,
weight updates, ...) go through ``self.communicator`` (tokenizer_communicator.py), whose
replies the scheduler sends here directly. Errors a client can fix raise ValueError
(-> HTTP 400).

Pause (0.5.4's pause_generation): mark the server paused and abort every in-flight request
(they finish with an abort reason and free their KV as any abort does). While paused,
`generate_request` parks each new request before tokenizing it, so nothing new reaches the
scheduler, which idles; continue releases the parked requests in arrival order. Pausing
twice or continuing while running are harmless no-ops beyond the abort. The /health probe
is a generate request too, so, as in 0.5.4, /health answers 503 while paused (after
SGLANG_HEALTH_CHECK_TIMEOUT); weight updates and other control requests still run.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import torch
import zmq
import zmq.asyncio

from mini_sglang.managers.dashboard_stats import DashboardStats
from mini_sglang.managers.input_checks import (
    NOT_A_GENERATION_MODEL,
    NOT_AN_EMBEDDING_MODEL,
    check_generate_features,
)
from mini_sglang.managers.io_struct.control import AbortReq
from mini_sglang.managers.io_struct.generate import (
    EmbeddingReqInput,
    GenerateReqInput,
    TokenizedEmbeddingReqInput,
    TokenizedGenerateReqInput,
)
from mini_sglang.managers.io_struct.output import BatchEmbeddingOutput, BatchStrOutput
from mini_sglang.managers.parallel_sampling import prefix_caching_requests
from mini_sglang.managers.req_state import ReqState
from mini_sglang.managers.request_logging import RequestLogger
from mini_sglang.managers.server_runtime_state import ServerRuntimeState
from mini_sglang.managers.session_controller import normalize_session_params
from mini_sglang.managers.tokenizer_communicator import REPLY_TYPES, TokenizerCommunicator
from mini_sglang.model_config import ModelConfig
from mini_sglang.multimodal.processors import (
    get_mm_processor,
    get_processor,
    is_multimodal_architecture,
)
from mini_sglang.sampling.sampling_params import SamplingParams
from mini_sglang.utils.gc_utils import configure_gc_warning
from mini_sglang.utils.hf_tokenizer import get_tokenizer
from mini_sglang.utils.process import get_zmq_socket
from mini_sglang.utils.unicode_check import ensure_valid_unicode

logger = logging.getLogger("mini_sglang")


class RequestAborted(Exception):
    """The client went away; the request was aborted in the scheduler."""


class SchedulerRefused(Exception):
    """The scheduler refused or ended the request with a server-side status (SGLang's
    HTTPException for an abort whose status_code is 503 or 500, e.g. 503 "The request queue
    is full."): the HTTP layer answers `status_code` with `message`."""

    def __init__(self, status_code: int, message: str) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message


class TokenizerManager:
    def __init__(self, server_args, port_args) -> None:
        self.server_args = server_args
        # what the control API changes at run time (ServerArgs itself is frozen)
        self.runtime_state = ServerRuntimeState.from_server_args(server_args)
        self.model_config = ModelConfig.from_server_args(server_args)
        self.context_len = self.model_config.context_len
        self.is_generation = self.model_config.is_generation
        self.tokenizer = None
        if not server_args.skip_tokenizer_init:
            self.tokenizer = get_tokenizer(server_args.tokenizer_path, server_args)
        # Images -> MultimodalInputs (multimodal/processors); None for a text-only model.
        self.mm_processor = None
        if is_multimodal_architecture(self.model_config.architectures):
            processor = get_processor(
                server_args.tokenizer_path, server_args.trust_remote_code, self.tokenizer
            )
            self.mm_processor = get_mm_processor(
                self.model_config.model_class_config, server_args, processor
            )
        ctx = zmq.asyncio.Context(2)
        self.recv_from_detokenizer = get_zmq_socket(
            ctx, zmq.PULL, port_args.tokenizer_ipc_name, bind=True
        )
        self.send_to_scheduler = get_zmq_socket(
            ctx, zmq.PUSH, port_args.scheduler_input_ipc_name, bind=True
        )
        self.rid_to_state: dict[str, ReqState] = {}
        self.request_logger = RequestLogger(
            server_args.log_requests, server_args.log_requests_level
        )
        if server_args.gc_warning_threshold_secs > 0:
            configure_gc_warning(server_args.gc_warning_threshold_secs)
        self.metrics = None
        if server_args.enable_metrics:
            # Local: it imports prometheus_client, loaded only with --enable-metrics.
            from mini_sglang.managers.tokenizer_metrics import ServerMetrics

            self.metrics = ServerMetrics(server_args.served_model_name, server_args.dp_size)
        # /dashboard/data: recent latencies and token counts (O(1) per output message).
        self.dashboard = DashboardStats()
        self.handle_loop_task: asyncio.Task | None = None
        self.last_receive_tstamp = time.time()
        self.preferred_sampling_params = None
        if server_args.preferred_sampling_params:
            import json

            self.preferred_sampling_params = json.loads(server_args.preferred_sampling_params)
        self.communicator = TokenizerCommunicator(
            self._send_to_scheduler,
            fan_out=server_args.dp_size,
            runtime_state=self.runtime_state,
            abort_all=lambda: self.abort_request(abort_all=True),
        )
        self._dispatch = {
            BatchStrOutput: self._handle_batch_output,
            BatchEmbeddingOutput: self._handle_embedding_output,
        }
        self._dispatch.update({t: self.communicator.handle_reply for t in REPLY_TYPES})
        # /pause_generation: new generate requests wait on this (see the module docstring).
        self.is_pause = False
        self.is_pause_cond = asyncio.Condition()

    # ---- the receive loop ----------------------------------------------------------
    def auto_create_handle_loop(self) -> None:
        if self.handle_loop_task is None or self.handle_loop_task.done():
            self.handle_loop_task = asyncio.get_running_loop().create_task(self.handle_loop())

    async def handle_loop(self) -> None:
        while True:
            recv = await self.recv_from_detokenizer.recv_pyobj()
            self.last_receive_tstamp = time.time()
            handler = self._dispatch.get(type(recv))
            if handler is None:
                logger.error("TokenizerManager got an unknown message %s", type(recv).__name__)
                continue
            handler(recv)

    def _handle_batch_output(self, recv: BatchStrOutput) -> None:
        weight_version = self.runtime_state.weight_version
        for i, rid in enumerate(recv.rids):
            state = self.rid_to_state.get(rid)
            if state is None:
                continue
            meta_info = state.add_output(recv, i, weight_version, self.tokenizer)
            if state.finished:
                self.rid_to_state.pop(rid, None)
            if not state.obj.log_metrics:
                continue
            self.dashboard.on_output(state, meta_info, state.finished, time.time())
            if self.metrics is not None:
                self.metrics.on_output(state, meta_info, state.finished)

    def _handle_embedding_output(self, recv: BatchEmbeddingOutput) -> None:
        weight_version = self.runtime_state.weight_version
        for i, rid in enumerate(recv.rids):
            state = self.rid_to_state.pop(rid, None)
            if state is None:
                continue
            meta_info = state.add_embedding_output(recv, i, weight_version)
            if not state.obj.log_metrics:
                continue
            # No completion tokens; the prompt and cache counts still go to the dashboard.
            counts = {**meta_info, "completion_tokens": 0, "cached_tokens": recv.cached_tokens[i]}
            self.dashboard.on_output(state, counts, True, time.time())
            if self.metrics is not None:
                self.metrics.on_output(state, counts, True)

    async def _send_to_scheduler(self, req: Any) -> None:
        """Send one message to the scheduler, the receive loop running for its reply."""
        self.auto_create_handle_loop()
        await self.send_to_scheduler.send_pyobj(req)

    # ---- abort and pause -----------------------------------------------------------
    def abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        """Abort every request (`abort_all`), or the request `rid` that this manager holds,
        or the sub-requests of a batch / n > 1 request sent with rid `rid` (which run as
        rid_0, rid_1, ...). An empty or unknown rid is ignored, as in SGLang 0.5.4: a rid
        never selects another client's requests by prefix."""
        if abort_all:
            self._send_abort(AbortReq(abort_all=True))
            return
        if not rid:
            return
        if rid in self.rid_to_state:
            rids = [rid]
        else:
            rids = [r for r, state in self.rid_to_state.items() if state.parent_rid == rid]
        for r in rids:
            self._send_abort(AbortReq(rid=r))

    def _send_abort(self, req: AbortReq) -> None:
        if self.metrics is not None:
            self.metrics.on_abort()
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no running loop (interpreter shutdown): send synchronously
            self.send_to_scheduler.send_pyobj(req, flags=zmq.NOBLOCK)
            return
        # zmq.asyncio's send returns a Future that is already scheduled (not a coroutine,
        # so it must not go through create_task); nothing needs to await it.
        self.send_to_scheduler.send_pyobj(req)

    async def pause_generation(self) -> None:
        async with self.is_pause_cond:
            self.is_pause = True
            self.abort_request(abort_all=True)

    async def continue_generation(self) -> None:
        async with self.is_pause_cond:
            self.is_pause = False
            self.is_pause_cond.notify_all()

    async def _wait_while_paused(self) -> None:
        """Return at once unless paused; else when continue_generation is called."""
        if not self.is_pause:
            return
        async with self.is_pause_cond:
            await self.is_pause_cond.wait_for(lambda: not self.is_pause)

    # ---- generation ----------------------------------------------------------------
    async def _process_mm(self, obj: GenerateReqInput) -> dict | None:
        """One request's images through the model's processor (off the event loop): the
        processor's dict (expanded input ids, mm_items, ...), or None without images.
        ValueError (-> 400) for images sent to a text-only model and for bad images."""
        images = obj.image_data
        if images is None:
            return None
        images = images if isinstance(images, list) else [images]
        if all(x is None for x in images):
            return None
        if self.mm_processor is None:
            raise ValueError(
                f"The model {self.server_args.served_model_name} does not accept images "
                "(image_data was given)."
            )
        if obj.input_embeds is not None:
            raise ValueError("image_data cannot be combined with input_embeds.")
        if isinstance(obj.session_params, dict) and obj.session_params.get("id"):
            raise ValueError("image_data cannot be sent in a session.")
        if obj.text is None and obj.input_ids is None:
            raise ValueError("image_data needs a text or input_ids prompt.")
        if obj.input_ids is None:
            ensure_valid_unicode(obj.text, "text")
        prompt = obj.input_ids if obj.input_ids is not None else obj.text
        return await self.mm_processor.process_mm_data_async(
            image_data=images,
            input_text=prompt,
            request_obj=obj,
            max_req_input_len=self.context_len - 1,
        )

    def _fit_context(self, input_ids: list[int]) -> list[int]:
        """`input_ids` if shorter than the context length; else its first context_len - 1
        tokens under --allow-auto-truncate, or ValueError without it."""
        n_in = len(input_ids)
        if n_in < self.context_len:
            return input_ids
        if not self.server_args.allow_auto_truncate:
            raise ValueError(
                f"The input ({n_in} tokens) is longer than the model's context length "
                f"({self.context_len} tokens)."
            )
        return input_ids[: self.context_len - 1]

    def _tokenize_one(
        self, obj: GenerateReqInput, mm_inputs: dict | None = None
    ) -> TokenizedGenerateReqInput:
        check_generate_features(obj, self.server_args)
        if mm_inputs is not None:
            text, input_ids = obj.text or "", list(mm_inputs["input_ids"])
        else:
            text, input_ids = self._prompt_ids(obj)
        vocab = self.model_config.vocab_size
        if any((not isinstance(t, int)) or t < 0 or t >= vocab for t in input_ids):
            raise ValueError(f"input_ids must be integers in [0, {vocab - 1}].")
        raw = dict(self.preferred_sampling_params or {})
        raw.update(obj.sampling_params or {})
        seed_given = "sampling_seed" in (obj.sampling_params or {})
        sp = SamplingParams.from_dict(raw)
        sp.normalize(self.tokenizer)
        sp.verify(vocab)
        sp.seed_given = seed_given
        input_ids = self._fit_context(input_ids)
        n_in = len(input_ids)
        if sp.max_new_tokens is not None and sp.max_new_tokens + n_in >= self.context_len:
            if self.server_args.allow_auto_truncate:
                sp.max_new_tokens = max(0, self.context_len - n_in)
            else:
                total = sp.max_new_tokens + n_in
                raise ValueError(
                    "Requested token count exceeds the model's maximum context length of "
                    f"{self.context_len} tokens. You requested a total of {total} tokens: "
                    f"{n_in} tokens from the input messages and {sp.max_new_tokens} tokens for "
                    "the completion. Please reduce the number of tokens in the input messages "
                    "or the completion to fit within the limit."
                )
        if obj.return_logprob:
            self._check_logprob_args(obj, n_in)
        session = obj.session_params
        session = normalize_session_params(session) if session is not None else None
        return TokenizedGenerateReqInput(
            rid=obj.rid,
            input_text=text,
            input_ids=input_ids,
            sampling_params=sp,
            return_logprob=bool(obj.return_logprob),
            logprob_start_len=obj.logprob_start_len,
            top_logprobs_num=obj.top_logprobs_num or 0,
            token_ids_logprob=obj.token_ids_logprob,
            stream=obj.stream,
            data_parallel_rank=obj.data_parallel_rank,
            session_params=session,
            custom_logit_processor=obj.custom_logit_processor,
            input_embeds=self._embeds_tensor(obj, n_in),
            mm_inputs=mm_inputs,
        )

    def _prompt_ids(self, obj: GenerateReqInput) -> tuple[str, list[int]]:
        """(input text, prompt ids). An input_embeds prompt has no ids: SGLang stands in
        id 1 for each embedding (the radix cache is off, so nothing is keyed on them)."""
        if obj.input_embeds is not None:
            return "", [1] * len(obj.input_embeds)
        if obj.input_ids is not None:
            return obj.text or "", list(obj.input_ids)
        if self.tokenizer is None:
            raise ValueError("--skip-tokenizer-init is set: give input_ids instead of text.")
        ensure_valid_unicode(obj.text, "text")
        return obj.text, self.tokenizer.encode(obj.text)

    def _embeds_tensor(self, obj: GenerateReqInput, n_in: int) -> torch.Tensor | None:
        """One request's input_embeds (its first n_in vectors) as a float32 [n_in, hidden]
        tensor, or None without them; ValueError unless each is a vector of numbers of the
        model's hidden size (a misfit one would fail the forward)."""
        if obj.input_embeds is None:
            return None
        if isinstance(obj.session_params, dict) and obj.session_params.get("id"):
            raise ValueError("input_embeds cannot continue a session; give input_ids.")
        hidden = self.model_config.hidden_size
        message = f"input_embeds must be a list of vectors of {hidden} numbers (the hidden size)."
        try:
            embeds = torch.tensor(obj.input_embeds[:n_in], dtype=torch.float32)
        except (TypeError, ValueError):
            raise ValueError(message) from None
        if embeds.dim() != 2 or embeds.shape[1] != hidden:
            raise ValueError(message)
        return embeds

    def _check_logprob_args(self, obj: GenerateReqInput, n_in: int) -> None:
        """Range checks of the logprob options (types were checked at parsing). The
        scheduler indexes logprob rows with them, so an out-of-range value must not reach it
        (a token id past the vocab, top_logprobs_num above it would crash it)."""
        vocab = self.model_config.vocab_size
        start = obj.logprob_start_len
        # A session request's prompt is built in the scheduler (history plus these ids);
        # the scheduler checks the start against that prompt, as SGLang does.
        in_session = isinstance(obj.session_params, dict) and obj.session_params.get("id")
        if start is not None and start >= n_in and not in_session:
            raise ValueError(
                f"logprob_start_len ({start}) is greater than or equal to the "
                f"length of the input ({n_in})."
            )
        if start is not None and start < -1:
            raise ValueError(f"logprob_start_len must be -1 or at least 0, got {start}.")
        if obj.top_logprobs_num is not None and not 0 <= obj.top_logprobs_num <= vocab:
            raise ValueError(
                f"top_logprobs_num must be in [0, {vocab}], got {obj.top_logprobs_num}."
            )
        for t in obj.token_ids_logprob or []:  # one prompt's list: flat ints only
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
                raise ValueError(
                    f"token_ids_logprob must be a list of token ids in [0, {vocab - 1}], "
                    f"got {t!r} in it."
                )

    async def generate_request(
        self, obj: GenerateReqInput | EmbeddingReqInput, request: Any = None
    ) -> AsyncIterator:
        """Yields output dicts: one per stream event (single request), or for a batch one
        per event with "index" (stream) or one list of every result (non-stream). An
        EmbeddingReqInput yields once: its {"embedding", "meta_info"} dict, or a list of
        them for a batch. A request for the other kind of model raises ValueError."""
        self.auto_create_handle_loop()
        created = time.time()
        if isinstance(obj, EmbeddingReqInput):
            async for out in self._embedding_request(obj, request, created):
                yield out
            return
        if not self.is_generation:
            raise ValueError(NOT_A_GENERATION_MODEL)
        obj.normalize_batch_and_arguments()
        self.request_logger.receive(obj)
        await self._wait_while_paused()
        subs = [obj] if obj.is_single else [obj[i] for i in range(len(obj))]
        # Validate everything before sending anything: a bad sub-request fails the batch.
        mm_inputs = await asyncio.gather(*(self._process_mm(sub) for sub in subs))
        tokenized = [self._tokenize_one(sub, mm) for sub, mm in zip(subs, mm_inputs)]
        if obj.parallel_sample_num > 1:  # n > 1: cache each prompt first (SGLang)
            await self._prefill_shared_prompts(subs, tokenized, obj.parallel_sample_num, request)
        states = self._register(subs, obj.parent_rids, created)
        for tok in tokenized:
            await self.send_to_scheduler.send_pyobj(tok)
        if obj.is_single:
            async for out in self._wait_one_response(states[0], request):
                yield out
            return
        if not obj.stream:
            results = await asyncio.gather(
                *(self._collect(self._wait_one_response(s, request)) for s in states)
            )
            yield [r[-1] for r in results]
            return
        async for out in self._merge_streams(states, request):
            yield out

    async def _embedding_request(
        self, obj: EmbeddingReqInput, request: Any, created: float
    ) -> AsyncIterator:
        obj.normalize_batch_and_arguments()
        self.request_logger.receive(obj)
        subs = [obj] if obj.is_single else [obj[i] for i in range(len(obj))]
        # Validate everything before sending anything: a bad input fails the batch.
        tokenized = [self._tokenize_embedding(sub) for sub in subs]
        if self.is_generation:
            raise ValueError(NOT_AN_EMBEDDING_MODEL)
        await self._wait_while_paused()
        states = self._register(subs, [None] * len(subs), created)  # type: ignore[arg-type]
        for tok in tokenized:
            await self.send_to_scheduler.send_pyobj(tok)
        results = await asyncio.gather(
            *(self._collect(self._wait_one_response(s, request)) for s in states)
        )
        yield results[0][-1] if obj.is_single else [r[-1] for r in results]

    def _tokenize_embedding(self, obj: EmbeddingReqInput) -> TokenizedEmbeddingReqInput:
        """One input's ids (tokenized text, or the ids given), checked as a generate
        prompt's: in the vocab, not empty, shorter than the context (else truncated with
        --allow-auto-truncate, as SGLang). A cross-encoder input (a [query, document] pair)
        is tokenized as a text pair and keeps the tokenizer's token types."""
        token_type_ids = None
        if obj.input_ids is not None:
            text, input_ids = "", list(obj.input_ids)
        elif self.tokenizer is None:
            raise ValueError("--skip-tokenizer-init is set: give input_ids instead of text.")
        elif obj.is_cross_encoder_request:
            query, document = obj.text  # type: ignore[misc]
            ensure_valid_unicode(query, "query")
            ensure_valid_unicode(document, "document")
            # SGLang's is_cross_encoder path: the pair in one call, token types kept.
            enc = self.tokenizer(query, document, return_token_type_ids=True)
            text, input_ids = f"{query}\n{document}", list(enc["input_ids"])
            token_type_ids = enc.get("token_type_ids")
        else:
            ensure_valid_unicode(obj.text, "text")
            text, input_ids = obj.text, self.tokenizer.encode(obj.text)
        if not input_ids:
            raise ValueError("The input is empty.")
        vocab = self.model_config.vocab_size
        if any(t >= vocab for t in input_ids):
            raise ValueError(f"input_ids must be integers in [0, {vocab - 1}].")
        n_in = len(input_ids)
        input_ids = self._fit_context(input_ids)
        if token_type_ids is not None and len(input_ids) < n_in:
            token_type_ids = token_type_ids[: self.context_len - 1]
        sp = SamplingParams(max_new_tokens=0)
        sp.normalize(None)
        return TokenizedEmbeddingReqInput(
            rid=obj.rid,  # type: ignore[arg-type]
            input_text=text,  # type: ignore[arg-type]
            input_ids=input_ids,
            sampling_params=sp,
            token_type_ids=list(token_type_ids) if token_type_ids is not None else None,
            data_parallel_rank=obj.data_parallel_rank,
            priority=obj.priority,
        )

    def _register(
        self,
        subs: list[GenerateReqInput] | list[EmbeddingReqInput],
        parents: list[str | None],
        created: float,
    ) -> list[ReqState]:
        """Add the sub-requests' states, all or none: a rid already in flight, or twice in
        the batch, refuses the whole request (400) and leaves nothing behind."""
        seen: set[str] = set()
        for sub in subs:
            if sub.rid in self.rid_to_state or sub.rid in seen:
                raise ValueError(f"Duplicate request ID: {sub.rid}")
            seen.add(sub.rid)
        states = [ReqState(sub, created, parent_rid=p) for sub, p in zip(subs, parents)]
        for state in states:
            self.rid_to_state[state.obj.rid] = state
        return states

    async def _prefill_shared_prompts(
        self,
        subs: list[GenerateReqInput],
        tokenized: list[TokenizedGenerateReqInput],
        n: int,
        request: Any,
    ) -> None:
        """Run one prefill-only request per prompt of an n > 1 batch (parallel_sampling.py)
        and wait for all; raises what the scheduler reports for a bad request (ValueError
        -> 400) before any real copy is sent."""
        waits = []
        for sub, tok in prefix_caching_requests(subs, tokenized, n):
            state = ReqState(sub, time.time())
            self.rid_to_state[sub.rid] = state
            await self.send_to_scheduler.send_pyobj(tok)
            waits.append(self._collect(self._wait_one_response(state, request)))
        await asyncio.gather(*waits)

    @staticmethod
    async def _collect(gen: AsyncIterator) -> list:
        return [x async for x in gen]

    async def _merge_streams(self, states: list[ReqState], request: Any) -> AsyncIterator:
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(index: int, state: ReqState) -> None:
            try:
                async for out in self._wait_one_response(state, request):
                    await queue.put((index, out, None))
            except Exception as e:  # forwarded to the consumer
                await queue.put((index, None, e))
            await queue.put((index, None, StopAsyncIteration()))

        tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(states)]
        remaining = len(states)
        try:
            while remaining:
                index, out, err = await queue.get()
                if isinstance(err, StopAsyncIteration):
                    remaining -= 1
                    continue
                if err is not None:
                    raise err
                out = dict(out)
                out["index"] = index
                yield out
        finally:
            for t in tasks:
                t.cancel()

    async def _wait_one_response(self, state: ReqState, request: Any) -> AsyncIterator[dict]:
        """Yield this request's outputs; if the consumer goes away first (client
        disconnect, cancelled stream, error), abort it in the scheduler so its KV is freed."""
        obj = state.obj
        try:
            while True:
                try:
                    await asyncio.wait_for(state.event.wait(), timeout=4)
                except asyncio.TimeoutError:
                    if request is not None and await request.is_disconnected():
                        raise RequestAborted(
                            f"Request {obj.rid} is disconnected from the client side."
                        ) from None
                    continue
                out = state.take_output(with_text=not self.server_args.skip_tokenizer_init)
                if state.finished:
                    self.request_logger.finish(obj, out)
                    reason = out["meta_info"]["finish_reason"] or {}
                    if reason.get("type") == "abort" and reason.get("status_code") == 400:
                        raise ValueError(reason["message"])
                    if reason.get("type") == "abort" and reason.get("status_code") in (500, 503):
                        raise SchedulerRefused(reason["status_code"], reason["message"])
                    yield out
                    return
                if obj.stream:
                    yield out
                elif request is not None and await request.is_disconnected():
                    raise RequestAborted(f"Request {obj.rid} is disconnected from the client side.")
        finally:
            if not state.finished:
                self.abort_disconnected(obj.rid)

    def abort_disconnected(self, rid: str) -> None:
        self.rid_to_state.pop(rid, None)
        self._send_abort(AbortReq(rid=rid))
