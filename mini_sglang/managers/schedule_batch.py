"""ScheduleBatch: the scheduler's view of a batch (requests + KV allocation).

`prepare_for_extend` / `prepare_for_decode` allocate KV slots and build the flat token
arrays; `get_model_worker_batch` hands plain tensors to the worker; `filter_batch` /
`merge_batch` follow requests as they finish or join the running decode batch.

The decode input is `self.output_ids`: the device tensor of tokens the previous step
sampled (one per row). Reading it instead of the requests' Python lists is what lets a
decode step be prepared before the previous step's tokens reach the host (overlap).
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from mini_sglang.managers.req import Req
from mini_sglang.model_executor.forward_batch_info import ForwardMode, ModelWorkerBatch
from mini_sglang.sampling.sampling_batch_info import NO_SEED, SamplingBatchInfo
from mini_sglang.sampling.sampling_params import SamplingParams
from mini_sglang.utils.device import to_device

if TYPE_CHECKING:
    from mini_sglang.mem_cache.base_prefix_cache import BasePrefixCache
    from mini_sglang.mem_cache.memory_pool import ReqToTokenPool

__all__ = ["BatchSnapshot", "Req", "ScheduleBatch", "OutOfKVMemoryError"]

logger = logging.getLogger("mini_sglang")


@dataclass
class BatchSnapshot:
    """A launched batch as result processing sees it (see ScheduleBatch.snapshot)."""

    reqs: list[Req]
    forward_mode: ForwardMode
    return_logprob: bool
    prefix_lens: list[int]
    seq_lens: torch.Tensor  # KV length of each row after this step
    out_cache_loc: torch.Tensor
    # Per row, where its prompt logprobs start inside this step's new tokens (frozen here:
    # under overlap the request is rescheduled before this step's results are processed).
    extend_logprob_start_lens: list[int]
    # Rows decode_start.. are decodes: all rows of a DECODE batch, none of an EXTEND batch,
    # the running requests appended to a MIXED batch.
    decode_start: int
    has_grammar: bool  # some row is constrained (see ScheduleBatch.reqs)
    has_custom_logit: bool = False  # some row has a custom logit processor

    def is_decode_row(self, i: int) -> bool:
        return i >= self.decode_start


class OutOfKVMemoryError(RuntimeError):
    """Raised when KV slots run out even after eviction (the scheduler's budgets failed)."""


class ScheduleBatch:
    def __init__(
        self,
        reqs: list[Req],
        req_to_token_pool: ReqToTokenPool,
        token_to_kv_pool_allocator,
        tree_cache: BasePrefixCache,
        vocab_size: int,
        device: str | torch.device,
    ) -> None:
        self.reqs = reqs
        self.req_to_token_pool = req_to_token_pool
        self.allocator = token_to_kv_pool_allocator
        self.tree_cache = tree_cache
        self.vocab_size = vocab_size
        self.device = device
        self.forward_mode = ForwardMode.EXTEND
        self.input_ids: torch.Tensor | None = None
        self.positions: torch.Tensor | None = None
        self.out_cache_loc: torch.Tensor | None = None
        # Each request's row in req_to_token and KV length after this step, kept both on the
        # host (for planning and bookkeeping) and on the device (for kernels), so the decode
        # path never copies them host->device.
        self.req_pool_indices = torch.empty(0, dtype=torch.int64)
        self.seq_lens = torch.empty(0, dtype=torch.int64)
        self.req_pool_indices_dev = self.req_pool_indices
        self.seq_lens_dev = self.seq_lens
        self.prefix_lens: list[int] = []
        self.extend_lens: list[int] = []
        self.extend_logprob_start_lens: list[int] = []
        self.decode_start = 0  # first decode row (see BatchSnapshot.decode_start)
        self.output_ids: torch.Tensor | None = None  # device, last sampled token per row
        self.sampling_info: SamplingBatchInfo | None = None
        self.return_logprob = False
        # An extend with input_embeds prompts: their rows and where they go among the
        # extend tokens (see _prompt_embeds); None otherwise, and always on decode.
        self.input_embeds: torch.Tensor | None = None
        self.input_embeds_loc: torch.Tensor | None = None
        # An extend with images: per extend row its MultimodalInputs (None for a text
        # row); None when no row has images, and always on decode.
        self.mm_inputs: list | None = None
        # An extend with token-type (segment) ids: one per extend token (see _token_types);
        # None otherwise, and always on decode.
        self.token_type_ids: torch.Tensor | None = None

    @property
    def reqs(self) -> list[Req]:
        return self._reqs

    @reqs.setter
    def reqs(self, reqs: list[Req]) -> None:
        """Membership changes only here (never in place), so per-row facts that stay fixed
        while a request is in a batch are computed once per change, not once per step."""
        self._reqs = reqs
        self.has_grammar = any(r.grammar is not None for r in reqs)
        self.has_logprob_reqs = any(r.return_logprob for r in reqs)
        self.has_custom_logit = any(r.custom_logit_processor for r in reqs)
        self.mrope_deltas = _mrope_deltas(reqs)  # host; its device copy made on first use
        self._mrope_deltas_dev: torch.Tensor | None = None

    def is_empty(self) -> bool:
        return not self.reqs

    # ---- KV allocation -------------------------------------------------------------
    def _evict_for(self, num_tokens: int) -> None:
        short = num_tokens - self.allocator.available_size()
        if short > 0:
            self.tree_cache.evict(short)

    def _alloc_extend(self, prefix_lens: torch.Tensor, seq_lens: torch.Tensor, total: int):
        self._evict_for(total + self.allocator.page_size * len(self.reqs))
        table = self.req_to_token_pool.req_to_token
        rows = self.req_pool_indices_dev
        prefix_dev = to_device(prefix_lens, table.device)
        last_loc = torch.where(
            prefix_dev > 0,
            table[rows, (prefix_dev - 1).clamp(min=0)].long(),
            torch.full_like(prefix_dev, -1),
        )
        # host lengths: the allocator counts pages from them without a device sync
        out = self.allocator.alloc_extend(prefix_lens, seq_lens, last_loc, total)
        if out is None:
            raise OutOfKVMemoryError(
                f"Prefill needs {total} KV slots, {self.allocator.available_size()} free"
            )
        return out

    def prepare_for_extend(self) -> None:
        self.forward_mode = ForwardMode.EXTEND
        reqs = self.reqs
        need_slots = [r for r in reqs if r.req_pool_idx is None]
        if need_slots:
            slots = self.req_to_token_pool.alloc(len(need_slots))
            if slots is None:
                raise OutOfKVMemoryError("No free request slots")
            for r, s in zip(need_slots, slots):
                r.req_pool_idx = s
        self.req_pool_indices = torch.tensor([r.req_pool_idx for r in reqs], dtype=torch.int64)
        self.prefix_lens = [len(r.prefix_indices) for r in reqs]
        self.extend_lens = [r.extend_input_len for r in reqs]
        seq_lens = [p + e for p, e in zip(self.prefix_lens, self.extend_lens)]
        self.seq_lens = torch.tensor(seq_lens, dtype=torch.int64)
        table = self.req_to_token_pool.req_to_token
        self.req_pool_indices_dev = to_device(self.req_pool_indices, table.device)
        self.seq_lens_dev = to_device(self.seq_lens, table.device)
        for r, p in zip(reqs, self.prefix_lens):
            if p:
                table[r.req_pool_idx, :p] = r.prefix_indices.to(table.device, torch.int32)
        total = sum(self.extend_lens)
        out = self._alloc_extend(torch.tensor(self.prefix_lens), self.seq_lens, total)
        self.out_cache_loc = out
        # Scatter the new slots into each request's row: request i's tokens
        # prefix_i .. seq_i - 1 take out[start_i : start_i + extend_i].
        row_ids = torch.repeat_interleave(self.req_pool_indices, torch.tensor(self.extend_lens))
        cols = torch.cat([torch.arange(p, s) for p, s in zip(self.prefix_lens, seq_lens)])
        cols_dev = to_device(cols, table.device)
        table[to_device(row_ids, table.device), cols_dev] = out.to(table.device, torch.int32)
        self.input_ids = to_device(
            torch.tensor(
                [t for r, p in zip(reqs, self.prefix_lens) for t in r.fill_ids[p:]],
                dtype=torch.int64,
            ),
            table.device,
        )
        self.positions = cols_dev
        self.input_embeds, self.input_embeds_loc = _prompt_embeds(reqs, self.prefix_lens, seq_lens)
        mm = [r.multimodal_inputs for r in reqs]
        self.mm_inputs = mm if any(m is not None for m in mm) else None
        self.token_type_ids = _token_types(reqs, self.prefix_lens, seq_lens)
        for r, p, s in zip(reqs, self.prefix_lens, seq_lens):
            # cached_tokens counts prompt tokens that came from the cache, once each.
            if p > r.already_computed:
                r.cached_tokens += p - r.already_computed
            r.already_computed = s
        self.return_logprob = self.has_logprob_reqs
        self.extend_logprob_start_lens = [
            max(r.logprob_start_len - p, 0) if r.return_logprob else e
            for r, p, e in zip(reqs, self.prefix_lens, self.extend_lens)
        ]
        self.decode_start = len(reqs)
        self.sampling_info = self._build_sampling_info()

    def _build_sampling_info(self) -> SamplingBatchInfo:
        """The batch's sampling tensors. If building them fails, each request is prepared
        alone: one that fails is a fault of that request, not of the engine, so it is
        aborted (status 500, at its next check_finished) and samples this step with
        neutral parameters; the rest of the batch runs as usual. A failure that no single
        request explains still raises."""
        try:
            return SamplingBatchInfo.from_reqs(self.reqs, self.vocab_size, self.device)
        except Exception:  # noqa: BLE001 - narrowed down to the requests below
            logger.exception("Building a batch's sampling tensors failed; checking each request")
        rows = []
        for req in self.reqs:
            try:
                SamplingBatchInfo.from_reqs([req], self.vocab_size, "cpu")
                rows.append(req)
            except Exception as e:  # noqa: BLE001
                logger.error("Request %s: preparing its sampling failed: %r", req.rid, e)
                req.abort(f"Internal server error: {e}", 500, "InternalServerError")
                rows.append(_neutral_stand_in(req))
        return SamplingBatchInfo.from_reqs(rows, self.vocab_size, self.device)

    def prepare_for_decode(self) -> None:
        """Allocate one KV slot per request for the token sampled last step."""
        self.forward_mode = ForwardMode.DECODE
        bs = len(self.reqs)
        self._evict_for(bs * self.allocator.page_size)
        table = self.req_to_token_pool.req_to_token
        rows, cols = self.req_pool_indices_dev, self.seq_lens_dev
        new_lens_dev = cols + 1
        if self.allocator.page_size == 1:
            # No partial page to continue: skip the last-slot gather (3 small kernels a
            # step, which the GPU runs between two decode graphs), as SGLang does.
            out = self.allocator.alloc(bs)
        else:
            last_loc = table[rows, cols - 1].long()
            out = self.allocator.alloc_decode(new_lens_dev, last_loc, self.seq_lens + 1)
        if out is None:
            raise OutOfKVMemoryError(f"Decode needs {bs} KV slots")
        table[rows, cols] = out.to(torch.int32)
        self.out_cache_loc = out
        # An M-RoPE request's new token sits at position seq + mrope_position_delta on all
        # three axes, so its decode runs plain RoPE there (models/qwen2_5_vl.py).
        self.positions = cols if self.mrope_deltas is None else cols + self._deltas_on(cols)
        self.seq_lens_dev = new_lens_dev
        self.seq_lens = self.seq_lens + 1
        self.input_ids = self.output_ids
        self.input_embeds = self.input_embeds_loc = None
        self.mm_inputs = self.token_type_ids = None
        self.return_logprob = self.has_logprob_reqs
        self.decode_start = 0
        self.prefix_lens, self.extend_lens, self.extend_logprob_start_lens = [], [], []

    def _deltas_on(self, like: torch.Tensor) -> torch.Tensor:
        if self._mrope_deltas_dev is None:
            self._mrope_deltas_dev = to_device(self.mrope_deltas, like.device)
        return self._mrope_deltas_dev

    def check_decode_mem(self) -> bool:
        """Whether the next decode step's slots fit (after evicting what can be evicted)."""
        need = len(self.reqs) * self.allocator.page_size
        if self.allocator.available_size() >= need:
            return True
        self.tree_cache.evict(need)
        return self.allocator.available_size() >= need

    # ---- membership ----------------------------------------------------------------
    def filter_batch(self, keep_indices: list[int] | None = None) -> None:
        """Keep only the given rows (default: the unfinished, non-chunked requests)."""
        if keep_indices is None:
            keep_indices = [
                i for i, r in enumerate(self.reqs) if not r.finished() and not r.is_chunked
            ]
        if len(keep_indices) == len(self.reqs):
            return
        self.reqs = [self.reqs[i] for i in keep_indices]
        keep = torch.tensor(keep_indices, dtype=torch.int64)
        keep_dev = to_device(keep, self.seq_lens_dev.device)
        self.req_pool_indices = self.req_pool_indices[keep]
        self.seq_lens = self.seq_lens[keep]
        self.req_pool_indices_dev = self.req_pool_indices_dev[keep_dev]
        self.seq_lens_dev = self.seq_lens_dev[keep_dev]
        if self.output_ids is not None:
            self.output_ids = self.output_ids[keep_dev]
        if self.sampling_info is not None:
            self.sampling_info.filter(keep)

    def merge_batch(self, other: ScheduleBatch) -> None:
        """Append `other`'s rows (both batches have run, so both have output_ids)."""
        self._append_rows(other)
        self.output_ids = torch.cat([self.output_ids, other.output_ids])

    def _append_rows(self, other: ScheduleBatch) -> None:
        self.sampling_info.merge(other.sampling_info, self.reqs + other.reqs)
        self.reqs = self.reqs + other.reqs
        self.req_pool_indices = torch.cat([self.req_pool_indices, other.req_pool_indices])
        self.seq_lens = torch.cat([self.seq_lens, other.seq_lens])
        self.req_pool_indices_dev = torch.cat(
            [self.req_pool_indices_dev, other.req_pool_indices_dev]
        )
        self.seq_lens_dev = torch.cat([self.seq_lens_dev, other.seq_lens_dev])

    def mix_with_running(self, running: ScheduleBatch) -> None:
        """Turn this prepared prefill batch into a MIXED one (--enable-mixed-chunk): the
        running decode batch, already through prepare_for_decode, is appended as extends
        of one token whose prefix is the request's whole KV history.

        Worked example: this batch has request A extending positions 8..11 on a cached
        prefix of 8; the running batch has B with 20 tokens of KV and C with 6 (its
        prepare_for_decode made seq_lens [21, 7], positions [20, 6]). After mixing
          prefix_lens [8, 20, 6], extend_lens [4, 1, 1], seq_lens [12, 21, 7],
          positions [8, 9, 10, 11, 20, 6], decode_start 1,
        and out_cache_loc / input_ids are A's 4 entries followed by B's and C's one each
        (B's and C's input id is the token their previous step sampled, still on the
        device: nothing here waits for the host).
        """
        assert running.forward_mode.is_decode(), "mix after running.prepare_for_decode()"
        assert self.forward_mode == ForwardMode.EXTEND and self.output_ids is None
        n = len(running.reqs)
        self.forward_mode = ForwardMode.MIXED
        self.decode_start = len(self.reqs)
        self.input_ids = torch.cat([self.input_ids, running.input_ids.to(self.input_ids.dtype)])
        self.positions = torch.cat([self.positions, running.positions.to(self.positions.dtype)])
        self.out_cache_loc = torch.cat(
            [self.out_cache_loc, running.out_cache_loc.to(self.out_cache_loc.dtype)]
        )
        self.prefix_lens = self.prefix_lens + (running.seq_lens - 1).tolist()
        self.extend_lens = self.extend_lens + [1] * n
        if self.mm_inputs is not None:
            self.mm_inputs = self.mm_inputs + [None] * n
        # A decode row's single position is its sampling row, not a prompt position.
        self.extend_logprob_start_lens = self.extend_logprob_start_lens + [1] * n
        self._append_rows(running)
        self.return_logprob = self.return_logprob or running.return_logprob

    def snapshot(self) -> BatchSnapshot:
        """What result processing needs, frozen at launch (the live batch moves on)."""
        return BatchSnapshot(
            reqs=list(self.reqs),
            forward_mode=self.forward_mode,
            return_logprob=self.return_logprob,
            prefix_lens=list(self.prefix_lens),
            seq_lens=self.seq_lens.clone(),
            out_cache_loc=self.out_cache_loc,
            extend_logprob_start_lens=list(self.extend_logprob_start_lens),
            decode_start=self.decode_start,
            has_grammar=self.has_grammar,
            has_custom_logit=self.has_custom_logit,
        )

    def get_model_worker_batch(self) -> ModelWorkerBatch:
        extend = self.forward_mode.is_extend()
        return ModelWorkerBatch(
            forward_mode=self.forward_mode,
            input_ids=self.input_ids,
            positions=self.positions,
            req_pool_indices=self.req_pool_indices_dev,
            seq_lens=self.seq_lens_dev,
            seq_lens_cpu=self.seq_lens,
            out_cache_loc=self.out_cache_loc,
            extend_seq_lens=self.extend_lens if extend else None,
            extend_prefix_lens=self.prefix_lens if extend else None,
            input_embeds=self.input_embeds if extend else None,
            input_embeds_loc=self.input_embeds_loc if extend else None,
            mm_inputs=self.mm_inputs if extend else None,
            token_type_ids=self.token_type_ids if extend else None,
            sampling_info=self.sampling_info,
            return_logprob=self.return_logprob,
            extend_logprob_start_lens=list(self.extend_logprob_start_lens)
            if extend and self.return_logprob
            else None,
            top_logprobs_nums=[r.top_logprobs_num for r in self.reqs]
            if self.return_logprob
            else None,
            token_ids_logprobs=[r.token_ids_logprob for r in self.reqs]
            if self.return_logprob
            else None,
        )


def _mrope_deltas(reqs: list[Req]) -> torch.Tensor | None:
    """int64 [len(reqs)] mrope_position_delta of each request (0 without one), or None
    when every delta is 0 (text-only batches: decode positions stay as they are)."""
    deltas = []
    for r in reqs:
        mm = r.multimodal_inputs
        delta = None if mm is None else mm.mrope_position_delta
        deltas.append(0 if delta is None else int(delta))
    if not any(deltas):
        return None
    return torch.tensor(deltas, dtype=torch.int64)


def _neutral_stand_in(req: Req) -> Req:
    """A copy of `req` that samples with default parameters (no bias, penalty, seed or
    custom logit processor): the row of an aborted request in the batch's sampling tensors."""
    stand_in = copy.copy(req)
    stand_in.rid = ""
    stand_in.sampling_params = SamplingParams()
    stand_in.sampling_seed = NO_SEED
    stand_in.custom_logit_processor = None
    return stand_in


def _token_types(
    reqs: list[Req], prefix_lens: list[int], seq_lens: list[int]
) -> torch.Tensor | None:
    """Token-type ids (int64) of this extend's tokens, request after request: request i's
    token_type_ids[prefix_i:seq_i], type 0 where it has none. None when no request has
    any (the model then takes type 0 everywhere)."""
    if all(r.token_type_ids is None for r in reqs):
        return None
    parts = []
    for r, p, s in zip(reqs, prefix_lens, seq_lens):
        types = list(r.token_type_ids or [])[p:s]
        parts.append(types + [0] * (s - p - len(types)))
    return torch.tensor([t for part in parts for t in part], dtype=torch.int64)


def _prompt_embeds(
    reqs: list[Req], prefix_lens: list[int], seq_lens: list[int]
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(rows, locations) of the given prompt embeddings this extend computes: request i
    extends positions prefix_i .. seq_i - 1, the extend tokens laid out request after
    request; the positions below its prompt length take its input_embeds rows (a chunk
    takes its slice; output tokens re-run after a retraction keep the embedding table).
    (None, None) when no request has input_embeds."""
    rows, locs, offset = [], [], 0
    for r, p, s in zip(reqs, prefix_lens, seq_lens):
        embeds = r.input_embeds
        end = min(s, len(embeds)) if embeds is not None else p
        if end > p:
            rows.append(embeds[p:end])
            locs.append(torch.arange(offset, offset + end - p))
        offset += s - p
    if not rows:
        return None, None
    return torch.cat(rows), torch.cat(locs)
