"""Scheduler: one per TP rank. Receives tokenized requests, forms batches (prefill first,
then decode), runs them on the TpModelWorker and streams token ids to the detokenizer.

It runs either in its own process (`run_scheduler_process`, ZMQ in and out) or in-process
for tests and tools (`add_request` + `run_until_idle`, outputs to a callback).

The loop (`event_loop`, `run_step`), without overlap:

    receive -> process_input_requests -> get_next_batch_to_run -> run_batch
            -> process_batch_result

and with overlap (`step_overlap`) step N's result is processed after step N+1 is launched.

The Scheduler owns the loop and the queues (`waiting_queue`, `chunked_req`,
`running_batch`, `last_batch`): which requests they hold changes only in this module (the
policy only reorders the waiting queue). Every other concern is a component built in
`__init__` that owns its own state and hands back what should join or leave a queue:
  policy      SchedulePolicy: the order of the waiting queue (schedule_policy.py)
  prefill     PrefillManager: prefill budgets, batch building, mixed chunks
  retraction  Retraction: new_token_ratio, retracting when decode runs out of KV
  output      OutputProcessor: results into requests, streaming to the detokenizer
  grammar     GrammarQueue: requests compiling their grammar, vocab masks
  sessions    SessionController: /open_session, continuations
  profiler    SchedulerProfiler: /start_profile, /slow_down, the forward counter
  stats       SchedulerStats: counters, log lines, memory self-check, internal state
  weights     WeightUpdater: online weight updates
Incoming messages are dispatched by type through a small handler table.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import zmq

from mini_sglang.layers.pooler import supports_prefix_reuse
from mini_sglang.managers.finish_reason import FINISH_ABORT
from mini_sglang.managers.io_struct.control import (
    AbortReq,
    ExpertDistributionReq,
    ExpertDistributionReqOutput,
    ExpertDistributionReqType,
    FlushCacheReqInput,
    FlushCacheReqOutput,
    FreezeGCReq,
    GetInternalStateReq,
    GetInternalStateReqOutput,
    GetLoadReqInput,
    GetLoadReqOutput,
)
from mini_sglang.managers.io_struct.generate import (
    BatchTokenizedGenerateReqInput,
    TokenizedEmbeddingReqInput,
    TokenizedGenerateReqInput,
)
from mini_sglang.managers.req import Req
from mini_sglang.managers.schedule_batch import ScheduleBatch
from mini_sglang.managers.schedule_policy import PrefillAdder, SchedulePolicy
from mini_sglang.managers.scheduler_grammar import GrammarQueue
from mini_sglang.managers.scheduler_metrics import SchedulerStats
from mini_sglang.managers.scheduler_output_processor import OutputProcessor
from mini_sglang.managers.scheduler_prefill import PrefillManager
from mini_sglang.managers.scheduler_profiler import SchedulerProfiler
from mini_sglang.managers.scheduler_retraction import Retraction
from mini_sglang.managers.scheduler_update_weights import WeightUpdater
from mini_sglang.managers.session_controller import SessionController
from mini_sglang.managers.tp_worker import TpModelWorker
from mini_sglang.mem_cache.chunk_cache import ChunkCache
from mini_sglang.mem_cache.radix_cache import RadixCache
from mini_sglang.multimodal.mm_inputs import MultimodalInputs
from mini_sglang.sampling.custom_logit_processor import CustomLogitProcessor
from mini_sglang.sampling.sampling_batch_info import NO_SEED
from mini_sglang.sampling.sampling_params import SamplingParams
from mini_sglang.utils.gc_utils import freeze_gc
from mini_sglang.utils.hf_tokenizer import get_tokenizer
from mini_sglang.utils.process import get_zmq_socket

logger = logging.getLogger("mini_sglang")

# How long the process loop waits for a message when it has nothing to do.
IDLE_WAIT_MS = 50


class Scheduler:
    def __init__(
        self,
        server_args,
        gpu_id: int = 0,
        tp_rank: int = 0,
        dp_rank: int | None = None,
        send_to_detokenizer: Callable[[Any], None] | None = None,
        send_to_tokenizer: Callable[[Any], None] | None = None,
    ) -> None:
        """`dp_rank` is the replica's index with --dp-size > 1 (else None); outputs go to
        `send_to_detokenizer`, replies to control requests to `send_to_tokenizer`."""
        self.server_args = server_args
        self.tp_rank = tp_rank
        self.dp_rank = dp_rank
        self.tp_worker = TpModelWorker(server_args, gpu_id=gpu_id)
        self.model_config = self.tp_worker.model_config
        # An embedding / score model runs prefill-only batches through forward_batch_embedding
        # (layers/pooler.py); one that cannot reuse prefixes (non-causal) shares no KV and
        # prefills every input whole.
        self.is_generation = self.model_config.is_generation
        reuse = supports_prefix_reuse(self.tp_worker.model_runner.model, self.is_generation)
        self.device = self.tp_worker.device
        self.tokenizer = None
        if not server_args.skip_tokenizer_init:
            self.tokenizer = get_tokenizer(server_args.tokenizer_path, server_args)
        self.req_to_token_pool, self.allocator = self.tp_worker.get_memory_pool()
        self.page_size = server_args.page_size or 1
        if server_args.disable_radix_cache or not reuse:
            self.tree_cache = ChunkCache(self.req_to_token_pool, self.allocator, self.page_size)
        else:
            self.tree_cache = RadixCache(
                self.req_to_token_pool,
                self.allocator,
                self.page_size,
                eviction_policy=server_args.radix_eviction_policy,
            )
        self.max_total_num_tokens = self.tp_worker.max_total_num_tokens
        self.max_running_requests = min(
            server_args.max_running_requests or self.req_to_token_pool.size,
            self.req_to_token_pool.size,
            self.max_total_num_tokens // 2,
        )
        context_len = self.model_config.context_len
        self.max_req_len = min(context_len - 1, self.max_total_num_tokens - 1)
        self.max_req_input_len = self.max_req_len - 5
        chunk = server_args.chunked_prefill_size
        chunked_prefill_size = chunk if chunk is not None and chunk > 0 and reuse else None

        # The queues (see the module docstring) and the loop's state.
        self.waiting_queue: list[Req] = []
        self.chunked_req: Req | None = None  # the prompt being prefilled chunk by chunk
        self.running_batch: ScheduleBatch | None = None
        self.last_batch: ScheduleBatch | None = None
        self.cur_batch: ScheduleBatch | None = None  # the step's batch (watchdog, tests)
        self._pending = None  # (BatchSnapshot, result) launched but not yet processed
        self.is_idle_checked = True
        self._send_to_tokenizer = send_to_tokenizer or (lambda out: None)
        self._send_to_detokenizer = send_to_detokenizer or (lambda out: None)
        self._load_report_sock = None  # the DP controller's, opened on its first request

        # The components.
        self.stats = SchedulerStats(
            server_args.decode_log_interval,
            self.tp_worker.model_runner,
            self.req_to_token_pool,
            self.allocator,
            self.tree_cache,
            self.max_total_num_tokens,
            self.max_req_input_len,
            self.device,
        )
        self.policy = SchedulePolicy(server_args.schedule_policy, self.tree_cache)
        self.prefill = PrefillManager(
            server_args,
            self.req_to_token_pool,
            self.allocator,
            self.tree_cache,
            self.page_size,
            chunked_prefill_size,
            self.model_config.vocab_size,
            self.device,
        )
        self.retraction = Retraction(
            server_args.schedule_conservativeness,
            self.req_to_token_pool,
            self.allocator,
            self.tree_cache,
            self.page_size,
        )
        self.output = OutputProcessor(
            self.allocator,
            self.tree_cache,
            self.page_size,
            self.tokenizer,
            server_args.stream_interval,
            self._send_to_detokenizer,
        )
        self.grammar = GrammarQueue(server_args, self.tokenizer, self.model_config, self.device)
        self.sessions = SessionController(self.model_config)
        self.profiler = SchedulerProfiler(
            tp_rank, server_args.tp_size, server_args.dp_size, dp_rank
        )
        self.weights = WeightUpdater(
            self.tp_worker.model_runner,
            dp_rank,
            self.has_work,
            self.run_until_idle,
            self.flush_cache,
        )
        self._dispatch: dict[type, Callable[[Any], Any]] = {
            TokenizedGenerateReqInput: self.handle_generate_request,
            TokenizedEmbeddingReqInput: self.handle_embedding_request,
            BatchTokenizedGenerateReqInput: self.handle_batch_generate_request,
            AbortReq: self.abort_request,
            FlushCacheReqInput: self.flush_cache_wrapped,
            GetInternalStateReq: self.get_internal_state,
            GetLoadReqInput: self.get_load,
            FreezeGCReq: self.freeze_gc,
            ExpertDistributionReq: self.expert_distribution,
            **self.weights.dispatch(),
            **self.profiler.dispatch(),
            **self.sessions.dispatch(),
        }
        logger.info(
            "max_total_num_tokens=%d, chunked_prefill_size=%s, max_prefill_tokens=%d, "
            "max_running_requests=%d, context_len=%d, available_gpu_mem=%s",
            self.max_total_num_tokens,
            chunk,
            server_args.max_prefill_tokens,
            self.max_running_requests,
            context_len,
            self.stats.available_mem_str(),
        )

    # ---- the loop ------------------------------------------------------------------
    def event_loop(self, recv_requests: Callable[[int], list[Any]]) -> None:
        """The process loop: receive, process input, then one step (schedule, run, process
        the result, stream). `recv_requests(block_ms)` returns what arrived, waiting up to
        block_ms for a first message; it waits only when there is nothing to do."""
        block_ms = 0
        while True:
            self.process_input_requests(recv_requests(block_ms))
            if self.run_step():
                self.is_idle_checked = False
                block_ms = 0
            else:
                block_ms = 0 if self.has_work() else IDLE_WAIT_MS

    def run_step(self) -> bool:
        """One step, overlapped unless disabled; False when there was nothing to run."""
        ran = self.step_overlap() if self.overlap else self.step()
        self.stats.on_step(self.cur_batch, self.waiting_queue)  # "Decode batch." lines
        return ran

    def step(self) -> bool:
        """One step without overlap; False when there was nothing to run."""
        batch = self.get_next_batch_to_run()
        self.cur_batch = batch
        if batch is None:
            self.last_batch = None
            self.on_idle()
            return False
        result = self.run_batch(batch)
        self.process_batch_result(batch.snapshot(), result)
        self.last_batch = batch
        return True

    def step_overlap(self) -> bool:
        """One overlapped step: launch step N+1, then process step N's results while
        the device runs it. Retraction needs settled outputs, so it first drains step N."""
        if self._pending is not None and self._needs_settled_outputs():
            self.process_batch_result(*self._pending)
            self._pending = None
        batch = self.get_next_batch_to_run()
        self.cur_batch = batch
        launched = (batch.snapshot(), self.run_batch(batch)) if batch is not None else None
        if self._pending is not None:
            self.process_batch_result(*self._pending)
        self._pending = launched
        self.last_batch = batch
        if batch is None:
            self.on_idle()
            return False
        return True

    @property
    def overlap(self) -> bool:
        # An embedding batch's result is the whole of its requests' output: nothing to
        # overlap with the next step (SGLang disables it for embedding models too).
        return not self.server_args.disable_overlap_schedule and self.is_generation

    # ---- in-process driving (tests, tools) -----------------------------------------
    def add_request(self, recv: TokenizedGenerateReqInput) -> None:
        self.process_input_requests([recv])

    def run_until_idle(self, max_steps: int = 1_000_000) -> None:
        for _ in range(max_steps):
            if not self.run_step() and not self.has_work():
                return
        raise RuntimeError("run_until_idle: too many steps")

    # ---- input ---------------------------------------------------------------------
    def process_input_requests(self, recv_reqs: list[Any]) -> None:
        for recv in recv_reqs:
            handler = self._dispatch.get(type(recv))
            if handler is None:
                logger.error("Scheduler got an unknown message type %s", type(recv).__name__)
                continue
            reply = handler(recv)
            if reply is not None:
                self._send_to_tokenizer(reply)

    def handle_batch_generate_request(self, recv: BatchTokenizedGenerateReqInput) -> None:
        for r in recv.batch:
            self.handle_generate_request(r)

    def handle_generate_request(self, recv: TokenizedGenerateReqInput) -> None:
        """Admit one new request (`_admit`). An error raised while admitting it (its
        session lookup, its Req, its grammar lookup, a bug) is a fault of this request, not
        of the engine: the request ends with an abort reason and status 500, and the loop
        goes on."""
        try:
            self._admit(recv)
        except Exception as e:  # noqa: BLE001 - contained to this one request
            logger.exception("Admitting request %s failed; it ends with an error", recv.rid)
            self._fail_admission(recv, e)

    def handle_embedding_request(self, recv: TokenizedEmbeddingReqInput) -> None:
        """Admit one embedding request: a prefill-only Req whose output is its pooled row.
        A bad input ends it at once with a 400 (as a generate request's), a full queue with
        a 503; a failure while admitting it is contained as in handle_generate_request."""
        try:
            req = Req(
                recv.rid,
                recv.input_text,
                recv.input_ids,
                recv.sampling_params,
                vocab_size=self.model_config.vocab_size,
            )
            req.is_embedding = True
            req.token_type_ids = recv.token_type_ids
            error = self.input_error(req)
            if error is None and self.is_generation:
                error = "This model is not an embedding model."
            if error is not None:
                req.finished_reason = FINISH_ABORT(
                    error, status_code=400, err_type="BadRequestError"
                )
                self.output.stream([req])
            elif self.queue_full():
                req.finished_reason = FINISH_ABORT("The request queue is full.", status_code=503)
                self.output.stream([req])
            else:
                self.waiting_queue.append(req)
        except Exception as e:  # noqa: BLE001 - contained to this one request
            logger.exception("Admitting request %s failed; it ends with an error", recv.rid)
            self._fail_admission(recv, e)

    def _fail_admission(
        self, recv: TokenizedGenerateReqInput | TokenizedEmbeddingReqInput, error: Exception
    ) -> None:
        # Wherever admission got to, the request leaves the queues and ends once, here.
        self.waiting_queue = [r for r in self.waiting_queue if r.rid != recv.rid]
        self.grammar.abort(lambda rid: rid == recv.rid, "")
        sp = SamplingParams()
        sp.normalize(None)
        req = Req(recv.rid, "", [0], sp, vocab_size=self.model_config.vocab_size)
        req.is_embedding = isinstance(recv, TokenizedEmbeddingReqInput)
        req.finished_reason = FINISH_ABORT(
            f"Internal server error: {error}", status_code=500, err_type="InternalServerError"
        )
        self.output.stream([req])

    def _admit(self, recv: TokenizedGenerateReqInput) -> None:
        """Its prompt (from its session if it names one), its Req, the checks (a failure is
        a 400 streamed at once), its defaults, and its place in the waiting queue or the
        grammar queue."""
        input_ids, session_link, error = self.sessions.lookup(recv)
        req = self._new_req(recv, input_ids)
        error = error or self.input_error(req)
        if error is not None:
            req.finished_reason = FINISH_ABORT(error, status_code=400, err_type="BadRequestError")
            self.output.stream([req])
            return
        if self.queue_full():
            # SGLang's retryable refusal: 503, which the HTTP layer answers as such.
            req.finished_reason = FINISH_ABORT("The request queue is full.", status_code=503)
            self.output.stream([req])
            return
        sp = req.sampling_params
        if req.logprob_start_len == -1 or not req.return_logprob:
            # By default only the output's logprobs; a prefill-only request (max_new_tokens
            # 0, e.g. a /v1/score item) has none, so its prompt reports none either (SGLang).
            prefill_only = sp.max_new_tokens == 0
            req.logprob_start_len = len(req.origin_input_ids) - (0 if prefill_only else 1)
        # None (or too many) new tokens: whatever room the context leaves (SGLang).
        room = self.max_req_len - len(req.origin_input_ids) - 1
        sp.max_new_tokens = room if sp.max_new_tokens is None else min(sp.max_new_tokens, room)
        self.queue_request(req)
        self.sessions.record(req, session_link)

    def _new_req(self, recv: TokenizedGenerateReqInput, input_ids: list[int]) -> Req:
        sp = recv.sampling_params
        seed = NO_SEED
        if getattr(sp, "seed_given", False) or self.server_args.enable_deterministic_inference:
            seed = int(sp.sampling_seed)
        mm_inputs, unpadded = None, None
        if recv.mm_inputs is not None:
            # The model's placeholder padding (multimodal/mm_utils.py): the padded ids key
            # the radix cache on each image's content.
            mm_inputs = MultimodalInputs.from_dict(recv.mm_inputs)
            unpadded = input_ids
            input_ids = self.tp_worker.model_runner.model.pad_input_ids(input_ids, mm_inputs)
        return Req(
            recv.rid,
            recv.input_text,
            input_ids,
            sp,
            eos_token_ids=self.model_config.eos_token_ids,
            vocab_size=self.model_config.vocab_size,
            return_logprob=recv.return_logprob,
            logprob_start_len=recv.logprob_start_len,
            top_logprobs_num=recv.top_logprobs_num,
            token_ids_logprob=recv.token_ids_logprob,
            stream=recv.stream,
            sampling_seed=seed,
            custom_logit_processor=recv.custom_logit_processor
            if self.server_args.enable_custom_logit_processor
            else None,
            input_embeds=recv.input_embeds,
            multimodal_inputs=mm_inputs,
            origin_input_ids_unpadded=unpadded,
        )

    def input_error(self, req: Req) -> str | None:
        """Why a new request cannot be queued (a 400), or None."""
        n = len(req.origin_input_ids)
        if n == 0:
            return "The input is empty."
        # A prefill-only embedding request needs no room for output tokens.
        limit = self.max_req_len if req.is_embedding else self.max_req_input_len
        if n > limit:
            return (
                f"The input ({n} tokens) is longer than the model's "
                f"context length ({limit} tokens)."
            )
        start = req.logprob_start_len
        prefill_only = req.sampling_params.max_new_tokens == 0
        if req.return_logprob and start != -1 and not prefill_only and start >= n:
            # SGLang's text, checked against the whole prompt (a session's history too)
            return (
                f"req.logprob_start_len={start} is higher than the number of input tokens "
                f"len(req.origin_input_ids)={n}. Please use a smaller logprob_start_len."
            )
        if req.custom_logit_processor:
            try:
                CustomLogitProcessor.from_str(req.custom_logit_processor)
            except Exception as e:  # client-sent: any failure to load is the client's
                return f"Invalid custom_logit_processor: {type(e).__name__}: {e}"
        return None

    def queue_full(self) -> bool:
        """True when --max-queued-requests requests already wait (SGLang refuses the new one)."""
        queue_cap = self.server_args.max_queued_requests
        return queue_cap is not None and len(self.waiting_queue) >= queue_cap

    def queue_request(self, req: Req) -> None:
        """Queue a validated request: a constrained one may wait for its grammar first."""
        if self.grammar.add(req):
            self.waiting_queue.append(req)
        elif req.finished():
            self.output.stream([req])

    def abort_request(self, recv: AbortReq) -> None:
        """Abort every request (abort_all) or the one whose rid is exactly recv.rid. Unlike
        SGLang's prefix match, a rid never reaches other requests: the TokenizerManager
        names each sub-request of a batch / n > 1 request itself."""

        def match(rid: str) -> bool:
            return recv.abort_all or (bool(recv.rid) and rid == recv.rid)

        message = recv.abort_reason or "Abort before prefill"
        keep = []
        for req in self.waiting_queue:
            if match(req.rid):
                req.finished_reason = FINISH_ABORT(message)
                self.output.stream([req])
                logger.debug(f"Abort queued request. {req.rid=}")  # SGLang's text
            else:
                keep.append(req)
        self.waiting_queue = keep
        for req in self.grammar.abort(match, message):
            logger.debug(f"Abort grammar queue request. {req.rid=}")
            self.output.stream([req])
        # Running requests stop after the current step, through check_finished. The last
        # batch's requests join running_batch only when the next one is formed (and after a
        # mixed step every running request is there).
        running = self.running_batch.reqs if self.running_batch else []
        last = self.last_batch.reqs if self.last_batch else []
        chunked = [self.chunked_req] if self.chunked_req else []
        for req in dict.fromkeys(running + last + chunked):  # a request once, in order
            if match(req.rid) and not req.finished():
                logger.debug(f"Abort running request. {req.rid=}")
                req.abort(recv.abort_reason or "Abort in the middle of a request")

    def flush_cache(self) -> bool:
        # has_work() also covers a prefill whose requests are not yet in running_batch
        # (last_batch) and a batch still in flight under overlap (_pending): both hold KV.
        if self.has_work():
            logger.warning("Cache not flushed because there are pending requests.")
            return False
        self.tree_cache.reset()
        self.grammar.reset()
        self.req_to_token_pool.clear()
        self.allocator.clear()
        self.running_batch = None
        self.last_batch = None
        self.retraction.reset()
        logger.info("Cache flushed successfully!")
        return True

    def flush_cache_wrapped(self, recv: FlushCacheReqInput) -> FlushCacheReqOutput:
        return FlushCacheReqOutput(success=self.flush_cache())

    def get_internal_state(self, recv: GetInternalStateReq) -> GetInternalStateReqOutput:
        return GetInternalStateReqOutput(self.internal_state(), dp_rank=self.dp_rank or 0)

    def internal_state(self) -> dict[str, Any]:
        state = self.stats.internal_state(self.num_running_reqs(), len(self.waiting_queue))
        return {**state, "num_grammar_queue_reqs": len(self.grammar.queue)}

    def get_load(self, recv: GetLoadReqInput) -> GetLoadReqOutput | None:
        """This replica's load. A request carrying `http_worker_ipc` (the DP controller's
        load-report socket) is answered there instead of to the TokenizerManager."""
        out = GetLoadReqOutput(
            dp_rank=self.dp_rank or 0,
            num_reqs=self.num_running_reqs() + len(self.waiting_queue),
            num_waiting_reqs=len(self.waiting_queue),
            num_tokens=self.stats.num_used_tokens(),
        )
        if recv.http_worker_ipc is None:
            return out
        if self.tp_rank == 0:
            if self._load_report_sock is None:
                self._load_report_sock = get_zmq_socket(
                    zmq.Context.instance(), zmq.PUSH, recv.http_worker_ipc, bind=False
                )
            self._load_report_sock.send_pyobj(out)
        return None

    def freeze_gc(self, recv: FreezeGCReq) -> None:
        freeze_gc("Scheduler")
        self._send_to_detokenizer(recv)  # the detokenizer freezes its own on arrival

    def expert_distribution(self, recv: ExpertDistributionReq) -> ExpertDistributionReqOutput:
        """/start|stop|dump_expert_distribution_record on this rank's recorder
        (layers/moe/expert_distribution.py); TP rank 0 writes the dump (every rank its own
        in the per_pass and per_token modes)."""
        recorder = self.tp_worker.model_runner.expert_recorder
        if recorder is None:
            reason = (
                "the model has no MoE layers"
                if self.server_args.expert_distribution_recorder_mode
                else "start the server with --expert-distribution-recorder-mode stat"
            )
            return ExpertDistributionReqOutput(False, f"No expert distribution recorder: {reason}.")
        if recv.action == ExpertDistributionReqType.START_RECORD:
            recorder.start()
        elif recv.action == ExpertDistributionReqType.STOP_RECORD:
            recorder.stop()
        else:
            path = recorder.dump(write=self.tp_rank == 0 or recorder.detail)
            return ExpertDistributionReqOutput(True, path or "")
        return ExpertDistributionReqOutput(True, "")

    # ---- batch selection -----------------------------------------------------------
    def get_next_batch_to_run(self) -> ScheduleBatch | None:
        """The last prefill batch's unfinished requests join the running batch; then a new
        prefill batch if one can be formed, else the running batch's next decode step."""
        if self.grammar.queue:
            self.move_ready_grammar_requests()
        last = self.last_batch
        if last is not None and last.forward_mode.is_extend():
            if self.chunked_req is not None:
                # The chunk's KV goes into the cache; its request slot is re-taken next round.
                self.tree_cache.cache_unfinished_req(self.chunked_req)
                self.req_to_token_pool.free(self.chunked_req.req_pool_idx)
                self.chunked_req.req_pool_idx = None
            last.filter_batch(
                [
                    i
                    for i, r in enumerate(last.reqs)
                    if not r.finished() and r is not self.chunked_req
                ]
            )
            if not last.is_empty():
                if self.running_batch is None or self.running_batch.is_empty():
                    self.running_batch = last
                else:
                    self.running_batch.merge_batch(last)
        if self.running_batch is not None:
            self.running_batch.filter_batch()
        new_batch = self.get_new_batch_prefill()
        if new_batch is not None:
            return new_batch
        running = self.running_batch
        if running is not None and not running.is_empty():
            self.update_running_batch(running)  # may retract requests (in place)
            if not running.is_empty():
                return running
        return None

    def move_ready_grammar_requests(self) -> None:
        """Requests whose grammar compiled join the waiting queue, in arrival order."""
        rb = self.running_batch
        busy = (rb is not None and not rb.is_empty()) or self.last_batch is not None
        for req in self.grammar.ready(idle=not self.waiting_queue and not busy):
            if req.finished():
                self.output.stream([req])
            else:
                self.waiting_queue.append(req)

    def get_new_batch_prefill(self) -> ScheduleBatch | None:
        """The chunked request's next chunk, then waiting requests in policy order, as far
        as the budgets (PrefillAdder) and max_running_requests allow."""
        if not self.waiting_queue and self.chunked_req is None:
            return None
        running_bs = len(self.running_batch.reqs) if self.running_batch else 0
        if running_bs >= self.max_running_requests:
            return None
        self.policy.calc_priority(self.waiting_queue)
        mixed_tokens = self.prefill.mixed_decode_tokens(running_bs)
        adder = self.prefill.new_adder(
            self.running_batch, self.retraction.new_token_ratio, mixed_tokens
        )
        if self.chunked_req is not None:
            self.chunked_req.init_next_round_input(None)
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
        if adder.add_waiting_reqs(self.waiting_queue, self.max_running_requests - running_bs):
            self.stats.log_no_token_once()
        if not adder.can_run_list:
            return None
        return self.prepare_prefill(adder, running_bs, mixed_tokens)

    def prepare_prefill(
        self, adder: PrefillAdder, running_bs: int, mixed_tokens: int
    ) -> ScheduleBatch:
        """Move the admitted requests out of the waiting queue and build their batch
        (mixed with the running batch when `mixed_tokens`)."""
        admitted = set(map(id, adder.can_run_list))
        self.waiting_queue = [r for r in self.waiting_queue if id(r) not in admitted]
        if adder.new_chunked_req is not None:
            assert self.chunked_req is None, "one chunked request at a time"
            self.chunked_req = adder.new_chunked_req
        if self.chunked_req is not None:
            self.chunked_req.is_chunked += 1
        batch = self.prefill.build(adder.can_run_list)
        self.stats.log_prefill(adder, running_bs, len(self.waiting_queue))
        if mixed_tokens and self.prefill.mix(batch, self.running_batch):
            self.stats.num_mixed_batches += 1
            self.stats.num_mixed_decode_rows += len(self.running_batch.reqs)
            self.running_batch = None  # its requests run on in the mixed batch
        return batch

    def update_running_batch(self, batch: ScheduleBatch) -> None:
        """Make room for one more token per request (retracting if needed), then prepare."""
        if not batch.check_decode_mem():
            retracted, keep = self.retraction.retract(batch)
            batch.filter_batch(keep)
            self.stats.num_retracted_reqs += len(retracted)
            self.waiting_queue = retracted + self.waiting_queue
            if batch.is_empty():
                return
        batch.prepare_for_decode()

    # ---- running -------------------------------------------------------------------
    def run_batch(self, batch: ScheduleBatch):
        """Launch the forward; the decode input of the next step is this step's device
        output, so the next step can be prepared before these tokens reach the host."""
        self.profiler.on_step(batch)  # the profiler starts/stops between steps
        if not self.is_generation:
            # Every batch of an embedding model is a prefill: its rows' pooled vectors.
            return self.tp_worker.forward_batch_embedding(batch.get_model_worker_batch())
        batch.sampling_info.vocab_mask = self.grammar.vocab_mask(batch)
        result = self.tp_worker.forward_batch_generation(batch.get_model_worker_batch())
        for failure in result.processor_failures:
            # Finishes with an abort when this step's result is processed; the rest go on.
            batch.reqs[failure.row].abort(failure.message)
        batch.output_ids = result.next_token_ids
        result.start_copy_to_host()
        return result

    def process_batch_result(self, batch, result) -> None:
        """Append the step's tokens, finish requests, and stream (OutputProcessor)."""
        if not self.is_generation:
            self.output.process_embedding(batch, result)
            self.output.stream(batch.reqs)
            return
        num_decoded = self.output.process(batch, result)
        if batch.forward_mode.is_decode():
            self.retraction.decay()
        self.stats.num_generated_tokens += num_decoded
        self.output.stream(batch.reqs)

    def _needs_settled_outputs(self) -> bool:
        # Structured outputs: the next step's vocab mask needs the in-flight step's tokens
        # accepted by the grammars. Of SGLang's two options (delay only the sampling of the
        # next step until this processing is done, or not overlap) we take the simple one:
        # a step whose predecessor holds a constrained request runs unoverlapped. Steps
        # without grammar requests keep full overlap, and a row's tokens never depend on
        # which path ran, so non-grammar outputs are unchanged.
        pending = self._pending[0]
        if pending.has_grammar and any(
            r.grammar is not None and not r.finished() for r in pending.reqs
        ):
            return True
        # Custom logit processors read their request's tokens ("__req__"): a step whose
        # predecessor holds one runs unoverlapped, so output_ids include every earlier token.
        if pending.has_custom_logit and any(
            r.custom_logit_processor and not r.finished() for r in pending.reqs
        ):
            return True
        # The next decode batch is the running batch plus the last prefill batch (merged in
        # get_next_batch_to_run, its results still pending): if that might not fit, it may
        # retract a request whose prefill result has not been processed yet.
        rb, last = self.running_batch, self.last_batch
        num_reqs = len(rb.reqs) if rb is not None else 0
        if last is not None and last.forward_mode.is_extend():
            num_reqs += len(last.reqs)
        if num_reqs == 0:
            return False
        need = num_reqs * self.page_size
        if self.allocator.available_size() < need:
            self.tree_cache.evict(need)
        return self.allocator.available_size() < need

    # ---- state ---------------------------------------------------------------------
    def on_idle(self) -> None:
        if not self.is_idle_checked and self._pending is None:
            self.stats.check_memory()
            self.is_idle_checked = True
            self.retraction.reset()

    def has_work(self) -> bool:
        return bool(
            self.waiting_queue
            or self.grammar.queue
            or self.chunked_req is not None
            or (self.running_batch is not None and not self.running_batch.is_empty())
            or self.last_batch is not None
            or self._pending is not None
        )

    def num_running_reqs(self) -> int:
        """Requests holding KV between steps: the running batch plus the last prefill (or
        mixed) batch's unfinished, non-chunked requests, which join it when the next batch
        forms (after a mixed step that is every running request)."""
        n = len(self.running_batch.reqs) if self.running_batch is not None else 0
        last = self.last_batch
        if last is not None and last.forward_mode.is_extend():
            n += sum(1 for r in last.reqs if not r.finished() and r is not self.chunked_req)
        return n
