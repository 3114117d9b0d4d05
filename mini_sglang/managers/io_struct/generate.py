"""Generate and embedding requests (SGLang 0.5.4's ``io_struct`` names).

Flow: HTTP body -> ``GenerateReqInput`` (TokenizerManager) -> ``TokenizedGenerateReqInput``
(scheduler); the outputs that come back are in ``io_struct.output``. Everything here is a
plain dataclass of builtins (and ``SamplingParams``) so it pickles across ZMQ.
"""

from __future__ import annotations

import copy
import dataclasses
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from mini_sglang.sampling.sampling_params import SamplingParams
from mini_sglang.utils.dataclass_validation import validate_dataclass

# Upper bound of the `n` sampling param. SGLang has none, but a batch is expanded into n
# sub-request objects up front, so n = 2**31 exhausted the HTTP process's memory.
MAX_PARALLEL_SAMPLES = 1024

# Per-request fields that may be given once for the whole batch or as a list (one entry per
# prompt), with their defaults; normalize_batch_and_arguments broadcasts them.
_PER_REQUEST_FIELDS: dict[str, Any] = {
    "sampling_params": None,  # {} per request; a fresh dict each, so edits do not alias
    "return_logprob": False,
    "logprob_start_len": -1,
    "top_logprobs_num": 0,
    "return_hidden_states": False,
    "lora_path": None,
    "custom_logit_processor": None,
    "extra_key": None,
}


