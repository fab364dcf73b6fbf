#!/usr/bin/env bash
# Set up the venv (tools/setup_env.sh: PYTHON and VENV, default python3 and
# .venv) and run the whole test suite against the checkout.  Extra arguments go
# to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
bash tools/setup_env.sh
exec "$VENV/bin/python" -m pytest test -q -p no:cacheprovider "$@"
