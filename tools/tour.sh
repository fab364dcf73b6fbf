#!/usr/bin/env bash
# Set up the venv (tools/setup_env.sh: PYTHON and VENV, default python3 and
# .venv) and show what decorated generators and coroutines see, on stock torch
# 2.13.0 and with this patch, side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
bash tools/setup_env.sh
echo "=== stock torch 2.13.0 (TORCH_GRADMODE_OVERLAY=0) ==="
TORCH_GRADMODE_OVERLAY=0 "$VENV/bin/python" examples/tour.py
echo
echo "=== with this patch ==="
"$VENV/bin/python" examples/tour.py
