#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA Hopper GPU and Basalt's build
# dependencies already there (this script installs nothing; CMAKE_PREFIX_PATH
# from the environment reaches cmake), it
#   1. configures a Release build with CUDA in the build directory and builds
#      the CUDA tests, the CUDA benchmarks, basalt and the model writer with
#      every core;
#   2. runs every CUDA test (ctest -L cuda);
#   3. runs the CUDA benchmarks: basalt_bench_cuda_linear,
#      basalt_bench_cuda_llama_decode (batch 1, 8, 64, 256) and every other
#      basalt_bench_cuda_* the build has (attention, FP8 GEMM, MLA, MoE, and
#      the DeepSeek-V3 slice, which writes ~38 GB to the temporary directory
#      and needs as much GPU memory);
#   4. writes a random-weight Llama-3.1-8B-shaped model (bench/write_llama_model.cc),
#      serves it with `basalt serve --device cuda`, load-tests it with
#      `basalt bench` (random 256-token prompts, 128 output tokens with
#      --ignore-eos, at 4 and 16 requests/s and all at once), and stops it;
#   5. prints a short summary last: tests passed/failed, decode ms/step and
#      prefill tokens/s per batch (the 8B-shaped model and the DeepSeek-V3
#      slice), TTFT and ITL P50/P99 per rate.
# Full logs go to $OUT (default ./gpu-check-out). About 10 minutes on an
# H200 with 16 cores, the build included (an estimate: the whole script has
# not run since the DeepSeek benchmarks joined it; run alone, those four took
# 68 s, the slice's 38 GB write and load included). Exit
# status: 0 when every step that ran passed, 1 otherwise, 2 on bad flags.
#
#   scripts/gpu-check.sh [--build-dir DIR] [--no-build] [--only tests|bench|serve]...
#                        [--layers N] [--port N] [--model-dir DIR] [--keep-model]
#
#   --build-dir DIR   build directory (default build-gpu)
#   --no-build        use the binaries already in the build directory
#   --only STEP       run only this step (tests, bench or serve; repeatable or
#                     comma-separated); the build runs unless --no-build
#   --layers N        decoder layers of the benchmarked and served models (default 32)
#   --port N          port of the server (default 8765)
#   --model-dir DIR   where the served model is written (default BUILD_DIR/llama8b-random);
#                     deleted afterwards unless --keep-model
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build_dir=build-gpu
do_build=1
steps=""
layers=32
port=8765
model_dir=""
keep_model=0

usage() { sed -n '/^#   scripts\/gpu-check.sh/,/^#                     deleted/p' "$0" | sed 's/^# \{0,1\}//'; }
while (($# > 0)); do
  case $1 in
    --build-dir) build_dir=${2:?--build-dir needs a value}; shift 2 ;;
    --no-build) do_build=0; shift ;;
    --only)
      for s in ${2//,/ }; do
        case $s in
          tests | bench | serve) steps="$steps $s" ;;
          *) echo "gpu-check: --only $s: expected tests, bench or serve" >&2; exit 2 ;;
        esac
      done
      shift 2 ;;
    --layers) layers=${2:?--layers needs a value}; shift 2 ;;
    --port) port=${2:?--port needs a value}; shift 2 ;;
    --model-dir) model_dir=${2:?--model-dir needs a value}; shift 2 ;;
    --keep-model) keep_model=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "gpu-check: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
done
[[ -z $steps ]] && steps=" tests bench serve"
[[ $layers =~ ^[1-9][0-9]*$ ]] || { echo "gpu-check: --layers $layers: expected a positive integer" >&2; exit 2; }
[[ $port =~ ^[1-9][0-9]*$ ]] || { echo "gpu-check: --port $port: expected a port number" >&2; exit 2; }

