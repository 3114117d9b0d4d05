"""Images through the real server (tiny random LLaVA, CPU): /generate's image_data in each
form SGLang takes (file path, http URL, data: URL, raw base64; one image, several, a batch),
OpenAI chat image_url parts (stream and not, official client), the radix cache reusing a
repeated image (cached_tokens) and never a different one, an image split across two
prefill chunks, and each kind of bad input answered 400 with nothing left held.

Outputs are checked against transformers' greedy generate on the same weights.
"""

from __future__ import annotations

import base64
import functools
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.conftest import ServerHandle, free_port, launch_server
from tests.tiny_vlm import IMAGE_TOKEN, TOKENS_PER_IMAGE, make_image, png_bytes

MAX_NEW = 8
GREEDY = {"max_new_tokens": MAX_NEW, "temperature": 0, "ignore_eos": True}
CHUNK = 24  # the prompts below put an image across the first chunk boundary
MAX_PIXELS = 200 * 200
MAX_IMAGES = 3
PROMPT = f"Look at this: {IMAGE_TOKEN} and say"
PROMPT2 = f"First {IMAGE_TOKEN} then {IMAGE_TOKEN} compare"


class Vlm:
    def __init__(self, path: Path, hf: Any, tokenizer: Any, processor: Any) -> None:
        self.path, self.hf, self.tokenizer, self.processor = path, hf, tokenizer, processor
        self.images = {k: make_image(w, h, k) for k, (w, h) in enumerate([(40, 30), (64, 50)])}
        for k, image in self.images.items():
            image.save(path / f"img{k}.png")

    @functools.cache  # noqa: B019 - one module-scoped instance
    def greedy(self, text: str, images: tuple[int, ...]) -> list[int]:
        pics = [self.images[k] for k in images]
        inputs = self.processor(images=pics, text=text, return_tensors="pt")
        out = self.hf.generate(
            **inputs, max_new_tokens=MAX_NEW, do_sample=False, eos_token_id=None, pad_token_id=0
        )
        return out[0, inputs["input_ids"].shape[1] :].tolist()

    def b64(self, k: int) -> str:
        return base64.b64encode(png_bytes(self.images[k])).decode()


@pytest.fixture(scope="module")
def vlm(tiny_llava: tuple[str, Any]) -> Vlm:
    from transformers import AutoProcessor

    path, hf = Path(tiny_llava[0]), tiny_llava[1]
    processor = AutoProcessor.from_pretrained(str(path))
    (path / "not_an_image.png").write_text("plain text, not a picture")
    make_image(300, 300, 9).save(path / "too_big.png")
    return Vlm(path, hf, processor.tokenizer, processor)


