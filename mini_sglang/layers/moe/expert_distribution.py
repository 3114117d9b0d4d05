"""ExpertDistributionRecorder: which experts each MoE layer routes its tokens to, for SGLang's
/start_expert_distribution_record, /stop_expert_distribution_record and
/dump_expert_distribution_record, in SGLang's recorder modes (`--expert-distribution-recorder-
mode`): "stat" (`stat_approx` is the same here: SGLang's differs only under DeepEP) counts per
pass into a buffer; "per_pass" and "per_token" keep a detail record per forward pass.

Off unless the server starts with a mode. Then every FusedMoE layer records its tokens' top-k
expert ids in its forward, CUDA graphs included (the writes are captured with the graphs);
dense layers record nothing. "stat" and "per_pass" add them into the layer's row of `counts`
[num_hidden_layers, num_experts] (int32, on the model's device); rows of a padded CUDA-graph
batch beyond the real tokens add nothing: `begin_forward` stores the real token count on the
device first. "per_token" writes them into `topk_ids` [num_hidden_layers, max_tokens, 8]
(-1 where nothing was written; SGLang's width, DeepSeek-V3's top-8).

Worked example: 2 layers, 4 experts, top-2, a prefill of 3 tokens whose layer-1 choices
are [[0, 1], [1, 2], [1, 3]]: counts[1] becomes [1, 3, 1, 1] and counts[0] holds layer 0's,
each row summing to 3 tokens x 2 = 6; per_token's topk_ids[1, :3, :2] holds those choices.

"stat": while recording, `end_forward` copies `counts` into the next slot of the pass buffer
and zeroes it, all in stream order (no host sync): slot i holds forward pass i's counts. The
buffer (--expert-distribution-recorder-buffer-size, default 1000) is circular: past that
many passes the oldest are overwritten, and a dump returns all of its slots (zeros where no
pass landed yet), as SGLang's does; -1 keeps every pass since the start.

"per_pass" / "per_token": while recording, `end_forward` appends the pass's record, copied to
the host (a sync per pass, as in SGLang): forward_pass_id (passes since start-up), rank,
gatherer_key "primary", and "global_physical_count" (the pass's counts) or the pass's
input_ids, positions, extend_seq_lens, forward_mode (SGLang's ForwardMode value),
"topk_ids_of_layer" [layers, tokens, 8] and misc_objects [] (DeepEP's, none here).

- start: reset (counts, buffer, records) and record; a start while recording warns and
  restarts.
- stop: stop recording (kept until a dump or a start); a stop while idle warns.
- dump ("stat"): TP rank 0 writes torch.save({"rank": 0, "logical_count": [passes, layers,
  experts] int32 on the CPU, "average_utilization_rate_over_window": None}) to
  $SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR/expert_distribution_recorder_{time.time()}.pt
  (SGLang's name and keys), then resets; recording goes on if it was on.
- dump (detail modes): every rank writes {"records": [...], "last_physical_to_logical_map":
  [layers, experts] (the identity)} to expert_distribution_recorder_{time.time()}_{rank}.pt,
  as SGLang's ranks do.

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
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from mini_sglang.environ import envs
from mini_sglang.layers.moe.layer import FusedMoE

if TYPE_CHECKING:
    from mini_sglang.model_executor.forward_batch_info import ForwardBatch

logger = logging.getLogger("mini_sglang")

_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")
MODES = ("stat", "stat_approx", "per_pass", "per_token")
DETAIL_MODES = ("per_pass", "per_token")
TOPK_COLUMNS = 8  # per_token's width: SGLang's _DetailSinglePassGatherer._TOP_K_NUM


class ExpertDistributionRecorder:
    """The counts of one rank's model (see the module). Build it with `attach`."""

    def __init__(
        self,
        num_layers: int,
        num_experts: int,
        buffer_size: int,
        device,
        mode: str = "stat",
        rank: int = 0,
        max_tokens: int = 0,
        top_k: int = TOPK_COLUMNS,
    ) -> None:
        """max_tokens: the most tokens a forward pass records with "per_token" (rows of
        topk_ids; a larger pass records its first max_tokens and warns)."""
        assert buffer_size == -1 or buffer_size > 0, buffer_size
        assert mode in MODES, mode
        self.mode = mode
        self.rank = rank
        self.counts = torch.zeros(num_layers, num_experts, dtype=torch.int32, device=device)
        self.topk_ids = None
        if mode == "per_token":
            width = max(TOPK_COLUMNS, top_k)
            self.topk_ids = torch.full(
                (num_layers, max_tokens, width), -1, dtype=torch.int32, device=device
            )
        self.records: list[dict] = []  # the detail modes' passes since the last reset
        self.forward_pass_id = 0  # passes since start-up, recorded or not
        self._pass_meta: dict | None = None
        # The real tokens of the running forward; rows past it are CUDA-graph padding.
        self.num_tokens = torch.zeros((), dtype=torch.int64, device=device)
        self.buffer_size = buffer_size
        rows = buffer_size if buffer_size > 0 else 128  # -1: doubled as it fills
        self.buffer = torch.zeros(rows, num_layers, num_experts, dtype=torch.int32, device=device)
        self.passes = 0  # forward passes recorded since the last reset
        self.recording = False

    @property
    def detail(self) -> bool:
        """Whether a dump writes per-pass records (one file per rank)."""
        return self.mode in DETAIL_MODES

    @classmethod
    def attach(
        cls, model: nn.Module, num_layers: int, buffer_size: int, device, **options: Any
    ) -> ExpertDistributionRecorder | None:
        """A recorder wired into every FusedMoE layer of `model` (before CUDA graphs are
        captured), or None if the model has none. options: the constructor's mode, rank and
        max_tokens."""
        layers = [(n, m) for n, m in model.named_modules() if isinstance(m, FusedMoE)]
        if not layers:
            return None
        first = layers[0][1]
        recorder = cls(
            num_layers, first.num_experts, buffer_size, device, top_k=first.top_k, **options
        )
        for name, module in layers:
            match = _LAYER_INDEX.search(name)
            assert match is not None, f"no layer index in the MoE module name {name!r}"
            module.record_experts = functools.partial(recorder.record, int(match.group(1)))
        return recorder

    # ---- the forward (stream-ordered device work only) ----------------------------------
    def record(self, layer: int, topk_ids: torch.Tensor) -> None:
        """Record layer `layer`'s choices topk_ids [tokens, k] (global expert ids): add the
        first `num_tokens` rows into counts[layer], or with "per_token" write them into
        topk_ids[layer] (padding rows too: a dump reads only the real ones)."""
        tokens, k = topk_ids.shape
        if self.topk_ids is not None:
            rows = min(tokens, self.topk_ids.shape[1])
            self.topk_ids[layer, :rows, :k].copy_(topk_ids[:rows])
            return
        real = torch.arange(tokens, device=topk_ids.device) < self.num_tokens
        ones = real.to(torch.int32)[:, None].expand(tokens, k).reshape(-1)
        self.counts[layer].index_add_(0, topk_ids.reshape(-1), ones)  # int32 ids index

    def begin_forward(self, fb: ForwardBatch) -> None:
        """Before the model runs `fb` (eagerly or as a graph replay)."""
        self.num_tokens.fill_(len(fb.input_ids))
        if self.topk_ids is not None and self.recording:
            self.topk_ids.fill_(-1)
            self._pass_meta = dict(
                input_ids=fb.input_ids.cpu().tolist(),
                positions=fb.positions.cpu().tolist(),
                extend_seq_lens=fb.extend_seq_lens_cpu,
                forward_mode=int(fb.forward_mode),
            )

    def end_forward(self) -> None:
        pass_id = self.forward_pass_id
        self.forward_pass_id += 1
        if not self.recording:
            return
        if self.detail:
            self.records.append(self._pass_record(pass_id))
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

    def _pass_record(self, pass_id: int) -> dict:
        """The detail modes' record of the pass that just ran (copied to the host)."""
        record = dict(forward_pass_id=pass_id, rank=self.rank, gatherer_key="primary")
        if self.topk_ids is None:  # per_pass
            record["global_physical_count"] = self.counts.cpu().clone()
            self.counts.zero_()
            return record
        meta = self._pass_meta
        assert meta is not None, "end_forward without begin_forward"
        self._pass_meta = None
        tokens = len(meta["input_ids"])
        if tokens > self.topk_ids.shape[1]:
            logger.warning(
                "expert distribution per_token: a pass of %d tokens records its first %d",
                tokens, self.topk_ids.shape[1],
            )  # fmt: skip
        return dict(
            record, **meta, topk_ids_of_layer=self.topk_ids[:, :tokens].cpu().clone(),
            misc_objects=[],
        )  # fmt: skip

    # ---- control --------------------------------------------------------------------
    def reset(self) -> None:
        self.counts.zero_()
        self.buffer.zero_()
        self.passes = 0
        self.records.clear()

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
        """Write the record (if `write`: TP rank 0, or every rank in the detail modes) and
        reset; the file's path, or None."""
        path = None
        if write:
            folder = envs.SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR.get()
            os.makedirs(folder, exist_ok=True)
            if self.detail:
                name = f"expert_distribution_recorder_{time.time()}_{self.rank}.pt"
                layers, experts = self.counts.shape
                data = {
                    "records": self.records,
                    "last_physical_to_logical_map": torch.arange(experts).repeat(layers, 1),
                }
            else:
                name = f"expert_distribution_recorder_{time.time()}.pt"
                data = {
                    "rank": 0,
                    "logical_count": self.logical_count(),
                    "average_utilization_rate_over_window": None,
                }
            path = os.path.join(folder, name)
            logger.info("Write expert distribution to %s", path)
            torch.save(data, path)
        self.reset()
        return path