out=${OUT:-./gpu-check-out}
mkdir -p "$out" || exit 1
out=$(cd "$out" && pwd)
case $build_dir in /*) ;; *) build_dir=$root/$build_dir ;; esac
[[ -z $model_dir ]] && model_dir=$build_dir/llama8b-random
case $model_dir in /*) ;; *) model_dir=$PWD/$model_dir ;; esac
jobs=$(nproc)
started=$SECONDS
failed_steps=()
summary=()

wants() { [[ " $steps " == *" $1 "* ]]; }
note() { printf '[gpu-check %4ds] %s\n' $((SECONDS - started)) "$*"; }
fail() {
  failed_steps+=("$1")
  note "FAILED: $1 (see $2)"
}

# --- 1. build -------------------------------------------------------------
if ((do_build)); then
  command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]] ||
    { echo "gpu-check: nvcc not found (the CUDA toolkit is needed to build)" >&2; exit 1; }
  command -v ninja >/dev/null || { echo "gpu-check: ninja not found" >&2; exit 1; }
  note "configure (Release, CUDA) in $build_dir"
  if ! cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBASALT_CUDA=ON \
      -DBASALT_TESTS=ON -DBASALT_BENCH=ON >"$out/configure.log" 2>&1; then
    fail configure "$out/configure.log"
    tail -20 "$out/configure.log"
    exit 1
  fi
  # Every CUDA test and benchmark the build defines, so new ones join by themselves.
  mapfile -t targets < <(ninja -C "$build_dir" -t targets all 2>/dev/null |
    sed -n 's/^\(basalt_cuda_[a-z0-9_]*test\|basalt_bench_cuda_[a-z0-9_]*\): phony$/\1/p' | sort -u)
  targets+=(basalt basalt_write_llama_model)
  note "build with $jobs jobs: ${targets[*]}"
  if ! cmake --build "$build_dir" -j "$jobs" --target "${targets[@]}" >"$out/build.log" 2>&1; then
    fail build "$out/build.log"
    grep -m 20 -E 'error|Error' "$out/build.log"
    exit 1
  fi
fi
[[ -x $build_dir/bin/basalt ]] || { echo "gpu-check: $build_dir/bin/basalt is missing (build first)" >&2; exit 1; }
gpu_name="nvidia-smi not found"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi >"$out/nvidia-smi.txt" 2>&1
  gpu_name=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -1)
fi

# --- 2. tests -------------------------------------------------------------
if wants tests; then
  note "CUDA tests (ctest -L cuda)"
  if ctest --test-dir "$build_dir" -L cuda -j 4 --timeout 600 --output-on-failure >"$out/tests.log" 2>&1; then
    :
  else
    fail tests "$out/tests.log"
  fi
  line=$(grep -E 'tests passed|No tests were found' "$out/tests.log" | tail -1)
  total=$(sed -n 's/.*out of \([0-9]*\).*/\1/p' <<<"$line")
  nfail=$(sed -n 's/.* \([0-9]*\) tests failed.*/\1/p' <<<"$line")
  nskip=$(grep -c '\*\*\*Skipped' "$out/tests.log")
  if [[ -n $total ]]; then
    summary+=("tests: $((total - nfail - nskip)) passed, $nfail failed, $nskip skipped of $total (ctest -L cuda)")
  else
    summary+=("tests: no result ($line)")
  fi
  mapfile -t failed_tests < <(grep -E '^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess aborted|Exception)' \
    "$out/tests.log" | head -8)
  for l in "${failed_tests[@]}"; do summary+=("  failed:$l"); done
fi

# --- 3. benchmarks --------------------------------------------------------
if wants bench; then
  for exe in "$build_dir"/bench/basalt_bench_cuda_*; do
    [[ -x $exe ]] || continue
    name=$(basename "$exe")
    args=()
    [[ $name == basalt_bench_cuda_llama_decode ]] && args=(--layers "$layers" --prompt 512 --tokens 20)
    note "$name ${args[*]}"
    if "$exe" "${args[@]}" >"$out/$name.log" 2>&1; then
      summary+=("$name: ok ($out/$name.log)")
    else
      fail "$name" "$out/$name.log"
      summary+=("$name: FAILED ($out/$name.log)")
    fi
  done
  decode_log=$out/basalt_bench_cuda_llama_decode.log
  decode_row='^[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+$'
  if grep -qE "$decode_row" "$decode_log" 2>/dev/null; then
    summary+=("$(printf '%-24s %6s %9s %10s %9s %11s %14s' "decode ($layers layers)" batch "eager ms" "graphed ms" \
      tokens/s graph/floor "prefill tok/s")")
    while read -r b eager ms tps ratio prefill; do
      summary+=("$(printf '%-24s %6s %9s %10s %9s %11s %14s' "" "$b" "$eager" "$ms" "$tps" "$ratio" "$prefill")")
    done < <(grep -E "$decode_row" "$decode_log")
  fi
  slice_log=$out/basalt_bench_cuda_deepseek_slice.log
  slice_row='^[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+$'
  if grep -qE "$slice_row" "$slice_log" 2>/dev/null; then
    summary+=("$(printf '%-24s %6s %9s %10s %9s %11s %14s' "DeepSeek-V3 slice" batch "eager ms" "graphed ms" \
      tokens/s graph/floor "prefill tok/s")")
    prefill=$(sed -nE 's/^prefill, one prompt of [0-9]+ tokens: ([0-9]+) tokens\/s$/\1/p' "$slice_log" | head -1)
    while read -r b eager ms tps _ _ ratio; do
      summary+=("$(printf '%-24s %6s %9s %10s %9s %11s %14s' "" "$b" "$eager" "$ms" "$tps" "$ratio" "${prefill:-?}")")
    done < <(grep -E "$slice_row" "$slice_log" | head -3)
  fi
