"""The HTTP server: the FastAPI app with every route module's router, and launch_server().

Routes live in their modules, each an APIRouter: native_routes (health, info, /generate;
/metrics from metrics), openai/routes, openai/responses_routes, weight_routes,
control_routes, cloud_routes, embedding_routes and dashboard_routes (/dashboard, /); what they share (responses, SSE, body parsing) is in http_helpers and the
server's state (ServerState) on ``app.state.server``. FastAPI's 422 for a body that fails
validation is SGLang's 400 (in OpenAI's nested envelope under /v1/responses).
"""

from __future__ import annotations

import logging
import os
import threading
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response

from mini_sglang.entrypoints import (
    cloud_routes,
    control_routes,
    dashboard_routes,
    embedding_routes,
    native_routes,
    weight_routes,
)
from mini_sglang.entrypoints.engine import launch_subprocesses
from mini_sglang.entrypoints.http_helpers import orjson_response, validation_error_response
from mini_sglang.entrypoints.openai import responses_routes
from mini_sglang.entrypoints.openai import routes as openai_routes
from mini_sglang.entrypoints.openai.serving_responses import responses_error
from mini_sglang.entrypoints.server_state import ServerState
from mini_sglang.entrypoints.startup import check_port_available
from mini_sglang.utils.process import configure_logger, kill_process_tree

logger = logging.getLogger("mini_sglang")

app = FastAPI()


@app.exception_handler(RequestValidationError)
async def validation_exception_handler(request: Request, exc: RequestValidationError) -> Response:
    # FastAPI says 422; SGLang (and OpenAI clients) expect 400.
    message = "; ".join(
        f"{'.'.join(str(p) for p in e.get('loc', []))}: {e.get('msg')}" for e in exc.errors()
    )
    if request.url.path.startswith("/v1/responses"):
        # The Responses API's clients expect OpenAI's nested envelope (SGLang).
        return responses_error(message, err_type="Bad Request")
    return validation_error_response(message)


class APIKeyMiddleware:
    """`--api-key`: every path but /health*, /metrics*, the dashboard's page and assets
    (dashboard_routes.is_public_path; its data needs the key) and OPTIONS needs
    `Authorization: Bearer <key>`; otherwise 401 {"error": "Unauthorized"}.

    A plain ASGI middleware on purpose: Starlette's BaseHTTPMiddleware (what
    @app.middleware("http") builds) hides client disconnects from Request.is_disconnected(),
    and the TokenizerManager relies on that to abort non-streaming requests.
    """

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        state: ServerState | None = getattr(scope["app"].state, "server", None)
        key = state.server_args.api_key if state is not None else None
        if key and scope["type"] == "http" and scope.get("method") != "OPTIONS":
            path = scope.get("path", "")
            headers = dict(scope.get("headers") or [])
            auth = headers.get(b"authorization", b"").decode("latin-1")
            if (
                not path.startswith("/health")
                and not path.startswith("/metrics")
                and not dashboard_routes.is_public_path(path)
                and auth != f"Bearer {key}"
            ):
                await orjson_response({"error": "Unauthorized"}, 401)(scope, receive, send)
                return
        await self.app(scope, receive, send)


app.add_middleware(APIKeyMiddleware)
# In this order, so that the OpenAPI route list is SGLang's.
for _router in (
    native_routes.router,
    openai_routes.router,
    responses_routes.router,
    weight_routes.router,
    control_routes.router,
    cloud_routes.router,
    embedding_routes.router,
    dashboard_routes.router,
):
    app.include_router(_router)


# ---- launching ---------------------------------------------------------------------------
def _warmup(server_args, state: ServerState) -> None:
    """Wait for the HTTP server, send one /generate (/encode), then flip /health to 200."""
    import requests

    url = server_args.url()
    headers = {"Authorization": f"Bearer {server_args.api_key}"} if server_args.api_key else {}
    for _ in range(600):
        try:
            if requests.get(f"{url}/get_model_info", timeout=5, headers=headers).ok:
                break
        except requests.RequestException:
            time.sleep(0.2)
    if not server_args.skip_server_warmup:
        # An embedding model warms up with /encode (SGLang).
        is_generation = state.tokenizer_manager.is_generation
        path = "/generate" if is_generation else "/encode"
        body: dict = (
            {"sampling_params": {"temperature": 0, "max_new_tokens": 8}} if is_generation else {}
        )
        if server_args.skip_tokenizer_init:
            body["input_ids"] = [10, 11, 12]
        else:
            body["text"] = "The capital city of France is"
        start = time.perf_counter()
        try:
            res = requests.post(f"{url}{path}", json=body, timeout=600, headers=headers)
            res.raise_for_status()
            logger.info("Warm-up request done in %.2f s", time.perf_counter() - start)
        except Exception as e:
            logger.error("Warm-up request failed: %s", e)
            kill_process_tree(os.getpid())
            return
    state.status = "Up"
    logger.info("The server is fired up and ready to roll!")
    logger.info("Dashboard: %s/dashboard", url)


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

    configure_logger(server_args)
    check_port_available(server_args.host, server_args.port)  # before any model load
    tm, info, children = launch_subprocesses(server_args)
    state = ServerState(tm, info, server_args)
    app.state.server = state

    def on_term(signum, frame) -> None:
        logger.info("Received signal %d; shutting down.", signum)
        state.status = "ShuttingDown"
        children.stop()
        kill_process_tree(os.getpid(), include_parent=False)
        os._exit(0)

    signal.signal(signal.SIGTERM, on_term)
    threading.Thread(target=_warmup, args=(server_args, state), daemon=True).start()
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
