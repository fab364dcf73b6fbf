#!/usr/bin/env python3
"""Run upstream PyTorch test files against stock torch and against this patch, and compare.

Usage::

    python tools/compare_upstream.py UPSTREAM_DIR [--patch FILE] [--python PYTHON] [--timeout SECONDS]
        [--stock-cache JSON]

UPSTREAM_DIR holds fetched upstream test files::

    UPSTREAM_DIR/test_autograd.py              (+ autograd/, expect/ it needs)
    UPSTREAM_DIR/dynamo/test_ctx_manager.py
    UPSTREAM_DIR/dynamo/test_generator.py

The index's ``test_generator.py`` is newer than 2.13.0 and collects only with a
``conftest.py`` beside it that defines ``TestCaseWithNestedGraphBreaks`` (see
CONTRIBUTING.md); without one its stock run is reported as not run.

Each file is run with ``PYTHON -m pytest FILE -q -p no:cacheprovider -p no:logging -rf``
from its own folder, once with ``TORCH_GRADMODE_OVERLAY=0`` (stock torch) and once
without it (the patch).  The FAILED test ids of both runs are compared.  Exit code 1
if the patched run fails any test that the stock run passes, or runs fewer tests.

With ``--patch FILE`` (the pull request, from ``tools/export_pr.py``), the
patched run uses a copy of UPSTREAM_DIR with the patch's test changes applied
(``git apply --include='test/*'``), so that upstream's ``test_autograd.py``
runs the new tests through its import of them; the stock run keeps the
unpatched files, as the baseline.  It also reports how many tests the patch
added to each file's run, and fails if it added none to ``test_autograd.py``.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ENV_SWITCH = "TORCH_GRADMODE_OVERLAY"
RUNS = (("test_autograd.py", "."), ("test_ctx_manager.py", "dynamo"), ("test_generator.py", "dynamo"))
PYTEST_ARGS = ["-q", "-p", "no:cacheprovider", "-p", "no:logging", "-rfE"]

_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)")
_COUNT = re.compile(r"(\d+) (failed|passed|skipped|errors?|xfailed|xpassed|deselected)\b")


def run_pytest(python, folder, filename, stock, timeout):
    env = dict(os.environ)
    if stock:
        env[ENV_SWITCH] = "0"
    else:
        env.pop(ENV_SWITCH, None)
    start = time.monotonic()
    try:
        proc = subprocess.run(
            [python, "-m", "pytest", filename, *PYTEST_ARGS],
            cwd=folder, env=env, capture_output=True, text=True, timeout=timeout,
        )
        out, rc = proc.stdout + proc.stderr, proc.returncode
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        rc = "timeout"
    elapsed = time.monotonic() - start
    failed = set()
    for line in out.splitlines():
        m = _FAILED.match(line)
        if m:
            failed.add(m.group(1))
    counts = {}
    summary = [line for line in out.splitlines() if re.search(r"\b(passed|failed)\b.* in [\d.]+s", line)]
    if summary:
        for n, kind in _COUNT.findall(summary[-1]):
            kind = "errors" if kind.startswith("error") else kind
            counts[kind] = counts.get(kind, 0) + int(n)
    ran = counts.get("passed", 0) + counts.get("failed", 0) + counts.get("errors", 0) \
        + counts.get("xfailed", 0) + counts.get("xpassed", 0)
    return {"rc": rc, "failed": failed, "counts": counts, "ran": ran, "elapsed": elapsed, "output": out}


def die(message):
    """Stop with a one-line error (exit 2: not a comparison result)."""
    print(f"compare_upstream: error: {message}", file=sys.stderr)
    sys.exit(2)


def apply_patch(root, patch, work):
    """Copy UPSTREAM_DIR to WORK/test and apply the patch's changes under test/ there."""
    tests = os.path.join(work, "test")
    shutil.copytree(root, tests, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache"))
    cmd = ["git", "apply", "--include=test/*", os.path.abspath(patch)]
    stat = subprocess.run([*cmd[:2], "--numstat", *cmd[2:]], cwd=work, capture_output=True, text=True)
    if stat.returncode == 0 and not stat.stdout.strip():
        die(f"--patch {patch} changes nothing under test/")
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
    if stat.returncode or proc.returncode:
        detail = (stat.stderr or proc.stderr).strip()
        die(f"--patch {patch} does not apply to the test files of {root}: {detail}")
    return tests


def check_run(label, filename, res):
    """Refuse a run that did not really run: pytest's usage/internal errors, a timeout, no tests."""
    if res["rc"] not in (0, 1) or res["ran"] == 0:
        tail = "\n".join(res["output"].strip().splitlines()[-5:])
        why = "timed out" if res["rc"] == "timeout" else f"exit status {res['rc']}, {res['ran']} tests ran"
        die(f"the {label} run of {filename} did not run ({why}):\n{tail}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("upstream_dir")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--log-dir", default=None, help="write each run's full output here")
    parser.add_argument("--stock-cache", default=None, metavar="JSON",
                        help="reuse the stock runs saved in this file (saved there if it does not exist)")
    parser.add_argument("--patch", default=None, metavar="FILE",
                        help="run the patched side on UPSTREAM_DIR with this pull request's test changes applied")
    args = parser.parse_args(argv)

    root = os.path.abspath(args.upstream_dir)
    if os.sep in args.python:
        args.python = os.path.abspath(args.python)  # each run starts in its test file's folder
    if args.patch and not os.path.isfile(args.patch):
        parser.error(f"--patch {args.patch}: no such file")
    if not os.path.isdir(root):
        parser.error(f"UPSTREAM_DIR {args.upstream_dir}: no such directory")
    for filename, sub in RUNS:
        if not os.path.isfile(os.path.join(root, sub, filename)):
            parser.error(f"UPSTREAM_DIR {args.upstream_dir} has no {os.path.normpath(os.path.join(sub, filename))} "
                         "(give the folder laid out as upstream's test/, see ../shared/upstream-tests.md)")
    probe = subprocess.run([args.python, "-c", "import pytest, torch"], capture_output=True, text=True) \
        if shutil.which(args.python) or os.path.isfile(args.python) else None
    if probe is None or probe.returncode:
        parser.error(f"--python {args.python}: cannot run it, or it lacks pytest or torch")
    work = tempfile.mkdtemp(prefix="compare_upstream-") if args.patch else None
    try:
        return _compare(args, root, work)
    finally:
        if work:
            shutil.rmtree(work, ignore_errors=True)


def _compare(args, root, work):
    patched_root = apply_patch(root, args.patch, work) if args.patch else root
    any_new = False
    rows = []
    wires_tests = False
    if args.patch:
        with open(args.patch, encoding="utf-8") as f:
            wires_tests = "\n+++ b/test/test_autograd.py\n" in f.read()
    cache = {}
    if args.stock_cache and os.path.isfile(args.stock_cache):
        with open(args.stock_cache) as f:
            cache = {name: {**res, "failed": set(res["failed"])} for name, res in json.load(f).items()}
    for filename, sub in RUNS:
        folder = os.path.normpath(os.path.join(root, sub))
        results = {}
        for label, stock in (("stock", True), ("patched", False)):
            where = folder if stock else os.path.normpath(os.path.join(patched_root, sub))
            if stock and filename in cache:
                results[label] = cache[filename]
                continue
            res = run_pytest(args.python, where, filename, stock, args.timeout)
            results[label] = res
            if args.log_dir:
                os.makedirs(args.log_dir, exist_ok=True)
                with open(os.path.join(args.log_dir, f"{filename}.{label}.log"), "w") as f:
                    f.write(res["output"])
            check_run(label, filename, res)
        stock_res, patched_res = results["stock"], results["patched"]
        new = sorted(patched_res["failed"] - stock_res["failed"])
        gone = sorted(stock_res["failed"] - patched_res["failed"])
        # A patched run that crashed or collected fewer tests lists fewer
        # failures too: that is not a pass.
        short = patched_res["ran"] < stock_res["ran"]
        added = patched_res["ran"] - stock_res["ran"]
        # The pull request's point on this file: its tests must run through upstream's import.
        none_added = wires_tests and filename == "test_autograd.py" and added <= 0
        any_new = any_new or bool(new) or short or none_added
        rows.append((filename, stock_res, patched_res))
        print(f"== {os.path.join(sub, filename)}")
        for label, res in results.items():
            counts = ", ".join(f"{v} {k}" for k, v in sorted(res["counts"].items())) or "no summary"
            print(f"  {label:8s} ran {res['ran']:5d}  failed {len(res['failed']):4d}  "
                  f"(rc {res['rc']}; {counts}; {res['elapsed']:.0f}s)")
        if short:
            print(f"  PATCHED RUN RAN FEWER TESTS ({patched_res['ran']} < {stock_res['ran']}): see its output")
        if args.patch:
            warn = "  (NONE: is the import wired?)" if none_added else ""
            print(f"  tests the patch added to this run: {added}{warn}")
        print(f"  new failures (patched only): {len(new)}")
        for t in new:
            print(f"    {t}")
        print(f"  failures only in stock: {len(gone)}")
        for t in gone:
            print(f"    {t}")

    if args.stock_cache and not cache:
        with open(args.stock_cache, "w") as f:
            json.dump({name: {**s, "failed": sorted(s["failed"])} for name, s, _ in rows}, f)
    print()
    print(f"{'file':24s} {'stock ran':>10s} {'stock failed':>13s} {'patched ran':>12s} {'patched failed':>15s}")
    for filename, s, p in rows:
        print(f"{filename:24s} {s['ran']:10d} {len(s['failed']):13d} {p['ran']:12d} {len(p['failed']):15d}")
    print("RESULT:", "NEW FAILURES" if any_new else "no new failures")
    return 1 if any_new else 0


if __name__ == "__main__":
    sys.exit(main())
