#!/usr/bin/env bash
# Builds the safetensors header fuzzer with clang (libFuzzer, AddressSanitizer,
# UndefinedBehaviorSanitizer) and runs it on the seed corpus for a bounded time.
# Then runs the Jinja chat-template fuzzer (jinja_fuzz) for JINJA_FUZZ_SECONDS
# (default 20), seeded with the real templates in testdata/chat_templates, and
# the OpenAI request-body fuzzer (openai_request_fuzz) for OPENAI_FUZZ_SECONDS
# (default 20), seeded with fuzz/corpus/openai.
#
# Usage: fuzz/run_fuzz.sh [seconds (default 60)] [build dir (default build-fuzz)]
# Environment: CXX (default clang++-14), JOBS (build parallelism, default 1).
#
# Inputs the fuzzer finds interesting go to <build dir>/fuzz-corpus, so the
# committed seeds in fuzz/corpus/safetensors stay small and reviewed; a
# failing input is saved to <build dir>/fuzz-artifacts/ and the script exits
# non-zero. Reproduce one with: <build dir>/fuzz/safetensors_header_fuzz FILE
set -euo pipefail

seconds="${1:-60}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${2:-$root/build-fuzz}"
cxx="${CXX:-clang++-14}"

if ! command -v "$cxx" >/dev/null; then
  echo "run_fuzz.sh: $cxx not found; on Debian install clang-14 and libclang-rt-14-dev" >&2
  exit 1
fi
runtime_dir="$("$cxx" -print-runtime-dir)"
if [[ ! -e "$runtime_dir/libclang_rt.fuzzer-$(uname -m).a" ]]; then
  echo "run_fuzz.sh: libFuzzer runtime missing in $runtime_dir; on Debian install libclang-rt-14-dev" >&2
  exit 1
fi

cmake -S "$root" -B "$build" -G Ninja \
  -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DBASALT_FUZZ=ON -DBASALT_TESTS=OFF -DBASALT_BENCH=OFF -DBASALT_CUDA=OFF -DBASALT_NATIVE=OFF
cmake --build "$build" --target safetensors_header_fuzz jinja_fuzz openai_request_fuzz -j"${JOBS:-1}"

corpus="$build/fuzz-corpus/safetensors"
artifacts="$build/fuzz-artifacts"
mkdir -p "$corpus" "$artifacts"
# The first corpus directory receives new inputs; the seeds are only read.
"$build/fuzz/safetensors_header_fuzz" \
  -max_total_time="$seconds" \
  -dict="$root/fuzz/safetensors.dict" \
  -max_len=4096 \
  -timeout=10 \
  -rss_limit_mb=2048 \
  -print_final_stats=1 \
  -artifact_prefix="$artifacts/" \
  "$corpus" "$root/fuzz/corpus/safetensors"

# Jinja templates: new inputs go to <build dir>/fuzz-corpus/jinja; the real
# chat templates are read-only seeds.
jinja_corpus="$build/fuzz-corpus/jinja"
mkdir -p "$jinja_corpus"
"$build/fuzz/jinja_fuzz" \
  -max_total_time="${JINJA_FUZZ_SECONDS:-20}" \
  -dict="$root/fuzz/jinja.dict" \
  -max_len=4096 \
  -timeout=10 \
  -rss_limit_mb=2048 \
  -print_final_stats=1 \
  -artifact_prefix="$artifacts/" \
  "$jinja_corpus" "$root/testdata/chat_templates"

# OpenAI request bodies: new inputs go to <build dir>/fuzz-corpus/openai.
openai_corpus="$build/fuzz-corpus/openai"
mkdir -p "$openai_corpus"
"$build/fuzz/openai_request_fuzz" \
  -max_total_time="${OPENAI_FUZZ_SECONDS:-20}" \
  -dict="$root/fuzz/openai.dict" \
  -max_len=4096 \
  -timeout=10 \
  -rss_limit_mb=2048 \
  -print_final_stats=1 \
  -artifact_prefix="$artifacts/" \
  "$openai_corpus" "$root/fuzz/corpus/openai"
