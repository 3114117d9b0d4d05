"""The values tool-call detectors hand to the serving layer."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ToolCallItem:
    """One parsed call, or one streamed piece of a call.

    Non-stream: `name` and the complete `parameters` (a JSON string); `tool_index` is -1,
    as SGLang 0.5.4's format parsers leave it. Stream: the first piece of call `tool_index`
    (0, 1, ... within the reply) has the `name` and parameters "", later pieces have name
    None and the next part of the arguments' JSON.
    """

    tool_index: int
    name: str | None = None
    parameters: str = ""


@dataclass
class StreamingParseResult:
    """New answer text and call pieces from one parse step."""

    normal_text: str = ""
    calls: list[ToolCallItem] = field(default_factory=list)

    def extend(self, other: StreamingParseResult) -> None:
        self.normal_text += other.normal_text
        self.calls.extend(other.calls)
