"""WeightUpdater: the scheduler's component for online weight updates (SGLang 0.5.4's
SchedulerUpdateWeightsMixin); its handlers go into the scheduler's dispatch table.

In-flight requests: SGLang's TokenizerManager holds a writer lock, so an update runs only
after every in-flight request has finished, and requests sent later see the new weights.
Here the scheduler gives the same guarantee itself: an update first runs the scheduler until
idle (finishing, and streaming, everything it already holds; with `abort_all_requests` the
TokenizerManager aborts those first), then swaps the weights and flushes the prefix cache,
whose KV was computed with the old weights. Messages that arrive meanwhile wait in the
socket and are handled afterwards, with the new weights. Every TP rank runs the same
handler on the same broadcast message; only rank 0's reply is sent.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

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
from mini_sglang.model_executor import weight_updates as wu

logger = logging.getLogger("mini_sglang")


class WeightUpdater:
    def __init__(
        self,
        model_runner: Any,
        dp_rank: int | None,
        has_work: Callable[[], bool],
        run_until_idle: Callable[[], None],
        flush_cache: Callable[[], bool],
    ) -> None:
        """The scheduler's own has_work / run_until_idle / flush_cache do the draining and
        the flush around an update."""
        self._runner = model_runner
        self.dp_rank = dp_rank or 0
        self.has_work = has_work
        self.run_until_idle = run_until_idle
        self.flush_cache = flush_cache

    def dispatch(self) -> dict[type, Callable[[Any], Any]]:
        """Entries for the scheduler's type -> handler table."""
        return {
            UpdateWeightFromDiskReqInput: self.update_weights_from_disk,
            InitWeightsUpdateGroupReqInput: self.init_weights_update_group,
            DestroyWeightsUpdateGroupReqInput: self.destroy_weights_update_group,
            UpdateWeightsFromDistributedReqInput: self.update_weights_from_distributed,
            UpdateWeightsFromTensorReqInput: self.update_weights_from_tensor,
            GetWeightsByNameReqInput: self.get_weights_by_name,
        }

    def _finish_in_flight(self) -> None:
        """Run until idle: in-flight requests complete with the weights they started with."""
        if self.has_work():
            logger.info("Weight update: finishing in-flight requests first.")
            self.run_until_idle()

    def _flush_after_update(self) -> None:
        ok = self.flush_cache()
        assert ok, "Cache flush failed after updating weights"

    def update_weights_from_disk(self, recv: UpdateWeightFromDiskReqInput):
        self._finish_in_flight()
        success, message = wu.update_weights_from_disk(
            self._runner, recv.model_path, recv.load_format
        )
        if success:
            self._flush_after_update()
        else:
            logger.error(message)
        return UpdateWeightFromDiskReqOutput(success, message, 0)

    def init_weights_update_group(self, recv: InitWeightsUpdateGroupReqInput):
        success, message = wu.init_weights_update_group(
            self._runner,
            recv.master_address,
            recv.master_port,
            recv.rank_offset,
            recv.world_size,
            recv.group_name,
            recv.backend,
            dp_rank=self.dp_rank,
        )
        return InitWeightsUpdateGroupReqOutput(success, message)

    def destroy_weights_update_group(self, recv: DestroyWeightsUpdateGroupReqInput):
        success, message = wu.destroy_weights_update_group(self._runner, recv.group_name)
        return DestroyWeightsUpdateGroupReqOutput(success, message)

    def update_weights_from_distributed(self, recv: UpdateWeightsFromDistributedReqInput):
        self._finish_in_flight()
        success, message = wu.update_weights_from_distributed(
            self._runner, recv.names, recv.dtypes, recv.shapes, recv.group_name
        )
        if success and recv.flush_cache:
            self._flush_after_update()
        elif not success:
            logger.error(message)
        return UpdateWeightsFromDistributedReqOutput(success, message)

    def update_weights_from_tensor(self, recv: UpdateWeightsFromTensorReqInput):
        self._finish_in_flight()
        success, message = wu.update_weights_from_tensor(
            self._runner, recv.serialized_named_tensors
        )
        if success and recv.flush_cache:
            self._flush_after_update()
        elif not success:
            logger.error(message)
        return UpdateWeightsFromTensorReqOutput(success, message)

    def get_weights_by_name(self, recv: GetWeightsByNameReqInput):
        parameter = wu.get_weights_by_name(self._runner, recv.name, recv.truncate_size)
        return GetWeightsByNameReqOutput(parameter)
