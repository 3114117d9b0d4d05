"""GET /metrics: Prometheus text format (managers/tokenizer_metrics.py), 404 unless the
server runs with --enable-metrics."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from mini_sglang.entrypoints.http_helpers import error_response
from mini_sglang.entrypoints.server_state import ServerStateDep

router = APIRouter()


@router.get("/metrics")
async def metrics(state: ServerStateDep) -> Response:
    """Prometheus text format; 404 unless the server runs with --enable-metrics."""
    tm = state.tokenizer_manager
    if tm.metrics is None:
        return error_response("Metrics are disabled; start the server with --enable-metrics", 404)
    body = tm.metrics.render(await tm.communicator.get_internal_state())
    return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")
