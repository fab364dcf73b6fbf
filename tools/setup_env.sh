#!/usr/bin/env bash
# Create (or reuse) a venv in the checkout with torch 2.13.0 and this patch
# installed over it.  Idempotent: a second run only checks what is there.
# PYTHON picks the interpreter (default python3; 3.10-3.13 are supported) and
# VENV the venv directory (default .venv, relative to the checkout), e.g.
#   PYTHON=/root/.pyenv/versions/3.10.13/bin/python VENV=.venv-3.10 bash tools/setup_env.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
    "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -r requirements-dev.txt -r docs/requirements.txt
# With build isolation (pip's default): setup.py finds the torch installed in
# the target venv through its prefix.
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -e .
