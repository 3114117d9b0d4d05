"""Progress bars for the slow start-up steps (weight loading, GGUF conversion), in SGLang's
tqdm format. Shown by TP rank 0 only, so N ranks draw one bar."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")

# SGLang's weight_utils._BAR_FORMAT: one line per update, readable in a log file.
BAR_FORMAT = (
    "{desc}: {percentage:3.0f}% Completed | {n_fmt}/{total_fmt} "
    "[{elapsed}<{remaining}, {rate_fmt}]\n"
)


def _is_rank_zero() -> bool:
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == 0


def progress(items: Iterable[T], desc: str, total: int | None = None) -> Iterator[T]:
    """`items`, drawing a tqdm bar labelled `desc` on stderr while they are consumed."""
    from tqdm import tqdm

    if not hasattr(tqdm, "_lock"):
        # tqdm's default lock holds a multiprocessing semaphore; a worker ends by SIGKILL at
        # shutdown, so it would leak (resource_tracker warns). One thread draws the bars.
        tqdm.set_lock(threading.RLock())
    return iter(
        tqdm(
            items,
            desc=desc,
            total=total,
            disable=not _is_rank_zero(),
            bar_format=BAR_FORMAT,
            mininterval=1.0,  # each update is a log line: at most about one a second
        )
    )
