"""The grammar backend interface and its compile cache.

A request's constraint is a key ``(kind, string)`` with kind "json", "regex" or "ebnf"
(SGLang's keys; json_object arrives as the schema ``{"type": "object"}``). The scheduler asks
the backend for it without blocking:

    value, hit = backend.get_cached_or_future(("regex", "(yes|no)-[0-9]{3}"))
    # hit: value is a fresh grammar object (or an InvalidGrammar) from the cache
    # miss: value is a Future compiling on a worker thread; when it is done the scheduler
    #       calls backend.set_cache(key, result) and uses result.copy() for the request

Compilation never raises: a bad schema/regex/grammar (or a missing package) comes back as
an ``InvalidGrammar`` whose ``error`` is the message the client gets with HTTP 400.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import torch

logger = logging.getLogger("mini_sglang")

GrammarKey = tuple[str, str]
# Compiled grammars kept per backend; the oldest go first (a server sees few distinct ones).
MAX_CACHED_GRAMMARS = 1024
NONE_BACKEND_ERROR = (
    "Grammar-based generation (json_schema, regex, ebnf, structural_tag) is not supported "
    "when the server is launched with --grammar-backend none"
)


class BaseGrammarObject:
    """One request's matcher: where it stands in its grammar.

    Contract (every backend):
    - ``accept_token(t)`` advances by token ``t`` and returns True, or returns False and
      leaves the state unchanged when the grammar forbids ``t``.
    - ``fill_vocab_mask(mask, row)`` writes the tokens allowed next into row ``row`` of a
      packed bitmask from ``constrained.bitmask.allocate_token_bitmask`` (other rows are
      untouched). Stop tokens are allowed only where the grammar may end.
    - ``is_terminated()``: a stop token was accepted; nothing may follow.
    - ``copy()``: a new matcher at the start state sharing the compiled grammar (cache hits).
    """

    def accept_token(self, token: int) -> bool:
        raise NotImplementedError

    def fill_vocab_mask(self, vocab_mask: torch.Tensor, row: int) -> None:
        raise NotImplementedError

    def is_terminated(self) -> bool:
        raise NotImplementedError

    def copy(self) -> BaseGrammarObject:
        raise NotImplementedError


class InvalidGrammar:
    """A constraint that could not be compiled; ``error`` is the client's 400 message.
    Cached like a grammar, so a repeated bad request fails without recompiling."""

    def __init__(self, error: str) -> None:
        self.error = error

    def copy(self) -> InvalidGrammar:
        return self


class GrammarNotSupported(ValueError):
    """The backend cannot express this kind of constraint (e.g. ebnf on outlines); the
    message names the backend, and the client gets it in a 400 like any invalid grammar."""

    def __init__(self, backend: str, kind: str) -> None:
        super().__init__(
            f"The {backend} grammar backend does not support {kind} constraints; "
            "launch the server with --grammar-backend xgrammar or llguidance for them."
        )


class GrammarBackendUnavailable(RuntimeError):
    """The backend cannot compile anything (e.g. its package is missing); the message says
    how to fix it and is sent to the client as is."""


# "[07:03:25] /project/cpp/regex_converter.cc:83: " in front of xgrammar's C++ errors.
_CPP_LOCATION = re.compile(r"^\[[^\]]*\]\s*\S+:\d+:\s*")


def invalid_grammar_message(key: GrammarKey, error: Exception) -> str:
    """SGLang's 400 message for a grammar that does not compile, plus the reason."""
    reason = _CPP_LOCATION.sub("", str(error).strip()).strip()
    return f"Invalid grammar request: req.grammar_key={key!r}. {reason}".rstrip()


class BaseGrammarBackend:
    """Compiles constraint keys into grammar objects on a worker thread and caches them.

    Subclasses implement ``dispatch_json`` / ``dispatch_regex`` / ``dispatch_ebnf``: return a
    grammar object for the string, raise any exception for an invalid one (the library's
    own message becomes the 400's reason), GrammarNotSupported for a kind they cannot
    express, or GrammarBackendUnavailable when they cannot compile at all. ``name`` is the
    --grammar-backend value that selects the subclass.
    """

    name = "base"

    def __init__(self) -> None:
        # Two workers: a slow schema must not hold up every other request's grammar.
        self.executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="grammar")
        self.cache: dict[GrammarKey, BaseGrammarObject | InvalidGrammar] = {}

    def dispatch_json(self, schema: str) -> BaseGrammarObject:
        raise GrammarNotSupported(self.name, "json_schema")

    def dispatch_regex(self, regex: str) -> BaseGrammarObject:
        raise GrammarNotSupported(self.name, "regex")

    def dispatch_ebnf(self, ebnf: str) -> BaseGrammarObject:
        raise GrammarNotSupported(self.name, "ebnf")

    def compile(self, key: GrammarKey) -> BaseGrammarObject | InvalidGrammar:
        """Compile ``key`` now (any thread). Never raises."""
        kind, string = key
        dispatch: dict[str, Callable[[str], BaseGrammarObject]] = {
            "json": self.dispatch_json,
            "regex": self.dispatch_regex,
            "ebnf": self.dispatch_ebnf,
        }
        try:
            if kind not in dispatch:
                raise ValueError(f"unknown grammar kind {kind!r}")
            return dispatch[kind](string)
        except GrammarBackendUnavailable as e:
            return InvalidGrammar(str(e))
        except Exception as e:  # noqa: BLE001 - any bad grammar is the client's 400
            logger.warning("Invalid grammar %r: %s", key, e)
            return InvalidGrammar(invalid_grammar_message(key, e))

    def get_cached_or_future(
        self, key: GrammarKey
    ) -> tuple[BaseGrammarObject | InvalidGrammar | Future, bool]:
        """(a fresh copy of the cached value, True) or (a Future of ``compile(key)``, False)."""
        value = self.cache.get(key)
        if value is not None:
            return value.copy(), True
        return self.executor.submit(self.compile, key), False

    def set_cache(self, key: GrammarKey, value: BaseGrammarObject | InvalidGrammar) -> None:
        """Remember ``value`` for ``key``; pass a copy that no request advances."""
        if len(self.cache) >= MAX_CACHED_GRAMMARS:
            self.cache.pop(next(iter(self.cache)))
        self.cache[key] = value

    def reset(self) -> None:
        """Forget every compiled grammar (flush_cache)."""
        self.cache.clear()
