"""Parallel sampling (n > 1): prefill each shared prompt once before sampling it n times.

SGLang 0.5.4's TokenizerManager (``_handle_batch_request``) first sends, for every distinct
prompt, a copy of the request with ``max_new_tokens=0`` and a fresh rid, waits until it has
finished (its prompt KV is then in the radix cache), and only then sends the n real
copies, whose prefill is then a cache hit on all but the last prompt token. The
prefix-caching requests' outputs are never shown to the client.

Example: text="Hi", n=3 -> one hidden request (max_new_tokens 0) for "Hi", then rids x_0,
x_1, x_2 that each report cached_tokens == len(prompt) - 1.
"""

from __future__ import annotations

import asyncio
import copy
import time
import uuid
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mini_sglang.managers.io_struct.generate import GenerateReqInput, TokenizedGenerateReqInput
    from mini_sglang.managers.tokenizer_manager import TokenizerManager


async def prefill_shared_prompts(
    tm: TokenizerManager,
    subs: list[GenerateReqInput],
    tokenized: list[TokenizedGenerateReqInput],
    n: int,
    request: Any = None,
) -> None:
    """Run one prefill-only request per prompt of an expanded batch and wait for all.

    ``subs``/``tokenized`` are the prompt-major expansion (sub-request k uses prompt k // n),
    so the first copy of each prompt is at k = 0, n, 2n, ... Raises what the scheduler
    reports for a bad request (ValueError -> 400) before any real copy is sent.
    """
    from mini_sglang.managers.tokenizer_manager import ReqState

    waits = []
    for k in range(0, len(subs), n):
        sub = copy.copy(subs[k])
        sub.rid = uuid.uuid4().hex
        sub.stream = False
        tok = copy.copy(tokenized[k])
        tok.rid = sub.rid
        tok.stream = False
        tok.sampling_params = copy.copy(tok.sampling_params)
        tok.sampling_params.max_new_tokens = 0
        state = ReqState(sub, time.time())
        tm.rid_to_state[sub.rid] = state
        await tm.send_to_scheduler.send_pyobj(tok)
        waits.append(_drain(tm._wait_one_response(state, request)))
    await asyncio.gather(*waits)


async def _drain(gen: Any) -> None:
    async for _ in gen:
        pass
