"""Reasoning parsers (`--reasoning-parser`): split a reply into reasoning and answer.

A detector knows a model family's think tags (`<think>` ... `</think>` for DeepSeek-R1 and
Qwen3). Two interfaces, with SGLang 0.5.4's semantics:

- `detect_and_parse(text)` (non-stream, SGLang's exact rule): the text is reasoning if
  reasoning is forced or the start tag occurs; start tags are removed, the rest is
  stripped and split at the first end tag into reasoning (its trailing whitespace kept) and
  answer (stripped). Without an end tag everything is reasoning (a truncated think block).
- `parse_streaming_increment(delta)` + `finish()` (stream): a state machine whose output,
  concatenated over any split of the text, equals `detect_and_parse` whenever the start
  tag occurs only at the beginning (the only place models put it). It holds back a partial
  tag and whitespace that the non-stream rule would strip, and `finish()` releases what
  the end of the text decides. SGLang's own stream skips that bookkeeping, so its deltas
  can differ from its non-stream result by leading/trailing newlines.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ReasoningResult:
    """What one parse step yields: new reasoning text and new answer text."""

    reasoning_text: str = ""
    normal_text: str = ""

    def extend(self, other: ReasoningResult) -> None:
        self.reasoning_text += other.reasoning_text
        self.normal_text += other.normal_text


def partial_suffix_len(text: str, tag: str) -> int:
    """Length of the longest proper prefix of `tag` that `text` ends with (0 if none):
    those characters may still become the tag and must not be emitted yet."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


class ReasoningDetector:
    """Think-tag detector; one instance parses one reply (it is stateful when streaming).

    `force_reasoning`: the reply starts inside a think block even without a start tag
    (R1-style models, or templates that put `<think>` in the prompt). `stream_reasoning`:
    stream reasoning as it arrives; when False it comes in one piece at the end tag.
    """

    start_tag = "<think>"
    end_tag = "</think>"

    def __init__(self, force_reasoning: bool = False, stream_reasoning: bool = True) -> None:
        self.force_reasoning = force_reasoning
        self.stream_reasoning = stream_reasoning
        # undecided -> reasoning -> answer, or undecided -> plain (never reasoned)
        self._state = "reasoning" if force_reasoning else "undecided"
        self._buf = ""
        self._reasoning_begun = False  # leading whitespace of the reasoning is dropped
        self._answer_begun = False  # leading whitespace of the answer is dropped

    # ---- non-stream ----------------------------------------------------------------------
    def detect_and_parse(self, text: str) -> ReasoningResult:
        if not (self.force_reasoning or self.start_tag in text):
            return ReasoningResult(normal_text=text)
        body = text.replace(self.start_tag, "").strip()
        if self.end_tag not in body:
            return ReasoningResult(reasoning_text=body)
        reasoning, answer = body.split(self.end_tag, maxsplit=1)
        return ReasoningResult(reasoning_text=reasoning, normal_text=answer.strip())

    # ---- stream --------------------------------------------------------------------------
    def parse_streaming_increment(self, new_text: str) -> ReasoningResult:
        self._buf += new_text
        out = ReasoningResult()
        while True:
            step = getattr(self, f"_step_{self._state}")()
            if step is None:
                return out
            out.extend(step)

    def finish(self) -> ReasoningResult:
        """End of the reply: release what was held back (a dangling partial tag is plain
        text; whitespace the non-stream rule strips is dropped)."""
        buf, self._buf = self._buf, ""
        if self._state in ("undecided", "plain"):
            return ReasoningResult(normal_text=buf)
        if self._state == "reasoning":
            text = buf.rstrip() if self._reasoning_begun else buf.strip()
            return ReasoningResult(reasoning_text=text)
        return ReasoningResult()  # answer: only stripped trailing whitespace is left

    # Each step consumes what it can; it returns None when it needs more text, or a result
    # (possibly empty) after changing state so that the loop runs the next state.
    def _step_undecided(self) -> ReasoningResult | None:
        head = self._buf.lstrip()
        if head.startswith(self.start_tag):
            self._state = "reasoning"
            return ReasoningResult()
        if self.start_tag.startswith(head):
            return None  # only whitespace or a partial start tag so far
        self._state = "plain"
        return ReasoningResult()

    def _step_plain(self) -> ReasoningResult | None:
        if not self._buf:
            return None
        text, self._buf = self._buf, ""
        return ReasoningResult(normal_text=text)

    def _step_reasoning(self) -> ReasoningResult | None:
        if not self._reasoning_begun:
            self._buf = self._buf.lstrip()
            if self._buf.startswith(self.start_tag):  # the start tag is optional when forced
                self._buf = self._buf[len(self.start_tag) :]
                return ReasoningResult()
            if not self._buf or (self.start_tag.startswith(self._buf)):
                return None
        idx = self._buf.find(self.end_tag)
        if idx >= 0:
            reasoning = self._buf[:idx]
            self._buf = self._buf[idx + len(self.end_tag) :]
            self._state = "answer"
            return ReasoningResult(reasoning_text=reasoning)
        if not self.stream_reasoning:
            self._reasoning_begun = True  # the start tag has been ruled out
            return None
        # Hold a partial end tag, and trailing whitespace: a truncated reply strips it.
        keep = partial_suffix_len(self._buf, self.end_tag)
        emit = self._buf[: len(self._buf) - keep].rstrip()
        if not emit:
            return None
        self._reasoning_begun = True
        self._buf = self._buf[len(emit) :]
        return ReasoningResult(reasoning_text=emit)

    def _step_answer(self) -> ReasoningResult | None:
        if not self._answer_begun:
            self._buf = self._buf.lstrip()
        emit = self._buf.rstrip()  # trailing whitespace waits: the answer gets stripped
        if not emit:
            return None
        self._answer_begun = True
        self._buf = self._buf[len(emit) :]
        return ReasoningResult(normal_text=emit)


