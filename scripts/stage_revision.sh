#!/usr/bin/env bash
# Copies mini_sglang/ as of git revision REV into .ab/REV, for A/B runs against this checkout
# on the device (run_gpu_suite.sh ab / nano_ab, arm "tree=.ab/REV"; carry ".ab").
# Usage (on your machine, at the repo root): bash scripts/stage_revision.sh REV
set -euo pipefail
rev=${1:?usage: stage_revision.sh REV}
dest=.ab/$rev
rm -rf "$dest" && mkdir -p "$dest"
git archive "$rev" mini_sglang | tar -x -C "$dest"
echo "$dest: mini_sglang at $(git rev-parse --short "$rev")"
