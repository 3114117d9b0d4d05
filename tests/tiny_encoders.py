"""Tiny random encoder models (BERT, XLM-RoBERTa) and a tiny WordPiece tokenizer for them.

The tokenizer is built in code (no download): lowercase letters as word starts and `##`
continuations plus a few whole words, so any lowercase ASCII text tokenizes. BERT-style
templates give pairs `[CLS] a [SEP] b [SEP]` with token types 0 / 1; RoBERTa-style ones
`<s> a </s></s> b </s>` with no token types (as XLMRobertaTokenizerFast).
"""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

import torch

from tests.conftest import randomize_norms_and_biases

WORDS = [
    "the",
    "a",
    "of",
    "to",
    "and",
    "is",
    "in",
    "what",
    "paris",
    "france",
    "capital",
    "city",
    "river",
    "cat",
    "dog",
    "sat",
    "on",
    "mat",
]
# role -> token, in vocabulary order (ids 0..4): BERT's [PAD] = 0, XLM-R's <pad> = 1.
SPECIALS = {
    "bert": {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]", "mask": "[MASK]"},
    "roberta": {"cls": "<s>", "pad": "<pad>", "sep": "</s>", "unk": "<unk>", "mask": "<mask>"},
}


def _vocab(specials: list[str]) -> dict[str, int]:
    pieces = specials + list(string.ascii_lowercase)
    pieces += ["##" + c for c in string.ascii_lowercase] + WORDS + list(string.punctuation)
    return {p: i for i, p in enumerate(dict.fromkeys(pieces))}


def build_tokenizer(style: str):
    """A PreTrainedTokenizerFast in `style` "bert" or "roberta" (see the module doc)."""
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece
    from transformers import PreTrainedTokenizerFast

    bert = style == "bert"
    roles = SPECIALS[style]
    vocab = _vocab(list(roles.values()))
    cls, pad, sep, unk, mask = (roles[r] for r in ("cls", "pad", "sep", "unk", "mask"))
    tok = Tokenizer(WordPiece(vocab, unk_token=unk))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    if bert:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{cls} $A {sep}",
            pair=f"{cls} $A {sep} $B:1 {sep}:1",
            special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])],
        )
    else:
        tok.post_processor = processors.RobertaProcessing((sep, vocab[sep]), (cls, vocab[cls]))
    names = ["input_ids", "token_type_ids", "attention_mask"] if bert else None
    names = names or ["input_ids", "attention_mask"]
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        cls_token=cls,
        sep_token=sep,
        pad_token=pad,
        unk_token=unk,
        mask_token=mask,
        bos_token=None if bert else cls,
        eos_token=None if bert else sep,
        model_max_length=512,
        model_input_names=names,
    )


def build_tiny_encoder(arch: str, out_dir: str | Path, seed: int = 0, **overrides: Any):
    """Save a tiny random `arch` (an HF architecture name: BertModel,
    BertForSequenceClassification, XLMRobertaModel, XLMRobertaForSequenceClassification) with
    its tokenizer to out_dir; return the transformers model (float32, eval)."""
    import transformers

    bert = arch.startswith("Bert")
    tokenizer = build_tokenizer("bert" if bert else "roberta")
    common: dict[str, Any] = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        initializer_range=0.2,
        num_labels=1,
        hidden_act="gelu",
    )
    if bert:
        cfg = transformers.BertConfig(
            **common, max_position_embeddings=128, type_vocab_size=2, pad_token_id=0
        )
    else:
        cfg = transformers.XLMRobertaConfig(
            **common,
            max_position_embeddings=130,
            type_vocab_size=1,
            pad_token_id=1,
            bos_token_id=0,
            eos_token_id=2,
        )
    for key, value in overrides.items():
        setattr(cfg, key, value)
    cfg.architectures = [arch]
    torch.manual_seed(seed)
    model = getattr(transformers, arch)(cfg).float().eval()
    # LayerNorm weights start at 1 and biases at 0, which would hide a model ignoring them
    randomize_norms_and_biases(model, seed, bias_std=0.2, norm_key="LayerNorm")
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    return model


