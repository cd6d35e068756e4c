#!/usr/bin/env bash
# Builds and runs every test: the normal build, a short fuzzing run of the
# checkpoint header, chat-template and request parsers, then the same tests
# under AddressSanitizer + UndefinedBehaviorSanitizer. The last line is the
# summary of both test runs: "tests: N passed, N failed, N skipped"; the
# fuzzers' output goes to build-fuzz/fuzz.log.
#   scripts/test.sh                  # all three
#   BASALT_QUICK=1 scripts/test.sh   # normal build only
set -euo pipefail
cd "$(dirname "$0")/.."
export BASALT_WITH_FUZZ=1
# ccache keys on paths relative to the checkout (as scripts/build.sh sets
# them), so the fuzz build too hits objects cached by another clone.
export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=true
scripts/install-deps.sh
jobs=$(nproc)
export CTEST_OUTPUT_ON_FAILURE=1

# The server's end-to-end tests drive it with the official openai npm client.
npm ci --prefix tests/e2e --no-audit --no-fund --loglevel=error

passed=0
failed=0
skipped=0
status=0
# run_ctest BUILD_DIR ctest-args...: runs the tests, keeps the log beside
# them, and adds their counts to the totals.
run_ctest() {
  local dir=$1
  shift
  local log="$dir/ctest.log"
  set +e
  ctest --test-dir "$dir" "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  set -e
  local line total bad skip
  line=$(grep -E '[0-9]+ tests failed out of [0-9]+' "$log" | tail -1 || true)
  total=$(sed -E 's/.* out of ([0-9]+).*/\1/' <<<"$line")
  bad=$(sed -E 's/.* ([0-9]+) tests failed.*/\1/' <<<"$line")
  skip=$(grep -cE '^[[:space:]]*[0-9]+ - .*\(Skipped\)$' "$log" || true)
  if [[ -z "$line" ]]; then
    total=0 bad=1 skip=0  # ctest did not get as far as its summary
  fi
  passed=$((passed + total - bad - skip))
  failed=$((failed + bad))
  skipped=$((skipped + skip))
  if ((rc != 0)); then status=1; fi
}

summary() {
  echo "tests: $passed passed, $failed failed, $skipped skipped"
  exit "$status"
}

echo "== build and test (RelWithDebInfo)"
scripts/build.sh build
run_ctest build -j "$jobs" --timeout 900 -LE soak
if [[ "${BASALT_QUICK:-0}" == "1" || $status -ne 0 ]]; then
  summary
fi

if [[ -x fuzz/run_fuzz.sh ]]; then
  seconds=${BASALT_FUZZ_SECONDS:-60}
  echo "== fuzz the safetensors header (${seconds} s), Jinja and request parsers (build-fuzz/fuzz.log)"
  mkdir -p build-fuzz
  if JOBS=$jobs fuzz/run_fuzz.sh "$seconds" >build-fuzz/fuzz.log 2>&1; then
    echo "fuzz: no crash, leak or sanitizer report"
  else
    echo "fuzz: FAILED (the end of build-fuzz/fuzz.log follows)"
    tail -n 40 build-fuzz/fuzz.log
    failed=$((failed + 1))
    status=1
    summary
  fi
fi

echo "== build and test (ASan + UBSan)"
# CPU only: the CUDA tests skip without a device and device code is not
# instrumented; the build above has already compiled the CUDA backend.
scripts/build.sh build-asan -DBASALT_SANITIZE=ON -DBASALT_BENCH=OFF -DBASALT_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  run_ctest build-asan -j "$jobs" --timeout 1800 -LE soak
summary
