"""The built-in dashboard: GET /dashboard (a page of live charts, static files shipped in
the package under entrypoints/static, nothing fetched from elsewhere), its assets under
/dashboard/static/, the JSON it polls at GET /dashboard/data, and GET / redirecting to it.

/dashboard/data is computed when asked: the schedulers answer an internal-state request
from numbers they keep anyway (one control round trip, every DP replica merged), and the
TokenizerManager adds its windowed throughput, hit rate and TTFT / ITL percentiles
(managers/dashboard_stats.py) and its in-flight requests. It works with or without
--enable-metrics. With --api-key the page and its assets load without the key (they hold no
data; the page asks for the key) and /dashboard/data needs it like every other route.
None of these routes is in the OpenAPI schema (SGLang has none of them).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from fastapi.responses import FileResponse, RedirectResponse, Response

from mini_sglang import __version__
from mini_sglang.entrypoints.http_helpers import error_response, orjson_response
from mini_sglang.entrypoints.server_state import ServerState, ServerStateDep
from mini_sglang.managers.dashboard_stats import inflight_table, merge_schedulers

router = APIRouter(include_in_schema=False)

STATIC_DIR = Path(__file__).parent / "static"
_ASSETS = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
# Paths the page needs before it has the API key (see APIKeyMiddleware).
PUBLIC_PATHS = ("/", "/dashboard", "/dashboard/")
PUBLIC_PREFIX = "/dashboard/static/"
# Server args never shown, whatever their value.
_SECRET_ARGS = ("api_key", "admin_api_key")


def is_public_path(path: str) -> bool:
    """True for the dashboard page, its assets and `/`: they load without the API key."""
    return path in PUBLIC_PATHS or path.startswith(PUBLIC_PREFIX)


@router.get("/")
async def root() -> Response:
    return RedirectResponse("/dashboard", status_code=307)


@router.get("/dashboard")
@router.get("/dashboard/")
async def dashboard_page() -> Response:
    return FileResponse(STATIC_DIR / "dashboard.html", media_type="text/html; charset=utf-8")


@router.get("/dashboard/static/{name}")
async def dashboard_asset(name: str) -> Response:
    media_type = _ASSETS.get(name)
    if media_type is None:
        return error_response(f"No dashboard asset {name!r}", 404)
    return FileResponse(STATIC_DIR / name, media_type=media_type)


def _non_default_args(view: dict[str, Any], state: ServerState) -> dict[str, Any]:
    """The server args whose value differs from the field's default (secrets left out)."""
    out = {}
    for f in dataclasses.fields(state.server_args):
        if f.name in _SECRET_ARGS or f.name not in view:
            continue
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = None
        value = view[f.name]
        if json.dumps(value, default=str) != json.dumps(default, default=str):
            out[f.name] = value
    return out


def server_description(state: ServerState) -> dict[str, Any]:
    """The model, card, parallelism and non-default flags the server runs with."""
    args = state.server_args
    view = state.tokenizer_manager.runtime_state.server_args_view(args)
    return {
        "version": __version__,
        "model_path": view.get("model_path"),
        "served_model_name": args.served_model_name,
        "weight_version": view.get("weight_version"),
        "device_name": state.scheduler_info.get("device_name"),
        "tp_size": args.tp_size,
        "dp_size": args.dp_size,
        "context_len": state.tokenizer_manager.context_len,
        "max_total_num_tokens": state.scheduler_info.get("max_total_num_tokens"),
        "enable_metrics": bool(args.enable_metrics),
        "status": state.status,
        "flags": _non_default_args(view, state),
    }


@router.get("/dashboard/data")
async def dashboard_data(state: ServerStateDep) -> Response:
    """One snapshot for the dashboard (see the module docstring); times in seconds."""
    tm = state.tokenizer_manager
    internal_states = await tm.communicator.get_internal_state()
    now = time.time()
    return orjson_response(
        {
            "time": now,
            "uptime_s": now - tm.dashboard.start_time,
            "server": server_description(state),
            "scheduler": merge_schedulers(internal_states),
            "tokenizer": tm.dashboard.tokenizer_side(now),
            "inflight": inflight_table(tm.rid_to_state, now),
        }
    )
