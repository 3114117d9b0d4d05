"""The grammar backends on their own: packed bitmasks (each backend's against the
tokenizer), compile / cache / errors, the registry, and a missing package (no model, no
scheduler)."""

from __future__ import annotations

import sys

import pytest
import regex
import torch

from mini_sglang.config_slices import GrammarConfig
from mini_sglang.constrained.base_grammar_backend import NONE_BACKEND_ERROR, InvalidGrammar
from mini_sglang.constrained.bitmask import (
    allocate_token_bitmask,
    apply_token_bitmask,
    unpack_token_bitmask,
)
from mini_sglang.constrained.grammar_registry import create_grammar_backend
from mini_sglang.constrained.llguidance_backend import GuidanceBackend
from mini_sglang.constrained.outlines_backend import OutlinesGrammarBackend
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
    for name, cls in [("llguidance", GuidanceBackend), ("outlines", OutlinesGrammarBackend)]:
        built = create_grammar_backend(
            GrammarConfig(grammar_backend=name), qwen_tokenizer, 100, {1}
        )
        assert isinstance(built, cls) and built.name == name
    with pytest.raises(ValueError, match="Invalid grammar backend"):
        create_grammar_backend(GrammarConfig(grammar_backend="nope"), qwen_tokenizer, 100, None)


def test_grammar_config_is_built_from_server_args():
    from mini_sglang.server_args import ServerArgs

    args = ServerArgs(
        model_path="/models/m", device="cpu", constrained_json_disable_any_whitespace=True
    )
    assert GrammarConfig.from_server_args(args) == GrammarConfig("xgrammar", True)
    for name in ["llguidance", "outlines", "none"]:  # selected as given, no warning
        args = ServerArgs(model_path="/models/m", device="cpu", grammar_backend=name)
        assert GrammarConfig.from_server_args(args).grammar_backend == name
    assert "--grammar-backend none" in NONE_BACKEND_ERROR


def test_missing_xgrammar_is_a_400_naming_the_install(qwen_tokenizer, monkeypatch):
    monkeypatch.setitem(sys.modules, "xgrammar", None)  # import xgrammar -> ImportError
    fresh = XGrammarGrammarBackend(qwen_tokenizer, vocab_size=len(qwen_tokenizer))
    value = fresh.compile(("regex", "a"))
    assert isinstance(value, InvalidGrammar) and value.error == INSTALL_HINT
    assert "pip install xgrammar" in INSTALL_HINT


# ---- every backend ------------------------------------------------------------------------
BACKENDS = ["xgrammar", "llguidance", "outlines"]
QWEN_STOPS = {151643, 151645}  # <|endoftext|>, <|im_end|>


@pytest.fixture(scope="module")
def backends(qwen_tokenizer) -> dict:
    """One backend per name (each scans the tokenizer once); the model vocabulary is wider
    than the tokenizer's, as in real checkpoints."""
    vocab = len(qwen_tokenizer) + 27
    return {
        name: create_grammar_backend(GrammarConfig(name), qwen_tokenizer, vocab, QWEN_STOPS)
        for name in BACKENDS
    }


@pytest.fixture(params=BACKENDS)
def any_backend(request, backends):
    return backends[request.param]


@pytest.fixture(scope="module")
def token_texts(qwen_tokenizer) -> list[str]:
    """Each token's text ("" for special tokens, which no grammar allows)."""
    special = set(qwen_tokenizer.all_special_ids) | {
        i for i, t in qwen_tokenizer.added_tokens_decoder.items() if t.special
    }
    ids = [[i] for i in range(len(qwen_tokenizer))]
    texts = qwen_tokenizer.batch_decode(ids)
    return ["" if i in special else t for i, t in enumerate(texts)]


def _allowed(grammar, vocab: int) -> set[int]:
    mask = allocate_token_bitmask(2, vocab)
    grammar.fill_vocab_mask(mask, 1)
    assert bool((mask[0] == -1).all())  # other rows untouched
    return set(unpack_token_bitmask(mask, vocab)[1].nonzero().flatten().tolist())


PATTERN = r"(yes|no)-[0-9]{3}"
PREFIXES = ["", "yes-1", "no-123"]


@pytest.fixture(scope="module")
def expected_allowed(token_texts) -> dict[str, set[int]]:
    """Per prefix, every token that keeps the output a prefix of a PATTERN match (only the
    model's stop ids once the match is complete)."""
    out = {}
    for prefix in PREFIXES:
        if regex.fullmatch(PATTERN, prefix):
            out[prefix] = QWEN_STOPS
            continue
        out[prefix] = {
            i
            for i, text in enumerate(token_texts)
            if text and regex.fullmatch(PATTERN, prefix + text, partial=True)
        }
    return out


