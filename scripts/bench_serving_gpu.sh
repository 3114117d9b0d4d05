#!/usr/bin/env bash
# SGLang's CI serving workload against a mini-sglang server on the GPU:
#   500 prompts, random-ids, input up to 4096, output up to 2048, range ratio 0, rate inf;
#   then 100 prompts at 1 request/s (median TTFT and ITL); then a request-rate sweep
#   (100 prompts, input/output up to 1024/256, rates 4-32) for the throughput/ITL plot.
# Usage: bash scripts/bench_serving_gpu.sh MODEL_DIR OUT_DIR [PORT]
# RATES overrides the sweep's rates; RATES= skips the sweep (the first two runs alone, ~5 min
# on an H100). The server inherits the environment, e.g. MINI_SGLANG_TRITON_DECODE_MAX_BS=0.
# Needs: an NVIDIA GPU and the GPU packages importable (as for scripts/run_gpu_suite.sh);
# MODEL_DIR from `python benchmarks/models/prepare.py llama-3.1-8b MODEL_DIR`.
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: bash scripts/bench_serving_gpu.sh MODEL_DIR OUT_DIR [PORT]" >&2; exit 1; }
command -v nvidia-smi >/dev/null || { echo "bench_serving_gpu.sh: needs an NVIDIA GPU (nvidia-smi not found)" >&2; exit 1; }
MODEL=$1; OUT=$2; PORT=${3:-30000}
mkdir -p "$OUT"
python -m mini_sglang.launch_server --model-path "$MODEL" --load-format dummy --port "$PORT" \
  > "$OUT/server.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT
for _ in $(seq 1 300); do
  curl -sf "localhost:$PORT/health" >/dev/null && break
  sleep 1
done
bench() { python -m mini_sglang.bench_serving --backend sglang --port "$PORT" \
  --dataset-name random-ids --random-range-ratio 0 --output-file "$OUT/serving.jsonl" "$@"; }
bench --num-prompts 500 --random-input-len 4096 --random-output-len 2048 --request-rate inf
bench --num-prompts 100 --random-input-len 4096 --random-output-len 2048 --request-rate 1
for rate in ${RATES-4 8 16 32}; do
  bench --num-prompts 100 --random-input-len 1024 --random-output-len 256 --request-rate "$rate"
done
