"""Sampler, SamplingBatchInfo and PenalizerOrchestrator on known logits (CPU, no model).

Exact where the result is a function of the logits (penalties, logit_bias, greedy, the
reported logprobs); statistical where it is a draw (top-k / top-p / min-p over many seeded
samples: the sampled set equals the allowed support, frequencies follow the renormalised
probabilities). Seeded draws must not depend on the batch companions.
"""

from __future__ import annotations

import math

import pytest
import torch

from mini_sglang.layers.sampler import Sampler
from mini_sglang.managers.req import Req
from mini_sglang.sampling.penaltylib.orchestrator import PenalizerOrchestrator
from mini_sglang.sampling.sampling_batch_info import NO_SEED, SamplingBatchInfo
from mini_sglang.sampling.sampling_params import SamplingParams

V = 8
EOS = 7


def make_req(
    prompt: list[int], output: list[int] | None = None, seed: int = NO_SEED, **sp_kw
) -> Req:
    """A real scheduler Req with normalised sampling params."""
    sp = SamplingParams(**sp_kw)
    sp.normalize(None)
    req = Req("r", "", prompt, sp, eos_token_ids={EOS}, vocab_size=V, sampling_seed=seed)
    req.output_ids = list(output or [])
    return req


def info_for(reqs: list[Req]) -> SamplingBatchInfo:
    return SamplingBatchInfo.from_reqs(reqs, V, "cpu")


def sample(reqs: list[Req], logits: torch.Tensor, positions=None, return_logprob=False):
    info = info_for(reqs)
    if positions is None:
        positions = torch.full((len(reqs),), 5, dtype=torch.int64)
    return Sampler()(logits.clone(), info, positions, return_logprob)


LOGITS = torch.tensor([2.0, -1.0, 0.5, 3.0, -2.0, 1.0, 0.0, 1.5])


# ---- penalties: exact values ------------------------------------------------------------
def test_frequency_and_presence_penalties_exact():
    req = make_req([0, 1], [3, 3, 5], frequency_penalty=0.5, presence_penalty=0.25)
    pen = PenalizerOrchestrator.from_reqs([req], V, "cpu")
    out = pen.apply(LOGITS[None].clone())[0]
    expected = LOGITS.clone()
    expected[3] -= 2 * 0.5 + 0.25  # generated twice
    expected[5] -= 1 * 0.5 + 0.25  # generated once
    # Prompt tokens 0 and 1 are not penalised by frequency / presence (outputs only).
    assert torch.equal(out, expected)


def test_repetition_penalty_divides_positive_multiplies_negative_over_prompt_and_output():
    req = make_req([0, 1], [3, 4], repetition_penalty=2.0)
    pen = PenalizerOrchestrator.from_reqs([req], V, "cpu")
    out = pen.apply(LOGITS[None].clone())[0]
    expected = LOGITS.clone()
    expected[0] = 2.0 / 2  # prompt, positive
    expected[1] = -1.0 * 2  # prompt, negative
    expected[3] = 3.0 / 2  # output, positive
    expected[4] = -2.0 * 2  # output, negative
    assert torch.equal(out, expected)


def test_cumulate_updates_counts_and_seen():
    req = make_req([0], [], frequency_penalty=1.0, repetition_penalty=1.5)
    pen = PenalizerOrchestrator.from_reqs([req], V, "cpu")
    pen.cumulate(torch.tensor([6]))
    pen.cumulate(torch.tensor([6]))
    out = pen.apply(LOGITS[None].clone())[0]
    # Logit 0.0 for token 6: minus 2 * 1.0 = -2.0, then negative * 1.5 = -3.0.
    assert out[6].item() == pytest.approx(-3.0)
    assert out[0].item() == pytest.approx(2.0 / 1.5)


def test_min_new_tokens_masks_eos_and_stop_ids_until_reached():
    req = make_req([0], [], min_new_tokens=2, stop_token_ids=[3])
    pen = PenalizerOrchestrator.from_reqs([req], V, "cpu")
    for _ in range(2):
        out = pen.apply(LOGITS[None].clone())[0]
        assert out[EOS] == -math.inf and out[3] == -math.inf
        assert torch.equal(out[:3], LOGITS[:3])
        pen.cumulate(torch.tensor([0]))
    assert torch.equal(pen.apply(LOGITS[None].clone())[0], LOGITS)


