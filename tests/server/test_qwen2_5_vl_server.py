"""Qwen2.5-VL through the real server (tiny random model, CPU), beside transformers: what
is specific to it (the LLaVA server tests cover the image forms, chat and bad input).

- Each image's token count is t * h * w / merge**2 of the image processor's
  image_grid_thw, for sizes the processor keeps and sizes it resizes.
- Greedy output equals transformers' generate, so decode positions carry the M-RoPE delta,
  with prefill chunks of 8 tokens that split every image (one feature computation, rows
  and M-RoPE columns per chunk); as one /generate batch too.
- The processor comes from get_processor's fallback (no torchvision here: transformers
  cannot build Qwen2.5-VL's AutoProcessor).
"""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from typing import Any

import pytest

from tests.server.conftest import ServerHandle, launch_server
from tests.tiny_qwen2_5_vl import CHAT_TEMPLATE, MAX_NEW_TOKENS, TinyVL, random_images

CHUNK = 8
GREEDY = {"max_new_tokens": MAX_NEW_TOKENS, "temperature": 0, "ignore_eos": True}


def _data_url(image: Any) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


@pytest.fixture(scope="module")
def server(tiny_qwen2_5_vl: TinyVL, server_logs) -> Iterator[ServerHandle]:
    handle = launch_server(
        tiny_qwen2_5_vl.path, "--chunked-prefill-size", str(CHUNK), log_dir=server_logs
    )
    yield handle
    handle.stop()


def _generate(server: ServerHandle, **body: Any) -> Any:
    r = server.post("/generate", json={"sampling_params": GREEDY, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_image_token_counts_follow_image_grid_thw(
    tiny_qwen2_5_vl: TinyVL, server: ServerHandle
) -> None:
    """Sizes off the 28-pixel grid are resized by the image processor: the prompt's image
    tokens are its image_grid_thw's t * h * w / 4 either way."""
    processor = tiny_qwen2_5_vl.processor
    text = processor.tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "?"}]}],
        add_generation_prompt=True,
        tokenize=False,
        chat_template=CHAT_TEMPLATE,
    )
    n_text = len(processor.tokenizer.encode(text)) - 1  # one <|image_pad|> stands for all
    for size in [(84, 112), (100, 70), (30, 200)]:
        (image,) = random_images([size], seed=7)
        grid = processor.image_processor(images=[image], return_tensors="pt")["image_grid_thw"]
        assert grid.shape == (1, 3) and grid[0, 0] == 1
        expected = n_text + int(grid.prod()) // 4
        meta = _generate(server, text=text, image_data=_data_url(image))["meta_info"]
        assert meta["prompt_tokens"] == expected, (size, grid.tolist(), meta)


def test_outputs_match_transformers_with_chunks_inside_images(
    tiny_qwen2_5_vl: TinyVL, server: ServerHandle
) -> None:
    """Every prompt (0, 1 and 2 images) one at a time, then all as one batch: transformers'
    16 greedy tokens, each image split by the 8-token prefill chunks."""
    cases = [(p.text, p.images, p.processed) for p in tiny_qwen2_5_vl.prompts]
    refs = [p.hf_output for p in tiny_qwen2_5_vl.prompts]
    for (text, images, processed), ref in zip(cases, refs):
        body: dict[str, Any] = {"text": text}
        if images:
            body["image_data"] = [_data_url(im) for im in images]
            for item in processed["mm_items"]:
                ((start, end),) = item.offsets
                assert start // CHUNK != (end - 1) // CHUNK
        out = _generate(server, **body)
        assert out["output_ids"] == ref, (len(images), out["output_ids"], ref)
        assert out["meta_info"]["prompt_tokens"] == len(processed["input_ids"])
    with_images = [(t, ims) for t, ims, _ in cases if ims]
    outs = _generate(
        server,
        text=[t for t, _ in with_images],
        image_data=[[_data_url(im) for im in ims] for _, ims in with_images],
    )
    assert [o["output_ids"] for o in outs] == [r for (_, ims, _), r in zip(cases, refs) if ims]
    assert server.get("/health").status_code == 200
