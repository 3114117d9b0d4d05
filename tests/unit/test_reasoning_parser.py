"""Reasoning parsers: SGLang 0.5.4's non-stream results, and streams that give the same
result however the text is split (every split point, including inside the tags)."""

from __future__ import annotations

import random

import pytest

from mini_sglang.parser.reasoning_parser import (
    REASONING_PARSERS,
    ReasoningParser,
)

# (text, force_reasoning) -> (reasoning, answer) by SGLang's one-shot rule.
NON_STREAM = [
    # Qwen3 thinking: the start tag is generated; reasoning keeps its trailing newline.
    (("<think>\nLet me see.\n</think>\n\nThe answer is 42.", False),
     ("Let me see.\n", "The answer is 42.")),
    # Not reasoning (no start tag, not forced): the text is untouched.
    (("  The answer.\n", False), ("", "  The answer.\n")),
    # Forced (R1, enable_thinking, a template that opens the block): no start tag needed.
    (("I think...\n</think>\nDone", True), ("I think...\n", "Done")),
    (("<think>x</think>y", True), ("x", "y")),
    # Cut off inside the think block: all reasoning, stripped.
    (("<think>\nstill thinking  \n", False), ("still thinking", "")),
    # An empty think block (Qwen3 with thinking off writes one into the prompt).
    (("<think>\n\n</think>\n\nHi", False), ("", "Hi")),
    # A partial tag at the end stays text.
    (("<think>a</thi", False), ("a</thi", "")),
    (("<thi", False), ("", "<thi")),
    # Only the first end tag splits.
    (("<think>a</think>b</think>c", False), ("a", "b</think>c")),
]  # fmt: skip

STREAM_TEXTS = [text for (text, _), _ in NON_STREAM] + [
    "<think>\n\nstep 1\n\nstep 2\n</think>\n\n\nFinal  answer \n\n",
    "\n<think>x</think>",
    "",
    "plain text with a </think> inside",
    "<think><think>doubled</think>answer",
]


@pytest.mark.parametrize(("args", "expected"), NON_STREAM)
def test_non_stream_matches_sglang(args: tuple[str, bool], expected: tuple[str, str]) -> None:
    text, force = args
    assert ReasoningParser("qwen3", force_reasoning=force).parse_non_stream(text) == expected


def test_parser_defaults_and_names() -> None:
    text = "thinking</think>answer"
    # deepseek-r1 / step3 always reason; qwen3-thinking is forced; qwen3 is not.
    for name in ("deepseek-r1", "step3", "qwen3-thinking"):
        assert ReasoningParser(name, force_reasoning=False).parse_non_stream(text) == (
            "thinking",
            "answer",
        )
    assert ReasoningParser("qwen3").parse_non_stream(text) == ("", text)
    assert ReasoningParser("kimi", force_reasoning=True).parse_non_stream("◁think▷a◁/think▷b") == (
        "a",
        "b",
    )
    assert ReasoningParser("QWEN3").detector.start_tag == "<think>"
    for bad in ("", None, "gpt-oss", "nope"):
        with pytest.raises(ValueError):
            ReasoningParser(bad)


def _stream(parser: ReasoningParser, pieces: list[str]) -> tuple[str, str]:
    reasoning = answer = ""
    for piece in pieces:
        r, a = parser.parse_stream_chunk(piece)
        reasoning, answer = reasoning + r, answer + a
    r, a = parser.finish()
    return reasoning + r, answer + a


def _splits(text: str) -> list[list[str]]:
    """Every two-piece split, one piece per character, and a few random multi-splits."""
    out = [[text[:i], text[i:]] for i in range(len(text) + 1)] + [list(text)]
    rng = random.Random(len(text))
    for _ in range(5):
        cuts = sorted(rng.sample(range(len(text) + 1), min(4, len(text) + 1)))
        out.append([text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])])
    return out


@pytest.mark.parametrize("name", sorted(REASONING_PARSERS))
@pytest.mark.parametrize("force", [False, True])
@pytest.mark.parametrize("stream_reasoning", [True, False])
def test_stream_equals_non_stream(name: str, force: bool, stream_reasoning: bool) -> None:
    for text in STREAM_TEXTS:
        expected = ReasoningParser(name, force_reasoning=force).parse_non_stream(text)
        for pieces in _splits(text):
            parser = ReasoningParser(name, stream_reasoning, force)
            assert _stream(parser, pieces) == expected, (name, force, pieces)


def test_stream_deltas_are_incremental() -> None:
    """Reasoning streams as it arrives; only a possible tag or whitespace the answer will
    lose is held back; with stream_reasoning False reasoning comes in one piece."""
    parser = ReasoningParser("qwen3")
    assert parser.parse_stream_chunk("<think>\nOk") == ("Ok", "")
    assert parser.parse_stream_chunk(", so \n</th") == (", so", "")
    assert parser.parse_stream_chunk("ink>\n\nYes") == (" \n", "Yes")
    assert parser.parse_stream_chunk(" it is.\n") == ("", " it is.")
    assert parser.finish() == ("", "")
    parser = ReasoningParser("deepseek-r1", stream_reasoning=False)
    assert parser.parse_stream_chunk("a b c") == ("", "")
    assert parser.parse_stream_chunk("</think>d") == ("a b c", "d")


def test_start_tag_mid_text_differs_from_non_stream() -> None:
    """Documented difference: SGLang's one-shot rule treats a `<think>` anywhere as the
    start of reasoning; a stream cannot take back answer text it sent, so a start tag
    after answer text stays text (SGLang's own stream splits such text arbitrarily)."""
    text = "Hello <think>x</think> y"
    assert ReasoningParser("qwen3").parse_non_stream(text) == ("Hello x", "y")
    assert _stream(ReasoningParser("qwen3"), list(text)) == ("", text)