class DeepSeekR1Detector(ReasoningDetector):
    """DeepSeek-R1 (and Step3): always starts reasoning; `<think>` may or may not be
    generated (R1-0528 emits it, the original R1 has it in the prompt)."""

    def __init__(self, force_reasoning: bool = True, stream_reasoning: bool = True) -> None:
        super().__init__(force_reasoning=True, stream_reasoning=stream_reasoning)


class Qwen3Detector(ReasoningDetector):
    """Qwen3 (also DeepSeek-V3.1 and GLM-4.5): reasons only when `<think>` is generated,
    unless forced (chat_template_kwargs enable_thinking, or a template that opens the
    think block itself)."""


class KimiDetector(ReasoningDetector):
    """Kimi thinking models: `◁think▷` ... `◁/think▷`, never forced."""

    start_tag = "◁think▷"
    end_tag = "◁/think▷"

    def __init__(self, force_reasoning: bool = False, stream_reasoning: bool = True) -> None:
        super().__init__(force_reasoning=False, stream_reasoning=stream_reasoning)


# --reasoning-parser name -> detector (SGLang 0.5.4's names; gpt-oss needs the Harmony
# format, which mini-sglang lacks).
REASONING_PARSERS: dict[str, type[ReasoningDetector]] = {
    "deepseek-r1": DeepSeekR1Detector,
    "deepseek-v3": Qwen3Detector,
    "glm45": Qwen3Detector,
    "kimi": KimiDetector,
    "qwen3": Qwen3Detector,
    "qwen3-thinking": Qwen3Detector,
    "step3": DeepSeekR1Detector,
}
# Every name SGLang 0.5.4 accepts on the command line.
SGLANG_REASONING_PARSERS = [*REASONING_PARSERS, "gpt-oss"]
# Parsers whose models always think, whatever the request says.
_ALWAYS_REASONING = {"qwen3-thinking"}


class ReasoningParser:
    """A detector chosen by parser name (ValueError for an unknown one).

    `force_reasoning=None` keeps the detector's default (what /separate_reasoning uses);
    the chat endpoint passes whether the template or the request turned thinking on.
    """

    def __init__(
        self,
        model_type: str | None,
        stream_reasoning: bool = True,
        force_reasoning: bool | None = None,
    ) -> None:
        if not model_type:
            raise ValueError("Model type must be specified")
        detector_class = REASONING_PARSERS.get(model_type.lower())
        if detector_class is None:
            raise ValueError(f"Unsupported model type: {model_type}")
        if model_type.lower() in _ALWAYS_REASONING:
            force_reasoning = True
        kwargs: dict[str, bool] = {"stream_reasoning": stream_reasoning}
        if force_reasoning is not None:
            kwargs["force_reasoning"] = force_reasoning
        self.detector = detector_class(**kwargs)

    def parse_non_stream(self, full_text: str) -> tuple[str, str]:
        """(reasoning_text, normal_text) of a whole reply."""
        ret = self.detector.detect_and_parse(full_text)
        return ret.reasoning_text, ret.normal_text

    def parse_stream_chunk(self, chunk_text: str) -> tuple[str, str]:
        """(reasoning delta, normal delta) for the next piece of a streamed reply."""
        ret = self.detector.parse_streaming_increment(chunk_text)
        return ret.reasoning_text, ret.normal_text

    def finish(self) -> tuple[str, str]:
        """The deltas held back until the reply ended."""
        ret = self.detector.finish()
        return ret.reasoning_text, ret.normal_text
