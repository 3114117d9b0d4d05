"""Custom logit processors: client-sent Python that edits a request's logits (SGLang's
interface and wire format).

A client subclasses `CustomLogitProcessor`, implements `__call__(logits, custom_param_list)`
and sends `MyProcessor.to_str()` as the request's `custom_logit_processor`, with its
per-request `custom_params`. The string is the JSON `{"callable": "<hex of dill.dumps(cls)>"}`;
the server turns it back into the class with `CustomLogitProcessor.from_str` (cached per
distinct string) and calls an instance once per step on the rows of the requests that sent
it (sampling/custom_logit_batch.py).

Compatibility with SGLang's clients: dill pickles a class defined in `__main__` by value,
but its base classes by reference, so a processor made with SGLang's `to_str()` names
`sglang.srt.sampling.custom_logit_processor.CustomLogitProcessor`. SGLang is not installed
here: references into that module are resolved to this module (same class names), so such
a string loads. A processor that references any other sglang module does not.

Security: loading the string runs arbitrary code in the server process (unpickling, then the
processor itself). The server accepts processors only with --enable-custom-logit-processor.
"""

from __future__ import annotations

import io
import json
from abc import ABC, abstractmethod
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import dill
import orjson
import torch

if TYPE_CHECKING:
    from mini_sglang.managers.req import Req

# SGLang's module of this interface, as dill names it in a processor pickled by SGLang.
_SGLANG_MODULE = "sglang.srt.sampling.custom_logit_processor"
# Distinct processor strings kept deserialised (each holds a class; a server sees a few).
_CACHE_SIZE = 1024


class _Unpickler(dill.Unpickler):
    """dill's unpickler, resolving SGLang's processor module to this one."""

    def find_class(self, module: str, name: str) -> Any:
        if module == _SGLANG_MODULE:
            module = __name__
        return super().find_class(module, name)


@lru_cache(maxsize=_CACHE_SIZE)
def _cache_from_str(json_str: str) -> type:
    """The processor class a `to_str()` string holds (deserialised once per string)."""
    data = orjson.loads(json_str)
    if not isinstance(data, dict) or not isinstance(data.get("callable"), str):
        raise ValueError('expected a JSON object {"callable": "<hex>"}')
    cls = _Unpickler(io.BytesIO(bytes.fromhex(data["callable"]))).load()
    if not callable(cls):
        raise ValueError(f"the callable is a {type(cls).__name__}, not a class")
    return cls


class CustomLogitProcessor(ABC):
    """A batch-level logits hook (SGLang's interface).

    `__call__(logits, custom_param_list)` gets the [n, vocab] logits of the n rows that use
    this processor in the step (after penalties, the grammar mask and logit_bias, before
    temperature and sampling) and one entry per row: the request's `custom_params` dict
    with `"__req__"` (the scheduler's Req: origin_input_ids, output_ids, ...) added, or
    None when the request sent no custom_params. It returns the new [n, vocab] logits (it may
    edit and return `logits`).
    """

    @abstractmethod
    def __call__(
        self,
        logits: torch.Tensor,
        custom_param_list: list[dict[str, Any] | None] | None = None,
    ) -> torch.Tensor:
        raise NotImplementedError

    @classmethod
    def to_str(cls) -> str:
        """The wire form: `{"callable": "<hex of dill.dumps(cls)>"}`."""
        return json.dumps({"callable": dill.dumps(cls).hex()})

    @classmethod
    def from_str(cls, json_str: str) -> CustomLogitProcessor:
        """A new instance of the class `json_str` holds (the class is cached per string).
        Raises whatever decoding or unpickling raises on a bad string."""
        return _cache_from_str(json_str)()


class DisallowedTokensLogitsProcessor(CustomLogitProcessor):
    """Bans `custom_params["token_ids"]` (the same list for every row, as in SGLang)."""

    def __call__(self, logits, custom_param_list=None):
        token_ids = custom_param_list[0]["token_ids"]
        assert all(token_ids == p["token_ids"] for p in custom_param_list), custom_param_list
        logits[..., token_ids] = -float("inf")
        return logits


class ThinkingBudgetLogitProcessor(CustomLogitProcessor):
    """Ends a reasoning block after `custom_params["thinking_budget"]` tokens: once the
    budget since the thinking start token is spent, force a newline, then the end token.
    Subclasses give the model's token ids."""

    THINKING_START_TOKEN_ID: int
    THINKING_END_TOKEN_ID: int
    NEW_LINE_TOKEN_ID: int

    def __call__(self, logits, custom_param_list=None):
        for i, params in enumerate(custom_param_list or ()):
            budget = None if params is None else params.get("thinking_budget")
            if not isinstance(budget, int) or budget < 0:
                continue
            req: Req = params["__req__"]
            ids = [*req.origin_input_ids, *req.output_ids]
            if self.THINKING_START_TOKEN_ID not in ids or self.THINKING_END_TOKEN_ID in ids:
                continue
            spent = len(ids) - ids.index(self.THINKING_START_TOKEN_ID) - 1
            if spent < budget:
                continue
            newline_last = bool(req.output_ids) and req.output_ids[-1] == self.NEW_LINE_TOKEN_ID
            forced = self.THINKING_END_TOKEN_ID if newline_last else self.NEW_LINE_TOKEN_ID
            logits[i, :] = -float("inf")
            logits[i, forced] = 0.0
        return logits


class Qwen3ThinkingBudgetLogitProcessor(ThinkingBudgetLogitProcessor):
    """Thinking budget for Qwen3 (<think> 151667, </think> 151668, newline 198)."""

    THINKING_START_TOKEN_ID: int = 151667
    THINKING_END_TOKEN_ID: int = 151668
    NEW_LINE_TOKEN_ID: int = 198


class DeepSeekR1ThinkingBudgetLogitProcessor(ThinkingBudgetLogitProcessor):
    """Thinking budget for DeepSeek-R1 (<think> 128798, </think> 128799, newline 201)."""

    THINKING_START_TOKEN_ID: int = 128798
    THINKING_END_TOKEN_ID: int = 128799
    NEW_LINE_TOKEN_ID: int = 201
