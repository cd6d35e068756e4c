#!/usr/bin/env bash
# Builds and runs every test: the normal build, a short fuzzing run of the
# checkpoint header parser, then the same tests under AddressSanitizer +
# UndefinedBehaviorSanitizer.
#   scripts/test.sh            # all three
#   BASALT_QUICK=1 scripts/test.sh   # normal build only
set -euo pipefail
cd "$(dirname "$0")/.."
export BASALT_WITH_FUZZ=1
scripts/install-deps.sh
jobs=$(nproc)
export CTEST_OUTPUT_ON_FAILURE=1

# The server's end-to-end tests drive it with the official openai npm client.
npm ci --prefix tests/e2e --no-audit --no-fund --loglevel=error

echo "== build and test (RelWithDebInfo)"
scripts/build.sh build
ctest --test-dir build -j "$jobs" --timeout 900

if [[ "${BASALT_QUICK:-0}" == "1" ]]; then
  exit 0
fi

if [[ -x fuzz/run_fuzz.sh ]]; then
  echo "== fuzz the safetensors header parser (${BASALT_FUZZ_SECONDS:-60} s)"
  fuzz/run_fuzz.sh "${BASALT_FUZZ_SECONDS:-60}"
fi

# Last, so the closing lines of the run are the sanitizer test summary.
echo "== build and test (ASan + UBSan)"
scripts/build.sh build-asan -DBASALT_SANITIZE=ON -DBASALT_BENCH=OFF -DCMAKE_BUILD_TYPE=Debug
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ctest --test-dir build-asan -j "$jobs" --timeout 1800

