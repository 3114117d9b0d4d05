"""The HTTP server: SGLang's native endpoints on FastAPI, and launch_server().

Responses are compact one-line orjson (clients such as bench_serving read line by line);
streams are SSE events `data: <json>\\n\\n` ending with `data: [DONE]\\n\\n`. Native errors are
400 {"error": {"message": ...}}; once a stream has started, an error is an event, then
[DONE]. The OpenAI-compatible routes live in entrypoints/openai/ and mount on this app.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response, StreamingResponse

from mini_sglang.environ import envs
from mini_sglang.managers.io_struct.control import AbortReq
from mini_sglang.managers.io_struct.generate import GenerateReqInput
from mini_sglang.managers.tokenizer_manager import RequestAborted
from mini_sglang.utils.dataclass_validation import BodyValidationError, validate_dataclass
from mini_sglang.utils.json_body import fastapi_default_response
from mini_sglang.utils.unicode_check import json_safe

logger = logging.getLogger("mini_sglang")

HEALTH_CHECK_TIMEOUT = envs.SGLANG_HEALTH_CHECK_TIMEOUT.get()


@dataclass
class GlobalState:
    tokenizer_manager: Any
    scheduler_info: dict
    server_args: Any
    status: str = "Starting"  # Starting -> Up (after warm-up) -> ShuttingDown


_state: GlobalState | None = None


def set_global_state(state: GlobalState) -> None:
    global _state
    _state = state


def get_state() -> GlobalState:
    assert _state is not None, "server not initialised"
    return _state


def orjson_response(content: Any, status_code: int = 200) -> Response:
    return Response(
        orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY),
        status_code=status_code,
        media_type="application/json",
    )


def error_response(message: str, status_code: int = 400) -> Response:
    return orjson_response({"error": {"message": json_safe(message)}}, status_code)


def sse_event(data: Any) -> bytes:
    return b"data: " + orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS) + b"\n\n"


def validation_error_response(message: str) -> Response:
    """SGLang's 400 for a body that fails its pydantic / dataclass validation."""
    body = {"object": "error", "message": json_safe(message), "type": "Bad Request"}
    return orjson_response({**body, "param": None, "code": 400}, 400)


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
        return await handle(get_state().tokenizer_manager, obj)

    return route


app = FastAPI()


@app.exception_handler(RequestValidationError)
async def validation_exception_handler(request: Request, exc: RequestValidationError) -> Response:
    # FastAPI says 422; SGLang (and OpenAI clients) expect 400.
    message = "; ".join(
        f"{'.'.join(str(p) for p in e.get('loc', []))}: {e.get('msg')}" for e in exc.errors()
    )
    return validation_error_response(message)


