"""TokenizerManager side of weight updates and of data parallelism.

Control replies with --dp-size N: the DP controller forwards every control request to all N
replicas and each replica's rank 0 answers the TokenizerManager directly, so the
TokenizerManager waits for N replies (SGLang's `_Communicator(fan_out=dp_size)`) and merges
them (`merge_replies`): success is the AND, messages are joined with " | ", weights read by
name become one list per replica (as SGLang returns them), anything else is replica 0's.
One control request of a given type is in flight at a time, so replies cannot interleave.

Weight updates (SGLang 0.5.4's TokenizerManager methods): `abort_all_requests` aborts every
request first; the scheduler then finishes what it holds before swapping weights (see
scheduler_update_weights). On success a given `weight_version` becomes the server's.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import TYPE_CHECKING, Any

from mini_sglang.managers.io_struct.control import GetLoadReqOutput
from mini_sglang.managers.io_struct.weights import (
    DestroyWeightsUpdateGroupReqInput,
    DestroyWeightsUpdateGroupReqOutput,
    GetWeightsByNameReqInput,
    GetWeightsByNameReqOutput,
    InitWeightsUpdateGroupReqInput,
    InitWeightsUpdateGroupReqOutput,
    UpdateWeightFromDiskReqInput,
    UpdateWeightFromDiskReqOutput,
    UpdateWeightsFromDistributedReqInput,
    UpdateWeightsFromDistributedReqOutput,
    UpdateWeightsFromTensorReqInput,
    UpdateWeightsFromTensorReqOutput,
)

if TYPE_CHECKING:
    from mini_sglang.managers.tokenizer_manager import TokenizerManager

REPLY_TYPES = (
    UpdateWeightFromDiskReqOutput,
    InitWeightsUpdateGroupReqOutput,
    DestroyWeightsUpdateGroupReqOutput,
    UpdateWeightsFromDistributedReqOutput,
    UpdateWeightsFromTensorReqOutput,
    GetWeightsByNameReqOutput,
    GetLoadReqOutput,
)


def merge_replies(replies: list[Any]) -> Any:
    """One reply from the N replicas' replies (see the module docstring)."""
    first = replies[0]
    if len(replies) == 1:
        return first
    if isinstance(first, GetWeightsByNameReqOutput):
        return GetWeightsByNameReqOutput([r.parameter for r in replies])
    changes: dict[str, Any] = {}
    if hasattr(first, "success"):
        changes["success"] = all(r.success for r in replies)
    if hasattr(first, "message"):
        changes["message"] = " | ".join(r.message for r in replies)
    return dataclasses.replace(first, **changes) if changes else first


async def request_all_replicas(
    tm: TokenizerManager, req: Any, reply_type: type, timeout: float | None
) -> Any:
    """Send one control request (the controller fans it out) and merge dp_size replies."""
    tm.auto_create_handle_loop()
    locks = tm.__dict__.setdefault("_replica_reply_locks", {})
    async with locks.setdefault(reply_type, asyncio.Lock()):
        loop = asyncio.get_running_loop()
        futs = [loop.create_future() for _ in range(tm.server_args.dp_size)]
        tm.reply_waiters[reply_type].extend(futs)
        await tm.send_to_scheduler.send_pyobj(req)
        replies = await asyncio.wait_for(asyncio.gather(*futs), timeout)
    return merge_replies(list(replies))


async def _call(tm: TokenizerManager, req: Any, reply_type: type) -> Any:
    for t in REPLY_TYPES:  # route these replies to the waiters (idempotent)
        tm._dispatch.setdefault(t, tm._handle_reply)
    if getattr(req, "abort_all_requests", False):
        tm.abort_request(abort_all=True)
    # No timeout: a weight update waits for in-flight requests and for the trainer.
    return await tm._request_reply(req, reply_type, timeout=None)


def _set_version(tm: TokenizerManager, version: str | None, out: Any) -> None:
    if out.success and version is not None:
        tm.server_args.weight_version = version
        out.message += f" Weight version updated to {version}."


async def update_weights_from_disk(
    tm: TokenizerManager, obj: UpdateWeightFromDiskReqInput
) -> UpdateWeightFromDiskReqOutput:
    if obj.load_format is None:
        obj.load_format = tm.server_args.load_format
    out = await _call(tm, obj, UpdateWeightFromDiskReqOutput)
    if out.success:
        tm.server_args.model_path = obj.model_path
        tm.server_args.load_format = obj.load_format
    _set_version(tm, obj.weight_version, out)
    return out


async def init_weights_update_group(
    tm: TokenizerManager, obj: InitWeightsUpdateGroupReqInput
) -> InitWeightsUpdateGroupReqOutput:
    return await _call(tm, obj, InitWeightsUpdateGroupReqOutput)


async def destroy_weights_update_group(
    tm: TokenizerManager, obj: DestroyWeightsUpdateGroupReqInput
) -> DestroyWeightsUpdateGroupReqOutput:
    return await _call(tm, obj, DestroyWeightsUpdateGroupReqOutput)


async def update_weights_from_distributed(
    tm: TokenizerManager, obj: UpdateWeightsFromDistributedReqInput
) -> UpdateWeightsFromDistributedReqOutput:
    out = await _call(tm, obj, UpdateWeightsFromDistributedReqOutput)
    _set_version(tm, obj.weight_version, out)
    return out


async def update_weights_from_tensor(
    tm: TokenizerManager, obj: UpdateWeightsFromTensorReqInput
) -> UpdateWeightsFromTensorReqOutput:
    out = await _call(tm, obj, UpdateWeightsFromTensorReqOutput)
    _set_version(tm, obj.weight_version, out)
    return out


async def get_weights_by_name(tm: TokenizerManager, obj: GetWeightsByNameReqInput) -> list | None:
    out = await _call(tm, obj, GetWeightsByNameReqOutput)
    return out.parameter
