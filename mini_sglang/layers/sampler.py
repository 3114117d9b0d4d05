"""Sampler: logits -> next token ids (and the logprobs SGLang reports).

Order of operations (SGLang's): penalties, the grammar mask and logit_bias on raw logits,
then the requests' custom logit processors (their failures are reported, not raised); greedy
rows take the argmax; other rows divide by temperature, softmax, then top-k, top-p and min-p
filtering (renormalised), then draw. Reported output logprobs are log_softmax(penalised logits /
temperature), taken before the top-k/p/min-p filtering, as SGLang 0.5.4 computes them
(greedy rows have temperature 1). Prompt logprobs are not made here: they are
log_softmax(raw logits), without temperature or penalties (scheduler_output_processor).

Seeded draws: a request with a sampling_seed draws with the Gumbel-max trick from noise that
is a pure hash of (seed, position, token id), so its tokens do not depend on which other
requests share the batch. Rows without a seed draw a fresh random seed each step, so one
vectorised path serves every row.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from mini_sglang.layers.kernels import flashinfer_module_ready, flashinfer_sampling
from mini_sglang.sampling.custom_logit_batch import ProcessorFailure
from mini_sglang.sampling.sampling_batch_info import NO_SEED, SamplingBatchInfo


@dataclass
class SamplerOutput:
    next_token_ids: torch.Tensor  # [B] int64
    logprobs: torch.Tensor | None = None  # [B, V] log_softmax(logits / T) when requested
    # Rows whose custom logit processor raised this step (their requests must finish).
    processor_failures: list[ProcessorFailure] = field(default_factory=list)


def _i64(c: int) -> int:
    """A 64-bit constant as the signed int64 with the same bits (torch has no uint64 ops)."""
    return c - (1 << 64) if c >= 1 << 63 else c


def _shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift on int64 (torch's >> is arithmetic: it copies the sign bit)."""
    return (x >> k) & ((1 << (64 - k)) - 1)


_M1, _M2 = _i64(0xBF58476D1CE4E5B9), _i64(0x94D049BB133111EB)
_G1, _G2 = _i64(0x9E3779B97F4A7C15), _i64(0x632BE59BD9B4E019)


