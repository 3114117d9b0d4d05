#!/usr/bin/env bash
# Runs the GPU tests and the benchmark suite on the device machine and leaves logs and
# JSONL results under $OUT. Usage (from the repo root, on the GPU machine):
#   source .device/env.sh && bash scripts/run_gpu_suite.sh [tests] [one_batch] [offline] [serving]
# With no arguments everything runs.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT" /tmp/m
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests one_batch offline serving)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/card.txt"
for name in qwen3-0.6b llama-3.1-8b; do
  python benchmarks/models/prepare.py "$name" "/tmp/m/$name" >/dev/null
done
for step in "${steps[@]}"; do
  case "$step" in
    tests)
      python -m pytest -x -q -p no:cacheprovider tests/gpu 2>&1 | tee "$OUT/gpu_tests.log" ;;
    one_batch)
      for m in qwen3-0.6b llama-3.1-8b; do
        python -m mini_sglang.bench_one_batch --model-path "/tmp/m/$m" --load-format dummy \
          --batch-size 1 --input-len 128 --output-len 1024 --result-filename "$OUT/one_batch.jsonl" \
          2>&1 | tee -a "$OUT/one_batch.log"
      done ;;
    offline)
      for m in qwen3-0.6b llama-3.1-8b; do
        python -m mini_sglang.bench_offline_throughput --model-path "/tmp/m/$m" --load-format dummy \
          --preset nano-vllm --result-filename "$OUT/offline.jsonl" 2>&1 | tail -15 | tee -a "$OUT/offline.log"
      done ;;
    serving)
      bash scripts/bench_serving_gpu.sh "/tmp/m/llama-3.1-8b" 2>&1 | tee -a "$OUT/serving.log" ;;
  esac
done
type save_flashinfer_cache >/dev/null 2>&1 && save_flashinfer_cache "$OUT"
exit 0
