"""Tiny random Qwen3-MoE, Qwen2-MoE and Mixtral models: mini-sglang against transformers.

Each model is saved with `save_pretrained` (per-expert safetensors names, loaded through the
stacked expert mapping) and checked: prefill logits of every position within 1e-3 in float32,
and 32 greedy tokens identical to transformers' for prompts of different lengths that join
the running batch at different steps (continuous batching). The configs exercise what each
family must get right: Qwen3-MoE q/k norm and top-4 of 8 renormalised; Qwen2-MoE qkv bias,
the sigmoid-gated shared expert, top-2 not renormalised and a dense layer (mlp_only_layers);
Mixtral the block_sparse_moe / w1-w3 names and always-renormalised top-2 of 4.

Then the Qwen2-MoE model runs on two gloo ranks (CPU) started with --tp-size 2 --ep-size 2
(whole experts per rank), and again on the same ranks split by TP alone (every expert's
intermediate dimension split), and must give transformers' first 16 tokens both times.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from tests.conftest import (
    TINY_DECODER,
    assert_memory_all_free,
    hf_greedy,
    make_scheduler,
    randomize_norms_and_biases,
    run_prompts,
)

ARCHS = ["qwen3_moe", "qwen2_moe", "mixtral"]
MAX_NEW_TOKENS = 32
TP_TOKENS = 16  # per request in the two-rank runs (their start-up dominates the test)
LOGITS_ATOL = 1e-3
PROMPTS = [
    "Hello world, this is",
    "x",
    "The capital of France is Paris. The capital of Germany is Berlin. The capital of",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
]


def tiny_moe_config(arch: str, vocab_size: int):
    from transformers import MixtralConfig, Qwen2MoeConfig, Qwen3MoeConfig

    common: dict[str, Any] = dict(
        TINY_DECODER, vocab_size=vocab_size, tie_word_embeddings=True, rope_theta=1e6
    )
    if arch == "qwen3_moe":
        return Qwen3MoeConfig(
            **common, head_dim=32, intermediate_size=96, moe_intermediate_size=32,
            num_experts=8, num_experts_per_tok=4, norm_topk_prob=True,
        )  # fmt: skip
    if arch == "qwen2_moe":
        return Qwen2MoeConfig(
            **common, intermediate_size=96, moe_intermediate_size=32,
            shared_expert_intermediate_size=48, num_experts=8, num_experts_per_tok=2,
            norm_topk_prob=False, mlp_only_layers=[0],
        )  # fmt: skip
    return MixtralConfig(**common, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2)


@dataclass
class TinyMoe:
    arch: str
    path: str
    hf_model: Any
    prompts: list[list[int]]
    hf_outputs: list[list[int]]


def build_tiny_moe(arch: str, path, tokenizer) -> TinyMoe:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_moe_config(arch, len(tokenizer)))
    model = model.float().eval()
    randomize_norms_and_biases(model)
    model.save_pretrained(str(path), safe_serialization=True)
    tokenizer.save_pretrained(str(path))
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    outputs = [hf_greedy(model, p, MAX_NEW_TOKENS, ignore_eos=True) for p in prompts]
    for out in outputs:  # one repeated token would match almost any model
        assert len(out) == MAX_NEW_TOKENS and len(set(out)) >= 8, out
    return TinyMoe(arch, str(path), model, prompts, outputs)


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory, qwen_tokenizer) -> dict[str, TinyMoe]:
    """Each arch's model, built on first use and shared by the tests of this module."""

    class Cache(dict):
        def __missing__(self, arch: str) -> TinyMoe:
            path = tmp_path_factory.mktemp(arch)
            self[arch] = build_tiny_moe(arch, path, qwen_tokenizer)
            return self[arch]

    return Cache()


@pytest.fixture(params=ARCHS)
def tiny(request, tiny_models) -> TinyMoe:
    return tiny_models[request.param]


@torch.no_grad()
def test_prefill_logits_and_greedy_match_hf(tiny: TinyMoe) -> None:
    sched = make_scheduler(tiny.path)
    model = sched.tp_worker.model_runner.model
    blocks = [type(layer.mlp).__name__ for layer in model.model.layers]
    assert blocks == (
        ["LlamaMLP", "SparseMoeBlock"] if tiny.arch == "qwen2_moe" else ["SparseMoeBlock"] * 2
    )
    # Prefill: the logprob of every prompt token (logits row k - 1 at token k) and of the
    # first output token, against transformers' log_softmax.
    results = run_prompts(
        sched, tiny.prompts, MAX_NEW_TOKENS, return_logprob=True, logprob_start_len=0,
        stagger=lambda i: 3 * i,
    )  # fmt: skip
    for i, (res, prompt, ref_out) in enumerate(zip(results, tiny.prompts, tiny.hf_outputs)):
        assert res.output_ids == ref_out, f"prompt {i}: {res.output_ids} != HF {ref_out}"
        full = torch.tensor([prompt + ref_out])
        ref = torch.log_softmax(tiny.hf_model(full).logits[0].float(), dim=-1)
        ref_in = [ref[k - 1, prompt[k]].item() for k in range(1, len(prompt))]
        ref_gen = [ref[len(prompt) - 1 + k, t].item() for k, t in enumerate(ref_out)]
        assert res.input_logprobs[1:] == pytest.approx(ref_in, abs=LOGITS_ATOL), i
        assert res.output_logprobs == pytest.approx(ref_gen, abs=LOGITS_ATOL), i
    assert_memory_all_free(sched)


