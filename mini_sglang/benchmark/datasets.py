"""Workload generation, identical to SGLang 0.5.4 ``bench_serving``.

Contract: with the global ``random`` and ``np.random`` generators seeded by ``--seed``
(``run_benchmark`` does this) each sampler consumes random numbers in the same order as
SGLang, so the same flags and tokenizer give the same prompts and lengths.
"""

from __future__ import annotations

import base64
import io
import json
import os
import random
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

ASSISTANT_SUFFIX = "Assistant:"


@dataclass
class DatasetRow:
    """One benchmark request: prompt (text, or token ids with --tokenize-prompt) and lengths."""

    prompt: str | list[int]
    prompt_len: int
    output_len: int
    text_prompt_len: int | None = None
    vision_prompt_len: int | None = None
    image_data: list[str] | None = None
    timestamp: float | None = None

    def __post_init__(self) -> None:
        if self.text_prompt_len is None:
            self.text_prompt_len = self.prompt_len
        if self.vision_prompt_len is None:
            self.vision_prompt_len = 0


def _load_sharegpt_pairs(dataset_path: str) -> list[tuple[str, str]]:
    """Return (first human turn, first reply) pairs of conversations with >= 2 turns.

    SGLang downloads the ShareGPT file from Hugging Face when no valid path is given;
    this clone never touches the network, so that case is a clear error instead.
    """
    if not dataset_path or not os.path.isfile(dataset_path):
        raise FileNotFoundError(
            "The ShareGPT dataset is required for --dataset-name sharegpt/random but "
            f"--dataset-path={dataset_path!r} is not a file, and this client does not download "
            "it. Pass --dataset-path /path/to/ShareGPT_V3_unfiltered_cleaned_split.json, or use "
            "--dataset-name random-ids / generated-shared-prefix, which need no file."
        )
    with open(dataset_path) as f:
        dataset = json.load(f)
    convs = [d.get("conversations", d.get("conversation", [])) for d in dataset]
    return [(c[0]["value"], c[1]["value"]) for c in convs if len(c) >= 2]


def _remove_suffix(text: str, suffix: str) -> str:
    return text[: -len(suffix)] if text.endswith(suffix) else text


