"""The OpenAI Responses API routes (an APIRouter the server's app includes):
POST /v1/responses, GET /v1/responses/{response_id} and
POST /v1/responses/{response_id}/cancel, answered by the server's OpenAIServingResponses.

The body of POST /v1/responses is parsed by FastAPI into ResponsesRequest; a body that does
not fit (or a Content-Type other than application/json) is http_server's validation 400,
in OpenAI's nested envelope for every path under /v1/responses (SGLang).
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response

from mini_sglang.entrypoints.http_helpers import validate_json_request
from mini_sglang.entrypoints.openai.protocol_responses import ResponsesRequest
from mini_sglang.entrypoints.openai.response_store import ResponseStore
from mini_sglang.entrypoints.openai.serving_chat import OpenAIServingChat
from mini_sglang.entrypoints.openai.serving_responses import OpenAIServingResponses
from mini_sglang.entrypoints.server_state import ServerState, ServerStateDep

router = APIRouter()


def _responses(state: ServerState) -> OpenAIServingResponses:
    """The server's Responses handler (with its store), built on its first request and kept
    in `state.handlers`; it renders prompts with the server's chat handler."""
    handler = state.handlers.get(OpenAIServingResponses)
    if handler is None:
        chat = state.handlers.get(OpenAIServingChat)
        if chat is None:
            chat = state.handlers[OpenAIServingChat] = OpenAIServingChat(state.tokenizer_manager)
        handler = OpenAIServingResponses(state.tokenizer_manager, chat, ResponseStore())
        state.handlers[OpenAIServingResponses] = handler
    return handler


@router.post("/v1/responses", dependencies=[Depends(validate_json_request)])
async def v1_responses_request(
    request: ResponsesRequest, raw_request: Request, state: ServerStateDep
) -> Response:
    """Create a response (streamed when `stream` is true)."""
    return await _responses(state).create_responses(request, raw_request)


@router.get("/v1/responses/{response_id}")
async def v1_retrieve_responses(response_id: str, state: ServerStateDep) -> Response:
    """A stored response by id."""
    return await _responses(state).retrieve_responses(response_id)


@router.post("/v1/responses/{response_id}/cancel")
async def v1_cancel_responses(response_id: str, state: ServerStateDep) -> Response:
    """Cancel a queued or in-progress (background or streaming) response."""
    return await _responses(state).cancel_responses(response_id)
