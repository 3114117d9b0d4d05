"""CustomLogitBatch: which rows of a batch run which custom logit processor, and running them.

Rows that sent the same processor string share one processor instance and one call per
step (SGLang merges them the same way); each row brings its request's custom_params (with
`"__req__"`, the scheduler's Req, so stateful processors can read the request's tokens).
The component follows its batch: `filter` when requests leave, `concat` when batches merge;
a batch without processor rows has none (None), so ordinary batches pay nothing.

Worked example: rows [A: P, B: none, C: Q, D: P] give groups {P: rows [0, 3], Q: rows [2]}
and params [pA, None, pC, pD]. filter([1, 2, 3]) keeps {P: [2], Q: [1]}; concatenated after a
batch of 2 rows without processors, {P: [4], Q: [3]}.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from mini_sglang.sampling.custom_logit_processor import CustomLogitProcessor

if TYPE_CHECKING:
    from mini_sglang.managers.req import Req

logger = logging.getLogger("mini_sglang")


@dataclass
class ProcessorFailure:
    """A row whose processor raised this step: its request is to finish with `message`."""

    row: int
    message: str


@dataclass
class CustomLogitBatch:
    """groups: processor string -> (instance, ascending row indices); params: one entry per
    row of the batch (the request's custom_params with "__req__", or None)."""

    groups: dict[str, tuple[CustomLogitProcessor, list[int]]]
    params: list[dict[str, Any] | None]

    @classmethod
    def from_reqs(cls, reqs: list[Req]) -> CustomLogitBatch | None:
        """None when no request carries a processor. Each request's string was loaded when
        it arrived (the scheduler refuses one that does not load), so this cannot fail."""
        rows: dict[str, list[int]] = {}
        for i, r in enumerate(reqs):
            if r.custom_logit_processor:
                rows.setdefault(r.custom_logit_processor, []).append(i)
        if not rows:
            return None
        groups = {s: (CustomLogitProcessor.from_str(s), idx) for s, idx in rows.items()}
        return cls(groups, [r.custom_params for r in reqs])

    def __len__(self) -> int:
        return len(self.params)

    def filter(self, keep: list[int]) -> CustomLogitBatch | None:
        """The rows `keep` (ascending old row indices), renumbered; None if none has a
        processor left."""
        new_row = {old: new for new, old in enumerate(keep)}
        groups = {}
        for key, (proc, rows) in self.groups.items():
            kept = sorted(new_row[r] for r in rows if r in new_row)
            if kept:
                groups[key] = (proc, kept)
        if not groups:
            return None
        return CustomLogitBatch(groups, [self.params[i] for i in keep])

    @staticmethod
    def concat(
        first: CustomLogitBatch | None,
        second: CustomLogitBatch | None,
        first_len: int,
        second_len: int,
    ) -> CustomLogitBatch | None:
        """`second`'s rows after `first`'s (either may be None: rows without processors).
        A processor string in both keeps `first`'s instance."""
        if first is None and second is None:
            return None
        first = first or CustomLogitBatch({}, [None] * first_len)
        second = second or CustomLogitBatch({}, [None] * second_len)
        assert len(first) == first_len and len(second) == second_len
        groups = {key: (proc, list(rows)) for key, (proc, rows) in first.groups.items()}
        for key, (proc, rows) in second.groups.items():
            shifted = [r + first_len for r in rows]
            if key in groups:
                groups[key] = (groups[key][0], groups[key][1] + shifted)
            else:
                groups[key] = (proc, shifted)
        return CustomLogitBatch(groups, first.params + second.params)

    def apply(self, logits: torch.Tensor) -> tuple[torch.Tensor, list[ProcessorFailure]]:
        """Run every processor on its rows of `logits` ([B, V], one row per request).

        Returns new logits (the input is not modified) and the failures: a processor that
        raises, or returns something that does not fit its rows, leaves its rows' logits as
        they were and reports each of its rows; the other rows are unaffected.
        """
        assert logits.shape[0] == len(self.params), (logits.shape, len(self.params))
        logits = logits.clone()
        failures: list[ProcessorFailure] = []
        for proc, rows in self.groups.values():
            index = torch.tensor(rows, dtype=torch.int64, device=logits.device)
            try:
                logits[index] = proc(logits[index], [self.params[i] for i in rows])
            except Exception as e:  # client code: any error stays with its requests
                name = type(proc).__name__
                logger.exception("Custom logit processor %s failed on %d row(s)", name, len(rows))
                message = f"Custom logit processor {name} failed: {type(e).__name__}: {e}"
                failures.extend(ProcessorFailure(r, message) for r in rows)
        return logits, failures
