"""The embedding-model endpoints, answered as SGLang 0.5.4 answers them on a generation model.

mini-sglang serves generation models only (`--is-embedding` is warned about and ignored), so
`/encode`, `/classify`, `/v1/embeddings`, `/v1/classify` and `/v1/rerank` always end in SGLang's
400 "This model does not appear to be an embedding model by default...". Before that, each
body is checked as SGLang checks it, so a malformed request gets the same message it would
get there: the native routes' "At least one of text, input_ids, or image should be provided"
(`{"error": {"message"}}`), the OpenAI routes' "Input cannot be empty" and the like
(OpenAI's error envelope).
"""

from __future__ import annotations

from typing import Any, Optional, Union

from fastapi import APIRouter, Depends
from fastapi.responses import Response
from pydantic import BaseModel

from mini_sglang.entrypoints.http_helpers import body_route, error_response, validate_json_request
from mini_sglang.entrypoints.openai.protocol import DEFAULT_MODEL_NAME
from mini_sglang.entrypoints.openai.serving_base import create_error_response
from mini_sglang.managers.io_struct.generate import EmbeddingReqInput

NOT_AN_EMBEDDING_MODEL = (
    "This model does not appear to be an embedding model by default. "
    "Please add `--is-embedding` when launching the server or try another model."
)


class MultimodalEmbeddingInput(BaseModel):
    text: Optional[str] = None
    image: Optional[str] = None


class EmbeddingRequest(BaseModel):
    input: Union[list[int], list[list[int]], str, list[str], list[MultimodalEmbeddingInput]]
    model: str = DEFAULT_MODEL_NAME
    encoding_format: str = "float"
    dimensions: Optional[int] = None
    user: Optional[str] = None


class ClassifyRequest(BaseModel):
    model: str = DEFAULT_MODEL_NAME
    input: Union[str, list[str], list[int]]
    user: Optional[str] = None


class V1RerankReqInput(BaseModel):
    query: str
    documents: list[str]


def native_input_error(obj: EmbeddingReqInput) -> str:
    """EmbeddingReqInput.normalize_batch_and_arguments' checks, then the model-kind error."""
    if obj.text is None and obj.input_ids is None and obj.image_data is None:
        return "At least one of text, input_ids, or image should be provided"
    if obj.text is not None and obj.input_ids is not None:
        return "text and input_ids cannot be provided at the same time"
    return NOT_AN_EMBEDDING_MODEL


def openai_input_error(value: Any) -> str | None:
    """SGLang's _validate_request of /v1/embeddings and /v1/classify (None: input is fine)."""
    if not value:
        return "Input cannot be empty"
    if isinstance(value, str):
        return None if value.strip() else "Input cannot be empty or whitespace only"
    if isinstance(value[0], str):
        for i, item in enumerate(value):
            if not isinstance(item, str):
                return "All items in input list must be strings"
            if not item.strip():
                return f"Input at index {i} cannot be empty or whitespace only"
    elif isinstance(value[0], int):
        for i, item in enumerate(value):
            if not isinstance(item, int):
                return "All items in input list must be integers"
            if item < 0:
                return f"Token ID at index {i} must be non-negative"
    return None


def rerank_input_error(request: V1RerankReqInput) -> str | None:
    if not request.query:
        return "Query cannot be empty"
    if not request.query.strip():
        return "Query cannot be empty or whitespace only"
    if not request.documents:
        return "Documents cannot be empty"
    for doc in request.documents:
        if not doc:
            return "Each document must be a non-empty string"
        if not doc.strip():
            return "Each document cannot be empty or whitespace only"
    return None


router = APIRouter()


async def native(_tokenizer_manager: Any, obj: EmbeddingReqInput) -> Response:
    return error_response(native_input_error(obj))


for _path in ("/encode", "/classify"):
    router.api_route(_path, methods=["POST", "PUT"])(body_route(EmbeddingReqInput, native))

_json_only = [Depends(validate_json_request)]


@router.post("/v1/embeddings", dependencies=_json_only)
async def openai_v1_embeddings(request: EmbeddingRequest) -> Response:
    return create_error_response(openai_input_error(request.input) or NOT_AN_EMBEDDING_MODEL)


@router.post("/v1/classify", dependencies=_json_only)
async def openai_v1_classify(request: ClassifyRequest) -> Response:
    return create_error_response(openai_input_error(request.input) or NOT_AN_EMBEDDING_MODEL)


@router.api_route("/v1/rerank", methods=["POST", "PUT"], dependencies=_json_only)
async def v1_rerank_request(request: V1RerankReqInput) -> Response:
    return create_error_response(rerank_input_error(request) or NOT_AN_EMBEDDING_MODEL)
