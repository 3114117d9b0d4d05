"""A tiny random LLaVA (CLIP tower + Llama, float32, CPU): mini-sglang against transformers.

Checked: prefill logits at every position within 1e-3 for prompts with 0, 1 and 2 images of
different sizes; 16 greedy tokens identical to transformers' generate for image requests
batched with a text-only one, as is, with chunked prefill splitting images' placeholder
runs across chunks, with page size 4, and with a KV pool small enough to retract; an
aborted image request frees everything.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from mini_sglang.managers.io_struct.control import AbortReq
from mini_sglang.managers.req import Req
from mini_sglang.multimodal.mm_inputs import MultimodalInputs
from mini_sglang.sampling.sampling_params import SamplingParams
from tests.conftest import (
    assert_memory_all_free,
    collect_outputs,
    make_req,
    make_scheduler,
    run_extend,
)
from tests.tiny_vlm import IMAGE_TOKEN, TOKENS_PER_IMAGE, make_image

MAX_NEW = 16
ATOL = 1e-3
# (prompt text, images as (width, height, seed))
CASES: list[tuple[str, list[tuple[int, int, int]]]] = [
    (f"Describe {IMAGE_TOKEN} briefly.", [(40, 30, 1)]),
    (f"{IMAGE_TOKEN}{IMAGE_TOKEN} Compare the two pictures.", [(64, 64, 2), (20, 48, 3)]),
    ("A text-only prompt between image ones", []),
    (f"Once more: {IMAGE_TOKEN} and then some words after the picture", [(33, 33, 4)]),
]


class Tiny:
    def __init__(self, path: str, hf_model: Any, processor: Any) -> None:
        self.path, self.hf, self.processor = path, hf_model, processor

    def inputs(self, case: tuple[str, list[tuple[int, int, int]]]) -> tuple[list[int], dict]:
        """(expanded prompt ids, processor output or None)."""
        text, sizes = case
        if not sizes:
            return self.processor.tokenizer.encode(text), None
        images = [make_image(*s) for s in sizes]
        out = self.processor.process_mm_data(images, text, None)
        return out["input_ids"], out

    @torch.no_grad()
    def logits(self, ids: list[int], mm: dict | None) -> torch.Tensor:
        kw = {}
        if mm is not None:
            kw["pixel_values"] = torch.cat([item.feature for item in mm["mm_items"]])
        return self.hf(input_ids=torch.tensor([ids]), **kw).logits[0].float()

    @torch.no_grad()
    def greedy(self, ids: list[int], mm: dict | None) -> list[int]:
        kw = {}
        if mm is not None:
            kw["pixel_values"] = torch.cat([item.feature for item in mm["mm_items"]])
        x = torch.tensor([ids])
        out = self.hf.generate(
            x, **kw, max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=None, pad_token_id=0
        )
        return out[0, len(ids) :].tolist()


@pytest.fixture(scope="module")
def tiny(tiny_llava: tuple[str, Any]) -> Tiny:
    from transformers import AutoConfig, AutoProcessor

    from mini_sglang.multimodal.processors import get_mm_processor

    path, hf = tiny_llava
    processor = get_mm_processor(
        AutoConfig.from_pretrained(path), None, AutoProcessor.from_pretrained(path)
    )
    return Tiny(path, hf, processor)


@pytest.fixture(scope="module")
def reference(tiny: Tiny) -> list[list[int]]:
    return [tiny.greedy(*tiny.inputs(case)) for case in CASES]


def _run(scheduler, tiny: Tiny, repeat: int = 1) -> list[list[int]]:
    """Every case `repeat` times, all added at once; the outputs of the last copy (all
    copies must agree)."""
    start = len(scheduler.test_outputs)
    for rep in range(repeat):
        for i, case in enumerate(CASES):
            ids, mm = tiny.inputs(case)
            scheduler.add_request(make_req(f"r{rep}_{i}", ids, MAX_NEW, True, mm_inputs=mm))
    scheduler.run_until_idle()
    results = collect_outputs(scheduler.test_outputs[start:])
    outs = [[results[f"r{rep}_{i}"].output_ids for i in range(len(CASES))] for rep in range(repeat)]
    assert all(o == outs[0] for o in outs)
    return outs[0]


def test_prefill_logits_match_hf(tiny: Tiny) -> None:
    """One EXTEND batch of the 0-, 1- and 2-image prompts; every position's logits."""
    scheduler = make_scheduler(tiny.path)
    model = scheduler.tp_worker.model_runner.model
    vocab = scheduler.model_config.vocab_size
    reqs, expanded = [], []
    for i, case in enumerate(CASES):
        ids, mm = tiny.inputs(case)
        mm_inputs = MultimodalInputs.from_dict(mm) if mm is not None else None
        padded = model.pad_input_ids(ids, mm_inputs) if mm_inputs is not None else ids
        if mm_inputs is not None:  # each image's run holds its own pad value
            pads = {item.pad_value for item in mm_inputs.mm_items}
            assert len(pads) == len(mm_inputs.mm_items)
            assert sum(t in pads for t in padded) == TOKENS_PER_IMAGE * len(pads)
        sp = SamplingParams(max_new_tokens=1, temperature=0.0)
        sp.normalize(None)
        req = Req(
            f"logits{i}",
            "",
            padded,
            sp,
            vocab_size=vocab,
            return_logprob=True,
            logprob_start_len=0,
            multimodal_inputs=mm_inputs,
            origin_input_ids_unpadded=ids,
        )
        req.init_next_round_input(None)
        reqs.append(req)
        expanded.append((ids, mm))
    out = run_extend(scheduler, reqs)
    offset = 0
    for i, (ids, mm) in enumerate(expanded):
        ref = tiny.logits(ids, mm)
        got = out.input_logits[offset : offset + len(ids)]
        offset += len(ids)
        assert (got - ref).abs().max().item() < ATOL, f"prompt {i}"
        assert (out.next_token_logits[i] - ref[-1]).abs().max().item() < ATOL
    # the images matter: the same prompt with the images' features zeroed differs
    ids, mm = expanded[0]
    assert len(ids) > TOKENS_PER_IMAGE
    assert (tiny.logits(ids, mm) - tiny.logits(ids, None)).abs().max().item() > 1e-2


