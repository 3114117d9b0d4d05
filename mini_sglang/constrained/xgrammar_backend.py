"""The xgrammar grammar backend (--grammar-backend xgrammar, the default).

xgrammar is imported on the first compile, not at server start: a server that never sees a
constrained request pays neither the import (~1 s) nor the tokenizer scan (~0.6 s for a 150k
vocabulary), and a missing package only fails the constrained requests, with a 400 naming
the install command.
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
    "Structured output (json_schema, regex, ebnf) needs the xgrammar package, which is not "
    "installed: pip install xgrammar==0.2.8"
)
# SGLang's special schema string for "any JSON value" (xgrammar's builtin JSON grammar).
ANY_JSON = "$$ANY$$"


class XGrammarGrammar(BaseGrammarObject):
    """A GrammarMatcher plus the compiled grammar it came from (to make fresh copies)."""

    def __init__(self, matcher: Any, compiled: Any) -> None:
        self.matcher = matcher
        self.compiled = compiled

    def accept_token(self, token: int) -> bool:
        return bool(self.matcher.accept_token(token))

    def fill_vocab_mask(self, vocab_mask: torch.Tensor, row: int) -> None:
        self.matcher.fill_next_token_bitmask(vocab_mask, row)

    def is_terminated(self) -> bool:
        return bool(self.matcher.is_terminated())

    def copy(self) -> XGrammarGrammar:
        import xgrammar

        return XGrammarGrammar(xgrammar.GrammarMatcher(self.compiled), self.compiled)

    def __repr__(self) -> str:
        return f"XGrammarGrammar(terminated={self.is_terminated()})"


class XGrammarGrammarBackend(BaseGrammarBackend):
    """Compiles with one xgrammar GrammarCompiler built from the HF tokenizer.

    ``vocab_size`` is the model's (its LM head may be wider than the tokenizer; the extra ids
    are never allowed) and ``eos_token_ids`` the model's EOS ids, which become the grammar's
    stop tokens: the only tokens allowed once the constraint is complete.
    """

    name = "xgrammar"

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        eos_token_ids: set[int] | None = None,
        any_whitespace: bool = True,
    ) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = sorted(eos_token_ids) if eos_token_ids else None
        self.any_whitespace = any_whitespace
        self._compiler: Any = None
        self._lock = threading.Lock()  # the compiler is built once, by whichever worker

    def _get_compiler(self) -> Any:
        with self._lock:
            if self._compiler is None:
                try:
                    import xgrammar
                except ImportError as e:
                    raise GrammarBackendUnavailable(INSTALL_HINT) from e
                info = xgrammar.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.eos_token_ids
                )
                self._compiler = xgrammar.GrammarCompiler(info)
            return self._compiler

    def _wrap(self, compiled: Any) -> XGrammarGrammar:
        import xgrammar

        return XGrammarGrammar(xgrammar.GrammarMatcher(compiled), compiled)

    def dispatch_json(self, schema: str) -> XGrammarGrammar:
        compiler = self._get_compiler()
        if schema == ANY_JSON:
            return self._wrap(compiler.compile_builtin_json_grammar())
        return self._wrap(compiler.compile_json_schema(schema, any_whitespace=self.any_whitespace))

    def dispatch_regex(self, regex: str) -> XGrammarGrammar:
        return self._wrap(self._get_compiler().compile_regex(regex))

    def dispatch_ebnf(self, ebnf: str) -> XGrammarGrammar:
        return self._wrap(self._get_compiler().compile_grammar(ebnf))

    def reset(self) -> None:
        super().reset()
        with self._lock:
            if self._compiler is not None:
                self._compiler.clear_cache()
