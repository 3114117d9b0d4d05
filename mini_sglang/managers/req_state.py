"""One generate request's state in the TokenizerManager, and the output dict built from it.

The detokenizer's BatchStrOutput messages are folded in as they arrive (``add_output``);
the request's consumer takes the latest output when it wakes (``take_output``):
``{"text": cumulative text, "output_ids": ..., "meta_info": {...}}``, the text left out
under --skip-tokenizer-init; for an embedding request (EmbeddingReqInput) it is
``{"embedding": [...], "meta_info": {...}}``. meta_info's key order is SGLang's (byte-exact clients read
it); logprobs are triples [logprob, token_id, text | None].
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Optional

from mini_sglang.managers.io_struct.generate import EmbeddingReqInput, GenerateReqInput
from mini_sglang.managers.io_struct.output import BatchEmbeddingOutput, BatchStrOutput

# (meta_info key, value field, index field, one list per position) of each logprob kind.
_LOGPROB_KINDS = (
    ("input_token_logprobs", "input_token_logprobs_val", "input_token_logprobs_idx", False),
    ("output_token_logprobs", "output_token_logprobs_val", "output_token_logprobs_idx", False),
    ("input_top_logprobs", "input_top_logprobs_val", "input_top_logprobs_idx", True),
    ("output_top_logprobs", "output_top_logprobs_val", "output_top_logprobs_idx", True),
    (
        "input_token_ids_logprobs",
        "input_token_ids_logprobs_val",
        "input_token_ids_logprobs_idx",
        True,
    ),
    (
        "output_token_ids_logprobs",
        "output_token_ids_logprobs_val",
        "output_token_ids_logprobs_idx",
        True,
    ),
)


@dataclass
class ReqState:
    """A request between its send to the scheduler and its last output.

    ``event`` is set when an output arrived that the consumer has not taken yet;
    ``finished`` once the last one arrived. ``metric_*`` belong to --enable-metrics, ``dash_*`` to
    DashboardStats.
    """

    obj: GenerateReqInput | EmbeddingReqInput
    created_time: float
    event: asyncio.Event = field(default_factory=asyncio.Event)
    finished: bool = False
    text: str = ""
    output_ids: list[int] = field(default_factory=list)
    meta_info: Optional[dict[str, Any]] = None  # of the latest output
    last_output_offset: int = 0
    logprobs: dict[str, list] = field(default_factory=lambda: defaultdict(list))
    metric_tokens: int = 0  # completion tokens already counted by --enable-metrics
    metric_last_time: float | None = None
    dash_tokens: int = 0  # completion tokens already counted by DashboardStats
    dash_last_time: float | None = None
    # The rid the client sent, when this is one of its batch / n > 1 sub-requests (which
    # run as rid_0, rid_1, ...): /abort_request with that rid aborts them all.
    parent_rid: str | None = None
    embedding: Optional[list[float]] = None  # an embedding request's output

    @property
    def is_embedding(self) -> bool:
        return isinstance(self.obj, EmbeddingReqInput)

    def add_embedding_output(
        self, recv: BatchEmbeddingOutput, i: int, weight_version: Optional[str]
    ) -> dict[str, Any]:
        """Fold in entry i of `recv` (the request's only, final output), wake the consumer
        and return the meta_info (SGLang's keys for an embedding: no completion counts)."""
        self.embedding = recv.embeddings[i]
        meta: dict[str, Any] = {
            "id": recv.rids[i],
            "finish_reason": recv.finished_reasons[i],
            "prompt_tokens": recv.prompt_tokens[i],
            "weight_version": weight_version,
        }
        self.finished = True
        meta["e2e_latency"] = time.time() - self.created_time
        self.meta_info = meta
        self.event.set()
        return meta

    def add_output(
        self, recv: BatchStrOutput, i: int, weight_version: Optional[str], tokenizer: Any
    ) -> dict[str, Any]:
        """Fold in entry i of `recv` (this request's), wake the consumer and return the new
        meta_info. `tokenizer` (None without one) decodes logprob token texts."""
        self.text += recv.output_strs[i]
        self.output_ids.extend(recv.output_ids[i])
        meta: dict[str, Any] = {
            "id": recv.rids[i],
            "finish_reason": recv.finished_reasons[i],
            "prompt_tokens": recv.prompt_tokens[i],
            "weight_version": weight_version,
        }
        if self.obj.return_logprob and recv.output_token_logprobs_val is not None:
            self._add_logprobs(meta, recv, i, tokenizer)
        meta["completion_tokens"] = recv.completion_tokens[i]
        meta["cached_tokens"] = recv.cached_tokens[i]
        if recv.finished_reasons[i] is not None:
            self.finished = True
            meta["e2e_latency"] = time.time() - self.created_time
        self.meta_info = meta
        self.event.set()
        return meta

    def _add_logprobs(
        self, meta: dict[str, Any], recv: BatchStrOutput, i: int, tokenizer: Any
    ) -> None:
        obj = self.obj
        with_text = bool(obj.return_text_in_logprobs) and tokenizer is not None

        def triples(vals: list, idxs: list) -> list:
            texts = tokenizer.batch_decode([[t] for t in idxs]) if with_text else [None] * len(idxs)
            return [[v, tok, t] for v, tok, t in zip(vals, idxs, texts)]

        for out_key, val_key, idx_key, nested in _LOGPROB_KINDS:
            if nested and out_key.endswith("top_logprobs") and not obj.top_logprobs_num:
                continue
            if nested and "token_ids" in out_key and obj.token_ids_logprob is None:
                continue
            vals, idxs = getattr(recv, val_key), getattr(recv, idx_key)
            if vals is not None:
                self.logprobs[val_key].extend(vals[i])
                self.logprobs[idx_key].extend(idxs[i])
            all_vals, all_idxs = self.logprobs[val_key], self.logprobs[idx_key]
            if nested:
                meta[out_key] = [
                    None if v is None else triples(v, ix) for v, ix in zip(all_vals, all_idxs)
                ]
            else:
                # A prompt's first token has no logprob: the scheduler sends it as None.
                meta[out_key] = triples(all_vals, all_idxs)

    def take_output(self, with_text: bool) -> dict[str, Any]:
        """The client's output for the latest state; clears ``event``. A stream event
        carries the output ids new since the previous event the client got (0.5.4; counted
        here, when taken, so events merged by a slow consumer lose nothing); otherwise all."""
        self.event.clear()
        if self.is_embedding:
            return {"embedding": self.embedding, "meta_info": self.meta_info}
        if self.obj.stream:
            ids = self.output_ids[self.last_output_offset :]
            self.last_output_offset = len(self.output_ids)
        else:
            ids = list(self.output_ids)
        out: dict[str, Any] = {"text": self.text} if with_text else {}
        out["output_ids"] = ids
        out["meta_info"] = self.meta_info
        return out