@pytest.mark.parametrize(
    "variant, kw",
    [
        ("chunked", {"chunked_prefill_size": 12}),
        ("paged", {"page_size": 4, "chunked_prefill_size": 8}),
        ("retract", {"max_total_tokens": 128, "chunked_prefill_size": 16}),
    ],
)
def test_greedy_matches_hf(tiny: Tiny, reference: list[list[int]], variant: str, kw) -> None:
    """Image requests with a text-only one: 16 greedy tokens as transformers' (unchunked
    prefill is test_prefill_logits_match_hf's). Chunks of 12
    and 8 split the 16-token placeholder runs; the small pool forces retractions."""
    scheduler = make_scheduler(tiny.path, **kw)
    assert _run(scheduler, tiny, repeat=3 if variant == "retract" else 1) == reference
    assert_memory_all_free(scheduler)
    if variant == "retract":
        assert scheduler.stats.num_retracted_reqs > 0, "the tiny pool should force retraction"


def test_abort_of_an_image_request_frees_everything(tiny: Tiny) -> None:
    scheduler = make_scheduler(tiny.path, chunked_prefill_size=8)
    ids, mm = tiny.inputs(CASES[1])
    scheduler.add_request(make_req("gone", ids, MAX_NEW, True, mm_inputs=mm))
    scheduler.run_step()  # the first chunk runs; the image features are cached
    scheduler.process_input_requests([AbortReq(rid="gone")])
    scheduler.run_until_idle()
    reason = collect_outputs(scheduler.test_outputs)["gone"].finish_reason
    assert reason is not None and reason["type"] == "abort"
    assert_memory_all_free(scheduler)
