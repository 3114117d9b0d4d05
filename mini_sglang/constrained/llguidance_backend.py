"""The llguidance grammar backend (--grammar-backend llguidance).

llguidance compiles json_schema, regex and ebnf (GBNF, converted to its Lark dialect) into an
Earley-parser matcher that computes each step's token mask lazily, so compiling is cheap and
the first masks of a big schema cost more than xgrammar's. Its masks use the packed int32
layout of `constrained.bitmask`, written in place by ``llguidance.torch``.

The package is imported, and the tokenizer scanned, on the first compile, not at server
start; a missing package only fails constrained requests, with a 400 naming the install
command.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

from mini_sglang.constrained.base_grammar_backend import (
    BaseGrammarBackend,
    BaseGrammarObject,
    GrammarBackendUnavailable,
)

INSTALL_HINT = (
    "Structured output with --grammar-backend llguidance needs the llguidance package, "
    "which is not installed: pip install llguidance==1.9.1"
)


class GuidanceGrammar(BaseGrammarObject):
    """One request's LLMatcher plus a pristine matcher of the same grammar to copy from.

    llguidance stops its matcher once nothing but a stop token may follow; "terminated"
    here means what the interface says: a stop token was accepted.
    """

    def __init__(self, matcher: Any, template: Any, stop_ids: frozenset[int]) -> None:
        self.matcher = matcher
        self.template = template  # never advanced
        self.stop_ids = stop_ids
        self.terminated = False

    def accept_token(self, token: int) -> bool:
        if token in self.stop_ids:
            # A stop token is never "consumed" by try_consume_tokens; it is allowed exactly
            # where the grammar may end.
            if not self.matcher.is_accepting() or not self.matcher.consume_token(token):
                return False
            self.terminated = True
            return True
        # try_consume_tokens leaves the matcher as it was for a forbidden token, where
        # consume_token would put it in an error state.
        return self.matcher.try_consume_tokens([token]) == 1

    def fill_vocab_mask(self, vocab_mask: torch.Tensor, row: int) -> None:
        from llguidance.torch import fill_next_token_bitmask

        fill_next_token_bitmask(self.matcher, vocab_mask, row)

    def is_terminated(self) -> bool:
        return self.terminated

    def copy(self) -> GuidanceGrammar:
        return GuidanceGrammar(self.template.deep_copy(), self.template, self.stop_ids)

    def __repr__(self) -> str:
        return f"GuidanceGrammar(terminated={self.terminated})"


class GuidanceBackend(BaseGrammarBackend):
    """Compiles with one llguidance tokenizer built from the HF tokenizer.

    ``vocab_size`` is the model's (ids past the tokenizer are never allowed),
    ``eos_token_ids`` the model's EOS ids, the grammar's stop tokens, and
    ``whitespace_pattern`` (a regex) replaces JSON's whitespace rule when given. Errors are
    llguidance's own texts (e.g. "Invalid type: nope", "regex parse error: ... unclosed
    group"), after SGLang's "Invalid grammar request" prefix.
    """

    name = "llguidance"

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        eos_token_ids: set[int] | None = None,
        any_whitespace: bool = True,
        whitespace_pattern: str | None = None,
    ) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(eos_token_ids) if eos_token_ids else None
        self.any_whitespace = any_whitespace
        self.whitespace_pattern = whitespace_pattern
        self._ll_tokenizer: Any = None
        self._lock = threading.Lock()  # the tokenizer is built once, by whichever worker

    def _get_tokenizer(self) -> Any:
        with self._lock:
            if self._ll_tokenizer is None:
                try:
                    import llguidance.hf
                except ImportError as e:
                    raise GrammarBackendUnavailable(INSTALL_HINT) from e
                self._ll_tokenizer = llguidance.hf.from_tokenizer(
                    self.tokenizer, n_vocab=self.vocab_size, eos_token=self.eos_token_ids
                )
            return self._ll_tokenizer

    def _stop_ids(self) -> frozenset[int]:
        if self.eos_token_ids:
            return frozenset(self.eos_token_ids)
        return frozenset(self._get_tokenizer().eos_tokens)

    def _from_serialized(self, grammar: str) -> GuidanceGrammar:
        import llguidance

        template = llguidance.LLMatcher(self._get_tokenizer(), grammar, log_level=1)
        if template.is_error():
            raise ValueError(template.get_error().strip())
        return GuidanceGrammar(template.deep_copy(), template, self._stop_ids())

    def dispatch_json(self, schema: str) -> GuidanceGrammar:
        self._get_tokenizer()  # the install hint before any other error
        import llguidance

        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            schema,
            defaults={
                "whitespace_flexible": self.any_whitespace,
                "whitespace_pattern": self.whitespace_pattern,
            },
        )
        return self._from_serialized(grammar)

    def dispatch_regex(self, regex: str) -> GuidanceGrammar:
        self._get_tokenizer()
        import llguidance

        return self._from_serialized(llguidance.grammar_from("regex", regex))

    def dispatch_ebnf(self, ebnf: str) -> GuidanceGrammar:
        self._get_tokenizer()
        import llguidance

        return self._from_serialized(llguidance.grammar_from("ebnf", ebnf))
