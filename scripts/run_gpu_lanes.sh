#!/usr/bin/env bash
# Runs several lists of scripts/run_gpu_suite.sh steps side by side, one list ("lane") per
# GPU, each under a time limit, then packs every lane's results into one archive.
#   bash scripts/run_gpu_lanes.sh "LANE0" ["LANE1" ...]
# A lane is words: VAR=value words set that lane's environment (MODELS=..., FP8_ARMS=...,
# a quoted value may not contain spaces: use a comma where the step allows it, or '+' for
# a space in MODELS), the other words are run_gpu_suite.sh steps run in order. Lane i runs on
# GPU i (CUDA_VISIBLE_DEVICES) with its own OUT ($WORK/lane<i>) and MODEL_ROOT. A lane "-"
# leaves its GPU idle. After the lanes, AFTER (optional) runs with every GPU visible, e.g.
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
# Parse one lane spec into run_gpu_suite.sh arguments and environment; run it under timeout.
run_lane() {
  local i=$1 spec=$2 limit=$3 gpus=$4 word envs=() steps=()
  for word in $spec; do
    case "$word" in *=*) envs+=("${word//+/ }") ;; *) steps+=("$word") ;; esac
  done
  mkdir -p "$WORK/lane$i"
  echo "lane $i (GPU $gpus) at +$(($(date +%s) - start)) s: ${envs[*]} ${steps[*]}" | tee -a "$OUT/lanes.log"
  env CUDA_VISIBLE_DEVICES="$gpus" OUT="$WORK/lane$i" MODEL_ROOT="$WORK/models$i" "${envs[@]}" \
    timeout -k 15 "$limit" bash scripts/run_gpu_suite.sh "${steps[@]}" > "$WORK/lane$i/lane.log" 2>&1
  echo "lane $i ended rc=$? at +$(($(date +%s) - start)) s" | tee -a "$OUT/lanes.log"
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
