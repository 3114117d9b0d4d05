"""TokenizerCommunicator: a control request gets its own reply, DP replies are merged, and
a request that timed out does not steal the next request's reply."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from mini_sglang.managers.io_struct.control import (
    FlushCacheReqInput,
    FlushCacheReqOutput,
    GetInternalStateReqOutput,
    GetLoadReqOutput,
)
from mini_sglang.managers.io_struct.weights import (
    GetWeightsByNameReqOutput,
    UpdateWeightFromDiskReqInput,
    UpdateWeightFromDiskReqOutput,
)
from mini_sglang.managers.tokenizer_communicator import TokenizerCommunicator, merge_replies


class _Scheduler:
    """Collects what the communicator sends; replies are fed back by the test."""

    def __init__(self) -> None:
        self.sent: list = []

    async def send(self, req) -> None:
        self.sent.append(req)


def _communicator(fan_out: int, **server_args):
    sched = _Scheduler()
    aborted: list[bool] = []
    args = SimpleNamespace(weight_version="v0", load_format="auto", model_path="m", **server_args)
    comm = TokenizerCommunicator(sched.send, fan_out, args, lambda: aborted.append(True))
    return comm, sched, args, aborted


async def _until_sent(sched: _Scheduler, n: int) -> None:
    while len(sched.sent) < n:
        await asyncio.sleep(0)


def test_replies_go_to_requests_in_order():
    async def run():
        comm, sched, _, _ = _communicator(1)
        first = asyncio.create_task(comm.flush_cache())
        second = asyncio.create_task(comm.flush_cache())
        await _until_sent(sched, 2)
        assert all(isinstance(r, FlushCacheReqInput) for r in sched.sent)
        comm.handle_reply(FlushCacheReqOutput(success=True))
        comm.handle_reply(FlushCacheReqOutput(success=False))
        return (await first).success, (await second).success

    assert asyncio.run(run()) == (True, False)


def test_a_timed_out_request_swallows_only_its_own_reply():
    async def run():
        comm, sched, _, _ = _communicator(1)
        with pytest.raises(asyncio.TimeoutError):
            await comm._call(FlushCacheReqInput(), FlushCacheReqOutput, timeout=0.01)
        late = asyncio.create_task(comm.flush_cache())
        await _until_sent(sched, 2)
        comm.handle_reply(FlushCacheReqOutput(success=False))  # the timed-out one's
        comm.handle_reply(FlushCacheReqOutput(success=True))
        return (await late).success

    assert asyncio.run(run()) is True


def test_dp_replies_are_merged_and_requests_serialised():
    async def run():
        comm, sched, args, aborted = _communicator(2)
        obj = UpdateWeightFromDiskReqInput(
            model_path="new", abort_all_requests=True, weight_version="v1"
        )
        first = asyncio.create_task(comm.update_weights_from_disk(obj))
        second = asyncio.create_task(
            comm.update_weights_from_disk(UpdateWeightFromDiskReqInput(model_path="other"))
        )
        await _until_sent(sched, 1)
        await asyncio.sleep(0.01)
        assert len(sched.sent) == 1  # the second waits for both replies to the first
        comm.handle_reply(UpdateWeightFromDiskReqOutput(success=True, message="a"))
        comm.handle_reply(UpdateWeightFromDiskReqOutput(success=True, message="b"))
        out = await first
        assert (out.success, out.message) == (True, "a | b Weight version updated to v1.")
        assert (args.model_path, args.weight_version, aborted) == ("new", "v1", [True])
        await _until_sent(sched, 2)
        comm.handle_reply(UpdateWeightFromDiskReqOutput(success=True, message="c"))
        comm.handle_reply(UpdateWeightFromDiskReqOutput(success=False, message="d"))
        out = await second
        return out.success, out.message, args.model_path

    assert asyncio.run(run()) == (False, "c | d", "new")


def test_weights_by_name_are_one_list_per_replica():
    merged = merge_replies(
        [GetWeightsByNameReqOutput(parameter=[1.0]), GetWeightsByNameReqOutput(parameter=[2.0])]
    )
    assert merged.parameter == [[1.0], [2.0]]


def test_internal_states_and_loads_list_every_replica_in_rank_order():
    async def run():
        comm, sched, _, _ = _communicator(2)
        states = asyncio.create_task(comm.get_internal_state())
        await _until_sent(sched, 1)
        comm.handle_reply(GetInternalStateReqOutput({"num_running_reqs": 1}, dp_rank=1))
        comm.handle_reply(GetInternalStateReqOutput({"num_running_reqs": 0}, dp_rank=0))
        loads = asyncio.create_task(comm.get_load())
        await _until_sent(sched, 2)
        for rank in (1, 0):
            comm.handle_reply(
                GetLoadReqOutput(rank, num_reqs=rank, num_waiting_reqs=0, num_tokens=0)
            )
        return await states, [load.num_reqs for load in await loads]

    states, loads = asyncio.run(run())
    assert states == [{"num_running_reqs": 0}, {"num_running_reqs": 1}]
    assert loads == [0, 1]
    # Without DP: a list of one.
    assert merge_replies([GetInternalStateReqOutput({"a": 1})])[0].internal_state == {"a": 1}