def test_min_new_tokens_masks_eos_even_with_ignore_eos():
    # SGLang 0.5.4's MinNewTokens penalizer ignores ignore_eos.
    req = make_req([0], [], min_new_tokens=1, stop_token_ids=[3], ignore_eos=True)
    out = PenalizerOrchestrator.from_reqs([req], V, "cpu").apply(LOGITS[None].clone())[0]
    assert out[3] == -math.inf and out[EOS] == -math.inf


def test_no_penalty_means_no_orchestrator():
    assert PenalizerOrchestrator.from_reqs([make_req([0]), make_req([1])], V, "cpu") is None


def test_merge_with_a_batch_without_penalties_keeps_in_flight_counts():
    """Rows of the penalised side keep counts that only live in the tensors (a token sampled
    in a step whose results were not processed yet), the other side gets neutral rows."""
    plain = make_req([0])
    penal = make_req([0], [], frequency_penalty=1.0)
    a, b = info_for([plain]), info_for([penal])
    assert a.penalizer is None and b.penalizer is not None
    b.penalizer.cumulate(torch.tensor([3]))  # penal.output_ids is still [] (in flight)
    a.merge(b, [plain, penal])
    out = a.apply_logits_bias(torch.stack([LOGITS, LOGITS]))
    assert torch.equal(out[0], LOGITS)
    assert out[1, 3].item() == pytest.approx(3.0 - 1.0)
    a.filter(torch.tensor([1]))
    assert a.apply_logits_bias(LOGITS[None].clone())[0, 3].item() == pytest.approx(2.0)


def test_filter_and_concat_follow_rows():
    r1 = make_req([0], [1], frequency_penalty=1.0)
    r2 = make_req([0], [2], presence_penalty=2.0)
    info = info_for([r1, r2])
    info.merge(info_for([make_req([0], [4], repetition_penalty=2.0)]), [r1, r2, r1])
    out = info.apply_logits_bias(torch.stack([LOGITS] * 3))
    assert out[0, 1].item() == pytest.approx(-2.0)
    assert out[1, 2].item() == pytest.approx(-1.5)
    assert out[2, 4].item() == pytest.approx(-4.0) and out[2, 0].item() == pytest.approx(1.0)
    info.filter(torch.tensor([2, 0]))
    out = info.apply_logits_bias(torch.stack([LOGITS] * 2))
    assert out[0, 4].item() == pytest.approx(-4.0) and out[1, 1].item() == pytest.approx(-2.0)


# ---- logit_bias, greedy, logprobs ---------------------------------------------------------
def test_logit_bias_forces_a_token_greedy_and_sampled():
    greedy = make_req([0], temperature=0.0, logit_bias={"6": 100.0})
    hot = make_req([0], temperature=1.5, logit_bias={"6": 100.0})
    plain = make_req([0], temperature=0.0)
    out = sample([greedy, hot, plain], torch.stack([LOGITS] * 3))
    assert out.next_token_ids.tolist() == [6, 6, 3]


def test_logit_bias_negative_infinity_bans_the_argmax():
    req = make_req([0], temperature=0.0, logit_bias={"3": -math.inf})
    assert sample([req], LOGITS[None]).next_token_ids.tolist() == [0]


def test_greedy_logprobs_are_log_softmax_of_biased_logits():
    req = make_req([0], temperature=0.0, logit_bias={"2": 1.0})
    out = sample([req], LOGITS[None], return_logprob=True)
    biased = LOGITS.clone()
    biased[2] += 1.0
    assert torch.allclose(out.logprobs[0], torch.log_softmax(biased, -1), atol=1e-6)


def test_sampled_logprobs_are_after_temperature_and_penalties_before_top_k():
    # SGLang 0.5.4: logprobs = log(softmax(penalised / T)), not renormalised by top-k/p.
    req = make_req([0], [3], temperature=0.5, top_k=2, frequency_penalty=1.0)
    greedy = make_req([0], temperature=0.0)
    out = sample([req, greedy], torch.stack([LOGITS, LOGITS]), return_logprob=True)
    penalised = LOGITS.clone()
    penalised[3] -= 1.0
    assert torch.allclose(out.logprobs[0], torch.log_softmax(penalised / 0.5, -1), atol=1e-6)
    assert torch.allclose(out.logprobs[1], torch.log_softmax(LOGITS, -1), atol=1e-6)
    assert out.next_token_ids[1].item() == 3  # the greedy row in a sampled batch


def test_banned_token_logprob_is_clamped_when_sampling():
    req = make_req([0], [], temperature=0.7, min_new_tokens=1)
    out = sample([req], LOGITS[None], return_logprob=True)
    assert out.logprobs[0, EOS].item() == torch.finfo(torch.float32).min
    assert out.next_token_ids.item() != EOS


