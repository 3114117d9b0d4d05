"""The TokenizerManager's control requests and their replies (SGLang 0.5.4's
``TokenizerCommunicatorMixin`` as a component the TokenizerManager owns).

Every control request goes to the scheduler (with --dp-size N the DP controller forwards it
to all N replicas) and each replica's rank 0 answers the TokenizerManager directly. One
``_Communicator`` per reply type waits for ``fan_out`` = dp_size replies to a request and
``merge_replies`` makes one of them: success is the AND, messages are joined with " | ",
weights read by name become one list per replica (as SGLang returns them), internal states
and loads stay one reply per replica in dp-rank order (SGLang lists them per rank), anything
else is replica 0's. With fan_out > 1 one request of a type is in flight at a time, so replicas'
replies cannot interleave; with fan_out == 1 concurrent requests are answered in order.

Profiling: one ProfileReq goes to every scheduler rank; a reply with success=False raises
RuntimeError, which the HTTP layer turns into SGLang's 500. The profile id is the start
time, unless given.

Weight updates (SGLang 0.5.4's TokenizerManager methods): ``abort_all_requests`` aborts
every request first; the scheduler then finishes what it holds before swapping weights (see
scheduler_update_weights). On success a given ``weight_version`` becomes the server's
(ServerRuntimeState, with the loaded checkpoint's path and format).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Optional

from mini_sglang.environ import envs
from mini_sglang.managers.io_struct.control import (
    CloseSessionReqInput,
    ExpertDistributionReq,
    ExpertDistributionReqOutput,
    ExpertDistributionReqType,
    FlushCacheReqInput,
    FlushCacheReqOutput,
    FreezeGCReq,
    GetInternalStateReq,
    GetInternalStateReqOutput,
    GetLoadReqInput,
    GetLoadReqOutput,
    OpenSessionReqInput,
    OpenSessionReqOutput,
    ProfileReq,
    ProfileReqInput,
    ProfileReqOutput,
    ProfileReqType,
    SlowDownReqInput,
    SlowDownReqOutput,
)
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
from mini_sglang.utils.gc_utils import freeze_gc as freeze_this_process

if TYPE_CHECKING:
    from mini_sglang.managers.server_runtime_state import ServerRuntimeState

# Every reply type the scheduler sends to the TokenizerManager for a control request.
REPLY_TYPES: tuple[type, ...] = (
    FlushCacheReqOutput,
    ExpertDistributionReqOutput,
    GetInternalStateReqOutput,
    ProfileReqOutput,
    SlowDownReqOutput,
    OpenSessionReqOutput,
    UpdateWeightFromDiskReqOutput,
    InitWeightsUpdateGroupReqOutput,
    DestroyWeightsUpdateGroupReqOutput,
    UpdateWeightsFromDistributedReqOutput,
    UpdateWeightsFromTensorReqOutput,
    GetWeightsByNameReqOutput,
    GetLoadReqOutput,
)


def merge_replies(replies: list[Any]) -> Any:
    """One reply from the N replicas' replies (see the module docstring); for internal
    states and loads, the list of every replica's reply."""
    first = replies[0]
    if isinstance(first, (GetInternalStateReqOutput, GetLoadReqOutput)):
        return sorted(replies, key=lambda r: r.dp_rank)
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


class _Communicator:
    """Requests of one reply type: send one, wait for ``fan_out`` replies, merge them.

    Replies are matched to waiting requests in order; a waiter that timed out (cancelled)
    swallows the reply meant for it, so later requests still get their own."""

    def __init__(self, send: Callable[[Any], Awaitable[None]], fan_out: int) -> None:
        self._send = send
        self._fan_out = fan_out
        self._waiters: deque[asyncio.Future] = deque()
        self._lock = asyncio.Lock() if fan_out > 1 else None

    async def __call__(self, req: Any, timeout: float | None) -> Any:
        if self._lock is None:
            return await self._exchange(req, timeout)
        async with self._lock:
            return await self._exchange(req, timeout)

    async def _exchange(self, req: Any, timeout: float | None) -> Any:
        loop = asyncio.get_running_loop()
        futs = [loop.create_future() for _ in range(self._fan_out)]
        self._waiters.extend(futs)
        await self._send(req)
        return merge_replies(list(await asyncio.wait_for(asyncio.gather(*futs), timeout)))

    def handle_reply(self, recv: Any) -> None:
        if self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(recv)


