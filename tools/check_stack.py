#!/usr/bin/env python3
"""Check that each step of ``stack/series`` stands on its own.

Usage::

    python tools/check_stack.py [--upstream DIR] [--python PYTHON] [--only STEP]

Over the torch wheel installed for PYTHON (default: this interpreter), with
the patch installed there (``pip install -e .``), it checks:

1. the last step builds what the install builds (every fragment whole), and
   what it builds is a minimal edit: every upstream definition no step
   replaces is byte for byte upstream's, and a replaced one keeps upstream's
   docstring (a ``.. versionchanged::`` paragraph may follow it), and the
   modules of every prefix pass upstream's ruff rules;
2. the series (``tools/export_pr.py --out-dir``) applies in order with
   ``git am`` on DIR, or, without ``--upstream``, on a tree of the wheel's
   files (the edits of files the wheel lacks left out);
3. for each step k, its tests pass with the first k steps installed
   (``TORCH_GRADMODE_STACK=k``) and fail with the first k-1, unless the step
   says it is exempt (docs only; faster only, with its benchmark figure).

Exit status 1 if any check fails.  Upstream's own suites per prefix:
``CONTRIBUTING.md`` ("The stack").
"""

import argparse
import ast
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "overlay"))
import _torch_gradmode_splice as splice  # noqa: E402

GIT = ["git", "-c", "user.name=check", "-c", "user.email=check@localhost", "-c", "commit.gpgsign=false"]


def _wheel_torch(python):
    out = subprocess.run(
        [python, "-c", "import importlib.util as u, os; print(os.path.dirname(u.find_spec('torch').origin))"],
        env={**os.environ, "TORCH_GRADMODE_OVERLAY": "0"}, capture_output=True, text=True, check=True,
    )
    return out.stdout.strip()


def _reader(base):
    def read(path):
        where = os.path.join(base, path)
        if not os.path.isfile(where):
            return None
        with open(where, encoding="utf-8") as f:
            return f.read()

    return read


def check_install(torch_dir):
    """The last step's modules are the install's."""
    read = _reader(os.path.dirname(torch_dir))
    steps = splice.series(ROOT)
    stacked = splice.build(ROOT, steps, read, only=lambda p: p.startswith("torch/"))
    installed = splice.build_install(ROOT, read)
    differ = sorted(p for p in set(stacked) | set(installed) if p.startswith("torch/") and
                    stacked.get(p) != installed.get(p))
    problems = []
    for path in differ:
        named = {n.split(".")[0] for step in steps for n in step.defines.get(path, ())}
        fragment = os.path.join(ROOT, path)
        left = [n for n in splice.fragment_names(fragment) if n not in named] if os.path.isfile(fragment) else []
        why = f" (no step defines {', '.join(left)})" if left else ""
        problems.append(f"{path}: the last step's differs from the install's{why}")
    return problems


def _definitions(text):
    """``{qualname: (source, docstring)}`` of a module's top-level definitions and class members."""
    found = {}
    for node in ast.parse(text).body:
        name = splice._name(node)
        if name is None:
            continue
        items = [(name, node)]
        if isinstance(node, ast.ClassDef):
            items += [(f"{name}.{splice._name(m)}", m) for m in node.body if splice._name(m)]
        for qualname, item in items:
            has_doc = isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            found[qualname] = (ast.get_source_segment(text, item),
                               ast.get_docstring(item, clean=False) if has_doc else None)
    return found


def check_minimal(torch_dir):
    """A minimal edit: what no step replaces is upstream's, byte for byte; what one does keeps
    upstream's docstring (a ``.. versionchanged::`` paragraph may follow it)."""
    read = _reader(os.path.dirname(torch_dir))
    steps = splice.series(ROOT)
    built = splice.build(ROOT, steps, read, only=lambda p: p.startswith("torch/"))
    replaced = {(path, name) for step in steps for path, names in step.defines.items() for name in names}
    problems, kept, redone = [], 0, 0
    for path in sorted({path for path, _ in replaced}):
        theirs, ours = _definitions(read(path)), _definitions(built[path])
        for name, (source, doc) in theirs.items():
            new_source, new_doc = ours.get(name, (None, None))
            if (path, name) in replaced or (path, name.split(".")[0]) in replaced:
                redone += 1
                extended = (new_doc or "").startswith(doc.rstrip() + "\n\n") if doc else False
                if doc is not None and new_doc != doc and not (
                        extended and (new_doc or "")[len(doc.rstrip()):].lstrip().startswith(".. versionchanged::")):
                    problems.append(f"{path}: {name}: upstream's docstring is not kept")
            elif "." not in name and name in ours and isinstance(ast.parse(source).body[0], ast.ClassDef):
                if new_doc != doc:  # a class: members may be added, its docstring stays
                    problems.append(f"{path}: class {name}'s docstring differs from upstream's")
            elif new_source != source:
                problems.append(f"{path}: {name} is not replaced by any step, yet differs from upstream's")
            else:
                kept += 1
    print(f"  {kept} upstream definitions kept byte for byte; {redone} replaced, with upstream's docstrings")
    return problems


