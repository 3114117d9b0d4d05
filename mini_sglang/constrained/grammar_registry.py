"""The --grammar-backend registry: backend name -> factory, and `create_grammar_backend`.

A factory takes (GrammarConfig, tokenizer, vocab_size, eos_token_ids) and returns a
backend. Registering costs nothing: a backend imports its grammar library (xgrammar,
llguidance, outlines-core) on its first compile, not when its module is imported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mini_sglang.constrained.base_grammar_backend import BaseGrammarBackend
from mini_sglang.constrained.llguidance_backend import GuidanceBackend
from mini_sglang.constrained.outlines_backend import OutlinesGrammarBackend
from mini_sglang.constrained.xgrammar_backend import XGrammarGrammarBackend

if TYPE_CHECKING:
    from mini_sglang.config_slices import GrammarConfig

# --grammar-backend name -> factory(GrammarConfig, tokenizer, vocab_size, eos_token_ids).
GrammarBackendFactory = Callable[["GrammarConfig", Any, int, "set[int] | None"], BaseGrammarBackend]
GRAMMAR_BACKEND_REGISTRY: dict[str, GrammarBackendFactory] = {}


def register_grammar_backend(name: str, factory: GrammarBackendFactory) -> None:
    """Make ``--grammar-backend name`` build its backend with ``factory``."""
    GRAMMAR_BACKEND_REGISTRY[name] = factory


def _factory(backend_cls: type, whitespace_pattern: bool) -> GrammarBackendFactory:
    """A factory for a backend class taking (tokenizer, vocab_size, eos_token_ids,
    any_whitespace[, whitespace_pattern]), as the built-in ones do."""

    def build(
        config: GrammarConfig, tokenizer: Any, vocab_size: int, eos_token_ids: set[int] | None
    ) -> BaseGrammarBackend:
        extra = (
            {"whitespace_pattern": config.constrained_json_whitespace_pattern}
            if whitespace_pattern
            else {}
        )
        return backend_cls(
            tokenizer,
            vocab_size=vocab_size,
            eos_token_ids=eos_token_ids,
            any_whitespace=not config.constrained_json_disable_any_whitespace,
            **extra,
        )

    return build


# --constrained-json-whitespace-pattern reaches outlines and llguidance only (SGLang).
register_grammar_backend("xgrammar", _factory(XGrammarGrammarBackend, whitespace_pattern=False))
register_grammar_backend("llguidance", _factory(GuidanceBackend, whitespace_pattern=True))
register_grammar_backend("outlines", _factory(OutlinesGrammarBackend, whitespace_pattern=True))


def create_grammar_backend(
    config: GrammarConfig, tokenizer: Any, vocab_size: int, eos_token_ids: set[int] | None
) -> BaseGrammarBackend | None:
    """The backend named by `config.grammar_backend` (None for "none", or without a
    tokenizer).

    Raises ValueError for a name nobody registered (ServerArgs normally rejects it first).
    """
    name = config.grammar_backend or "xgrammar"
    if name == "none" or tokenizer is None:
        return None
    if name not in GRAMMAR_BACKEND_REGISTRY:
        raise ValueError(f"Invalid grammar backend: {name}")
    return GRAMMAR_BACKEND_REGISTRY[name](config, tokenizer, vocab_size, eos_token_ids)
