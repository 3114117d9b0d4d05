"""benchmarks/fp8_quality.py's teacher-forced decode (--decode-from): feeding a prompt's own
tokens through decode steps gives the logits one prefill gives at the same positions (float32
on CPU), at pages of 1 and 16, and leaves the KV pool as it found it."""

from __future__ import annotations

import pytest
import torch

from benchmarks import fp8_quality


@pytest.mark.parametrize("page_size", [1, 16])
def test_decode_steps_give_the_prefill_logits(tiny_llama_path, page_size):
    from tests.conftest import make_scheduler

    sched = make_scheduler(tiny_llama_path, page_size=page_size, disable_radix_cache=True)
    prompts = [list(range(100, 100 + n)) for n in (9, 40)]
    prefill = fp8_quality.position_logits(sched, prompts)
    decode = fp8_quality.decode_logits(sched, prompts, 5)
    for p, want, got in zip(prompts, prefill, decode):
        assert got.shape == (len(p) - 4, want.shape[1])
        torch.testing.assert_close(got, want[4:], rtol=1e-4, atol=1e-4)
    m = sched.stats.memory_accounting()
    assert m["free"] == m["capacity"] and m["free_req_slots"] == m["req_slots"], m
