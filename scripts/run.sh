#!/usr/bin/env bash
# The first thing to try: builds Basalt and generates text on the CPU.
#   scripts/run.sh [basalt generate flags...]
# With no flags it uses a small checkpoint from testdata/ (random weights, so
# the text is gibberish until the bundled trained model ships).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh build >&2
if (($# == 0)); then
  set -- --model testdata/models/llama --prompt "Basalt is" --max-tokens 24 --temperature 0
fi
exec build/bin/basalt generate "$@"
