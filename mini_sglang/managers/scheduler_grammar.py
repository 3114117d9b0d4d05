"""GrammarQueue: the scheduler's structured-output component. It compiles each request's
constraint, holds the requests whose grammar is still compiling, masks each step's logits
with the rows' grammars, and advances the grammars with the sampled tokens.

Contract: the queue owns only its compiling requests; it never touches the waiting queue.
`add(req)` says whether the request can be scheduled now; otherwise it waits here or is
finished with a 400. `ready(idle)` and `abort(match, message)` hand back the requests
that leave the queue; the scheduler appends the unfinished ones to its waiting queue and
streams the finished ones.

Life of a constrained request (SGLang's flow):
  handle_generate_request -> queue_request -> add: a cache hit goes straight to the waiting
    queue; a miss waits here while a worker thread compiles it
  get_next_batch_to_run -> ready: compiled ones join the waiting queue; an invalid
    constraint finishes the request with a 400 before it holds any KV
  run_batch -> vocab_mask: one packed bitmask row per batch row (all ones for rows without
    a grammar), applied to the logits before sampling (greedy or not, so reported logprobs
    are those of the masked distribution, as in SGLang)
  process_batch_result -> accept_token, then Req.check_finished: the request ends when its
    grammar terminates (it accepted a stop token, which the mask allows only where the
    grammar may end)

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

from mini_sglang.config_slices import GrammarConfig
from mini_sglang.constrained.base_grammar_backend import (
    NONE_BACKEND_ERROR,
    GrammarKey,
    InvalidGrammar,
)
from mini_sglang.constrained.bitmask import allocate_token_bitmask
from mini_sglang.constrained.grammar_registry import create_grammar_backend
from mini_sglang.managers.finish_reason import FINISH_ABORT
from mini_sglang.utils.device import to_device

if TYPE_CHECKING:
    from mini_sglang.managers.req import Req
    from mini_sglang.managers.schedule_batch import ScheduleBatch
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


def _fail(req: Req, error: str, status_code: int = 400) -> None:
    """Finish a request that never got KV with a 400 (SGLang's set_finish_with_abort), or
    a 500 when preparing its grammar failed for a reason other than the constraint."""
    logger.error("%s, rid=%s", error, req.rid)
    req.grammar = None
    err_type = "BadRequestError" if status_code == 400 else "InternalServerError"
    req.finished_reason = FINISH_ABORT(error, status_code=status_code, err_type=err_type)


def accept_token(req: Req, token: int) -> None:
    """Advance the request's grammar; a token it rejects (possible only when something
    overrode the mask, e.g. min_new_tokens banning the only allowed EOS) aborts it."""
    grammar = req.grammar
    if grammar.is_terminated() or grammar.accept_token(token):
        return
    logger.error("Grammar rejected token %d of request %s; aborting it.", token, req.rid)
    req.abort(f"The grammar does not accept the sampled token {token}.")


class GrammarQueue:
    def __init__(self, server_args, tokenizer, model_config, device) -> None:
        self.queue: list[Req] = []  # compiling, in arrival order
        self.backend = create_grammar_backend(
            GrammarConfig.from_server_args(server_args),
            tokenizer,
            model_config.vocab_size,
            model_config.eos_token_ids,
        )
        # With tp_size > 1 every rank must admit the same requests in the same step.
        self.wait_for_all = server_args.tp_size > 1
        self.has_tokenizer = tokenizer is not None
        self.vocab_size = model_config.vocab_size
        self.device = device

    def add(self, req: Req) -> bool:
        """True when `req` can be scheduled now (no constraint, or its grammar is cached).
        Otherwise it waits here for its compile, or it is finished with a 400."""
        key = grammar_key(req.sampling_params)
        if key is None:
            return True
        if self.backend is None:
            error = NONE_BACKEND_ERROR
            if not self.has_tokenizer:
                error += " or with --skip-tokenizer-init (the grammar needs the tokenizer)"
            _fail(req, error)
            return False
        value, cache_hit = self.backend.get_cached_or_future(key)
        req.grammar_key = key
        if not cache_hit:
            req.grammar = value  # a Future until ready() resolves it
            self.queue.append(req)
            return False
        if isinstance(value, InvalidGrammar):
            _fail(req, value.error)
            return False
        req.grammar = value
        return True

    def ready(self, idle: bool) -> list[Req]:
        """The requests whose compile ended, in arrival order, removed from the queue: the
        unfinished ones carry their grammar, the others were finished with a 400.

        With tp_size > 1 it waits for every pending compile (each rank compiles its own
        copy). When the scheduler is `idle` otherwise, it waits up to GRAMMAR_POLL_S for
        the first one instead of spinning."""
        wait = self.wait_for_all
        if not wait and idle:
            futures.wait([self.queue[0].grammar], timeout=GRAMMAR_POLL_S)
        num_done = 0
        for req in self.queue:
            future: Future = req.grammar
            if not wait and not future.done():
                break
            num_done += 1
            try:
                value = future.result()
            except Exception as e:  # noqa: BLE001 - a fault of this request's grammar only
                _fail(req, f"Internal server error: {e}", status_code=500)
                continue
            self.backend.set_cache(req.grammar_key, value.copy())
            if isinstance(value, InvalidGrammar):
                _fail(req, value.error)
            else:
                req.grammar = value
        done = self.queue[:num_done]
        del self.queue[:num_done]
        return done

    def abort(self, match: Callable[[str], bool], message: str) -> list[Req]:
        """Finish and remove the matching requests still waiting for their grammar."""
        keep, aborted = [], []
        for req in self.queue:
            if match(req.rid):
                req.grammar.cancel()  # a compile already running just finishes unused
                req.finished_reason = FINISH_ABORT(message)
                aborted.append(req)
            else:
                keep.append(req)
        self.queue = keep
        return aborted

    def reset(self) -> None:
        """Forget the compiled grammars (flush_cache)."""
        if self.backend is not None:
            self.backend.reset()

    # ---- per step ------------------------------------------------------------------
    def vocab_mask(self, batch: ScheduleBatch) -> torch.Tensor | None:
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
        mask = allocate_token_bitmask(len(batch.reqs), self.vocab_size)
        for i, grammar in rows:
            try:
                grammar.fill_vocab_mask(mask, i)
            except Exception as e:  # noqa: BLE001 - a fault of this row's grammar only
                logger.exception("Request %s: filling its grammar mask failed", batch.reqs[i].rid)
                mask[i] = -1  # unconstrained for its last step; it ends with a 500
                req = batch.reqs[i]
                req.grammar = None  # its sampled token is not fed to the broken grammar
                req.abort(f"Internal server error: {e}", 500, "InternalServerError")
        return to_device(mask, self.device)
