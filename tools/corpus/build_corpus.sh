#!/usr/bin/env bash
# Builds the English training corpus of the bundled models from Debian 12
# packages that ship prose under free licenses (tools/corpus/SOURCES.md lists
# them with their licenses and the checksums of the expected result).
#
#   tools/corpus/build_corpus.sh [OUT_DIR]      (default: build-corpus/corpus)
#
# Installs the packages (needs root or sudo), extracts and cleans their text
# with clean_corpus.py (standard library only), and writes OUT_DIR/train.txt,
# OUT_DIR/valid.txt, OUT_DIR/stats.json, OUT_DIR/packages.txt (the installed
# versions) and OUT_DIR/SHA256SUMS. The same package versions give the same
# bytes.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="${1:-build-corpus/corpus}"

packages=(
  apache2-doc
  base-files
  bash-doc
  debian-faq
  debian-handbook
  debian-policy
  debian-reference-en
  developers-reference
  fortunes
  fortunes-min
  git-doc
  installation-guide-amd64
  gnu-standards
  jargon-text
  maint-guide
  perl-doc
  postgresql-doc-15
  python-django-doc
  python3.11-doc
  sqlite3-doc
  vim-runtime
)

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  $sudo apt-get update
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y --no-install-recommends "${missing[@]}"
fi

mkdir -p "$out"
python3 "$here/clean_corpus.py" "$out"
dpkg-query -W -f='${Package} ${Version}\n' "${packages[@]}" > "$out/packages.txt"
(cd "$out" && sha256sum train.txt valid.txt > SHA256SUMS)
cat "$out/packages.txt" "$out/SHA256SUMS"
