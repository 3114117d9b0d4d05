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

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch

from mini_sglang.multimodal.mm_inputs import MultimodalInputs
from tests.conftest import (
    TINY_DECODER,
    assert_memory_all_free,
    collect_outputs,
    make_req,
    make_scheduler,
    randomize_norms_and_biases,
    run_extend,
)

MAX_NEW_TOKENS = 16
LOGITS_ATOL = 1e-3
# A chat template in the shape of Qwen2.5-VL's: each image part becomes
# <|vision_start|><|image_pad|><|vision_end|>, which the processor expands.
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] in ('image', 'image_url') %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# (height, width) of each prompt's images: 0, 1 and 2 images of different sizes. With
# patch 14, merge 2 and window 56 each image spans several attention windows.
IMAGE_SIZES = [[], [(84, 112)], [(56, 140), (112, 84)], [(140, 56)]]


def tiny_qwen2_5_vl_config(tokenizer, **text_overrides: Any) -> Any:
    """A two-layer Qwen2.5-VL (hidden 64, head_dim 16, mrope_section [2, 3, 3]; text config
    fields overridable) with a two-block vision tower (hidden 32, window 56: block 0
    windowed, block 1 full)."""
    from transformers import Qwen2_5_VLConfig

    ids = tokenizer.convert_tokens_to_ids
    text = dict(
        TINY_DECODER,
        vocab_size=len(tokenizer),
        intermediate_size=128,
        max_position_embeddings=1024,
        rope_theta=10000.0,
        rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
        eos_token_id=ids("<|im_end|>"),
        tie_word_embeddings=False,
    )
    text.update(text_overrides)
    return Qwen2_5_VLConfig(
        text_config=text,
        vision_config=dict(
            depth=2,
            hidden_size=32,
            intermediate_size=64,
            num_heads=2,
            out_hidden_size=text["hidden_size"],
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            window_size=56,
            fullatt_block_indexes=[1],
            initializer_range=text["initializer_range"],
        ),
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=False,
    )


def build_tiny_qwen2_5_vl(path, tokenizer, **text_overrides: Any) -> Any:
    """Save the tiny model, tokenizer (with CHAT_TEMPLATE) and image processor into path;
    return the float32 transformers model."""
    from transformers import Qwen2_5_VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    torch.manual_seed(0)
    config = tiny_qwen2_5_vl_config(tokenizer, **text_overrides)
    hf = Qwen2_5_VLForConditionalGeneration(config).float()
    randomize_norms_and_biases(hf)
    hf.eval()
    hf.save_pretrained(str(path))
    old_template = tokenizer.chat_template  # the session's tokenizer: leave it as it was
    tokenizer.chat_template = CHAT_TEMPLATE
    try:
        tokenizer.save_pretrained(str(path))
    finally:
        tokenizer.chat_template = old_template
    Qwen2VLImageProcessorPil(
        size={"shortest_edge": 28 * 28 * 2, "longest_edge": 28 * 28 * 64}
    ).save_pretrained(str(path))
    return hf


def random_images(sizes: list[tuple[int, int]], seed: int) -> list[Any]:
    from PIL import Image

    rng = np.random.default_rng(seed)
    return [
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), "RGB") for h, w in sizes
    ]


def build_prompts(processor) -> list[tuple[str, list, dict]]:
    """(chat-templated text, images, our processor's output) for each IMAGE_SIZES entry."""
    tok = processor.tokenizer
    out = []
    for k, sizes in enumerate(IMAGE_SIZES):
        content = [{"type": "image"} for _ in sizes] + [{"type": "text", "text": f"Photo {k}?"}]
        if k == 2:  # text between the two images
            content = [content[0], {"type": "text", "text": " and "}, content[1], content[2]]
        text = tok.apply_chat_template(
            [{"role": "user", "content": content}],
            add_generation_prompt=True,
            tokenize=False,
            chat_template=CHAT_TEMPLATE,
        )
        images = random_images(sizes, seed=k)
        if images:
            processed = processor.process_mm_data(images, text, None)
        else:
            processed = {"input_ids": tok.encode(text)}
        out.append((text, images, processed))
    return out


@dataclass
class Prompt:
    text: str
    images: list[Any]
    processed: dict  # our processor's output (input_ids, mm_items, mrope_*)
    hf_logits: torch.Tensor  # [len, vocab]
    hf_output: list[int]


@dataclass
class TinyVL:
    path: str
    hf: Any
    processor: Any  # QwenVLImageProcessor
    prompts: list[Prompt]


def _hf_inputs(hf, processed: dict) -> dict:
    ids = torch.tensor([processed["input_ids"]])
    kw: dict[str, Any] = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    items = processed.get("mm_items") or []
    if items:
        kw["pixel_values"] = torch.cat([it.feature for it in items])
        kw["image_grid_thw"] = torch.cat([it.image_grid_thw for it in items])
        kw["mm_token_type_ids"] = (ids == hf.config.image_token_id).int()
    return kw


@torch.no_grad()
def _hf_reference(hf, processed: dict) -> tuple[torch.Tensor, list[int]]:
    from transformers import GenerationConfig

    kw = _hf_inputs(hf, processed)
    hf.model.rope_deltas = None  # cached per call by transformers: never reuse another's
    logits = hf(**kw).logits[0].float()
    hf.model.rope_deltas = None
    gen = GenerationConfig(
        max_new_tokens=MAX_NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    out = hf.generate(**kw, generation_config=gen)
    return logits, out[0, kw["input_ids"].shape[1] :].tolist()


@pytest.fixture(scope="module")
def tiny_vl(tmp_path_factory: pytest.TempPathFactory, qwen_tokenizer) -> TinyVL:
    from transformers import AutoConfig, AutoImageProcessor

    from mini_sglang.multimodal.processors import TokenizerAndImageProcessor
    from mini_sglang.multimodal.processors.qwen_vl import QwenVLImageProcessor

    path = tmp_path_factory.mktemp("tiny_qwen2_5_vl")
    hf = build_tiny_qwen2_5_vl(path, qwen_tokenizer)
    # The session's tokenizer (loading the Qwen tokenizer again takes seconds).
    parts = TokenizerAndImageProcessor(qwen_tokenizer, AutoImageProcessor.from_pretrained(path))
    processor = QwenVLImageProcessor(AutoConfig.from_pretrained(str(path)), None, parts)
    prompts = []
    for text, images, processed in build_prompts(processor):
        logits, output = _hf_reference(hf, processed)
        # Guards the test's power: one repeated token would match almost any model.
        assert len(set(output)) >= 4, output
        prompts.append(Prompt(text, images, processed, logits, output))
    return TinyVL(str(path), hf, processor, prompts)


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
