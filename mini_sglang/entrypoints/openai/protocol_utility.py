"""Pydantic models of SGLang's utility endpoints beside the OpenAI ones: /separate_reasoning,
/parse_function_call, /tokenize, /detokenize (with their /v1 aliases) and /v1/score. Field
names, defaults and order are SGLang 0.5.4's, as in protocol.py."""

from __future__ import annotations

from typing import Optional, Union

from pydantic import BaseModel, Field

from mini_sglang.entrypoints.openai.protocol import DEFAULT_MODEL_NAME, Tool, UsageInfo


# ---- /separate_reasoning, /parse_function_call (SGLang's native parser endpoints) --------
class SeparateReasoningReqInput(BaseModel):
    text: str
    reasoning_parser: str


class ParseFunctionCallReq(BaseModel):
    text: str
    tools: list[Tool] = Field(default_factory=list)
    tool_call_parser: Optional[str] = None


# ---- /tokenize, /detokenize ------------------------------------------------------------
class TokenizeRequest(BaseModel):
    model: str = DEFAULT_MODEL_NAME
    prompt: Union[str, list[str]]
    add_special_tokens: bool = True


class TokenizeResponse(BaseModel):
    tokens: Union[list[int], list[list[int]]]
    count: Union[int, list[int]]
    max_model_len: int


class DetokenizeRequest(BaseModel):
    model: str = DEFAULT_MODEL_NAME
    tokens: Union[list[int], list[list[int]]]
    skip_special_tokens: bool = True


class DetokenizeResponse(BaseModel):
    text: Union[str, list[str]]


class ScoringRequest(BaseModel):
    """/v1/score (SGLang's decoder-only scoring; see managers/scoring.py)."""

    query: Optional[Union[str, list[int]]] = None
    items: Optional[Union[str, list[str], list[list[int]]]] = None
    label_token_ids: Optional[list[int]] = None
    apply_softmax: bool = False
    item_first: bool = False
    model: str = DEFAULT_MODEL_NAME


class ScoringResponse(BaseModel):
    scores: list[list[float]]  # per item, in label_token_ids order
    model: str
    usage: Optional[UsageInfo] = None
    object: str = "scoring"
