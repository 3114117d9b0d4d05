"""Encoder models (BERT, XLM-RoBERTa, their cross-encoders) against transformers.

Each tiny random model is saved once (module scope) with transformers, loaded by
mini-sglang's loader, and run as one EXTEND batch of sequences of different lengths through
the torch_native attention backend and a real KV pool. Pooled embeddings (with the class's
default pooling, SGLang's) and cross-encoder scores must match transformers' outputs for each
sequence alone within 1e-4 (float32); text pairs carry token types.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from tests.tiny_encoders import build_tiny_encoder, build_tokenizer

ARCHS = [
    "BertModel",
    "BertForSequenceClassification",
    "XLMRobertaModel",
    "XLMRobertaForSequenceClassification",
]
TEXTS = [
    ("what is the capital of france?", "paris is the capital of france."),
    ("cat", "the cat sat on the mat, and the dog sat on the cat."),
    ("river", "a"),
]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """arch -> (model dir, transformers model), each built once."""
    out = {}
    for i, arch in enumerate(ARCHS):
        path = tmp_path_factory.mktemp(arch)
        out[arch] = (str(path), build_tiny_encoder(arch, path, seed=i))
    return out


def _load(path: str):
    from mini_sglang.model_config import ModelConfig
    from mini_sglang.model_loader.loader import get_model
    from mini_sglang.server_args import ServerArgs

    config = ModelConfig.from_server_args(ServerArgs(model_path=path, device="cpu"))
    return config, get_model(config, "auto", "cpu")


def _run(model, config, seqs: list[list[int]], token_types: list[list[int]] | None):
    """The model's output for one EXTEND batch of whole sequences (torch_native attention)."""
    from mini_sglang.layers.attention.torch_native_backend import TorchNativeAttnBackend
    from mini_sglang.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from mini_sglang.model_executor.forward_batch_info import (
        ForwardBatch,
        ForwardMode,
        ModelWorkerBatch,
    )

    lens = [len(s) for s in seqs]
    r2t = ReqToTokenPool(len(seqs) + 1, max(lens), "cpu")
    kv = MHATokenToKVPool(
        sum(lens) + 1,
        torch.float32,
        config.num_key_value_heads,
        config.head_dim,
        config.num_hidden_layers,
        "cpu",
    )
    slots = torch.arange(1, sum(lens) + 1)
    for i, part in enumerate(torch.split(slots, lens)):
        r2t.req_to_token[i + 1, : len(part)] = part.to(torch.int32)
    batch = ModelWorkerBatch(
        forward_mode=ForwardMode.EXTEND,
        input_ids=torch.tensor(sum(seqs, [])),
        positions=torch.cat([torch.arange(n) for n in lens]),
        req_pool_indices=torch.arange(1, len(seqs) + 1),
        seq_lens=torch.tensor(lens),
        out_cache_loc=slots,
        extend_seq_lens=lens,
        extend_prefix_lens=[0] * len(lens),
        token_type_ids=torch.tensor(sum(token_types, [])) if token_types else None,
    )
    backend = TorchNativeAttnBackend(SimpleNamespace(device=torch.device("cpu")))
    fb = ForwardBatch.init_new(batch, r2t, kv, backend, "cpu")
    backend.init_forward_metadata(fb)
    return model(fb.input_ids, fb.positions, fb, get_embedding=True).embeddings


@pytest.mark.parametrize("arch", ARCHS)
def test_encoder_matches_transformers(saved, arch):
    path, hf = saved[arch]
    config, model = _load(path)
    assert not model.supports_prefix_reuse
    tok = build_tokenizer("bert" if arch.startswith("Bert") else "roberta")
    cross = arch.endswith("ForSequenceClassification")
    if cross:
        enc = [tok(q, d, return_token_type_ids=True) for q, d in TEXTS]
    else:
        enc = [tok(q + " " + d, return_token_type_ids=True) for q, d in TEXTS]
    seqs = [e["input_ids"] for e in enc]
    types = [e["token_type_ids"] for e in enc]
    if arch.startswith("Bert") and cross:
        assert any(1 in t for t in types)  # pairs really carry segment 1
    got = _run(model, config, seqs, types if arch.startswith("Bert") else None)
    assert got.shape[0] == len(seqs) and got.dtype == torch.float32
    with torch.no_grad():
        for i, (ids, tt) in enumerate(zip(seqs, types)):
            kw = dict(input_ids=torch.tensor([ids]), token_type_ids=torch.tensor([tt]))
            if cross:
                ref = hf(**kw).logits[0].squeeze(-1)
            else:
                hidden = hf(**kw).last_hidden_state[0]
                pooled = hidden[-1] if arch == "BertModel" else hidden[0]  # LAST / CLS
                ref = F.normalize(pooled, dim=-1)
            torch.testing.assert_close(got[i], ref, atol=1e-4, rtol=1e-4)
