"""SGLang's native routes: health, model and server info, /flush_cache, /abort_request and
/generate (0.5.4's paths, bodies and replies; shared response forms in http_helpers.py).

/generate streams SSE events ending with [DONE]; once a stream has started, an error is an
event, then [DONE]. The non-stream body is FastAPI's default JSONResponse, as SGLang
returns its dict.
"""

from __future__ import annotations

import asyncio
import logging
import time

import orjson
from fastapi import APIRouter, Request, UploadFile
from fastapi.responses import Response, StreamingResponse

from mini_sglang import __version__
from mini_sglang.entrypoints import metrics
from mini_sglang.entrypoints.http_helpers import (
    SSE_DONE,
    error_response,
    http_exception_response,
    orjson_response,
    parse_json_body,
    sse_event,
    validate_body,
    validation_error_response,
)
from mini_sglang.entrypoints.server_state import ServerStateDep
from mini_sglang.environ import envs
from mini_sglang.managers.io_struct.control import AbortReq
from mini_sglang.managers.io_struct.generate import EmbeddingReqInput, GenerateReqInput
from mini_sglang.managers.tokenizer_manager import RequestAborted, SchedulerRefused
from mini_sglang.utils.dataclass_validation import BodyValidationError
from mini_sglang.utils.json_body import fastapi_default_response
from mini_sglang.utils.unicode_check import json_safe

logger = logging.getLogger("mini_sglang")

HEALTH_CHECK_TIMEOUT = envs.SGLANG_HEALTH_CHECK_TIMEOUT.get()

router = APIRouter()


# ---- health and info --------------------------------------------------------------------
@router.get("/health")
@router.get("/health_generate")
async def health_generate(state: ServerStateDep) -> Response:
    """503 until warm-up finished; then 200 (empty body) once the scheduler answers a
    1-token probe (or anything else) within SGLANG_HEALTH_CHECK_TIMEOUT seconds."""
    if state.status != "Up":
        return Response(status_code=503)
    tm = state.tokenizer_manager
    tic = time.time()
    obj: GenerateReqInput | EmbeddingReqInput
    if tm.is_generation:
        obj = GenerateReqInput(
            rid=f"HEALTH_CHECK_{tic}",
            input_ids=[0],
            sampling_params={"max_new_tokens": 1, "temperature": 0.0},
            log_metrics=False,
        )
    else:
        obj = EmbeddingReqInput(rid=f"HEALTH_CHECK_{tic}", input_ids=[0], log_metrics=False)

    async def probe() -> None:
        async for _ in tm.generate_request(obj, None):
            break

    task = asyncio.create_task(probe())
    try:
        while time.time() < tic + HEALTH_CHECK_TIMEOUT:
            await asyncio.sleep(0.01)
            if tm.last_receive_tstamp > tic or task.done():
                return Response(status_code=200)
        logger.error("Health check failed: no scheduler output for %.0f s", HEALTH_CHECK_TIMEOUT)
        return Response(status_code=503)
    finally:
        task.cancel()


@router.get("/get_model_info")
@router.get("/model_info")
async def get_model_info(state: ServerStateDep) -> Response:
    sa = state.server_args
    runtime = state.tokenizer_manager.runtime_state
    return orjson_response(
        {
            "model_path": runtime.model_path,
            "tokenizer_path": sa.tokenizer_path,
            "is_generation": state.tokenizer_manager.is_generation,
            "preferred_sampling_params": sa.preferred_sampling_params,
            "weight_version": runtime.weight_version,
            "served_model_name": sa.served_model_name,
            "architectures": state.tokenizer_manager.model_config.architectures,
        }
    )


# /metrics comes here, so that the OpenAPI route list keeps SGLang's order.
router.include_router(metrics.router)


@router.get("/get_weight_version")
async def get_weight_version(state: ServerStateDep) -> Response:
    return orjson_response({"weight_version": state.tokenizer_manager.runtime_state.weight_version})


@router.get("/get_server_info")
@router.get("/server_info")
async def get_server_info(state: ServerStateDep) -> Response:
    internal_states = await state.tokenizer_manager.communicator.get_internal_state()
    args = state.tokenizer_manager.runtime_state.server_args_view(state.server_args)
    info = {
        **args,
        "status": "ready",
        "max_total_num_tokens": state.scheduler_info["max_total_num_tokens"],
        "max_req_input_len": state.scheduler_info["max_req_input_len"],
        # One per DP replica, as SGLang lists them.
        "internal_states": [{**args, **internal} for internal in internal_states],
        "version": __version__,
    }
    return orjson_response(info)