def sample_sharegpt_requests(
    dataset_path: str,
    num_requests: int,
    tokenizer: Any,
    fixed_output_len: int | None = None,
    context_len: int | None = None,
    prompt_suffix: str | None = "",
    apply_chat_template: bool = False,
) -> list[DatasetRow]:
    """ShareGPT prompts, shuffled with ``random``; output length from the reference reply.

    Drops rows whose prompt or output is < 2 tokens or whose sum exceeds ``context_len``.
    """
    if fixed_output_len is not None and fixed_output_len < 4:
        raise ValueError("output_len too small")
    dataset = _load_sharegpt_pairs(dataset_path)
    random.shuffle(dataset)

    rows: list[DatasetRow] = []
    for prompt, completion in dataset:
        if len(rows) == num_requests:
            break
        if prompt_suffix:
            prompt = _remove_suffix(prompt, ASSISTANT_SUFFIX) + prompt_suffix + ASSISTANT_SUFFIX
        if apply_chat_template:
            prompt = tokenizer.apply_chat_template(
                [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
            )
            if tokenizer.bos_token:
                prompt = prompt.replace(tokenizer.bos_token, "")
        prompt_len = len(tokenizer.encode(prompt))
        output_len = (
            len(tokenizer.encode(completion)) if fixed_output_len is None else fixed_output_len
        )
        if prompt_len < 2 or output_len < 2:
            continue
        if context_len and prompt_len + output_len > context_len:
            continue
        rows.append(DatasetRow(prompt=prompt, prompt_len=prompt_len, output_len=output_len))

    print(f"#Input tokens: {np.sum([x.prompt_len for x in rows])}")
    print(f"#Output tokens: {np.sum([x.output_len for x in rows])}")
    return rows


def sample_random_requests(
    input_len: int,
    output_len: int,
    num_prompts: int,
    range_ratio: float,
    tokenizer: Any,
    dataset_path: str,
    random_sample: bool = True,
    return_text: bool = True,
) -> list[DatasetRow]:
    """``random`` (ShareGPT tokens, needs the file) or ``random-ids`` (synthetic ids).

    Lengths: input ~ U[max(int(L_in*r), 1), L_in], output ~ U[int(L_out*r), L_out], drawn
    from ``np.random`` before anything else. random-ids token j of prompt i is
    ``(offset_i + i + j) % vocab_size`` with ``offset_i ~ U[0, vocab_size)``.
    """
    input_lens = np.random.randint(
        max(int(input_len * range_ratio), 1), input_len + 1, size=num_prompts
    )
    output_lens = np.random.randint(int(output_len * range_ratio), output_len + 1, size=num_prompts)

    rows: list[DatasetRow] = []
    if random_sample:
        dataset = _load_sharegpt_pairs(dataset_path)
        random.shuffle(dataset)
        for prompt, _ in dataset:
            i = len(rows)
            if i == num_prompts:
                break
            ids = tokenizer.encode(prompt)
            if not ids:
                continue
            n = int(input_lens[i])
            # Repeat short prompts then truncate, so every prompt has exactly n tokens.
            ids = ids[:n] if len(ids) > n else (ids * ((n + len(ids) - 1) // len(ids)))[:n]
            content: str | list[int] = tokenizer.decode(ids) if return_text else ids
            rows.append(DatasetRow(prompt=content, prompt_len=n, output_len=int(output_lens[i])))
    else:
        vocab = tokenizer.vocab_size
        offsets = np.random.randint(0, vocab, size=num_prompts)
        for i in range(num_prompts):
            # Plain ints: numpy ints are not JSON-serialisable for --tokenize-prompt.
            ids = [int((offsets[i] + i + j) % vocab) for j in range(input_lens[i])]
            content = tokenizer.decode(ids) if return_text else ids
            rows.append(
                DatasetRow(
                    prompt=content, prompt_len=int(input_lens[i]), output_len=int(output_lens[i])
                )
            )

    print(f"#Input tokens: {np.sum(input_lens)}")
    print(f"#Output tokens: {np.sum(output_lens)}")
    return rows


def gen_prompt(tokenizer: Any, token_num: int, vocab_ids: list[int] | None = None) -> str:
    """Decode ``token_num`` vocab ids drawn uniformly with ``random.choices`` (as SGLang).

    SGLang draws from ``list(get_vocab().values())``, whose order changes on every call for
    fast (Rust) tokenizers, so its workload is not reproducible from ``--seed``. Sorting the
    ids keeps the same uniform distribution and makes the prompts a pure function of the seed.
    ``vocab_ids`` lets callers pass that sorted list once: building it costs ~0.3 s.
    """
    all_tokens = vocab_ids if vocab_ids is not None else sorted(tokenizer.get_vocab().values())
    return tokenizer.decode(random.choices(all_tokens, k=token_num))


def sample_generated_shared_prefix_requests(
    num_groups: int,
    prompts_per_group: int,
    system_prompt_len: int,
    question_len: int,
    output_len: int,
    tokenizer: Any,
) -> list[DatasetRow]:
    """``num_groups`` random system prompts, each followed by ``prompts_per_group`` questions.

    Prompt = f"{system_prompt}\\n\\n{question}"; rows are shuffled with ``random`` at the end.
    SGLang also pickles the result under ~/.cache/sglang/benchmark keyed only by sizes and
    tokenizer class; that cache is skipped here because it can return a stale workload
    generated with another seed or tokenizer (see ``gen_prompt`` for determinism).
    """
    print("\nGenerating new input data...")
    vocab_ids = sorted(tokenizer.get_vocab().values())
    system_prompts = [
        gen_prompt(tokenizer, system_prompt_len, vocab_ids) for _ in range(num_groups)
    ]
    questions = [
        gen_prompt(tokenizer, question_len, vocab_ids)
        for _ in range(num_groups * prompts_per_group)
    ]

    rows: list[DatasetRow] = []
    for g, system_prompt in enumerate(system_prompts):
        for p in range(prompts_per_group):
            full_prompt = f"{system_prompt}\n\n{questions[g * prompts_per_group + p]}"
            rows.append(
                DatasetRow(
                    prompt=full_prompt,
                    prompt_len=len(tokenizer.encode(full_prompt)),
                    output_len=output_len,
                )
            )
    random.shuffle(rows)

    print("\nGenerated shared prefix dataset statistics:")
    print(f"Number of groups: {num_groups}")
    print(f"Prompts per group: {prompts_per_group}")
    print(f"Total prompts: {len(rows)}")
    print(f"Total input tokens: {sum(r.prompt_len for r in rows)}")
    print(f"Total output tokens: {sum(r.output_len for r in rows)}")
    avg_sys = sum(len(tokenizer.encode(s)) for s in system_prompts) / max(len(system_prompts), 1)
    avg_q = sum(len(tokenizer.encode(q)) for q in questions) / max(len(questions), 1)
    print(f"Average system prompt length: {avg_sys:.1f} tokens")
    print(f"Average question length: {avg_q:.1f} tokens\n")
    return rows


IMAGE_RESOLUTIONS = {
    "4k": (3840, 2160),
    "1080p": (1920, 1080),
    "720p": (1280, 720),
    "360p": (640, 360),
}


def parse_image_resolution(image_resolution: str) -> tuple[int, int]:
    """(width, height) of a preset (4k, 1080p, 720p, 360p) or of "HEIGHTxWIDTH"."""
    if image_resolution in IMAGE_RESOLUTIONS:
        return IMAGE_RESOLUTIONS[image_resolution]
    parts = image_resolution.strip().lower().split("x")
    if len(parts) == 2 and all(p.isdigit() and int(p) > 0 for p in parts):
        return int(parts[1]), int(parts[0])
    raise ValueError(
        f"Unsupported image resolution: {image_resolution}. "
        "Choose from 4k, 1080p, 720p, 360p, or provide custom 'heightxwidth' (e.g., 1080x1920)."
    )


def create_mm_data_row(
    text_prompt: str, images: list, images_base64: list[str], output_len: int, processor: Any
) -> DatasetRow:
    """A request of text_prompt and the images, as SGLang counts it: prompt_len is the
    processor's token count of the chat-templated prompt with the images (their
    placeholders expanded), text_prompt_len that of the text alone, vision_prompt_len the
    difference. The row's prompt is the bare text; the images travel in image_data."""
    try:
        content: list[dict] = [{"type": "image", "image": {"url": u}} for u in images_base64]
        content.append({"type": "text", "text": text_prompt})
        prompt_str = processor.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
        )
    except Exception as e:  # noqa: BLE001 - SGLang's fallback for list-less templates
        print(f"Error applying chat template: {e}, fallback to <image> tag")
        prompt_str = f"<image>{text_prompt}"
    prompt_len = processor(text=[prompt_str], images=images, padding=False, return_tensors="pt")[
        "input_ids"
    ].numel()
    try:
        text_only = processor.apply_chat_template(
            [{"role": "user", "content": text_prompt}], add_generation_prompt=True, tokenize=False
        )
        text_prompt_len = processor(text=[text_only], padding=False, return_tensors="pt")[
            "input_ids"
        ].numel()
    except Exception:  # noqa: BLE001 - as SGLang
        text_prompt_len = len(processor.tokenizer.encode(text_prompt))
    return DatasetRow(
        prompt=text_prompt,
        prompt_len=prompt_len,
        output_len=output_len,
        text_prompt_len=text_prompt_len,
        vision_prompt_len=prompt_len - text_prompt_len,
        image_data=images_base64,
    )


def sample_image_requests(
    num_requests: int,
    image_count: int,
    input_len: int,
    output_len: int,
    range_ratio: float,
    processor: Any,
    image_content: str,
    image_format: str,
    image_resolution: str,
) -> list[DatasetRow]:
    """SGLang's ``image`` dataset: each request has ``image_count`` images of the given
    resolution (random pixels, or white with image_content "blank"), sent as data URLs,
    and a random text prompt whose length follows the ``random`` rule.

    Random numbers are drawn in SGLang's order: all input lengths, all output lengths
    (np.random), then per request its text (random.choices, see gen_prompt) and its images
    (np.random.rand)."""
    from PIL import Image

    width, height = parse_image_resolution(image_resolution)
    if width * height >= 1920 * 1080 and image_count * num_requests >= 100:
        warnings.warn(
            f"High resolution ({width}x{height}) with {image_count * num_requests} total images "
            "may take a long time. Consider reducing resolution or image count.",
            UserWarning,
            stacklevel=2,
        )
    input_lens = np.random.randint(
        max(int(input_len * range_ratio), 1), input_len + 1, size=num_requests
    )
    output_lens = np.random.randint(
        int(output_len * range_ratio), output_len + 1, size=num_requests
    )

    def random_image() -> tuple[Any, str, int]:
        if image_content == "blank":
            arr = np.full((height, width, 3), 255, dtype=np.uint8)
        else:
            arr = (np.random.rand(height, width, 3) * 255).astype(np.uint8)
        img = Image.fromarray(arr)
        buf = io.BytesIO()
        img.save(buf, format=image_format, quality=85)
        url = f"data:image/{image_format};base64,{base64.b64encode(buf.getvalue()).decode()}"
        return img, url, len(url.encode("utf-8"))

    vocab_ids = sorted(processor.tokenizer.get_vocab().values())
    rows: list[DatasetRow] = []
    total_image_bytes = 0
    for i in range(num_requests):
        text_prompt = gen_prompt(processor.tokenizer, int(input_lens[i]), vocab_ids)
        images, urls, sizes = zip(*[random_image() for _ in range(image_count)])
        total_image_bytes += sum(sizes)
        rows.append(
            create_mm_data_row(
                text_prompt, list(images), list(urls), int(output_lens[i]), processor
            )
        )
    print(f"#Input tokens: {np.sum([x.prompt_len for x in rows])}")
    print(f"#Output tokens: {np.sum([x.output_len for x in rows])}")
    print(
        f"\nCreated {len(rows)} {image_content} {image_format} images with average "
        f"{total_image_bytes // num_requests} bytes per request"
    )
    return rows


def get_dataset(args: Any, tokenizer: Any) -> list[DatasetRow]:
    """Dispatch on ``args.dataset_name`` exactly like SGLang's ``get_dataset``."""
    tokenize_prompt = getattr(args, "tokenize_prompt", False)
    name = args.dataset_name
    if name == "sharegpt":
        assert not tokenize_prompt, "--tokenize-prompt is not supported with sharegpt"
        return sample_sharegpt_requests(
            dataset_path=args.dataset_path,
            num_requests=args.num_prompts,
            tokenizer=tokenizer,
            fixed_output_len=args.sharegpt_output_len,
            context_len=args.sharegpt_context_len,
            prompt_suffix=args.prompt_suffix,
            apply_chat_template=args.apply_chat_template,
        )
    if name.startswith("random"):
        return sample_random_requests(
            input_len=args.random_input_len,
            output_len=args.random_output_len,
            num_prompts=args.num_prompts,
            range_ratio=args.random_range_ratio,
            tokenizer=tokenizer,
            dataset_path=args.dataset_path,
            random_sample=name == "random",
            return_text=not tokenize_prompt,
        )
    if name == "generated-shared-prefix":
        assert not tokenize_prompt, (
            "--tokenize-prompt is not supported with generated-shared-prefix"
        )
        return sample_generated_shared_prefix_requests(
            num_groups=args.gsp_num_groups,
            prompts_per_group=args.gsp_prompts_per_group,
            system_prompt_len=args.gsp_system_prompt_len,
            question_len=args.gsp_question_len,
            output_len=args.gsp_output_len,
            tokenizer=tokenizer,
        )
    if name == "image":
        return sample_image_requests(
            num_requests=args.num_prompts,
            image_count=args.image_count,
            input_len=args.random_input_len,
            output_len=args.random_output_len,
            range_ratio=args.random_range_ratio,
            processor=load_processor(args.tokenizer or args.model),
            image_content=args.image_content,
            image_format=args.image_format,
            image_resolution=args.image_resolution,
        )
    raise ValueError(f"Unknown or unsupported dataset: {name}")


def load_processor(model_path: str) -> Any:
    """The model's AutoProcessor (as SGLang's client). Where transformers cannot build it
    (ImportError: e.g. Qwen2.5-VL's video processor needs torchvision), mini-sglang's own
    processor for the architecture counts the tokens instead (MiniProcessor)."""
    from transformers import AutoProcessor

    try:
        return AutoProcessor.from_pretrained(model_path, trust_remote_code=True)
    except ImportError:
        return MiniProcessor.from_pretrained(model_path)


class MiniProcessor:
    """What create_mm_data_row needs of an HF processor (``tokenizer``,
    ``apply_chat_template``, ``__call__(text=[...], images=...)["input_ids"]``), served by
    the tokenizer and mini-sglang's multimodal processor (BaseMultimodalProcessor) of the
    model's architecture."""

    def __init__(self, tokenizer: Any, mm_processor: Any) -> None:
        self.tokenizer = tokenizer
        self.mm_processor = mm_processor

    @classmethod
    def from_pretrained(cls, model_path: str) -> MiniProcessor:
        from transformers import AutoConfig

        from mini_sglang.multimodal.processors import get_mm_processor, get_processor

        parts = get_processor(model_path, trust_remote_code=True)
        config = AutoConfig.from_pretrained(model_path, trust_remote_code=True)
        mm_processor = get_mm_processor(config, None, parts)
        if mm_processor is None:
            raise ValueError(f"{model_path} is not a multimodal model mini-sglang serves")
        return cls(parts.tokenizer, mm_processor)

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
        return self.tokenizer.apply_chat_template(*args, **kwargs)

    def __call__(self, text: list[str], images: list | None = None, **_: Any) -> dict:
        import torch

        if images:
            ids = self.mm_processor.process_mm_data(images, text[0], None)["input_ids"]
        else:
            ids = self.tokenizer.encode(text[0])
        return {"input_ids": torch.tensor([ids])}
