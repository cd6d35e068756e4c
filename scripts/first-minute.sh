#!/bin/bash
# A fresh server's first requests against its steady state (issue 20: "serve,
# first load after start"), with and without --warmup: starts `basalt serve`,
# runs `basalt bench` at RATE requests/s for N prompts as soon as /ready
# answers 200 (the first load), then the same again (steady), and prints the
# P99 and max ITL and TTFT of both, for --warmup off and on.
#
# Usage: scripts/first-minute.sh BASALT_BINARY MODEL_DIR [RATE] [N] [serve flags...]
#   e.g. scripts/first-minute.sh build-gpu/bin/basalt /tmp/m8b 4 120 --device cuda
set -euo pipefail
basalt=$1 model=$2 rate=${3:-4} prompts=${4:-120}
shift $(( $# < 4 ? $# : 4 ))
port=8799
out=$(mktemp -d)
bench() {  # $1: label, $2: seed
  "$basalt" bench --base-url "http://127.0.0.1:$port" --model "$model" --dataset random --input-len 256 \
    --output-len 64 --ignore-eos --num-prompts "$prompts" --request-rate "$rate" --seed "$2" --no-progress \
    --output-json "$out/$1.json" >/dev/null
}
for warmup in off on; do
  start=$(date +%s.%N)
  "$basalt" serve --model "$model" --port "$port" --warmup "$warmup" --no-request-log "$@" 2>"$out/serve-$warmup.log" &
  pid=$!
  until python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)" "http://127.0.0.1:$port/ready" 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || { cat "$out/serve-$warmup.log"; exit 1; }
    sleep 0.2
  done
  ready=$(python3 -c "import sys; print(float(sys.argv[1]) - float(sys.argv[2]))" "$(date +%s.%N)" "$start")
  bench "first-$warmup" 1
  bench "steady-$warmup" 2
  kill "$pid"; wait "$pid" || true
  grep -h ' warmup ' "$out/serve-$warmup.log" || true
  python3 - "$out" "$warmup" "$ready" <<'PY'
import json, sys
out, warmup, ready = sys.argv[1], sys.argv[2], float(sys.argv[3])
row = lambda name: json.load(open(f"{out}/{name}-{warmup}.json"))["results"][0]
f, s = row("first"), row("steady")
print(f"--warmup {warmup}: ready after {ready:.1f} s")
for key in ("itl_ms", "ttft_ms"):
    print(f"  {key:8} P99 first {f[key]['p99']:8.1f}  steady {s[key]['p99']:8.1f}  ratio {f[key]['p99'] / s[key]['p99']:5.2f}x"
          f"   max first {f[key]['max']:8.1f}  steady {s[key]['max']:8.1f}")
PY
done
