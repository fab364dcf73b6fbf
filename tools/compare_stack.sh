#!/usr/bin/env bash
# Upstream's suites at every prefix of the stack: for k = 1..N, export the
# first k steps squashed against TREE (tools/make_upstream_tree.py) and run
# tools/compare_upstream.py on UPSTREAM_TESTS with TORCH_GRADMODE_STACK=k (the
# first k steps installed); stock's runs are made once and reused.
#
#   bash tools/compare_stack.sh TREE UPSTREAM_TESTS [OUT_DIR]
#
# One summary block per prefix in OUT_DIR/prefix-k.txt (default
# build/compare-stack); exit status 1 if any prefix has a new failure.
set -uo pipefail
cd "$(dirname "$0")/.."
TREE=${1:?usage: $0 TREE UPSTREAM_TESTS [OUT_DIR]}
TESTS=${2:?usage: $0 TREE UPSTREAM_TESTS [OUT_DIR]}
OUT=${3:-build/compare-stack}
PY=${VENV:-.venv}/bin/python
mkdir -p "$OUT"
n=$(grep -cv '^\s*\(#\|$\)' stack/series)
status=0
for k in $(seq 1 "$n"); do
    "$PY" tools/export_pr.py --upstream "$TREE" --squash --out "$OUT/pr-$k.patch" --steps "$k" 2>/dev/null || {
        echo "prefix $k: export failed" >&2
        status=1
        continue
    }
    TORCH_GRADMODE_STACK=$k "$PY" tools/compare_upstream.py "$TESTS" --patch "$OUT/pr-$k.patch" \
        --stock-cache "$OUT/stock.json" >"$OUT/prefix-$k.txt" 2>&1 || status=1
    echo "prefix $k: $(grep '^RESULT' "$OUT/prefix-$k.txt")"
    sed -n '/^file /,/^RESULT/p' "$OUT/prefix-$k.txt" | sed 's/^/    /'
done
exit $status
