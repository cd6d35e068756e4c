#!/usr/bin/env bash
# Basalt against llama.cpp on the CPU, on the same weights, alternated in one
# run. Run by hand (not in CI), from the repository root, after Basalt's
# release build (scripts/build.sh):
#
#   bench/peers/llama_cpp/compare.sh LLAMA_CPP_DIR [--layers 16] [--threads 2]
#                                    [--rounds 3] [--work DIR] [--formats LIST]
#                                    [--isa native|avx2]
#
# LLAMA_CPP_DIR is a llama.cpp source checkout (not part of this repository).
# The script
#  1. builds its llama-bench and llama-quantize (CMake, -DGGML_NATIVE=ON, in
#     LLAMA_CPP_DIR/build-basalt; kept between runs; with --isa avx2, for
#     AVX2 + FMA + F16C only, in LLAMA_CPP_DIR/build-basalt-avx2);
#  2. writes a random-weight Llama-3.2-1B-shaped model (16 layers, hidden
#     2048, MLP 8192, 32 query / 8 KV heads, the bundled tokenizer's 8,192
#     ids) as Hugging Face safetensors (basalt_write_llama_model), an f16
#     copy, Basalt's int8 and int4 copies (`basalt quantize`), and the same
#     weights as GGUF: bf16 and f16 (convert.py, with llama.cpp's own gguf-py,
#     which needs python3-numpy; older checkouts' gguf-py also imports
#     python3-sentencepiece and python3-yaml), then Q8_0, Q4_0 and Q4_K_M
#     (llama-quantize from the bf16 GGUF);
#  3. runs, round after round, each pair back to back: basalt_bench_model
#     and llama-bench (-p 128,512 -n 64 -r 1), both at --threads threads;
#  4. prints the median tokens/s of each side over the rounds and their
#     ratio (Basalt / llama.cpp: above 1, Basalt is faster).
#
# Pairs (--formats, default all): bf16 (bf16/bf16), f16 (f16/f16), int8
# (Basalt int8, 32-column groups / Q8_0), int4 (Basalt int4, 32-column groups
# / Q4_0, and / Q4_K_M), bundled (the bundled DeepSeek-V3-layout model,
# models/basalt-mini, as llama.cpp's deepseek2 in bf16; tg256, since a token
# takes half a millisecond). The work directory (default
# /var/tmp/basalt-vs-llama-cpp) takes about 9 GB and is kept, so a second run
# skips the writing.
#
# --isa avx2 times both engines as an AVX2 machine without AVX-512 runs them,
# on any machine with AVX2: llama.cpp as above, Basalt from BASALT_BUILD_DIR
# (default build-avx2), a build for x86-64-v3 made first with
#   cmake -S . -B build-avx2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DBASALT_CUDA=OFF \
#     -DBASALT_NATIVE=OFF -DCMAKE_CXX_FLAGS=-march=x86-64-v3
#   ninja -C build-avx2 basalt basalt_bench_model basalt_write_llama_model
set -euo pipefail

usage() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 2; }
[[ $# -ge 1 && $1 != -* ]] || usage
LLAMA_CPP=$(cd "$1" 2> /dev/null && pwd) || { echo "compare.sh: $1: no such directory" >&2; exit 1; }
shift
LAYERS=16 THREADS=2 ROUNDS=3 WORK=/var/tmp/basalt-vs-llama-cpp FORMATS="bf16 f16 int8 int4 bundled" ISA=native
while [[ $# -gt 0 ]]; do
  case $1 in
    --layers) LAYERS=$2; shift 2 ;;
    --threads) THREADS=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    --work) WORK=$2; shift 2 ;;
    --formats) FORMATS=${2//,/ }; shift 2 ;;
    --isa) ISA=$2; shift 2 ;;
    *) usage ;;
  esac
done

ROOT=$(pwd)
case $ISA in
  native) BUILD=${BASALT_BUILD_DIR:-$ROOT/build} LSUFFIX="" GGML_ISA=(-DGGML_NATIVE=ON) ;;
  avx2)
    BUILD=${BASALT_BUILD_DIR:-$ROOT/build-avx2} LSUFFIX=-avx2
    GGML_ISA=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON)
    ;;
  *) echo "compare.sh: --isa $ISA: expected native or avx2" >&2; exit 2 ;;
esac
PYTHON=${PYTHON:-python3}
for tool in "$BUILD/bench/basalt_write_llama_model" "$BUILD/bench/basalt_bench_model" "$BUILD/bin/basalt"; do
  [[ -x $tool ]] || { echo "compare.sh: $tool is missing: build Basalt first (scripts/build.sh)" >&2; exit 1; }
done
[[ -f $LLAMA_CPP/CMakeLists.txt && -d $LLAMA_CPP/gguf-py ]] ||
  { echo "compare.sh: $LLAMA_CPP is not a llama.cpp checkout (no CMakeLists.txt or gguf-py)" >&2; exit 1; }
"$PYTHON" -c "import numpy" 2>/dev/null ||
  { echo "compare.sh: $PYTHON has no numpy (apt-get install python3-numpy)" >&2; exit 1; }

