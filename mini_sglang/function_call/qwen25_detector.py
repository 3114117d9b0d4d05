"""Qwen2.5 / Qwen3 (Hermes-style) tool calls: `--tool-call-parser qwen` (or `qwen25`).

    answer text<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>\n<tool_call>...

Non-stream (SGLang 0.5.4): the answer is the text before the first `<tool_call>\n`,
stripped; every `<tool_call>\n...\n</tool_call>` block is decoded (a malformed one is
skipped with a warning) and anything between or after the blocks is dropped.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from typing import Any

from mini_sglang.function_call.base_detector import (
    BaseFormatDetector,
    parse_base_json,
)
from mini_sglang.function_call.core_types import StreamingParseResult
from mini_sglang.parser.reasoning_parser import partial_suffix_len

logger = logging.getLogger("mini_sglang")


class Qwen25Detector(BaseFormatDetector):
    bot_token = "<tool_call>\n"
    eot_token = "\n</tool_call>"

    def __init__(self) -> None:
        super().__init__()
        self._mode = "text"  # text (answer) -> call <-> between (after a call)
        self._text_begun = False

    def has_tool_call(self, text: str) -> bool:
        return self.bot_token in text

    def detect_and_parse(self, text: str, tools: Sequence[Any]) -> StreamingParseResult:
        idx = text.find(self.bot_token)
        if idx == -1:
            return StreamingParseResult(normal_text=text)
        pattern = f"{re.escape(self.bot_token)}(.*?){re.escape(self.eot_token)}"
        calls = []
        for block in re.findall(pattern, text, re.DOTALL):
            try:
                calls.extend(parse_base_json(json.loads(block.strip()), tools))
            except json.JSONDecodeError as e:
                logger.warning("Failed to parse JSON part: %s, JSON parse error: %s", block, e)
        return StreamingParseResult(normal_text=text[:idx].strip(), calls=calls)

    def parse_streaming_increment(
        self, new_text: str, tools: Sequence[Any]
    ) -> StreamingParseResult:
        self._buf += new_text
        out = StreamingParseResult()
        while True:
            if self._mode == "call":
                if not self._feed_call(out):
                    return out
                self._mode = "between"
                continue
            idx = self._buf.find(self.bot_token)
            if idx >= 0:
                if self._mode == "text":
                    # The answer is stripped before a call: held trailing whitespace goes.
                    out.normal_text += self._answer(self._buf[:idx].rstrip())
                self._buf = self._buf[idx + len(self.bot_token) :]
                self._mode = "call"
                self._start_call(tools)
                continue
            keep = partial_suffix_len(self._buf, self.bot_token)
            rest = self._buf[: len(self._buf) - keep]
            if self._mode == "text":
                # Trailing whitespace waits: it is dropped if a call follows.
                emit = rest.rstrip()
                out.normal_text += self._answer(emit)
                self._buf = self._buf[len(emit) :]
            else:  # text between and after calls is dropped
                self._buf = self._buf[len(rest) :]
            return out

    def _answer(self, text: str) -> str:
        if not self._text_begun:
            if not text.strip():
                return ""  # leading whitespace before a call is stripped
            self._text_begun = True
        return text
