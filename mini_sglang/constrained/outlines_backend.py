"""The outlines grammar backend (--grammar-backend outlines), on outlines-core.

outlines compiles a regex into a token-level DFA over the whole vocabulary (an ``Index``),
and a json_schema into such a regex first (``build_regex_from_schema``), so compiling costs
more than xgrammar or llguidance but each step's mask is a table lookup. It has no EBNF
(nor structural tags): those get a 400 naming the backend. JSON Schema support is partial:
keywords outside the regex translation (e.g. integer ``minimum`` / ``maximum``) are ignored,
as in SGLang's outlines backend.

The package is imported, and the vocabulary converted to bytes, on the first compile.
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
from mini_sglang.constrained.bitmask import BITS_PER_WORD

INSTALL_HINT = (
    "Structured output with --grammar-backend outlines needs the outlines-core package, "
    "which is not installed: pip install outlines-core==0.2.14"
)


def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet: printable character -> the byte it stands for."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in table.items()}


def token_bytes(tokenizer: Any) -> dict[int, bytes]:
    """Each non-special token id -> the bytes it decodes to.

    Byte-level BPE tokens (GPT-2, Llama 3, Qwen) map character by character; SentencePiece
    tokens (Llama 2, Mistral) turn "▁" into a space and "<0xNN>" into byte NN. Tokens that
    are neither (added words) are their UTF-8 text.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    byte_level = backend is not None and "ByteLevel" in repr(backend.decoder)
    decoder = _byte_level_decoder()
    special = set(tokenizer.all_special_ids)
    special.update(
        i for i, t in getattr(tokenizer, "added_tokens_decoder", {}).items() if t.special
    )
    out: dict[int, bytes] = {}
    for tid, text in enumerate(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))):
        if tid in special or not text:
            continue
        if byte_level and all(c in decoder for c in text):
            out[tid] = bytes(decoder[c] for c in text)
        elif len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            out[tid] = bytes([int(text[3:5], 16)])
        else:
            out[tid] = text.replace("▁", " ").encode()
    return out


def _set_bit(row: torch.Tensor, token: int) -> None:
    word, bit = divmod(token, BITS_PER_WORD)
    value = 1 << bit
    row[word] |= value - (1 << 32) if bit == BITS_PER_WORD - 1 else value  # int32 sign bit


class OutlinesGrammar(BaseGrammarObject):
    """An outlines-core Guide (the DFA state) over a compiled Index.

    The Index knows one EOS id, and outlines never advances past it; stop tokens are
    handled here: every model EOS id is allowed in a final state, and accepting one
    terminates the grammar.
    """

    def __init__(self, index: Any, stop_ids: frozenset[int], vocab_size: int) -> None:
        from outlines_core import Guide

        self.index = index
        self.guide = Guide(index)
        self.stop_ids = stop_ids
        self.vocab_size = vocab_size
        self.terminated = False

    def accept_token(self, token: int) -> bool:
        if token in self.stop_ids:
            if not self.guide.is_finished():
                return False
            self.terminated = True
            return True
        try:
            self.guide.advance(token, return_tokens=False)
        except ValueError:  # no transition: the state is unchanged
            return False
        return True

    def fill_vocab_mask(self, vocab_mask: torch.Tensor, row: int) -> None:
        assert vocab_mask.device.type == "cpu" and vocab_mask.is_contiguous()
        target = vocab_mask[row]
        self.guide.write_mask_into(target.data_ptr(), target.numel(), target.element_size())
        if self.guide.is_finished():
            for token in self.stop_ids:
                if token < self.vocab_size:
                    _set_bit(target, token)

    def is_terminated(self) -> bool:
        return self.terminated

    def copy(self) -> OutlinesGrammar:
        return OutlinesGrammar(self.index, self.stop_ids, self.vocab_size)

    def __repr__(self) -> str:
        return f"OutlinesGrammar(state={self.guide.get_state()}, terminated={self.terminated})"


class OutlinesGrammarBackend(BaseGrammarBackend):
    """Compiles with one outlines-core Vocabulary built from the HF tokenizer.

    Errors are outlines-core's own texts (e.g. "Unsupported type: nope", "Expected a valid
    JSON string.", the regex parser's message), after SGLang's "Invalid grammar request"
    prefix; ebnf is refused by name.
    """

    name = "outlines"

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
        stops = set(eos_token_ids or ())
        if not stops and tokenizer.eos_token_id is not None:
            stops.add(tokenizer.eos_token_id)
        self.stop_ids = frozenset(stops)
        # An explicit pattern wins; outlines' own default (None) is one optional space.
        if whitespace_pattern is None and not any_whitespace:
            whitespace_pattern = ""
        self.whitespace_pattern = whitespace_pattern
        self._vocabulary: Any = None
        self._lock = threading.Lock()  # the vocabulary is built once, by whichever worker

    def _get_vocabulary(self) -> Any:
        with self._lock:
            if self._vocabulary is None:
                try:
                    from outlines_core import Vocabulary
                except ImportError as e:
                    raise GrammarBackendUnavailable(INSTALL_HINT) from e
                by_bytes: dict[bytes, list[int]] = {}
                for tid, data in token_bytes(self.tokenizer).items():
                    if tid not in self.stop_ids:
                        by_bytes.setdefault(data, []).append(tid)
                eos = min(self.stop_ids) if self.stop_ids else len(self.tokenizer)
                self._vocabulary = Vocabulary(eos, by_bytes)
            return self._vocabulary

    def dispatch_regex(self, regex: str) -> OutlinesGrammar:
        vocabulary = self._get_vocabulary()
        from outlines_core import Index

        return OutlinesGrammar(Index(regex, vocabulary), self.stop_ids, self.vocab_size)

    def dispatch_json(self, schema: str) -> OutlinesGrammar:
        self._get_vocabulary()
        from outlines_core.json_schema import build_regex_from_schema

        return self.dispatch_regex(build_regex_from_schema(schema, self.whitespace_pattern))
