"""`--tool-call-parser`: the registry of call-format detectors, the parser the chat
endpoint uses per reply, and the constraint SGLang 0.5.4 puts on `tool_choice`.

tool_choice "required" / a named function: the reply is constrained by a JSON schema to
an array of `{"name", "parameters"}` objects (see `get_json_schema_constraint`), whatever
the model's own format. "auto": the model writes calls in its format and the detector
finds them (SGLang's structural_tag for `strict` tools is not implemented here).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mini_sglang.function_call.base_detector import BaseFormatDetector
from mini_sglang.function_call.core_types import ToolCallItem
from mini_sglang.function_call.llama32_detector import Llama32Detector
from mini_sglang.function_call.qwen25_detector import Qwen25Detector

# --tool-call-parser name -> detector. SGLang 0.5.4 renames qwen25 to qwen at start-up.
TOOL_CALL_PARSERS: dict[str, type[BaseFormatDetector]] = {
    "llama3": Llama32Detector,
    "qwen": Qwen25Detector,
    "qwen25": Qwen25Detector,
}
# Every name SGLang 0.5.4 accepts on the command line.
SGLANG_TOOL_CALL_PARSERS = ["deepseekv3", "deepseekv31", "glm", "glm45", "gpt-oss", "kimi_k2",
                            "llama3", "mistral", "pythonic", "qwen", "qwen25", "qwen3_coder",
                            "step3"]  # fmt: skip


class FunctionCallParser:
    """The detector of `tool_call_parser` (ValueError if unknown), or the given `detector`,
    bound to the request's tools. Without tools nothing is a call: the text passes
    through."""

    def __init__(
        self,
        tools: Sequence[Any],
        tool_call_parser: str | None,
        detector: BaseFormatDetector | None = None,
    ) -> None:
        if detector is None:
            detector_class = TOOL_CALL_PARSERS.get(tool_call_parser or "")
            if detector_class is None:
                raise ValueError(f"Unsupported tool_call_parser: {tool_call_parser}")
            detector = detector_class()
        self.detector = detector
        self.tools = list(tools)

    def has_tool_call(self, text: str) -> bool:
        return bool(self.tools) and self.detector.has_tool_call(text)

    def parse_non_stream(self, full_text: str) -> tuple[str, list[ToolCallItem]]:
        """(answer text, calls). When no call decodes the whole text is the answer."""
        if not self.tools:
            return full_text, []
        result = self.detector.detect_and_parse(full_text, self.tools)
        if not result.calls:
            return full_text, []
        return result.normal_text, result.calls

    def parse_stream_chunk(self, chunk_text: str) -> tuple[str, list[ToolCallItem]]:
        """(answer delta, call pieces) for the next piece of a streamed reply."""
        if not self.tools:
            return chunk_text, []
        result = self.detector.parse_streaming_increment(chunk_text, self.tools)
        return result.normal_text, result.calls

    def finish(self) -> tuple[str, list[ToolCallItem]]:
        """What the stream held back until the reply ended."""
        if not self.tools:
            return "", []
        result = self.detector.finish(self.tools)
        return result.normal_text, result.calls


def _tool_schema(tool: Any) -> dict:
    params = tool.function.parameters or {"type": "object", "properties": {}}
    return {
        "properties": {
            "name": {"type": "string", "enum": [tool.function.name]},
            "parameters": params,
        },
        "required": ["name", "parameters"],
    }


def _schema_defs(tools: Sequence[Any]) -> dict:
    """The tools' `$defs` merged (the array schema has one namespace for them)."""
    defs: dict = {}
    for tool in tools:
        params = tool.function.parameters
        for name, schema in (params.get("$defs", {}) if isinstance(params, dict) else {}).items():
            if name in defs and defs[name] != schema:
                raise ValueError(
                    f"Tool definition '{name}' has multiple schemas, which is not supported."
                )
            defs[name] = schema
    return defs


def get_json_schema_constraint(tools: Sequence[Any], tool_choice: Any) -> dict | None:
    """The JSON schema SGLang constrains "required" (an array of at least one call of any
    tool) and a named function (exactly one call of it) to; None for "auto"/"none"."""
    if not isinstance(tool_choice, str):
        for tool in tools:
            if tool.function.name == tool_choice.function.name:
                return {"type": "array", "minItems": 1, "maxItems": 1, "items": _tool_schema(tool)}
        return None
    if tool_choice != "required":
        return None
    schema: dict = {
        "type": "array",
        "minItems": 1,
        "items": {"type": "object", "anyOf": [_tool_schema(t) for t in tools]},
    }
    defs = _schema_defs(tools)
    if defs:
        schema["$defs"] = defs
    return schema