def write_sentence_transformers_pooling(out_dir: str | Path, mode: str, normalize: bool) -> None:
    """sentence-transformers' modules.json + 1_Pooling/config.json (`mode`: cls, mean or
    lasttoken) and, with `normalize`, a Normalize module."""
    out = Path(out_dir)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {
            "idx": 1,
            "name": "1",
            "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling",
        },
    ]
    if normalize:
        modules.append(
            {
                "idx": 2,
                "name": "2",
                "path": "2_Normalize",
                "type": "sentence_transformers.models.Normalize",
            }
        )
    (out / "modules.json").write_text(json.dumps(modules))
    (out / "1_Pooling").mkdir(exist_ok=True)
    keys = {"cls": "cls_token", "mean": "mean_tokens", "lasttoken": "lasttoken"}
    cfg = {f"pooling_mode_{k}": k == keys[mode] for k in keys.values()}
    (out / "1_Pooling" / "config.json").write_text(
        json.dumps({"word_embedding_dimension": 64, **cfg})
    )


# ---- running them ----------------------------------------------------------------------------
TEXT_PAIRS = [
    ("what is the capital of france?", "paris is the capital of france."),
    ("cat", "the cat sat on the mat, and the dog sat on the cat."),
    ("river", "a"),
]


def tokenized_inputs(arch: str) -> tuple[list[list[int]], list[list[int]]]:
    """(input ids, token types) of TEXT_PAIRS as `arch` reads them: pairs for a
    cross-encoder, the two texts joined for an embedding model."""
    tok = build_tokenizer("bert" if arch.startswith("Bert") else "roberta")
    if arch.endswith("ForSequenceClassification"):
        enc = [tok(q, d, return_token_type_ids=True) for q, d in TEXT_PAIRS]
    else:
        enc = [tok(q + " " + d, return_token_type_ids=True) for q, d in TEXT_PAIRS]
    return [e["input_ids"] for e in enc], [e["token_type_ids"] for e in enc]


def extend_batch(
    req_to_token: torch.Tensor, seqs: list[list[int]], token_types=None, page_size: int = 1
):
    """A ModelWorkerBatch running `seqs` as one EXTEND of whole sequences: request i in
    req_to_token row i + 1, its KV slots consecutive from a page boundary (page 0 unused;
    with page_size 1, slots 1 .. total tokens in order). Rows and slots are written."""
    from mini_sglang.model_executor.forward_batch_info import ForwardMode, ModelWorkerBatch

    lens = [len(s) for s in seqs]
    parts, page = [], 1
    for n in lens:
        parts.append(torch.arange(page * page_size, page * page_size + n))
        page += (n + page_size - 1) // page_size
    for i, part in enumerate(parts):
        req_to_token[i + 1, : len(part)] = part.to(req_to_token.device, torch.int32)
    return ModelWorkerBatch(
        forward_mode=ForwardMode.EXTEND,
        input_ids=torch.tensor(sum(seqs, [])),
        positions=torch.cat([torch.arange(n) for n in lens]),
        req_pool_indices=torch.arange(1, len(seqs) + 1),
        seq_lens=torch.tensor(lens),
        out_cache_loc=torch.cat(parts),
        extend_seq_lens=lens,
        extend_prefix_lens=[0] * len(lens),
        token_type_ids=torch.tensor(sum(token_types, [])) if token_types else None,
    )


@torch.no_grad()
def hf_reference(hf, arch: str, ids: list[int], token_types: list[int]) -> torch.Tensor:
    """What mini-sglang must give for one sequence: a cross-encoder's logits squeezed
    (SGLang's identity activation), or the last hidden state pooled as the class pools by
    default (SGLang's: BertModel LAST, XLMRobertaModel CLS) and L2-normalized."""
    dev = next(hf.parameters()).device
    kw = dict(input_ids=torch.tensor([ids], device=dev))
    kw["token_type_ids"] = torch.tensor([token_types], device=dev)
    if arch.endswith("ForSequenceClassification"):
        return hf(**kw).logits[0].squeeze(-1).float()
    hidden = hf(**kw).last_hidden_state[0].float()
    pooled = hidden[-1] if arch == "BertModel" else hidden[0]
    return torch.nn.functional.normalize(pooled, dim=-1)
