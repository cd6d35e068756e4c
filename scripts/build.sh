#!/usr/bin/env bash
# Configures and builds Basalt into a build directory (default: build).
#   scripts/build.sh [BUILD_DIR] [--target TARGET]... [extra cmake flags...]
# Without --target everything is built (tests, benchmarks, the CUDA backend
# where nvcc is found). cmake flags, when given, are applied to the build
# directory each time (so a changed flag takes effect).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build}
shift || true
targets=()
flags=()
while (($#)); do
  case $1 in
    --target) targets+=(--target "$2"); shift 2 ;;
    *) flags+=("$1"); shift ;;
  esac
done
scripts/install-deps.sh
jobs=$(nproc)
# ccache: paths relative to the checkout, so build directories and clones
# share cached objects.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true
if [[ ! -f "$build_dir/build.ninja" ]] || ((${#flags[@]})); then
  cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${flags[@]}" >/dev/null
fi
cmake --build "$build_dir" -j "$jobs" "${targets[@]}"
