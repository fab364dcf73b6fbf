#!/usr/bin/env bash
# Set up .venv (tools/setup_env.sh) and run the whole test suite against the
# checkout.  Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup_env.sh
exec .venv/bin/python -m pytest test -q -p no:cacheprovider "$@"
