"""Decoder-only scoring: the probability of each label token right after (query + item).

SGLang 0.5.4's `TokenizerManager.score_request`, behind `/v1/score` and `Engine.score`. Each
item becomes one prompt, `query + item` (or `item + query` with `item_first`), as text or as
token ids, and runs as a prefill-only request (`max_new_tokens` 0) that reports the
logprobs of `label_token_ids` at the position after its prompt. Scores are those
probabilities, or, with `apply_softmax`, a softmax over the labels' logprobs.

Worked example: query "Is Paris the capital of France? Answer:", items [" yes", " no"] would
score the prompts "...Answer: yes" and "...Answer: no"; with label_token_ids [A, B] the
result is [[p(A | prompt 1), p(B | prompt 1)], [p(A | prompt 2), p(B | prompt 2)]].

Not here: multi-item scoring (`--multi-item-scoring-delimiter`, one sequence holding every
item), which needs attention masks that keep the items apart.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from mini_sglang.managers.io_struct.generate import GenerateReqInput

if TYPE_CHECKING:
    from mini_sglang.managers.tokenizer_manager import TokenizerManager

Query = str | list[int] | None
Items = str | list[str] | list[list[int]] | None


def scoring_request(
    query: Query, items: Items, label_token_ids: list[int], item_first: bool
) -> GenerateReqInput:
    """The batch of prefill-only requests that scores every item (one per item)."""
    obj = GenerateReqInput(
        token_ids_logprob=label_token_ids,
        return_logprob=True,
        logprob_start_len=-1,
        stream=False,
        sampling_params={"max_new_tokens": 0},
    )
    if isinstance(query, str) and (
        isinstance(items, str)
        or (isinstance(items, list) and (not items or isinstance(items[0], str)))
    ):
        texts = [items] if isinstance(items, str) else items
        obj.text = [f"{item}{query}" if item_first else f"{query}{item}" for item in texts]
    elif (
        isinstance(query, list) and isinstance(items, list) and items and isinstance(items[0], list)
    ):
        obj.input_ids = [item + query if item_first else query + item for item in items]
    else:
        raise ValueError("Invalid combination of query/items types for score_request.")
    return obj


def label_scores(
    result: dict[str, Any], label_token_ids: list[int], apply_softmax: bool
) -> list[float]:
    """One item's scores, in label_token_ids order, from its generate result. A label the
    result does not carry scores 0 (logprob -inf)."""
    meta = result["meta_info"]
    positions = meta.get("output_token_ids_logprobs") or []
    if not positions:
        reason = meta.get("finish_reason") or {}
        if reason.get("type") == "abort":  # e.g. a prompt longer than the context
            raise ValueError(reason.get("message") or "The scoring request was aborted.")
        raise RuntimeError(f"output_logprobs is empty for request {meta.get('id', '<unknown>')}.")
    found = {
        token_id: logprob for logprob, token_id, _ in positions[0] if token_id in label_token_ids
    }
    logprobs = [found.get(token_id, float("-inf")) for token_id in label_token_ids]
    if apply_softmax:
        # float32, as SGLang's torch.tensor(list of floats)
        return torch.softmax(torch.tensor(logprobs), dim=0).tolist()
    return [math.exp(x) if x != float("-inf") else 0.0 for x in logprobs]


async def score_request(
    tokenizer_manager: TokenizerManager,
    query: Query = None,
    items: Items = None,
    label_token_ids: list[int] | None = None,
    apply_softmax: bool = False,
    item_first: bool = False,
    request: Any = None,
) -> list[list[float]]:
    """Scores of every item (see the module docstring). Raises ValueError for bad input:
    no label_token_ids, a label id outside the tokenizer's vocab, or query/items of
    mismatched kinds (text with ids)."""
    if label_token_ids is None:
        raise ValueError("label_token_ids must be provided")
    tokenizer = tokenizer_manager.tokenizer
    if tokenizer is not None:
        # the tokenizer's base vocab, as SGLang (added special tokens lie above it)
        for token_id in label_token_ids:
            if token_id >= tokenizer.vocab_size:
                raise ValueError(
                    f"Token ID {token_id} is out of vocabulary (vocab size: {tokenizer.vocab_size})"
                )
    obj = scoring_request(query, items, label_token_ids, item_first)
    if not (obj.text if obj.text is not None else obj.input_ids):
        return []  # no items, nothing to run
    results = await tokenizer_manager.generate_request(obj, request).__anext__()
    return [label_scores(r, label_token_ids, apply_softmax) for r in results]
