"""Calls as a JSON array `[{"name": ..., "parameters": {...}}, ...]`: what the json_schema
constraint of `tool_choice: "required"` or a named function makes the model write,
whatever the model's own call format (SGLang 0.5.4).

Non-stream the serving layer decodes the array itself (calls numbered 0, 1, ...); this
detector is the stream side: no answer text, one streamed call per array element.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mini_sglang.function_call.base_detector import BaseFormatDetector
from mini_sglang.function_call.core_types import StreamingParseResult


class JsonArrayParser(BaseFormatDetector):
    def __init__(self) -> None:
        super().__init__()
        self._mode = "open"  # open ("[") -> call <-> after ("," or "]") -> done

    def has_tool_call(self, text: str) -> bool:
        return "[" in text or "{" in text

    def parse_streaming_increment(
        self, new_text: str, tools: Sequence[Any]
    ) -> StreamingParseResult:
        self._buf += new_text
        out = StreamingParseResult()
        while True:
            self._buf = self._buf.lstrip()
            if not self._buf or self._mode == "done":
                return out
            if self._mode == "call":
                call = self._call
                if not self._feed_call(out):
                    return out
                failed = call is not None and call.failed
                self._mode = "done" if failed else "after"
            elif self._mode == "open" or self._buf[0] == ",":
                if self._mode == "open" and self._buf[0] != "[":
                    self._mode = "done"  # not an array: nothing to stream
                    continue
                self._buf = self._buf[1:]
                self._mode = "call"
                self._start_call(tools)
            else:  # "]" or anything else ends the array
                self._mode = "done"