# ---- the expert distribution record -----------------------------------------------------
@torch.no_grad()
def test_expert_distribution_record_counts_hf_routing(tiny_models, tmp_path, monkeypatch) -> None:
    """--expert-distribution-recorder-mode stat through the scheduler's handler: the dump's
    per-pass counts, summed, are transformers' top-k choices over every token the model ran
    (prompt and all but the last output token; no overlap, whose extra step for a finished
    request would run one more), the dense layer's row stays zero, each pass counts k per
    token, and a dump resets the record."""
    from mini_sglang.managers.io_struct.control import ExpertDistributionReq
    from mini_sglang.managers.io_struct.control import ExpertDistributionReqType as Action

    tiny = tiny_models["qwen2_moe"]  # layer 0 dense, top-2 of 8
    monkeypatch.setenv("SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR", str(tmp_path / "records"))
    sched = make_scheduler(
        tiny.path,
        expert_distribution_recorder_mode="stat",
        expert_distribution_recorder_buffer_size=-1,
        disable_overlap_schedule=True,
    )

    def call(action: Action):
        out = sched.expert_distribution(ExpertDistributionReq(action))
        assert out.success, out.message
        return out.message

    # Before the start and after the stop: not recorded. (Not a recorded prompt: the radix
    # cache would spare the recorded prefill its cached tokens.)
    run_prompts(sched, tiny.prompts[3:], 4)
    call(Action.START_RECORD)
    prompts = tiny.prompts[:3]
    results = run_prompts(sched, prompts, 8, stagger=lambda i: 3 * i)
    call(Action.STOP_RECORD)
    run_prompts(sched, tiny.prompts[3:], 4, rid_prefix="after")
    path = call(Action.DUMP_RECORD)
    assert os.path.dirname(path) == str(tmp_path / "records")
    assert os.path.basename(path).startswith("expert_distribution_recorder_")
    record = torch.load(path)
    assert sorted(record) == ["average_utilization_rate_over_window", "logical_count", "rank"]
    count = record["logical_count"]
    assert count.dtype == torch.int32 and count.shape[1:] == (2, 8)

    want = torch.zeros(2, 8, dtype=torch.int64)
    for prompt, res in zip(prompts, results):
        ran = torch.tensor([prompt + res.output_ids[:-1]])
        (router_logits,) = tiny.hf_model(ran, output_router_logits=True).router_logits
        want[1] += torch.bincount(router_logits.topk(2, dim=-1).indices.reshape(-1), minlength=8)
    assert count.sum(0).tolist() == want.tolist()
    assert count[:, 0].sum() == 0  # the dense layer
    per_pass = count[:, 1].sum(1)
    assert (per_pass > 0).all() and (per_pass % 2 == 0).all()
    # The dump reset the record: a second one holds no pass.
    assert torch.load(call(Action.DUMP_RECORD))["logical_count"].shape[0] == 0
    assert_memory_all_free(sched)


