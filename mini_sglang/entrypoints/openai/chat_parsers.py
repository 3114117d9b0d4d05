"""Reasoning and tool calls on /v1/chat/completions: the parts of SGLang 0.5.4's
OpenAIServingChat that `--reasoning-parser` and `--tool-call-parser` switch on.

- Requests: `validate_tools` (SGLang's 400 messages), `tools_for_template` (the function
  dicts the chat template sees) and `tool_call_constraint` (the JSON schema that
  tool_choice "required" / a named function imposes).
- Non-stream replies: `parse_reply` splits reasoning off, then extracts calls; a reply
  with calls that stopped naturally gets finish_reason "tool_calls" (matched_stop null).
- Streams: one `ChoiceStreamParser` per choice turns text deltas into reasoning, answer
  and tool-call deltas; the serving layer sends them as SGLang's chunks.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from jsonschema import Draft202012Validator, SchemaError

from mini_sglang.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    FunctionResponse,
    ToolCall,
    ToolChoice,
)
from mini_sglang.function_call.core_types import ToolCallItem
from mini_sglang.function_call.function_call_parser import (
    FunctionCallParser,
    get_json_schema_constraint,
)
from mini_sglang.function_call.json_array_parser import JsonArrayParser
from mini_sglang.parser.reasoning_parser import ReasoningParser

# A chat template that opens the think block itself (e.g. Qwen3-Thinking-2507): the reply
# starts inside it. SGLang's TemplateManager looks for exactly this text.
_FORCED_THINK_TEMPLATE = re.compile(r"<\|im_start\|>assistant\\n<think>\\n")
# chat_template_kwargs key that turns thinking on, per reasoning parser (SGLang).
_THINKING_KWARG = {
    "qwen3": "enable_thinking",
    "glm45": "enable_thinking",
    "deepseek-v3": "thinking",
}


def template_forces_reasoning(template: str) -> bool:
    return _FORCED_THINK_TEMPLATE.search(template or "") is not None


def request_enables_thinking(request: ChatCompletionRequest, reasoning_parser: str | None) -> bool:
    """Whether chat_template_kwargs turn thinking on for this parser's model family."""
    key = _THINKING_KWARG.get(reasoning_parser or "")
    kwargs = request.chat_template_kwargs or {}
    return bool(key and kwargs.get(key, False))


def new_tool_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def tools_active(request: ChatCompletionRequest, tool_call_parser: str | None) -> bool:
    """Whether the reply is parsed for calls."""
    return bool(request.tools) and request.tool_choice != "none" and bool(tool_call_parser)


def is_forced_choice(tool_choice: Any) -> bool:
    """ "required" or a named function: the reply is a constrained JSON array of calls."""
    return tool_choice == "required" or isinstance(tool_choice, ToolChoice)


# ---- requests ------------------------------------------------------------------------------
def validate_tools(request: ChatCompletionRequest) -> str | None:
    """The 400 message for bad tools / tool_choice, or None (SGLang's checks and order).
    Without --tool-call-parser tools are still fine, as in SGLang: the template renders
    them and the reply comes back as plain content (tool_choice "required" / a named
    function still constrains it to the JSON array of calls)."""
    tools, choice = request.tools, request.tool_choice
    if choice == "required" and not tools:
        return "Tools cannot be empty if tool choice is set to required."
    if isinstance(choice, ToolChoice):
        if not tools:
            return "Tools cannot be empty if tool choice is set to a specific tool."
        if not any(t.function.name == choice.function.name for t in tools):
            return f"Tool '{choice.function.name}' not found in tools list."
    for i, tool in enumerate(tools or []):
        error = _schema_error(tool.function.parameters)
        if error:
            return f"Tool {i} function has invalid 'parameters' schema: {error}"
    return None


def _schema_error(schema: Any) -> str | None:
    """SGLang's check of a tool's `parameters`, whatever the tool_choice: a valid JSON
    Schema (Draft 2020-12), else the SchemaError's text."""
    if schema is None:
        return None
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as e:
        return str(e)
    return None


def tools_for_template(request: ChatCompletionRequest) -> list[dict] | None:
    """The `tools` the chat template renders: each tool's function dict (SGLang passes
    these, not the {"type", "function"} wrappers); only the named one for a named choice."""
    if not request.tools or request.tool_choice == "none":
        return None
    choice = request.tool_choice
    return [
        t.function.model_dump()
        for t in request.tools
        if not isinstance(choice, ToolChoice) or t.function.name == choice.function.name
    ]


def tool_call_constraint(request: ChatCompletionRequest) -> str | None:
    """The json_schema string that "required" / a named function constrains the reply to
    (SGLang applies it even without a parser), or None."""
    if not request.tools or not is_forced_choice(request.tool_choice):
        return None
    schema = get_json_schema_constraint(request.tools, request.tool_choice)
    return None if schema is None else json.dumps(schema)


