"""What the OpenAI handlers share: the request pattern (validate -> convert to a
GenerateReqInput -> stream or not), OpenAI's error envelope, finish_reason / usage /
logprob conversions, and a StreamingResponse that always closes its generator.

Error contract (SGLang 0.5.4): a ValueError / TypeError before generation is HTTP 400
{"object":"error","message","type","param":null,"code":400}; once a stream has started an
error is the event `data: {"error": {...}}` followed by `data: [DONE]` (HTTP 200 already
sent); anything else is 500 "Internal server error: ...".
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import orjson
from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel

from mini_sglang.entrypoints.http_helpers import SSE_DONE
from mini_sglang.entrypoints.openai.protocol import ErrorResponse, LogProbs, UsageInfo
from mini_sglang.managers.io_struct.generate import GenerateReqInput
from mini_sglang.managers.tokenizer_manager import RequestAborted, SchedulerRefused
from mini_sglang.sampling.sampling_params import SamplingParams
from mini_sglang.utils.json_body import fastapi_default_response
from mini_sglang.utils.unicode_check import json_safe

logger = logging.getLogger("mini_sglang")


# ---- responses ---------------------------------------------------------------------------
def json_response(model: BaseModel, status_code: int = 200) -> Response:
    """One-line compact JSON in the model's field order."""
    return Response(model.model_dump_json(), status_code=status_code, media_type="application/json")


def fastapi_json_response(model: BaseModel) -> Response:
    """`model` in the bytes SGLang's non-stream chat, completions and /v1/score send
    (jsonable_encoder, then FastAPI's default response; see utils/json_body.py)."""
    return fastapi_default_response(jsonable_encoder(model))


def create_error_response(
    message: str,
    err_type: str = "BadRequestError",
    status_code: int = 400,
    param: str | None = None,
) -> Response:
    error = ErrorResponse(message=json_safe(message), type=err_type, param=param, code=status_code)
    return json_response(error, status_code)


def streaming_error_event(
    message: str, err_type: str = "BadRequestError", code: int = 400
) -> bytes:
    """`data: {"error": {...ErrorResponse...}}` for errors after the stream started, in
    SGLang's bytes: json.dumps' defaults (", " and ": " separators, non-ASCII escaped),
    unlike the compact chunks around it."""
    error = ErrorResponse(message=json_safe(message), type=err_type, param=None, code=code)
    return b"data: " + json.dumps({"error": error.model_dump()}).encode() + b"\n\n"


def sse(model: BaseModel, exclude_none: bool = False) -> bytes:
    return b"data: " + model.model_dump_json(exclude_none=exclude_none).encode() + b"\n\n"


