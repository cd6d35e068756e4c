#!/usr/bin/env bash
# Installs the Debian packages Basalt needs to build and test, skipping those
# already present. Safe to run repeatedly; needs root (or sudo) only when
# something is missing.
set -euo pipefail

# Boost 1.81 is Debian 12's newest; Ubuntu 24.04 (NVIDIA's CUDA images,
# deploy/Dockerfile.cuda) has 1.83 instead.
boost=libboost1.81-dev
if grep -qs '^ID=ubuntu' /etc/os-release; then
  boost=libboost1.83-dev
fi
packages=(
  build-essential cmake ninja-build ccache pkg-config git
  nlohmann-json3-dev libfmt-dev libcli11-dev
  "$boost" libssl-dev openssl libyaml-cpp-dev
  libgtest-dev libgmock-dev libbenchmark-dev libopenblas-dev
)
# Node.js runs the server tests with the openai npm client (Debian's nodejs
# when no newer one is installed); BASALT_WITH_NODE=0 leaves it out (the
# images, deploy/Dockerfile.*, build but do not test).
if [[ "${BASALT_WITH_NODE:-1}" == "1" ]] && { ! command -v node >/dev/null || ! command -v npm >/dev/null; }; then
  packages+=(nodejs npm)
fi
# The fuzzers need clang with libFuzzer; optional for a plain build.
if [[ "${BASALT_WITH_FUZZ:-0}" == "1" ]]; then
  packages+=(clang-14 libclang-rt-14-dev)
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then
  exit 0
fi

echo "installing: ${missing[*]}" >&2
sudo_cmd=()
if [[ $(id -u) -ne 0 ]]; then
  sudo_cmd=(sudo)
fi
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
