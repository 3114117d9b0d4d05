"""GGUF loading and the embedded default model, checked against transformers' own GGUF code.

The real SmolLM2 GGUF is converted once per module (into a temporary cache dir); tiny GGUF
files for llama/qwen2/qwen3 are written with gguf.GGUFWriter from known tensors.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from mini_sglang.model_loader.default_model import (
    DEFAULT_MODEL_NAME,
    MARKER_FILE,
    find_default_gguf,
    install_atomically,
    resolve_default_model_path,
)
from mini_sglang.model_loader.gguf_loader import (
    gguf_config_dict,
    iterate_gguf_weights,
)
from mini_sglang.utils.gguf_path import is_gguf_path


@pytest.fixture(scope="module")
def gguf_path() -> str:
    return find_default_gguf()


@pytest.fixture(scope="module")
def hf_gguf_config(gguf_path: str):
    """transformers' own config for the GGUF (parsing it takes seconds, so once per module)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(
        os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path)
    )


@pytest.fixture(scope="module")
def converted_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The default model converted into a fresh cache that starts with a half-written target
    (files but no marker), so the first resolve must detect it as stale and rebuild."""
    cache = tmp_path_factory.mktemp("mini_sglang_cache")
    stale = cache / DEFAULT_MODEL_NAME
    stale.mkdir()
    (stale / "config.json").write_text("{half written")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MINI_SGLANG_CACHE_DIR", str(cache))
        path = resolve_default_model_path()
        yield path


def test_default_dir_layout_and_stale_cache_rebuilt(converted_dir: str) -> None:
    names = set(os.listdir(converted_dir))
    assert {
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "model.safetensors",
        MARKER_FILE,
    } <= names
    assert json.loads(Path(converted_dir, "config.json").read_text())["architectures"] == [
        "LlamaForCausalLM"
    ]
    gen = json.loads(Path(converted_dir, "generation_config.json").read_text())
    assert gen["eos_token_id"] == 2 and gen["bos_token_id"] == 1
    # The model card's sampling settings (temperature 1.0 gives noise from this small model).
    assert (gen["temperature"], gen["top_p"], gen["do_sample"]) == (0.2, 0.9, True)
    tok_cfg = json.loads(Path(converted_dir, "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tok_cfg["chat_template"]
    assert tok_cfg["eos_token"] == "<|im_end|>" and tok_cfg["pad_token"] == "<|im_end|>"
    # no temp or stale directories left behind next to the target
    assert os.listdir(os.path.dirname(converted_dir)) == [DEFAULT_MODEL_NAME]


def test_resolve_twice_does_not_reconvert(converted_dir: str) -> None:
    marker = os.stat(os.path.join(converted_dir, MARKER_FILE))
    weights = os.stat(os.path.join(converted_dir, "model.safetensors"))
    assert resolve_default_model_path() == converted_dir
    assert os.stat(os.path.join(converted_dir, MARKER_FILE)).st_mtime_ns == marker.st_mtime_ns
    again = os.stat(os.path.join(converted_dir, "model.safetensors"))
    assert (again.st_ino, again.st_mtime_ns) == (weights.st_ino, weights.st_mtime_ns)


def test_tokenizer_and_config_load_by_path(converted_dir: str) -> None:
    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(converted_dir)
    assert tok.convert_tokens_to_ids("<|im_start|>") == 1
    assert tok.convert_tokens_to_ids("<|im_end|>") == 2
    assert tok.eos_token_id == 2
    text = tok.apply_chat_template(
        [{"role": "user", "content": "Hello"}], tokenize=False, add_generation_prompt=True
    )
    assert "<|im_start|>user\nHello<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    config = AutoConfig.from_pretrained(converted_dir)
    assert (config.model_type, config.num_hidden_layers, config.hidden_size) == ("llama", 30, 576)
    assert config.tie_word_embeddings is True


def test_transformers_greedy_paris(converted_dir: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(converted_dir)
    model = AutoModelForCausalLM.from_pretrained(converted_dir)
    assert model.dtype == torch.float32
    ids = tok("The capital of France is", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=2, do_sample=False)
    new_text = tok.decode(out[0, ids.input_ids.shape[1] :])
    assert new_text.startswith(" Paris"), new_text


def test_weights_match_transformers_gguf_loader(gguf_path: str, hf_gguf_config) -> None:
    """Names, shapes and values equal transformers' GGUF load (which un-permutes Llama q/k)."""
    from transformers import AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    # from_pretrained(gguf_file=...) needs `accelerate`, which we don't depend on; its GGUF
    # path runs this same function on a model built from the GGUF's config.
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(hf_gguf_config)
    ref = load_gguf_checkpoint(gguf_path, return_tensors=True, model_to_load=skeleton)["tensors"]

    ours = dict(iterate_gguf_weights(gguf_path))
    assert sorted(ours) == sorted(ref)
    assert "lm_head.weight" not in ours  # tied
    for name, tensor in ours.items():
        assert tensor.dtype == torch.float32
        assert tensor.shape == ref[name].shape, name
        diff = (tensor - ref[name].float()).abs().max().item()
        assert diff <= 1e-6, (name, diff)