@dataclass
class GenerateReqInput:
    """A /generate request body: one prompt or a batch (SGLang's fields and defaults).

    Call ``normalize_batch_and_arguments()`` once before use. Afterwards:
    - ``is_single`` is True for one prompt with n == 1; then every field is a scalar and
      ``rid`` is set (``uuid4().hex`` unless given).
    - otherwise the request is a batch of ``len(self)`` sub-requests == ``batch_size``
      prompts x ``parallel_sample_num`` (the ``n`` sampling param), ordered prompt-major
      (sub-request k uses prompt k // n, as SGLang returns them), every per-request field is
      a list of that length, and ``self[k]`` is the k-th single sub-request.
      ``parent_rids[k]`` is the rid the client gave that sub-request k's rid derives from
      ("x" for x_0, x_1, ...; None for a rid given as is or generated).
    Raises ValueError with SGLang's messages on bad input; an empty rid is refused (a
    client's rid must name its own requests only).
    """

    text: Optional[Union[list[str], str]] = None
    input_ids: Optional[Union[list[list[int]], list[int]]] = None
    input_embeds: Optional[Union[list[list[list[float]]], list[list[float]]]] = None
    image_data: Optional[Any] = None
    video_data: Optional[Any] = None
    audio_data: Optional[Any] = None
    sampling_params: Optional[Union[list[dict], dict]] = None
    rid: Optional[Union[list[str], str]] = None
    return_logprob: Optional[Union[list[bool], bool]] = None
    # -1: logprobs of output tokens only; k: prompt positions from k on.
    logprob_start_len: Optional[Union[list[int], int]] = None
    top_logprobs_num: Optional[Union[list[int], int]] = None
    token_ids_logprob: Optional[Union[list[list[int]], list[int]]] = None
    return_text_in_logprobs: bool = False
    stream: bool = False
    log_metrics: bool = True
    return_hidden_states: Union[list[bool], bool] = False
    modalities: Optional[list[str]] = None
    session_params: Optional[Union[list[dict], dict]] = None
    lora_path: Optional[Union[list[Optional[str]], str]] = None
    lora_id: Optional[Union[list[Optional[str]], str]] = None
    custom_logit_processor: Optional[Union[list[Optional[str]], str]] = None
    bootstrap_host: Optional[Union[list[str], str]] = None
    bootstrap_port: Optional[Union[list[Optional[int]], int]] = None
    bootstrap_room: Optional[Union[list[int], int]] = None
    bootstrap_pair_key: Optional[Union[list[str], str]] = None
    data_parallel_rank: Optional[int] = None
    background: bool = False
    conversation_id: Optional[str] = None
    priority: Optional[int] = None
    extra_key: Optional[Union[list[str], str]] = None
    no_logs: bool = False
    custom_labels: Optional[dict[str, str]] = None
    return_bytes: bool = False
    return_entropy: bool = False
    http_worker_ipc: Optional[str] = None

    # Set by normalize_batch_and_arguments (not part of the JSON body).
    is_single: bool = field(default=True, init=False)
    batch_size: int = field(default=1, init=False)
    parallel_sample_num: int = field(default=1, init=False)
    parent_rids: list[Optional[str]] = field(default_factory=list, init=False)

    @classmethod
    def from_json_dict(cls, d: dict[str, Any]) -> GenerateReqInput:
        """Build from a parsed JSON body, ignoring unknown top-level keys (SGLang 0.5.23).

        Field types are checked as SGLang's pydantic does (BodyValidationError): an
        ill-typed value such as a nested token_ids_logprob for one prompt or a string
        top_logprobs_num must never reach the scheduler."""
        if not isinstance(d, dict):
            raise ValueError("The request body must be a JSON object.")
        # http_worker_ipc is routing state set by the server, never by a client.
        names = {f.name for f in dataclasses.fields(cls) if f.init} - {"http_worker_ipc"}
        return validate_dataclass(cls, {k: v for k, v in d.items() if k in names})

    # ------------------------------------------------------------------ normalisation
    def normalize_batch_and_arguments(self) -> None:
        """Validate the inputs, decide single vs batch, expand ``n`` and fill defaults."""
        given = [x is not None for x in (self.text, self.input_ids, self.input_embeds)]
        # SGLang refuses none or all three. With text and input_ids the ids are the prompt and
        # the text is kept as its input text; input_embeds beside either is dropped.
        if not any(given) or all(given):
            raise ValueError("Either text, input_ids or input_embeds should be provided.")
        if self.text is not None or self.input_ids is not None:
            self.input_embeds = None
        self._determine_batch_size()
        self._determine_parallel_sample_num()
        if self.is_single:
            self._normalize_single()
        else:
            self._normalize_batch()

    def _determine_batch_size(self) -> None:
        if self.text is not None:
            if isinstance(self.text, str):
                self.is_single, self.batch_size = True, 1
            elif isinstance(self.text, list) and all(isinstance(t, str) for t in self.text):
                if not self.text:
                    raise ValueError("text cannot be an empty list.")
                self.is_single, self.batch_size = False, len(self.text)
            else:
                raise ValueError("text should be a string or a list of strings.")
        elif self.input_ids is not None:
            if not isinstance(self.input_ids, list):
                raise ValueError("input_ids should be a list of integers or a list of lists.")
            if len(self.input_ids) == 0:
                raise ValueError("input_ids cannot be empty.")
            if isinstance(self.input_ids[0], int):
                self.is_single, self.batch_size = True, 1
            else:
                if any(not isinstance(ids, list) or not ids for ids in self.input_ids):
                    raise ValueError("input_ids cannot be empty.")
                self.is_single, self.batch_size = False, len(self.input_ids)
        else:
            embeds = self.input_embeds
            if not embeds or not embeds[0]:  # type: ignore[index]
                raise ValueError("input_embeds cannot be empty.")
            if isinstance(embeds[0][0], (int, float)):  # type: ignore[index]
                self.is_single, self.batch_size = True, 1
            else:
                self.is_single, self.batch_size = False, len(embeds)  # type: ignore[arg-type]

    def _determine_parallel_sample_num(self) -> None:
        sp = self.sampling_params
        if sp is None:
            n = 1
        elif isinstance(sp, dict):
            n = sp.get("n", 1)
        elif isinstance(sp, list) and sp and all(isinstance(p, dict) for p in sp):
            n = sp[0].get("n", 1)
            if any(p.get("n", 1) != n for p in sp):
                raise ValueError(
                    "The parallel_sample_num should be the same for all samples in sample params."
                )
        else:
            raise ValueError("sampling_params should be a dict or a list of dicts.")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"n must be at least 1, got {n}.")
        if n > MAX_PARALLEL_SAMPLES:
            raise ValueError(f"n must be at most {MAX_PARALLEL_SAMPLES}, got {n}.")
        self.parallel_sample_num = n
        if n > 1 and self.is_single:
            # One prompt sampled n times is a batch of n (SGLang).
            self.is_single = False
            if self.text is not None:
                self.text = [self.text]  # type: ignore[list-item]
            if self.input_ids is not None:
                self.input_ids = [self.input_ids]  # type: ignore[list-item]
            if self.input_embeds is not None:
                self.input_embeds = [self.input_embeds]  # type: ignore[list-item]

    def _normalize_single(self) -> None:
        if self.sampling_params is None:
            self.sampling_params = {}
        elif not isinstance(self.sampling_params, dict):
            raise ValueError("sampling_params should be a dict for a single request.")
        if self.rid is None:
            self.rid = uuid.uuid4().hex
        elif not isinstance(self.rid, str):  # a list would be an unhashable request key
            raise ValueError("The rid should be a string for a single request.")
        _check_not_empty(self.rid)
        self.parent_rids = [None]
        for name in ("return_logprob", "logprob_start_len", "top_logprobs_num"):
            if isinstance(getattr(self, name), list):  # the scheduler compares them to ints
                raise ValueError(f"{name} should be a single value for a single request.")
        if self.return_logprob is None:
            self.return_logprob = False
        if self.logprob_start_len is None:
            self.logprob_start_len = -1
        if self.top_logprobs_num is None:
            self.top_logprobs_num = 0
        if not self.token_ids_logprob:  # None and [] both mean "none"
            self.token_ids_logprob = None

    def _normalize_batch(self) -> None:
        for name in ("text", "input_ids", "input_embeds"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, self._per_prompt_to_expanded(value))
        self._expand_rids()
        if isinstance(self.custom_logit_processor, list) and self.parallel_sample_num > 1:
            raise ValueError("Cannot use list custom_logit_processor with parallel_sample_num > 1")
        for name, default in _PER_REQUEST_FIELDS.items():
            self._expand_per_request_field(name, default)
        self.sampling_params = [{} if p is None else p for p in self.sampling_params]  # type: ignore[union-attr]
        self._expand_token_ids_logprob()
        for name in ("image_data", "video_data", "audio_data"):
            value = getattr(self, name)
            if value is None or value == []:
                setattr(self, name, [None] * len(self))
            elif isinstance(value, list) and len(value) == self.batch_size:
                setattr(self, name, self._per_prompt_to_expanded(value))
            else:
                setattr(self, name, [copy.deepcopy(value) for _ in range(len(self))])

    def _per_prompt_to_expanded(self, values: list[Any]) -> list[Any]:
        """One (deep-copied) entry per sub-request from one per prompt, prompt-major:
        batch_size=2, n=3, values=[a, b] -> [a, a, a, b, b, b]."""
        n = self.parallel_sample_num
        return [copy.deepcopy(values[k // n]) for k in range(len(self))]

    def _expand_rids(self) -> None:
        # none -> a fresh uuid per sub-request; "x" -> x_0, x_1, ... (SGLang); a list needs
        # one rid per prompt, and with n > 1 each gets a _j suffix. parent_rids records the
        # client's rid that each derived rid came from.
        bs, n, num = self.batch_size, self.parallel_sample_num, len(self)
        if self.rid is None:
            self.rid = [uuid.uuid4().hex for _ in range(num)]
            self.parent_rids = [None] * num
        elif isinstance(self.rid, str):
            _check_not_empty(self.rid)
            self.parent_rids = [self.rid] * num
            self.rid = [f"{self.rid}_{k}" for k in range(num)]
        elif isinstance(self.rid, list):
            if len(self.rid) != bs:
                raise ValueError(
                    "The specified rids length mismatch with the batch_size for batch processing."
                )
            for rid in self.rid:
                _check_not_empty(rid)
            if n == 1:
                self.rid, self.parent_rids = list(self.rid), [None] * num
            else:
                self.parent_rids = [self.rid[k // n] for k in range(num)]
                self.rid = [f"{self.rid[k // n]}_{k % n}" for k in range(num)]
        else:
            raise ValueError("The rid should be a string or a list of strings.")

    def _expand_per_request_field(self, name: str, default: Any) -> None:
        # A list has one value per prompt; anything else is shared by every sub-request.
        value = getattr(self, name)
        if value is None:
            value = default
        if not isinstance(value, list):
            setattr(self, name, [copy.deepcopy(value) for _ in range(len(self))])
            return
        if len(value) != self.batch_size:
            raise ValueError(
                f"The length of {name} ({len(value)}) should be equal to the batch "
                f"size ({self.batch_size})."
            )
        setattr(self, name, self._per_prompt_to_expanded(value))

    def _expand_token_ids_logprob(self) -> None:
        # token_ids_logprob is itself a list: a flat list is shared, a nested one is per prompt.
        til, num = self.token_ids_logprob, len(self)
        if not til:
            self.token_ids_logprob = [None] * num
        elif isinstance(til[0], list):
            if len(til) != self.batch_size:
                raise ValueError(
                    f"The length of token_ids_logprob ({len(til)}) should be equal to the "
                    f"batch size ({self.batch_size})."
                )
            self.token_ids_logprob = self._per_prompt_to_expanded([t or None for t in til])
        else:
            self.token_ids_logprob = [list(til) for _ in range(num)]

    # ------------------------------------------------------------------ access
    def __len__(self) -> int:
        """Number of sub-requests (1 when single)."""
        return 1 if self.is_single else self.batch_size * self.parallel_sample_num

    def __getitem__(self, i: int) -> GenerateReqInput:
        """The i-th sub-request of a normalised batch, as a normalised single request."""
        if self.is_single:
            if i not in (0, -1):
                raise IndexError(i)
            return self
        if not -len(self) <= i < len(self):
            raise IndexError(i)

        def pick(value: Any) -> Any:
            return value[i] if isinstance(value, list) else value

        sub = GenerateReqInput(
            text=self.text[i] if self.text is not None else None,
            input_ids=self.input_ids[i] if self.input_ids is not None else None,  # type: ignore[arg-type]
            input_embeds=self.input_embeds[i] if self.input_embeds is not None else None,  # type: ignore[arg-type]
            image_data=pick(self.image_data),
            video_data=pick(self.video_data),
            audio_data=pick(self.audio_data),
            sampling_params=self.sampling_params[i],  # type: ignore[index]
            rid=self.rid[i],  # type: ignore[index]
            return_logprob=self.return_logprob[i],  # type: ignore[index]
            logprob_start_len=self.logprob_start_len[i],  # type: ignore[index]
            top_logprobs_num=self.top_logprobs_num[i],  # type: ignore[index]
            token_ids_logprob=self.token_ids_logprob[i],  # type: ignore[index]
            return_text_in_logprobs=self.return_text_in_logprobs,
            stream=self.stream,
            log_metrics=self.log_metrics,
            return_hidden_states=pick(self.return_hidden_states),
            modalities=pick(self.modalities),
            session_params=(
                self.session_params[i]  # type: ignore[index]
                if isinstance(self.session_params, list)
                else self.session_params
            ),
            lora_path=pick(self.lora_path),
            lora_id=pick(self.lora_id),
            custom_logit_processor=pick(self.custom_logit_processor),
            bootstrap_host=pick(self.bootstrap_host),
            bootstrap_port=pick(self.bootstrap_port),
            bootstrap_room=pick(self.bootstrap_room),
            bootstrap_pair_key=pick(self.bootstrap_pair_key),
            data_parallel_rank=self.data_parallel_rank,
            background=self.background,
            conversation_id=self.conversation_id,
            priority=self.priority,
            extra_key=pick(self.extra_key),
            no_logs=self.no_logs,
            custom_labels=self.custom_labels,
            return_bytes=self.return_bytes,
            return_entropy=self.return_entropy,
            http_worker_ipc=self.http_worker_ipc,
        )
        sub.is_single, sub.batch_size, sub.parallel_sample_num = True, 1, 1
        return sub

    def regenerate_rid(self) -> str | list[str]:
        """Give this request fresh uuid4 rid(s) and return them (SGLang's BaseReq helper)."""
        if isinstance(self.rid, list):
            self.rid = [uuid.uuid4().hex for _ in self.rid]
        else:
            self.rid = uuid.uuid4().hex
        return self.rid


def _check_not_empty(rid: Any) -> None:
    if rid == "":
        raise ValueError("The rid should be a non-empty string.")


@dataclass
class TokenizedGenerateReqInput:
    """One tokenized request, TokenizerManager -> scheduler.

    ``sampling_params`` is already normalised and verified. ``logprob_start_len`` is as sent
    by the client (-1 = output tokens only); the scheduler resolves -1 to len(input_ids) - 1.
    ``input_embeds`` (a float32 [len(input_ids), hidden] tensor) replaces the embeddings of
    the prompt positions; its input_ids are then SGLang's stand-in 1s.
    ``mm_inputs`` (a multimodal processor's output dict: mm_items, im_token_id, mrope_*;
    see multimodal/mm_inputs.py) comes with prompts that hold images; input_ids then hold
    each image's placeholder tokens, expanded to its feature count and not yet padded.
    """

    rid: str
    input_text: str
    input_ids: list[int]
    sampling_params: SamplingParams
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    token_ids_logprob: Optional[list[int]] = None
    stream: bool = False
    mm_inputs: Optional[dict] = None
    return_hidden_states: bool = False
    input_embeds: Any = None  # torch.Tensor | None
    session_params: Optional[dict] = None
    lora_id: Optional[str] = None
    custom_logit_processor: Optional[str] = None
    data_parallel_rank: Optional[int] = None
    priority: Optional[int] = None
    extra_key: Optional[str] = None
    no_logs: bool = False
    return_entropy: bool = False
    http_worker_ipc: Optional[str] = None


@dataclass
class BatchTokenizedGenerateReqInput:
    """Several tokenized requests sent in one message (SGLang's batch tokenization path)."""

    batch: list[TokenizedGenerateReqInput]

    def __len__(self) -> int:
        return len(self.batch)

    def __getitem__(self, i: int) -> TokenizedGenerateReqInput:
        return self.batch[i]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self.batch)


# The most inputs one /encode, /classify or /v1/embeddings request may carry.
MAX_EMBEDDING_BATCH_SIZE = 2048


@dataclass
class EmbeddingReqInput:
    """An /encode, /classify or /v1/embeddings request: one input or a batch (SGLang's
    fields; ``sampling_params`` and ``input_embeds`` are its dummies, ignored).

    Call ``normalize_batch_and_arguments()`` once before use. Afterwards ``is_single`` tells
    one input from a batch of ``batch_size``; ``rid`` is a string (single) or one string per
    input, and ``self[i]`` is input i as a single request. Raises ValueError with SGLang's
    messages for a missing or doubled input, and a clear message for ill-typed or empty
    inputs or more than MAX_EMBEDDING_BATCH_SIZE of them, so nothing malformed reaches the
    scheduler.

    With ``is_cross_encoder_request`` (SGLang's /v1/rerank path) ``text`` is a list of
    [query, document] pairs, a batch of one input per pair: each is tokenized as a text
    pair (with token types where the tokenizer makes them) and scored by a cross-encoder.
    """

    text: Optional[Union[list[list[str]], list[str], str]] = None
    image_data: Optional[Any] = None
    input_ids: Optional[Union[list[list[int]], list[int]]] = None
    rid: Optional[Union[list[str], str]] = None
    sampling_params: Optional[Union[list[dict], dict]] = None
    input_embeds: Optional[Any] = None
    log_metrics: bool = True
    priority: Optional[int] = None
    data_parallel_rank: Optional[int] = None
    is_cross_encoder_request: bool = False

    is_single: bool = field(default=True, init=False)
    batch_size: int = field(default=1, init=False)

    def normalize_batch_and_arguments(self) -> None:
        if self.text is None and self.input_ids is None and self.image_data is None:
            raise ValueError("At least one of text, input_ids, or image should be provided")
        if self.text is not None and self.input_ids is not None:
            raise ValueError("text and input_ids cannot be provided at the same time")
        if self.text is None and self.input_ids is None:
            raise ValueError("Image inputs are not supported; give text or input_ids.")
        if self.text is not None:
            self._check_text()
        else:
            self._check_input_ids()
        if self.batch_size > MAX_EMBEDDING_BATCH_SIZE:
            raise ValueError(
                f"The request has {self.batch_size} inputs; at most "
                f"{MAX_EMBEDDING_BATCH_SIZE} are allowed."
            )
        self._normalize_rids()

    def _normalize_rids(self) -> None:
        if self.is_single:
            if self.rid is None:
                self.rid = uuid.uuid4().hex
            elif not isinstance(self.rid, str):
                raise ValueError("The rid should be a string for a single request.")
            _check_not_empty(self.rid)
            return
        if self.rid is None:
            self.rid = [uuid.uuid4().hex for _ in range(self.batch_size)]
        elif isinstance(self.rid, str):
            _check_not_empty(self.rid)
            self.rid = [f"{self.rid}_{k}" for k in range(self.batch_size)]
        elif len(self.rid) != self.batch_size:
            raise ValueError(
                "The specified rids length mismatch with the batch_size for batch processing."
            )
        else:
            for rid in self.rid:
                _check_not_empty(rid)

    def _check_text(self) -> None:
        if self.is_cross_encoder_request:
            self._check_text_pairs()
            return
        if isinstance(self.text, str):
            self.is_single, self.batch_size = True, 1
            return
        if not isinstance(self.text, list) or not self.text:
            raise ValueError("text should be a non-empty string or list of strings.")
        if not all(isinstance(t, str) for t in self.text):
            raise ValueError("text should be a string or a list of strings.")
        self.is_single, self.batch_size = False, len(self.text)

    def _check_text_pairs(self) -> None:
        pairs = self.text
        if (
            not isinstance(pairs, list)
            or not pairs
            or not all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(t, str) for t in p)
                for p in pairs
            )
        ):
            raise ValueError(
                "A cross-encoder request's text should be a list of [query, document] pairs."
            )
        self.is_single, self.batch_size = False, len(pairs)

    def _check_input_ids(self) -> None:
        ids = self.input_ids
        if not isinstance(ids, list) or not ids:
            raise ValueError("input_ids cannot be empty.")
        if all(_is_token_id(t) for t in ids):
            self.is_single, self.batch_size = True, 1
            return
        for item in ids:
            if not isinstance(item, list) or not item:
                raise ValueError("input_ids cannot be empty.")
            if not all(_is_token_id(t) for t in item):
                raise ValueError("input_ids should be a list of integers or a list of lists.")
        self.is_single, self.batch_size = False, len(ids)

    def __len__(self) -> int:
        return self.batch_size

    def __getitem__(self, i: int) -> EmbeddingReqInput:
        """Input i of a normalised request, as a normalised single request (for a
        cross-encoder request: its pair i as ``text``)."""
        if self.is_single:
            return self
        sub = EmbeddingReqInput(
            text=self.text[i] if self.text is not None else None,  # type: ignore[arg-type]
            input_ids=self.input_ids[i] if self.input_ids is not None else None,  # type: ignore[arg-type]
            rid=self.rid[i],  # type: ignore[index]
            log_metrics=self.log_metrics,
            priority=self.priority,
            data_parallel_rank=self.data_parallel_rank,
            is_cross_encoder_request=self.is_cross_encoder_request,
        )
        sub.is_single, sub.batch_size = True, 1
        return sub

    # GenerateReqInput's fields that the TokenizerManager reads from any request.
    stream = False
    return_logprob = False
    parallel_sample_num = 1


def _is_token_id(t: Any) -> bool:
    return isinstance(t, int) and not isinstance(t, bool) and t >= 0


@dataclass
class TokenizedEmbeddingReqInput:
    """One tokenized embedding request, TokenizerManager -> scheduler. It runs as a
    prefill-only request (``sampling_params.max_new_tokens`` is 0); ``token_type_ids`` is
    for encoders that read them (None: all zeros)."""

    rid: str
    input_text: str
    input_ids: list[int]
    sampling_params: SamplingParams
    token_type_ids: Optional[list[int]] = None
    data_parallel_rank: Optional[int] = None
    priority: Optional[int] = None
    http_worker_ipc: Optional[str] = None
