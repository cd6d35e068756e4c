#!/usr/bin/env bash
# Runs a built image as the rendered manifests run it (user 10001, a
# read-only root file system with /tmp writable, no capabilities) and checks
# that it serves: one replica answering a completion, then a replica over two
# nodes (a leader and a worker container, as a LeaderWorkerSet group runs
# them) answering the same, both stopping cleanly when stopped together.
#   deploy/image-test.sh basalt:cpu [PORT]
# Needs a Docker engine; uses the host's network (127.0.0.1:PORT and PORT+1,
# and PORT+2 between the nodes). Not run by CI (no engine there).
set -euo pipefail
image=${1:?usage: deploy/image-test.sh IMAGE [PORT]}
port=${2:-18080}
run=(docker run -d --network host --read-only --tmpfs /tmp --cap-drop ALL --security-opt no-new-privileges)
names=()
cleanup() { [[ ${#names[@]} -gt 0 ]] && docker rm -f "${names[@]}" > /dev/null 2>&1 || true; }
trap cleanup EXIT

wait_ready() {
  for _ in $(seq 1 120); do
    curl -sf "http://127.0.0.1:$1/ready" > /dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "not ready on port $1" >&2
  return 1
}
complete() {
  curl -sf "http://127.0.0.1:$1/v1/completions" -H 'content-type: application/json' \
    -d '{"model":"basalt-mini","prompt":"The Debian project","max_tokens":12,"temperature":0}' |
    sed -n 's/.*"text":"\([^"]*\)".*/\1/p'
}

tag=$RANDOM
names+=("basalt-one-$tag")
"${run[@]}" --name "basalt-one-$tag" "$image" serve --host 127.0.0.1 --port "$port" > /dev/null
wait_ready "$port"
one=$(complete "$port")
[[ $(docker exec "basalt-one-$tag" id -u) == 10001 ]] || { echo "not running as 10001" >&2; exit 1; }
docker stop -t 60 "basalt-one-$tag" > /dev/null
echo "one replica: '$one'"

names+=("basalt-worker-$tag" "basalt-leader-$tag")
nodes=(--model /models/basalt-mini --tp 2 --nnodes 2)
"${run[@]}" --name "basalt-worker-$tag" "$image" serve "${nodes[@]}" --node-rank 1 \
  --dist-init-addr "127.0.0.1:$((port + 2))" > /dev/null
"${run[@]}" --name "basalt-leader-$tag" "$image" serve --host 127.0.0.1 --port "$((port + 1))" "${nodes[@]}" \
  --node-rank 0 --dist-init-addr "0.0.0.0:$((port + 2))" > /dev/null
wait_ready "$((port + 1))"
two=$(complete "$((port + 1))")
echo "two nodes: '$two'"
[[ "$two" == "$one" ]] || { echo "the two nodes answered otherwise than one replica" >&2; exit 1; }
docker stop -t 60 "basalt-worker-$tag" "basalt-leader-$tag" > /dev/null
for n in "basalt-worker-$tag" "basalt-leader-$tag"; do
  code=$(docker inspect -f '{{.State.ExitCode}}' "$n")
  [[ $code == 0 ]] || { echo "$n exited $code" >&2; docker logs "$n" 2>&1 | tail -5 >&2; exit 1; }
done
echo "image $image: ok"
