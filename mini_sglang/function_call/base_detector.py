"""What every tool-call format detector shares: the per-call JSON streamer and the
contract of the two parsing interfaces.

A detector instance parses one reply. `detect_and_parse(text, tools)` is SGLang 0.5.4's
one-shot rule for the format. `parse_streaming_increment(delta, tools)` then `finish(tools)`
is the stream: the answer text before the first call (formats may hold back a partial
call marker and trailing whitespace), then per call a piece with its name and pieces with
argument JSON, whose concatenation is `json.dumps(arguments, ensure_ascii=False)`, i.e.
the non-stream `parameters`. A call whose name is not among the tools is dropped (with a
warning), as in SGLang; so is the rest of a call whose JSON turns out malformed.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from mini_sglang.function_call.core_types import (
    StreamingParseResult,
    ToolCallItem,
)
from mini_sglang.function_call.partial_json import (
    MalformedJSON,
    PartialStr,
    parse_partial,
    stable_prefix,
)

logger = logging.getLogger("mini_sglang")


def tool_names(tools: Sequence[Any]) -> set[str]:
    return {t.function.name for t in tools if t.function.name}


def call_arguments(call: dict) -> Any:
    """A call's arguments: "parameters" (Llama's key, and the JSON-array form) or
    "arguments" (Hermes/Qwen), an empty object when absent (SGLang's rule)."""
    return call.get("parameters") or call.get("arguments", {})


def parse_base_json(action: Any, tools: Sequence[Any]) -> list[ToolCallItem]:
    """Calls from decoded JSON (one call object or a list of them); unknown names are
    skipped. tool_index is -1: SGLang's format parsers do not number non-stream calls."""
    names = tool_names(tools)
    calls = []
    for act in action if isinstance(action, list) else [action]:
        name = act.get("name") if isinstance(act, dict) else None
        if name and name in names:
            args = json.dumps(call_arguments(act), ensure_ascii=False)
            calls.append(ToolCallItem(tool_index=-1, name=name, parameters=args))
        else:
            logger.warning("Model attempted to call undefined function: %s", name)
    return calls


class CallStreamer:
    """Streams one call object `{"name": ..., "arguments"|"parameters": {...}}` as its JSON
    text grows. `feed(text)` gets the whole object text so far (it may run past the
    object's end) and returns the new pieces; then `complete` / `end` tell whether and
    where the object ended, and `failed` whether it was dropped."""

    def __init__(self, tool_index: int, names: set[str]) -> None:
        self.tool_index = tool_index
        self.names = names
        self.name_sent = False
        self.sent_args = ""
        self.complete = False
        self.failed = False
        self.end = 0
        self._value: dict | None = None

    def feed(self, text: str) -> list[ToolCallItem]:
        try:
            value, self.end, self.complete = parse_partial(text)
        except MalformedJSON as e:
            logger.warning("Malformed tool call JSON %r: %s", text, e)
            self.failed = True
            return []
        if value is None:
            return []
        if not isinstance(value, dict):
            self.failed = True
            return []
        self._value = value
        out: list[ToolCallItem] = []
        name = value.get("name")
        if not self.name_sent:
            if not isinstance(name, str) or isinstance(name, PartialStr):
                if self.complete:  # an object without a name is no call
                    self.failed = True
                return out
            if name not in self.names:
                logger.warning("Model attempted to call undefined function: %s", name)
                self.failed = True
                return out
            self.name_sent = True
            out.append(ToolCallItem(self.tool_index, name=name, parameters=""))
        key = "parameters" if "parameters" in value else "arguments"
        if self.complete:
            return out + self._send(json.dumps(call_arguments(value), ensure_ascii=False))
        if key in value:
            return out + self._send(stable_prefix(value[key]))
        return out

    def close(self) -> list[ToolCallItem]:
        """The call broke off (reply ended, or malformed JSON followed): complete its
        arguments JSON as far as it went (SGLang sends the same rest at the end of the
        reply), so clients still get valid JSON."""
        if self.complete or not self.name_sent or self._value is None:
            return []
        return self._send(json.dumps(call_arguments(self._value), ensure_ascii=False))

    def _send(self, args: str) -> list[ToolCallItem]:
        if len(args) <= len(self.sent_args) or not args.startswith(self.sent_args):
            return []
        diff = args[len(self.sent_args) :]
        self.sent_args = args
        return [ToolCallItem(self.tool_index, name=None, parameters=diff)]


class BaseFormatDetector:
    """Common streaming state: the text buffer, the call in progress and the next index."""

    def __init__(self) -> None:
        self._buf = ""
        self._call: CallStreamer | None = None
        self._next_index = 0
        # The format's stream state; in "text" the buffer holds answer text kept back in
        # case it is the start of a call marker.
        self._mode = "text"

    def has_tool_call(self, text: str) -> bool:
        """Whether `text` contains this format's call marker."""
        raise NotImplementedError

    def detect_and_parse(self, text: str, tools: Sequence[Any]) -> StreamingParseResult:
        raise NotImplementedError

    def parse_streaming_increment(
        self, new_text: str, tools: Sequence[Any]
    ) -> StreamingParseResult:
        raise NotImplementedError

    def finish(self, tools: Sequence[Any]) -> StreamingParseResult:
        """End of the reply: the held-back answer text and the rest of a cut-off call."""
        out = StreamingParseResult()
        if self._call is not None:
            out.calls.extend(self._call.close())
        if self._mode == "text":
            out.normal_text += self._buf
        self._buf = ""
        return out

    def _start_call(self, tools: Sequence[Any]) -> None:
        self._call = CallStreamer(self._next_index, tool_names(tools))

    def _feed_call(self, out: StreamingParseResult) -> bool:
        """Feed the buffer to the call in progress; True when it ended (complete or
        dropped), with the buffer then holding the text after it."""
        call = self._call
        assert call is not None
        out.calls.extend(call.feed(self._buf))
        if not (call.failed or call.complete):
            return False
        # A failed call leaves its text in the buffer: formats skip to their next marker.
        if call.complete and not call.failed:
            self._buf = self._buf[call.end :]
        self._call = None
        if call.name_sent:  # a named call keeps its index even if it broke off later
            self._next_index += 1
        if call.failed:
            out.calls.extend(call.close())
        return True
