"""/v1/rerank (SGLang's OpenAIServingRerank): score each document against a query with a
cross-encoder and return them best first.

The body is SGLang 0.5.4's V1RerankReqInput (`query`, `documents`) plus `top_n` (keep only
the best N) and `return_documents` (false leaves `document` out of each result). The
(query, document) pairs go to the TokenizerManager as one cross-encoder EmbeddingReqInput:
each pair is tokenized as a text pair (token types for BERT-style tokenizers) and the model's
score is the request's `embedding`. The answer is a JSON list of
`{"score", "document", "index", "meta_info"}` sorted by score, highest first (`index` is the
document's position in the request). A generation model, or a bad body, gets SGLang's 400 in
OpenAI's error envelope; so does an embedding model that is no cross-encoder (its outputs
are vectors, not scores), which SGLang answers with a 500.
"""

from __future__ import annotations

from typing import Any, Optional

from fastapi.encoders import jsonable_encoder
from fastapi.responses import Response
from pydantic import BaseModel

from mini_sglang.entrypoints.http_helpers import http_exception_response
from mini_sglang.entrypoints.openai.serving_base import create_error_response
from mini_sglang.managers.input_checks import NOT_AN_EMBEDDING_MODEL
from mini_sglang.managers.io_struct.generate import EmbeddingReqInput
from mini_sglang.managers.tokenizer_manager import RequestAborted, SchedulerRefused
from mini_sglang.utils.json_body import fastapi_default_response

NOT_A_CROSS_ENCODER = (
    "This model gives no single score per input: /v1/rerank needs a cross-encoder "
    "(a sequence-classification model with one label)."
)


class V1RerankReqInput(BaseModel):
    query: str
    documents: list[str]
    top_n: Optional[int] = None
    return_documents: bool = True


class RerankResponse(BaseModel):
    score: float
    document: Optional[str] = None
    index: int
    meta_info: Optional[dict] = None


def rerank_input_error(request: V1RerankReqInput) -> str | None:
    """SGLang's _validate_request, then top_n's range (None: the body is fine)."""
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
    if request.top_n is not None and request.top_n < 1:
        return "top_n must be a positive integer"
    return None


def to_embedding_request(request: V1RerankReqInput) -> EmbeddingReqInput:
    """One cross-encoder request whose inputs are the [query, document] pairs in order."""
    pairs = [[request.query, doc] for doc in request.documents]
    return EmbeddingReqInput(text=pairs, is_cross_encoder_request=True)


def build_rerank_response(ret: list[dict], request: V1RerankReqInput) -> list[dict[str, Any]]:
    """Results (one per document, in request order, each with a scalar `embedding`) ->
    the response list: highest score first (ties keep request order), cut to top_n."""
    results = [
        RerankResponse(
            score=item["embedding"],
            document=request.documents[i] if request.return_documents else None,
            index=i,
            meta_info=item["meta_info"],
        )
        for i, item in enumerate(ret)
    ]
    results.sort(key=lambda r: r.score, reverse=True)
    if request.top_n is not None:
        results = results[: request.top_n]
    exclude = None if request.return_documents else {"document"}
    return [jsonable_encoder(r, exclude=exclude) for r in results]


async def serve_rerank(tokenizer_manager: Any, request: V1RerankReqInput, raw: Any) -> Response:
    """The /v1/rerank answer: the sorted list, or OpenAI's error envelope: 400 for a bad
    body, a generation model, a model whose output is not one score per input, or a
    ValueError from the TokenizerManager (an over-long pair); the scheduler's refusal
    (a full queue: 503) as SGLang's HTTPException answer."""
    error = rerank_input_error(request)
    if error is None and tokenizer_manager.is_generation:
        error = NOT_AN_EMBEDDING_MODEL
    if error is not None:
        return create_error_response(error)
    try:
        ret = await tokenizer_manager.generate_request(
            to_embedding_request(request), raw
        ).__anext__()
    except (ValueError, TypeError, RequestAborted) as e:
        return create_error_response(str(e))
    except SchedulerRefused as e:
        return http_exception_response(e.status_code, e.message)
    ret = ret if isinstance(ret, list) else [ret]
    if not all(isinstance(item["embedding"], (int, float)) for item in ret):
        return create_error_response(NOT_A_CROSS_ENCODER)
    return fastapi_default_response(build_rerank_response(ret, request))
