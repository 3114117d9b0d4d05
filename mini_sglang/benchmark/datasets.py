"""Workload generation, identical to SGLang 0.5.4 ``bench_serving``.

Contract: with the global ``random`` and ``np.random`` generators seeded by ``--seed``
(``run_benchmark`` does this) each sampler consumes random numbers in the same order as
SGLang, so the same flags and tokenizer give the same prompts and lengths.
"""

from __future__ import annotations

import json
import os
import random
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
    raise ValueError(f"Unknown or unsupported dataset: {name}")
