"""Encoder models (BERT, XLM-RoBERTa, their cross-encoders) against transformers.

Each tiny random model is saved once (module scope) with transformers, loaded by
mini-sglang's loader, and run as one EXTEND batch of sequences of different lengths through
the torch_native attention backend and a real KV pool. Pooled embeddings (with the class's
default pooling, SGLang's) and cross-encoder scores must match transformers' outputs for each
sequence alone within 1e-4 (float32); text pairs carry token types into BERT.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from tests.tiny_encoders import build_tiny_encoder, extend_batch, hf_reference, tokenized_inputs

ARCHS = [
    "BertModel",
    "BertForSequenceClassification",
    "XLMRobertaModel",
    "XLMRobertaForSequenceClassification",
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """arch -> (model dir, transformers model), each built once."""
    out = {}
    for i, arch in enumerate(ARCHS):
        path = tmp_path_factory.mktemp(arch)
        out[arch] = (str(path), build_tiny_encoder(arch, path, seed=i))
    return out


def _load(path: str, **overrides):
    """(ModelConfig, model) for `path`; `overrides` go into config.json's values."""
    import json

    from mini_sglang.model_config import ModelConfig
    from mini_sglang.model_loader.loader import get_model
    from mini_sglang.server_args import ServerArgs

    args = ServerArgs(model_path=path, device="cpu", json_model_override_args=json.dumps(overrides))
    config = ModelConfig.from_server_args(args)
    return config, get_model(config, "auto", "cpu")


def _run(model, config, seqs: list[list[int]], token_types: list[list[int]] | None):
    """The model's output for one EXTEND batch of whole sequences (torch_native attention)."""
    from mini_sglang.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from mini_sglang.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from mini_sglang.model_executor.forward_batch_info import ForwardBatch

    n = sum(len(s) for s in seqs)
    r2t = ReqToTokenPool(len(seqs) + 1, max(len(s) for s in seqs), "cpu")
    heads, layers = config.num_key_value_heads, config.num_hidden_layers
    kv = MHATokenToKVPool(n + 1, torch.float32, heads, config.head_dim, layers, "cpu")
    batch = extend_batch(r2t.req_to_token, seqs, token_types)
    backend = TorchNativeAttnBackend(SimpleNamespace(device=torch.device("cpu")))
    fb = ForwardBatch.init_new(batch, r2t, kv, backend, "cpu")
    backend.init_forward_metadata(fb)
    return model(fb.input_ids, fb.positions, fb, get_embedding=True).embeddings


@pytest.mark.parametrize("arch", ARCHS)
def test_encoder_matches_transformers(saved, arch):
    path, hf = saved[arch]
    config, model = _load(path)
    assert not model.supports_prefix_reuse
    # The longest input (context_len - 1 tokens) must fit the position table; XLM-R's
    # positions start at pad_token_id + 1 = 2 (130 rows: 128 tokens).
    assert config.context_len == (128 if arch.startswith("Bert") else 129)
    seqs, types = tokenized_inputs(arch)
    bert = arch.startswith("Bert")
    if arch == "BertForSequenceClassification":
        assert any(1 in t for t in types)  # pairs really carry segment 1
    got = _run(model, config, seqs, types if bert else None)
    assert got.shape[0] == len(seqs) and got.dtype == torch.float32
    for i, (ids, tt) in enumerate(zip(seqs, types)):
        ref = hf_reference(hf, arch, ids, tt)
        torch.testing.assert_close(got[i], ref, atol=1e-4, rtol=1e-4)


@torch.no_grad()
def test_scheduler_runs_encoder_inputs_whole_and_alone(saved, tmp_path):
    """Through the in-process scheduler with the radix cache on and 8-token chunks: rerank
    pairs that share their query (a radix prefix a decoder would reuse) and are longer than
    a chunk still get transformers' scores, token types included; a BertModel directory with
    sentence-transformers' mean pooling pools every token. Nothing stays cached or held."""
    from mini_sglang.managers.io_struct.generate import TokenizedEmbeddingReqInput
    from mini_sglang.sampling.sampling_params import SamplingParams
    from tests.conftest import assert_memory_all_free, make_scheduler
    from tests.tiny_encoders import build_tokenizer, write_sentence_transformers_pooling

    tok = build_tokenizer("bert")
    query = "what is the capital of france?"
    docs = ["paris is the capital.", "the cat sat on the mat.", "a river"]
    pairs = [tok(query, d, return_token_type_ids=True) for d in docs]
    mean_dir = tmp_path / "bert_mean"
    mean_hf = build_tiny_encoder("BertModel", mean_dir, seed=5)
    write_sentence_transformers_pooling(mean_dir, "mean", normalize=True)
    cases = [
        (saved["BertForSequenceClassification"][0], saved["BertForSequenceClassification"][1]),
        (str(mean_dir), mean_hf),
    ]
    for path, hf in cases:
        sched = make_scheduler(path, chunked_prefill_size=8)
        assert not sched.model_config.is_generation
        for i, enc in enumerate(pairs):
            assert len(enc["input_ids"]) > 8
            sp = SamplingParams(max_new_tokens=0)
            sp.normalize(None)
            types = enc["token_type_ids"]
            req = TokenizedEmbeddingReqInput(
                f"r{i}", "", enc["input_ids"], sp, token_type_ids=types
            )
            sched.add_request(req)
        sched.run_until_idle()
        got = {
            rid: torch.tensor(emb)
            for msg in sched.test_outputs
            for rid, emb in zip(msg.rids, msg.embeddings)
        }
        for i, enc in enumerate(pairs):
            kw = {k: torch.tensor([enc[k]]) for k in ("input_ids", "token_type_ids")}
            if path == str(mean_dir):
                ref = F.normalize(hf(**kw).last_hidden_state[0].mean(0), dim=0)
            else:
                ref = hf(**kw).logits[0, 0]
            torch.testing.assert_close(got[f"r{i}"], ref, atol=1e-4, rtol=1e-4)
        assert_memory_all_free(sched)
        assert sched.stats.memory_accounting()["evictable"] == 0


def test_xlm_roberta_longest_input_fits_its_positions(saved):
    """An input of context_len - 1 tokens (the longest the server admits) reads the last
    row of XLM-R's offset position table and matches transformers."""
    path, hf = saved["XLMRobertaModel"]
    config, model = _load(path)
    ids = [0] + [5 + i % 40 for i in range(config.context_len - 3)] + [2]
    assert len(ids) == config.context_len - 1
    got = _run(model, config, [ids], None)
    ref = hf_reference(hf, "XLMRobertaModel", ids, [0] * len(ids))
    torch.testing.assert_close(got[0], ref, atol=1e-4, rtol=1e-4)


def test_cross_encoder_activation_from_config(saved):
    """sbert_ce_default_activation_function (a torch.nn.modules class; a key config.json
    lacks, set by --json-model-override-args) applies to the scores, as SGLang's
    CrossEncodingPooler does; a name outside torch.nn.modules is refused at load."""
    path, hf = saved["XLMRobertaForSequenceClassification"]
    name = "torch.nn.modules.activation.Sigmoid"
    config, model = _load(path, sbert_ce_default_activation_function=name)
    seqs, types = tokenized_inputs("XLMRobertaForSequenceClassification")
    got = _run(model, config, seqs, None)
    for i, (ids, tt) in enumerate(zip(seqs, types)):
        ref = hf_reference(hf, "XLMRobertaForSequenceClassification", ids, tt).sigmoid()
        torch.testing.assert_close(got[i], ref, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="torch.nn.modules"):
        _load(path, sbert_ce_default_activation_function="os.system")
