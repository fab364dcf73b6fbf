#!/usr/bin/env bash
# Set up the venv (tools/setup_env.sh: PYTHON and VENV, default python3 and
# .venv) and run the whole test suite against the checkout, in one pytest run:
# the upstream-bound tests (test/autograd/, test/dynamo/ and test/test_autocast_suspend.py, bound for the pull request) and the
# project-only ones (project_tests/).  Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
bash tools/setup_env.sh
exec "$VENV/bin/python" -m pytest test/autograd test/dynamo test/test_autocast_suspend.py project_tests -q -p no:cacheprovider "$@"