@pytest.mark.parametrize("mode", ["per_pass", "per_token"])
@torch.no_grad()
def test_expert_distribution_detail_records_match_hf_routing(
    tiny_models, tmp_path, monkeypatch, mode
) -> None:
    """SGLang's detail modes: the dump is one file per rank holding a record per recorded
    forward pass. per_pass records each pass's counts; per_token each token's input id,
    position and top-k choices per layer (-1 for the dense layer and unused columns), so the
    records' tokens, in order, are the tokens the model ran, routed as transformers routes
    them."""
    from mini_sglang.managers.io_struct.control import ExpertDistributionReq
    from mini_sglang.managers.io_struct.control import ExpertDistributionReqType as Action

    tiny = tiny_models["qwen2_moe"]  # layer 0 dense, top-2 of 8
    monkeypatch.setenv("SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR", str(tmp_path / "records"))
    sched = make_scheduler(
        tiny.path, expert_distribution_recorder_mode=mode, disable_overlap_schedule=True
    )

    def call(action: Action):
        out = sched.expert_distribution(ExpertDistributionReq(action))
        assert out.success, out.message
        return out.message

    run_prompts(sched, tiny.prompts[3:], 4)  # before the start: not recorded
    call(Action.START_RECORD)
    prompts = tiny.prompts[:2]
    results = run_prompts(sched, prompts, 6, stagger=lambda i: 2 * i)
    call(Action.STOP_RECORD)
    path = call(Action.DUMP_RECORD)
    assert os.path.basename(path).startswith("expert_distribution_recorder_")
    assert path.endswith("_0.pt")  # the rank
    dump = torch.load(path)
    assert sorted(dump) == ["last_physical_to_logical_map", "records"]
    assert dump["last_physical_to_logical_map"].tolist() == [list(range(8))] * 2
    records = dump["records"]
    ids = [r["forward_pass_id"] for r in records]
    assert ids == list(range(ids[0], ids[0] + len(ids))) and ids[0] > 0
    assert all(r["rank"] == 0 and r["gatherer_key"] == "primary" for r in records)

    want = torch.zeros(2, 8, dtype=torch.int64)
    routes = {}  # (token, position) -> transformers' top-2 choices of layer 1 there
    for prompt, res in zip(prompts, results):
        ran = torch.tensor([prompt + res.output_ids[:-1]])
        (router_logits,) = tiny.hf_model(ran, output_router_logits=True).router_logits
        top = router_logits.topk(2, dim=-1).indices
        want[1] += torch.bincount(top.reshape(-1), minlength=8)
        for pos, (tok, choice) in enumerate(zip(ran[0].tolist(), top.tolist())):
            routes[(tok, pos)] = routes.get((tok, pos), []) + [sorted(choice)]
    if mode == "per_pass":
        counts = torch.stack([r["global_physical_count"] for r in records])
        assert counts.dtype == torch.int32 and counts.shape[1:] == (2, 8)
        assert counts.sum(0).tolist() == want.tolist()
        assert (counts[:, 1].sum(1) > 0).all() and counts[:, 0].sum() == 0
    else:
        ran_tokens = 0
        for r in records:
            topk = r["topk_ids_of_layer"]
            n = len(r["input_ids"])
            assert topk.dtype == torch.int32 and topk.shape == (2, n, 8)
            assert len(r["positions"]) == n and r["misc_objects"] == []
            assert r["forward_mode"] in (1, 2)  # SGLang's ForwardMode EXTEND, DECODE
            assert (r["extend_seq_lens"] is not None) == (r["forward_mode"] == 1)
            assert (topk[0] == -1).all() and (topk[1, :, 2:] == -1).all()
            for tok, pos, choice in zip(r["input_ids"], r["positions"], topk[1, :, :2].tolist()):
                assert sorted(choice) in routes[(tok, pos)], (tok, pos)
            ran_tokens += n
        assert ran_tokens == int(want[1].sum()) // 2
    # The dump reset the record.
    assert torch.load(call(Action.DUMP_RECORD))["records"] == []
    assert_memory_all_free(sched)


# ---- tp=2 and ep=2 on two gloo ranks -------------------------------------------------------
def _rank_generate(server_args, prompts: list[list[int]], tp_rank: int) -> dict[int, list]:
    """On one TP rank: TP_TOKENS greedy tokens per prompt with the experts split as the
    rank's start-up set it from server_args (--ep-size 2: whole experts per rank), then by
    TP alone (ep 1), each through its own Scheduler (every rank gets the same requests, as
    bench_one_batch's ranks do)."""
    from mini_sglang.distributed.parallel_state import get_moe_ep_size, set_expert_parallel_size
    from mini_sglang.managers.scheduler import Scheduler

    assert get_moe_ep_size() == server_args.ep_size == 2  # the rank's start-up path
    tokens = {}
    for ep in (2, 1):
        set_expert_parallel_size(ep)
        outputs: list = []
        args = dataclasses.replace(server_args, ep_size=ep)
        sched = Scheduler(args, tp_rank=tp_rank, send_to_detokenizer=outputs.append)
        sched.test_outputs = outputs
        moe = sched.tp_worker.model_runner.model.model.layers[1].mlp.experts
        assert (moe.num_local_experts, moe.intermediate_per_partition) == (
            (8, 16) if ep == 1 else (4, 32)
        )
        tokens[ep] = [r.output_ids for r in run_prompts(sched, prompts, TP_TOKENS)]
        del sched
    return tokens


def test_tp2_and_ep2_match_hf(tiny_models) -> None:
    from mini_sglang.benchmark.tp_group import run_tp_group
    from mini_sglang.server_args import ServerArgs

    tiny = tiny_models["qwen2_moe"]
    args = ServerArgs(
        model_path=tiny.path, device="cpu", tp_size=2, ep_size=2, max_total_tokens=1024,
        max_running_requests=8, random_seed=0, skip_tokenizer_init=True,
    )  # fmt: skip
    # Two prompts of different lengths (a batch of two rows) keep the two-rank runs short.
    tokens = run_tp_group(_rank_generate, args, tiny.prompts[:2])
    expected = [out[:TP_TOKENS] for out in tiny.hf_outputs[:2]]
    assert tokens[1] == expected
    assert tokens[2] == expected