fi

# --- 4. serve an 8B-shaped model and load-test it --------------------------
server_pid=""
stop_server() {
  if [[ -n $server_pid ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill -TERM "$server_pid" 2>/dev/null
    for _ in $(seq 1 100); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.2; done
    kill -0 "$server_pid" 2>/dev/null && kill -KILL "$server_pid" 2>/dev/null
    wait "$server_pid" 2>/dev/null
  fi
  server_pid=""
}
trap stop_server EXIT

if wants serve; then
  base=http://127.0.0.1:$port
  note "write the model ($layers layers) to $model_dir"
  if ! "$build_dir/bench/basalt_write_llama_model" --out "$model_dir" --layers "$layers" --force \
      >"$out/write-model.log" 2>&1; then
    fail write-model "$out/write-model.log"
  else
    summary+=("model: $(tail -1 "$out/write-model.log")")
    note "basalt serve --device cuda on port $port"
    "$build_dir/bin/basalt" serve --device cuda --model "$model_dir" --port "$port" --max-running 128 \
      --no-request-log >"$out/serve.log" 2>&1 &
    server_pid=$!
    ready=0
    for _ in $(seq 1 900); do
      kill -0 "$server_pid" 2>/dev/null || break
      if curl -sf "$base/ready" >/dev/null 2>&1; then ready=1; break; fi
      sleep 0.2
    done
    if ((!ready)); then
      fail serve "$out/serve.log"
      tail -5 "$out/serve.log"
    else
      note "server ready after $((SECONDS - started)) s; one completion, then basalt bench"
      curl -s "$base/v1/completions" -H 'Content-Type: application/json' \
        -d '{"prompt": "The Debian project", "max_tokens": 16, "temperature": 0}' >"$out/completion.json" 2>&1
      if grep -q '"choices"' "$out/completion.json"; then
        summary+=("completion: answered ($out/completion.json)")
      else
        fail completion "$out/completion.json"
      fi
      if ! "$build_dir/bin/basalt" bench --base-url "$base" --model "$model_dir" --dataset random \
          --input-len 256 --output-len 128 --ignore-eos --num-prompts 64 --sweep-rates 4,16,inf --seed 0 \
          --no-progress --output-json "$out/serve-bench.json" >"$out/serve-bench.log" 2>&1; then
        fail serve-bench "$out/serve-bench.log"
      fi
    fi
    stop_server
  fi
  ((keep_model)) || rm -rf "$model_dir"
  if [[ -s $out/serve-bench.json ]]; then
    summary+=("$(printf '%-24s %6s %7s %7s %9s %19s %15s' "serve (256 in/128 out)" rate "done" req/s "out tok/s" \
      "TTFT P50/P99 ms" "ITL P50/P99 ms")")
    if command -v python3 >/dev/null; then
      mapfile -t rows < <(python3 - "$out/serve-bench.json" <<'EOF'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    t, i = r["ttft_ms"], r["itl_ms"]
    print("%-24s %6s %7s %7.2f %9.0f %9.1f / %-7.1f %6.1f / %-6.1f" % (
        "", r["request_rate"], "%d/%d" % (r["completed"], r["requests"]), r["request_throughput"],
        r["output_token_throughput"], t["median"], t["p99"], i["median"], i["p99"]))
EOF
      )
    elif command -v jq >/dev/null; then
      mapfile -t rows < <(jq -r '.results[] | "\(.request_rate) \(.completed)/\(.requests) \(.request_throughput) \(.output_token_throughput) \(.ttft_ms.median)/\(.ttft_ms.p99) \(.itl_ms.median)/\(.itl_ms.p99)"' \
        "$out/serve-bench.json")
    else
      rows=("  (no python3 or jq to read $out/serve-bench.json; see $out/serve-bench.log)")
    fi
    summary+=("${rows[@]}")
  fi
fi

# --- 5. summary -----------------------------------------------------------
echo
echo "== gpu-check summary ($gpu_name; $((SECONDS - started)) s; logs in $out)"
for l in "${summary[@]}"; do echo "$l"; done
if ((${#failed_steps[@]} > 0)); then
  echo "FAILED steps: ${failed_steps[*]}"
  exit 1
fi
echo "all steps passed"
