"""TpModelWorker: one TP rank's model execution for the scheduler: forward + sample
(forward_batch_generation) or forward + pool (forward_batch_embedding)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mini_sglang.config_slices import ModelRunnerConfig
from mini_sglang.layers.logits_processor import LogitsProcessorOutput
from mini_sglang.model_config import ModelConfig
from mini_sglang.model_executor.forward_batch_info import ModelWorkerBatch
from mini_sglang.model_executor.model_runner import ModelRunner
from mini_sglang.sampling.custom_logit_batch import ProcessorFailure


@dataclass
class GenerationBatchResult:
    logits_output: LogitsProcessorOutput
    next_token_ids: torch.Tensor  # [B] on device
    logprobs: torch.Tensor | None = None  # [B, V] when the batch asked for logprobs
    next_token_ids_host: torch.Tensor | None = None  # pinned copy, valid after copy_done
    copy_done: torch.cuda.Event | None = None
    # Rows whose custom logit processor raised (see CustomLogitBatch.apply).
    processor_failures: list[ProcessorFailure] = field(default_factory=list)

    def start_copy_to_host(self) -> None:
        """Begin the device->host copy of the sampled tokens without blocking."""
        ids = self.next_token_ids
        if ids.is_cuda:
            self.next_token_ids_host = _pinned_slot(ids.shape[0], ids.dtype)
            self.next_token_ids_host.copy_(ids, non_blocking=True)
            self.copy_done = torch.cuda.Event()
            self.copy_done.record()
        else:
            self.next_token_ids_host = ids

    def token_list(self) -> list[int]:
        """The sampled tokens on the host (waits for this step's copy only)."""
        if self.next_token_ids_host is None:
            self.start_copy_to_host()
        if self.copy_done is not None:
            self.copy_done.synchronize()
        return self.next_token_ids_host.tolist()


_PINNED_RING = 4  # >= steps in flight (2 with overlap) plus slack
_pinned: list[torch.Tensor] = []
_pinned_next = 0


def _pinned_slot(n: int, dtype: torch.dtype) -> torch.Tensor:
    """A pinned host buffer of n elements from a small ring, reused every few steps
    (allocating pinned memory per step costs more than the step's copy)."""
    global _pinned_next
    i = _pinned_next % _PINNED_RING
    _pinned_next += 1
    if len(_pinned) <= i:
        _pinned.append(torch.empty(0, dtype=dtype, pin_memory=True))
    buf = _pinned[i]
    if buf.numel() < n or buf.dtype != dtype:
        buf = torch.empty(max(n, 256), dtype=dtype, pin_memory=True)
        _pinned[i] = buf
    return buf[:n]


class ForwardTimer:
    """GPU-side timestamps around every forward + sample, for the "forward occupancy" measure
    (the share of wall time the GPU spends in the forward during steady decode).

    CUDA events are recorded on the stream the forward runs on, so a gap between one step's
    end and the next step's start is time the GPU sat idle waiting for the host. Off by
    default (bench_one_batch turns it on); it never synchronizes until :meth:`decode_occupancy`.
    """

    def __init__(self) -> None:
        self.spans: list[tuple[torch.cuda.Event, torch.cuda.Event, bool]] = []

    def begin(self) -> torch.cuda.Event:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def end(self, start: torch.cuda.Event, is_decode: bool) -> None:
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        self.spans.append((start, ev, is_decode))

    def decode_occupancy(self, skip: int = 2) -> float | None:
        """busy / wall over the last run of consecutive decode steps (after `skip` warm-up
        steps): sum(end_i - start_i) / (end_last - start_first). None if too few steps."""
        first = max((i + 1 for i, span in enumerate(self.spans) if not span[2]), default=0)
        run = [(start, end) for start, end, _ in self.spans[first:]][skip:]
        if len(run) < 2:
            return None
        run[-1][1].synchronize()
        busy = sum(s.elapsed_time(e) for s, e in run)
        return busy / run[0][0].elapsed_time(run[-1][1])


class TpModelWorker:
    def __init__(self, server_args, model_config: ModelConfig | None = None, gpu_id: int = 0):
        self.server_args = server_args
        self.model_config = model_config or ModelConfig.from_server_args(server_args)
        self.model_runner = ModelRunner(
            self.model_config, ModelRunnerConfig.from_server_args(server_args), gpu_id=gpu_id
        )
        self.device = self.model_runner.device
        self.max_total_num_tokens = self.model_runner.max_total_num_tokens
        self.forward_timer: ForwardTimer | None = None

    def get_memory_pool(self):
        r = self.model_runner
        return r.req_to_token_pool, r.token_to_kv_pool_allocator

    def forward_batch_embedding(self, batch: ModelWorkerBatch) -> torch.Tensor:
        """One prefill (EXTEND) batch through the model and its pooler: a float32 CPU tensor
        with one row per request, in batch order (see layers/pooler.py)."""
        fb = self.model_runner.make_forward_batch(batch)
        out = self.model_runner.forward(fb, get_embedding=True)
        return out.embeddings.float().cpu()

    def forward_batch_generation(self, batch: ModelWorkerBatch) -> GenerationBatchResult:
        fb = self.model_runner.make_forward_batch(batch)
        # After the batch's inputs are staged: host time spent preparing them counts as idle.
        timer = self.forward_timer
        started = timer.begin() if timer is not None else None
        logits_output = self.model_runner.forward(fb)
        sample = self.model_runner.sample(logits_output.next_token_logits, fb)
        if fb.sampling_info.penalizer is not None:
            fb.sampling_info.penalizer.cumulate(sample.next_token_ids)
        if timer is not None:
            timer.end(started, fb.forward_mode.is_decode())
        return GenerationBatchResult(
            logits_output,
            sample.next_token_ids,
            sample.logprobs,
            processor_failures=sample.processor_failures,
        )
