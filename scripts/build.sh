#!/usr/bin/env bash
# Configures and builds Basalt into a build directory (default: build).
#   scripts/build.sh [BUILD_DIR] [extra cmake flags...]
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}
shift || true
scripts/install-deps.sh
jobs=$(nproc)
if [[ ! -f "$build_dir/build.ninja" ]]; then
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
fi
cmake --build "$build_dir" -j "$jobs"