def check_lint(python, torch_dir, work):
    """Every prefix's modules pass upstream's ruff rules (an import a step leaves unused, say)."""
    ruff = os.path.join(os.path.dirname(python), "ruff")
    if not os.path.isfile(ruff):
        return [f"no ruff beside {python}: install requirements-dev.txt"]
    read = _reader(os.path.dirname(torch_dir))
    steps = splice.series(ROOT)
    problems = []
    for k in range(1, len(steps) + 1):
        ours = {p for s in steps[:k] for p in s.defines}
        built = splice.build(ROOT, steps[:k], read, only=lambda p: p in ours)
        folder = os.path.join(work, "lint", str(k))
        for path, text in built.items():
            os.makedirs(os.path.dirname(os.path.join(folder, path)), exist_ok=True)
            with open(os.path.join(folder, path), "w", encoding="utf-8") as f:
                f.write(text)
        files = [os.path.join(folder, p) for p in built]
        for args in (["check", "--output-format", "concise"], ["format", "--check"]):
            config = os.path.join(ROOT, "lint", "upstream", "ruff.toml")
            done = subprocess.run([ruff, *args, "--no-cache", "--config", config, *files],
                                  capture_output=True, text=True)
            if done.returncode:
                problems.append(f"steps 1-{k}: ruff {args[0]}: {done.stdout.strip() or done.stderr.strip()}")
        print(f"  steps 1-{k}: ruff check and format clean" if not problems else f"  steps 1-{k}: see below")
    return problems


def check_series(python, upstream, work):
    """The series exports and applies, step by step, with git am."""
    tree = os.path.join(work, "tree")
    if upstream:
        shutil.copytree(upstream, tree, symlinks=True)
    else:
        subprocess.run([python, os.path.join(ROOT, "tools", "make_upstream_tree.py"), "--out", tree,
                        "--python", python], check=True, capture_output=True)
    series = os.path.join(work, "series")
    cmd = [python, os.path.join(ROOT, "tools", "export_pr.py"), "--upstream", tree, "--out-dir", series]
    proc = subprocess.run(cmd + ([] if upstream else ["--skip-missing"]), capture_output=True, text=True)
    if proc.returncode:
        return [f"export failed: {proc.stderr.strip()}"]
    if not os.path.isdir(os.path.join(tree, ".git")):
        subprocess.run(["git", "init", "-q"], cwd=tree, check=True)
        subprocess.run([*GIT, "add", "-A"], cwd=tree, check=True)
        subprocess.run([*GIT, "commit", "-qm", "base"], cwd=tree, check=True)
    problems = []
    for patch in sorted(os.listdir(series)):
        am = subprocess.run([*GIT, "am", "-q", "--keep-non-patch", os.path.join(series, patch)],
                            cwd=tree, capture_output=True, text=True)
        print(f"  {'applies' if am.returncode == 0 else 'FAILS TO APPLY'}: {patch}")
        if am.returncode:
            problems.append(f"{patch} does not apply: {am.stderr.strip()}")
            break
    return problems


def _pytest(python, k, tests, cwd):
    env = {**os.environ, "TORCH_GRADMODE_STACK": str(k)}
    env.pop("TORCH_GRADMODE_OVERLAY", None)
    proc = subprocess.run([python, "-m", "pytest", *tests, "-q", "-p", "no:cacheprovider"],
                          cwd=cwd, env=env, capture_output=True, text=True)
    last = (proc.stdout.strip().splitlines() or ["(no output)"])[-1]
    return proc.returncode, last


def check_steps(python, work, only=None):
    """Each step's tests pass with its prefix and fail with the one before."""
    problems = []
    for k, step in enumerate(splice.series(ROOT), 1):
        if only and step.name != only:
            continue
        tests = []
        for path in step.tests:
            where = os.path.join(work, "tests", step.name, path)
            os.makedirs(os.path.dirname(where), exist_ok=True)
            shutil.copy(step.source(path), where)
            tests.append(where)
        if not tests:
            if not step.exempt:
                problems.append(f"{step.name}: no tests, and not exempt")
            print(f"  {step.name}: no tests ({step.exempt})")
            continue
        rc, last = _pytest(python, k, tests, ROOT)
        print(f"  {step.name}: with steps 1-{k}: {last}")
        if rc:
            problems.append(f"{step.name}: its tests fail with steps 1-{k}: {last}")
        if step.exempt:
            continue
        rc, last = _pytest(python, k - 1, tests, ROOT)
        print(f"  {step.name}: with steps 1-{k - 1}: {last}")
        if rc == 0:
            problems.append(f"{step.name}: its tests pass without it (steps 1-{k - 1})")
    return problems


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", metavar="DIR", help="a PyTorch v2.13.0 tree (default: the wheel's files)")
    parser.add_argument("--python", default=sys.executable, help="the venv's python, the patch installed")
    parser.add_argument("--only", metavar="STEP", help="check this step's tests only")
    args = parser.parse_args(argv)
    names = [step.name for step in splice.series(ROOT)]
    if args.only and args.only not in names:
        parser.error(f"--only {args.only}: not a step of stack/series ({', '.join(names)})")
    problems = []
    with tempfile.TemporaryDirectory() as work:
        print("install = last step")
        problems += check_install(_wheel_torch(args.python))
        print("minimal diffs")
        problems += check_minimal(_wheel_torch(args.python))
        print("each prefix lints")
        problems += check_lint(args.python, _wheel_torch(args.python), work)
        if not args.only:
            print("series applies")
            problems += check_series(args.python, args.upstream, work)
        print("each step's tests")
        problems += check_steps(args.python, work, args.only)
    for problem in problems:
        print(f"check_stack: {problem}", file=sys.stderr)
    print(f"check_stack: {'FAILED' if problems else 'ok'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
