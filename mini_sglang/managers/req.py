"""Req: one request's state inside the scheduler.

Lengths (the invariant every step keeps):
  len(prefix_indices)  tokens whose KV is already in the pool (cached prefix, earlier chunks)
  len(fill_ids)        tokens whose KV exists after this step's forward
  extend_input_len     = len(fill_ids) - len(prefix_indices), the tokens computed now
and len(prefix_indices) <= len(fill_ids) <= len(origin_input_ids) + max_new_tokens.
SGLang's names are kept (extend_input_len, cached_tokens) so its logic reads across.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import torch

from mini_sglang.managers.finish_reason import (
    FINISH_ABORT,
    FINISH_LENGTH,
    FINISH_MATCHED_STR,
    FINISH_MATCHED_TOKEN,
    FINISHED_MATCHED_REGEX,
    BaseFinishReason,
)
from mini_sglang.sampling.sampling_batch_info import NO_SEED

if TYPE_CHECKING:
    from mini_sglang.mem_cache.base_prefix_cache import BasePrefixCache
    from mini_sglang.multimodal.mm_inputs import MultimodalInputs
    from mini_sglang.sampling.sampling_params import SamplingParams


class Req:
    def __init__(
        self,
        rid: str,
        origin_input_text: str,
        origin_input_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_ids: set[int] | None = None,
        vocab_size: int = 0,
        return_logprob: bool = False,
        logprob_start_len: int = -1,
        top_logprobs_num: int = 0,
        token_ids_logprob: list[int] | None = None,
        stream: bool = False,
        sampling_seed: int = NO_SEED,
        custom_logit_processor: str | None = None,
        input_embeds: torch.Tensor | None = None,
        multimodal_inputs: MultimodalInputs | None = None,
        origin_input_ids_unpadded: list[int] | None = None,
    ) -> None:
        self.rid = rid
        self.origin_input_text = origin_input_text
        # With images, origin_input_ids hold each image's pad values (the radix key; they
        # may lie outside the vocabulary) and origin_input_ids_unpadded the placeholder
        # token ids at the same positions (for detokenization, penalties and logprobs).
        self.origin_input_ids = list(origin_input_ids)
        self.origin_input_ids_unpadded = (
            self.origin_input_ids
            if origin_input_ids_unpadded is None
            else list(origin_input_ids_unpadded)
        )
        self.multimodal_inputs = multimodal_inputs
        self.sampling_params = sampling_params
        self.eos_token_ids = eos_token_ids or set()
        self.vocab_size = vocab_size
        self.stream = stream
        self.sampling_seed = sampling_seed
        # A CustomLogitProcessor.to_str() string, and what its calls get for this request:
        # custom_params plus "__req__" (this Req), as SGLang passes them; only set with a
        # processor (the dict and the Req refer to each other).
        self.custom_logit_processor = custom_logit_processor
        self.custom_params = sampling_params.custom_params
        if custom_logit_processor and isinstance(self.custom_params, dict):
            self.custom_params = {**self.custom_params, "__req__": self}
        self.output_ids: list[int] = []
        self.fill_ids: list[int] = []
        # The prompt's embeddings ([len(origin_input_ids), hidden], CPU), used instead of
        # the embedding table at prompt positions; None for a prompt of token ids.
        self.input_embeds = input_embeds
        # An embedding request (TokenizedEmbeddingReqInput): prefill only, and its output is
        # `embedding` (its pooled row, a list of floats, set when its last chunk ran).
        self.is_embedding = False
        self.embedding: list[float] | None = None
        self.token_type_ids: list[int] | None = None
        # Memory
        self.req_pool_idx: int | None = None
        self.prefix_indices: torch.Tensor = torch.empty((0,), dtype=torch.int64)
        self.last_node: Any = None
        self.extend_input_len = 0
        self.is_chunked = 0  # > 0 while a prefill chunk of this request is in flight
        self.cached_tokens = 0
        self.already_computed = 0  # prompt tokens counted into cached_tokens so far
        # Structured output: the matcher (a Future while it compiles) and its cache key.
        self.grammar: Any = None
        self.grammar_key: tuple[str, str] | None = None
        # Finish
        self.finished_reason: BaseFinishReason | None = None
        self.to_abort = False
        self.to_abort_message: str | None = None
        self.to_abort_status: tuple[int, str] | None = None  # (HTTP status, error type)
        # Streaming / detokenization bookkeeping
        self.send_token_offset = 0  # output ids already streamed
        self.sent_final = False  # the finishing message went out
        self.logprob_sent: dict[str, int] = {}  # per logprob list, entries already streamed
        self.read_offset: int | None = None  # context ids in the first message; None: unsent
        # Logprobs
        self.return_logprob = return_logprob
        self.logprob_start_len = logprob_start_len
        self.top_logprobs_num = top_logprobs_num
        self.token_ids_logprob = token_ids_logprob
        self.input_token_logprobs_val: list[float | None] = []
        self.input_token_logprobs_idx: list[int] = []
        self.input_top_logprobs_val: list = []
        self.input_top_logprobs_idx: list = []
        self.input_token_ids_logprobs_val: list = []
        self.input_token_ids_logprobs_idx: list = []
        self.output_token_logprobs_val: list[float] = []
        self.output_token_logprobs_idx: list[int] = []
        self.output_top_logprobs_val: list = []
        self.output_top_logprobs_idx: list = []
        self.output_token_ids_logprobs_val: list = []
        self.output_token_ids_logprobs_idx: list = []

    # ---- lengths -------------------------------------------------------------------
    def finished(self) -> bool:
        return self.finished_reason is not None

    def init_next_round_input(self, tree_cache: BasePrefixCache | None) -> None:
        """Set fill_ids and match the cached prefix (at most len - 1 tokens, so the last
        token is always recomputed and yields logits; with prompt logprobs, no further than
        logprob_start_len, since those positions need their logits)."""
        self.fill_ids = self.origin_input_ids + self.output_ids
        max_prefix_len = len(self.fill_ids) - 1
        if self.return_logprob:
            max_prefix_len = min(max_prefix_len, self.logprob_start_len)
        max_prefix_len = max(max_prefix_len, 0)
        if tree_cache is not None:
            match = tree_cache.match_prefix(self.fill_ids[:max_prefix_len])
            self.prefix_indices, self.last_node = match.device_indices, match.last_device_node
        self.extend_input_len = len(self.fill_ids) - len(self.prefix_indices)

    def reset_for_retract(self) -> None:
        self.prefix_indices = torch.empty((0,), dtype=torch.int64)
        self.last_node = None
        self.extend_input_len = 0
        self.is_chunked = 0
        self.req_pool_idx = None
        if self.multimodal_inputs is not None:
            self.multimodal_inputs.drop_feature_cache()

    # ---- finishing -----------------------------------------------------------------
    def tail_str(self, tokenizer) -> str:
        """The text of the last few output tokens, enough to hold any stop string or stop
        regex match (SGLang's window: the longest one in tokens + 2, since a match can
        straddle token boundaries)."""
        sp = self.sampling_params
        tail = max(sp.stop_str_max_len + 1, sp.stop_regex_max_len + 1) + 1
        return tokenizer.decode(self.output_ids[-tail:])

    def check_finished(self, tokenizer=None) -> None:
        """SGLang's order: abort, length, grammar terminated, EOS/stop token (unless ignore_eos), out-of-vocab
        token, stop string, stop regex (searched in the decoded tail of the output)."""
        if self.finished():
            return
        if self.to_abort:
            status, err_type = self.to_abort_status or (None, None)
            self.finished_reason = FINISH_ABORT(self.to_abort_message or "Abort", status, err_type)
            return
        sp = self.sampling_params
        if sp.max_new_tokens is not None and len(self.output_ids) >= sp.max_new_tokens:
            self.finished_reason = FINISH_LENGTH(length=sp.max_new_tokens)
            if sp.max_new_tokens == 0:
                # Prefill only: the token sampled from the prompt is not an output (SGLang
                # reports output_ids_through_stop == [] and completion_tokens 0), but the
                # next position's top_logprobs / token_ids_logprob stay: /v1/score reads them.
                self._drop_output_tokens()
            return
        if not self.output_ids:
            return
        last = self.output_ids[-1]
        if self.grammar is not None and self.grammar.is_terminated():
            # The grammar accepted its stop token: the constraint decides the end (SGLang).
            self.finished_reason = FINISH_MATCHED_TOKEN(matched=last)
            return
        if not sp.ignore_eos:
            stop_ids = sp.stop_token_ids or ()
            if last in stop_ids or last in self.eos_token_ids:
                self.finished_reason = FINISH_MATCHED_TOKEN(matched=last)
                return
        if last < 0 or (self.vocab_size and last >= self.vocab_size):
            self.finished_reason = FINISH_MATCHED_STR(matched="NaN happened")
            return
        if (sp.stop_strs or sp.stop_regex_strs) and tokenizer is not None:
            self.finished_reason = self._matched_stop_str(tokenizer)

    def _matched_stop_str(self, tokenizer) -> BaseFinishReason | None:
        """The first stop string, then stop regex, found in the output's decoded tail."""
        sp = self.sampling_params
        tail = self.tail_str(tokenizer)
        for stop in sp.stop_strs or ():
            if stop in tail:
                return FINISH_MATCHED_STR(matched=stop)
        for pattern in sp.stop_regex_strs or ():
            if re.search(pattern, tail):
                return FINISHED_MATCHED_REGEX(matched=pattern)
        return None

    def _drop_output_tokens(self) -> None:
        del self.output_ids[:]
        del self.output_token_logprobs_val[:]
        del self.output_token_logprobs_idx[:]

    def abort(self, message: str, status_code: int | None = None, err_type: str = "") -> None:
        """Finish at the next check_finished with an abort reason; `status_code` (e.g. 500
        for a request the scheduler failed to prepare) is the HTTP status the client gets."""
        self.to_abort = True
        self.to_abort_message = message
        if status_code is not None:
            self.to_abort_status = (status_code, err_type)

    def __repr__(self) -> str:
        return f"Req(rid={self.rid}, input_len={len(self.origin_input_ids)}, output_len={len(self.output_ids)})"
