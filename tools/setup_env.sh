#!/usr/bin/env bash
# Create (or reuse) .venv in the checkout with torch 2.13.0 and this patch
# installed over it.  Idempotent: a second run only checks what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements-dev.txt -r docs/requirements.txt
# --no-build-isolation: setup.py checks the torch installed in this venv.
.venv/bin/python -m pip install -q --disable-pip-version-check --no-build-isolation -e .
