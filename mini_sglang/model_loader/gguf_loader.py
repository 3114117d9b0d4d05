"""Reading GGUF checkpoints (llama.cpp's format) as HF-named float32 weights.

Used by ``--load-format gguf`` and whenever ``--model-path`` points at a ``.gguf`` file. The
``gguf`` package parses the file and dequantizes each tensor; this module only maps GGUF metadata
to an HF config dict, GGUF tensor names to HF parameter names, and undoes llama.cpp's q/k row
permutation for Llama (the same transform transformers applies when it loads a GGUF).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

import gguf
import numpy as np
import torch

from mini_sglang.model_loader.progress import progress
from mini_sglang.utils.gguf_path import GGUF_MAGIC

# GGUF `general.architecture` -> (HF model_type, HF architecture class name).
SUPPORTED_GGUF_ARCHITECTURES: dict[str, tuple[str, str]] = {
    "llama": ("llama", "LlamaForCausalLM"),
    "qwen2": ("qwen2", "Qwen2ForCausalLM"),
    "qwen3": ("qwen3", "Qwen3ForCausalLM"),
}

# Top-level GGUF tensor name -> HF parameter name (suffix `.weight`/`.bias` is carried over).
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}

# Per-block GGUF tensor name -> HF submodule of `model.layers.N`.
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}

# Tensors llama.cpp stores that have no HF parameter: Llama 3's precomputed rope frequency
# factors, which HF derives from `rope_scaling` instead.
_SKIPPED_TENSORS = {"rope_freqs.weight"}

_BLOCK_RE = re.compile(r"^blk\.(\d+)\.([a-z_]+)\.(weight|bias)$")
_GLOBAL_RE = re.compile(r"^([a-z_]+)\.(weight|bias)$")


def open_gguf(gguf_path: str) -> gguf.GGUFReader:
    """Open and validate a GGUF file.

    Raises ValueError("<path> is not a valid GGUF file: <reason>") when the file is missing,
    not GGUF, has unparsable metadata, or is truncated (a tensor's data runs past the end).
    """
    path = str(gguf_path)
    if not os.path.isfile(path):
        raise ValueError(f"{path} is not a valid GGUF file: no such file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ValueError(
            f"{path} is not a valid GGUF file: bad magic {magic!r}, expected {GGUF_MAGIC!r}"
        )
    try:
        reader = gguf.GGUFReader(path)
    except Exception as e:  # the gguf package raises many kinds on malformed input
        raise ValueError(
            f"{path} is not a valid GGUF file: cannot parse it (truncated or corrupt?): "
            f"{type(e).__name__}: {e}"
        ) from e
    file_size = os.path.getsize(path)
    for t in reader.tensors:
        # np.memmap silently yields short arrays for data past EOF; check the extents ourselves.
        if t.data_offset + t.n_bytes > file_size or t.data.nbytes != t.n_bytes:
            raise ValueError(
                f"{path} is not a valid GGUF file: tensor {t.name} extends past the end of the "
                f"file ({file_size} bytes); the file is truncated"
            )
    return reader


def _field(reader: gguf.GGUFReader, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return default
    return field.contents()


def _required(reader: gguf.GGUFReader, key: str) -> Any:
    value = _field(reader, key)
    if value is None:
        raise ValueError(f"{reader.data.filename} is not a valid GGUF file: metadata lacks {key}")
    return value


def _as_float(value: Any) -> float:
    # GGUF stores float32; its shortest decimal repr recovers the original config value
    # (e.g. 1e-05 instead of 9.999999747378752e-06).
    return float(str(np.float32(value)))


def gguf_architecture(reader: gguf.GGUFReader) -> str:
    """The file's ``general.architecture``; ValueError if it is not one this loader supports."""
    arch = _required(reader, "general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise ValueError(
            f"{reader.data.filename}: unsupported GGUF architecture {arch!r}; supported: "
            f"{', '.join(sorted(SUPPORTED_GGUF_ARCHITECTURES))}"
        )
    return arch


def config_dict_from_reader(reader: gguf.GGUFReader) -> dict[str, Any]:
    """The HF config dict for an already opened GGUF file (see :func:`gguf_config_dict`)."""
    arch = gguf_architecture(reader)
    model_type, hf_arch = SUPPORTED_GGUF_ARCHITECTURES[arch]

    def key(name: str, default: Any = None) -> Any:
        return _field(reader, f"{arch}.{name}", default)

    def need(name: str) -> Any:
        return _required(reader, f"{arch}.{name}")

    tensor_names = {t.name for t in reader.tensors}
    hidden = int(need("embedding_length"))
    heads = int(need("attention.head_count"))
    # Qwen3 states head_dim explicitly (it is not hidden/heads); llama.cpp writes it as the
    # key length, or for Llama as the rotary dimension.
    head_dim = key("attention.key_length")
    if head_dim is None and arch == "llama":
        head_dim = key("rope.dimension_count")
    vocab = key("vocab_size")
    if vocab is None:
        tokens = reader.fields.get("tokenizer.ggml.tokens")
        vocab = len(tokens.data) if tokens is not None else None
    if vocab is None:
        embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
        vocab = int(embd.shape[-1])

    cfg: dict[str, Any] = {
        "architectures": [hf_arch],
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(key("attention.head_count_kv", heads)),
        "head_dim": int(head_dim) if head_dim is not None else hidden // heads,
        "vocab_size": int(vocab),
        "max_position_embeddings": int(need("context_length")),
        "rms_norm_eps": _as_float(need("attention.layer_norm_rms_epsilon")),
        "rope_theta": _as_float(key("rope.freq_base", 10000.0)),
        "hidden_act": "silu",
        # llama.cpp writes the output projection only when it is not the embedding matrix.
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "torch_dtype": "float32",
    }
    if arch in ("llama", "qwen3"):
        cfg["attention_bias"] = "blk.0.attn_q.bias" in tensor_names
    scaling = key("rope.scaling.type")
    if scaling not in (None, "none"):
        cfg["rope_scaling"] = {
            "rope_type": scaling,
            "factor": _as_float(key("rope.scaling.factor", 1.0)),
        }
        orig = key("rope.scaling.original_context_length")
        if orig is not None:
            cfg["rope_scaling"]["original_max_position_embeddings"] = int(orig)
    for gguf_key, hf_key in (
        ("bos_token_id", "bos_token_id"),
        ("eos_token_id", "eos_token_id"),
        ("padding_token_id", "pad_token_id"),
    ):
        value = _field(reader, f"tokenizer.ggml.{gguf_key}")
        if value is not None:
            cfg[hf_key] = int(value)
    return cfg


def gguf_config_dict(gguf_path: str) -> dict[str, Any]:
    """An HF ``config.json`` dict built from a GGUF file's metadata.

    Covers architectures, model_type, sizes, heads/kv heads/head_dim, vocab, rope_theta (and
    rope_scaling when stated), rms_norm_eps, max_position_embeddings, tie_word_embeddings and
    bos/eos/pad ids. Raises ValueError for an invalid file or an unsupported architecture
    (supported: llama, qwen2, qwen3).
    """
    return config_dict_from_reader(open_gguf(gguf_path))


def gguf_to_hf_name(gguf_name: str) -> str | None:
    """The HF parameter name for a GGUF tensor name, or None for tensors HF has no parameter
    for. Raises ValueError for names outside the llama/qwen2/qwen3 tensor set."""
    if gguf_name in _SKIPPED_TENSORS:
        return None
    m = _BLOCK_RE.match(gguf_name)
    if m and m.group(2) in _BLOCK_NAMES:
        return f"model.layers.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}.{m.group(3)}"
    m = _GLOBAL_RE.match(gguf_name)
    if m and m.group(1) in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[m.group(1)]}.{m.group(2)}"
    raise ValueError(f"unexpected GGUF tensor {gguf_name!r} for a llama/qwen2/qwen3 model")


