"""BERT encoders: BertModel (embeddings), BertForSequenceClassification (cross-encoder scores).

The shared encoder (XLM-RoBERTa reuses it, models/xlm_roberta.py) is the classic post-LayerNorm
transformer: embeddings = LayerNorm(word + absolute position + token type), then per layer
h = LayerNorm(h + attn(h)); h = LayerNorm(h + W2 act(W1 h)). Attention is bidirectional
(RadixAttention ENCODER_ONLY), so a request is always one whole extend: encoder classes set
`supports_prefix_reuse = False` and the scheduler neither shares radix prefixes nor chunks
their prompts (layers/pooler.py states the contract).

Token types (segment ids) come from `ForwardBatch.token_type_ids` (one per extend token, set
for text pairs such as a rerank's (query, document)); without them every token is type 0.

Pooling, as SGLang 0.5.4's models: BertModel pools LAST with normalization unless the model
directory's sentence-transformers config says otherwise (ModelConfig.pooling);
BertForSequenceClassification takes BERT's pooler (dense + tanh over the first token) and its
classifier, SGLang's CrossEncodingPooler, giving one score row per request (squeezed to one
number per request when num_labels is 1).

Linear layers are tensor-parallel (QKV and W1 column-parallel, the output projections
row-parallel); embeddings, LayerNorms and the heads are replicated.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
from torch import nn

from mini_sglang.layers.activation import get_act_fn
from mini_sglang.layers.linear import ColumnParallelLinear, QKVParallelLinear, RowParallelLinear
from mini_sglang.layers.pooler import EmbeddingPoolerOutput, Pooler, PoolingType
from mini_sglang.layers.radix_attention import AttentionType, RadixAttention
from mini_sglang.layers.vocab_parallel_embedding import VocabParallelEmbedding
from mini_sglang.models.weight_loading import load_checkpoint_weights

if TYPE_CHECKING:
    from mini_sglang.model_executor.forward_batch_info import ForwardBatch


class BertEmbedding(nn.Module):
    """LayerNorm(word + position + token type embeddings) for the extend tokens."""

    def __init__(self, config) -> None:
        super().__init__()
        kind = getattr(config, "position_embedding_type", None) or "absolute"
        if kind != "absolute":
            raise ValueError(f"Only 'absolute' position_embedding_type is supported, got {kind}")
        hidden = config.hidden_size
        self.word_embeddings = VocabParallelEmbedding(config.vocab_size, hidden)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, hidden)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, hidden)
        self.LayerNorm = nn.LayerNorm(hidden, eps=config.layer_norm_eps)

    def position_ids(
        self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch
    ) -> torch.Tensor:
        """Rows of the position table for each token: its position in its sequence."""
        return positions

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch
    ) -> torch.Tensor:
        token_types = fb.token_type_ids
        if token_types is None:
            token_types = torch.zeros_like(input_ids)
        hidden = (
            self.word_embeddings(input_ids)
            + self.position_embeddings(self.position_ids(input_ids, positions, fb))
            + self.token_type_embeddings(token_types)
        )
        return self.LayerNorm(hidden)


class BertSelfAttention(nn.Module):
    def __init__(self, config, layer_id: int) -> None:
        super().__init__()
        heads = config.num_attention_heads
        head_dim = config.hidden_size // heads
        self.qkv_proj = QKVParallelLinear(config.hidden_size, head_dim, heads, heads, bias=True)
        self.q_size = self.qkv_proj.num_heads * head_dim
        self.attn = RadixAttention(
            self.qkv_proj.num_heads,
            head_dim,
            head_dim**-0.5,
            self.qkv_proj.num_kv_heads,
            layer_id,
            attn_type=AttentionType.ENCODER_ONLY,
        )

    def forward(self, hidden: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q, k, v = self.qkv_proj(hidden).split([self.q_size] * 3, dim=-1)
        return self.attn(q, k, v, fb)


class BertAddNorm(nn.Module):
    """LayerNorm(residual + dense(x)): BERT's attention-output and output sublayers."""

    def __init__(self, in_size: int, hidden: int, eps: float) -> None:
        super().__init__()
        self.dense = RowParallelLinear(in_size, hidden, bias=True)
        self.LayerNorm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dense(x) + residual)


