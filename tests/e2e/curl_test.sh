#!/usr/bin/env bash
# `basalt serve` driven by curl, as the README's quickstart shows it: health,
# readiness, models, completions (whole and streamed), chat, tokenize, the
# metrics page, and the error answers (400, 401, 404, 405, 413, 429).
# Usage: tests/e2e/curl_test.sh BASALT_BINARY
set -euo pipefail
binary="$1"
work="$(mktemp -d)"
log="$work/server.log"
printf '# keys, one per line\nsk-from-file\n' >"$work/keys.txt"
"$binary" serve --port 0 --api-key sk-curl --api-key-file "$work/keys.txt" --max-body-bytes 4096 \
  --max-running 1 --max-queue 0 >/dev/null 2>"$log" &
pid=$!
cleanup() { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
for _ in $(seq 1 600); do
  grep -q " info ready " "$log" && break
  kill -0 "$pid" 2>/dev/null || { cat "$log"; exit 1; }
  sleep 0.1
done
port="$(sed -n 's/.*listening url=http:\/\/127.0.0.1:\([0-9]*\).*/\1/p' "$log" | head -1)"
base="http://127.0.0.1:$port"
auth=(-H "Authorization: Bearer sk-curl")
failures=0
check() {  # check NAME EXPECTED_STATUS PATTERN curl-args...
  local name="$1" want="$2" pattern="$3"
  shift 3
  local body status
  body="$(curl -sS -o - -w '\n%{http_code}' "$@")"
  status="${body##*$'\n'}"
  body="${body%$'\n'*}"
  if [[ "$status" != "$want" ]] || ! grep -qE -- "$pattern" <<<"$body"; then
    echo "FAIL $name: status $status (want $want), body: ${body:0:400}"
    failures=$((failures + 1))
  else
    echo "ok   $name"
  fi
}
json=(-H "Content-Type: application/json")
check health 200 '"ok"' "$base/health"
check ready 200 '"ready"' "$base/ready"
check models 200 '"basalt-mini"' "${auth[@]}" "$base/v1/models"
check completion 200 '"text_completion"' "${auth[@]}" "${json[@]}" "$base/v1/completions" \
  -d '{"model": "basalt-mini", "prompt": "Free software is", "max_tokens": 8, "temperature": 0}'
check stream 200 'data: \[DONE\]' -N "${auth[@]}" "${json[@]}" "$base/v1/completions" \
  -d '{"prompt": "Free software is", "max_tokens": 8, "stream": true}'
check chat 200 '"chat.completion"' "${auth[@]}" "${json[@]}" "$base/v1/chat/completions" \
  -d '{"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 8}'
check tokenize 200 '"tokens":\[' "${auth[@]}" "${json[@]}" "$base/tokenize" -d '{"prompt": "Hello world"}'
check detokenize 200 '"prompt":' "${auth[@]}" "${json[@]}" "$base/detokenize" -d '{"tokens": [1, 2, 3]}'
check metrics 200 'vllm:num_requests_waiting' "$base/metrics"
check key-from-file 200 '"basalt-mini"' -H "Authorization: Bearer sk-from-file" "$base/v1/models"
check template-raises 400 'chat template error: .*no tools here' "${auth[@]}" "${json[@]}" "$base/v1/chat/completions" \
  -d '{"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ raise_exception(\"no tools here\") }}"}'
check template-syntax 400 'chat template error' "${auth[@]}" "${json[@]}" "$base/v1/chat/completions" \
  -d '{"messages": [{"role": "user", "content": "x"}], "chat_template": "{% for %}"}'
check no-key 401 'authentication_error' "$base/v1/models"
check bad-key 401 'authentication_error' -H "Authorization: Bearer nope" "$base/v1/models"
check bad-json 400 'not valid JSON' "${auth[@]}" "${json[@]}" "$base/v1/completions" -d '{"prompt": '
check wrong-type 400 '"param":"max_tokens"' "${auth[@]}" "${json[@]}" "$base/v1/completions" \
  -d '{"prompt": "x", "max_tokens": "ten"}'
check unknown-model 404 'does not exist' "${auth[@]}" "${json[@]}" "$base/v1/completions" \
  -d '{"model": "gpt-9", "prompt": "x"}'
check unknown-path 404 'no route' "${auth[@]}" "$base/v2/everything"
check wrong-method 405 'use POST' "${auth[@]}" "$base/v1/completions"
check too-large 413 'larger than the limit' "${auth[@]}" "${json[@]}" "$base/v1/completions" \
  -d "{\"prompt\": \"$(head -c 8000 /dev/zero | tr '\0' 'a')\"}"
# With --max-running 1 and --max-queue 0, a second request while one runs is 429.
curl -sS -N "${auth[@]}" "${json[@]}" "$base/v1/completions" \
  -d '{"prompt": "Hold the only slot", "max_tokens": 400, "ignore_eos": true, "stream": true}' >"$work/long.txt" &
long=$!
for _ in $(seq 1 100); do [[ -s "$work/long.txt" ]] && break; sleep 0.05; done
headers="$(curl -sS -D - -o /dev/null "${auth[@]}" "${json[@]}" "$base/v1/completions" -d '{"prompt": "x"}')"
if grep -q "^HTTP/1.1 429" <<<"$headers" && grep -qi "^Retry-After: 1" <<<"$headers"; then
  echo "ok   queue-full"
else
  echo "FAIL queue-full: $headers"
  failures=$((failures + 1))
fi
wait "$long"
# The request log has ids, sizes and timings, never the text.
if grep -q "Free software" "$log"; then
  echo "FAIL request log contains prompt text"
  failures=$((failures + 1))
fi
grep -q "request id=cmpl-" "$log" || { echo "FAIL no request log lines"; failures=$((failures + 1)); }
kill -TERM "$pid"
wait "$pid" || { echo "FAIL exit status $?"; failures=$((failures + 1)); }
trap - EXIT
rm -rf "$work"
if ((failures > 0)); then
  echo "$failures failures"
  exit 1
fi
echo "all curl checks passed"
