"""SamplingBatchInfo: the per-row sampling parameters of a batch, as device tensors.

Built from the requests when a batch forms; `filter` and `merge` follow the batch as requests
finish and new ones join, so the tensors are never rebuilt from scratch on the decode path.
Penalties live in a PenalizerOrchestrator and custom logit processors in a
CustomLogitBatch, which filter and merge the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from mini_sglang.constrained.bitmask import apply_token_bitmask
from mini_sglang.environ import envs
from mini_sglang.sampling.custom_logit_batch import CustomLogitBatch
from mini_sglang.sampling.penaltylib.orchestrator import PenalizerOrchestrator
from mini_sglang.utils.device import to_device

if TYPE_CHECKING:
    from mini_sglang.managers.schedule_batch import Req

NO_SEED = -1
# Test hook (tests/server/test_hostile_requests.py): preparing a batch that holds the
# request with this rid raises, as a bug in one request's preparation would.
_FAIL_PREPARE_RID = envs.MINI_SGLANG_TEST_FAIL_PREPARE_RID.get() or None


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
    # CPU copies of top_ps, top_ks, min_ps and seeds, kept in step with the device rows.
    host_rows: dict[str, torch.Tensor] = field(default_factory=dict)
    has_greedy_rows: bool = False  # some row has top_k <= 1 (argmax)
    # Packed allowed-token bitmask of this step's grammar rows (int32 [B, ceil(V / 32)]),
    # or None. Set by the scheduler before every forward, never filtered or merged.
    vocab_mask: torch.Tensor | None = None
    # The rows' custom logit processors (the sampler runs them after apply_logits_bias), or
    # None when no row has one.
    custom_logit: CustomLogitBatch | None = None

    @classmethod
    def from_reqs(cls, reqs: list[Req], vocab_size: int, device) -> SamplingBatchInfo:
        if _FAIL_PREPARE_RID and any(r.rid == _FAIL_PREPARE_RID for r in reqs):  # test hook
            raise RuntimeError(f"test hook: preparing request {_FAIL_PREPARE_RID} fails")
        sps = [r.sampling_params for r in reqs]
        temps = torch.tensor([sp.temperature for sp in sps], dtype=torch.float32).view(-1, 1)
        host = {
            "top_ps": torch.tensor([sp.top_p for sp in sps], dtype=torch.float32),
            "top_ks": torch.tensor([min(sp.top_k, vocab_size) for sp in sps], dtype=torch.int64),
            "min_ps": torch.tensor([sp.min_p for sp in sps], dtype=torch.float32),
            "seeds": torch.tensor([r.sampling_seed for r in reqs], dtype=torch.int64),
        }
        logit_bias = None
        if any(sp.logit_bias for sp in sps):
            logit_bias = torch.zeros(len(reqs), vocab_size, dtype=torch.float32)
            for i, sp in enumerate(sps):
                for tok, bias in (sp.logit_bias or {}).items():
                    logit_bias[i, int(tok)] = float(bias)
            logit_bias = to_device(logit_bias, device)
        info = cls(
            temperatures=to_device(temps, device),
            **{name: to_device(t, device) for name, t in host.items()},
            is_all_greedy=False,
            need_top_p=False,
            need_top_k=False,
            need_min_p=False,
            has_seeds=False,
            vocab_size=vocab_size,
            device=device,
            logit_bias=logit_bias,
            host_rows=host,
        )
        info._flags_from_host_rows()
        info.penalizer = PenalizerOrchestrator.from_reqs(reqs, vocab_size, device)
        info.custom_logit = CustomLogitBatch.from_reqs(reqs)
        return info

    def _flags_from_host_rows(self) -> None:
        # From the host copies: reading the device tensors here would synchronise with the
        # GPU on every filter/merge and stall overlap scheduling.
        top_ks, top_ps = self.host_rows["top_ks"], self.host_rows["top_ps"]
        self.has_greedy_rows = bool((top_ks <= 1).any())
        self.is_all_greedy = bool((top_ks <= 1).all())
        self.need_top_p = bool((top_ps < 1.0).any())
        self.need_top_k = bool(((top_ks > 1) & (top_ks < self.vocab_size)).any())
        self.need_min_p = bool((self.host_rows["min_ps"] > 0).any())
        self.has_seeds = bool((self.host_rows["seeds"] != NO_SEED).any())

    def filter(self, keep: torch.Tensor) -> None:
        """Keep rows `keep` (a 1-D int64 index tensor on the CPU), in that order."""
        keep_dev = to_device(keep, self.device)
        for name in ("temperatures", "top_ps", "top_ks", "min_ps", "seeds", "logit_bias"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value[keep_dev])
        self.host_rows = {name: t[keep] for name, t in self.host_rows.items()}
        if self.penalizer is not None:
            self.penalizer = self.penalizer.filter(keep_dev)
        if self.custom_logit is not None:
            self.custom_logit = self.custom_logit.filter(keep.tolist())
        self._flags_from_host_rows()

    def merge(self, other: SamplingBatchInfo, merged_reqs: list[Req]) -> None:
        """Append `other`'s rows after ours; `merged_reqs` are both batches' requests in order."""
        n_self = len(merged_reqs) - len(other.top_ps)
        self.custom_logit = CustomLogitBatch.concat(
            self.custom_logit, other.custom_logit, n_self, len(other.top_ps)
        )
        for name in ("temperatures", "top_ps", "top_ks", "min_ps", "seeds"):
            setattr(self, name, torch.cat([getattr(self, name), getattr(other, name)]))
        self.host_rows = {n: torch.cat([t, other.host_rows[n]]) for n, t in self.host_rows.items()}
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
        self._flags_from_host_rows()

    def _zeros(self, rows: int) -> torch.Tensor:
        return torch.zeros(rows, self.vocab_size, dtype=torch.float32, device=self.device)

    def apply_logits_bias(self, logits: torch.Tensor) -> torch.Tensor:
        """Penalties, the grammar mask, then logit_bias, applied to raw logits before
        temperature (SGLang's order)."""
        if self.penalizer is not None:
            logits = self.penalizer.apply(logits)
        if self.vocab_mask is not None:
            logits = apply_token_bitmask(logits, self.vocab_mask)
        if self.logit_bias is not None:
            logits = logits + self.logit_bias
        return logits
