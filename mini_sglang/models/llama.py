"""LlamaForCausalLM, and the decoder that Qwen2 and Qwen3 reuse with two switches.

Differences between the three families are confined to the attention block:
Qwen2 adds a bias to q/k/v; Qwen3 normalises q and k per head (RMSNorm over head_dim)
before RoPE. Everything else (RMSNorm, SwiGLU MLP, RoPE, tied embeddings) is shared.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch
from torch import nn

from mini_sglang.distributed.parallel_state import get_tp_size
from mini_sglang.environ import envs
from mini_sglang.layers import fused_kernels, small_m_gemm
from mini_sglang.layers.activation import SiluAndMul
from mini_sglang.layers.attention.base_attn_backend import QKNormRope
from mini_sglang.layers.cpu_offload import offload_layers
from mini_sglang.layers.fused_kernels import fused_ops_available, qk_norm_rope_store
from mini_sglang.layers.kernels import pdl_enabled
from mini_sglang.layers.layernorm import RMSNorm
from mini_sglang.layers.linear import (
    MergedColumnParallelLinear,
    QKVParallelLinear,
    RowParallelLinear,
)
from mini_sglang.layers.logits_processor import LogitsProcessor, LogitsProcessorOutput
from mini_sglang.layers.pooler import EmbeddingPoolerOutput, Pooler, PoolingType
from mini_sglang.layers.radix_attention import RadixAttention
from mini_sglang.layers.rotary_embedding import RotaryEmbedding, get_rope
from mini_sglang.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
from mini_sglang.models.weight_loading import load_checkpoint_weights

if TYPE_CHECKING:
    from mini_sglang.layers.quantization.base import QuantizationConfig
    from mini_sglang.model_executor.forward_batch_info import ForwardBatch


def norms_in_gemvs(x: torch.Tensor) -> bool:
    """Whether the decoder runs LlamaDecoderLayer.forward_norms_in_gemvs for the embeddings x
    (decided once per forward): where our PDL-launched Triton kernels serve
    (fused_kernels.small_batch_pdl_ops), on one rank (with TP the residual add waits for the
    all-reduce), unless MINI_SGLANG_DISABLE_GEMV_NORM_FUSION=1. Every step of that dataflow
    falls back to an unfused kernel on its own, so this only decides where it pays."""
    return small_m_gemm.FUSE_NORM and get_tp_size() == 1 and fused_kernels.small_batch_pdl_ops(x)


def head_dim_of(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


class LlamaMLP(nn.Module):
    """The SwiGLU MLP; with reduce_results False the output is this rank's partial sum (the
    caller all-reduces it, e.g. together with a MoE block's experts)."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
        reduce_results: bool = True,
    ) -> None:
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(
            hidden_size,
            [intermediate_size] * 2,
            quant_config=quant_config,
            prefix=f"{prefix}.gate_up_proj",
        )
        self.down_proj = RowParallelLinear(
            intermediate_size,
            hidden_size,
            reduce_results=reduce_results,
            quant_config=quant_config,
            prefix=f"{prefix}.down_proj",
        )
        self.act_fn = SiluAndMul()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.gate_up_proj.forward_silu_mul(x, self.act_fn))

    def forward_add_(self, x: torch.Tensor, residual: torch.Tensor) -> None:
        """residual += forward(x), with the add in down_proj's epilogue where it can be."""
        self.down_proj.forward_add_(self.gate_up_proj.forward_silu_mul(x, self.act_fn), residual)

    def forward_after_add_rmsnorm(
        self, x: torch.Tensor, residual: torch.Tensor, norm: RMSNorm
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(forward(h), residual) for h, residual = norm(x, residual), gate_up_proj folding
        the norm into its input where its method can (forward_fused_add_rmsnorm), and then
        down_proj the SiLU-mul (forward_after_silu_mul)."""
        gate_up = self.gate_up_proj.forward_fused_add_rmsnorm(x, residual, norm)
        if gate_up is None:
            h, residual = norm(x, residual)
            return self.forward(h), residual
        return self.down_proj.forward_after_silu_mul(gate_up, self.act_fn), residual


class LlamaAttention(nn.Module):
    def __init__(
        self,
        config,
        layer_id: int,
        rotary_emb: RotaryEmbedding,
        qkv_bias: bool,
        qk_norm: bool,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        tp = get_tp_size()
        self.head_dim = head_dim_of(config)
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size,
            self.head_dim,
            config.num_attention_heads,
            config.num_key_value_heads,
            bias=qkv_bias,
            quant_config=quant_config,
            prefix=f"{prefix}.qkv_proj",
        )
        self.num_heads = self.qkv_proj.num_heads
        self.num_kv_heads = self.qkv_proj.num_kv_heads
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.o_proj = RowParallelLinear(
            config.num_attention_heads * self.head_dim,
            config.hidden_size,
            quant_config=quant_config,
            prefix=f"{prefix}.o_proj",
        )
        assert self.num_heads * tp == config.num_attention_heads
        self.rotary_emb = rotary_emb
        self.qk_norm = qk_norm
        self.use_fused = not envs.MINI_SGLANG_DISABLE_FUSED_QK_ROPE.get()
        if qk_norm:
            self.q_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.attn = RadixAttention(
            self.num_heads, self.head_dim, self.head_dim**-0.5, self.num_kv_heads, layer_id
        )

    def _qk_norm_rope(self) -> QKNormRope:
        if not self.qk_norm:
            return QKNormRope(self.rotary_emb.cos_sin_cache)
        return QKNormRope(
            self.rotary_emb.cos_sin_cache,
            self.q_norm.weight,
            self.k_norm.weight,
            self.q_norm.variance_epsilon,
        )

    def forward(
        self, positions: torch.Tensor, hidden: torch.Tensor, fb: ForwardBatch
    ) -> torch.Tensor:
        return self.forward_qkv(positions, self.qkv_proj(hidden), fb)

    def forward_qkv(
        self, positions: torch.Tensor, qkv: torch.Tensor, fb: ForwardBatch
    ) -> torch.Tensor:
        """forward() from the qkv projection's output."""
        return self.o_proj(self.attend(positions, qkv, fb))

    def attend(self, positions: torch.Tensor, qkv: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """Attention output [tokens, heads * head_dim] (before o_proj) from the qkv projection."""
        # M-RoPE extends carry per-token cos/sin rows that `positions` index (see
        # layers/rotary_embedding.py); decode never does: its positions are plain.
        cos_sin = self.rotary_emb.cos_sin_cache if fb.rope_cos_sin is None else fb.rope_cos_sin
        pool_ok = fb.token_to_kv_pool.triton_ok  # the fused kernels store into the pool
        if self.use_fused and pool_ok and fused_ops_available(qkv, self.head_dim):
            if fb.forward_mode.is_decode():
                out = fb.attn_backend.forward_decode_from_qkv(
                    qkv, positions, self._qk_norm_rope(), self.attn, fb
                )
                if out is not None:
                    return out
            # q/k norm + RoPE + K/V store in one kernel (see layers/fused_kernels.py).
            k_buf, v_buf = fb.token_to_kv_pool.get_kv_buffer(self.attn.layer_id)
            q = qk_norm_rope_store(
                qkv,
                positions,
                cos_sin,
                self.num_heads,
                self.num_kv_heads,
                self.head_dim,
                self.q_norm.weight if self.qk_norm else None,
                self.k_norm.weight if self.qk_norm else None,
                self.q_norm.variance_epsilon if self.qk_norm else 0.0,
                fb.out_cache_loc,
                k_buf,
                v_buf,
                pdl=pdl_enabled(qkv),
                k_scale=self.attn.k_scale,
                v_scale=self.attn.v_scale,
            )
            return self.attn(q, None, None, fb, save_kv_cache=False)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        if self.qk_norm:
            q = self.q_norm(q.reshape(-1, self.head_dim)).view(q.shape)
            k = self.k_norm(k.reshape(-1, self.head_dim)).view(k.shape)
        q, k = self.rotary_emb(positions, q, k, cos_sin)
        return self.attn(q, k, v, fb)


class LlamaDecoderLayer(nn.Module):
    # The methods LlamaModel calls; with --cpu-offload-gb each one runs on device copies of
    # the layer's host weights (layers/cpu_offload.py).
    offload_entry_points = ("forward", "forward_norms_in_gemvs")

    def __init__(
        self,
        config,
        layer_id: int,
        rotary_emb,
        qkv_bias: bool,
        qk_norm: bool,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "",
    ) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(
            config,
            layer_id,
            rotary_emb,
            qkv_bias,
            qk_norm,
            quant_config=quant_config,
            prefix=f"{prefix}.self_attn",
        )
        self.mlp = self.build_mlp(config, layer_id, quant_config, f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def build_mlp(
        self, config, layer_id: int, quant_config: QuantizationConfig | None, prefix: str
    ) -> nn.Module:
        """The feed-forward block: a module with forward(x) and forward_add_(x, residual)
        (residual += forward(x)); MoE decoders return a sparse block here."""
        return LlamaMLP(
            config.hidden_size, config.intermediate_size, quant_config=quant_config, prefix=prefix
        )

    def forward(
        self,
        positions: torch.Tensor,
        hidden: torch.Tensor,
        fb: ForwardBatch,
        residual: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden, residual) for the next layer, as SGLang's decoder layers: the next layer
        adds hidden into residual in its input add-RMSNorm."""
        attn, qkv = self.self_attn, None
        if residual is None:
            residual = hidden
            hidden = self.input_layernorm(hidden)
        else:
            qkv = attn.qkv_proj.forward_fused_add_rmsnorm(hidden, residual, self.input_layernorm)
            if qkv is None:
                hidden, residual = self.input_layernorm(hidden, residual)
        hidden = (
            attn(positions, hidden, fb) if qkv is None else attn.forward_qkv(positions, qkv, fb)
        )
        if isinstance(self.mlp, LlamaMLP):
            return self.mlp.forward_after_add_rmsnorm(
                hidden, residual, self.post_attention_layernorm
            )
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual

    def forward_norms_in_gemvs(
        self, positions: torch.Tensor, fb: ForwardBatch, residual: torch.Tensor
    ) -> torch.Tensor:
        """The layer where norms_in_gemvs holds; returns the residual stream, updated in place
        except where a step falls back to torch's RMSNorm (CPU), which adds out of place.
        qkv_proj normalises it inside its GEMV and down_proj adds into it in its epilogue, so
        the input add-RMSNorm kernel does not run. The post-attention one runs too where
        gate_up_proj cannot fold it (rmsnorm_silu_mul_fold: only a persistent GEMV, whose
        programs load the norm's weight once; in the grid GEMV every program loads it again,
        which cost more than it saved: Llama-3.1-8B batch 1, H100, 5.61 vs 5.48 ms/token;
        docs/performance/decode-gemv.md). Where it folds, o_proj adds into the residual in
        its epilogue and gate_up_proj normalises the residual, so no norm kernel runs."""
        attn, mlp = self.self_attn, self.mlp
        norm = self.post_attention_layernorm
        qkv = attn.qkv_proj.forward_rmsnorm(residual, self.input_layernorm)
        fold = None
        if isinstance(mlp, LlamaMLP):
            fold = mlp.gate_up_proj.rmsnorm_silu_mul_fold(residual, norm)
        if fold is None:
            hidden, residual = norm(attn.forward_qkv(positions, qkv, fb), residual)
            mlp.forward_add_(hidden, residual)
            return residual
        attn.o_proj.forward_add_(attn.attend(positions, qkv, fb), residual)
        mlp.down_proj.forward_add_(fold(residual), residual)
        return residual


class LlamaModel(nn.Module):
    def __init__(
        self,
        config,
        qkv_bias: bool,
        qk_norm: bool,
        quant_config: QuantizationConfig | None = None,
        prefix: str = "model",
        layer_cls: type[LlamaDecoderLayer] = LlamaDecoderLayer,
    ) -> None:
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size)
        # One cos/sin cache shared by every layer (a buffer: never offloaded).
        rotary_emb = get_rope(config, head_dim_of(config), config.max_position_embeddings)
        self.rotary_emb = rotary_emb
        # Each layer leaves the device as soon as it is built if --cpu-offload-gb has room.
        self.layers = nn.ModuleList(
            offload_layers(
                layer_cls(
                    config,
                    i,
                    rotary_emb,
                    qkv_bias,
                    qk_norm,
                    quant_config=quant_config,
                    prefix=f"{prefix}.layers.{i}",
                )
                for i in range(config.num_hidden_layers)
            )
        )
        self.norm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        fb: ForwardBatch,
        input_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final hidden states; `input_embeds` ([tokens, hidden], e.g. text and image rows
        merged by multimodal/mm_utils.py) replaces the embedding lookup of input_ids."""
        hidden = self.embed_tokens(input_ids) if input_embeds is None else input_embeds
        # The layers index the RoPE cache with these rows (other than the positions only
        # for longrope, see layers/rotary_embedding.py).
        positions = self.rotary_emb.cache_rows(positions)
        if fb.input_embeds is not None:  # an extend with input_embeds prompts (never decode)
            hidden[fb.input_embeds_loc] = fb.input_embeds.to(hidden.dtype)
        if norms_in_gemvs(hidden):
            residual = hidden  # the embeddings start the residual stream
            for layer in self.layers:
                residual = layer.forward_norms_in_gemvs(positions, fb, residual)
            return self.norm(residual)
        residual = None
        for layer in self.layers:
            hidden, residual = layer(positions, hidden, fb, residual)
        hidden, _ = self.norm(hidden, residual)
        return hidden


class LlamaForCausalLM(nn.Module):
    """The decoder with an LM head; with ``get_embedding`` (``--is-embedding``) the decoder's
    last-token state, L2-normalized (SGLang's pooler for Llama / Qwen3 embedders such as
    e5-mistral and Qwen3-Embedding; a sentence-transformers directory may override it)."""

    qkv_bias_default = False
    qk_norm = False
    # Causal: a request's states depend only on earlier tokens, so cached prefixes and
    # chunked prefill leave its last token's state unchanged (see layers/pooler.py).
    supports_prefix_reuse = True
    decoder_layer_cls = LlamaDecoderLayer
    # checkpoint name fragment -> (fused parameter fragment, shard id)
    stacked_params_mapping = [
        ("qkv_proj", "q_proj", "q"),
        ("qkv_proj", "k_proj", "k"),
        ("qkv_proj", "v_proj", "v"),
        ("gate_up_proj", "gate_proj", 0),
        ("gate_up_proj", "up_proj", 1),
    ]

    def __init__(self, config, quant_config: QuantizationConfig | None = None) -> None:
        """The LM head and the embeddings are never quantized (quant_config reaches the
        decoder's linear layers only)."""
        super().__init__()
        self.config = config
        qkv_bias = getattr(config, "attention_bias", self.qkv_bias_default) or self.qkv_bias_default
        self.model = LlamaModel(
            config,
            qkv_bias=qkv_bias,
            qk_norm=self.qk_norm,
            quant_config=quant_config,
            layer_cls=self.decoder_layer_cls,
        )
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if self.tie_word_embeddings:
            self.lm_head = self.model.embed_tokens
        else:
            self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size)
        self.logits_processor = LogitsProcessor(config.vocab_size)
        self.pooler = Pooler(PoolingType.LAST, normalize=True)

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        fb: ForwardBatch,
        get_embedding: bool = False,
    ) -> LogitsProcessorOutput | EmbeddingPoolerOutput:
        hidden = self.model(input_ids, positions, fb)
        if get_embedding:
            return self.pooler(hidden, fb)
        return self.logits_processor(hidden, self.lm_head, fb)

    def load_weights(
        self, weights: Iterable[tuple[str, torch.Tensor]], strict: bool = True
    ) -> None:
        """Copy checkpoint tensors (HF names) into the fused, sharded parameters.

        Raises ValueError naming the parameters that no checkpoint tensor filled, unless
        strict is False (online weight updates send a subset).
        """
        load_checkpoint_weights(
            self, weights, self.stacked_params_mapping, self.tie_word_embeddings, strict
        )
