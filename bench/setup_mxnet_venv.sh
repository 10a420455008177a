#!/usr/bin/env bash
# Create the MXNet 1.9.1 virtualenv that bench/bench_local.py compares pskv against.
#
#   bash bench/setup_mxnet_venv.sh            # -> bench/.venv-mxnet (git-ignored)
#   MXNET_VENV=/some/dir bash bench/setup_mxnet_venv.sh
#   MXNET_BASE_PYTHON=python3.10 bash bench/setup_mxnet_venv.sh
#
# Installs mxnet==1.9.1 and numpy<1.24 (MXNet 1.9.1 uses NumPy aliases removed in 1.24)
# from the package index with pip. numpy<1.24 has no wheels for Python >= 3.12, so the
# base interpreter must be Python 3.9 - 3.11: $MXNET_BASE_PYTHON if set, else the first
# suitable one of python3, python3.11, python3.10, python3.9.
#
# Idempotent: if the venv already imports mxnet 1.9.1 nothing is installed.
# Progress goes to stderr; the venv's python path is the only line on stdout:
#   py=$(bash bench/setup_mxnet_venv.sh)
set -euo pipefail

MXNET_VERSION="1.9.1"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${MXNET_VENV:-$here/.venv-mxnet}"
py="$venv/bin/python"

log() { echo "setup_mxnet_venv: $*" >&2; }

has_mxnet() {
    [ -x "$py" ] && "$py" -c "import sys, mxnet; sys.exit(mxnet.__version__ != '$MXNET_VERSION')" >/dev/null 2>&1
}

# Print a Python 3.9-3.11 interpreter to build the venv with, or fail.
base_python() {
    local candidates=("python3" "python3.11" "python3.10" "python3.9")
    if [ -n "${MXNET_BASE_PYTHON:-}" ]; then candidates=("$MXNET_BASE_PYTHON"); fi
    local c
    for c in "${candidates[@]}"; do
        if command -v "$c" >/dev/null 2>&1 &&
           "$c" -c 'import sys; sys.exit(not ((3, 9) <= sys.version_info[:2] <= (3, 11)))' 2>/dev/null; then
            command -v "$c"
            return 0
        fi
    done
    log "no Python 3.9-3.11 found (tried: ${candidates[*]}); numpy<1.24 needs one. Set MXNET_BASE_PYTHON."
    return 1
}

if has_mxnet; then
    log "$venv already has mxnet $MXNET_VERSION"
    echo "$py"
    exit 0
fi

base="$(base_python)"
log "creating $venv with $base ($("$base" --version 2>&1))"
"$base" -m venv "$venv"
log "installing mxnet==$MXNET_VERSION 'numpy<1.24' (about 50 MB)"
"$py" -m pip install --quiet "mxnet==$MXNET_VERSION" "numpy<1.24" >&2

if ! has_mxnet; then
    log "the venv at $venv does not import mxnet $MXNET_VERSION after installing; see the errors above"
    "$py" -c "import mxnet" >&2 || true
    exit 1
fi
log "ready: mxnet $MXNET_VERSION"
echo "$py"
