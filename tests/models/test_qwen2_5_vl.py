"""Tiny random Qwen2.5-VL: mini-sglang against HF transformers in float32.

One model (windowed vision tower with a full-attention block, M-RoPE decoder) is saved with
`save_pretrained` beside the Qwen tokenizer, a chat template placing image tokens and the
Qwen2-VL image processor. Prompts with 0, 1 and 2 images of different sizes go through our
processor (multimodal/processors/qwen_vl.py) and the in-process Scheduler. Checked: the
prompt's M-RoPE positions against transformers' get_rope_index, every prefill logit within
1e-3, and 16 greedy tokens identical to transformers' generate with the image requests
batched beside a text-only one (decode positions carry the M-RoPE delta), also with a
prefill chunk boundary inside an image and with the images' KV reused from the radix cache.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from mini_sglang.multimodal.mm_inputs import MultimodalInputs
from tests.conftest import (
    assert_memory_all_free,
    collect_outputs,
    make_req,
    make_scheduler,
    run_extend,
)
from tests.tiny_qwen2_5_vl import MAX_NEW_TOKENS, Prompt, TinyVL

LOGITS_ATOL = 1e-3


@pytest.fixture(scope="module")
def tiny_vl(tiny_qwen2_5_vl: TinyVL) -> TinyVL:
    return tiny_qwen2_5_vl


@pytest.fixture(scope="module")
def scheduler(tiny_vl: TinyVL):
    return make_scheduler(tiny_vl.path)


def _mm_req(rid: str, prompt: Prompt, **kw: Any):
    extra = {}
    if prompt.processed.get("mm_items"):
        extra["mm_inputs"] = {k: v for k, v in prompt.processed.items() if k != "input_ids"}
    return make_req(rid, prompt.processed["input_ids"], MAX_NEW_TOKENS, True, **extra, **kw)


def _run(sched, prompts: list[Prompt], prefix: str) -> tuple[list[list[int]], list[int]]:
    """Each prompt's output ids and cached_tokens, all requests added at once."""
    start = len(sched.test_outputs)
    for i, p in enumerate(prompts):
        sched.add_request(_mm_req(f"{prefix}{i}", p))
    sched.run_until_idle()
    msgs = sched.test_outputs[start:]
    results = collect_outputs(msgs)
    cached = {rid: c for m in msgs for rid, c in zip(m.rids, m.cached_tokens)}
    rids = [f"{prefix}{i}" for i in range(len(prompts))]
    return [results[r].output_ids for r in rids], [cached[r] for r in rids]


# ---- processor ----------------------------------------------------------------------------
def test_processor_expands_images_and_matches_hf_rope_index(tiny_vl: TinyVL) -> None:
    hf = tiny_vl.hf
    merge = hf.config.vision_config.spatial_merge_size
    for prompt in tiny_vl.prompts[1:]:
        d = prompt.processed
        ids = torch.tensor([d["input_ids"]])
        grids = torch.cat([it.image_grid_thw for it in d["mm_items"]])
        assert grids.shape == (len(prompt.images), 3)
        for item, (h, w), grid in zip(
            d["mm_items"], [im.size[::-1] for im in prompt.images], grids
        ):
            # the processor keeps the size here (multiples of 28 within its pixel budget)
            assert grid.tolist() == [1, h // 14, w // 14]
            ((start, end),) = item.offsets
            assert end - start == h * w // (14 * 14 * merge**2)
            assert item.feature.shape[0] == h * w // (14 * 14)
        assert len({it.pad_value for it in d["mm_items"]}) == len(d["mm_items"])
        ref, delta = hf.model.get_rope_index(
            ids, (ids == hf.config.image_token_id).int(), image_grid_thw=grids
        )
        assert torch.equal(d["mrope_positions"], ref[:, 0])
        assert d["mrope_position_delta"].item() == delta.item() < 0


def test_loads_transformers_5_parameter_names(tiny_vl: TinyVL, scheduler) -> None:
    """transformers >= 5 names the modules model.language_model.* and model.visual.*
    (published checkpoints: model.* and visual.*): both load, every parameter filled. The
    tests below then run on weights loaded this way."""
    names = dict(tiny_vl.hf.named_parameters())
    assert any(n.startswith("model.language_model.") for n in names)
    model = scheduler.tp_worker.model_runner.model
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    model.load_weights(iter(names.items()))  # strict: raises if any parameter stays unfilled
    assert torch.equal(model.visual.merger.mlp[0].weight, names["model.visual.merger.mlp.0.weight"])


# ---- prefill logits -----------------------------------------------------------------------
def test_prefill_logits_match_hf(tiny_vl: TinyVL, scheduler) -> None:
    """Every position's logits of one EXTEND batch holding all prompts."""
    reqs = []
    for i, p in enumerate(tiny_vl.prompts):
        recv = _mm_req(f"logits{i}", p, return_logprob=True, logprob_start_len=0)
        req = scheduler._new_req(recv, list(recv.input_ids))
        req.init_next_round_input(None)
        reqs.append(req)
    assert isinstance(reqs[1].multimodal_inputs, MultimodalInputs)
    logits = run_extend(scheduler, reqs).input_logits
    offset = 0
    for i, p in enumerate(tiny_vl.prompts):
        n = len(p.processed["input_ids"])
        diff = (logits[offset : offset + n] - p.hf_logits).abs().max().item()
        offset += n
        assert diff <= LOGITS_ATOL, f"prompt {i} ({len(p.images)} images): max |diff| {diff}"
    assert_memory_all_free(scheduler)


# ---- greedy generation ---------------------------------------------------------------------
def test_greedy_batch_matches_hf_and_reuses_image_kv(tiny_vl: TinyVL, scheduler) -> None:
    """The image requests batched with the text-only one; then again, now with the prompts'
    KV (image rows included) in the radix cache."""
    expected = [p.hf_output for p in tiny_vl.prompts]
    outputs, cached = _run(scheduler, tiny_vl.prompts, "g")
    assert outputs == expected
    assert_memory_all_free(scheduler)
    outputs, cached = _run(scheduler, tiny_vl.prompts, "again")
    assert outputs == expected
    lens = [len(p.processed["input_ids"]) for p in tiny_vl.prompts]
    assert cached == [n - 1 for n in lens], (cached, lens)  # all but the last prompt token
    assert_memory_all_free(scheduler)


def test_chunk_boundary_inside_an_image_matches_hf(tiny_vl: TinyVL) -> None:
    """Chunked prefill of 8 tokens splits every image's tokens across chunks (the image
    features are computed once, their rows and M-RoPE columns taken per chunk), and a KV
    pool too small for the batch retracts running requests, whose re-prefill covers
    output tokens past the prompt (positions p + delta). (Chunks mixed with running
    decodes, whose rows sit at seq + delta in an extend batch, are checked on the GPU:
    tests/gpu/test_gpu_qwen2_5_vl.py.)"""
    for p in tiny_vl.prompts:
        for item in p.processed.get("mm_items") or []:
            ((start, end),) = item.offsets
            assert start // 8 != (end - 1) // 8, "the image should span chunks"
    # Each prompt twice: 8 requests, ~330 tokens of work for 110 KV slots.
    sched = make_scheduler(tiny_vl.path, chunked_prefill_size=8, max_total_tokens=110)
    outputs, _ = _run(sched, tiny_vl.prompts * 2, "c")
    assert outputs == [p.hf_output for p in tiny_vl.prompts] * 2
    assert sched.stats.num_retracted_reqs > 0, "the small pool should force retraction"
    assert_memory_all_free(sched)