mkdir -p "$WORK"
echo "== building llama.cpp's llama-bench and llama-quantize"
LBUILD=$LLAMA_CPP/build-basalt$LSUFFIX
cmake -S "$LLAMA_CPP" -B "$LBUILD" -DCMAKE_BUILD_TYPE=Release "${GGML_ISA[@]}" -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF > "$WORK/llama-cpp-build.log" 2>&1 || { cat "$WORK/llama-cpp-build.log"; exit 1; }
cmake --build "$LBUILD" --target llama-bench llama-quantize -j "$(nproc)" >> "$WORK/llama-cpp-build.log" 2>&1 ||
  { tail -30 "$WORK/llama-cpp-build.log"; exit 1; }
LLAMA_BENCH=$LBUILD/bin/llama-bench
LLAMA_QUANTIZE=$LBUILD/bin/llama-quantize

# step OUTPUT COMMAND...: runs the command unless OUTPUT exists, its output
# in OUTPUT.log; a failed command's partial output is removed (so the next
# run writes it again) and the end of its log printed.
step() {
  local out=$1; shift
  [[ -e $out ]] && return 0
  echo "== writing $out"
  "$@" > "$out.log" 2>&1 || { tail -20 "$out.log"; rm -rf "$out"; exit 1; }
}
CONVERT=$ROOT/bench/peers/llama_cpp/convert.py
step "$WORK/bf16" "$BUILD/bench/basalt_write_llama_model" --out "$WORK/bf16" --layers "$LAYERS" --hidden 2048 \
  --intermediate 8192 --heads 32 --kv-heads 8
step "$WORK/f16" "$PYTHON" "$CONVERT" f16 "$WORK/bf16" "$WORK/f16"
step "$WORK/int8" "$BUILD/bin/basalt" quantize --model "$WORK/bf16" --out "$WORK/int8" --format int8 --group-size 32
step "$WORK/int4" "$BUILD/bin/basalt" quantize --model "$WORK/bf16" --out "$WORK/int4" --format int4 --group-size 32
for t in bf16 f16; do
  step "$WORK/$t.gguf" "$PYTHON" "$CONVERT" gguf "$WORK/bf16" "$WORK/$t.gguf" --type $t --gguf-py "$LLAMA_CPP/gguf-py"
done
for q in Q8_0 Q4_0 Q4_K_M; do
  step "$WORK/$q.gguf" "$LLAMA_QUANTIZE" "$WORK/bf16.gguf" "$WORK/$q.gguf" $q
done
step "$WORK/basalt-mini.gguf" "$PYTHON" "$CONVERT" gguf "$ROOT/models/basalt-mini" "$WORK/basalt-mini.gguf" \
  --type bf16 --gguf-py "$LLAMA_CPP/gguf-py"

PAIRS=()
for f in $FORMATS; do
  case $f in
    bf16) PAIRS+=("bf16 $WORK/bf16 bf16.gguf 64") ;;
    f16) PAIRS+=("f16 $WORK/f16 f16.gguf 64") ;;
    int8) PAIRS+=("int8/Q8_0 $WORK/int8 Q8_0.gguf 64") ;;
    int4) PAIRS+=("int4/Q4_0 $WORK/int4 Q4_0.gguf 64" "int4/Q4_K_M $WORK/int4 Q4_K_M.gguf 64") ;;
    bundled) PAIRS+=("bundled $ROOT/models/basalt-mini basalt-mini.gguf 256") ;;
    *) echo "compare.sh: unknown format $f (bf16, f16, int8, int4, bundled)" >&2; exit 2 ;;
  esac
done

RESULTS=$WORK/results.jsonl
: > "$RESULTS"
for round in $(seq "$ROUNDS"); do
  for pair in "${PAIRS[@]}"; do
    read -r label ours theirs tokens <<< "$pair"
    echo "== round $round: $label"
    basalt=$(BASALT_NUM_THREADS=$THREADS "$BUILD/bench/basalt_bench_model" --model "$ours" \
      --prompt 128,512 --tokens "$tokens" --json)
    llama=$("$LLAMA_BENCH" -m "$WORK/$theirs" -p 128,512 -n "$tokens" -t "$THREADS" -r 1 -o json 2> /dev/null)
    "$PYTHON" - "$label" "$basalt" "$llama" >> "$RESULTS" <<'EOF'
import json, sys
label, ours, theirs = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
for run in theirs:
    test = f"pp{run['n_prompt']}" if run["n_gen"] == 0 else f"tg{run['n_gen']}"
    print(json.dumps({"pair": label, "test": test, "basalt": ours[test], "llama_cpp": run["avg_ts"]}))
EOF
  done
done

"$PYTHON" - "$RESULTS" "$THREADS" "$ROUNDS" "$ISA" <<'EOF'
import collections, json, statistics, sys
rows = collections.defaultdict(lambda: ([], []))
for line in open(sys.argv[1]):
    r = json.loads(line)
    rows[(r["pair"], r["test"])][0].append(r["basalt"])
    rows[(r["pair"], r["test"])][1].append(r["llama_cpp"])
print(f"\ntokens/s, median of {sys.argv[3]} alternated rounds, {sys.argv[2]} threads, {sys.argv[4]} builds;"
      " x = Basalt / llama.cpp")
print(f"| {'pair':<12} | {'test':<6} | {'Basalt':>8} | {'llama.cpp':>9} | {'x':>5} |")
print(f"|{'-' * 14}|{'-' * 8}|{'-' * 10}|{'-' * 11}|{'-' * 7}|")
for (pair, test), (ours, theirs) in rows.items():
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"| {pair:<12} | {test:<6} | {a:8.2f} | {b:9.2f} | {a / b:5.2f} |")
EOF
