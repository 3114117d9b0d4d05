"""Pydantic models of the OpenAI Responses API (/v1/responses), after SGLang 0.5.4's
ResponsesRequest / ResponsesResponse and the `openai.types.responses` items and stream
events they are built from (field names, defaults and JSON key order).

Requests ignore unknown keys. `input` is a string (one user message) or a list of message
items ({"role", "content"} with a string or a list of input_text / output_text parts);
other item kinds (function calls, images, reasoning) are refused by the handler.
Usage is OpenAI's ResponseUsage (input / output / total tokens) in every response and
event, which the `openai` client reads as `response.usage`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, Field

from mini_sglang.entrypoints.openai.protocol import DEFAULT_MODEL_NAME

ResponseStatus = Literal["queued", "in_progress", "completed", "failed", "cancelled"]


def new_response_id() -> str:
    """A response id (also the request's rid): "resp_" + 32 hex digits."""
    return f"resp_{uuid.uuid4().hex}"


# ---- request -------------------------------------------------------------------------------
class ResponseReasoningParam(BaseModel):
    effort: Optional[Literal["low", "medium", "high"]] = "medium"


class ResponseTool(BaseModel):
    """A built-in tool (accepted and echoed back; no tool server runs them)."""

    type: Literal["web_search_preview", "code_interpreter"]


class ResponsesRequest(BaseModel):
    """The body of POST /v1/responses (SGLang's fields and defaults)."""

    background: Optional[bool] = False
    include: Optional[list[str]] = None
    input: Union[str, list[dict[str, Any]]]
    instructions: Optional[str] = None
    max_output_tokens: Optional[int] = None
    max_tool_calls: Optional[int] = None
    metadata: Optional[dict[str, Any]] = None
    model: Optional[str] = DEFAULT_MODEL_NAME
    parallel_tool_calls: Optional[bool] = True
    previous_response_id: Optional[str] = None
    reasoning: Optional[ResponseReasoningParam] = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] = "auto"
    store: Optional[bool] = True
    stream: Optional[bool] = False
    temperature: Optional[float] = None
    tool_choice: Literal["auto", "required", "none"] = "auto"
    tools: list[ResponseTool] = Field(default_factory=list)
    top_logprobs: Optional[int] = 0
    top_p: Optional[float] = None
    truncation: Optional[Literal["auto", "disabled"]] = "disabled"
    user: Optional[str] = None

    # SGLang's extras
    request_id: str = Field(default_factory=new_response_id)
    priority: int = 0
    extra_key: Optional[str] = None
    cache_salt: Optional[str] = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    stop: Optional[Union[str, list[str]]] = None
    top_k: int = -1
    min_p: float = 0.0
    repetition_penalty: float = 1.0


# ---- output items ---------------------------------------------------------------------------
class ResponseOutputText(BaseModel):
    annotations: list[Any] = Field(default_factory=list)
    text: str
    type: Literal["output_text"] = "output_text"
    logprobs: Optional[list[Any]] = None


class ResponseOutputMessage(BaseModel):
    id: str
    content: list[ResponseOutputText]
    role: Literal["assistant"] = "assistant"
    status: Literal["in_progress", "completed", "incomplete"]
    type: Literal["message"] = "message"


class ResponseReasoningTextContent(BaseModel):
    text: str
    type: Literal["reasoning_text"] = "reasoning_text"


class ResponseReasoningItem(BaseModel):
    id: str
    summary: list[Any] = Field(default_factory=list)
    type: Literal["reasoning"] = "reasoning"
    content: Optional[list[ResponseReasoningTextContent]] = None
    encrypted_content: Optional[str] = None
    status: Optional[Literal["in_progress", "completed", "incomplete"]] = None


ResponseOutputItem = Union[ResponseOutputMessage, ResponseReasoningItem]


# ---- response -------------------------------------------------------------------------------
class InputTokensDetails(BaseModel):
    cached_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int


class ResponsesResponse(BaseModel):
    """The `response` object (SGLang's field order)."""

    id: str
    object: Literal["response"] = "response"
    created_at: int = Field(default_factory=lambda: int(time.time()))
    model: str
    output: list[ResponseOutputItem] = Field(default_factory=list)
    status: ResponseStatus
    usage: Optional[ResponseUsage] = None
    parallel_tool_calls: bool = True
    tool_choice: str = "auto"
    tools: list[ResponseTool] = Field(default_factory=list)
    error: Optional[dict] = None
    incomplete_details: Optional[dict] = None
    instructions: Optional[str] = None
    max_output_tokens: Optional[int] = None
    previous_response_id: Optional[str] = None
    reasoning: Optional[dict] = None
    store: Optional[bool] = None
    temperature: Optional[float] = None
    text: Optional[dict] = None
    top_p: Optional[float] = None
    truncation: Optional[str] = None
    user: Optional[str] = None
    metadata: Optional[dict[str, Any]] = None

    @classmethod
    def from_request(
        cls,
        request: ResponsesRequest,
        created_at: int,
        output: list[ResponseOutputItem],
        status: str,
        usage: ResponseUsage | None,
    ) -> ResponsesResponse:
        """The response to `request` (SGLang's from_request): the request's settings echoed,
        text.format "text" when every output item is a message."""
        text_only = bool(output) and all(isinstance(i, ResponseOutputMessage) for i in output)
        return cls(
            id=request.request_id,
            created_at=created_at,
            model=request.model or DEFAULT_MODEL_NAME,
            output=output,
            status=status,  # type: ignore[arg-type]
            usage=usage,
            parallel_tool_calls=True,
            tool_choice=request.tool_choice,
            tools=request.tools,
            instructions=request.instructions,
            max_output_tokens=request.max_output_tokens,
            previous_response_id=request.previous_response_id,
            reasoning={
                "effort": request.reasoning.effort if request.reasoning else None,
                "summary": None,
            },
            store=request.store,
            temperature=request.temperature,
            text={"format": {"type": "text"}} if text_only else None,
            top_p=request.top_p,
            truncation=request.truncation,
            user=request.user,
            metadata=request.metadata or {},
        )

    @property
    def output_text(self) -> str:
        """The text of every output_text part of every message item, concatenated."""
        return "".join(
            part.text
            for item in self.output
            if isinstance(item, ResponseOutputMessage)
            for part in item.content
        )
