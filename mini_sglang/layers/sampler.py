"""Sampler: logits -> next token ids (and the logprobs SGLang reports).

Order of operations (SGLang's): penalties and logit_bias on raw logits; greedy rows take the
argmax; other rows divide by temperature, softmax, then top-k, top-p and min-p filtering
(renormalised), then draw. Reported logprobs are log_softmax(logits / temperature), taken
before the top-k/p/min-p filtering, as SGLang computes them.

Seeded draws: a request with a sampling_seed draws with the Gumbel-max trick from noise that
is a pure hash of (seed, position, token id), so its tokens do not depend on which other
requests share the batch. Rows without a seed draw a fresh random seed each step, so one
vectorised path serves every row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from mini_sglang.layers.kernels import flashinfer_sampling
from mini_sglang.sampling.sampling_batch_info import NO_SEED, SamplingBatchInfo


@dataclass
class SamplerOutput:
    next_token_ids: torch.Tensor  # [B] int64
    logprobs: torch.Tensor | None = None  # [B, V] log_softmax(logits / T) when requested


def _mix64(x: torch.Tensor) -> torch.Tensor:
    """A splitmix64-style integer hash on int64 tensors (wrap-around arithmetic).

    Why hand-written: torch has no counter-based RNG whose stream depends only on a
    per-row key, and that is exactly what batch-independent seeded sampling needs.
    """
    x = x ^ (x >> 31)
    x = x * 0x7FB5D329728EA185
    x = x ^ (x >> 27)
    x = x * 0x81DADEF4BC2DD44D
    return x ^ (x >> 33)


def hashed_uniform(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B, vocab] uniforms in (0, 1) that depend only on (seed, position, token id)."""
    cols = torch.arange(vocab, device=seeds.device, dtype=torch.int64)
    key = _mix64(seeds * 0x9E3779B97F4A7C15 + positions * 0x632BE59BD9B4E019)
    bits = _mix64(key[:, None] + cols[None, :] * 0x9E3779B97F4A7C15)
    # 24 random bits -> uniform strictly inside (0, 1).
    return ((bits >> 40) & 0xFFFFFF).float().add_(0.5).div_(1 << 24)


def filter_probs(probs: torch.Tensor, info: SamplingBatchInfo) -> torch.Tensor:
    """Zero the tokens outside each row's top-k / top-p / min-p set and renormalise."""
    if not (info.need_top_k or info.need_top_p or info.need_min_p):
        return probs
    sorted_p, order = probs.sort(dim=-1, descending=True)
    ranks = torch.arange(probs.shape[-1], device=probs.device)[None, :]
    drop = ranks >= info.top_ks[:, None]
    if info.need_top_p:
        # Keep the smallest prefix whose mass reaches top_p (the token crossing it stays).
        cum_before = sorted_p.cumsum(-1) - sorted_p
        drop |= cum_before > info.top_ps[:, None]
    if info.need_min_p:
        drop |= sorted_p < sorted_p[:, :1] * info.min_ps[:, None]
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    filtered = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    return filtered / filtered.sum(-1, keepdim=True)


class Sampler(nn.Module):
    def forward(
        self,
        logits: torch.Tensor,
        info: SamplingBatchInfo,
        positions: torch.Tensor,
        return_logprob: bool = False,
    ) -> SamplerOutput:
        logits = info.apply_logits_bias(logits)
        logprobs = None
        if info.is_all_greedy:
            next_ids = logits.argmax(dim=-1)
            if return_logprob:
                logprobs = torch.log_softmax(logits, dim=-1)
            return SamplerOutput(next_ids, logprobs)
        scaled = logits / info.temperatures
        probs = torch.softmax(scaled, dim=-1)
        if return_logprob:
            logprobs = torch.log_softmax(scaled, dim=-1)
        greedy_rows = info.top_ks <= 1
        fi = flashinfer_sampling() if logits.is_cuda and not info.has_seeds else None
        if fi is not None:
            next_ids = fi.top_k_top_p_sampling_from_probs(
                probs, info.top_ks.int(), info.top_ps, filter_apply_order="joint"
            ).long()
            if info.need_min_p:
                next_ids = self._draw(filter_probs(probs, info), info, positions)
        else:
            next_ids = self._draw(filter_probs(probs, info), info, positions)
        next_ids = torch.where(greedy_rows, logits.argmax(dim=-1), next_ids)
        return SamplerOutput(next_ids, logprobs)

    @staticmethod
    def _draw(
        probs: torch.Tensor, info: SamplingBatchInfo, positions: torch.Tensor
    ) -> torch.Tensor:
        seeds = info.seeds
        if not info.has_seeds:
            seeds = torch.randint(0, 1 << 62, seeds.shape, device=seeds.device)
        else:
            fresh = torch.randint(0, 1 << 62, seeds.shape, device=seeds.device)
            seeds = torch.where(seeds == NO_SEED, fresh, seeds)
        u = hashed_uniform(seeds, positions.to(torch.int64), probs.shape[-1])
        gumbel = -torch.log(-torch.log(u))
        return (torch.log(probs) + gumbel).argmax(dim=-1)
