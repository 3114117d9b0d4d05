"""HTTP routes for online weight updates (SGLang 0.5.4's paths, bodies and replies).

`{"success", "message"}` (plus `num_paused_requests` from disk) with 200 on success and 400
on failure; /get_weights_by_name returns the (truncated) nested list, or 400
{"error": {"message"}}. A body that does not fit the request dataclass (a missing field, a
wrong JSON type) is SGLang's validation 400 {"object": "error", "message": "body.<field>:
...", "type": "Bad Request", ...}, checked here so that no ill-typed value reaches the
scheduler (where e.g. a list as group_name would crash its `in groups` check).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import Response

from mini_sglang.entrypoints.http_helpers import body_route, error_response, orjson_response
from mini_sglang.managers.io_struct.weights import (
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


def _forwarding(method: str):
    """body_route's handler for the communicator method answered with {"success", "message"}."""

    async def handle(tm: Any, obj: Any) -> Response:
        return _reply(await getattr(tm.communicator, method)(obj))

    return handle


router = APIRouter()


async def update_weights_from_disk(tm: Any, obj: UpdateWeightFromDiskReqInput) -> Response:
    out = await tm.communicator.update_weights_from_disk(obj)
    return _reply(out, num_paused_requests=out.num_paused_requests)


async def get_weights_by_name(tm: Any, obj: GetWeightsByNameReqInput) -> Response:
    ret = await tm.communicator.get_weights_by_name(obj)
    if ret is None:
        return error_response("Get parameter by name failed")
    return orjson_response(ret)


async def update_weight_version(tm: Any, obj: UpdateWeightVersionReqInput) -> Response:
    if obj.abort_all_requests:
        tm.abort_request(abort_all=True)
    tm.runtime_state.weight_version = obj.new_version
    return orjson_response(
        {
            "success": True,
            "message": f"Weight version updated to {obj.new_version}",
            "new_version": obj.new_version,
        }
    )


router.post("/update_weights_from_disk")(
    body_route(UpdateWeightFromDiskReqInput, update_weights_from_disk)
)
# Routes whose whole job is: parse the body, forward it, answer {"success","message"}.
for _path, _req_cls, _method in (
    ("/init_weights_update_group", InitWeightsUpdateGroupReqInput, "init_weights_update_group"),
    (
        "/destroy_weights_update_group",
        DestroyWeightsUpdateGroupReqInput,
        "destroy_weights_update_group",
    ),
    (
        "/update_weights_from_distributed",
        UpdateWeightsFromDistributedReqInput,
        "update_weights_from_distributed",
    ),
):
    router.post(_path)(body_route(_req_cls, _forwarding(_method)))
router.api_route("/get_weights_by_name", methods=["GET", "POST"])(
    body_route(GetWeightsByNameReqInput, get_weights_by_name)
)
router.post("/update_weight_version")(
    body_route(UpdateWeightVersionReqInput, update_weight_version)
)
