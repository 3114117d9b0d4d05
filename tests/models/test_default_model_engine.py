"""Real-sized models through the in-process Scheduler.

1. The embedded default model (SmolLM2-135M-Instruct): greedy tokens identical to
   transformers, where transformers reads the original GGUF with its own dequantizer and
   q/k un-permutation, while mini-sglang loads the converted default directory. So this
   also checks the conversion end to end.
2. A Qwen3-0.6B-shaped config with --load-format dummy: prefill and decode stay finite.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from tests.conftest import (
    assert_memory_all_free,
    collect_outputs,
    hf_greedy,
    make_req,
    make_scheduler,
    qwen_tokenizer_dir,
    run_prompts,
)

MAX_NEW_TOKENS = 16

PROMPTS = [
    "The capital of France is",
    "中文：北京是中国的首都。请继续：",
    "Emoji test 😀🚀 means",
    "def add(a, b):\n    return",
    "List three colors: 1.",
]
# Through the model's ChatML template: the answers are short, so these end on <|im_end|>.
CHAT_QUESTIONS = ["What is the capital of France?", "What is 2+2? Answer with a number only."]


@pytest.fixture(scope="module")
def gguf_reference():
    """(transformers model, tokenizer) built from the GGUF by transformers' own GGUF code.

    from_pretrained(gguf_file=...) needs `accelerate` (not a dependency), so the model is
    built from transformers' GGUF config and filled by load_gguf_checkpoint, which is what
    that path runs."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    from mini_sglang.model_loader.default_model import find_default_gguf

    gguf = find_default_gguf()
    folder, name = os.path.dirname(gguf), os.path.basename(gguf)
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(gguf, return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(
        {k: v.float() for k, v in tensors.items()}, strict=False
    )
    assert missing == ["lm_head.weight"] and not unexpected  # tied to the embeddings
    model.tie_weights()
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    return model, tokenizer


@pytest.fixture(scope="module")
def default_scheduler():
    from mini_sglang.model_loader.default_model import resolve_default_model_path

    return make_scheduler(resolve_default_model_path())


def test_default_model_greedy_matches_transformers(gguf_reference, default_scheduler) -> None:
    hf_model, tokenizer = gguf_reference
    texts = PROMPTS + [
        default_scheduler.tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
        )
        for q in CHAT_QUESTIONS
    ]
    prompts = [tokenizer.encode(t) for t in texts]
    # The converted directory's tokenizer must agree with the GGUF's.
    assert prompts == [default_scheduler.tokenizer.encode(t) for t in texts]
    refs = [hf_greedy(hf_model, p, MAX_NEW_TOKENS, ignore_eos=False) for p in prompts]
    results = run_prompts(default_scheduler, prompts, MAX_NEW_TOKENS, ignore_eos=False)
    for i, (res, ref) in enumerate(zip(results, refs)):
        assert res.output_ids == ref, (
            f"prompt {i}: mini-sglang {tokenizer.decode(res.output_ids)!r} != "
            f"transformers {tokenizer.decode(ref)!r}"
        )
        if len(ref) < MAX_NEW_TOKENS:  # transformers stopped on EOS: so must we
            assert ref[-1] == tokenizer.eos_token_id
            assert res.finish_reason == {"type": "stop", "matched": ref[-1]}
        else:
            assert res.finish_reason == {"type": "length", "length": MAX_NEW_TOKENS}
    assert sum(len(r) < MAX_NEW_TOKENS for r in refs) >= 2, "the chat prompts should end on EOS"
    assert tokenizer.decode(results[0].output_ids).startswith(" Paris")
    assert_memory_all_free(default_scheduler)


def test_default_model_json_schema_answer_parses(default_scheduler) -> None:
    """A trained model under a json_schema (SGLang's default free whitespace): the answer is
    JSON with the required keys and types, ended by the grammar with the model's EOS."""
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    tok = default_scheduler.tokenizer
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Give the name and age of a famous scientist as JSON."}],
        tokenize=False,
        add_generation_prompt=True,
    )
    req = make_req("json", tok.encode(text), 48, ignore_eos=False)
    req.sampling_params.json_schema = json.dumps(schema)
    start = len(default_scheduler.test_outputs)
    default_scheduler.add_request(req)
    default_scheduler.run_until_idle()
    (result,) = collect_outputs(default_scheduler.test_outputs[start:]).values()
    assert result.finish_reason["type"] == "stop", result
    answer = json.loads(tok.decode(result.output_ids, skip_special_tokens=True))
    assert isinstance(answer["name"], str) and type(answer["age"]) is int, answer
    assert_memory_all_free(default_scheduler)


# ---- Qwen3-0.6B shape, dummy weights -------------------------------------------------------
# Exactly the benchmark architecture of benchmarks/models/qwen3-0.6b/config.json.
QWEN3_0_6B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "num_hidden_layers": 28,
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 40960,
    "eos_token_id": 151645,
    "bos_token_id": 151643,
    "hidden_act": "silu",
    "attention_bias": False,
    "torch_dtype": "bfloat16",
}


def test_qwen3_0_6b_dummy_prefill_and_decode_are_finite(tmp_path: Path) -> None:
    """~600M float32 parameters on CPU: two short prompts, four decode steps."""
    (tmp_path / "config.json").write_text(json.dumps(QWEN3_0_6B))
    for f in os.listdir(qwen_tokenizer_dir()):
        shutil.copy(os.path.join(qwen_tokenizer_dir(), f), tmp_path / f)
    # A small KV pool: 4096 tokens of this shape would be ~0.9 GiB.
    sched = make_scheduler(str(tmp_path), load_format="dummy", max_total_tokens=128)
    cfg = sched.model_config
    assert (cfg.num_hidden_layers, cfg.head_dim, cfg.vocab_size) == (28, 128, 151936)
    assert cfg.dtype == torch.float32  # --dtype auto on CPU
    prompts = [sched.tokenizer.encode("Hello, my name is"), sched.tokenizer.encode("1 2 3")]
    for i, ids in enumerate(prompts):
        sched.add_request(make_req(f"q{i}", ids, max_new_tokens=5, ignore_eos=True))
    # Watch each forward's logits on their way from the worker to the scheduler.
    seen: list[tuple[str, torch.Tensor]] = []
    forward = sched.tp_worker.forward_batch_generation

    def recording_forward(batch):
        result = forward(batch)
        seen.append((batch.forward_mode.name, result.logits_output.next_token_logits.clone()))
        return result

    sched.tp_worker.forward_batch_generation = recording_forward
    sched.run_until_idle()
    for mode, logits in seen:
        assert logits.shape[1] == 151936
        assert torch.isfinite(logits).all(), f"non-finite logits in a {mode} step"
    modes = [mode for mode, _ in seen]
    # One prefill, then >= 4 decodes (with overlap scheduling one more decode is launched
    # before the step that finished the requests has been processed).
    assert modes[0] == "EXTEND" and set(modes[1:]) == {"DECODE"} and len(modes) >= 5, modes
    for i in range(2):
        req_outputs = [o for o in sched.test_outputs if f"q{i}" in o.rids]
        assert req_outputs[-1].finished_reasons[-1] == {"type": "length", "length": 5}
    assert_memory_all_free(sched)
