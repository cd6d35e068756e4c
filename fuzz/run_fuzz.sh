#!/usr/bin/env bash
# Builds the safetensors header fuzzer with clang (libFuzzer, AddressSanitizer,
# UndefinedBehaviorSanitizer) and runs it on the seed corpus for a bounded time.
# Then runs the Jinja chat-template fuzzer (jinja_fuzz) for JINJA_FUZZ_SECONDS
# (default 20), seeded with the real templates in testdata/chat_templates, and
# the OpenAI request-body fuzzer (openai_request_fuzz) for OPENAI_FUZZ_SECONDS
# (default 20), seeded with fuzz/corpus/openai, and the structured-output
# fuzzer (grammar_fuzz: EBNF, regexes, JSON schemas) for GRAMMAR_FUZZ_SECONDS
# (default 20), seeded with fuzz/corpus/grammar, and the model-output fuzzer
# (chat_output_fuzz: tool-call and reasoning parsers) for
# CHAT_OUTPUT_FUZZ_SECONDS (default 20), seeded with fuzz/corpus/chat_output,
# and the gateway's reader of replicas' /metrics (prometheus_fuzz) for
# PROMETHEUS_FUZZ_SECONDS (default 20), seeded with fuzz/corpus/prometheus,
# and the deployment spec parser (deploy_spec_fuzz) for DEPLOY_FUZZ_SECONDS
# (default 20), seeded with fuzz/corpus/deploy, and the workflow definition
# parser and templates (workflow_fuzz) for WORKFLOW_FUZZ_SECONDS (default 20),
# seeded with fuzz/corpus/workflow.
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
cmake --build "$build" --target safetensors_header_fuzz jinja_fuzz openai_request_fuzz grammar_fuzz chat_output_fuzz \
  prometheus_fuzz deploy_spec_fuzz workflow_fuzz \
  -j"${JOBS:-1}"

artifacts="$build/fuzz-artifacts"
mkdir -p "$artifacts"
# fuzz TARGET SECONDS DICT SEEDS: new inputs go to <build dir>/fuzz-corpus/TARGET
# (the first corpus directory receives them); the seeds are only read.
fuzz() {
  local target="$1" time="$2" dict="$3" seeds="$4"
  local corpus="$build/fuzz-corpus/$target"
  mkdir -p "$corpus"
  "$build/fuzz/$target" \
    -max_total_time="$time" \
    -dict="$dict" \
    -max_len=4096 \
    -timeout=10 \
    -rss_limit_mb=2048 \
    -print_final_stats=1 \
    -artifact_prefix="$artifacts/" \
    "$corpus" "$seeds"
}

fuzz safetensors_header_fuzz "$seconds" "$root/fuzz/safetensors.dict" "$root/fuzz/corpus/safetensors"
# Jinja templates, seeded with the real chat templates.
fuzz jinja_fuzz "${JINJA_FUZZ_SECONDS:-20}" "$root/fuzz/jinja.dict" "$root/testdata/chat_templates"
# OpenAI request bodies.
fuzz openai_request_fuzz "${OPENAI_FUZZ_SECONDS:-20}" "$root/fuzz/openai.dict" "$root/fuzz/corpus/openai"
# Structured-output specs: grammars, regexes, JSON schemas.
fuzz grammar_fuzz "${GRAMMAR_FUZZ_SECONDS:-20}" "$root/fuzz/grammar.dict" "$root/fuzz/corpus/grammar"
# Model output text: tool calls in every format, reasoning.
fuzz chat_output_fuzz "${CHAT_OUTPUT_FUZZ_SECONDS:-20}" "$root/fuzz/chat_output.dict" "$root/fuzz/corpus/chat_output"
# Replicas' /metrics text, as the gateway reads it.
fuzz prometheus_fuzz "${PROMETHEUS_FUZZ_SECONDS:-20}" "$root/fuzz/prometheus.dict" "$root/fuzz/corpus/prometheus"
# Deployment specs (basalt.yaml).
fuzz deploy_spec_fuzz "${DEPLOY_FUZZ_SECONDS:-20}" "$root/fuzz/deploy.dict" "$root/fuzz/corpus/deploy"
# Workflow definitions (basalt route --workflows) and their templates.
fuzz workflow_fuzz "${WORKFLOW_FUZZ_SECONDS:-20}" "$root/fuzz/workflow.dict" "$root/fuzz/corpus/workflow"