def _mix64(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser on int64 tensors (wrap-around multiplication, logical shifts).

    Why hand-written: torch has no counter-based RNG whose stream depends only on a
    per-row key, and that is exactly what batch-independent seeded sampling needs. The
    shifts must be logical: with arithmetic ones the top bit of ``x ^ (x >> k)`` is always 0,
    which once halved the uniforms' range and starved low-probability tokens.
    """
    x = (x ^ _shr(x, 30)) * _M1
    x = (x ^ _shr(x, 27)) * _M2
    return x ^ _shr(x, 31)


def hashed_uniform(seeds: torch.Tensor, positions: torch.Tensor, vocab: int) -> torch.Tensor:
    """[B, vocab] uniforms in (0, 1) that depend only on (seed, position, token id)."""
    cols = torch.arange(vocab, device=seeds.device, dtype=torch.int64)
    key = _mix64(seeds * _G1 + positions * _G2)
    bits = _mix64(key[:, None] + cols[None, :] * _G1)
    # The top 23 random bits -> uniform strictly inside (0, 1); 23, not 24, so that
    # k + 0.5 stays exact in float32 and the largest value is below 1.0.
    return _shr(bits, 41).float().add_(0.5).div_(1 << 23)


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


def greedy_argmax(logits: torch.Tensor) -> torch.Tensor:
    """logits.argmax(-1) for [B, V] logits, first index on ties, as torch's.

    torch's reduction gives each row one thread block, so at batch 1 the argmax over
    Llama-3.1-8B's 128,256 logits took 28 us on an H100, longer than its qkv GEMV. On CUDA, for
    a few rows, each row is cut into `chunks` equal pieces reduced in parallel, then the
    best piece is picked: the first piece holding the maximum, then the first index in it.
    Worked example, V = 12, 4 chunks of 3: [1 5 2 | 0 5 1 | 9 9 0 | 3 3 3] -> chunk maxima
    [5 5 9 3] at [1 1 0 0]; best chunk 2, so the index is 2 * 3 + 0 = 6.
    """
    b, v = logits.shape
    chunks = 128
    while v % chunks:
        chunks //= 2
    if not logits.is_cuda or b > 32 or chunks < 16 or not logits.is_contiguous():
        return logits.argmax(dim=-1)
    return argmax_by_chunks(logits, chunks)


def argmax_by_chunks(logits: torch.Tensor, chunks: int) -> torch.Tensor:
    """greedy_argmax's two passes, for contiguous [B, V] logits with V divisible by chunks."""
    b, v = logits.shape
    values, where = logits.view(b, chunks, v // chunks).max(dim=-1)
    best = values.argmax(dim=-1, keepdim=True)
    return (best * (v // chunks) + where.gather(1, best)).squeeze(1)


class Sampler(nn.Module):
    """backend (--sampling-backend): "flashinfer" draws unseeded rows with flashinfer's
    sampling kernels on CUDA; "pytorch" always takes the softmax path below (seeded rows
    always do, so their draws do not depend on the batch). `flashinfer_build`: the name of
    flashinfer's sampling module when a background build of it was started
    (kernels.start_flashinfer_builds); while that build is in flight, unseeded rows take the
    torch path too (their draws are random either way)."""

    def __init__(self, backend: str = "flashinfer", flashinfer_build: str | None = None) -> None:
        super().__init__()
        self.use_flashinfer = backend == "flashinfer"
        self.flashinfer_build = flashinfer_build

    def forward(
        self,
        logits: torch.Tensor,
        info: SamplingBatchInfo,
        positions: torch.Tensor,
        return_logprob: bool = False,
    ) -> SamplerOutput:
        logits = info.apply_logits_bias(logits)
        failures: list[ProcessorFailure] = []
        if info.custom_logit is not None:
            logits, failures = info.custom_logit.apply(logits)
        out = self._sample(logits, info, positions, return_logprob)
        out.processor_failures = failures
        return out

    def _sample(
        self,
        logits: torch.Tensor,
        info: SamplingBatchInfo,
        positions: torch.Tensor,
        return_logprob: bool,
    ) -> SamplerOutput:
        logprobs = None
        if info.is_all_greedy:
            next_ids = greedy_argmax(logits)
            if return_logprob:
                logprobs = torch.log_softmax(logits, dim=-1)
            return SamplerOutput(next_ids, logprobs)
        scaled = logits / info.temperatures
        use_fi = (
            self.use_flashinfer
            and logits.is_cuda
            and not info.has_seeds
            and flashinfer_module_ready(self.flashinfer_build)
        )
        fi = flashinfer_sampling() if use_fi else None
        filtered = info.need_top_k or info.need_top_p or info.need_min_p
        if fi is not None and not filtered and not return_logprob:
            # Plain temperature sampling: one Gumbel-max pass over the scaled logits instead
            # of a softmax pass plus the rejection sampler's passes over [B, V] probabilities.
            next_ids = fi.sampling_from_logits(scaled).long()
        else:
            probs = torch.softmax(scaled, dim=-1)
            if return_logprob:
                # SGLang takes log(probs) clamped to the dtype's min, so a banned token (-inf
                # logit) reports a finite -3.4e38 here, but -inf (null in JSON) when all greedy.
                logprobs = torch.log_softmax(scaled, dim=-1).clamp_(
                    min=torch.finfo(scaled.dtype).min
                )
            if fi is not None and not info.need_min_p:
                next_ids = fi.top_k_top_p_sampling_from_probs(
                    probs, info.top_ks.int(), info.top_ps, filter_apply_order="joint"
                ).long()
            else:
                next_ids = self._draw(filter_probs(probs, info), info, positions)
        if info.has_greedy_rows:
            next_ids = torch.where(info.top_ks <= 1, greedy_argmax(logits), next_ids)
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
