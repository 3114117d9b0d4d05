"""Structured outputs in the scheduler: compile each request's constraint, mask each step's
logits with the rows' grammars, and advance the grammars with the sampled tokens.

Life of a constrained request (SGLang's flow):
  handle_generate_request -> queue_request: a cache hit goes straight to the waiting queue;
    a miss waits in grammar_queue while a worker thread compiles it
  get_next_batch_to_run -> move_ready_grammar_requests: compiled ones join the waiting
    queue; an invalid constraint finishes the request with a 400 before it holds any KV
  run_batch -> build_vocab_mask: one packed bitmask row per batch row (all ones for rows
    without a grammar), applied to the logits before sampling (greedy or not, so reported
    logprobs are those of the masked distribution, as in SGLang)
  process_batch_result -> accept_grammar_token, then Req.check_finished: the request ends
    when its grammar terminates (it accepted a stop token, which the mask allows only where
    the grammar may end)

Chunked prefill: a non-final chunk's token is junk and never reaches the grammar. Retraction
keeps output_ids, so the matcher (which has accepted exactly those tokens) stays valid and
the re-prefill samples the next token under it: nothing to roll back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent import futures
from concurrent.futures import Future
from typing import TYPE_CHECKING

import torch

from mini_sglang.constrained.base_grammar_backend import (
    NONE_BACKEND_ERROR,
    GrammarKey,
    InvalidGrammar,
    create_grammar_backend,
)
from mini_sglang.constrained.bitmask import allocate_token_bitmask
from mini_sglang.managers.finish_reason import FINISH_ABORT
from mini_sglang.utils.device import to_device

if TYPE_CHECKING:
    from mini_sglang.managers.req import Req
    from mini_sglang.managers.schedule_batch import ScheduleBatch
    from mini_sglang.managers.scheduler import Scheduler
    from mini_sglang.sampling.sampling_params import SamplingParams

logger = logging.getLogger("mini_sglang")

# How long an otherwise idle scheduler blocks on a compiling grammar per loop (SGLang: 30 ms).
GRAMMAR_POLL_S = 0.03


def grammar_key(sp: SamplingParams) -> GrammarKey | None:
    """The request's constraint as a cache key (SamplingParams.verify allows at most one)."""
    if sp.json_schema is not None:
        return ("json", sp.json_schema)
    if sp.regex is not None:
        return ("regex", sp.regex)
    if sp.ebnf is not None:
        return ("ebnf", sp.ebnf)
    return None


class SchedulerGrammarMixin:
    def init_grammar(self: Scheduler) -> None:
        self.grammar_queue: list[Req] = []
        self.grammar_backend = create_grammar_backend(
            self.server_args,
            self.tokenizer,
            self.model_config.vocab_size,
            self.model_config.eos_token_ids,
        )

    def queue_request(self: Scheduler, req: Req) -> None:
        """Queue a validated request: a constrained one gets its grammar first."""
        key = grammar_key(req.sampling_params)
        if key is None:
            self.waiting_queue.append(req)
            return
        if self.grammar_backend is None:
            error = NONE_BACKEND_ERROR
            if self.tokenizer is None:
                error += " or with --skip-tokenizer-init (the grammar needs the tokenizer)"
            self.finish_with_error(req, error)
            return
        value, cache_hit = self.grammar_backend.get_cached_or_future(key)
        req.grammar_key = key
        if not cache_hit:
            req.grammar = value  # a Future until move_ready_grammar_requests resolves it
            self.grammar_queue.append(req)
        elif isinstance(value, InvalidGrammar):
            self.finish_with_error(req, value.error)
        else:
            req.grammar = value
            self.waiting_queue.append(req)

    def move_ready_grammar_requests(self: Scheduler) -> None:
        """Move requests whose grammar compiled to the waiting queue, in arrival order.

        With tp_size > 1 it waits for every pending compile: all ranks must admit the same
        requests in the same step (each rank compiles its own copy). With nothing else to
        run it waits up to GRAMMAR_POLL_S for the first one instead of spinning."""
        wait = self.server_args.tp_size > 1
        if not wait and not self.waiting_queue and not self.running_batch_has_reqs():
            futures.wait([self.grammar_queue[0].grammar], timeout=GRAMMAR_POLL_S)
        num_done = 0
        for req in self.grammar_queue:
            future: Future = req.grammar
            if not wait and not future.done():
                break
            num_done += 1
            value = future.result()
            self.grammar_backend.set_cache(req.grammar_key, value.copy())
            if isinstance(value, InvalidGrammar):
                self.finish_with_error(req, value.error)
            else:
                req.grammar = value
                self.waiting_queue.append(req)
        del self.grammar_queue[:num_done]

    def abort_grammar_queue(self: Scheduler, match: Callable[[str], bool], message: str) -> None:
        """Finish the matching requests that are still waiting for their grammar."""
        keep = []
        for req in self.grammar_queue:
            if match(req.rid):
                req.grammar.cancel()  # a compile already running just finishes unused
                req.finished_reason = FINISH_ABORT(message)
                self.stream_output([req])
            else:
                keep.append(req)
        self.grammar_queue = keep

    def finish_with_error(self: Scheduler, req: Req, error: str) -> None:
        """End a request that never got KV with a 400 (SGLang's set_finish_with_abort)."""
        logger.error("%s, rid=%s", error, req.rid)
        req.grammar = None
        req.finished_reason = FINISH_ABORT(error, status_code=400, err_type="BadRequestError")
        self.stream_output([req])

    # ---- per step ------------------------------------------------------------------
    def build_vocab_mask(self: Scheduler, batch: ScheduleBatch) -> torch.Tensor | None:
        """The packed bitmask of allowed next tokens per row, on the device; None when no
        row is constrained. Needs every grammar row's previous token accepted already (see
        Scheduler._needs_settled_outputs for how overlap guarantees it)."""
        if not batch.has_grammar:
            return None
        rows = [
            (i, r.grammar)
            for i, r in enumerate(batch.reqs)
            if r.grammar is not None and not r.finished() and not r.grammar.is_terminated()
        ]
        if not rows:
            return None
        mask = allocate_token_bitmask(len(batch.reqs), self.model_config.vocab_size)
        for i, grammar in rows:
            grammar.fill_vocab_mask(mask, i)
        return to_device(mask, self.device)

    def accept_grammar_token(self: Scheduler, req: Req, token: int) -> None:
        """Advance the request's grammar; a token it rejects (possible only when something
        overrode the mask, e.g. min_new_tokens banning the only allowed EOS) aborts it."""
        grammar = req.grammar
        if grammar.is_terminated() or grammar.accept_token(token):
            return
        logger.error("Grammar rejected token %d of request %s; aborting it.", token, req.rid)
        req.abort(f"The grammar does not accept the sampled token {token}.")

    def running_batch_has_reqs(self: Scheduler) -> bool:
        rb = self.running_batch
        return (rb is not None and not rb.is_empty()) or self.last_batch is not None

    def pending_has_grammar(self: Scheduler) -> bool:
        """Whether the batch still in flight (overlap) has a constrained request."""
        pending = self._pending
        return (
            pending is not None
            and pending[0].has_grammar
            and any(r.grammar is not None and not r.finished() for r in pending[0].reqs)
        )
