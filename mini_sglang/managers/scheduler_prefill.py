"""Forming the next prefill batch, and --enable-mixed-chunk (SGLang's mixed chunked prefill).

`get_new_batch_prefill` continues the chunked request, then admits waiting requests through
a PrefillAdder, and prepares the batch (KV slots, flat token arrays).

Mixed chunked prefill: with --enable-mixed-chunk and chunked prefill on, a prefill batch
formed while requests are decoding takes the running batch along. Each running request
advances by one token inside the same EXTEND forward (an extend of 1 token whose prefix is
its whole history), so decoding does not stall behind a long chunked prompt. The adder's
budgets shrink by the running count (those tokens share the forward). The forward mode is
MIXED (an extend for the model, attention and logits; CUDA graphs are decode-only, so it
runs eagerly); result processing treats the appended rows as decode rows. Afterwards the
whole mixed batch becomes the running batch, as a plain prefill batch does.

Differences from SGLang 0.5.4, on purpose: batches with logprob requests are mixed too
(SGLang skips them, a TODO there; here each row's logprob bookkeeping is per row and
frozen in the batch snapshot), a running batch as large as the chunk budget is not mixed
(SGLang would leave the chunked request a zero or negative budget), and a running batch
whose next KV slots do not fit after the prefill's allocation is left to the ordinary
decode step, which can retract (SGLang allocates without checking).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from mini_sglang.managers.schedule_batch import ScheduleBatch
from mini_sglang.managers.schedule_policy import AddReqResult, PrefillAdder

if TYPE_CHECKING:
    from mini_sglang.managers.scheduler import Scheduler

logger = logging.getLogger("mini_sglang")


class SchedulerPrefillMixin:
    def init_mixed_chunk(self: Scheduler) -> None:
        self.is_mixed_chunk = (
            self.chunked_prefill_size is not None and self.server_args.enable_mixed_chunk
        )
        self.num_mixed_batches = 0  # forwards that ran prefill and decode rows together
        self.num_mixed_decode_rows = 0  # decode rows those forwards carried

    def mixed_decode_tokens(self: Scheduler, running_bs: int) -> int:
        """Decode tokens the next prefill batch carries if it is mixed (0: no mixing)."""
        if not self.is_mixed_chunk or running_bs == 0:
            return 0
        return running_bs if running_bs < self.chunked_prefill_size else 0

    def get_new_batch_prefill(self: Scheduler) -> ScheduleBatch | None:
        if not self.waiting_queue and self.chunked_req is None:
            return None
        running_bs = len(self.running_batch.reqs) if self.running_batch else 0
        if running_bs >= self.max_running_requests:
            return None
        self.policy.calc_priority(self.waiting_queue)
        mixed_tokens = self.mixed_decode_tokens(running_bs)
        adder = PrefillAdder(
            self.page_size,
            self.tree_cache,
            self.allocator,
            self.running_batch,
            self.new_token_ratio,
            self.server_args.max_prefill_tokens,
            self.chunked_prefill_size,
            mixed_with_decode_tokens=mixed_tokens,
        )
        if self.chunked_req is not None:
            self.chunked_req.init_next_round_input(None)
            self.chunked_req = adder.add_chunked_req(self.chunked_req)
        for req in self.waiting_queue:
            if running_bs + len(adder.can_run_list) >= self.max_running_requests:
                break
            req.init_next_round_input(self.tree_cache)
            result = adder.add_one_req(req)
            if result != AddReqResult.CONTINUE:
                if result == AddReqResult.NO_TOKEN and not adder.can_run_list:
                    self.log_no_token_once()
                break
            if adder.new_chunked_req is not None:
                break
        if not adder.can_run_list:
            return None
        admitted = set(map(id, adder.can_run_list))
        self.waiting_queue = [r for r in self.waiting_queue if id(r) not in admitted]
        if adder.new_chunked_req is not None:
            assert self.chunked_req is None, "one chunked request at a time"
            self.chunked_req = adder.new_chunked_req
        if self.chunked_req is not None:
            self.chunked_req.is_chunked += 1
        batch = ScheduleBatch(
            adder.can_run_list,
            self.req_to_token_pool,
            self.allocator,
            self.tree_cache,
            self.model_config.vocab_size,
            self.device,
        )
        batch.prepare_for_extend()
        self.log_prefill_stats(adder, running_bs)
        if mixed_tokens:
            self.mix_running_into(batch)
        return batch

    def mix_running_into(self: Scheduler, batch: ScheduleBatch) -> None:
        """Append the running decode batch to the prepared prefill `batch` (now MIXED) and
        empty running_batch: the mixed batch is the running batch from the next step on.

        The running batch was filtered this step (get_next_batch_to_run); under overlap it
        may still hold requests that finished in the step whose results are pending, as a
        decode step would, and result processing frees their surplus slot the same way.
        """
        running = self.running_batch
        if not running.check_decode_mem():
            # The prefill took the room: the next decode step makes it (and may retract).
            return
        running.prepare_for_decode()
        batch.mix_with_running(running)
        self.running_batch = None
        self.num_mixed_batches += 1
        self.num_mixed_decode_rows += len(running.reqs)
        logger.debug(
            "Mixed batch. #prefill-seq: %d, #decode-seq: %d",
            batch.decode_start,
            len(running.reqs),
        )
