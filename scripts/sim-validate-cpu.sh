#!/bin/bash
# The fleet simulator against a real run (docs/SCALING.md §1): measures this
# machine's step-time table for the bundled model with `basalt bench` (decode
# steps at batch 1 / 4 / 16 / 64, prefill at two prompt lengths, decode at a
# long context), then runs the same trace twice, once as `basalt bench`
# against `basalt serve` and once as `basalt sim` on the measured table, and
# prints TTFT P50 / P99 and throughput of both with their differences
# (within 15 % is the bar before the simulator's larger answers are trusted),
# and the five slowest requests by TTFT of the real run and of the simulated
# one, each with its TTFT on all three sides (both sides run with
# --save-detailed, which numbers requests by their place in the trace).
#
# Usage: scripts/sim-validate-cpu.sh BASALT_BINARY [OUT_DIR] [RATES] [PROMPTS] [serve flags...]
#   e.g. scripts/sim-validate-cpu.sh build/bin/basalt /tmp/simval 2,3 120 --threads 1 --no-radix-cache
# The real side runs each trace twice (their spread is the noise floor), so
# the server needs --no-radix-cache, or the second run would find the first's
# prompts cached (random prompts share nothing else).
# On a machine shared with other work, one compute thread (--threads 1) keeps
# step times steadier than threads that wait for each other at every layer.
# The table is written to OUT_DIR/cpu-table.json (bench/sim/cpu-basalt-mini.json
# is one such file); every JSON of both sides stays in OUT_DIR.
set -euo pipefail
basalt=$1 out=${2:-$(mktemp -d)} rates=${3:-4,6} prompts=${4:-120}
shift $(($# < 4 ? $# : 4))
mkdir -p "$out"
port=8797
"$basalt" serve --port "$port" --no-request-log "$@" 2>"$out/serve.log" &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
until python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)" \
  "http://127.0.0.1:$port/ready" 2>/dev/null; do
  kill -0 "$pid" 2>/dev/null || { cat "$out/serve.log"; exit 1; }
  sleep 0.2
done
kv=$(grep -o 'kv_slots=[0-9]*' "$out/serve.log" | head -1 | cut -d= -f2)
bench() {  # $1: name; the rest: bench flags
  local name=$1
  shift
  "$basalt" bench --base-url "http://127.0.0.1:$port" --ignore-eos --no-progress --output-json "$out/$name.json" \
    "$@" >/dev/null
}
echo "measuring the step table..." >&2
# Every run its own seed: prompts of one seed share their leading tokens
# whatever their length, and the radix cache would serve them.
# Decode steps: B requests at once with short prompts, then B = 16 with long
# ones for the cost of context.
for b in 1 4 16 64; do
  bench "decode-$b" --input-len 16 --output-len 64 --num-prompts $((b < 4 ? 4 : 2 * b)) --max-concurrency "$b" \
    --seed $((100 + b))
done
bench context --input-len 768 --output-len 64 --num-prompts 32 --max-concurrency 16 --seed 200
# Prefill: prompts arriving alone (Poisson, 1 a second, one output token), as
# a served request meets an idle server, not back to back.
for n in 64 192 320 448; do
  bench "prefill-$n" --input-len "$n" --output-len 1 --num-prompts 8 --request-rate 1 --seed $((300 + n))
done
python3 - "$out" "$kv" "$*" <<'PY'
import json, sys, time
out, kv, serve_flags = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def res(name): return json.load(open(f"{out}/{name}.json"))["results"][0]
decode = [[b, round(res(f"decode-{b}")["itl_ms"]["median"], 3)] for b in (1, 4, 16, 64)]
# Context on average: the prompt (with its BOS) plus half the 64 outputs.
def context(r): return r["input_tokens"] / r["completed"] + 32
base_ctx = context(res("decode-16"))
ctx = res("context")
long_ctx = context(ctx)
per_1k = max(0.0, (ctx["itl_ms"]["median"] - decode[2][1]) / (16 * (long_ctx - base_ctx) / 1000))
# Prefill of n tokens in one step: fixed + n / rate + pairs(n) x cost, pairs(n) = n (n + 1) / 2 (causal
# attention), fitted by least squares over four prompt lengths.
points = [(res(f"prefill-{n}")["input_tokens"] / 8, res(f"prefill-{n}")["ttft_ms"]["median"])
          for n in (64, 192, 320, 448)]
def fit(columns):
    rows = [[f(n) for f in columns] for n, _ in points]
    k = len(columns)
    a = [[sum(r[i] * r[j] for r in rows) for j in range(k)] for i in range(k)]
    b = [sum(r[i] * t for r, (_, t) in zip(rows, points)) for i in range(k)]
    for i in range(k):  # Gauss-Jordan
        p = a[i][i]
        a[i] = [x / p for x in a[i]]; b[i] /= p
        for j in range(k):
            if j != i:
                f = a[j][i]
                a[j] = [x - f * y for x, y in zip(a[j], a[i])]; b[j] -= f * b[i]
    return b
fixed, per_token, per_pair = fit([lambda n: 1, lambda n: n, lambda n: n * (n + 1) / 2 / 1e6])
if per_pair < 0:
    (fixed, per_token), per_pair = fit([lambda n: 1, lambda n: n]), 0.0
if fixed < 0:
    fixed = 0.0
rate = 1000 / per_token
table = {
  "name": "cpu-basalt-mini",
  "source": f"Measured by scripts/sim-validate-cpu.sh on {time.strftime('%Y-%m-%d')}: the bundled model on this "
            f"machine's CPU under `basalt serve {serve_flags}` (otherwise defaults); decode = median ITL of "
            "`basalt bench` at --max-concurrency "
            "B (16-token prompts, 64 outputs); context cost from the median ITL at B = 16 with 768-token prompts; "
            "prefill fixed cost, rate and attention cost fitted to the median TTFT of 64- to 448-token prompts "
            "arriving alone (Poisson, 1/s); KV = the "
            "server's kv_slots.",
  "decode_ms": decode,
  "decode_context_tokens": round(base_ctx, 1),
  "decode_ms_per_1k_context": round(per_1k, 4),
  "prefill_tokens_per_s": round(rate, 1),
  "prefill_fixed_ms": round(fixed, 3),
  "prefill_ms_per_1m_pairs": round(per_pair, 3),
  "max_running": 64,
  "step_token_budget": 512,
  "kv_capacity_tokens": kv,
}
json.dump(table, open(f"{out}/cpu-table.json", "w"), indent=2)
print(json.dumps(table, indent=2))
PY
IFS=, read -ra rate_list <<<"$rates"
seed=0
for rate in "${rate_list[@]}"; do
  echo "rate $rate: basalt bench against basalt serve..." >&2
  # Each rate its own prompts (seed = its index), so the radix cache does not carry one into the next.
  flags=(--dataset random --input-len 256 --output-len 128 --num-prompts "$prompts" --request-rate "$rate"
    --seed $((seed++)))
  # Twice: how far two real runs of one trace differ is the floor under any comparison.
  bench "real-$rate" "${flags[@]}" --save-detailed
  bench "again-$rate" "${flags[@]}" --save-detailed
  "$basalt" sim --step-table "$out/cpu-table.json" --replicas 1 "${flags[@]}" --save-detailed --json \
    >"$out/sim-$rate.json"
done
kill $pid
wait $pid 2>/dev/null || true
python3 - "$out" "$rates" <<'PY'
import json, sys
out, rates = sys.argv[1], sys.argv[2].split(",")
print(f"{'rate':>5} {'figure':<18} {'real':>9} {'again':>9} {'sim':>9} {'again/real':>11} {'sim/real':>9} "
      f"{'sim/again':>10}")
verdicts = []
for rate in rates:
    real = json.load(open(f"{out}/real-{rate}.json"))["results"][0]
    again = json.load(open(f"{out}/again-{rate}.json"))["results"][0]
    sim = json.load(open(f"{out}/sim-{rate}.json"))["results"]
    def pick(r, key, field): return r[key][field] if field else r[key]
    rows = [("TTFT P50 ms", "ttft_ms", "median", "ttft_ms", "median"),
            ("TTFT P99 ms", "ttft_ms", "p99", "ttft_ms", "p99"),
            ("ITL P50 ms", "itl_ms", "median", "itl_ms", "median"),
            ("requests/s", "request_throughput", None, "request_throughput", None),
            ("output tokens/s", "output_token_throughput", None, "output_throughput", None)]
    # The bar's figures (TTFT P50/P99, throughput): the largest difference of
    # the simulator from each real run, and of the real runs from each other.
    worst = {"real": 0.0, "again": 0.0, "spread": 0.0}
    def ratio(x, y): return x / y if y else float("nan")
    for name, rk, rf, sk, sf in rows:
        a, a2, b = pick(real, rk, rf), pick(again, rk, rf), pick(sim, sk, sf)
        if name.startswith("TTFT") or name.endswith("/s"):
            worst["real"] = max(worst["real"], abs(ratio(b, a) - 1))
            worst["again"] = max(worst["again"], abs(ratio(b, a2) - 1))
            worst["spread"] = max(worst["spread"], abs(ratio(a2, a) - 1))
        print(f"{rate:>5} {name:<18} {a:>9.1f} {a2:>9.1f} {b:>9.1f} {ratio(a2, a):>11.3f} {ratio(b, a):>9.3f} "
              f"{ratio(b, a2):>10.3f}")
    # The tail, request by request (the traces are the same: index k is the k-th arrival on both sides).
    def ttfts(r): return {d["index"]: d["ttft_ms"] for d in r.get("details", [])}
    t_real, t_again, t_sim = ttfts(real), ttfts(again), ttfts(sim)
    for side, ranked in (("real", t_real), ("sim", t_sim)):
        top = sorted(ranked, key=ranked.get, reverse=True)[:5]
        print(f"{rate:>5} slowest TTFT ({side}): " + ", ".join(
            f"#{k} {t_real.get(k, -1):.0f}/{t_again.get(k, -1):.0f}/{t_sim.get(k, -1):.0f}" for k in top) +
            " ms (real/again/sim)")
    nearer = "real" if worst["real"] <= worst["again"] else "again"
    verdicts.append(worst[nearer])
    print(f"{rate:>5} the simulator's largest difference on TTFT P50/P99 and throughput: {worst['real'] * 100:.1f} % "
          f"from the first real run, {worst['again'] * 100:.1f} % from the second; the two real runs differ by "
          f"up to {worst['spread'] * 100:.1f} %")
# The bar: the simulator reproduces a real run (the nearer of the two) within 15 % at every rate.
print(f"within 15 % of a real run at every rate: {'yes' if max(verdicts) <= 0.15 else 'NO'} "
      f"(worst {max(verdicts) * 100:.1f} %)")
PY