def test_bitmask_is_exactly_the_regex_over_the_vocabulary(any_backend, expected_allowed):
    tok, vocab = any_backend.tokenizer, any_backend.vocab_size
    compiled = any_backend.compile(("regex", PATTERN))
    for prefix in PREFIXES:
        grammar = compiled.copy()
        for t in tok.encode(prefix, add_special_tokens=False):
            assert grammar.accept_token(t)
        assert _allowed(grammar, vocab) == expected_allowed[prefix], prefix


def test_accept_reject_terminate_and_copy_on_every_backend(any_backend):
    tok = any_backend.tokenizer
    grammar = any_backend.compile(("regex", "ab|cd"))
    ids = tok.encode("cd", add_special_tokens=False)
    first = grammar.copy()
    assert all(grammar.accept_token(t) for t in ids)
    assert not grammar.is_terminated()
    assert not grammar.accept_token(tok.encode("x", add_special_tokens=False)[0])
    assert not grammar.is_terminated()  # a rejected token changed nothing
    assert grammar.accept_token(151643)  # any of the model's stop ids
    assert grammar.is_terminated()
    fresh = grammar.copy()  # a new matcher at the start, sharing the compiled grammar
    assert not fresh.is_terminated() and fresh.accept_token(ids[0])
    assert not first.accept_token(151645)  # a stop token only where the grammar may end


def test_json_schema_and_ebnf_masks_on_every_backend(any_backend, token_texts):
    schema = '{"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]}'
    grammar = any_backend.compile(("json", schema))
    allowed = _allowed(grammar, any_backend.vocab_size)
    assert allowed and all(token_texts[i].lstrip().startswith("{") for i in allowed)
    if any_backend.name == "outlines":
        return  # no ebnf: see test_each_backends_own_error_texts
    grammar = any_backend.compile(("ebnf", 'root ::= "cat" | "dog"'))
    allowed = _allowed(grammar, any_backend.vocab_size)
    assert allowed and all(
        t and ("cat".startswith(t) or "dog".startswith(t))
        for t in (token_texts[i] for i in allowed)
    )


@pytest.mark.parametrize(
    "name, key, reason",
    [
        ("llguidance", ("regex", "(ab"), "unclosed group"),
        ("llguidance", ("json", '{"type": "nope"}'), "Invalid type: nope"),
        ("llguidance", ("json", "{not json"), "key must be a string"),
        ("llguidance", ("ebnf", "root ::= undefined"), "Rule 'undefined' not found"),
        ("outlines", ("regex", "(ab"), "Failed to build DFA"),
        ("outlines", ("json", '{"type": "nope"}'), "Unsupported type: nope"),
        ("outlines", ("json", "{not json"), "Expected a valid JSON string."),
        (
            "outlines",
            ("ebnf", 'root ::= "a"'),
            "The outlines grammar backend does not support ebnf",
        ),
    ],
)
def test_each_backends_own_error_texts(backends, name, key, reason):
    value = backends[name].compile(key)
    assert isinstance(value, InvalidGrammar)
    assert value.error.startswith(f"Invalid grammar request: req.grammar_key={key!r}. ")
    assert reason in value.error


@pytest.mark.parametrize(
    "module, cls, hint",
    [
        ("llguidance", GuidanceBackend, "pip install llguidance"),
        ("outlines_core", OutlinesGrammarBackend, "pip install outlines-core"),
    ],
)
def test_missing_package_is_a_400_naming_the_install(
    qwen_tokenizer, monkeypatch, module, cls, hint
):
    for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, module, None)
    fresh = cls(qwen_tokenizer, vocab_size=len(qwen_tokenizer))
    value = fresh.compile(("regex", "a"))
    assert isinstance(value, InvalidGrammar) and hint in value.error


@pytest.mark.parametrize("name", ["llguidance", "outlines"])
def test_whitespace_pattern_reaches_outlines_and_llguidance(qwen_tokenizer, name):
    """--constrained-json-whitespace-pattern replaces the whitespace between JSON tokens."""
    config = GrammarConfig(grammar_backend=name, constrained_json_whitespace_pattern=r"[\n]?")
    backend = create_grammar_backend(config, qwen_tokenizer, len(qwen_tokenizer), QWEN_STOPS)
    schema = '{"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]}'
    grammar = backend.compile(("json", schema))
    (brace,) = qwen_tokenizer.encode("{", add_special_tokens=False)
    assert grammar.accept_token(brace)
    allowed = _allowed(grammar, len(qwen_tokenizer))
    (newline,) = qwen_tokenizer.encode("\n", add_special_tokens=False)
    (space,) = qwen_tokenizer.encode(" ", add_special_tokens=False)
    assert newline in allowed and space not in allowed