class BertAttention(nn.Module):
    def __init__(self, config, layer_id: int) -> None:
        super().__init__()
        self.self_attn = BertSelfAttention(config, layer_id)
        self.output = BertAddNorm(config.hidden_size, config.hidden_size, config.layer_norm_eps)

    def forward(self, hidden: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        return self.output(self.self_attn(hidden, fb), hidden)


class BertIntermediate(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.dense = ColumnParallelLinear(config.hidden_size, config.intermediate_size, bias=True)
        self.act = get_act_fn(config.hidden_act)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.act(self.dense(hidden))


class BertLayer(nn.Module):
    def __init__(self, config, layer_id: int) -> None:
        super().__init__()
        self.attention = BertAttention(config, layer_id)
        self.intermediate = BertIntermediate(config)
        self.output = BertAddNorm(
            config.intermediate_size, config.hidden_size, config.layer_norm_eps
        )

    def forward(self, hidden: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        hidden = self.attention(hidden, fb)
        return self.output(self.intermediate(hidden), hidden)


class BertEncoder(nn.Module):
    def __init__(self, config) -> None:
        super().__init__()
        self.layer = nn.ModuleList(BertLayer(config, i) for i in range(config.num_hidden_layers))

    def forward(self, hidden: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        for layer in self.layer:
            hidden = layer(hidden, fb)
        return hidden


class BertPooler(nn.Module):
    """tanh(dense(first token)) of each request: BERT's pooled output, [batch, hidden]."""

    def __init__(self, config) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def forward(self, hidden: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        return torch.tanh(self.dense(hidden[fb.extend_start_loc.long()]))


def cross_encoder_activation(config) -> nn.Module:
    """SGLang's get_cross_encoder_activation_function: the sentence-transformers
    CrossEncoder's `sbert_ce_default_activation_function` (a torch.nn.modules class) when the
    config names one, else identity (bge-reranker's raw logits)."""
    name = getattr(config, "sbert_ce_default_activation_function", None)
    if not name:
        return nn.Identity()
    prefix = "torch.nn.modules."
    if not name.startswith(prefix):
        raise ValueError(f"Cross-encoder activation must be a {prefix}* class, got {name!r}")
    return getattr(torch.nn, name.rsplit(".", 1)[-1])()


def scores_output(logits: torch.Tensor, activation: nn.Module) -> EmbeddingPoolerOutput:
    """A cross-encoder's output: activation(logits) [batch, num_labels], squeezed to [batch]
    when there is one label (SGLang's CrossEncodingPooler)."""
    return EmbeddingPoolerOutput(embeddings=activation(logits).squeeze(-1))


# checkpoint name fragment -> (fused parameter fragment, shard id), as the decoders' mapping
ENCODER_STACKED_PARAMS: list[tuple[str, str, str | int]] = [
    ("qkv_proj", "query", "q"),
    ("qkv_proj", "key", "k"),
    ("qkv_proj", "value", "v"),
]


class EncoderWeightsMixin:
    """Checkpoint loading shared by the encoders: HF names -> this module tree.

    `.attention.self.` becomes `.attention.self_attn.`, `.attention.output.dense` stays, and
    query / key / value load into the fused qkv_proj as shards q / k / v. `checkpoint_prefix`
    is the HF base model's attribute ("bert", "roberta"): stripped where the class holds the
    encoder directly, kept where it holds it under that name. Tensors for parts a class has
    no parameter for (an unused pooler, position_ids buffers) are skipped; a parameter no
    tensor filled raises ValueError."""

    checkpoint_prefix = ""
    holds_base_as_attribute = False

    def _param_name(self, name: str) -> str:
        prefix = self.checkpoint_prefix + "."
        if self.holds_base_as_attribute:
            if not name.startswith(prefix) and name.split(".")[0] in ("embeddings", "encoder"):
                name = prefix + name
        elif name.startswith(prefix):
            name = name[len(prefix) :]
        return name.replace(".attention.self.", ".attention.self_attn.")

    def load_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], strict: bool = True
    ) -> None:
        renamed = ((self._param_name(name), tensor) for name, tensor in weights)
        load_checkpoint_weights(self, renamed, ENCODER_STACKED_PARAMS, False, strict)  # type: ignore[arg-type]


class BertModel(EncoderWeightsMixin, nn.Module):
    """Sentence embeddings from a BERT encoder (one pooled row per request)."""

    supports_prefix_reuse = False
    checkpoint_prefix = "bert"
    default_pooling = (PoolingType.LAST, True)  # SGLang 0.5.4's BertModel
    embedding_cls = BertEmbedding

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config
        self.embeddings = self.embedding_cls(config)
        self.encoder = BertEncoder(config)
        self.pooler = Pooler(*self.default_pooling)

    def encode(
        self, input_ids: torch.Tensor, positions: torch.Tensor, fb: ForwardBatch
    ) -> torch.Tensor:
        """The last layer's hidden states [tokens, hidden] of the extend tokens."""
        return self.encoder(self.embeddings(input_ids, positions, fb), fb)

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        fb: ForwardBatch,
        get_embedding: bool = True,
    ) -> EmbeddingPoolerOutput:
        return self.pooler(self.encode(input_ids, positions, fb), fb)


class EncoderCrossEncoder(EncoderWeightsMixin, nn.Module):
    """A cross-encoder: one relevance score row per (query, document) request. Subclasses
    hold their encoder model (with `encode`) under `checkpoint_prefix` and map its hidden
    states to logits [batch, num_labels] in `head`; the config's activation then applies
    (scores_output)."""

    supports_prefix_reuse = False
    holds_base_as_attribute = True

    def __init__(self, config) -> None:
        super().__init__()
        self.config = config
        self.activation = cross_encoder_activation(config)

    def head(self, hidden: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        raise NotImplementedError

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        fb: ForwardBatch,
        get_embedding: bool = True,
    ) -> EmbeddingPoolerOutput:
        hidden = getattr(self, self.checkpoint_prefix).encode(input_ids, positions, fb)
        return scores_output(self.head(hidden, fb), self.activation)


class BertForSequenceClassification(EncoderCrossEncoder):
    """A BERT cross-encoder: BERT's pooler, then the classifier."""

    checkpoint_prefix = "bert"

    def __init__(self, config) -> None:
        super().__init__(config)
        self.bert = BertModel(config)
        self.bert.pooler = BertPooler(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def head(self, hidden: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        return self.classifier(self.bert.pooler(hidden, fb))
