#!/usr/bin/env bash
# Build the docs as HTML (warnings are errors), then run their doctests.
# Installs nothing: run tools/setup_env.sh and install docs/requirements.txt
# into the venv first.  PYTHON overrides the interpreter (default: .venv/bin/python,
# which must have the patch installed so that autodoc and the doctests see it).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" -m sphinx -W --keep-going -b html docs/source docs/build/html
"$PY" -m sphinx -b doctest docs/source docs/build/doctest