# ---- non-stream replies ------------------------------------------------------------------
@dataclass
class ParsedReply:
    text: str
    reasoning_text: str | None = None
    tool_calls: list[ToolCall] | None = None
    finish_reason: dict | None = None


def parse_reply(
    text: str,
    finish_reason: Mapping[str, Any] | None,
    request: ChatCompletionRequest,
    reasoning_parser: str | None,
    tool_call_parser: str | None,
    force_reasoning: bool,
) -> ParsedReply:
    """A finished choice's text -> reasoning, answer text, tool calls, finish_reason."""
    out = ParsedReply(text=text, finish_reason=dict(finish_reason) if finish_reason else None)
    if reasoning_parser and request.separate_reasoning:
        parser = ReasoningParser(reasoning_parser, False, force_reasoning)
        out.reasoning_text, out.text = parser.parse_non_stream(text)
    if tools_active(request, tool_call_parser):
        _parse_tool_calls(out, request, tool_call_parser)
    return out


def _mark_tool_calls(finish_reason: dict | None) -> None:
    if finish_reason and finish_reason["type"] == "stop":
        finish_reason.update(type="tool_calls", matched=None)


def _parse_tool_calls(out: ParsedReply, request: ChatCompletionRequest, name: Any) -> None:
    if is_forced_choice(request.tool_choice):
        # The constrained reply is a JSON array of {"name", "parameters"}; finish_reason
        # becomes tool_calls even if it does not decode (SGLang).
        _mark_tool_calls(out.finish_reason)
        try:
            calls = [
                ToolCall(
                    id=new_tool_call_id(),
                    index=i,
                    function=FunctionResponse(
                        name=call["name"],
                        arguments=json.dumps(call["parameters"], ensure_ascii=False),
                    ),
                )
                for i, call in enumerate(orjson.loads(out.text))
            ]
        except (ValueError, TypeError, KeyError):
            return  # the text stays the answer (e.g. cut off by max_tokens)
        out.tool_calls, out.text = calls, ""
        return
    parser = FunctionCallParser(request.tools or [], name)
    if parser.has_tool_call(out.text):
        _mark_tool_calls(out.finish_reason)
        out.text, items = parser.parse_non_stream(out.text)
        out.tool_calls = [_tool_call(item, new_tool_call_id()) for item in items]


def _tool_call(item: ToolCallItem, call_id: str | None) -> ToolCall:
    return ToolCall(
        id=call_id,
        index=item.tool_index,
        function=FunctionResponse(name=item.name, arguments=item.parameters),
    )


# ---- streams -------------------------------------------------------------------------------
@dataclass
class StreamDelta:
    """What one text delta of a choice becomes."""

    reasoning_text: str = ""
    normal_text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)


class ChoiceStreamParser:
    """One streamed choice's parsers. `feed(delta, finished)` returns the deltas to send;
    with `finished` it also flushes what the parsers held back. `tools_active` says
    whether answer text goes through the tool parser (then SGLang sends it without
    logprobs); `has_tool_calls` whether any call was sent (finish_reason tool_calls)."""

    def __init__(
        self,
        request: ChatCompletionRequest,
        reasoning_parser: str | None,
        tool_call_parser: str | None,
        force_reasoning: bool,
    ) -> None:
        self.reasoning: ReasoningParser | None = None
        if reasoning_parser and request.separate_reasoning:
            self.reasoning = ReasoningParser(
                reasoning_parser, request.stream_reasoning, force_reasoning
            )
        self.tools_active = tools_active(request, tool_call_parser)
        self.tools: FunctionCallParser | None = None
        if self.tools_active:
            detector = JsonArrayParser() if is_forced_choice(request.tool_choice) else None
            self.tools = FunctionCallParser(request.tools or [], tool_call_parser, detector)
        self.has_tool_calls = False

    def feed(self, delta: str, finished: bool) -> StreamDelta:
        out = StreamDelta(normal_text=delta)
        if self.reasoning is not None:
            out.reasoning_text, out.normal_text = self.reasoning.parse_stream_chunk(delta)
            if finished:
                reasoning, normal = self.reasoning.finish()
                out.reasoning_text += reasoning
                out.normal_text += normal
        if self.tools is not None:
            normal, items = self.tools.parse_stream_chunk(out.normal_text)
            if finished:
                rest, more = self.tools.finish()
                normal += rest
                items += more
            out.normal_text = normal
            # The call id goes with the piece that names the function.
            out.tool_calls = [_tool_call(i, new_tool_call_id() if i.name else None) for i in items]
            self.has_tool_calls |= bool(items)
        return out
