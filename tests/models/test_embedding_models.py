"""Embedding and score models through the real in-process Scheduler vs transformers.

Tiny random configs (hidden 64, 2 layers, vocab 1000) of each served embedding
architecture are saved with transformers; a batch of inputs of different lengths runs
through forward_batch_embedding with and without chunked prefill (and the radix cache
sharing a prefix), and every row must match transformers plus the documented pooling
within 1e-4 (float32): Qwen3 / Llama CausalLM with --is-embedding (last token,
normalized), MistralModel (a bare decoder checkpoint), sentence-transformers' mean pooling
from modules.json, and the score heads (LlamaForSequenceClassification,
Qwen2/Qwen3ForSequenceClassification, Qwen2ForRewardModel). KV is all free afterwards.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from mini_sglang.managers.io_struct.generate import TokenizedEmbeddingReqInput
from mini_sglang.sampling.sampling_params import SamplingParams
from tests.conftest import (
    assert_memory_all_free,
    make_scheduler,
    randomize_norms_and_biases,
    tiny_config,
)

VOCAB = 1000
# Input lengths of one batch; the first two share a 20-token prefix (a radix cache hit).
LENGTHS = [23, 41, 5, 1, 17]
TOL = 1e-4


def _inputs() -> list[list[int]]:
    gen = torch.Generator().manual_seed(3)
    prefix = torch.randint(10, VOCAB, (20,), generator=gen).tolist()
    out = []
    for i, n in enumerate(LENGTHS):
        ids = torch.randint(10, VOCAB, (n,), generator=gen).tolist()
        out.append(prefix + ids[: n - 20] if i < 2 else ids)
    return out


# Shapes for a bf16 GPU run (tests/gpu/test_gpu_embedding.py): flashinfer needs head_dim
# >= 64, and HF's initializer_range keeps bf16's own error small enough to compare (see
# tests/gpu/test_gpu_correctness.py _build_gpu_tiny_model); norms and biases perturbed mildly.
GPU_SHAPE: dict = dict(hidden_size=256, intermediate_size=512, head_dim=64, initializer_range=0.02)
GPU_PERTURB: dict = dict(bias_std=0.05, norm_std=0.05)


def _save(model, path: Path, perturb: dict | None = None) -> None:
    randomize_norms_and_biases(model, **(perturb or {}))
    model.eval()
    model.save_pretrained(str(path), safe_serialization=True)


def _last_norm(hidden: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(hidden[-1], dim=0)


def _build(kind: str, path: Path, gpu: bool = False):
    """Save the tiny model of `kind` (GPU_SHAPE's sizes with `gpu`); return (server kwargs,
    reference fn(ids) -> vector)."""
    import transformers as tf

    torch.manual_seed(0)
    shape = GPU_SHAPE if gpu else {}
    perturb = GPU_PERTURB if gpu else None
    hidden = shape.get("hidden_size", 64)

    def config(arch: str, **kw):
        return tiny_config(arch, VOCAB, eos_token_id=2, **kw, **shape)

    if kind in ("qwen3_causal", "llama_causal"):
        arch = "qwen3" if kind == "qwen3_causal" else "llama"
        model = tf.AutoModelForCausalLM.from_config(config(arch))
        _save(model, path, perturb)
        return {"is_embedding": True}, lambda h, m=model: _last_norm(h(m.model))
    if kind == "mistral":
        cfg = tf.MistralConfig(
            vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
            initializer_range=0.3, rms_norm_eps=1e-6, eos_token_id=2,
        )  # fmt: skip
        for key, value in shape.items():
            setattr(cfg, key, value)
        model = tf.MistralModel(cfg)
        _save(model, path, perturb)  # architectures ["MistralModel"], names without "model."
        return {}, lambda h, m=model: _last_norm(h(m))
    if kind == "qwen3_mean":
        model = tf.AutoModelForCausalLM.from_config(config("qwen3"))
        _save(model, path, perturb)
        modules = [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
        ]  # fmt: skip
        (path / "modules.json").write_text(json.dumps(modules))
        (path / "1_Pooling").mkdir()
        pooling = {"word_embedding_dimension": hidden, "pooling_mode_mean_tokens": True}
        (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
        return {"is_embedding": True}, lambda h, m=model: torch.nn.functional.normalize(
            h(m.model).mean(0), dim=0
        )
    if kind == "qwen2_reward":
        # transformers has no Qwen2ForRewardModel: a Qwen2 decoder plus the two-layer head.
        model = tf.AutoModelForCausalLM.from_config(config("qwen2"))
        randomize_norms_and_biases(model, **(perturb or {}))
        head = torch.nn.Sequential(
            torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)
        )
        state = {k: v for k, v in model.state_dict().items() if not k.startswith("lm_head")}
        state.update({f"score.{k}": v for k, v in head.state_dict().items()})
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in state.items()}, str(path / "model.safetensors"))
        model.config.architectures = ["Qwen2ForRewardModel"]
        model.config.save_pretrained(str(path))
        return {}, lambda h, m=model: head(h(m.model)[-1])
    arch, cls = {
        "llama_cls": ("llama", tf.LlamaForSequenceClassification),
        "qwen2_cls": ("qwen2", tf.Qwen2ForSequenceClassification),
        "qwen3_cls": ("qwen3", tf.Qwen3ForSequenceClassification),
    }[kind]
    model = cls(config(arch, num_labels=3, pad_token_id=None))
    _save(model, path, perturb)
    return {}, lambda h, m=model: m.score(h(m.model)[-1])


KINDS = [
    "qwen3_causal",
    "llama_causal",
    "mistral",
    "qwen3_mean",
    "llama_cls",
    "qwen2_cls",
    "qwen3_cls",
    "qwen2_reward",
]


def run_embeddings(sched, prompts: list[list[int]]) -> list:
    """Submit one embedding request per prompt (rids r0, r1, ...) to the in-process
    scheduler and run it until idle; returns the output messages these requests produced."""
    start = len(sched.test_outputs)
    for i, ids in enumerate(prompts):
        sp = SamplingParams(max_new_tokens=0)
        sp.normalize(None)
        sched.add_request(TokenizedEmbeddingReqInput(f"r{i}", "", ids, sp))
    sched.run_until_idle()
    return sched.test_outputs[start:]


@pytest.mark.parametrize("kind", KINDS)
@torch.no_grad()
def test_embeddings_match_transformers(kind: str, tmp_path: Path) -> None:
    server_kw, reference = _build(kind, tmp_path)
    prompts = _inputs()
    expected = []
    for ids in prompts:
        run = lambda m, ids=ids: m(torch.tensor([ids])).last_hidden_state[0]  # noqa: E731
        expected.append(reference(run).float())
    for chunk in (None, 8):
        sched = make_scheduler(
            str(tmp_path), skip_tokenizer_init=True, chunked_prefill_size=chunk, **server_kw
        )
        assert not sched.model_config.is_generation
        got = {}
        for msg in run_embeddings(sched, prompts):
            for rid, emb, reason, n in zip(
                msg.rids, msg.embeddings, msg.finished_reasons, msg.prompt_tokens
            ):
                assert reason == {"type": "length", "length": 0}
                assert n == len(prompts[int(rid[1:])])
                got[rid] = torch.tensor(emb)
        assert sorted(got) == [f"r{i}" for i in range(len(prompts))]
        for i, ref in enumerate(expected):
            torch.testing.assert_close(got[f"r{i}"], ref, atol=TOL, rtol=0)
            if kind in ("qwen3_causal", "llama_causal", "mistral", "qwen3_mean"):
                assert abs(got[f"r{i}"].norm().item() - 1.0) < 1e-5
        assert_memory_all_free(sched)


def test_abort_and_bad_input_hold_nothing(tmp_path: Path) -> None:
    """An aborted queued embedding request and an over-long one end with their reason and
    no embedding; a chunked one aborted mid-prefill too; nothing stays held."""
    from mini_sglang.managers.io_struct.control import AbortReq

    server_kw, _ = _build("qwen3_causal", tmp_path)
    sched = make_scheduler(
        str(tmp_path), skip_tokenizer_init=True, chunked_prefill_size=8, **server_kw
    )

    def add(rid: str, ids: list[int]) -> None:
        sp = SamplingParams(max_new_tokens=0)
        sp.normalize(None)
        sched.add_request(TokenizedEmbeddingReqInput(rid, "", ids, sp))

    add("queued", [5] * 10)
    sched.process_input_requests([AbortReq(rid="queued")])
    add("long", [5] * 600)  # over the 512-token context
    add("chunked", list(range(10, 60)))
    sched.run_step()  # its first chunk runs
    sched.process_input_requests([AbortReq(rid="chunked")])
    sched.run_until_idle()
    out = {
        rid: (emb, reason)
        for msg in sched.test_outputs
        for rid, emb, reason in zip(msg.rids, msg.embeddings, msg.finished_reasons)
    }
    assert sorted(out) == ["chunked", "long", "queued"]
    assert all(emb is None and reason["type"] == "abort" for emb, reason in out.values())
    assert out["long"][1]["status_code"] == 400 and "context length" in out["long"][1]["message"]
    assert_memory_all_free(sched)


@pytest.mark.parametrize("truncate", [False, True])
def test_context_length_check_or_truncation(tmp_path: Path, truncate: bool) -> None:
    """The TokenizerManager refuses an input as long as the context (512) with SGLang's
    message, or with --allow-auto-truncate keeps its first 511 ids; an empty one is refused."""
    from mini_sglang.managers.io_struct.generate import EmbeddingReqInput
    from mini_sglang.managers.tokenizer_manager import TokenizerManager
    from mini_sglang.port_args import PortArgs
    from mini_sglang.server_args import ServerArgs

    _build("qwen3_causal", tmp_path)
    args = ServerArgs(
        model_path=str(tmp_path),
        device="cpu",
        skip_tokenizer_init=True,
        is_embedding=True,
        allow_auto_truncate=truncate,
    )
    tm = TokenizerManager(args, PortArgs.init_new(args))
    try:
        obj = EmbeddingReqInput(input_ids=list(range(10, 522)))
        obj.normalize_batch_and_arguments()
        if truncate:
            assert tm._tokenize_embedding(obj).input_ids == list(range(10, 521))
        else:
            with pytest.raises(ValueError, match=r"The input \(512 tokens\) is longer"):
                tm._tokenize_embedding(obj)
        empty = EmbeddingReqInput(text="")
        empty.normalize_batch_and_arguments()
        with pytest.raises(ValueError, match="skip-tokenizer-init"):
            tm._tokenize_embedding(empty)
    finally:  # no server process: its sockets must not keep the interpreter from exiting
        for sock in (tm.send_to_scheduler, tm.recv_from_detokenizer):
            sock.close(linger=0)
