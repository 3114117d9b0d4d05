"""Parallel sampling (n > 1): prefill each shared prompt once before sampling it n times.

SGLang 0.5.4's TokenizerManager (``_handle_batch_request``) first sends, for every distinct
prompt, a copy of the request with ``max_new_tokens=0`` and a fresh rid, waits until it has
finished (its prompt KV is then in the radix cache), and only then sends the n real
copies, whose prefill is then a cache hit on all but the last prompt token. The
prefix-caching requests' outputs are never shown to the client.

Example: text="Hi", n=3 -> one hidden request (max_new_tokens 0) for "Hi", then rids x_0,
x_1, x_2 that each report cached_tokens == len(prompt) - 1.
"""

from __future__ import annotations

import copy
import uuid

from mini_sglang.managers.io_struct.generate import GenerateReqInput, TokenizedGenerateReqInput


def prefix_caching_requests(
    subs: list[GenerateReqInput], tokenized: list[TokenizedGenerateReqInput], n: int
) -> list[tuple[GenerateReqInput, TokenizedGenerateReqInput]]:
    """One prefill-only (max_new_tokens 0, non-stream, fresh rid) copy of each prompt of an
    expanded batch, as (sub-request, tokenized request) pairs; the inputs are not changed.

    ``subs``/``tokenized`` are the prompt-major expansion (sub-request k uses prompt k // n),
    so the first copy of each prompt is at k = 0, n, 2n, ...
    """
    pairs = []
    for k in range(0, len(subs), n):
        sub = copy.copy(subs[k])
        sub.rid = uuid.uuid4().hex
        sub.stream = False
        tok = copy.copy(tokenized[k])
        tok.rid = sub.rid
        tok.stream = False
        tok.sampling_params = copy.copy(tok.sampling_params)
        tok.sampling_params.max_new_tokens = 0
        pairs.append((sub, tok))
    return pairs
