"""PrefillManager: the scheduler's component for building prefill batches, and
--enable-mixed-chunk (SGLang's mixed chunked prefill).

Contract: the scheduler's `get_new_batch_prefill` decides which requests run (it owns the
waiting queue, the chunked request and the running batch); this component supplies the
pieces: `new_adder` (a PrefillAdder with this step's budgets), `build` (the prepared
ScheduleBatch: KV slots, flat token arrays, sampling tensors) and `mix` (the running batch
appended to a prefill batch, which the scheduler then stops holding as running_batch).

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
from mini_sglang.managers.schedule_policy import PrefillAdder

if TYPE_CHECKING:
    from mini_sglang.managers.req import Req

logger = logging.getLogger("mini_sglang")


class PrefillManager:
    def __init__(
        self,
        server_args,
        req_to_token_pool,
        allocator,
        tree_cache,
        page_size: int,
        chunked_prefill_size: int | None,
        vocab_size: int,
        device,
    ) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.allocator = allocator
        self.tree_cache = tree_cache
        self.page_size = page_size
        self.max_prefill_tokens = server_args.max_prefill_tokens
        self.chunked_prefill_size = chunked_prefill_size
        self.vocab_size = vocab_size
        self.device = device
        self.is_mixed_chunk = chunked_prefill_size is not None and server_args.enable_mixed_chunk

    def mixed_decode_tokens(self, running_bs: int) -> int:
        """Decode tokens the next prefill batch carries if it is mixed (0: no mixing)."""
        if not self.is_mixed_chunk or running_bs == 0:
            return 0
        return running_bs if running_bs < self.chunked_prefill_size else 0

    def new_adder(
        self, running_batch: ScheduleBatch | None, new_token_ratio: float, mixed_tokens: int
    ) -> PrefillAdder:
        return PrefillAdder(
            self.page_size,
            self.tree_cache,
            self.allocator,
            running_batch,
            new_token_ratio,
            self.max_prefill_tokens,
            self.chunked_prefill_size,
            mixed_with_decode_tokens=mixed_tokens,
        )

    def build(self, reqs: list[Req]) -> ScheduleBatch:
        """The prefill batch of `reqs`, prepared: KV slots taken, inputs on the device."""
        batch = ScheduleBatch(
            reqs,
            self.req_to_token_pool,
            self.allocator,
            self.tree_cache,
            self.vocab_size,
            self.device,
        )
        batch.prepare_for_extend()
        return batch

    def mix(self, batch: ScheduleBatch, running: ScheduleBatch) -> bool:
        """Append the running decode batch to the prepared prefill `batch` (now MIXED);
        True when it did, and then the mixed batch is the running batch from the next step
        on. False when the running batch's next KV slots do not fit after the prefill's
        allocation: the next decode step makes room (and may retract).

        The running batch was filtered this step (get_next_batch_to_run); under overlap it
        may still hold requests that finished in the step whose results are pending, as a
        decode step would, and result processing frees their surplus slot the same way.
        """
        if not running.check_decode_mem():
            return False
        running.prepare_for_decode()
        batch.mix_with_running(running)
        logger.debug(
            "Mixed batch. #prefill-seq: %d, #decode-seq: %d",
            batch.decode_start,
            len(running.reqs),
        )
        return True
