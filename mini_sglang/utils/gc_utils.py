"""Python garbage-collector controls SGLang exposes: /freeze_gc and
--gc-warning-threshold-secs.

A full collection walks every tracked object, and a serving process holds many long-lived
ones (modules, tensors' Python wrappers, tokenizer tables), so gen-2 collections pause the
process for milliseconds at unpredictable steps. `freeze_gc` moves every object alive now
into the permanent generation, which collections skip; a server calls it (POST /freeze_gc)
after a few warm-up requests. `configure_gc_warning` logs each collection slower than a
threshold, to find out whether such pauses happen at all.
"""

from __future__ import annotations

import gc
import logging
import time

logger = logging.getLogger("mini_sglang")


def gc_object_counts() -> tuple[int, int, int]:
    """Objects tracked in generations 0, 1 and 2 (not counting frozen ones)."""
    return len(gc.get_objects(0)), len(gc.get_objects(1)), len(gc.get_objects(2))


def freeze_gc(context: str) -> None:
    """gc.freeze() in this process, logged as SGLang logs it: "Freezing GC in Scheduler
    process. gen0: 812->0, gen1: 1204->0, gen2: 301977->0"."""
    g0, g1, g2 = gc_object_counts()
    gc.freeze()
    a0, a1, a2 = gc_object_counts()
    logger.info(
        "Freezing GC in %s process. gen0: %d->%d, gen1: %d->%d, gen2: %d->%d",
        context, g0, a0, g1, a1, g2, a2,
    )  # fmt: skip


def configure_gc_warning(threshold_secs: float) -> None:
    """Warn about every collection in this process that takes longer than threshold_secs."""
    started: dict[object, float] = {}

    def on_gc(phase: str, info: dict) -> None:
        gen = info.get("generation", "?")
        if phase == "start":
            started[gen] = time.perf_counter()
            return
        duration = time.perf_counter() - started.pop(gen, time.perf_counter())
        if duration > threshold_secs:
            g0, g1, g2 = gc_object_counts()
            logger.warning(
                "LONG GARBAGE COLLECTION DETECTED | Generation %s | Duration: %.4fs | "
                "# Objects: gen0=%d, gen1=%d, gen2=%d | This may cause latency jitter. "
                "Consider calling the freeze_gc API after sending a few warmup requests.",
                gen, duration, g0, g1, g2,
            )  # fmt: skip

    gc.callbacks.append(on_gc)
