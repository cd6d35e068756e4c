#!/usr/bin/env bash
# The first thing to try: builds the `basalt` binary and serves the bundled
# model with the OpenAI-compatible API on http://127.0.0.1:8000 (Ctrl-C
# stops it).
#   scripts/run.sh [basalt serve flags...]
# Only what serving needs is built, into build-run/: the binary with the CPU
# backend, or with the CUDA backend too when the flags say --device cuda.
# The first build takes about 9 minutes on a 2-core machine (README.md);
# later runs rebuild only what changed. The bundled model is
# models/basalt-mini, a 21M-parameter DeepSeek-V3-architecture model trained
# on Debian's English documentation (models/MODELS.md); --model DIR serves any
# Hugging Face model directory.
set -euo pipefail
cd "$(dirname "$0")/.."
cuda=OFF
previous=""
for arg in "$@"; do
  if [[ "$arg" == "--device=cuda" || ("$previous" == "--device" && "$arg" == "cuda") ]]; then cuda=ON; fi
  previous=$arg
done
backend="CPU backend"
[[ $cuda == ON ]] && backend="CPU and CUDA backends"
echo "run.sh: building build-run/bin/basalt ($backend); the first build takes minutes, later ones seconds" >&2
scripts/build.sh build-run --target basalt -DBASALT_CUDA=$cuda -DBASALT_TESTS=OFF -DBASALT_BENCH=OFF >&2
echo "run.sh: starting basalt serve $*" >&2
exec build-run/bin/basalt serve "$@"
