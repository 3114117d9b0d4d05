"""ModelConfig: the facts about a model that the runtime needs, read from config.json.

The HF config is read with transformers' AutoConfig (GGUF files through the gguf loader),
then --json-model-override-args is applied to it key by key (apply_model_overrides);
context length (checked against --context-length), head counts and EOS ids are resolved
here once, and so is whether the model generates or embeds (`is_generation`, SGLang's
is_generation_model) and how an embedding model pools (`pooling`, from
sentence-transformers' files in the model directory).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field

import torch
from transformers import AutoConfig, GenerationConfig, PretrainedConfig

from mini_sglang.environ import envs
from mini_sglang.layers.pooler import PoolingConfig, read_sentence_transformers_pooling
from mini_sglang.layers.quantization.methods import QuantSpec, parse_quantization
from mini_sglang.model_loader.gguf_loader import gguf_config_dict
from mini_sglang.server_args_defaults import resolve_dtype as resolve_cli_dtype
from mini_sglang.utils.gguf_path import is_gguf_path

logger = logging.getLogger(__name__)

# Architectures that only embed or score (SGLang 0.5.4's is_generation_model list); any
# other architecture generates unless --is-embedding is given.
EMBEDDING_ARCHITECTURES = frozenset(
    {
        "LlamaEmbeddingModel",
        "MistralModel",
        "LlamaForSequenceClassification",
        "LlamaForSequenceClassificationWithNormal_Weights",
        "InternLM2ForRewardModel",
        "Qwen2ForRewardModel",
        "Qwen2ForSequenceClassification",
        "Qwen3ForSequenceClassification",
        "CLIPModel",
        "BertModel",
        "Contriever",
        "BertForSequenceClassification",
        "XLMRobertaModel",
        "XLMRobertaForSequenceClassification",
    }
)


def is_generation_model(architectures: list[str], is_embedding: bool = False) -> bool:
    """SGLang's rule: an embedding architecture never generates; others unless --is-embedding."""
    if any(arch in EMBEDDING_ARCHITECTURES for arch in architectures):
        return False
    return not is_embedding


def apply_model_overrides(hf: PretrainedConfig, overrides: dict) -> PretrainedConfig:
    """--json-model-override-args applied to a loaded config, as SGLang's get_config does
    (`config.update(overrides)`): every key is set on the top-level config, whether or not
    config.json has it. A dict given for a nested sub-config (e.g. `text_config`) updates
    only the keys it names, keeping the others. A rope dict (`rope_scaling` /
    `rope_parameters`) that names no `rope_theta` keeps the config's base, which in SGLang
    is a separate attribute the override leaves alone. Returns `hf`, changed in place."""
    for key, value in overrides.items():
        current = getattr(hf, key, None)
        if isinstance(current, PretrainedConfig) and isinstance(value, dict):
            merged = current.to_dict()
            merged.update(value)
            value = current.__class__(**merged)
        elif key in ("rope_scaling", "rope_parameters") and isinstance(value, dict):
            theta = (getattr(hf, "rope_parameters", None) or {}).get("rope_theta")
            theta = theta or getattr(hf, "rope_theta", None)
            if value.get("rope_theta") is None and theta is not None:
                value = {**value, "rope_theta": theta}
        setattr(hf, key, value)
    return hf


def _load_hf_config(model_path: str, trust_remote_code: bool) -> PretrainedConfig:
    if is_gguf_path(model_path):
        cfg = gguf_config_dict(model_path)
        model_type = cfg.pop("model_type")
        return AutoConfig.for_model(model_type, **cfg)
    if not os.path.isdir(model_path):
        raise ValueError(
            f"Model path {model_path!r} is not a local directory or .gguf file "
            "(mini-sglang cannot download from a model hub)."
        )
    if not os.path.exists(os.path.join(model_path, "config.json")):
        raise ValueError(f"Model directory {model_path!r} has no config.json")
    try:
        return AutoConfig.from_pretrained(model_path, trust_remote_code=trust_remote_code)
    except ValueError as e:
        raise ValueError(f"Cannot read the config of {model_path!r}: {e}") from e


def hf_quant_config(hf: PretrainedConfig) -> dict | None:
    """The checkpoint's quantization_config as a dict (None if it has none)."""
    cfg = getattr(hf, "quantization_config", None)
    if cfg is None:
        cfg = getattr(getattr(hf, "text_config", None), "quantization_config", None)
    if cfg is not None and not isinstance(cfg, dict):
        cfg = cfg.to_dict()
    return cfg


def resolve_dtype(
    dtype: str, config_dtype: torch.dtype | None, device: str, model_type: str = ""
) -> torch.dtype:
    """--dtype -> torch dtype. "auto" is float32 on CPU (ServerArgs already settles that),
    elsewhere SGLang's rule for the checkpoint's dtype (server_args_defaults.resolve_dtype)."""
    if dtype == "auto" and str(device).startswith("cpu"):
        return torch.float32
    return resolve_cli_dtype(dtype, config_dtype, model_type)


# config.json keys that state a model's context length, in SGLang's order of preference
# (some configs state two).
CONTEXT_LENGTH_KEYS = (
    "max_sequence_length",
    "seq_length",
    "max_seq_len",
    "model_max_length",
    "max_position_embeddings",
)


