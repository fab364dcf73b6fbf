#!/usr/bin/env bash
# Set up .venv and show what decorated generators and coroutines see, on stock
# torch 2.13.0 and with this patch, side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup_env.sh
echo "=== stock torch 2.13.0 (TORCH_GRADMODE_OVERLAY=0) ==="
TORCH_GRADMODE_OVERLAY=0 .venv/bin/python examples/tour.py
echo
echo "=== with this patch ==="
.venv/bin/python examples/tour.py
