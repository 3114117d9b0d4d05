"""TokenizerManager side of profiling, /slow_down, sessions, pause / continue and /freeze_gc
(SGLang 0.5.4 semantics).

Profiling: one ProfileReq goes to every scheduler rank (and, with --dp-size N, to every
replica, whose N replies are merged); a reply with success=False raises RuntimeError, which
the HTTP layer turns into SGLang's 500. The profile id is the start time, unless given.

Pause (0.5.4's TokenizerManager.pause_generation): mark the server paused and abort every
in-flight request (they finish with an abort reason and free their KV as any abort does).
While paused, `generate_request` parks each new request before tokenizing it, so nothing new
reaches the scheduler, which idles; continue releases the parked requests in arrival order.
Pausing twice or continuing while running are harmless no-ops beyond the abort. The
/health probe is a generate request too, so, as in 0.5.4, /health answers 503 while paused
(after SGLANG_HEALTH_CHECK_TIMEOUT); weight updates and other control requests still run.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING, Optional

from mini_sglang.environ import envs
from mini_sglang.managers.io_struct.control import (
    CloseSessionReqInput,
    FreezeGCReq,
    OpenSessionReqInput,
    OpenSessionReqOutput,
    ProfileReq,
    ProfileReqInput,
    ProfileReqOutput,
    ProfileReqType,
    SlowDownReqInput,
    SlowDownReqOutput,
)
from mini_sglang.utils.gc_utils import freeze_gc as freeze_this_process

if TYPE_CHECKING:
    from mini_sglang.managers.tokenizer_manager import TokenizerManager


async def start_profile(
    tm: TokenizerManager, obj: Optional[ProfileReqInput] = None
) -> ProfileReqOutput:
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
    return await _execute_profile(tm, req)


async def stop_profile(tm: TokenizerManager) -> ProfileReqOutput:
    return await _execute_profile(tm, ProfileReq(type=ProfileReqType.STOP_PROFILE))


async def _execute_profile(tm: TokenizerManager, req: ProfileReq) -> ProfileReqOutput:
    # No timeout: writing a long trace can take minutes.
    out = await tm._request_reply(req, ProfileReqOutput, timeout=None)
    if not out.success:
        raise RuntimeError(out.message)
    return out


async def slow_down(tm: TokenizerManager, req: SlowDownReqInput) -> None:
    """Every scheduler rank (every replica with --dp-size) sleeps req.forward_sleep_time
    seconds before each forward from now on (null or <= 0: no more); returns once set."""
    await tm._request_reply(req, SlowDownReqOutput)


async def open_session(tm: TokenizerManager, req: OpenSessionReqInput) -> Optional[str]:
    """The new session's id (a fresh uuid4 hex unless given), or None if it is taken."""
    if req.session_id is None:
        req.session_id = uuid.uuid4().hex
    reply = await tm._request_reply(req, OpenSessionReqOutput)
    return reply.session_id if reply.success else None


async def close_session(tm: TokenizerManager, req: CloseSessionReqInput) -> None:
    await tm.send_to_scheduler.send_pyobj(req)


async def freeze_gc(tm: TokenizerManager) -> None:
    """gc.freeze() in the scheduler (which passes it on to the detokenizer), then here; as
    in SGLang, nothing waits for the other processes to have done it."""
    await tm.send_to_scheduler.send_pyobj(FreezeGCReq())
    freeze_this_process("Tokenizer Manager")


async def pause_generation(tm: TokenizerManager) -> None:
    async with tm.is_pause_cond:
        tm.is_pause = True
        tm.abort_request(abort_all=True)


async def continue_generation(tm: TokenizerManager) -> None:
    async with tm.is_pause_cond:
        tm.is_pause = False
        tm.is_pause_cond.notify_all()


async def wait_while_paused(tm: TokenizerManager) -> None:
    """Return at once unless paused; else when /continue_generation is called."""
    if not tm.is_pause:
        return
    async with tm.is_pause_cond:
        await tm.is_pause_cond.wait_for(lambda: not tm.is_pause)