@pytest.fixture(scope="module")
def image_host(vlm: Vlm) -> Iterator[str]:
    """An http server for the model directory's images (base URL)."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(vlm.path))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def vlm_server(vlm: Vlm, server_logs) -> Iterator[ServerHandle]:
    env = {
        "MINI_SGLANG_MAX_IMAGE_PIXELS": str(MAX_PIXELS),
        "MINI_SGLANG_MAX_IMAGES_PER_REQUEST": str(MAX_IMAGES),
        "MINI_SGLANG_IMAGE_FETCH_TIMEOUT": "5",
    }
    args = ("--chunked-prefill-size", str(CHUNK))
    handle = launch_server(str(vlm.path), *args, log_dir=server_logs, env=env)
    yield handle
    handle.stop()


def _generate(server: ServerHandle, **body: Any) -> Any:
    r = server.post("/generate", json={"sampling_params": GREEDY, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_generate_takes_every_image_form(vlm: Vlm, vlm_server: ServerHandle, image_host) -> None:
    """Each form of the same image gives transformers' output; from the second request on
    the prompt and image come from the radix cache."""
    ref = vlm.greedy(PROMPT, (0,))
    forms = [
        str(vlm.path / "img0.png"),
        f"{image_host}/img0.png",
        "data:image/png;base64," + vlm.b64(0),
        vlm.b64(0),
        [vlm.b64(0)],
    ]
    n_prompt = len(vlm.tokenizer.encode(PROMPT)) - 1 + TOKENS_PER_IMAGE
    for i, form in enumerate(forms):
        out = _generate(vlm_server, text=PROMPT, image_data=form, modalities=["image"])
        assert out["output_ids"] == ref, f"form {i}"
        meta = out["meta_info"]
        assert meta["prompt_tokens"] == n_prompt
        if i:
            assert meta["cached_tokens"] >= n_prompt - 1 - CHUNK, (i, meta)
            assert meta["cached_tokens"] > TOKENS_PER_IMAGE
    # input_ids hold one image token per image, expanded as the text's is
    ids = vlm.tokenizer.encode(PROMPT)
    assert _generate(vlm_server, input_ids=ids, image_data=vlm.b64(0))["output_ids"] == ref


def test_different_images_never_share_cache(vlm: Vlm, vlm_server: ServerHandle) -> None:
    """Same text, another image: its own output, and no cached rows past the text before
    the image. Two images split across the chunk boundary; a batch of two prompts."""
    first = _generate(vlm_server, text=PROMPT, image_data=vlm.b64(0))
    other = _generate(vlm_server, text=PROMPT, image_data=vlm.b64(1))
    assert other["output_ids"] == vlm.greedy(PROMPT, (1,))
    assert other["output_ids"] != first["output_ids"]
    before_image = vlm.tokenizer.encode(PROMPT.split(IMAGE_TOKEN)[0])
    assert other["meta_info"]["cached_tokens"] <= len(before_image)
    two = _generate(vlm_server, text=PROMPT2, image_data=[vlm.b64(1), vlm.b64(0)])
    assert two["meta_info"]["prompt_tokens"] > CHUNK  # the second image crosses the chunk
    assert two["output_ids"] == vlm.greedy(PROMPT2, (1, 0))
    swapped = _generate(vlm_server, text=PROMPT2, image_data=[vlm.b64(0), vlm.b64(1)])
    assert swapped["output_ids"] == vlm.greedy(PROMPT2, (0, 1))
    batch = _generate(vlm_server, text=[PROMPT, PROMPT], image_data=[vlm.b64(1), vlm.b64(0)])
    assert [b["output_ids"] for b in batch] == [other["output_ids"], first["output_ids"]]
    vlm_server.wait_memory_all_free()


def test_openai_chat_with_image_parts(vlm: Vlm, vlm_server: ServerHandle) -> None:
    """image_url parts (data URL, detail) mixed with text, rendered by the chat template:
    the reply is /generate's for the rendered prompt, streamed or not."""
    import openai

    client = openai.OpenAI(base_url=vlm_server.base_url + "/v1", api_key="x")
    url = "data:image/png;base64," + vlm.b64(1)
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is in"},
                {"type": "image_url", "image_url": {"url": url, "detail": "low"}},
                {"type": "text", "text": "?"},
            ],
        }
    ]
    text = vlm.processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "text", "text": "What is in"}, {"type": "image"},
                                      {"type": "text", "text": "?"}]}],
        add_generation_prompt=True,
        tokenize=False,
    )  # fmt: skip
    expected = _generate(vlm_server, text=text, image_data=url)
    assert expected["output_ids"] == vlm.greedy(text, (1,))
    kw: dict[str, Any] = dict(model="x", messages=messages, max_tokens=MAX_NEW, temperature=0)
    reply = client.chat.completions.create(**kw, extra_body={"ignore_eos": True})
    assert reply.choices[0].message.content == expected["text"]
    assert reply.usage.prompt_tokens == expected["meta_info"]["prompt_tokens"]
    stream = client.chat.completions.create(
        **kw, stream=True, extra_body={"ignore_eos": True, "modalities": ["image"]}
    )
    assert (
        "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == (expected["text"])
    )


def test_bad_images_are_400s(vlm: Vlm, vlm_server: ServerHandle) -> None:
    closed = f"http://127.0.0.1:{free_port()}/img0.png"
    cases = {
        str(vlm.path / "missing.png"): "does not exist",
        str(vlm.path / "not_an_image.png"): "not a readable image",
        str(vlm.path / "too_big.png"): f"at most {MAX_PIXELS} pixels",
        closed: "Fetching the image",
        "%%% not base64 %%%": "not a file path, an http(s) URL",
    }
    for data, message in cases.items():
        r = vlm_server.post("/generate", json={"text": PROMPT, "image_data": data})
        assert r.status_code == 400 and message in r.text, (data, r.text)
    too_many = [vlm.b64(0)] * (MAX_IMAGES + 1)
    r = vlm_server.post(
        "/generate", json={"text": IMAGE_TOKEN * (MAX_IMAGES + 1), "image_data": too_many}
    )
    assert r.status_code == 400 and f"at most {MAX_IMAGES}" in r.text
    r = vlm_server.post("/generate", json={"text": "no image token", "image_data": vlm.b64(0)})
    assert r.status_code == 400 and "image tokens" in r.text
    session = {"text": PROMPT, "image_data": vlm.b64(0), "session_params": {"id": "s"}}
    r = vlm_server.post("/generate", json=session)
    assert r.status_code == 400 and "in a session" in r.text
    r = vlm_server.post(
        "/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}],
        },
    )
    assert r.status_code == 400, r.text
    m = vlm_server.wait_memory_all_free()
    assert m["failures"] == 0
    assert _generate(vlm_server, text=PROMPT, image_data=vlm.b64(0))["output_ids"] == (
        vlm.greedy(PROMPT, (0,))
    )