# ---- statistical: top-k / top-p / min-p ---------------------------------------------------
PROBS = torch.tensor([0.30, 0.20, 0.15, 0.12, 0.10, 0.07, 0.04, 0.02])
N_DRAWS = 4000


def draw_many(**sp_kw) -> torch.Tensor:
    """N_DRAWS seeded draws from PROBS (one row per seed, same logits), as token counts."""
    reqs = [make_req([0], seed=s, **sp_kw) for s in range(N_DRAWS)]
    logits = torch.log(PROBS)[None].repeat(N_DRAWS, 1)
    ids = sample(reqs, logits).next_token_ids
    return torch.bincount(ids, minlength=V).float()


@pytest.mark.parametrize(
    "sp_kw, support",
    [
        ({}, list(range(V))),
        ({"top_k": 3}, [0, 1, 2]),
        ({"top_p": 0.6}, [0, 1, 2]),  # 0.30 + 0.20 < 0.6: the token crossing it (2) stays
        ({"top_p": 0.45}, [0, 1]),
        ({"min_p": 0.45}, [0, 1, 2]),  # p >= 0.45 * 0.30 = 0.135
        ({"top_k": 4, "min_p": 0.6}, [0, 1]),  # threshold on the unfiltered max: 0.18
        ({"top_k": 1}, [0]),
    ],
)
def test_filters_sample_exactly_the_allowed_support(sp_kw, support):
    # The reference renormalised distribution (PROBS restricted to `support`).
    expected = torch.zeros(V)
    expected[support] = PROBS[support] / PROBS[support].sum()
    counts = draw_many(**sp_kw)
    sampled = sorted(torch.nonzero(counts).view(-1).tolist())
    assert sampled == support
    freqs = counts / counts.sum()
    # 4000 draws: the standard error of a p=0.3 frequency is ~0.007; 0.03 is > 4 sigma.
    assert torch.allclose(freqs, expected, atol=0.03), (freqs, expected)


def test_temperature_sharpens_the_distribution():
    counts = draw_many(temperature=0.5)
    expected = torch.softmax(torch.log(PROBS) / 0.5, -1)
    assert torch.allclose(counts / counts.sum(), expected, atol=0.03)


# ---- seeds ------------------------------------------------------------------------------
def test_same_seed_same_token_whatever_the_batch_companions():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, V, generator=gen)
    positions = torch.tensor([3, 9, 4, 7, 3, 11])
    reqs = [make_req([0], seed=s, temperature=1.0) for s in (11, 12, 13, 14, 11, 15)]
    full = sample(reqs, logits, positions).next_token_ids
    for i in range(6):
        alone = sample([reqs[i]], logits[i : i + 1], positions[i : i + 1]).next_token_ids
        assert alone.item() == full[i].item()
    # Different companions (an unseeded row and a top-k row) change nothing either.
    mixed = [make_req([0]), reqs[2], make_req([0], seed=99, top_k=2)]
    rows = torch.stack([logits[0], logits[2], logits[5]])
    out = sample(mixed, rows, torch.tensor([1, 4, 2])).next_token_ids
    assert out[1].item() == full[2].item()


def test_seeded_draws_vary_with_position_and_seed():
    logits = torch.zeros(1, V)  # uniform
    req = make_req([0], seed=5)
    by_pos = {sample([req], logits, torch.tensor([p])).next_token_ids.item() for p in range(40)}
    by_seed = {
        sample([make_req([0], seed=s)], logits, torch.tensor([7])).next_token_ids.item()
        for s in range(40)
    }
    assert len(by_pos) > 4 and len(by_seed) > 4


def test_unseeded_rows_are_random():
    logits = torch.zeros(200, V)
    ids = sample([make_req([0]) for _ in range(200)], logits).next_token_ids
    assert len(set(ids.tolist())) == V


@pytest.mark.parametrize("chunks", [4, 16, 128])
def test_argmax_by_chunks_matches_argmax_including_ties(chunks):
    from mini_sglang.layers.sampler import argmax_by_chunks

    torch.manual_seed(0)
    # few distinct values, so most rows have their maximum in several places and chunks
    logits = torch.randint(0, 5, (9, 128 * 12)).float()
    logits[3, 7] = 5.0
    logits[3, 900] = 5.0  # a tie across chunks: the first wins
    logits[4] = -torch.inf
    logits[4, 1000] = 0.0
    assert torch.equal(argmax_by_chunks(logits, chunks), logits.argmax(dim=-1))
    assert argmax_by_chunks(logits, chunks)[3].item() == 7