class ClosingStreamingResponse(StreamingResponse):
    """A StreamingResponse that acloses its body generator however the response ends.

    Starlette cancels the response task when the client disconnects; if that happens
    while the generator is suspended at a `yield` (blocked in `send`), nothing would close
    it until garbage collection. Closing it at once runs the TokenizerManager generator's
    `finally`, which aborts the request in the scheduler and frees its KV cache."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                # RuntimeError: still running in a cancelled task, which ends it itself.
                with contextlib.suppress(RuntimeError):
                    await aclose()


# ---- conversions ---------------------------------------------------------------------------
def finish_fields(meta_info: Mapping[str, Any]) -> tuple[str | None, int | str | None]:
    """SGLang's finish_reason dict -> (OpenAI finish_reason, matched_stop).

    {"type":"length","length":N} -> ("length", None); {"type":"stop","matched":X} ->
    ("stop", X) where X is a token id (EOS / stop_token_ids) or the stop string;
    {"type":"abort",...} -> ("abort", None); null (still running) -> (None, None)."""
    reason = meta_info.get("finish_reason")
    if not reason:
        return None, None
    return reason["type"], reason.get("matched")


def to_openai_style_logprobs(
    input_token_logprobs: list | None = None,
    output_token_logprobs: list | None = None,
    input_top_logprobs: list | None = None,
    output_top_logprobs: list | None = None,
) -> LogProbs:
    """SGLang's [logprob, token_id, text] triples -> completions-style LogProbs
    (text_offset is always -1, as in SGLang)."""
    ret = LogProbs()
    for triples in (input_token_logprobs, output_token_logprobs):
        for logprob, _, text in triples or []:
            ret.tokens.append(text)
            ret.token_logprobs.append(logprob)
            ret.text_offset.append(-1)
    for tops in (input_top_logprobs, output_top_logprobs):
        for position in tops or []:
            ret.top_logprobs.append(None if position is None else {t[2]: t[0] for t in position})
    return ret


def _details(cached: int, enable_cache_report: bool) -> dict[str, int] | None:
    return {"cached_tokens": cached} if enable_cache_report and cached > 0 else None


def usage_from_responses(ret: list[dict], n: int, enable_cache_report: bool) -> UsageInfo:
    """Usage of a finished (non-stream) request, from its responses in choice order."""
    return usage_from_metas([r["meta_info"] for r in ret], n, enable_cache_report)


def response_fields(ret: list[dict], request: Any, enable_cache_report: bool) -> dict[str, Any]:
    """The fields a non-stream chat or completion response shares: id, created, model
    (echoed back, as SGLang does), usage and the weight version."""
    meta = ret[0]["meta_info"]
    return {
        "id": meta["id"],
        "created": int(time.time()),
        "model": request.model,
        "usage": usage_from_responses(ret, request.n, enable_cache_report),
        "metadata": {"weight_version": meta["weight_version"]},
    }


def usage_from_metas(metas: list[dict], n: int, enable_cache_report: bool) -> UsageInfo:
    """Usage from each choice's final meta_info, in choice-index order (a stream keeps the
    last one per index): the prompt counted once per prompt (every n-th choice),
    completions and cached tokens summed over all choices."""
    prompt = sum(metas[i]["prompt_tokens"] for i in range(0, len(metas), n))
    completion = sum(m["completion_tokens"] for m in metas)
    cached = sum(m.get("cached_tokens", 0) for m in metas)
    return UsageInfo(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=_details(cached, enable_cache_report),
    )


def common_sampling_params(request: Any) -> dict[str, Any]:
    """Sampling keys both endpoints map the same way (SGLang names on the right)."""
    params: dict[str, Any] = {
        "min_new_tokens": request.min_tokens,
        "stop": request.stop,
        "stop_token_ids": request.stop_token_ids,
        "stop_regex": request.stop_regex,
        "presence_penalty": request.presence_penalty,
        "frequency_penalty": request.frequency_penalty,
        "regex": request.regex,
        "ebnf": request.ebnf,
        "n": request.n,
        "no_stop_trim": request.no_stop_trim,
        "ignore_eos": request.ignore_eos,
        "skip_special_tokens": request.skip_special_tokens,
        "logit_bias": request.logit_bias,
        "custom_params": request.custom_params,
    }
    if request.seed is not None:
        params["sampling_seed"] = request.seed
    rf = request.response_format
    if rf is not None and rf.type == "json_schema":
        params["json_schema"] = orjson.dumps(
            rf.json_schema.schema_ if rf.json_schema else {}
        ).decode()
    elif rf is not None and rf.type == "json_object":
        params["json_schema"] = '{"type": "object"}'
    elif rf is not None and rf.type == "structural_tag":
        params["structural_tag"] = "structural_tag"
    # Checked now (not in the TokenizerManager) so that unknown / structured-output keys
    # are an HTTP 400 even for a stream, whose errors would otherwise arrive as events.
    SamplingParams.from_dict({k: v for k, v in params.items() if v is not None})
    return params


# ---- the handler pattern ---------------------------------------------------------------------
class OpenAIServingBase:
    """Subclasses implement `_validate_request` (an error message or None),
    `_convert_to_internal_request` (-> GenerateReqInput; may raise ValueError),
    `_generate_stream` (SSE bytes) and `_build_response` (from the list of finished
    TokenizerManager outputs)."""

    def __init__(self, tokenizer_manager: Any) -> None:
        self.tokenizer_manager = tokenizer_manager

    @property
    def enable_cache_report(self) -> bool:
        return bool(getattr(self.tokenizer_manager.server_args, "enable_cache_report", False))

    async def handle_request(self, request: Any, raw_request: Request) -> Response:
        try:
            error = self._validate_request(request)
            if error:
                return create_error_response(error)
            adapted = self._convert_to_internal_request(request)
            if getattr(request, "stream", False):
                body = self._stream_with_errors(adapted, request, raw_request)
                return ClosingStreamingResponse(body, media_type="text/event-stream")
            return await self._handle_non_streaming(adapted, request, raw_request)
        except (ValueError, TypeError) as e:
            return create_error_response(str(e), err_type="BadRequest")
        except Exception as e:  # noqa: BLE001 - an internal bug must still answer JSON
            logger.exception("Error in OpenAI request: %s", e)
            return create_error_response(
                f"Internal server error: {e}", err_type="InternalServerError", status_code=500
            )

    async def _handle_non_streaming(
        self, adapted: GenerateReqInput, request: Any, raw_request: Request
    ) -> Response:
        gen = self.tokenizer_manager.generate_request(adapted, raw_request)
        try:
            ret = await gen.__anext__()
        except (ValueError, TypeError) as e:
            return create_error_response(str(e))
        except RequestAborted as e:
            # The client is gone; the answer goes nowhere but must not be a 500.
            return create_error_response(str(e))
        except SchedulerRefused as e:
            return create_error_response(e.message, str(e.status_code), e.status_code)
        finally:
            await gen.aclose()
        return self._build_response(request, ret if isinstance(ret, list) else [ret])

    async def _stream_with_errors(
        self, adapted: GenerateReqInput, request: Any, raw_request: Request
    ) -> AsyncIterator[bytes]:
        """Wrap `_generate_stream`: errors become an error event, then [DONE]."""
        gen = self._generate_stream(adapted, request, raw_request)
        try:
            async for chunk in gen:
                yield chunk
        except RequestAborted:
            return  # the client disconnected; nobody reads further events
        except (ValueError, TypeError) as e:
            yield streaming_error_event(str(e))
        except SchedulerRefused as e:
            yield streaming_error_event(e.message, str(e.status_code), e.status_code)
        except Exception as e:  # noqa: BLE001
            logger.exception("Error in OpenAI stream: %s", e)
            yield streaming_error_event(f"Internal server error: {e}", "InternalServerError", 500)
        finally:
            await gen.aclose()
        yield SSE_DONE

    def _validate_request(self, request: Any) -> str | None:
        return None

    def _convert_to_internal_request(self, request: Any) -> GenerateReqInput:
        raise NotImplementedError

    def _generate_stream(
        self, adapted: GenerateReqInput, request: Any, raw_request: Request
    ) -> AsyncIterator[bytes]:
        raise NotImplementedError

    def _build_response(self, request: Any, ret: list[dict]) -> Response:
        raise NotImplementedError
