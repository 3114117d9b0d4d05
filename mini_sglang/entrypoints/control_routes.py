"""HTTP routes for profiling, pause / continue, freeze_gc and request logging (SGLang
0.5.4's paths, bodies and replies).

- GET|POST /start_profile, optional JSON body ProfileReqInput -> 200 text "Start profiling.\\n"
- GET|POST /stop_profile -> 200 text "Stop profiling. This will take some time.\\n"
  A scheduler refusal (start while a trace runs, stop without one, no usable activity) is
  what 0.5.4's uncaught RuntimeError gives: 500 text "Internal Server Error"; the reason is
  logged. A body that does not fit ProfileReqInput is SGLang's validation 400.
- POST /pause_generation -> 200 {"message": "Generation paused successfully.", "status": "ok"}
- POST /continue_generation -> 200 {"message": "Generation continued successfully.", "status": "ok"}
  (bodies ignored, as in 0.5.4; semantics in managers/tokenizer_manager.py)
- GET|POST /freeze_gc -> 200 text "Garbage collection frozen.\\n" (gc.freeze() in the HTTP,
  scheduler and detokenizer processes; see utils/gc_utils.py)
- GET|POST /slow_down {"forward_sleep_time": seconds | null} -> 200 `null` once every
  scheduler sleeps that long before each forward (null or <= 0 ends it); a non-number is
  a 400.
- GET|POST /open_session {"capacity_of_str_len": int, "session_id"?: str} -> 200 the id (a
  JSON string); an id already open is a 400. GET|POST /close_session {"session_id"} -> 200,
  empty. Generate requests name a session in session_params (managers/session_controller.py).
- GET|POST /start_expert_distribution_record, /stop_expert_distribution_record,
  /dump_expert_distribution_record -> 200 text "Start recording the expert distribution.\\n",
  "Stop recording the expert distribution.\\n", "Dump expert distribution record.\\n" (the
  record: layers/moe/expert_distribution.py); 400 where no recorder runs
- GET|POST /configure_logging, JSON body ConfigureLoggingReq (log_requests,
  log_requests_level, ...) -> 200, empty body; a bad type or level is a 400 (see
  managers/request_logging.py)
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from mini_sglang.entrypoints.http_helpers import (
    body_route,
    error_response,
    orjson_response,
    validate_body,
    validation_error_response,
)
from mini_sglang.entrypoints.server_state import ServerStateDep
from mini_sglang.managers.io_struct.control import (
    CloseSessionReqInput,
    ConfigureLoggingReq,
    ExpertDistributionReqType,
    OpenSessionReqInput,
    ProfileReqInput,
    SlowDownReqInput,
)

logger = logging.getLogger("mini_sglang")

# The body's fields; rid / http_worker_ipc are internal (as in every control body).
_PROFILE_FIELDS = tuple(
    f.name for f in dataclasses.fields(ProfileReqInput) if f.name not in ("rid", "http_worker_ipc")
)


def _internal_error() -> Response:
    # What Starlette answers for the RuntimeError SGLang's route lets escape.
    return Response("Internal Server Error", 500, media_type="text/plain; charset=utf-8")


def parse_profile_body(raw: bytes) -> ProfileReqInput:
    """ProfileReqInput from a (possibly empty or null) JSON body, checked as SGLang's
    pydantic does (lax: "15" is an int 15); unknown keys are ignored. Raises ValueError
    (BodyValidationError for a misfit field)."""
    if not raw.strip():
        return ProfileReqInput()
    try:
        body: Any = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ValueError(f"body: JSON decode error: {e}") from None
    if body is None:
        return ProfileReqInput()
    if not isinstance(body, dict):
        raise ValueError("body: Input should be a valid dictionary or object")
    return validate_body(ProfileReqInput, body, _PROFILE_FIELDS)


router = APIRouter()


@router.api_route("/start_profile", methods=["GET", "POST"])
async def start_profile(request: Request, state: ServerStateDep) -> Response:
    try:
        obj = parse_profile_body(await request.body())
    except ValueError as e:
        return validation_error_response(str(e))
    try:
        await state.tokenizer_manager.communicator.start_profile(obj)
    except RuntimeError as e:
        logger.error("/start_profile failed: %s", e)
        return _internal_error()
    return Response("Start profiling.\n", 200)


@router.api_route("/stop_profile", methods=["GET", "POST"])
async def stop_profile(state: ServerStateDep) -> Response:
    try:
        await state.tokenizer_manager.communicator.stop_profile()
    except RuntimeError as e:
        logger.error("/stop_profile failed: %s", e)
        return _internal_error()
    return Response("Stop profiling. This will take some time.\n", 200)


@router.post("/pause_generation")
async def pause_generation(state: ServerStateDep) -> Response:
    await state.tokenizer_manager.pause_generation()
    return orjson_response({"message": "Generation paused successfully.", "status": "ok"})


@router.post("/continue_generation")
async def continue_generation(state: ServerStateDep) -> Response:
    await state.tokenizer_manager.continue_generation()
    return orjson_response({"message": "Generation continued successfully.", "status": "ok"})


@router.api_route("/freeze_gc", methods=["GET", "POST"])
async def freeze_gc(state: ServerStateDep) -> Response:
    await state.tokenizer_manager.communicator.freeze_gc()
    return Response("Garbage collection frozen.\n", 200)


# /start|stop|dump_expert_distribution_record: SGLang 0.5.4's replies. Without a recorder
# (no --expert-distribution-recorder-mode, or a model without MoE layers) SGLang's scheduler
# raises and stops; here it is a 400 naming what to change.
_EXPERT_DISTRIBUTION_ROUTES = (
    ("start", ExpertDistributionReqType.START_RECORD, "Start recording the expert distribution.\n"),
    ("stop", ExpertDistributionReqType.STOP_RECORD, "Stop recording the expert distribution.\n"),
    ("dump", ExpertDistributionReqType.DUMP_RECORD, "Dump expert distribution record.\n"),
)


def _expert_distribution_route(action: ExpertDistributionReqType, reply: str):
    async def route(state: ServerStateDep) -> Response:
        out = await state.tokenizer_manager.communicator.expert_distribution(action)
        if not out.success:
            return error_response(out.message)
        return Response(reply, 200)

    return route


for _verb, _action, _reply in _EXPERT_DISTRIBUTION_ROUTES:
    router.api_route(f"/{_verb}_expert_distribution_record", methods=["GET", "POST"])(
        _expert_distribution_route(_action, _reply)
    )


async def configure_logging(tm: Any, req: ConfigureLoggingReq) -> Response:
    try:
        tm.request_logger.configure(req)
    except ValueError as e:  # a level outside 0-3
        return error_response(str(e))
    return Response(status_code=200)


async def slow_down(tm: Any, req: SlowDownReqInput) -> Response:
    await tm.communicator.slow_down(req)
    return orjson_response(None)


async def open_session(tm: Any, req: OpenSessionReqInput) -> Response:
    session_id = await tm.communicator.open_session(req)
    if session_id is None:
        return error_response(
            "Failed to open the session. Check if a session with the same id is still open."
        )
    return orjson_response(session_id)


async def close_session(tm: Any, req: CloseSessionReqInput) -> Response:
    await tm.communicator.close_session(req)
    return Response(status_code=200)


# Routes whose body is one request dataclass (parsed and checked by body_route).
for _path, _req_cls, _handle in (
    ("/configure_logging", ConfigureLoggingReq, configure_logging),
    ("/slow_down", SlowDownReqInput, slow_down),
    ("/open_session", OpenSessionReqInput, open_session),
    ("/close_session", CloseSessionReqInput, close_session),
):
    router.api_route(_path, methods=["GET", "POST"])(body_route(_req_cls, _handle))