class APIKeyMiddleware:
    """`--api-key`: every path but /health*, /metrics* and OPTIONS needs
    `Authorization: Bearer <key>`; otherwise 401 {"error": "Unauthorized"}.

    A plain ASGI middleware on purpose: Starlette's BaseHTTPMiddleware (what
    @app.middleware("http") builds) hides client disconnects from Request.is_disconnected(),
    and the TokenizerManager relies on that to abort non-streaming requests.
    """

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        key = _state.server_args.api_key if _state is not None else None
        if key and scope["type"] == "http" and scope.get("method") != "OPTIONS":
            path = scope.get("path", "")
            headers = dict(scope.get("headers") or [])
            auth = headers.get(b"authorization", b"").decode("latin-1")
            if (
                not path.startswith("/health")
                and not path.startswith("/metrics")
                and auth != f"Bearer {key}"
            ):
                await orjson_response({"error": "Unauthorized"}, 401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


app.add_middleware(APIKeyMiddleware)


# ---- health and info --------------------------------------------------------------------
@app.get("/health")
@app.get("/health_generate")
async def health_generate(request: Request) -> Response:
    """503 until warm-up finished; then 200 (empty body) once the scheduler answers a
    1-token probe (or anything else) within SGLANG_HEALTH_CHECK_TIMEOUT seconds."""
    state = get_state()
    if state.status != "Up":
        return Response(status_code=503)
    tm = state.tokenizer_manager
    tic = time.time()
    obj = GenerateReqInput(
        rid=f"HEALTH_CHECK_{tic}",
        input_ids=[0],
        sampling_params={"max_new_tokens": 1, "temperature": 0.0},
        log_metrics=False,
    )

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


@app.get("/get_model_info")
@app.get("/model_info")
async def get_model_info() -> Response:
    state = get_state()
    sa = state.server_args
    runtime = state.tokenizer_manager.runtime_state
    return orjson_response(
        {
            "model_path": runtime.model_path,
            "tokenizer_path": sa.tokenizer_path,
            "is_generation": True,
            "preferred_sampling_params": sa.preferred_sampling_params,
            "weight_version": runtime.weight_version,
            "served_model_name": sa.served_model_name,
            "architectures": state.tokenizer_manager.model_config.architectures,
        }
    )


@app.get("/metrics")
async def metrics() -> Response:
    """Prometheus text format; 404 unless the server runs with --enable-metrics."""
    tm = get_state().tokenizer_manager
    if tm.metrics is None:
        return error_response("Metrics are disabled; start the server with --enable-metrics", 404)
    body = tm.metrics.render(await tm.communicator.get_internal_state())
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")


@app.get("/get_weight_version")
async def get_weight_version() -> Response:
    runtime = get_state().tokenizer_manager.runtime_state
    return orjson_response({"weight_version": runtime.weight_version})


@app.get("/get_server_info")
@app.get("/server_info")
async def get_server_info() -> Response:
    state = get_state()
    internal = await state.tokenizer_manager.communicator.get_internal_state()
    from mini_sglang import __version__

    args = state.tokenizer_manager.runtime_state.server_args_view(state.server_args)
    info = {
        **args,
        "status": "ready",
        "max_total_num_tokens": state.scheduler_info["max_total_num_tokens"],
        "max_req_input_len": state.scheduler_info["max_req_input_len"],
        "internal_states": [{**args, **internal}],
        "version": __version__,
    }
    return orjson_response(info)


@app.get("/get_load")
async def get_load() -> Response:
    internal = await get_state().tokenizer_manager.communicator.get_internal_state()
    return orjson_response([{"dp_rank": 0, **internal.get("load", {})}])


@app.get("/v1/models")
async def available_models() -> Response:
    state = get_state()
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
@app.api_route("/flush_cache", methods=["GET", "POST"])
async def flush_cache() -> Response:
    ret = await get_state().tokenizer_manager.communicator.flush_cache()
    return Response(
        content="Cache flushed.\nPlease check backend logs for more details. "
        "(When there are running or waiting requests, the operation will not be performed.)\n",
        status_code=200 if ret.success else 400,
        media_type="text/plain",
    )


@app.post("/abort_request")
async def abort_request(request: Request) -> Response:
    """{"rid": str, "abort_all": bool} -> 200 (empty). A body that is no object or has a
    wrong-typed field is a 400 (a list rid used to crash the scheduler's prefix match)."""
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
    get_state().tokenizer_manager.abort_request(rid=obj.rid or "", abort_all=obj.abort_all)
    return Response(status_code=200)


# ---- generation ------------------------------------------------------------------------
async def parse_json_body(request: Request) -> dict:
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as e:
        raise ValueError(f"Invalid JSON in the request body: {e}") from None
    if not isinstance(body, dict):
        raise ValueError("The request body must be a JSON object.")
    return body


@app.api_route("/generate", methods=["POST", "PUT"])
async def generate_request(request: Request) -> Response:
    tm = get_state().tokenizer_manager
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
            except (ValueError, TypeError) as e:
                yield sse_event({"error": {"message": json_safe(str(e))}})
            except RequestAborted:
                return
            yield b"data: [DONE]\n\n"

        return StreamingResponse(stream_results(), media_type="text/event-stream")
    try:
        ret = await tm.generate_request(obj, request).__anext__()
    except (ValueError, TypeError) as e:
        return error_response(str(e))
    except RequestAborted as e:
        return error_response(str(e))
    return fastapi_default_response(ret)  # SGLang returns the dict: json.dumps, not orjson


# ---- launching ---------------------------------------------------------------------------
def _warmup(server_args) -> None:
    """Wait for the HTTP server, send one /generate, then flip /health to 200."""
    import requests

    url = server_args.url()
    headers = {"Authorization": f"Bearer {server_args.api_key}"} if server_args.api_key else {}
    for _ in range(600):
        try:
            if requests.get(f"{url}/get_model_info", timeout=5, headers=headers).ok:
                break
        except requests.RequestException:
            time.sleep(0.2)
    state = get_state()
    if not server_args.skip_server_warmup:
        body = {"sampling_params": {"temperature": 0, "max_new_tokens": 8}}
        if server_args.skip_tokenizer_init:
            body["input_ids"] = [10, 11, 12]
        else:
            body["text"] = "The capital city of France is"
        start = time.perf_counter()
        try:
            res = requests.post(f"{url}/generate", json=body, timeout=600, headers=headers)
            res.raise_for_status()
            logger.info("Warm-up request done in %.2f s", time.perf_counter() - start)
        except Exception as e:
            logger.error("Warm-up request failed: %s", e)
            from mini_sglang.utils.process import kill_process_tree

            kill_process_tree(os.getpid())
            return
    state.status = "Up"
    logger.info("The server is fired up and ready to roll!")


def set_uvicorn_logging_configs() -> None:
    """Uvicorn's log lines in the server's format (SGLang's): timestamp, level, message."""
    from uvicorn.config import LOGGING_CONFIG

    formatters = LOGGING_CONFIG["formatters"]
    formatters["default"]["fmt"] = "[%(asctime)s] %(levelprefix)s %(message)s"
    formatters["default"]["datefmt"] = "%Y-%m-%d %H:%M:%S"
    formatters["access"]["fmt"] = (
        '[%(asctime)s] %(levelprefix)s %(client_addr)s - "%(request_line)s" %(status_code)s'
    )
    formatters["access"]["datefmt"] = "%Y-%m-%d %H:%M:%S"


def launch_server(server_args) -> None:
    """Start the subprocesses, the warm-up thread and uvicorn (blocks until shutdown)."""
    import signal

    import uvicorn

    from mini_sglang.entrypoints.cloud_routes import mount_cloud_routes
    from mini_sglang.entrypoints.control_routes import mount_control_routes
    from mini_sglang.entrypoints.embedding_routes import mount_embedding_routes
    from mini_sglang.entrypoints.engine import launch_subprocesses
    from mini_sglang.entrypoints.openai.routes import mount_openai_routes
    from mini_sglang.entrypoints.startup import check_port_available
    from mini_sglang.entrypoints.weight_routes import mount_weight_routes
    from mini_sglang.utils.process import configure_logger, kill_process_tree

    configure_logger(server_args)
    check_port_available(server_args.host, server_args.port)  # before any model load
    tm, info, children = launch_subprocesses(server_args)
    set_global_state(GlobalState(tm, info, server_args))
    mount_openai_routes(app)
    mount_weight_routes(app)
    mount_control_routes(app)
    mount_cloud_routes(app)
    mount_embedding_routes(app)

    def on_term(signum, frame) -> None:
        logger.info("Received signal %d; shutting down.", signum)
        get_state().status = "ShuttingDown"
        children.stop()
        kill_process_tree(os.getpid(), include_parent=False)
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    threading.Thread(target=_warmup, args=(server_args,), daemon=True).start()
    set_uvicorn_logging_configs()
    try:
        uvicorn.run(
            app,
            host=server_args.host,
            port=server_args.port,
            log_level=server_args.log_level_http or server_args.log_level,
            timeout_keep_alive=5,
            loop="uvloop",
        )
    finally:
        children.stop()
