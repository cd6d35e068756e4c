#!/usr/bin/env bash
# Prints the Debian packages that hold the shared libraries BINARY loads,
# one per line, so that an image's runtime stage installs what its build
# stage linked against and nothing else (deploy/Dockerfile.*). Libraries
# outside the package database (the CUDA base image's own) are skipped and
# named on stderr.
#   deploy/runtime-packages.sh build/bin/basalt
set -euo pipefail
binary=${1:?usage: runtime-packages.sh BINARY}
[[ -x "$binary" ]] || { echo "runtime-packages.sh: $binary is not an executable" >&2; exit 1; }

# `ldd` lines: "libfmt.so.9 => /lib/x86_64-linux-gnu/libfmt.so.9 (0x...)".
mapfile -t libraries < <(ldd "$binary" | awk '$2 == "=>" && $3 ~ /^\// {print $3}')
((${#libraries[@]})) || { echo "runtime-packages.sh: ldd found no shared libraries in $binary" >&2; exit 1; }
for library in "${libraries[@]}"; do
  real=$(readlink -f "$library")
  package=""
  # Debian 12 merged /usr: the package database may record either spelling.
  for path in "$real" "${real#/usr}" "/usr$real" "$library"; do
    if owner=$(dpkg-query -S "$path" 2>/dev/null); then
      package=${owner%%:*}
      break
    fi
  done
  if [[ -z "$package" ]]; then
    echo "runtime-packages.sh: no Debian package holds $library (skipped)" >&2
    continue
  fi
  echo "$package"
done | sort -u
