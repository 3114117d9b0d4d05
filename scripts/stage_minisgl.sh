#!/usr/bin/env bash
# Stages sgl-project/mini-sglang (the engine the speed targets compare against) for a
# side-by-side run on the GPU machine, never as a dependency: its python/ tree goes to the
# git-ignored .minisgl/ (carry it) and msgpack, its one import the device lacks, into .device/.
# Usage: fetch github:sgl-project/mini-sglang with the search tool first (it lands under
# /work/.mirror/), then   bash scripts/stage_minisgl.sh [MIRROR_GIT_DIR]
# (also the official openai client and pytest for tests/gpu; openai 3.x imports httpx2).
# On the device:  PYTHONPATH=$PYTHONPATH:$PWD/.minisgl bash scripts/run_gpu_suite.sh compare
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
mirror=${1:-/work/.mirror/sgl-project+mini-sglang/repo}
grep -qxF '/.minisgl/' .git/info/exclude 2>/dev/null || echo '/.minisgl/' >> .git/info/exclude
rm -rf .minisgl && mkdir .minisgl
git --git-dir "$mirror" archive HEAD python/minisgl | tar x -C .minisgl --strip-components=1
git --git-dir "$mirror" log -1 --format='minisgl commit %H' | tee .minisgl/COMMIT
bash ../shared/device/stage.sh pytest==9.0.3 iniconfig==2.3.0 pluggy==1.6.0 pygments==2.19.2 \
  openai==3.57.0 httpx==0.28.1 httpcore==1.0.9 distro==1.9.0 jiter==0.19.0 certifi==2026.5.20 \
  idna==3.20 msgpack==1.2.4 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5
du -sh .minisgl .device