def unpermute_llama_qk(weight: torch.Tensor, n_head: int) -> torch.Tensor:
    """Undo llama.cpp's rotary row permutation of a Llama q/k projection (weight or bias).

    llama.cpp's converter reorders each head's rows from HF's rotate-half layout [x0..x(d/2-1),
    y0..] into interleaved pairs; this maps them back. ``n_head`` is the number of heads the
    tensor holds (attention heads for q, kv heads for k).
    """
    rows = weight.shape[0]
    half = rows // n_head // 2
    rest = weight.shape[1:]
    return weight.reshape(n_head, half, 2, *rest).transpose(1, 2).reshape(weight.shape)


def _dequantize(tensor: Any) -> np.ndarray:
    values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    # GGUF lists dims fastest-first; torch order is the reverse.
    shape = tuple(int(d) for d in reversed(tensor.shape))
    return np.asarray(values, dtype=np.float32).reshape(shape)


def weights_from_reader(
    reader: gguf.GGUFReader, desc: str | None = None
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF name, float32 tensor) for an already opened GGUF file (see
    :func:`iterate_gguf_weights`); with `desc`, a progress bar so labelled counts the
    tensors."""
    arch = gguf_architecture(reader)
    cfg = config_dict_from_reader(reader)
    n_head, n_kv_head = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    tensors = reader.tensors
    if desc is not None:
        tensors = progress(tensors, desc, total=len(reader.tensors))
    for tensor in tensors:
        hf_name = gguf_to_hf_name(tensor.name)
        if hf_name is None:
            continue
        # copy: the dequantized array may be a read-only view of the memory-mapped file
        weight = torch.from_numpy(np.array(_dequantize(tensor), dtype=np.float32, copy=True))
        if arch == "llama":
            if ".attn_q." in tensor.name:
                weight = unpermute_llama_qk(weight, n_head)
            elif ".attn_k." in tensor.name:
                weight = unpermute_llama_qk(weight, n_kv_head)
        yield hf_name, weight.contiguous()


def iterate_gguf_weights(gguf_path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (HF parameter name, float32 tensor) for each tensor in a GGUF file, one at a time.

    Tensors are dequantized with ``gguf.quants.dequantize``; names follow HF (model.embed_tokens,
    model.layers.N.self_attn.{q,k,v,o}_proj, ..., model.norm, lm_head when not tied); Llama q/k
    rows are un-permuted to HF's layout. The file is validated before the first tensor is
    yielded: ValueError for an invalid/truncated file or an unsupported architecture.
    """
    reader = open_gguf(gguf_path)
    gguf_architecture(reader)  # fail at call time, not at first next()
    return weights_from_reader(reader, desc="Loading gguf weights")