def derived_context_length(text_cfg: PretrainedConfig) -> int:
    """The context length the config states (SGLang's get_context_length): the first of
    CONTEXT_LENGTH_KEYS it has (2048 when none), times the rope scaling factor unless the
    rope parameters name original_max_position_embeddings or are llama3's (the stated
    length is then already the scaled one). RoBERTa numbers positions from
    pad_token_id + 1 (models/xlm_roberta.py), so its table serves pad_token_id fewer
    tokens than it has rows."""
    rope = getattr(text_cfg, "rope_scaling", None) or {}
    factor = rope.get("factor", 1) or 1
    if "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3":
        factor = 1
    derived = 2048
    for key in CONTEXT_LENGTH_KEYS:
        value = getattr(text_cfg, key, None)
        if value is not None:
            derived = int(factor * value)
            break
    if getattr(text_cfg, "model_type", "") in ("roberta", "xlm-roberta"):
        derived -= getattr(text_cfg, "pad_token_id", None) or 0
    return derived


def checked_context_length(requested: int | None, derived: int) -> int:
    """--context-length against the model's derived length, as SGLang's
    _derive_context_length: unset -> the derived length; at most the derived length -> as
    given; longer -> ValueError, unless SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN is set,
    which takes it with a warning (positions past the model's table or training length may
    give wrong outputs)."""
    if requested is None:
        return derived
    if requested > derived:
        msg = (
            f"Warning: User-specified context_length ({requested}) is greater than the derived "
            f"context_length ({derived}). This may lead to incorrect model outputs or CUDA "
            "errors. Note that the derived context_length may differ from "
            "max_position_embeddings in the model's config."
        )
        if not envs.SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN.get():
            raise ValueError(
                f"{msg} To allow overriding this maximum, set the env var "
                "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1"
            )
        logger.warning(msg)
    return requested


@dataclass
class ModelConfig:
    model_path: str
    hf_config: PretrainedConfig
    dtype: torch.dtype
    context_len: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    hidden_size: int
    vocab_size: int
    architectures: list[str]
    eos_token_ids: set[int] = field(default_factory=set)
    generation_defaults: dict = field(default_factory=dict)
    # False: an embedding / score model (/encode, /v1/embeddings, /classify), not /generate.
    is_generation: bool = True
    # sentence-transformers' pooling of the model directory, overriding the model class's
    # default pooler; None when the directory has none.
    pooling: PoolingConfig | None = None
    # The whole HF config where hf_config is its text_config (vision-language models:
    # the model class is built from it); None where the two are one.
    hf_full_config: PretrainedConfig | None = None

    @property
    def model_class_config(self) -> PretrainedConfig:
        """The config the model class is built from."""
        return self.hf_full_config if self.hf_full_config is not None else self.hf_config

    # --quantization and the checkpoint's quantization_config (None: unquantized)
    quantization: QuantSpec | None = None

    @classmethod
    def from_server_args(cls, server_args) -> ModelConfig:
        overrides = json.loads(getattr(server_args, "json_model_override_args", None) or "{}")
        hf = _load_hf_config(server_args.model_path, server_args.trust_remote_code)
        hf = apply_model_overrides(hf, overrides)
        text_cfg = getattr(hf, "text_config", None) or hf
        config_dtype = getattr(text_cfg, "dtype", None) or getattr(text_cfg, "torch_dtype", None)
        if isinstance(config_dtype, str):
            config_dtype = getattr(torch, config_dtype, None)
        model_type = getattr(text_cfg, "model_type", "") or ""
        dtype = resolve_dtype(server_args.dtype, config_dtype, server_args.device, model_type)
        derived = derived_context_length(text_cfg)
        context_len = checked_context_length(server_args.context_length, derived)
        head_dim = getattr(text_cfg, "head_dim", None) or (
            text_cfg.hidden_size // text_cfg.num_attention_heads
        )
        # SGLang reads the top-level config's (a text_config's only where it has none).
        eos = getattr(hf, "eos_token_id", None)
        if eos is None:
            eos = getattr(text_cfg, "eos_token_id", None)
        eos_ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        gen_defaults: dict = {}
        if os.path.isdir(server_args.model_path):
            try:
                gen = GenerationConfig.from_pretrained(server_args.model_path)
                g_eos = gen.eos_token_id
                eos_ids |= set(
                    g_eos if isinstance(g_eos, list) else [g_eos] if g_eos is not None else []
                )
                # --sampling-defaults openai: OpenAI's defaults, not the model's
                if getattr(server_args, "sampling_defaults", "model") == "model":
                    gen_defaults = {
                        k: getattr(gen, k)
                        for k in ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
                        if getattr(gen, k, None) is not None and k in gen.to_diff_dict()
                    }
            except OSError:
                pass
        architectures = list(getattr(hf, "architectures", None) or [])
        return cls(
            model_path=server_args.model_path,
            hf_config=text_cfg,
            dtype=dtype,
            context_len=int(context_len),
            num_hidden_layers=text_cfg.num_hidden_layers,
            num_attention_heads=text_cfg.num_attention_heads,
            num_key_value_heads=getattr(text_cfg, "num_key_value_heads", None)
            or text_cfg.num_attention_heads,
            head_dim=head_dim,
            hidden_size=text_cfg.hidden_size,
            vocab_size=text_cfg.vocab_size,
            architectures=architectures,
            eos_token_ids=eos_ids,
            generation_defaults=gen_defaults,
            is_generation=is_generation_model(
                architectures, bool(getattr(server_args, "is_embedding", False))
            ),
            pooling=read_sentence_transformers_pooling(server_args.model_path),
            hf_full_config=hf if text_cfg is not hf else None,
            quantization=parse_quantization(
                getattr(server_args, "quantization", None), hf_quant_config(hf)
            ),
        )

    def num_kv_heads_per_rank(self, tp_size: int) -> int:
        return max(1, self.num_key_value_heads // tp_size)