def test_config_dict_matches_transformers(gguf_path: str, hf_gguf_config) -> None:
    ours = gguf_config_dict(gguf_path)
    ref = hf_gguf_config
    assert ours["architectures"] == ["LlamaForCausalLM"] and ours["model_type"] == ref.model_type
    for key in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "vocab_size",
        "max_position_embeddings",
        "tie_word_embeddings",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
    ):
        assert ours[key] == getattr(ref, key), key
    assert ours["rms_norm_eps"] == pytest.approx(ref.rms_norm_eps, rel=1e-6)
    ref_theta = getattr(ref, "rope_parameters", None) or {"rope_theta": ref.rope_theta}
    assert ours["rope_theta"] == ref_theta["rope_theta"] == 100000.0


def test_invalid_files_fail_fast(gguf_path: str, tmp_path: Path) -> None:
    data = Path(gguf_path).read_bytes()
    cases = {
        "head.gguf": data[: 1 << 20],  # metadata cut short
        "tail.gguf": data[:-100_000],  # metadata intact, tensor data cut short
        "random.gguf": random.Random(0).randbytes(1 << 16),
        "random_magic.gguf": b"GGUF" + random.Random(1).randbytes(1 << 16),
    }
    for name, content in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        # iterate_gguf_weights must fail at call time, before any tensor is yielded
        fn = iterate_gguf_weights if name.startswith("random") else gguf_config_dict
        with pytest.raises(ValueError, match=f"{path} is not a valid GGUF file: "):
            fn(str(path))
    with pytest.raises(ValueError, match="is not a valid GGUF file: no such file"):
        gguf_config_dict(str(tmp_path / "missing.gguf"))


