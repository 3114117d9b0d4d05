"""The embedding-model endpoints: /encode, /classify, /v1/embeddings, /v1/classify, /v1/rerank.

On an embedding / score model (``--is-embedding`` or an embedding architecture) /encode and
/classify answer SGLang's dict ``{"embedding": [...], "meta_info": {...}}`` (a list of them
for a batch; for a classifier the "embedding" is the row of scores), /v1/embeddings
OpenAI's EmbeddingResponse (``encoding_format`` "float" or "base64", ``dimensions`` for
Matryoshka models) and /v1/classify SGLang's ClassifyResponse (softmax of the scores, the
argmax's id2label name), /v1/rerank on a cross-encoder the documents sorted by score
(entrypoints/openai/serving_rerank.py). A bad input is a 400 before anything reaches the
scheduler.

On a generation model every route ends in SGLang's 400 "This model does not appear to be an
embedding model by default...". Before that, each body is checked as SGLang checks it, so a
malformed request gets the same message it would get there: the native routes' "At least
one of text, input_ids, or image should be provided" (`{"error": {"message"}}`), the OpenAI
routes' "Input cannot be empty" and the like (OpenAI's error envelope).
"""

from __future__ import annotations

import base64
import time
import uuid
from typing import Any, Optional, Union

import torch
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from pydantic import BaseModel

from mini_sglang.entrypoints.http_helpers import (
    error_response,
    http_exception_response,
    parse_error_response,
    parse_request,
    validate_json_request,
)
from mini_sglang.entrypoints.openai.protocol import DEFAULT_MODEL_NAME, UsageInfo
from mini_sglang.entrypoints.openai.serving_base import (
    create_error_response,
    fastapi_json_response,
)
from mini_sglang.entrypoints.openai.serving_rerank import V1RerankReqInput, serve_rerank
from mini_sglang.entrypoints.server_state import server_state
from mini_sglang.managers.input_checks import NOT_AN_EMBEDDING_MODEL
from mini_sglang.managers.io_struct.generate import EmbeddingReqInput
from mini_sglang.managers.tokenizer_manager import RequestAborted, SchedulerRefused
from mini_sglang.utils.json_body import fastapi_default_response

__all__ = ["NOT_AN_EMBEDDING_MODEL", "router"]


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


class EmbeddingObject(BaseModel):
    embedding: Union[list[float], str]  # a str: base64 of little-endian float32
    index: int
    object: str = "embedding"


class EmbeddingResponse(BaseModel):
    data: list[EmbeddingObject]
    model: str
    object: str = "list"
    usage: Optional[UsageInfo] = None


class ClassifyData(BaseModel):
    index: int
    label: str
    probs: list[float]
    num_classes: int


class ClassifyResponse(BaseModel):
    id: str
    object: str = "list"
    created: int
    model: str
    data: list[ClassifyData]
    usage: UsageInfo


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


router = APIRouter()


async def _run(tm: Any, obj: EmbeddingReqInput, request: Request | None) -> list[dict]:
    """The request's outputs, one dict per input (ValueError for a bad input)."""
    ret = await tm.generate_request(obj, request).__anext__()
    return ret if isinstance(ret, list) else [ret]


def _openai_error(tm: Any, value: Any) -> str | None:
    """The first error of an OpenAI-style request's input (openai_input_error), then of the
    model kind (a generation model serves no embeddings or scores); None if there is none."""
    error = openai_input_error(value)
    if error is None and tm.is_generation:
        error = NOT_AN_EMBEDDING_MODEL
    return error


async def _run_openai(tm: Any, obj: EmbeddingReqInput, request: Request) -> list[dict] | Response:
    """The request's outputs (one dict per input), or the OpenAI error response for an input
    the TokenizerManager rejects, an aborted request or a scheduler refusal."""
    try:
        return await _run(tm, obj, request)
    except (ValueError, TypeError, RequestAborted) as e:
        return create_error_response(str(e))
    except SchedulerRefused as e:
        return http_exception_response(e.status_code, e.message)


async def native(request: Request) -> Response:
    """/encode and /classify: SGLang returns the TokenizerManager's dict (or list) as is."""
    tm = server_state(request).tokenizer_manager
    try:
        obj = await parse_request(request, EmbeddingReqInput)
    except ValueError as e:
        return parse_error_response(e)
    if tm.is_generation:
        return error_response(native_input_error(obj))
    try:
        ret = await tm.generate_request(obj, request).__anext__()
    except (ValueError, TypeError, RequestAborted) as e:
        return error_response(str(e))
    except SchedulerRefused as e:
        return http_exception_response(e.status_code, e.message)
    return fastapi_default_response(ret)


for _path in ("/encode", "/classify"):
    router.api_route(_path, methods=["POST", "PUT"])(native)

_json_only = [Depends(validate_json_request)]


def openai_to_internal(value: Any) -> EmbeddingReqInput:
    """SGLang's _convert_to_internal_request: a string or list of strings is text, a list
    of ints one tokenized input, a list of lists a batch of them; multimodal items' text
    (an image is refused: no multimodal model is served)."""
    if isinstance(value, str) or (isinstance(value, list) and isinstance(value[0], str)):
        return EmbeddingReqInput(text=value)
    if isinstance(value, list) and isinstance(value[0], MultimodalEmbeddingInput):
        if any(item.image is not None for item in value):
            raise ValueError("Image inputs are not supported by this model.")
        texts = [item.text if item.text is not None else "padding" for item in value]
        return EmbeddingReqInput(text=texts[0] if len(texts) == 1 else texts)
    return EmbeddingReqInput(input_ids=value)


