"""Packed token bitmasks: one bit per vocabulary entry, 32 tokens per int32 word.

This is xgrammar's layout (bit ``t % 32`` of word ``t // 32`` set means token ``t`` is
allowed; a fresh mask is all ones, i.e. -1 words), so a matcher fills rows in place:

    mask = allocate_token_bitmask(batch_size=2, vocab_size=70)   # int32 [2, 3], all -1
    matcher.fill_next_token_bitmask(mask, 1)                     # row 1 now constrained
    logits = apply_token_bitmask(logits, mask)                   # row 0 untouched

Applying is plain torch (unpack the bits, masked_fill) rather than xgrammar's kernels, so the
same code runs on CPU and GPU with no JIT step; tests/unit/test_grammar.py checks it against
``xgrammar.apply_token_bitmask_inplace``.
"""

from __future__ import annotations

import torch

BITS_PER_WORD = 32


def bitmask_width(vocab_size: int) -> int:
    """int32 words per row for a vocabulary of ``vocab_size`` tokens."""
    return (vocab_size + BITS_PER_WORD - 1) // BITS_PER_WORD


def allocate_token_bitmask(batch_size: int, vocab_size: int) -> torch.Tensor:
    """A CPU int32 [batch_size, words] mask that allows every token (all bits set)."""
    return torch.full((batch_size, bitmask_width(vocab_size)), -1, dtype=torch.int32)


def unpack_token_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool [B, vocab_size]: True where the token is allowed."""
    shifts = torch.arange(BITS_PER_WORD, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1  # arithmetic shift is fine: bit 0 only
    return bits.view(bitmask.shape[0], -1)[:, :vocab_size].bool()


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """``logits`` [B, V] with every disallowed token set to -inf (a new tensor).

    Contract: ``bitmask`` is [B, >= ceil(V / 32)] int32 on the logits' device; rows that
    allow everything (-1 words) come back unchanged, bit for bit.
    """
    vocab = logits.shape[-1]
    assert bitmask.shape[0] == logits.shape[0], (bitmask.shape, logits.shape)
    assert bitmask.shape[1] * BITS_PER_WORD >= vocab, (bitmask.shape, logits.shape)
    allowed = unpack_token_bitmask(bitmask, vocab)
    return logits.masked_fill(~allowed, float("-inf"))