def test_is_gguf_path(gguf_path: str, tmp_path: Path) -> None:
    assert is_gguf_path(gguf_path)
    assert is_gguf_path("/no/such/model.GGUF")
    noext = tmp_path / "model_without_suffix"
    noext.write_bytes(Path(gguf_path).read_bytes()[:64])
    assert is_gguf_path(str(noext))
    assert not is_gguf_path(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    assert not is_gguf_path(str(tmp_path / "config.json"))


def test_install_atomically_races(tmp_path: Path) -> None:
    """Second finisher keeps the first valid result; a stale target is replaced."""

    def valid(d: str) -> bool:
        return os.path.exists(os.path.join(d, "ok"))

    def build(name: str, ok: bool = True) -> str:
        d = tmp_path / name
        d.mkdir()
        (d / "who").write_text(name)
        if ok:
            (d / "ok").write_text("")
        return str(d)

    target = str(tmp_path / "model")
    assert install_atomically(build("a"), target, valid) == target
    assert install_atomically(build("b"), target, valid) == target
    assert Path(target, "who").read_text() == "a"
    assert not (tmp_path / "b").exists()

    stale = str(tmp_path / "stale")
    os.rename(build("half", ok=False), stale)
    assert install_atomically(build("c"), stale, valid) == stale
    assert Path(stale, "who").read_text() == "c"
    assert sorted(os.listdir(tmp_path)) == ["model", "stale"]


# ---------------------------------------------------------------- tiny synthetic GGUF files


def _llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # llama.cpp's convert_hf_to_gguf.py permute(): HF rotate-half rows -> interleaved pairs
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


_TINY = dict(hidden=32, inter=48, layers=2, heads=4, kv=2, head_dim=8, vocab=64)


def _tiny_state_dict(arch: str, tied: bool) -> dict[str, np.ndarray]:
    t, rng = _TINY, np.random.default_rng(0)
    q_out, kv_out = t["heads"] * t["head_dim"], t["kv"] * t["head_dim"]
    sd = {
        "model.embed_tokens.weight": (t["vocab"], t["hidden"]),
        "model.norm.weight": (t["hidden"],),
    }
    if not tied:
        sd["lm_head.weight"] = (t["vocab"], t["hidden"])
    for i in range(t["layers"]):
        p = f"model.layers.{i}."
        sd |= {
            p + "input_layernorm.weight": (t["hidden"],),
            p + "post_attention_layernorm.weight": (t["hidden"],),
            p + "self_attn.q_proj.weight": (q_out, t["hidden"]),
            p + "self_attn.k_proj.weight": (kv_out, t["hidden"]),
            p + "self_attn.v_proj.weight": (kv_out, t["hidden"]),
            p + "self_attn.o_proj.weight": (t["hidden"], q_out),
            p + "mlp.gate_proj.weight": (t["inter"], t["hidden"]),
            p + "mlp.up_proj.weight": (t["inter"], t["hidden"]),
            p + "mlp.down_proj.weight": (t["hidden"], t["inter"]),
        }
        if arch == "qwen2":
            sd |= {
                p + f"self_attn.{x}_proj.bias": (n,) for x, n in zip("qkv", (q_out, kv_out, kv_out))
            }
        if arch == "qwen3":
            sd |= {p + f"self_attn.{x}_norm.weight": (t["head_dim"],) for x in "qk"}
    return {k: rng.standard_normal(s).astype(np.float32) for k, s in sd.items()}


_HF_TO_GGUF = {
    "model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output",
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}  # fmt: skip


def _gguf_name(hf: str) -> str:
    module, suffix = hf.rsplit(".", 1)
    if module.startswith("model.layers."):
        _, _, idx, sub = module.split(".", 3)
        return f"blk.{idx}.{_HF_TO_GGUF[sub]}.{suffix}"
    return f"{_HF_TO_GGUF[module]}.{suffix}"


def _write_tiny_gguf(path: Path, arch: str, sd: dict[str, np.ndarray]) -> None:
    t = _TINY
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(t["layers"])
    w.add_context_length(256)
    w.add_embedding_length(t["hidden"])
    w.add_feed_forward_length(t["inter"])
    w.add_head_count(t["heads"])
    w.add_head_count_kv(t["kv"])
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_key_length(t["head_dim"])
    w.add_vocab_size(t["vocab"])
    w.add_bos_token_id(5)
    w.add_eos_token_id(7)
    for hf, value in sd.items():
        if arch == "llama" and ".q_proj." in hf:
            value = _llama_cpp_permute(value, t["heads"])
        elif arch == "llama" and ".k_proj." in hf:
            value = _llama_cpp_permute(value, t["kv"])
        w.add_tensor(_gguf_name(hf), value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize(
    ("arch", "tied"), [("llama", False), ("qwen2", True), ("qwen3", True), ("qwen3", False)]
)
def test_tiny_gguf_roundtrip(tmp_path: Path, arch: str, tied: bool) -> None:
    sd = _tiny_state_dict(arch, tied)
    path = tmp_path / f"tiny-{arch}.gguf"
    _write_tiny_gguf(path, arch, sd)

    loaded = dict(iterate_gguf_weights(str(path)))
    assert sorted(loaded) == sorted(sd)
    for name, value in sd.items():
        assert torch.equal(loaded[name], torch.from_numpy(value)), name

    cfg = gguf_config_dict(str(path))
    expected_arch = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}.get(
        arch, "Qwen3ForCausalLM"
    )
    assert cfg["architectures"] == [expected_arch]
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (4, 2, 8)
    assert (cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]) == (32, 48, 2)
    assert (cfg["vocab_size"], cfg["max_position_embeddings"]) == (64, 256)
    assert (cfg["rope_theta"], cfg["rms_norm_eps"]) == (1e6, 1e-6)
    assert (cfg["bos_token_id"], cfg["eos_token_id"]) == (5, 7)
    assert cfg["tie_word_embeddings"] is tied


def test_unsupported_architecture(tmp_path: Path) -> None:
    path = tmp_path / "gpt2.gguf"
    w = gguf.GGUFWriter(str(path), "gpt2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    for fn in (gguf_config_dict, iterate_gguf_weights):
        with pytest.raises(ValueError, match=r"unsupported GGUF architecture 'gpt2'.*llama"):
            fn(str(path))
