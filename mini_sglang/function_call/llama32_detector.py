"""Llama 3.1 / 3.2 JSON tool calls: `--tool-call-parser llama3`.

    answer text<|python_tag|>{"name": "f", "parameters": {...}};{"name": "g", ...}

or, without the tag, a reply that starts with `{`. Calls are separated by `;` (SGLang's
choice; Llama itself has no parallel-call syntax). Non-stream (SGLang 0.5.4): the answer
is the text before the tag (not stripped) plus whatever follows the last call that
decodes (stripped); an undecodable part is skipped up to the next `{"name":`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from mini_sglang.function_call.base_detector import (
    BaseFormatDetector,
    parse_base_json,
)
from mini_sglang.function_call.core_types import StreamingParseResult
from mini_sglang.parser.reasoning_parser import partial_suffix_len

logger = logging.getLogger("mini_sglang")


class Llama32Detector(BaseFormatDetector):
    bot_token = "<|python_tag|>"
    tool_call_separator = ";"

    def __init__(self) -> None:
        super().__init__()
        # start -> text -> call <-> after (separator or trailing text) ; dead after an error
        self._mode = "start"
        self._trailing_begun = False

    def has_tool_call(self, text: str) -> bool:
        # Depending on the prompt the model may or may not emit the tag first.
        return self.bot_token in text or text.startswith("{")

    def detect_and_parse(self, text: str, tools: Sequence[Any]) -> StreamingParseResult:
        if not self.has_tool_call(text):
            return StreamingParseResult(normal_text=text)
        if self.bot_token in text:
            normal, action = text.split(self.bot_token, maxsplit=1)
        else:
            normal, action = "", text
        decoder = json.JSONDecoder()
        actions, idx, safe_idx = [], 0, 0
        while idx < len(action):
            try:
                obj, end = decoder.raw_decode(action[idx:])
            except json.JSONDecodeError as e:
                logger.warning("Failed to parse JSON part: %s, JSON parse error: %s", action, e)
                idx = action.find('{"name":', idx + 1)
                if idx == -1:
                    break
                continue
            actions.append(obj)
            idx += end + len(self.tool_call_separator)  # skips the separator unchecked
            safe_idx = idx
        calls = parse_base_json(actions, tools) if actions else []
        trailing = action[safe_idx:].strip() if safe_idx < len(action) else ""
        return StreamingParseResult(normal_text=normal + trailing, calls=calls)

    def parse_streaming_increment(
        self, new_text: str, tools: Sequence[Any]
    ) -> StreamingParseResult:
        self._buf += new_text
        out = StreamingParseResult()
        while self._buf and self._STEPS[self._mode](self, out, tools):
            pass
        return out

    # Each step consumes what it can of self._buf for its mode and returns whether parsing
    # goes on with what is left (False: wait for more text).

    def _step_start(self, out: StreamingParseResult, tools: Sequence[Any]) -> bool:
        self._mode = "call" if self._buf.startswith("{") else "text"
        if self._mode == "call":
            self._start_call(tools)
        return True

    def _step_text(self, out: StreamingParseResult, tools: Sequence[Any]) -> bool:
        idx = self._buf.find(self.bot_token)
        if idx < 0:
            keep = partial_suffix_len(self._buf, self.bot_token)
            out.normal_text += self._buf[: len(self._buf) - keep]
            self._buf = self._buf[len(self._buf) - keep :]
            return False
        out.normal_text += self._buf[:idx]
        self._buf = self._buf[idx + len(self.bot_token) :]
        self._mode = "call"
        self._start_call(tools)
        return True

    def _step_call(self, out: StreamingParseResult, tools: Sequence[Any]) -> bool:
        call = self._call
        if not self._feed_call(out):
            return False
        self._mode = "dead" if call is not None and call.failed else "after"
        return True

    def _step_after(self, out: StreamingParseResult, tools: Sequence[Any]) -> bool:
        if not self._trailing_begun:
            self._buf = self._buf.lstrip()
            if not self._buf:
                return False
            if self._buf.startswith(self.tool_call_separator):
                rest = self._buf[len(self.tool_call_separator) :].lstrip()
                if not rest:
                    return False  # wait for the next call
                self._buf = rest
                self._mode = "call"
                self._start_call(tools)
                return True
        # Text after the last call is answer text, stripped.
        emit = self._buf.rstrip()
        if emit:
            self._trailing_begun = True
            out.normal_text += emit
        self._buf = self._buf[len(emit) :]
        return False

    def _step_dead(self, out: StreamingParseResult, tools: Sequence[Any]) -> bool:
        self._buf = ""  # a malformed call ends the parsing of this reply
        return True

    _STEPS = {
        "start": _step_start,
        "text": _step_text,
        "call": _step_call,
        "after": _step_after,
        "dead": _step_dead,
    }
