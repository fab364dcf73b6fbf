#!/usr/bin/env bash
# Build the docs as HTML (warnings are errors), then run their doctests.
# Installs nothing: run tools/setup_env.sh first.  VENV names the venv (default
# .venv, as for tools/setup_env.sh), which must have the patch installed so that
# autodoc and the doctests see it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${VENV:-.venv}/bin/python
"$PY" -m sphinx -W --keep-going -b html docs/project docs/build/html
"$PY" -m sphinx -b doctest docs/project docs/build/doctest
