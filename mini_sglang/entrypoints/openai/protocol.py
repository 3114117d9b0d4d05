"""Pydantic models of the OpenAI-compatible API (SGLang 0.5.4's field names, defaults and
field order; the order is the JSON key order clients see).

Requests ignore unknown keys (pydantic's default), like SGLang. Responses serialise with
`model_dump_json()` (compact, one line). Fields SGLang only emits in features mini-sglang
lacks (hidden_states) are left out of the response models entirely.
"""

from __future__ import annotations

import time
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, Field, field_validator, model_validator

from mini_sglang.sampling.sampling_params import INT64_MAX, INT64_MIN

DEFAULT_MODEL_NAME = "default"

FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "function_call", "abort"]


# ---- shared ----------------------------------------------------------------------------
class ModelCard(BaseModel):
    id: str
    object: str = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "sglang"
    root: Optional[str] = None
    max_model_len: Optional[int] = None


class ErrorResponse(BaseModel):
    object: str = "error"
    message: str
    type: str
    param: Optional[str] = None
    code: int


class LogProbs(BaseModel):
    """Completions-style logprobs (also the intermediate form for chat logprobs)."""

    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[Optional[float]] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[Optional[dict[str, float]]] = Field(default_factory=list)


class TopLogprob(BaseModel):
    token: str
    bytes: list[int]
    logprob: float


class ChatCompletionTokenLogprob(BaseModel):
    token: str
    bytes: list[int]
    logprob: float
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[ChatCompletionTokenLogprob]


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: Optional[int] = 0
    # Only with --enable-cache-report (and a non-zero count): {"cached_tokens": N}.
    prompt_tokens_details: Optional[dict[str, int]] = None
    reasoning_tokens: Optional[int] = 0


class StreamOptions(BaseModel):
    include_usage: Optional[bool] = False


class JsonSchemaResponseFormat(BaseModel):
    name: str
    description: Optional[str] = None
    schema_: Optional[dict[str, object]] = Field(alias="schema", default=None)
    strict: Optional[bool] = False


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: Optional[JsonSchemaResponseFormat] = None


class _SglangExtras(BaseModel):
    """SGLang's extra request parameters shared by completions and chat."""

    min_tokens: int = 0
    regex: Optional[str] = None
    ebnf: Optional[str] = None
    stop_token_ids: Optional[list[int]] = None
    stop_regex: Optional[Union[str, list[str]]] = None
    no_stop_trim: bool = False
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    lora_path: Optional[Union[list[Optional[str]], str]] = None
    session_params: Optional[dict] = None
    custom_params: Optional[dict] = None
    custom_logit_processor: Optional[Union[list[Optional[str]], str]] = None
    return_hidden_states: bool = False
    rid: Optional[Union[list[str], str]] = None
    extra_key: Optional[Union[list[str], str]] = None
    cache_salt: Optional[Union[list[str], str]] = None
    priority: Optional[int] = None


def _check_seed(v: Optional[int]) -> Optional[int]:
    # The seed becomes the request's sampling_seed, an int64 in the batch's seed tensor.
    if v is not None and not INT64_MIN <= v <= INT64_MAX:
        raise ValueError(f"seed must be in [{INT64_MIN}, {INT64_MAX}], got {v}.")
    return v


# ---- /v1/completions -------------------------------------------------------------------
class CompletionRequest(_SglangExtras):
    model: str = DEFAULT_MODEL_NAME
    prompt: Union[list[int], list[list[int]], str, list[str]]
    best_of: Optional[int] = None
    echo: bool = False
    frequency_penalty: float = 0.0
    logit_bias: Optional[dict[str, float]] = None
    logprobs: Optional[int] = None
    max_tokens: int = 16
    n: int = 1
    presence_penalty: float = 0.0
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    suffix: Optional[str] = None
    temperature: float = 1.0
    top_p: float = 1.0
    user: Optional[str] = None
    top_k: int = -1
    min_p: float = 0.0
    json_schema: Optional[str] = None
    repetition_penalty: float = 1.0
    response_format: Optional[ResponseFormat] = None

    @field_validator("max_tokens")
    @classmethod
    def _max_tokens_positive(cls, v: int) -> int:
        if v is not None and v <= 0:
            raise ValueError("max_tokens must be positive")
        return v

    _seed_int64 = field_validator("seed")(_check_seed)


