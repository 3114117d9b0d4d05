"""The grammar backend on its own: packed bitmasks, compile / cache / errors, the registry,
and a missing xgrammar package (no model, no scheduler)."""

from __future__ import annotations

import sys

import pytest
import torch

from mini_sglang.config_slices import GrammarConfig
from mini_sglang.constrained.base_grammar_backend import NONE_BACKEND_ERROR, InvalidGrammar
from mini_sglang.constrained.bitmask import allocate_token_bitmask, apply_token_bitmask
from mini_sglang.constrained.grammar_registry import create_grammar_backend
from mini_sglang.constrained.xgrammar_backend import INSTALL_HINT, XGrammarGrammarBackend

xgrammar = pytest.importorskip("xgrammar")


@pytest.fixture(scope="module")
def backend(qwen_tokenizer) -> XGrammarGrammarBackend:
    # The model vocabulary is wider than the tokenizer's, as in real checkpoints.
    return XGrammarGrammarBackend(qwen_tokenizer, vocab_size=len(qwen_tokenizer) + 27)


def test_bitmask_apply_matches_xgrammar_kernel(backend):
    vocab = backend.vocab_size
    grammar = backend.compile(("regex", "(yes|no)-[0-9]{3}"))
    mask = allocate_token_bitmask(3, vocab)
    grammar.fill_vocab_mask(mask, 1)
    logits = torch.randn(3, vocab, generator=torch.Generator().manual_seed(0))
    ours = apply_token_bitmask(logits, mask)
    theirs = logits.clone()
    xgrammar.apply_token_bitmask_inplace(theirs, mask)
    assert torch.equal(ours, theirs)
    assert torch.equal(ours[0], logits[0]) and torch.equal(ours[2], logits[2])  # unmasked rows
    allowed = torch.isfinite(ours[1]).nonzero().flatten().tolist()
    assert 0 < len(allowed) < 100  # "yes"/"no" prefixes only
    assert all(i < len(backend.tokenizer) for i in allowed)  # never the padding ids


def test_compile_accept_terminate_and_copy(backend):
    tok = backend.tokenizer
    grammar = backend.compile(("regex", "ab|cd"))
    ids = tok.encode("cd", add_special_tokens=False)
    assert all(grammar.accept_token(t) for t in ids)
    assert not grammar.is_terminated()
    assert not grammar.accept_token(tok.encode("x", add_special_tokens=False)[0])
    assert grammar.accept_token(tok.eos_token_id or tok.convert_tokens_to_ids("<|im_end|>"))
    assert grammar.is_terminated()
    fresh = grammar.copy()  # a new matcher at the start, sharing the compiled grammar
    assert not fresh.is_terminated() and fresh.accept_token(ids[0])


@pytest.mark.parametrize(
    "key, reason",
    [
        (("regex", "(ab"), "Regex parsing error"),
        (("json", "{not json"), "Failed to parse JSON"),
        (("json", '{"type": "nope"}'), "nope"),
        (("ebnf", "root ::= undefined"), "undefined"),
        (("structural_tag", "{}"), "unknown grammar kind"),
    ],
)
def test_invalid_grammar_message(backend, key, reason):
    value = backend.compile(key)
    assert isinstance(value, InvalidGrammar)
    assert value.error.startswith(f"Invalid grammar request: req.grammar_key={key!r}. ")
    assert reason in value.error and ".cc:" not in value.error  # no C++ source location


def test_cache_round_trip(backend):
    key = ("json", '{"type": "object"}')
    future, hit = backend.get_cached_or_future(key)
    assert not hit
    backend.set_cache(key, future.result().copy())
    first, hit = backend.get_cached_or_future(key)
    second, _ = backend.get_cached_or_future(key)
    assert hit and first is not second  # each request advances its own matcher
    backend.reset()
    assert not backend.get_cached_or_future(key)[1]


def test_registry_and_none(qwen_tokenizer):
    none = GrammarConfig(grammar_backend="none")
    assert create_grammar_backend(none, qwen_tokenizer, 100, None) is None
    xgr = GrammarConfig(grammar_backend="xgrammar")
    assert isinstance(create_grammar_backend(xgr, qwen_tokenizer, 100, {1}), XGrammarGrammarBackend)
    assert create_grammar_backend(xgr, None, 100, None) is None  # --skip-tokenizer-init
    with pytest.raises(ValueError, match="Invalid grammar backend"):
        create_grammar_backend(GrammarConfig(grammar_backend="outlines"), qwen_tokenizer, 100, None)


def test_grammar_config_is_built_from_server_args():
    from mini_sglang.server_args import ServerArgs

    args = ServerArgs(
        model_path="/models/m", device="cpu", constrained_json_disable_any_whitespace=True
    )
    assert GrammarConfig.from_server_args(args) == GrammarConfig("xgrammar", True)
    assert "--grammar-backend none" in NONE_BACKEND_ERROR


def test_missing_xgrammar_is_a_400_naming_the_install(qwen_tokenizer, monkeypatch):
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # import xgrammar -> ImportError
    fresh = XGrammarGrammarBackend(qwen_tokenizer, vocab_size=len(qwen_tokenizer))
    value = fresh.compile(("regex", "a"))
    assert isinstance(value, InvalidGrammar) and value.error == INSTALL_HINT
    assert "pip install xgrammar" in INSTALL_HINT
