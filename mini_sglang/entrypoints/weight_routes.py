"""HTTP routes for online weight updates (SGLang 0.5.4's paths, bodies and replies).

`{"success", "message"}` (plus `num_paused_requests` from disk) with 200 on success and 400
on failure; /get_weights_by_name returns the (truncated) nested list, or 400
{"error": {"message"}}. A body that does not fit the request dataclass (a missing field, a
wrong JSON type) is SGLang's validation 400 {"object": "error", "message": "body.<field>:
...", "type": "Bad Request", ...}, checked here so that no ill-typed value reaches the
scheduler (where e.g. a list as group_name used to crash it).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from mini_sglang.entrypoints.http_server import (
    error_response,
    get_state,
    orjson_response,
    parse_error_response,
    parse_request,
)
from mini_sglang.managers import tokenizer_manager_parallel as tmp
from mini_sglang.managers.io_struct import (
    DestroyWeightsUpdateGroupReqInput,
    GetWeightsByNameReqInput,
    InitWeightsUpdateGroupReqInput,
    UpdateWeightFromDiskReqInput,
    UpdateWeightsFromDistributedReqInput,
    UpdateWeightVersionReqInput,
)


def _reply(out: Any, **extra: Any) -> Response:
    content = {"success": out.success, "message": out.message, **extra}
    return orjson_response(content, 200 if out.success else 400)


def _forwarding_route(req_cls: type, call: Any):
    async def route(request: Request) -> Response:
        try:
            obj = await parse_request(request, req_cls)
        except ValueError as e:
            return parse_error_response(e)
        return _reply(await call(get_state().tokenizer_manager, obj))

    return route


def mount_weight_routes(app: FastAPI) -> None:
    """Add the weight-update routes to `app` (called once by launch_server)."""

    @app.post("/update_weights_from_disk")
    async def update_weights_from_disk(request: Request) -> Response:
        try:
            obj = await parse_request(request, UpdateWeightFromDiskReqInput)
        except ValueError as e:
            return parse_error_response(e)
        out = await tmp.update_weights_from_disk(get_state().tokenizer_manager, obj)
        return _reply(out, num_paused_requests=out.num_paused_requests)

    # Routes whose whole job is: parse the body, forward it, answer {"success","message"}.
    forwarded = {
        "/init_weights_update_group": (
            InitWeightsUpdateGroupReqInput,
            tmp.init_weights_update_group,
        ),
        "/destroy_weights_update_group": (
            DestroyWeightsUpdateGroupReqInput,
            tmp.destroy_weights_update_group,
        ),
        "/update_weights_from_distributed": (
            UpdateWeightsFromDistributedReqInput,
            tmp.update_weights_from_distributed,
        ),
    }
    for path, (req_cls, call) in forwarded.items():
        app.post(path)(_forwarding_route(req_cls, call))

    @app.api_route("/get_weights_by_name", methods=["GET", "POST"])
    async def get_weights_by_name(request: Request) -> Response:
        try:
            obj = await parse_request(request, GetWeightsByNameReqInput)
        except ValueError as e:
            return parse_error_response(e)
        ret = await tmp.get_weights_by_name(get_state().tokenizer_manager, obj)
        if ret is None:
            return error_response("Get parameter by name failed")
        return orjson_response(ret)

    @app.post("/update_weight_version")
    async def update_weight_version(request: Request) -> Response:
        try:
            obj = await parse_request(request, UpdateWeightVersionReqInput)
        except ValueError as e:
            return parse_error_response(e)
        tm = get_state().tokenizer_manager
        if obj.abort_all_requests:
            tm.abort_request(abort_all=True)
        tm.server_args.weight_version = obj.new_version
        return orjson_response(
            {
                "success": True,
                "message": f"Weight version updated to {obj.new_version}",
                "new_version": obj.new_version,
            }
        )
