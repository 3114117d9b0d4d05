"""SamplingBatchInfo: the per-row sampling parameters of a batch, as device tensors.

Built from the requests when a batch forms; `filter` and `merge` follow the batch as requests
finish and new ones join, so the tensors are never rebuilt from scratch on the decode path.
Penalties live in a PenalizerOrchestrator that filters and merges the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from mini_sglang.sampling.penaltylib.orchestrator import PenalizerOrchestrator

if TYPE_CHECKING:
    from mini_sglang.managers.schedule_batch import Req

NO_SEED = -1


@dataclass
class SamplingBatchInfo:
    temperatures: torch.Tensor  # [B, 1] float32
    top_ps: torch.Tensor  # [B] float32
    top_ks: torch.Tensor  # [B] int64 (vocab-wide sentinel for "off")
    min_ps: torch.Tensor  # [B] float32
    seeds: torch.Tensor  # [B] int64, NO_SEED where the request gave none
    is_all_greedy: bool
    need_top_p: bool
    need_top_k: bool
    need_min_p: bool
    has_seeds: bool
    vocab_size: int
    device: str | torch.device
    logit_bias: torch.Tensor | None = None  # [B, V] additive, or None when unused
    penalizer: PenalizerOrchestrator | None = None

    @classmethod
    def from_reqs(cls, reqs: list[Req], vocab_size: int, device) -> SamplingBatchInfo:
        sps = [r.sampling_params for r in reqs]
        temps = torch.tensor([sp.temperature for sp in sps], dtype=torch.float32).view(-1, 1)
        top_ps = torch.tensor([sp.top_p for sp in sps], dtype=torch.float32)
        top_ks = torch.tensor([min(sp.top_k, vocab_size) for sp in sps], dtype=torch.int64)
        min_ps = torch.tensor([sp.min_p for sp in sps], dtype=torch.float32)
        seeds = torch.tensor([r.sampling_seed for r in reqs], dtype=torch.int64)
        logit_bias = None
        if any(sp.logit_bias for sp in sps):
            logit_bias = torch.zeros(len(reqs), vocab_size, dtype=torch.float32)
            for i, sp in enumerate(sps):
                for tok, bias in (sp.logit_bias or {}).items():
                    logit_bias[i, int(tok)] = float(bias)
            logit_bias = logit_bias.to(device)
        info = cls(
            temperatures=temps.to(device),
            top_ps=top_ps.to(device),
            top_ks=top_ks.to(device),
            min_ps=min_ps.to(device),
            seeds=seeds.to(device),
            is_all_greedy=all(sp.top_k <= 1 for sp in sps),
            need_top_p=any(sp.top_p < 1.0 for sp in sps),
            need_top_k=any(1 < sp.top_k < vocab_size for sp in sps),
            need_min_p=any(sp.min_p > 0 for sp in sps),
            has_seeds=any(r.sampling_seed != NO_SEED for r in reqs),
            vocab_size=vocab_size,
            device=device,
            logit_bias=logit_bias,
        )
        info.penalizer = PenalizerOrchestrator.from_reqs(reqs, vocab_size, device)
        return info

    def _flags_from_tensors(self) -> None:
        self.is_all_greedy = bool((self.top_ks <= 1).all())
        self.need_top_p = bool((self.top_ps < 1.0).any())
        self.need_top_k = bool(((self.top_ks > 1) & (self.top_ks < self.vocab_size)).any())
        self.need_min_p = bool((self.min_ps > 0).any())
        self.has_seeds = bool((self.seeds != NO_SEED).any())

    def filter(self, keep: torch.Tensor) -> None:
        """Keep rows `keep` (a 1-D index tensor), in that order."""
        keep_dev = keep.to(self.device)
        for name in ("temperatures", "top_ps", "top_ks", "min_ps", "seeds", "logit_bias"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value[keep_dev])
        if self.penalizer is not None:
            self.penalizer = self.penalizer.filter(keep_dev)
        self._flags_from_tensors()

    def merge(self, other: SamplingBatchInfo, merged_reqs: list[Req]) -> None:
        """Append `other`'s rows after ours; `merged_reqs` are both batches' requests in order."""
        for name in ("temperatures", "top_ps", "top_ks", "min_ps", "seeds"):
            setattr(self, name, torch.cat([getattr(self, name), getattr(other, name)]))
        if self.logit_bias is not None or other.logit_bias is not None:
            mine = (
                self.logit_bias
                if self.logit_bias is not None
                else self._zeros(len(self.top_ps) - len(other.top_ps))
            )
            theirs = (
                other.logit_bias if other.logit_bias is not None else self._zeros(len(other.top_ps))
            )
            self.logit_bias = torch.cat([mine, theirs])
        if self.penalizer is not None or other.penalizer is not None:
            # A side that tracks no penalties gets neutral rows (see PenalizerOrchestrator.
            # neutral for why the tensors are not rebuilt from the requests).
            n_self = len(merged_reqs) - len(other.top_ps)
            mine = self.penalizer or PenalizerOrchestrator.neutral(
                n_self, self.vocab_size, self.device
            )
            theirs = other.penalizer or PenalizerOrchestrator.neutral(
                len(other.top_ps), self.vocab_size, self.device
            )
            self.penalizer = mine.concat(theirs)
        self._flags_from_tensors()

    def _zeros(self, rows: int) -> torch.Tensor:
        return torch.zeros(rows, self.vocab_size, dtype=torch.float32, device=self.device)

    def apply_logits_bias(self, logits: torch.Tensor) -> torch.Tensor:
        """Penalties and logit_bias, applied to raw logits before temperature (as SGLang)."""
        if self.penalizer is not None:
            logits = self.penalizer.apply(logits)
        if self.logit_bias is not None:
            logits = logits + self.logit_bias
        return logits
