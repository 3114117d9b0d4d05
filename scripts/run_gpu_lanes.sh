#!/usr/bin/env bash
# Runs several lists of scripts/run_gpu_suite.sh steps side by side, one list ("lane") per
# GPU, each under a time limit, then packs every lane's results into one archive.
#   bash scripts/run_gpu_lanes.sh "LANE0" ["LANE1" ...]
# A lane is words run in order: a VAR=value word sets VAR for the steps after it (a value
# cannot hold a space: write '+' for one, e.g. MODELS=qwen3-0.6b+llama-3.1-8b), any other
# word is a run_gpu_suite.sh step. Lane i runs on GPU i (CUDA_VISIBLE_DEVICES) with its own
# OUT ($WORK/lane<i>) and MODEL_ROOT. A lane "-" leaves its GPU idle. After the lanes, AFTER (optional) runs with every GPU visible, e.g.
# AFTER="MIXTRAL_TP=2 mixtral".
# Environment: OUT (where results.tgz and each lane's log go; default /tmp/gpu_out),
# LANE_LIMIT_S (seconds each lane may run, default 540; a lane past it is killed with its
# process group), AFTER_LIMIT_S (default 240), WORK (default /tmp/gpu_lanes).
# Measurements taken while another lane runs share the host's CPUs and PCIe with it; the
# lane logs say which steps ran together.
set -uo pipefail
OUT=${OUT:-/tmp/gpu_out}
WORK=${WORK:-/tmp/gpu_lanes}
mkdir -p "$OUT" "$WORK"
start=$(date +%s)
# run_lane I SPEC LIMIT GPUS: the lane's words in order; a VAR=value word sets VAR for the
# steps after it, a step runs under whatever time of the lane's LIMIT is left.
run_lane() {
  local i=$1 spec=$2 limit=$3 gpus=$4 word left rc envs=()
  local deadline=$(($(date +%s) + limit))
  mkdir -p "$WORK/lane$i"
  for word in $spec; do
    case "$word" in *=*) envs+=("${word//+/ }"); continue ;; esac
    left=$((deadline - $(date +%s)))
    if [ "$left" -le 10 ]; then
      echo "lane $i: no time left for $word" | tee -a "$OUT/lanes.log"; continue
    fi
    echo "lane $i (GPU $gpus) at +$(($(date +%s) - start)) s: ${envs[*]} $word" | tee -a "$OUT/lanes.log"
    env CUDA_VISIBLE_DEVICES="$gpus" OUT="$WORK/lane$i" MODEL_ROOT="$WORK/models$i" "${envs[@]}" \
      timeout -k 15 "$left" bash scripts/run_gpu_suite.sh "$word" >> "$WORK/lane$i/lane.log" 2>&1
    rc=$?
    echo "lane $i: $word ended rc=$rc at +$(($(date +%s) - start)) s" | tee -a "$OUT/lanes.log"
  done
}
lanes=("$@") pids=()
for i in "${!lanes[@]}"; do
  [ "${lanes[$i]}" = "-" ] && continue
  run_lane "$i" "${lanes[$i]}" "${LANE_LIMIT_S:-540}" "$i" &
  pids+=($!)
done
wait "${pids[@]}"
if [ -n "${AFTER:-}" ]; then
  all=$(seq -s, 0 $(($(nvidia-smi -L | wc -l) - 1)))
  run_lane after "$AFTER" "${AFTER_LIMIT_S:-240}" "$all"
fi
for log in "$WORK"/lane*/lane.log; do
  echo "=== $log"; grep -vE "^\s*$" "$log" | tail -40
done > "$OUT/lanes_tail.log"
# one archive of every lane's files (server logs, JSONL rows, tuned configs), without the
# model directories
tar czf "$OUT/results.tgz" -C "$WORK" $(cd "$WORK" && ls -d lane*) 2>/dev/null
ls -la "$OUT"