class TokenizerCommunicator:
    """Sends control requests to the scheduler and returns their (merged) replies.

    ``send`` puts one message on the scheduler's socket (starting the TokenizerManager's
    receive loop first); ``fan_out`` is the number of replicas that answer (dp_size);
    ``abort_all`` aborts every request (weight updates asked to); ``runtime_state`` (the
    TokenizerManager's ServerRuntimeState) gets the new model path, load format and weight
    version after a successful update.
    """

    def __init__(
        self,
        send: Callable[[Any], Awaitable[None]],
        fan_out: int,
        runtime_state: ServerRuntimeState,
        abort_all: Callable[[], None],
    ) -> None:
        self._send = send
        self._runtime_state = runtime_state
        self._abort_all = abort_all
        self._communicators = {t: _Communicator(send, fan_out) for t in REPLY_TYPES}

    def handle_reply(self, recv: Any) -> None:
        """Hand a reply (one of REPLY_TYPES) to the request waiting for it."""
        self._communicators[type(recv)].handle_reply(recv)

    async def _call(self, req: Any, reply_type: type, timeout: float | None = 60.0) -> Any:
        return await self._communicators[reply_type](req, timeout)

    # ---- cache and state -----------------------------------------------------------
    async def flush_cache(self) -> FlushCacheReqOutput:
        return await self._call(FlushCacheReqInput(), FlushCacheReqOutput)

    async def get_internal_state(self) -> list[dict[str, Any]]:
        """Every DP replica's scheduler state (one with --dp-size 1), in dp-rank order."""
        replies = await self._call(GetInternalStateReq(), GetInternalStateReqOutput)
        return [r.internal_state for r in replies]

    async def get_load(self) -> list[GetLoadReqOutput]:
        """Every DP replica's load (running + waiting requests, tokens held), in dp-rank
        order, as SGLang's /get_load lists them."""
        return await self._call(GetLoadReqInput(), GetLoadReqOutput)

    async def slow_down(self, req: SlowDownReqInput) -> None:
        """Every scheduler rank (every replica with --dp-size) sleeps req.forward_sleep_time
        seconds before each forward from now on (null or <= 0: no more); returns once set."""
        await self._call(req, SlowDownReqOutput)

    async def expert_distribution(
        self, action: ExpertDistributionReqType
    ) -> ExpertDistributionReqOutput:
        """Start, stop or dump the expert distribution record on every scheduler rank;
        success False (with the reason) where no recorder runs."""
        return await self._call(ExpertDistributionReq(action), ExpertDistributionReqOutput)

    async def freeze_gc(self) -> None:
        """gc.freeze() in the scheduler (which passes it on to the detokenizer), then here; as
        in SGLang, nothing waits for the other processes to have done it."""
        await self._send(FreezeGCReq())
        freeze_this_process("Tokenizer Manager")

    # ---- profiling -----------------------------------------------------------------
    async def start_profile(self, obj: Optional[ProfileReqInput] = None) -> ProfileReqOutput:
        obj = obj or ProfileReqInput()
        # SGLang: stacks are on unless the request or SGLANG_PROFILE_WITH_STACK turns them off.
        env_stack = envs.SGLANG_PROFILE_WITH_STACK.get()
        with_stack = obj.with_stack is not False and env_stack
        req = ProfileReq(
            type=ProfileReqType.START_PROFILE,
            output_dir=obj.output_dir,
            start_step=obj.start_step,
            num_steps=obj.num_steps,
            activities=obj.activities,
            with_stack=with_stack,
            record_shapes=obj.record_shapes,
            profile_by_stage=obj.profile_by_stage,
            profile_id=obj.profile_id or str(time.time()),
            merge_profiles=obj.merge_profiles,
        )
        return await self._execute_profile(req)

    async def stop_profile(self) -> ProfileReqOutput:
        return await self._execute_profile(ProfileReq(type=ProfileReqType.STOP_PROFILE))

    async def _execute_profile(self, req: ProfileReq) -> ProfileReqOutput:
        # No timeout: writing a long trace can take minutes.
        out = await self._call(req, ProfileReqOutput, timeout=None)
        if not out.success:
            raise RuntimeError(out.message)
        return out

    # ---- sessions ------------------------------------------------------------------
    async def open_session(self, req: OpenSessionReqInput) -> Optional[str]:
        """The new session's id (a fresh uuid4 hex unless given), or None if it is taken."""
        if req.session_id is None:
            req.session_id = uuid.uuid4().hex
        reply = await self._call(req, OpenSessionReqOutput)
        return reply.session_id if reply.success else None

    async def close_session(self, req: CloseSessionReqInput) -> None:
        await self._send(req)

    # ---- weight updates ------------------------------------------------------------
    async def _update(self, req: Any, reply_type: type) -> Any:
        if getattr(req, "abort_all_requests", False):
            self._abort_all()
        # No timeout: a weight update waits for in-flight requests and for the trainer.
        return await self._call(req, reply_type, timeout=None)

    def _set_version(self, version: str | None, out: Any) -> None:
        if out.success and version is not None:
            self._runtime_state.weight_version = version
            out.message += f" Weight version updated to {version}."

    async def update_weights_from_disk(
        self, obj: UpdateWeightFromDiskReqInput
    ) -> UpdateWeightFromDiskReqOutput:
        if obj.load_format is None:
            obj.load_format = self._runtime_state.load_format
        out = await self._update(obj, UpdateWeightFromDiskReqOutput)
        if out.success:
            self._runtime_state.model_path = obj.model_path
            self._runtime_state.load_format = obj.load_format
        self._set_version(obj.weight_version, out)
        return out

    async def init_weights_update_group(
        self, obj: InitWeightsUpdateGroupReqInput
    ) -> InitWeightsUpdateGroupReqOutput:
        return await self._update(obj, InitWeightsUpdateGroupReqOutput)

    async def destroy_weights_update_group(
        self, obj: DestroyWeightsUpdateGroupReqInput
    ) -> DestroyWeightsUpdateGroupReqOutput:
        return await self._update(obj, DestroyWeightsUpdateGroupReqOutput)

    async def update_weights_from_distributed(
        self, obj: UpdateWeightsFromDistributedReqInput
    ) -> UpdateWeightsFromDistributedReqOutput:
        out = await self._update(obj, UpdateWeightsFromDistributedReqOutput)
        self._set_version(obj.weight_version, out)
        return out

    async def update_weights_from_tensor(
        self, obj: UpdateWeightsFromTensorReqInput
    ) -> UpdateWeightsFromTensorReqOutput:
        out = await self._update(obj, UpdateWeightsFromTensorReqOutput)
        self._set_version(obj.weight_version, out)
        return out

    async def get_weights_by_name(self, obj: GetWeightsByNameReqInput) -> list | None:
        out = await self._update(obj, GetWeightsByNameReqOutput)
        return out.parameter
