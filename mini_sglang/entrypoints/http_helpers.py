"""What the HTTP routes share: native responses, SSE framing and request-body parsing.

Native responses are compact one-line orjson (clients such as bench_serving read line by
line); native errors are 400 {"error": {"message": ...}}; a body that does not fit its
request type is SGLang's validation 400 {"object": "error", "message", "type": "Bad
Request", "param": null, "code": 400}. Streams are SSE events `data: <json>\\n\\n` ending
with `data: [DONE]\\n\\n`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import orjson
from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response

from mini_sglang.entrypoints.server_state import server_state
from mini_sglang.utils.dataclass_validation import BodyValidationError, validate_dataclass
from mini_sglang.utils.unicode_check import json_safe

SSE_DONE = b"data: [DONE]\n\n"


# ---- responses ---------------------------------------------------------------------------
def orjson_response(content: Any, status_code: int = 200) -> Response:
    return Response(
        orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY),
        status_code=status_code,
        media_type="application/json",
    )


def error_response(message: str, status_code: int = 400) -> Response:
    return orjson_response({"error": {"message": json_safe(message)}}, status_code)


def validation_error_response(message: str) -> Response:
    """SGLang's 400 for a body that fails its pydantic / dataclass validation."""
    body = {"object": "error", "message": json_safe(message), "type": "Bad Request"}
    return orjson_response({**body, "param": None, "code": 400}, 400)


def http_exception_response(status_code: int, message: str) -> Response:
    """SGLang's answer to a raised HTTPException (its exception handler): ErrorResponse
    with the status as `type` and `code`, e.g. 503 "The request queue is full."."""
    body = {"object": "error", "message": json_safe(message), "type": str(status_code)}
    return orjson_response({**body, "param": None, "code": status_code}, status_code)


def sse_event(data: Any) -> bytes:
    return b"data: " + orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS) + b"\n\n"


# ---- request bodies ----------------------------------------------------------------------
async def parse_json_body(request: Request) -> dict:
    """The body as a JSON object; ValueError for bad JSON or another JSON value."""
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as e:
        raise ValueError(f"Invalid JSON in the request body: {e}") from None
    if not isinstance(body, dict):
        raise ValueError("The request body must be a JSON object.")
    return body


def validate_body(cls: type, body: dict, fields: Iterable[str]) -> Any:
    """`cls` (a dataclass) from the `fields` of `body` (other keys ignored), type-checked as
    SGLang's FastAPI does; raises BodyValidationError. Checked in the HTTP process so that
    no ill-typed value reaches the scheduler."""
    wanted = set(fields)
    return validate_dataclass(cls, {k: v for k, v in body.items() if k in wanted})


async def parse_request(request: Request, cls: type) -> Any:
    """The request dataclass from the JSON body (unknown keys ignored; a GET without a body
    reads the query string), its fields checked against their annotations as SGLang's
    FastAPI / pydantic does (lax: "3" is an int, 3 is no str). Raises ValueError for bad
    JSON, BodyValidationError for a misfit body; parse_error_response answers either."""
    raw = await request.body()
    try:
        body = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError as e:
        raise ValueError(f"Invalid JSON in the request body: {e}") from None
    if not isinstance(body, dict):
        raise ValueError("The request body must be a JSON object.")
    if request.method == "GET" and not body:
        body = dict(request.query_params)
    names = {f.name for f in dataclasses.fields(cls)} - {"rid", "http_worker_ipc"}
    return validate_body(cls, body, names)


def parse_error_response(e: ValueError) -> Response:
    if isinstance(e, BodyValidationError):
        return validation_error_response(str(e))
    return error_response(str(e))


def body_route(req_cls: type, handle: Callable[[Any, Any], Awaitable[Response]]):
    """A route handler: the body parsed as req_cls (parse_request; a bad body is
    parse_error_response's 400), answered by `await handle(tokenizer_manager, object)`."""

    async def route(request: Request) -> Response:
        try:
            obj = await parse_request(request, req_cls)
        except ValueError as e:
            return parse_error_response(e)
        return await handle(server_state(request).tokenizer_manager, obj)

    return route


async def validate_json_request(raw_request: Request) -> None:
    """A route dependency: raise a validation error (-> 400) unless Content-Type is
    application/json, or if the body escapes a lone UTF-16 surrogate: Python's json
    (FastAPI's parser) accepts one, but such a string can be neither tokenized nor echoed
    back (a rid holding one would fail the response's serialisation after the generation
    ran)."""
    content_type = raw_request.headers.get("content-type", "").lower()
    if content_type.split(";", maxsplit=1)[0].strip() != "application/json":
        raise RequestValidationError(
            errors=[
                {
                    "loc": ["header", "content-type"],
                    "msg": "Unsupported Media Type: Only 'application/json' is allowed",
                    "type": "value_error",
                }
            ]
        )
    body = await raw_request.body()
    if b"\\u" in body:  # only escapes can encode a lone surrogate; skip the rest
        try:
            orjson.loads(body)
        except orjson.JSONDecodeError as e:
            if "surrogate" in str(e):
                raise RequestValidationError(
                    errors=[
                        {"loc": ["body"], "msg": f"Invalid Unicode: {e}", "type": "value_error"}
                    ]
                ) from None