@router.get("/get_load")
async def get_load(state: ServerStateDep) -> Response:
    """Every DP replica's load: dp_rank, num_reqs, num_waiting_reqs, num_tokens (SGLang's
    GetLoadReqOutput fields)."""
    loads = await state.tokenizer_manager.communicator.get_load()
    fields = ("dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens")
    return orjson_response([{f: getattr(load, f) for f in fields} for load in loads])


@router.get("/v1/models")
async def available_models(state: ServerStateDep) -> Response:
    name = state.server_args.served_model_name
    card = {
        "id": name,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "sglang",
        "root": name,
        "max_model_len": state.tokenizer_manager.context_len,
    }
    return orjson_response({"object": "list", "data": [card]})


# ---- cache and abort ----------------------------------------------------------------------
@router.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache(state: ServerStateDep) -> Response:
    ret = await state.tokenizer_manager.communicator.flush_cache()
    return Response(
        content="Cache flushed.\nPlease check backend logs for more details. "
        "(When there are running or waiting requests, the operation will not be performed.)\n",
        status_code=200 if ret.success else 400,
        media_type="text/plain",
    )


@router.post("/abort_request")
async def abort_request(request: Request, state: ServerStateDep) -> Response:
    """{"rid": str, "abort_all": bool} -> 200 (empty). A body that is no object or has a
    wrong-typed field is a 400 (a list rid would crash the scheduler's prefix match)."""
    try:
        body = orjson.loads(await request.body() or b"{}")
    except orjson.JSONDecodeError as e:
        return error_response(f"Invalid JSON: {e}")
    if not isinstance(body, dict):
        return validation_error_response("body: Input should be a valid dictionary or object")
    try:
        obj = validate_body(AbortReq, body, ("rid", "abort_all"))
    except BodyValidationError as e:
        return validation_error_response(str(e))
    state.tokenizer_manager.abort_request(rid=obj.rid or "", abort_all=obj.abort_all)
    return Response(status_code=200)


# ---- generation ------------------------------------------------------------------------
@router.api_route("/generate", methods=["POST", "PUT"])
async def generate_request(request: Request, state: ServerStateDep) -> Response:
    tm = state.tokenizer_manager
    try:
        obj = GenerateReqInput.from_json_dict(await parse_json_body(request))
    except BodyValidationError as e:
        return validation_error_response(str(e))
    except (ValueError, TypeError) as e:
        return error_response(str(e))
    if obj.stream:

        async def stream_results():
            try:
                async for out in tm.generate_request(obj, request):
                    yield sse_event(out)
            except (ValueError, TypeError, SchedulerRefused) as e:
                if not isinstance(e, SchedulerRefused):
                    logger.error("[http_server] Error: %s", e)  # SGLang's line for a refusal
                yield sse_event({"error": {"message": json_safe(str(e))}})
            except RequestAborted:
                return
            yield SSE_DONE

        return StreamingResponse(stream_results(), media_type="text/event-stream")
    try:
        ret = await tm.generate_request(obj, request).__anext__()
    except (ValueError, TypeError) as e:
        logger.error("[http_server] Error: %s", e)  # SGLang's line for a refusal
        return error_response(str(e))
    except RequestAborted as e:
        return error_response(str(e))
    except SchedulerRefused as e:
        return http_exception_response(e.status_code, e.message)
    return fastapi_default_response(ret)  # SGLang returns the dict: json.dumps, not orjson


@router.post("/generate_from_file")
async def generate_from_file_request(
    file: UploadFile, request: Request, state: ServerStateDep
) -> Response:
    """SGLang's /generate_from_file: the uploaded file (multipart field `file`) is a JSON
    input_embeds, generated greedily with up to 512 new tokens; the reply is /generate's."""
    try:
        input_embeds = orjson.loads(await file.read())
        obj = GenerateReqInput.from_json_dict(
            {
                "input_embeds": input_embeds,
                "sampling_params": {"temperature": 0.0, "max_new_tokens": 512},
            }
        )
        ret = await state.tokenizer_manager.generate_request(obj, request).__anext__()
    except (ValueError, TypeError, RequestAborted) as e:  # orjson's decode error too
        return error_response(str(e))
    except SchedulerRefused as e:
        return http_exception_response(e.status_code, e.message)
    return fastapi_default_response(ret)
