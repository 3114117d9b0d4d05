"""ExpertDistributionRecorder: how many tokens each MoE layer routes to each expert, per
forward pass, for SGLang's /start_expert_distribution_record, /stop_expert_distribution_record
and /dump_expert_distribution_record (its "stat" recorder mode).

Off unless the server starts with `--expert-distribution-recorder-mode stat` (`stat_approx`
is the same here: SGLang's differs only under DeepEP). Then every FusedMoE layer adds its
tokens' top-k expert ids into its row of `counts` [num_hidden_layers, num_experts] (int32,
on the model's device) in its forward, CUDA graphs included (the adds are captured with
the graphs); dense layers' rows stay zero. Rows of a padded CUDA-graph batch beyond the
real tokens add nothing: `begin_forward` stores the real token count on the device first.

Worked example: 2 layers, 4 experts, top-2, a prefill of 3 tokens whose layer-1 choices
are [[0, 1], [1, 2], [1, 3]]: counts[1] becomes [1, 3, 1, 1] and counts[0] holds layer 0's,
each row summing to 3 tokens x 2 = 6.

While recording, `end_forward` copies `counts` into the next slot of the pass buffer and
zeroes it, all in stream order (no host sync): slot i holds forward pass i's counts. The
buffer (--expert-distribution-recorder-buffer-size, default 1000) is circular: past that
many passes the oldest are overwritten, and a dump returns all of its slots (zeros where no
pass landed yet), as SGLang's does; -1 keeps every pass since the start.

- start: reset (counts, buffer) and record; a start while recording warns and restarts.
- stop: stop recording (kept until a dump or a start); a stop while idle warns.
- dump: TP rank 0 writes torch.save({"rank": 0, "logical_count": [passes, layers, experts]
  int32 on the CPU, "average_utilization_rate_over_window": None}) to
  $SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR/expert_distribution_recorder_{time.time()}.pt
  (SGLang's name and keys), then resets; recording goes on if it was on.

Every TP rank routes every token (the router is replicated), so the ranks' counts are
equal and rank 0's are the whole picture: each token's k choices count once per pass.
(SGLang all-reduces the ranks' counts, which multiplies them by the TP size unless attention
is data-parallel, which mini-sglang does not have.) Redundant experts do not exist here, so
SGLang's physical and logical expert ids are the same ids.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import time

import torch
from torch import nn

from mini_sglang.environ import envs
from mini_sglang.layers.moe.layer import FusedMoE

logger = logging.getLogger("mini_sglang")

_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")


class ExpertDistributionRecorder:
    """The counts of one rank's model (see the module). Build it with `attach`."""

    def __init__(self, num_layers: int, num_experts: int, buffer_size: int, device) -> None:
        assert buffer_size == -1 or buffer_size > 0, buffer_size
        self.counts = torch.zeros(num_layers, num_experts, dtype=torch.int32, device=device)
        # The real tokens of the running forward; rows past it are CUDA-graph padding.
        self.num_tokens = torch.zeros((), dtype=torch.int64, device=device)
        self.buffer_size = buffer_size
        rows = buffer_size if buffer_size > 0 else 128  # -1: doubled as it fills
        self.buffer = torch.zeros(rows, num_layers, num_experts, dtype=torch.int32, device=device)
        self.passes = 0  # forward passes recorded since the last reset
        self.recording = False

    @classmethod
    def attach(
        cls, model: nn.Module, num_layers: int, buffer_size: int, device
    ) -> ExpertDistributionRecorder | None:
        """A recorder wired into every FusedMoE layer of `model` (before CUDA graphs are
        captured), or None if the model has none."""
        layers = [(n, m) for n, m in model.named_modules() if isinstance(m, FusedMoE)]
        if not layers:
            return None
        recorder = cls(num_layers, layers[0][1].num_experts, buffer_size, device)
        for name, module in layers:
            match = _LAYER_INDEX.search(name)
            assert match is not None, f"no layer index in the MoE module name {name!r}"
            module.record_experts = functools.partial(recorder.record, int(match.group(1)))
        return recorder

    # ---- the forward (stream-ordered device work only) ----------------------------------
    def record(self, layer: int, topk_ids: torch.Tensor) -> None:
        """Add layer `layer`'s choices topk_ids [tokens, k] (global expert ids) of the
        first `num_tokens` rows into counts[layer]."""
        tokens, k = topk_ids.shape
        real = torch.arange(tokens, device=topk_ids.device) < self.num_tokens
        ones = real.to(torch.int32)[:, None].expand(tokens, k).reshape(-1)
        self.counts[layer].index_add_(0, topk_ids.reshape(-1), ones)  # int32 ids index

    def begin_forward(self, num_tokens: int) -> None:
        self.num_tokens.fill_(num_tokens)

    def end_forward(self) -> None:
        if not self.recording:
            return
        if self.buffer_size > 0:
            slot = self.passes % self.buffer_size
        else:
            slot = self.passes
            if slot == len(self.buffer):
                self.buffer = torch.cat([self.buffer, torch.zeros_like(self.buffer)])
        self.buffer[slot].copy_(self.counts)
        self.counts.zero_()
        self.passes += 1

    # ---- control --------------------------------------------------------------------
    def reset(self) -> None:
        self.counts.zero_()
        self.buffer.zero_()
        self.passes = 0

    def start(self) -> None:
        if self.recording:
            logger.warning(
                "The server is already recording expert ids. Did you forget to dump the "
                "expert ids recorded so far by sending requests to the "
                "`/stop_expert_distribution_record` and `/dump_expert_distribution_record` "
                "endpoints?"
            )
        self.reset()
        self.recording = True

    def stop(self) -> None:
        if not self.recording:
            logger.warning(
                "The server has not been recording expert ids. Did you forget to start "
                "recording by sending a request to the `/start_expert_distribution_record` "
                "endpoint?"
            )
        self.recording = False

    def logical_count(self) -> torch.Tensor:
        """[passes, layers, experts] int32 on the CPU: every slot of a circular buffer, or
        the passes recorded so far with -1."""
        rows = self.buffer if self.buffer_size > 0 else self.buffer[: self.passes]
        return rows.cpu()

    def dump(self, write: bool) -> str | None:
        """Write the record (if `write`: TP rank 0) and reset; the file's path, or None."""
        path = None
        if write:
            folder = envs.SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR.get()
            os.makedirs(folder, exist_ok=True)
            path = os.path.join(folder, f"expert_distribution_recorder_{time.time()}.pt")
            data = {
                "rank": 0,
                "logical_count": self.logical_count(),
                "average_utilization_rate_over_window": None,
            }
            logger.info("Write expert distribution to %s", path)
            torch.save(data, path)
        self.reset()
        return path