def matryoshka_error(hf_config: Any, dimensions: int | None, size: int) -> str | None:
    """Why `dimensions` cannot be served (None: fine): the model's config must declare
    Matryoshka training (``is_matryoshka`` or ``matryoshka_dimensions``, which then lists
    the allowed sizes), and the size must be in 1..the embedding size."""
    if dimensions is None:
        return None
    allowed = getattr(hf_config, "matryoshka_dimensions", None)
    if not getattr(hf_config, "is_matryoshka", False) and not allowed:
        return (
            "The model does not support matryoshka representation, changing output "
            "dimensions will lead to poor results."
        )
    if dimensions < 1 or dimensions > size:
        return f"Requested dimensions must be in [1, {size}], got {dimensions}."
    if allowed and dimensions not in allowed:
        return (
            f"The model only supports {list(allowed)} matryoshka dimensions, "
            "using other output dimensions will lead to poor results."
        )
    return None


def shape_embedding(vector: list[float], dimensions: int | None, encoding: str) -> list | str:
    """Truncate to `dimensions` (re-normalized when the full vector was: a normalizing
    model's truncated vectors stay unit vectors) and encode as floats or base64."""
    if dimensions is not None:
        full = torch.tensor(vector, dtype=torch.float32)
        cut = full[:dimensions]
        if abs(float(full.norm()) - 1.0) < 1e-3:
            cut = torch.nn.functional.normalize(cut, dim=0)
        vector = cut.tolist()
    if encoding == "base64":
        data = torch.tensor(vector, dtype=torch.float32).numpy().astype("<f4").tobytes()
        return base64.b64encode(data).decode()
    return vector


@router.post("/v1/embeddings", dependencies=_json_only)
async def openai_v1_embeddings(request: EmbeddingRequest, raw_request: Request) -> Response:
    tm = server_state(raw_request).tokenizer_manager
    error = _openai_error(tm, request.input)
    if error is None and request.encoding_format not in ("float", "base64"):
        error = f"encoding_format must be 'float' or 'base64', got {request.encoding_format!r}."
    if error is None:
        error = matryoshka_error(
            tm.model_config.hf_config, request.dimensions, tm.model_config.hidden_size
        )
    if error is not None:
        return create_error_response(error)
    ret = await _run_openai(tm, openai_to_internal(request.input), raw_request)
    if isinstance(ret, Response):
        return ret
    data = [
        EmbeddingObject(
            embedding=shape_embedding(r["embedding"], request.dimensions, request.encoding_format),
            index=i,
        )
        for i, r in enumerate(ret)
    ]
    prompt_tokens = sum(r["meta_info"].get("prompt_tokens", 0) for r in ret)
    usage = UsageInfo(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens)
    return fastapi_json_response(
        EmbeddingResponse(data=data, model=tm.server_args.model_path, usage=usage)
    )


def classify_data(index: int, scores: list[float] | float | None, id2label: dict) -> ClassifyData:
    """SGLang's per-input entry: softmax of the scores and the argmax's label. A single-label
    cross-encoder's score is one number: one class (SGLang fails on it with a 500)."""
    if isinstance(scores, (int, float)):
        scores = [float(scores)]
    probs, label = [1.0], "Default"  # SGLang's answer without scores or without a label
    if scores:
        logits = torch.tensor(scores, dtype=torch.float32)
        predicted = int(torch.argmax(logits))
        if predicted in id2label:
            probs, label = torch.softmax(logits, dim=0).tolist(), id2label[predicted]
    return ClassifyData(index=index, label=label, probs=probs, num_classes=len(probs))


@router.post("/v1/classify", dependencies=_json_only)
async def openai_v1_classify(request: ClassifyRequest, raw_request: Request) -> Response:
    tm = server_state(raw_request).tokenizer_manager
    error = _openai_error(tm, request.input)
    if error is not None:
        return create_error_response(error)
    ret = await _run_openai(tm, openai_to_internal(request.input), raw_request)
    if isinstance(ret, Response):
        return ret
    hf = tm.model_config.hf_config
    id2label = getattr(hf, "id2label", None) or {
        i: f"LABEL_{i}" for i in range(getattr(hf, "num_labels", 0) or 0)
    }
    prompt_tokens = sum(r["meta_info"].get("prompt_tokens", 0) for r in ret)
    sa = tm.server_args
    return fastapi_json_response(
        ClassifyResponse(
            id=f"classify-{uuid.uuid4().hex}",
            created=int(time.time()),
            model=sa.served_model_name or sa.model_path,
            data=[classify_data(i, r["embedding"], id2label) for i, r in enumerate(ret)],
            usage=UsageInfo(prompt_tokens=prompt_tokens, total_tokens=prompt_tokens),
        )
    )


@router.api_route("/v1/rerank", methods=["POST", "PUT"], dependencies=_json_only)
async def v1_rerank_request(request: V1RerankReqInput, raw_request: Request) -> Response:
    return await serve_rerank(server_state(raw_request).tokenizer_manager, request, raw_request)
