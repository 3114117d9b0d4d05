"""utils/gc_utils: freeze_gc moves every live object out of the collected generations and
logs SGLang's line; configure_gc_warning logs each collection slower than its threshold;
--gc-warning-threshold-secs reaches ServerArgs."""

from __future__ import annotations

import argparse
import gc
import logging
import re

import pytest

from mini_sglang.server_args import ServerArgs
from mini_sglang.utils.gc_utils import configure_gc_warning, freeze_gc


@pytest.fixture
def restore_gc():
    callbacks = list(gc.callbacks)
    yield
    gc.unfreeze()
    gc.callbacks[:] = callbacks


def test_freeze_gc_moves_live_objects_to_the_permanent_generation(caplog, restore_gc):
    kept = [[i] for i in range(1000)]  # tracked objects alive across the freeze
    caplog.set_level(logging.INFO, logger="mini_sglang")
    freeze_gc("Scheduler")
    assert gc.get_freeze_count() >= len(kept)
    assert not any(obj is kept for obj in gc.get_objects())
    line = caplog.records[-1].getMessage()
    m = re.fullmatch(
        r"Freezing GC in Scheduler process\. gen0: (\d+)->(\d+), gen1: (\d+)->(\d+), "
        r"gen2: (\d+)->(\d+)",
        line,
    )
    assert m, line
    before, after = sum(map(int, m.groups()[::2])), sum(map(int, m.groups()[1::2]))
    assert before >= len(kept) > after, line


def test_gc_warning_logs_slow_collections_only(caplog, restore_gc):
    caplog.set_level(logging.WARNING, logger="mini_sglang")
    configure_gc_warning(3600.0)
    gc.collect()
    assert not [r for r in caplog.records if "GARBAGE" in r.getMessage()]
    configure_gc_warning(1e-12)
    gc.collect()
    messages = [r.getMessage() for r in caplog.records if "GARBAGE" in r.getMessage()]
    assert messages, "a full collection took no measurable time?"
    assert messages[-1].startswith("LONG GARBAGE COLLECTION DETECTED | Generation 2 | Duration: ")
    assert "Consider calling the freeze_gc API" in messages[-1]


def test_gc_warning_threshold_flag():
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    args = parser.parse_args(["--model-path", "m", "--gc-warning-threshold-secs", "0.25"])
    assert args.gc_warning_threshold_secs == 0.25
    assert ServerArgs.gc_warning_threshold_secs == 0.0