class CompletionResponseChoice(BaseModel):
    index: int
    text: str
    logprobs: Optional[LogProbs] = None
    finish_reason: Optional[Literal["stop", "length", "content_filter", "abort"]] = None
    matched_stop: Union[None, int, str] = None


class CompletionResponse(BaseModel):
    id: str
    object: str = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseChoice]
    usage: UsageInfo
    metadata: Optional[dict[str, Any]] = None


class CompletionStreamResponse(BaseModel):
    id: str
    object: str = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseChoice]
    usage: Optional[UsageInfo] = None


# ---- /v1/chat/completions --------------------------------------------------------------
class ChatCompletionMessageContentTextPart(BaseModel):
    type: Literal["text"]
    text: str


class ChatCompletionMessageContentMediaPart(BaseModel):
    """image_url / video_url / audio_url parts: accepted by the schema, refused (400) by
    the server, which has no multimodal models."""

    model_config = {"extra": "allow"}
    type: Literal["image_url", "video_url", "audio_url"]


ContentPart = Union[ChatCompletionMessageContentTextPart, ChatCompletionMessageContentMediaPart]


class FunctionResponse(BaseModel):
    name: Optional[str] = None
    arguments: Optional[Union[str, dict[str, Any]]] = None


class ToolCall(BaseModel):
    id: Optional[str] = None
    index: Optional[int] = None
    type: Literal["function"] = "function"
    function: FunctionResponse


class ChatCompletionMessageGenericParam(BaseModel):
    role: Literal["system", "assistant", "tool", "function"]
    content: Union[str, list[ChatCompletionMessageContentTextPart], None] = None
    tool_call_id: Optional[str] = None
    name: Optional[str] = None
    reasoning_content: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None

    @field_validator("role", mode="before")
    @classmethod
    def _normalize_role(cls, v: Any) -> str:
        if isinstance(v, str) and v.lower() in {"system", "assistant", "tool", "function"}:
            return v.lower()
        raise ValueError(
            "'role' must be one of 'system', 'assistant', 'tool', or 'function' (case-insensitive)."
        )


class ChatCompletionMessageUserParam(BaseModel):
    role: Literal["user"]
    content: Union[str, list[ContentPart]]


ChatCompletionMessageParam = Union[
    ChatCompletionMessageGenericParam, ChatCompletionMessageUserParam
]


class Function(BaseModel):
    description: Optional[str] = None
    name: str
    parameters: Optional[object] = None
    strict: bool = False


class Tool(BaseModel):
    type: str = "function"
    function: Function


class ToolChoiceFuncName(BaseModel):
    name: Optional[str] = None


class ToolChoice(BaseModel):
    """A named function: `{"type": "function", "function": {"name": ...}}`."""

    function: ToolChoiceFuncName
    type: Literal["function"] = "function"


