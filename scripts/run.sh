#!/usr/bin/env bash
# The first thing to try: builds Basalt and generates text on the CPU.
#   scripts/run.sh [basalt generate flags...]
# With no flags it continues a prompt with the bundled model (models/basalt-mini,
# a 21M-parameter DeepSeek-V3-architecture model trained on Debian's English
# documentation; see models/MODELS.md).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh build >&2
if (($# == 0)); then
  set -- --prompt "The Debian project" --max-tokens 64 --temperature 0.8 --top-p 0.95 --seed 1
fi
exec build/bin/basalt generate "$@"
