#!/usr/bin/env bash
# Lint the files the pull request carries under test/ and torch/
# (as the install builds them: overlay/_torch_gradmode_splice.py) the way upstream PyTorch's lintrunner does, with
# upstream's rules restated in lint/upstream/ and upstream's tool versions
# pinned in requirements-dev.txt (ruff, mypy, pyrefly, xdoctest, clang-format,
# clang-tidy) and lint/upstream/requirements-flake8.txt (flake8 and its
# plugins, in a venv of their own under build/).
#
#   ruff check, ruff format --check   every listed .py file
#   flake8                            every listed .py file
#   mypy, pyrefly                     the listed .py files under torch/
#                                     (upstream's MYPY and PYREFLY linters
#                                     cover torch/ and a fixed list of tests,
#                                     none of ours)
#   xdoctest                          the docstring examples of the listed
#                                     modules under torch/, as upstream's
#                                     run_test.py --xdoctest runs them
#   clang-format --dry-run --Werror   every listed C++ file (.cpp, .h)
#   clang-tidy                        every listed C++ file, reporting on the
#                                     checkout's own headers under torch/ too
#
# mypy and pyrefly check a link tree of the installed torch wheel
# (build/lint-upstream/tree) with the checkout's modules in place of the
# wheel's, and torch/_C/__init__.pyi extended by lint/upstream/*_state.pyi:
# the declarations the pull request adds to upstream's torch/_C/__init__.pyi.in
# for the bindings' names.
#
# clang-tidy reads build/lint-upstream/compile_commands.json, written here as
# setup.py builds the binding: -std=c++20, the checkout's root, the installed
# wheel's torch/include and torch/include/torch/csrc/api/include, and the
# venv's Python headers as include directories.
#
# One summary line per linter; exit status 1 if any linter found anything (or
# failed to run).  VENV (default .venv) is the venv made by tools/setup_env.sh.
# Files listed but not there yet are skipped with a note.
#
#   bash tools/lint_upstream.sh           the checkout's files
#   bash tools/lint_upstream.sh --stock   the installed wheel's own copies of
#                                         the listed torch/ modules, through
#                                         the same Python linters: stock torch
#                                         is clean upstream, so it must be
#                                         clean here too, or lint/upstream/ is
#                                         wrong (the C++ files are new: not
#                                         linted with --stock)
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${VENV:-.venv}
case $VENV in /*) ;; *) VENV=$ROOT/$VENV ;; esac  # the linters run from other folders too
PY=$VENV/bin/python
CFG=lint/upstream
WORK=$ROOT/build/lint-upstream
mkdir -p "$WORK"
LOG=$WORK/last.log
: >"$LOG"

STOCK=0
case ${1:-} in
--stock) STOCK=1 ;;
"") ;;
*)
    echo "usage: $0 [--stock]" >&2
    exit 2
    ;;
esac

if [ ! -x "$PY" ]; then
    echo "error: no venv at $VENV (run tools/setup_env.sh first)" >&2
    exit 2
fi
WHEEL=$(TORCH_GRADMODE_OVERLAY=0 "$PY" -c \
    "import importlib.util, os; print(os.path.dirname(importlib.util.find_spec('torch').origin))")

files=()        # .py files under test/ and torch/
torch_files=()  # those under torch/
cxx_files=()    # C++ files under test/ and torch/
# The pull request's files: the modules as the install builds them from the
# wheel's text (overlay/_torch_gradmode_splice.py: what the last step of the
# stack gives), written under $WORK/built, and the new files of every step.
BUILT=$WORK/built
listed=$(TORCH_GRADMODE_OVERLAY=0 "$PY" - "$ROOT" "$WHEEL" "$BUILT" <<'EOF'
import os
import shutil
import sys

root, wheel, built = sys.argv[1:]
sys.path.insert(0, os.path.join(root, "overlay"))
import _torch_gradmode_splice as splice


def read(path):
    where = os.path.join(os.path.dirname(wheel), path)
    return open(where, encoding="utf-8").read() if os.path.isfile(where) else None


# The modules the patch writes definitions into, and its new files: the files
# only an anchored edit touches (Dynamo's convert_frame.py, trace_rules.py) are
# upstream's but for a line or two, under upstream's own per-file settings.
steps = splice.series(root)
ours = {p for s in steps for p in [*s.defines, *s.new]}
shutil.rmtree(built, ignore_errors=True)
for path, text in sorted(splice.build_install(root, read).items()):
    if path in ours:
        os.makedirs(os.path.dirname(os.path.join(built, path)), exist_ok=True)
        with open(os.path.join(built, path), "w", encoding="utf-8") as f:
            f.write(text)
        print(path)
EOF
) || { echo "error: could not build the patched modules" >&2; exit 2; }
for line in $listed; do
    case $line in
    test/* | torch/*) ;;
    *) continue ;;
    esac
    case $line in
    *.py) kind=py ;;
    *.cpp | *.cc | *.h | *.hpp) kind=cxx ;;
    *) continue ;;
    esac
    if [ $STOCK -eq 1 ]; then
        case $kind:$line in
        py:torch/*)
            files+=("$WHEEL/${line#torch/}")
            torch_files+=("$line")
            ;;
        esac
        continue
    fi
    if [ $kind = cxx ]; then
        cxx_files+=("$line")
        continue
    fi
    case $line in
    torch/*)
        files+=("$BUILT/$line")
        torch_files+=("$line")
        ;;
    *) files+=("$line") ;;
    esac
done
if [ $STOCK -eq 1 ]; then
    echo "note: linting stock torch's own copies of the listed modules (in $WHEEL)"
fi
if [ ${#files[@]} -eq 0 ]; then
    echo "error: no upstream-bound .py file found" >&2
    exit 2
fi

status=0
# report NAME RC DETAIL: one summary line; the output is in $LOG.
report() {
    if [ "$2" -eq 0 ]; then
        echo "$1: clean ($3)"
    else
        echo "$1: FAILED ($3)"
        status=1
    fi
}
# run NAME CMD...: run CMD, showing and logging its output.
run() {
    local name=$1 rc
    shift
    echo "--- $name: $*" >>"$LOG"
    "$@" >"$WORK/out" 2>&1
    rc=$?
    cat "$WORK/out" >>"$LOG"
    if [ $rc -ne 0 ]; then
        sed 's/^/    /' "$WORK/out"
    fi
    return $rc
}

n=${#files[@]}

# --- ruff -----------------------------------------------------------------
run "ruff check" "$VENV/bin/ruff" check --config "$CFG/ruff.toml" --no-cache --output-format concise "${files[@]}"
rc=$?
report "ruff check" $rc "$n files; $(grep -cE '^[^ ]+:[0-9]+:[0-9]+: ' "$WORK/out") findings"

run "ruff format" "$VENV/bin/ruff" format --check --config "$CFG/ruff.toml" --no-cache "${files[@]}"
rc=$?
report "ruff format --check" $rc "$n files; $(grep -c '^Would reformat' "$WORK/out") would be reformatted"

# --- flake8, in its own venv ----------------------------------------------
F8=$WORK/flake8-venv
stamp=$(cat "$CFG/requirements-flake8.txt" "$PY" 2>/dev/null | sha256sum | cut -c1-16)
if [ "$(cat "$F8/.stamp" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$F8"
    "$PY" -m venv "$F8" &&
        "$F8/bin/python" -m pip install -q --disable-pip-version-check -r "$CFG/requirements-flake8.txt" >>"$LOG" 2>&1 &&
        echo "$stamp" >"$F8/.stamp"
fi
# -W: flake8-logging-format's import of pkg_resources warns on every run.
run flake8 "$F8/bin/python" -W "ignore::UserWarning" -m flake8 --config "$CFG/flake8.ini" "${files[@]}"
rc=$?
report flake8 $rc "$n files; $(grep -cE '^[^ ]+:[0-9]+:[0-9]+: ' "$WORK/out") findings"

# --- the link tree for mypy and pyrefly -----------------------------------
if [ ${#torch_files[@]} -gt 0 ]; then
    TREE=$WORK/tree
    # PATH=TARGET pairs: the tree's torch/PATH links to TARGET (the checkout's
    # module, or with --stock the wheel's own).
    owned=()
    for f in "${torch_files[@]}"; do
        if [ $STOCK -eq 1 ]; then
            owned+=("${f#torch/}=$WHEEL/${f#torch/}")
        else
            owned+=("${f#torch/}=$BUILT/$f")
        fi
    done
    TORCH_GRADMODE_OVERLAY=0 "$PY" - "$TREE" "$CFG" "${owned[@]}" <<'EOF'
import importlib.util
import os
import shutil
import sys

tree, cfg, *owned = sys.argv[1:]
wheel = os.path.dirname(importlib.util.find_spec("torch").origin)
stub = "_C/__init__.pyi"
# Paths under torch/ that the tree replaces; their parents become real dirs.
replaced = dict(pair.split("=", 1) for pair in owned)
replaced[stub] = None
dirs = {""}
for rel in replaced:
    parts = rel.split("/")[:-1]
    dirs.update("/".join(parts[: i + 1]) for i in range(len(parts)))

shutil.rmtree(tree, ignore_errors=True)
for rel in sorted(dirs):
    os.makedirs(os.path.join(tree, "torch", rel), exist_ok=True)
    src = os.path.join(wheel, rel)
    for name in os.listdir(src):
        entry = os.path.join(rel, name) if rel else name
        if entry in replaced or entry in dirs or name == "__pycache__":
            continue
        os.symlink(os.path.join(src, name), os.path.join(tree, "torch", entry))
for rel, target in replaced.items():
    if target is not None:
        os.symlink(target, os.path.join(tree, "torch", rel))
with open(os.path.join(wheel, stub)) as f:
    text = f.read()
for extra in sorted(os.listdir(cfg)):
    if extra.endswith("_state.pyi"):
        with open(os.path.join(cfg, extra)) as f:
            text += "\n" + f.read()
with open(os.path.join(tree, "torch", stub), "w") as f:
    f.write(text)
EOF
    tree_rc=$?
fi

# --- mypy -----------------------------------------------------------------
if [ ${#torch_files[@]} -eq 0 ]; then
    echo "mypy: nothing to check (no listed file under torch/)"
elif [ $tree_rc -ne 0 ]; then
    report mypy 1 "could not build the link tree"
else
    (cd "$TREE" && run mypy "$PY" -m mypy --config-file "$ROOT/$CFG/mypy.ini" \
        --cache-dir "$WORK/mypy-cache$([ $STOCK -eq 1 ] && echo -stock)" --python-executable "$PY" "${torch_files[@]}")
    rc=$?
    report mypy $rc "${#torch_files[@]} files; $(grep -c ': error:' "$WORK/out") errors"
fi

# --- pyrefly (if installed) -----------------------------------------------
if [ ${#torch_files[@]} -eq 0 ]; then
    echo "pyrefly: nothing to check (no listed file under torch/)"
elif [ ! -x "$VENV/bin/pyrefly" ]; then
    echo "pyrefly: skipped (not installed in $VENV)"
elif [ $tree_rc -ne 0 ]; then
    report pyrefly 1 "could not build the link tree"
else
    (cd "$TREE" && run pyrefly "$VENV/bin/pyrefly" check --config "$ROOT/$CFG/pyrefly.toml" \
        --python-interpreter-path "$PY" --search-path . "${torch_files[@]}")
    rc=$?
    report pyrefly $rc "${#torch_files[@]} files; $(grep -cE '^(ERROR|WARN) ' "$WORK/out") findings"
fi

# --- xdoctest -------------------------------------------------------------
# As upstream's run_test.py runs the doctests: google style, static analysis,
# its global-exec and options, and no TORCH_DOCTEST_* feature variable set for
# a CPU-only run.  The modules are imported through the overlay, so the
# checkout's code runs (with --stock, the overlay is off).
if [ ${#torch_files[@]} -eq 0 ]; then
    echo "xdoctest: nothing to run (no listed module under torch/)"
else
    modules=()
    for f in "${torch_files[@]}"; do
        m=${f%.py}
        modules+=("${m//\//.}")
    done
    run xdoctest env TORCH_GRADMODE_OVERLAY=$((1 - STOCK)) $(env | grep -o '^TORCH_DOCTEST_[A-Z0-9_]*' | sed 's/^/-u /') "$PY" - "${modules[@]}" <<'EOF'
import sys

import xdoctest.runner

config = {
    "global_exec": r"\n".join(
        ["from torch import nn", "import torch.nn.functional as F", "import torch"]
    ),
    "analysis": "static",
    "style": "google",
    "options": "+IGNORE_WHITESPACE",
}
failed = 0
for module in sys.argv[1:]:
    summary = xdoctest.runner.doctest_module(module, config=config, command="all", argv=[], verbose=1)
    failed += summary.get("n_failed", 0)
sys.exit(1 if failed else 0)
EOF
    rc=$?
    # Each module's closing line: "=== 3 passed, 2 skipped in 1.5 seconds ===".
    count() {
        grep -E '=== .* in [0-9.]+ seconds ===' "$WORK/out" | grep -oE "[0-9]+ $1" |
            awk '{s += $1} END {print s + 0}'
    }
    passed=$(count passed)
    skipped=$(count skipped)
    failed=$(count failed)
    report xdoctest $rc "${#modules[@]} modules; $passed passed, $skipped skipped, $failed failed"
fi

# --- clang-format, clang-tidy ----------------------------------------------
nc=${#cxx_files[@]}
if [ $STOCK -eq 1 ]; then
    echo "clang-format, clang-tidy: nothing to check with --stock (the listed C++ files are new)"
elif [ "$nc" -eq 0 ]; then
    echo "clang-format, clang-tidy: nothing to check (no listed C++ file under test/ or torch/)"
else
    if [ ! -x "$VENV/bin/clang-format" ]; then
        report clang-format 1 "not installed in $VENV: run tools/setup_env.sh"
    else
        run clang-format "$VENV/bin/clang-format" --dry-run --Werror --style="file:$CFG/clang-format.yaml" "${cxx_files[@]}"
        rc=$?
        report clang-format $rc "$nc files; $(grep -cE '^[^ ]+:[0-9]+:[0-9]+: (error|warning): ' "$WORK/out") findings"
    fi

    # The compile commands: the binding's flags from setup.py, with the
    # installed wheel's headers and the venv's Python headers.
    if [ ! -x "$VENV/bin/clang-tidy" ]; then
        report clang-tidy 1 "not installed in $VENV: run tools/setup_env.sh"
    elif ! TORCH_GRADMODE_OVERLAY=0 "$PY" - "$WORK/compile_commands.json" "$ROOT" "$WHEEL" "${cxx_files[@]}" <<'EOF'; then
import json
import os
import sys
import sysconfig

out, root, wheel, *paths = sys.argv[1:]
include = os.path.join(wheel, "include")
flags = ["-std=c++20", "-D_GLIBCXX_USE_CXX11_ABI=1"]
for d in (
    root,
    include,
    os.path.join(include, "torch", "csrc", "api", "include"),
    sysconfig.get_paths()["include"],
):
    flags.append("-I" + d)
commands = [
    {
        "directory": root,
        "file": os.path.join(root, path),
        "arguments": [
            "c++",
            *flags,
            "-x",
            "c++-header" if path.endswith((".h", ".hpp")) else "c++",
            "-c",
            path,
        ],
    }
    for path in paths
]
with open(out, "w") as f:
    json.dump(commands, f, indent=1)
EOF
        report clang-tidy 1 "could not write the compile commands"
    else
        # Findings in the checkout's own headers under torch/ only: not in the
        # wheel's (the venv, inside the checkout, has a torch/csrc/ too).
        root_re=$(printf '%s' "$ROOT" | sed 's/[][\.*^$(){}?+|]/\\&/g')
        run clang-tidy "$VENV/bin/clang-tidy" --quiet -p "$WORK" --config-file="$CFG/clang-tidy.yaml" \
            --header-filter="^$root_re/torch/" "${cxx_files[@]}"
        rc=$?
        report clang-tidy $rc "$nc files; $(grep -cE '^[^ ]+:[0-9]+:[0-9]+: (error|warning): .*\]$' "$WORK/out") findings"
    fi
fi

exit $status
