#!/usr/bin/env bash
# The first thing to try: builds Basalt and serves the bundled model with the
# OpenAI-compatible API on http://127.0.0.1:8000 (Ctrl-C stops it).
#   scripts/run.sh [basalt serve flags...]
# The bundled model is models/basalt-mini, a 21M-parameter
# DeepSeek-V3-architecture model trained on Debian's English documentation
# (see models/MODELS.md); --model DIR serves any Hugging Face model directory.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh build >&2
exec build/bin/basalt serve "$@"
