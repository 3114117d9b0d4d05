"""Building SGLang's meta_info dict (key order matters to byte-exact clients) and its
logprob triples [logprob, token_id, text | None]."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mini_sglang.managers.io_struct.output import BatchStrOutput
    from mini_sglang.managers.tokenizer_manager import ReqState, TokenizerManager

_PAIRS = (
    ("input_token_logprobs", "input_token_logprobs_val", "input_token_logprobs_idx", False),
    ("output_token_logprobs", "output_token_logprobs_val", "output_token_logprobs_idx", False),
    ("input_top_logprobs", "input_top_logprobs_val", "input_top_logprobs_idx", True),
    ("output_top_logprobs", "output_top_logprobs_val", "output_top_logprobs_idx", True),
    (
        "input_token_ids_logprobs",
        "input_token_ids_logprobs_val",
        "input_token_ids_logprobs_idx",
        True,
    ),
    (
        "output_token_ids_logprobs",
        "output_token_ids_logprobs_val",
        "output_token_ids_logprobs_idx",
        True,
    ),
)


def _triples(tm: TokenizerManager, vals: list, idxs: list, with_text: bool) -> list:
    texts = tm.tokenizer.batch_decode([[i] for i in idxs]) if with_text else [None] * len(idxs)
    return [[v, i, t] for v, i, t in zip(vals, idxs, texts)]


def build_meta_info(tm: TokenizerManager, state: ReqState, recv: BatchStrOutput, i: int) -> dict:
    meta: dict[str, Any] = {
        "id": recv.rids[i],
        "finish_reason": recv.finished_reasons[i],
        "prompt_tokens": recv.prompt_tokens[i],
        "weight_version": tm.server_args.weight_version,
    }
    obj = state.obj
    if obj.return_logprob and recv.output_token_logprobs_val is not None:
        with_text = bool(obj.return_text_in_logprobs) and tm.tokenizer is not None
        for out_key, val_key, idx_key, nested in _PAIRS:
            if nested and out_key.endswith("top_logprobs") and not obj.top_logprobs_num:
                continue
            if nested and "token_ids" in out_key and obj.token_ids_logprob is None:
                continue
            vals, idxs = getattr(recv, val_key), getattr(recv, idx_key)
            if vals is not None:
                state.logprobs[val_key].extend(vals[i])
                state.logprobs[idx_key].extend(idxs[i])
            all_vals, all_idxs = state.logprobs[val_key], state.logprobs[idx_key]
            if nested:
                meta[out_key] = [
                    None if v is None else _triples(tm, v, ix, with_text)
                    for v, ix in zip(all_vals, all_idxs)
                ]
            else:
                # A prompt's first token has no logprob: the scheduler sends it as None.
                meta[out_key] = _triples(tm, all_vals, all_idxs, with_text)
    meta["completion_tokens"] = recv.completion_tokens[i]
    meta["cached_tokens"] = recv.cached_tokens[i]
    return meta
