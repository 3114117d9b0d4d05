"""OutputProcessor: what the scheduler does with a finished forward. It appends each row's
token (and logprobs), finishes requests, frees their KV into the prefix cache, and streams
BatchTokenIDOutput to the detokenizer.

Contract: `process(batch, result)` changes the requests of the batch and the KV pools only,
never the scheduler's queues (finished requests leave the running batch when the scheduler
filters it), and returns the number of decode tokens; `stream(reqs)` sends what is new
for each request that is due (also used for requests finished before they ran).

An embedding model's batches go through `process_embedding(batch, embeddings)` instead:
each request whose last prefill chunk ran takes its pooled row and finishes; embedding
requests are streamed once, finished, as BatchEmbeddingOutput.

Streaming rule (SGLang's): a request is sent when it finishes, and while streaming when it
got its first token or every --stream-interval tokens. Each message carries only what is
new for that request (its decode ids, output ids and logprobs since the last message).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from mini_sglang.managers.io_struct.output import (
    LOGPROB_FIELDS,
    BatchEmbeddingOutput,
    BatchTokenIDOutput,
)
from mini_sglang.managers.scheduler_grammar import accept_token

if TYPE_CHECKING:
    from mini_sglang.managers.req import Req
    from mini_sglang.managers.schedule_batch import BatchSnapshot
    from mini_sglang.managers.tp_worker import GenerationBatchResult

# Prompt ids sent along with a request's first message, as decoding context.
DETOKENIZE_CONTEXT_TOKENS = 5


class OutputProcessor:
    def __init__(
        self,
        allocator,
        tree_cache,
        page_size: int,
        tokenizer,
        stream_interval: int,
        send_to_detokenizer: Callable[[BatchTokenIDOutput], None],
    ) -> None:
        self.allocator = allocator
        self.tree_cache = tree_cache
        self.page_size = page_size
        self.tokenizer = tokenizer  # for stop strings (None with --skip-tokenizer-init)
        self.stream_interval = stream_interval  # --stream-interval
        self.send_to_detokenizer = send_to_detokenizer

    def process(self, batch: BatchSnapshot, result: GenerationBatchResult) -> int:
        """Append each row's sampled token and finish requests; returns the number of
        decode rows' tokens.

        Rows are prefill rows (their prompt just got its KV: cached for sharing) or decode
        rows (one more token); a MIXED batch (--enable-mixed-chunk) has prefill rows first
        and decode rows from batch.decode_start on, each handled as in its own kind of batch.

        With overlap scheduling the next step was launched before this runs, so a request
        that finished in an earlier step may still sit in this batch as a decode row: its
        token here is surplus and the KV slot that step took for it is freed.
        """
        next_ids = result.token_list()
        # One free for every request finishing here (SGLang groups them too): with pages,
        # each free dedupes page ids on the device, which waits for the GPU queue.
        self.allocator.free_group_begin()
        try:
            num_decoded = self._process_rows(batch, result, next_ids)
        finally:
            self.allocator.free_group_end()
        if batch.forward_mode.is_extend() and batch.return_logprob:
            self.add_input_logprobs(batch, result)
        return num_decoded

    def _process_rows(
        self, batch: BatchSnapshot, result: GenerationBatchResult, next_ids: list[int]
    ) -> int:
        """The per-row part of process; returns the decode rows' token count."""
        num_decoded = 0
        for i, req in enumerate(batch.reqs):
            is_decode_row = batch.is_decode_row(i)
            if req.is_chunked > 0:
                # A prefill chunk that is not the prompt's last: its sampled token is junk.
                req.is_chunked -= 1
                continue
            if req.finished():
                if is_decode_row:
                    self.free_surplus_slot(batch, i)
                continue
            num_decoded += is_decode_row
            req.output_ids.append(next_ids[i])
            if req.return_logprob and result.logprobs is not None:
                self.add_output_logprobs(req, result.logprobs[i], next_ids[i])
            if req.grammar is not None:
                accept_token(req, next_ids[i])
            req.check_finished(self.tokenizer)
            if req.finished():
                self.tree_cache.cache_finished_req(req)
            elif not is_decode_row:
                # The prompt just got its KV: insert it so later requests can share it.
                self.tree_cache.cache_unfinished_req(req)
        return num_decoded

    def process_embedding(self, batch: BatchSnapshot, embeddings: torch.Tensor) -> None:
        """An embedding model's prefill step: ``embeddings`` has one row per request (CPU).
        A request still being chunked keeps going (its row is not its embedding yet: only
        the final chunk's last token sees the whole input, SGLang 0.5.4's rule); the rest
        take their row and finish (max_new_tokens 0: FINISH_LENGTH, or their abort)."""
        rows = embeddings.tolist()
        self.allocator.free_group_begin()
        try:
            for i, req in enumerate(batch.reqs):
                if req.is_chunked > 0:
                    req.is_chunked -= 1
                    continue
                if req.finished():
                    continue
                req.output_ids.append(0)  # a stand-in token: check_finished drops it
                req.check_finished()
                if not req.to_abort:  # an aborted request ends without its vector
                    req.embedding = rows[i]
                self.tree_cache.cache_finished_req(req)
        finally:
            self.allocator.free_group_end()

    def free_surplus_slot(self, batch: BatchSnapshot, i: int) -> None:
        """Free the KV slot a finished request took in a step launched before its finish
        was known (decode row i; a decode row's slot is among the last len(reqs) - i
        entries of out_cache_loc, since a MIXED batch lists its prefill tokens first).
        With pages, the slot's page is the request's own only when the slot
        opened it (position % page_size == 0); otherwise the page went with the request's
        tail when it finished. Example, page_size 4: the surplus token at position 8 opened
        page [8..11] -> free it; at position 9 its page was freed with positions 8."""
        position = int(batch.seq_lens[i]) - 1
        if position % self.page_size == 0:
            j = len(batch.out_cache_loc) - len(batch.reqs) + i
            self.allocator.free(batch.out_cache_loc[j : j + 1])

    # ---- logprobs ------------------------------------------------------------------
    def add_output_logprobs(self, req: Req, logprobs: torch.Tensor, token_id: int) -> None:
        req.output_token_logprobs_val.append(float(logprobs[token_id]))
        req.output_token_logprobs_idx.append(token_id)
        if req.top_logprobs_num > 0:
            vals, idx = logprobs.topk(req.top_logprobs_num)
            req.output_top_logprobs_val.append(vals.tolist())
            req.output_top_logprobs_idx.append(idx.tolist())
        if req.token_ids_logprob is not None:
            ids = req.token_ids_logprob
            req.output_token_ids_logprobs_val.append(logprobs[ids].tolist())
            req.output_token_ids_logprobs_idx.append(list(ids))

    def add_input_logprobs(self, batch: BatchSnapshot, result: GenerationBatchResult) -> None:
        """Prompt logprobs: position k's value is log p(token k | tokens < k), from the
        logits row of position k - 1; the first reported position (logprob_start_len) gets
        None, as in SGLang 0.5.4 even when it is not 0 (its row k - 1 is not computed).

        Worked example: prompt t0..t5, logprob_start_len 2, nothing cached, one chunk: the
        rows are positions 2..5 (start 2). Position 2 gets None; rows 0, 1, 2 predict t3,
        t4, t5; row 3 predicts the first output token and is skipped. The prompt's values
        are then [None, lp(t3), lp(t4), lp(t5)]. Split into chunks t0..t3 and t4..t5, the
        second chunk's rows start at 4 and the first one's last row already gave t4.
        """
        out = result.logits_output
        if out.input_logits is None:
            return
        offset = 0
        for req, n_rows, prefix, rel_start in zip(
            batch.reqs, out.input_logits_lens, batch.prefix_lens, batch.extend_logprob_start_lens
        ):
            rows = out.input_logits[offset : offset + n_rows]
            offset += n_rows
            if not req.return_logprob or n_rows == 0:
                continue
            # Raw logits, no temperature: SGLang 0.5.4 never sets temp_scaled_logprobs for
            # prompt positions (only output logprobs are taken after temperature).
            logprobs = torch.log_softmax(rows, dim=-1)
            start = prefix + rel_start  # absolute position of the first row
            if start == req.logprob_start_len and not req.input_token_logprobs_val:
                req.input_token_logprobs_val.append(None)
                req.input_token_logprobs_idx.append(req.origin_input_ids_unpadded[start])
                if req.top_logprobs_num > 0:
                    req.input_top_logprobs_val.append(None)
                    req.input_top_logprobs_idx.append(None)
                if req.token_ids_logprob is not None:
                    req.input_token_ids_logprobs_val.append(None)
                    req.input_token_ids_logprobs_idx.append(None)
            prompt_len = len(req.origin_input_ids)
            # Last prompt position whose logprob is already recorded: row s predicts s + 1,
            # and position s holds a None. A retracted request re-prefills its
            # prompt; those rows must not be appended a second time (SGLang skips them too).
            s = req.logprob_start_len
            done_until = s + len(req.input_token_logprobs_val) - 1
            for j in range(n_rows):
                pos = start + j + 1  # the token this row predicts
                if pos >= prompt_len:
                    break
                if pos <= done_until:
                    continue
                # origin_input_ids, not fill_ids: a non-final prefill chunk's last row
                # predicts the first token of the next chunk, beyond this chunk's fill_ids.
                tok = req.origin_input_ids_unpadded[pos]
                req.input_token_logprobs_val.append(float(logprobs[j, tok]))
                req.input_token_logprobs_idx.append(tok)
                if req.top_logprobs_num > 0:
                    vals, idx = logprobs[j].topk(req.top_logprobs_num)
                    req.input_top_logprobs_val.append(vals.tolist())
                    req.input_top_logprobs_idx.append(idx.tolist())
                if req.token_ids_logprob is not None:
                    ids = req.token_ids_logprob
                    req.input_token_ids_logprobs_val.append(logprobs[j, ids].tolist())
                    req.input_token_ids_logprobs_idx.append(list(ids))

    # ---- streaming -----------------------------------------------------------------
    def should_stream(self, req: Req) -> bool:
        if req.finished():
            return True
        if not req.stream or req.is_chunked > 0:
            return False
        interval = req.sampling_params.stream_interval or self.stream_interval
        n = len(req.output_ids)
        return n == 1 or (n - req.send_token_offset) >= interval

    def stream(self, reqs: list[Req]) -> None:
        to_send = [r for r in reqs if self.should_stream(r) and not r.sent_final]
        embedded = [r for r in to_send if r.is_embedding]
        if embedded:
            self.stream_embedding(embedded)
            to_send = [r for r in to_send if not r.is_embedding]
        if not to_send:
            return
        out = BatchTokenIDOutput(
            rids=[],
            finished_reasons=[],
            decoded_texts=[],
            decode_ids=[],
            read_offsets=[],
            output_ids=[],
            skip_special_tokens=[],
            spaces_between_special_tokens=[],
            no_stop_trim=[],
            prompt_tokens=[],
            completion_tokens=[],
            cached_tokens=[],
            stop_strs=[],
        )
        want_logprobs = any(r.return_logprob for r in to_send)
        if want_logprobs:
            for name in LOGPROB_FIELDS:
                setattr(out, name, [])
        for req in to_send:
            sp = req.sampling_params
            if req.read_offset is None:
                ctx = req.origin_input_ids_unpadded[-DETOKENIZE_CONTEXT_TOKENS:]
                decode_ids = ctx + req.output_ids
                req.read_offset = len(ctx)
            else:
                decode_ids = req.output_ids[req.send_token_offset :]
            out.rids.append(req.rid)
            out.finished_reasons.append(
                req.finished_reason.to_json() if req.finished_reason is not None else None
            )
            out.decoded_texts.append("")
            out.decode_ids.append(decode_ids)
            out.read_offsets.append(req.read_offset)
            out.output_ids.append(req.output_ids[req.send_token_offset :])
            out.skip_special_tokens.append(sp.skip_special_tokens)
            out.spaces_between_special_tokens.append(sp.spaces_between_special_tokens)
            out.no_stop_trim.append(sp.no_stop_trim)
            out.prompt_tokens.append(len(req.origin_input_ids))
            out.completion_tokens.append(len(req.output_ids))
            out.cached_tokens.append(req.cached_tokens)
            out.stop_strs.append(list(sp.stop_strs) if sp.stop_strs else None)
            if want_logprobs:
                self._append_logprob_deltas(out, req)
            req.send_token_offset = len(req.output_ids)
            if req.finished():
                req.sent_final = True
        self.send_to_detokenizer(out)

    def stream_embedding(self, reqs: list[Req]) -> None:
        """Finished embedding requests as one BatchEmbeddingOutput (SGLang's fields)."""
        out = BatchEmbeddingOutput(
            rids=[r.rid for r in reqs if r.finished()],
            finished_reasons=[r.finished_reason.to_json() for r in reqs if r.finished()],
            embeddings=[r.embedding for r in reqs if r.finished()],
            prompt_tokens=[len(r.origin_input_ids) for r in reqs if r.finished()],
            cached_tokens=[r.cached_tokens for r in reqs if r.finished()],
        )
        for r in reqs:
            r.sent_final = r.finished()
        if out.rids:
            self.send_to_detokenizer(out)

    def _append_logprob_deltas(self, out: BatchTokenIDOutput, req: Req) -> None:
        for name in LOGPROB_FIELDS:
            values = getattr(req, name)
            getattr(out, name).append(values[req.logprob_sent.get(name, 0) :])
            req.logprob_sent[name] = len(values)
