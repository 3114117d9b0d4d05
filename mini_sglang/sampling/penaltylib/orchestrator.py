"""PenalizerOrchestrator: batched frequency / presence / repetition penalties and
min_new_tokens, kept as [B, V] device tensors that follow the batch (filter / merge).

Contract:
- `from_reqs` returns None when no request in the batch uses any penalty, so the common
  path costs nothing.
- `apply(logits)` returns penalised logits (a new tensor) for the current step.
- `cumulate(next_token_ids)` records the tokens just sampled, one per row.
SGLang's semantics: frequency_penalty subtracts count * penalty, presence_penalty subtracts
penalty once a token appeared in the output; repetition_penalty divides positive logits and
multiplies negative ones for every token seen in the prompt or output; min_new_tokens masks
the stop tokens (EOS, even with ignore_eos, and stop_token_ids) until that many tokens
were generated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from mini_sglang.utils.device import to_device

if TYPE_CHECKING:
    from mini_sglang.managers.schedule_batch import Req


@dataclass
class PenalizerOrchestrator:
    vocab_size: int
    device: str | torch.device
    frequency: torch.Tensor  # [B, 1]
    presence: torch.Tensor  # [B, 1]
    repetition: torch.Tensor  # [B, 1]
    output_counts: torch.Tensor  # [B, V] float32: times each token was generated
    seen: torch.Tensor  # [B, V] bool: token in prompt or output
    min_new_tokens: torch.Tensor  # [B] int64
    generated: torch.Tensor  # [B] int64
    stop_mask: torch.Tensor  # [B, V] bool: tokens banned until min_new_tokens is reached

    @classmethod
    def from_reqs(cls, reqs: list[Req], vocab_size: int, device) -> PenalizerOrchestrator | None:
        sps = [r.sampling_params for r in reqs]
        if not any(
            sp.frequency_penalty
            or sp.presence_penalty
            or sp.repetition_penalty != 1.0
            or sp.min_new_tokens > 0
            for sp in sps
        ):
            return None
        bs = len(reqs)
        seen = torch.zeros(bs, vocab_size, dtype=torch.bool)
        counts = torch.zeros(bs, vocab_size, dtype=torch.float32)
        stop_mask = torch.zeros(bs, vocab_size, dtype=torch.bool)
        for i, r in enumerate(reqs):
            ids = torch.tensor(r.origin_input_ids_unpadded + r.output_ids, dtype=torch.int64)
            ids = ids[(ids >= 0) & (ids < vocab_size)]
            seen[i, ids] = True
            if r.output_ids:
                out = torch.tensor(r.output_ids, dtype=torch.int64)
                counts[i].index_add_(0, out, torch.ones(len(out)))
            if r.sampling_params.min_new_tokens > 0:
                # EOS is masked even with ignore_eos (SGLang 0.5.4's MinNewTokens does too).
                stops = set(r.sampling_params.stop_token_ids or ()) | set(r.eos_token_ids)
                for t in stops:
                    if 0 <= t < vocab_size:
                        stop_mask[i, t] = True

        # Through pinned memory (to_device): a pageable copy would stall the overlap loop.
        def col(values: list[float]) -> torch.Tensor:
            return to_device(torch.tensor(values, dtype=torch.float32).view(-1, 1), device)

        def ints(values: list[int]) -> torch.Tensor:
            return to_device(torch.tensor(values, dtype=torch.int64), device)

        return cls(
            vocab_size=vocab_size,
            device=device,
            frequency=col([sp.frequency_penalty for sp in sps]),
            presence=col([sp.presence_penalty for sp in sps]),
            repetition=col([sp.repetition_penalty for sp in sps]),
            output_counts=to_device(counts, device),
            seen=to_device(seen, device),
            min_new_tokens=ints([sp.min_new_tokens for sp in sps]),
            generated=ints([len(r.output_ids) for r in reqs]),
            stop_mask=to_device(stop_mask, device),
        )

    @classmethod
    def neutral(cls, rows: int, vocab_size: int, device) -> PenalizerOrchestrator:
        """`rows` rows that change nothing (no penalty, no min_new_tokens).

        Used to pad the side of a merge that tracks no penalties: rebuilding from the
        requests instead would lose tokens sampled in a step whose results the overlap
        scheduler has not processed yet (their counts live only in these tensors).
        """
        zeros = torch.zeros(rows, 1, dtype=torch.float32, device=device)
        return cls(
            vocab_size=vocab_size,
            device=device,
            frequency=zeros,
            presence=zeros.clone(),
            repetition=torch.ones_like(zeros),
            output_counts=torch.zeros(rows, vocab_size, dtype=torch.float32, device=device),
            seen=torch.zeros(rows, vocab_size, dtype=torch.bool, device=device),
            min_new_tokens=torch.zeros(rows, dtype=torch.int64, device=device),
            generated=torch.zeros(rows, dtype=torch.int64, device=device),
            stop_mask=torch.zeros(rows, vocab_size, dtype=torch.bool, device=device),
        )

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        logits = logits - self.frequency * self.output_counts
        logits = logits - self.presence * (self.output_counts > 0)
        rep = torch.where(logits > 0, logits / self.repetition, logits * self.repetition)
        logits = torch.where(self.seen, rep, logits)
        banned = self.stop_mask & (self.generated < self.min_new_tokens)[:, None]
        return logits.masked_fill(banned, float("-inf"))

    def cumulate(self, next_token_ids: torch.Tensor) -> None:
        rows = torch.arange(len(next_token_ids), device=next_token_ids.device)
        self.output_counts[rows, next_token_ids] += 1
        self.seen[rows, next_token_ids] = True
        self.generated += 1

    def filter(self, keep: torch.Tensor) -> PenalizerOrchestrator | None:
        if len(keep) == 0:
            return None
        for name in _FIELDS:
            setattr(self, name, getattr(self, name)[keep])
        return self

    def concat(self, other: PenalizerOrchestrator) -> PenalizerOrchestrator:
        """Append other's rows after ours (both sides must track penalties)."""
        for name in _FIELDS:
            setattr(self, name, torch.cat([getattr(self, name), getattr(other, name)]))
        return self


_FIELDS = (
    "frequency",
    "presence",
    "repetition",
    "output_counts",
    "seen",
    "min_new_tokens",
    "generated",
    "stop_mask",
)