class ChatCompletionRequest(_SglangExtras):
    messages: list[ChatCompletionMessageParam]
    model: str = DEFAULT_MODEL_NAME
    frequency_penalty: float = 0.0
    logit_bias: Optional[dict[str, float]] = None
    logprobs: bool = False
    top_logprobs: Optional[int] = None
    max_tokens: Optional[int] = None
    max_completion_tokens: Optional[int] = None
    n: int = 1
    presence_penalty: float = 0.0
    response_format: Optional[ResponseFormat] = None
    seed: Optional[int] = None
    stop: Optional[Union[str, list[str]]] = None
    stream: bool = False
    stream_options: Optional[StreamOptions] = None
    # None: the model's generation_config.json value, else the OpenAI default.
    temperature: Optional[float] = None
    top_p: Optional[float] = None
    user: Optional[str] = None
    tools: Optional[list[Tool]] = None
    tool_choice: Union[ToolChoice, Literal["auto", "required", "none"]] = "auto"
    reasoning_effort: Optional[Literal["low", "medium", "high"]] = "medium"
    top_k: Optional[int] = None
    min_p: Optional[float] = None
    repetition_penalty: Optional[float] = None
    continue_final_message: bool = False
    separate_reasoning: bool = True
    stream_reasoning: bool = True
    chat_template_kwargs: Optional[dict] = None

    _seed_int64 = field_validator("seed")(_check_seed)

    @model_validator(mode="before")
    @classmethod
    def _tool_choice_default(cls, values: Any) -> Any:
        # SGLang: no tools -> "none", tools -> "auto" (when tool_choice is not given).
        if isinstance(values, dict) and values.get("tool_choice") is None:
            values["tool_choice"] = "none" if values.get("tools") is None else "auto"
        return values

    @model_validator(mode="before")
    @classmethod
    def _reasoning_object(cls, values: Any) -> Any:
        # SGLang's normalize_reasoning_inputs: {"reasoning": {"effort", "enabled"}} (or
        # "reasoning_effort" / "enable") sets reasoning_effort, and turns on the template's
        # "thinking" kwarg unless the request sets it.
        r = values.get("reasoning") if isinstance(values, dict) else None
        if not isinstance(r, dict):
            return values
        effort = r.get("effort") or r.get("reasoning_effort")
        if effort in {"low", "medium", "high"}:
            values["reasoning_effort"] = effort
        enabled = r.get("enabled") if r.get("enabled") is not None else r.get("enable", False)
        if isinstance(enabled, str):
            enabled = enabled.strip().lower() in {"1", "true", "yes", "y", "on"}
        if enabled:
            kwargs = values.get("chat_template_kwargs")
            kwargs = kwargs if isinstance(kwargs, dict) else {}
            kwargs.setdefault("thinking", True)
            values["chat_template_kwargs"] = kwargs
        return values

    @model_validator(mode="before")
    @classmethod
    def _json_schema_shorthand(cls, values: Any) -> Any:
        # SGLang's set_json_schema: {"type": "json_schema", "schema": {...}} (no json_schema
        # object) means json_schema {"name": schema title or "Schema", "schema", "strict"},
        # strict when the schema's own "strict" property (removed) defaults to true.
        fmt = values.get("response_format") if isinstance(values, dict) else None
        if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
            return values
        schema = fmt.pop("schema", None)
        if fmt.get("json_schema") or not isinstance(schema, dict):
            return values
        properties = schema.get("properties")
        strict = properties.pop("strict", None) if isinstance(properties, dict) else None
        fmt["json_schema"] = {
            "name": schema.get("title", "Schema"),
            "schema": schema,
            "strict": isinstance(strict, dict) and bool(strict.get("default", False)),
        }
        return values


class ChatMessage(BaseModel):
    role: Optional[str] = None
    content: Optional[str] = None
    reasoning_content: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None


class ChatCompletionResponseChoice(BaseModel):
    index: int
    message: ChatMessage
    logprobs: Optional[Union[LogProbs, ChoiceLogprobs]] = None
    finish_reason: Optional[FinishReason] = None
    matched_stop: Union[None, int, str] = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: str = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseChoice]
    usage: UsageInfo
    metadata: Optional[dict[str, Any]] = None


class DeltaMessage(BaseModel):
    role: Optional[str] = None
    content: Optional[str] = None
    reasoning_content: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None


class ChatCompletionResponseStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: Optional[Union[LogProbs, ChoiceLogprobs]] = None
    finish_reason: Optional[FinishReason] = None
    matched_stop: Union[None, int, str] = None


class ChatCompletionStreamResponse(BaseModel):
    id: str
    object: str = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseStreamChoice]
    usage: Optional[UsageInfo] = None
