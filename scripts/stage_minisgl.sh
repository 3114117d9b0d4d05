#!/usr/bin/env bash
# Stages sgl-project/mini-sglang (the engine the speed targets compare against) for a
# side-by-side run on the GPU machine, never as a dependency: its python/ tree goes to the
# git-ignored .minisgl/ (copy it along) and the wheels the GPU machine lacks (msgpack and
# prompt_toolkit, its missing imports, plus the official openai client and pytest for
# tests/gpu; openai 3.x imports httpx2) are downloaded by WHEEL_STAGER.
# Usage, at the repository root:
#   bash scripts/stage_minisgl.sh MINISGL_GIT_DIR
# MINISGL_GIT_DIR: a git directory (a bare clone or a checkout's .git) of
# github.com/sgl-project/mini-sglang.
# WHEEL_STAGER: a script that takes NAME==VERSION arguments and stages their wheels for the
# GPU machine (default ../shared/device/stage.sh, relative to the repository root).
# On the GPU machine:  PYTHONPATH=$PYTHONPATH:$PWD/.minisgl bash scripts/run_gpu_suite.sh compare
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mirror=${1:?usage: bash scripts/stage_minisgl.sh MINISGL_GIT_DIR}
stager=${WHEEL_STAGER:-../shared/device/stage.sh}
[ -f "$stager" ] || { echo "stage_minisgl.sh: no wheel stager at $stager (set WHEEL_STAGER)" >&2; exit 1; }
rm -rf .minisgl && mkdir .minisgl
git --git-dir "$mirror" archive HEAD python/minisgl | tar x -C .minisgl --strip-components=1
git --git-dir "$mirror" log -1 --format='minisgl commit %H' | tee .minisgl/COMMIT
bash "$stager" pytest==9.0.3 iniconfig==2.3.0 pluggy==1.6.0 pygments==2.19.2 \
  openai==3.57.0 httpx==0.28.1 httpcore==1.0.9 distro==1.9.0 jiter==0.19.0 certifi==2026.5.20 \
  idna==3.20 msgpack==1.2.4 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 \
  prompt_toolkit==3.0.53 wcwidth==0.9.4
du -sh .minisgl
