"""The OpenAI-compatible routes (an APIRouter the server's app includes).

/v1/completions, /v1/chat/completions (also as SageMaker's /invocations), /v1/models/{model},
/v1/score, /tokenize, /detokenize with their /v1 aliases, and SGLang's native parser endpoints
/separate_reasoning and /parse_function_call. Bodies are parsed by FastAPI into the pydantic models of
protocol.py, so malformed JSON and schema errors reach http_server's RequestValidationError
handler (HTTP 400, OpenAI's error envelope); POSTs whose Content-Type is not
application/json are refused the same way, before the body is validated (SGLang).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from mini_sglang.entrypoints.http_helpers import (
    error_response,
    orjson_response,
    validate_json_request,
)
from mini_sglang.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    ModelCard,
)
from mini_sglang.entrypoints.openai.protocol_utility import (
    DetokenizeRequest,
    DetokenizeResponse,
    ParseFunctionCallReq,
    ScoringRequest,
    ScoringResponse,
    SeparateReasoningReqInput,
    TokenizeRequest,
    TokenizeResponse,
)
from mini_sglang.entrypoints.openai.serving_base import (
    create_error_response,
    fastapi_json_response,
    json_response,
)
from mini_sglang.entrypoints.openai.serving_chat import OpenAIServingChat
from mini_sglang.entrypoints.openai.serving_completions import OpenAIServingCompletion
from mini_sglang.entrypoints.server_state import ServerState, ServerStateDep
from mini_sglang.function_call.function_call_parser import FunctionCallParser
from mini_sglang.managers.scoring import score_request
from mini_sglang.parser.reasoning_parser import ReasoningParser

logger = logging.getLogger("mini_sglang")

# orjson (and JSON clients) cap integers at 64 bits; HF tokenizers without a limit report
# model_max_length as int(1e30).
_MAX_JSON_INT = (1 << 63) - 1


router = APIRouter()
_json_only = [Depends(validate_json_request)]

_Handler = TypeVar("_Handler", OpenAIServingChat, OpenAIServingCompletion)


def _handler(state: ServerState, cls: type[_Handler]) -> _Handler:
    """The server's `cls` handler, built on its first request (the chat one logs the model's
    default sampling parameters then) and kept in `state.handlers`."""
    if cls not in state.handlers:
        state.handlers[cls] = cls(state.tokenizer_manager)
    return state.handlers[cls]


@router.post("/v1/completions", dependencies=_json_only)
async def openai_v1_completions(
    request: CompletionRequest, raw_request: Request, state: ServerStateDep
) -> Response:
    return await _handler(state, OpenAIServingCompletion).handle_request(request, raw_request)


@router.post("/v1/chat/completions", dependencies=_json_only)
async def openai_v1_chat_completions(
    request: ChatCompletionRequest, raw_request: Request, state: ServerStateDep
) -> Response:
    return await _handler(state, OpenAIServingChat).handle_request(request, raw_request)


@router.post("/invocations")  # SageMaker's chat endpoint (SGLang: no Content-Type check)
async def sagemaker_chat_completions(
    request: ChatCompletionRequest, raw_request: Request, state: ServerStateDep
) -> Response:
    return await _handler(state, OpenAIServingChat).handle_request(request, raw_request)


@router.get("/v1/models/{model:path}")
async def retrieve_model(model: str, state: ServerStateDep) -> Response:
    served = state.server_args.served_model_name
    if model != served:
        error = {
            "message": f"The model '{model}' does not exist",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
        return orjson_response({"error": error}, 404)
    card = ModelCard(id=model, root=model, max_model_len=state.tokenizer_manager.context_len)
    return json_response(card)


@router.post("/v1/score", dependencies=_json_only)
async def v1_score_request(
    request: ScoringRequest, raw_request: Request, state: ServerStateDep
) -> Response:
    try:
        scores = await score_request(
            state.tokenizer_manager,
            query=request.query,
            items=request.items,
            label_token_ids=request.label_token_ids,
            apply_softmax=request.apply_softmax,
            item_first=request.item_first,
            request=raw_request,
        )
    except ValueError as e:
        return create_error_response(str(e))
    except Exception as e:  # SGLang's serving base: anything else is a 500
        logger.exception("Error in /v1/score")
        return create_error_response(
            f"Internal server error: {e}", err_type="InternalServerError", status_code=500
        )
    return fastapi_json_response(ScoringResponse(scores=scores, model=request.model))


def _no_tokenizer_error(tm: Any) -> Response | None:
    if tm.tokenizer is None:
        return create_error_response("--skip-tokenizer-init is set: no tokenizer to use.")
    return None


@router.post("/v1/tokenize", dependencies=_json_only)
@router.post("/tokenize", dependencies=_json_only, include_in_schema=False)
async def openai_v1_tokenize(request: TokenizeRequest, state: ServerStateDep) -> Response:
    tm = state.tokenizer_manager
    if (error := _no_tokenizer_error(tm)) is not None:
        return error
    max_len = getattr(tm.tokenizer, "model_max_length", -1)
    if not isinstance(max_len, int) or max_len > _MAX_JSON_INT:
        max_len = tm.context_len
    add = request.add_special_tokens
    if isinstance(request.prompt, str):
        ids = tm.tokenizer.encode(request.prompt, add_special_tokens=add)
        return json_response(TokenizeResponse(tokens=ids, count=len(ids), max_model_len=max_len))
    lists = [tm.tokenizer.encode(p, add_special_tokens=add) for p in request.prompt]
    return json_response(
        TokenizeResponse(tokens=lists, count=[len(x) for x in lists], max_model_len=max_len)
    )


@router.post("/v1/detokenize", dependencies=_json_only)
@router.post("/detokenize", dependencies=_json_only, include_in_schema=False)
async def openai_v1_detokenize(request: DetokenizeRequest, state: ServerStateDep) -> Response:
    tm = state.tokenizer_manager
    if (error := _no_tokenizer_error(tm)) is not None:
        return error
    skip = request.skip_special_tokens
    tokens = request.tokens
    vocab = tm.model_config.vocab_size
    flat = [t for x in tokens for t in (x if isinstance(x, list) else [x])]
    if any(t < 0 or t >= max(vocab, len(tm.tokenizer)) for t in flat):
        return create_error_response(
            f"Error decoding tokens: token ids must be in [0, {vocab - 1}]. Input tokens "
            "might be invalid for the model.",
            err_type="DecodeError",
        )
    if not tokens:
        text: str | list[str] = ""
    elif isinstance(tokens[0], int):
        text = tm.tokenizer.decode(tokens, skip_special_tokens=skip)
    else:
        text = [tm.tokenizer.decode(x, skip_special_tokens=skip) for x in tokens]
    return json_response(DetokenizeResponse(text=text))


@router.post("/separate_reasoning")
async def separate_reasoning_request(obj: SeparateReasoningReqInput) -> Response:
    """{"reasoning_text", "text"} of `text` under the named reasoning parser (its
    default forcing; non-stream rule)."""
    try:
        parser = ReasoningParser(model_type=obj.reasoning_parser)
    except ValueError as e:  # SGLang answers 500 here; a bad name is the client's fault
        return error_response(str(e))
    reasoning_text, text = parser.parse_non_stream(obj.text)
    return orjson_response({"reasoning_text": reasoning_text, "text": text})


@router.post("/parse_function_call")
async def parse_function_call_request(obj: ParseFunctionCallReq) -> Response:
    """{"normal_text", "calls": [{"tool_index", "name", "parameters"}]} of `text`
    under the named tool-call parser (non-stream rule)."""
    try:
        parser = FunctionCallParser(tools=obj.tools, tool_call_parser=obj.tool_call_parser)
    except ValueError as e:
        return error_response(str(e))
    normal_text, calls = parser.parse_non_stream(obj.text)
    return orjson_response(
        {"normal_text": normal_text, "calls": [dataclasses.asdict(c) for c in calls]}
    )
