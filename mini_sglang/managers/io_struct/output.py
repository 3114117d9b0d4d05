"""Per-step outputs: scheduler -> detokenizer -> TokenizerManager (SGLang's names)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass(kw_only=True)
class LogprobLists:
    """Per-request logprob lists shared by BatchTokenIDOutput and BatchStrOutput (keyword
    fields, None unless some request in the batch asked for logprobs)."""

    input_token_logprobs_val: Optional[list[list[float]]] = None
    input_token_logprobs_idx: Optional[list[list[int]]] = None
    output_token_logprobs_val: Optional[list[list[float]]] = None
    output_token_logprobs_idx: Optional[list[list[int]]] = None
    input_top_logprobs_val: Optional[list[list]] = None
    input_top_logprobs_idx: Optional[list[list]] = None
    output_top_logprobs_val: Optional[list[list]] = None
    output_top_logprobs_idx: Optional[list[list]] = None
    input_token_ids_logprobs_val: Optional[list[list]] = None
    input_token_ids_logprobs_idx: Optional[list[list]] = None
    output_token_ids_logprobs_val: Optional[list[list]] = None
    output_token_ids_logprobs_idx: Optional[list[list]] = None
    output_hidden_states: Optional[list[list[float]]] = None


# The logprob list fields, in order (the scheduler streams each one's new entries).
LOGPROB_FIELDS: tuple[str, ...] = tuple(
    name for name in LogprobLists.__dataclass_fields__ if name != "output_hidden_states"
)


@dataclass
class BatchTokenIDOutput(LogprobLists):
    """Scheduler -> detokenizer: one entry per request that has something to send.

    Incremental-detokenization inputs (see incremental_detok.py): ``decode_ids[i]`` are the
    ids *new since the last message* for request i (the first message also carries up to 5
    prompt ids before the output, as surrounding context); ``read_offsets[i]`` is where the
    output starts inside that first chunk; ``decoded_texts[i]`` is text decoded elsewhere
    (normally ""). ``output_ids[i]`` are the new output ids for the client (0.5.4 streams
    deltas). ``finished_reasons[i]`` is a ``FINISH_*.to_json()`` dict, or None while running.
    ``completion_tokens`` counts all output ids so far, the matched stop token included.
    Logprob lists are None unless some request in the batch asked for logprobs; then each
    holds one (possibly empty) list per request, covering only what is new.
    ``stop_strs`` (a mini-sglang addition, optional) lets the detokenizer hold back a
    streamed tail that might become a stop string.
    """

    rids: list[str]
    finished_reasons: list[Optional[dict[str, Any]]]
    decoded_texts: list[str]
    decode_ids: list[list[int]]
    read_offsets: list[int]
    output_ids: Optional[list[list[int]]]
    skip_special_tokens: list[bool]
    spaces_between_special_tokens: list[bool]
    no_stop_trim: list[bool]
    prompt_tokens: list[int]
    completion_tokens: list[int]
    cached_tokens: list[int]
    stop_strs: Optional[list[Optional[list[str]]]] = None
    http_worker_ipcs: Optional[list[Optional[str]]] = None


# Fields BatchStrOutput copies unchanged from BatchTokenIDOutput.
PASSTHROUGH_FIELDS: tuple[str, ...] = (
    "rids",
    "finished_reasons",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    *LOGPROB_FIELDS,
    "output_hidden_states",
    "http_worker_ipcs",
)


@dataclass
class BatchStrOutput(LogprobLists):
    """Detokenizer -> TokenizerManager: ``output_strs[i]`` is the *new* text of request i
    (the TokenizerManager appends it to build SGLang's cumulative ``text``); ``output_ids[i]``
    the new output ids. Other fields are copied from the ``BatchTokenIDOutput``.
    """

    rids: list[str]
    finished_reasons: list[Optional[dict[str, Any]]]
    output_strs: list[str]
    output_ids: Optional[list[list[int]]]
    prompt_tokens: list[int]
    completion_tokens: list[int]
    cached_tokens: list[int]
    http_worker_ipcs: Optional[list[Optional[str]]] = None


@dataclass
class BatchEmbeddingOutput:
    """Scheduler -> detokenizer -> TokenizerManager (passed on unchanged): finished
    embedding requests. ``embeddings[i]`` is request i's vector (scores for a classifier),
    None for a request that ended without one (an abort)."""

    rids: list[str]
    finished_reasons: list[Optional[dict[str, Any]]]
    embeddings: list[Optional[list[float]]]
    prompt_tokens: list[int]
    cached_tokens: list[int]
    http_worker_ipcs: Optional[list[Optional[str]]] = None
