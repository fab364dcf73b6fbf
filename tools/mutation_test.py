#!/usr/bin/env python3
"""A small AST mutation tester for the grad-mode patch.

mutmut and cosmic-ray cannot follow the spliced install, so this harness does
the little they would do here:

1. snapshot the checkout's pieces -- ``stack/``, ``overlay/*.py``, the
   fragments and every file a build reads (``_torch_gradmode_splice.inputs``),
   and the tests -- into a work directory, so that edits made in /work/main
   while it runs do not mix into a run;
2. parse the *fragments* ``torch/utils/_contextlib.py``,
   ``torch/autograd/grad_mode.py`` and ``torch/_dynamo/bytecode_transformation.py``
   (only the definitions the patch adds or replaces), and enumerate mutants
   (one small change each, see ``Mutator``): the mutated code is exactly the
   patch's own;
3. for each mutant, write the mutated fragment into the slot's copy of the
   snapshot, build the module with ``_torch_gradmode_splice.build_install``
   over the wheel's upstream text (as the install does), and write it into a
   *mutant tree*: a directory ``torch/`` mirroring the current overlay tree
   (``os.path.dirname(torch.__file__)`` with the overlay active, under
   ``build/overlay-<env>/<hash>/``) -- links to the wheel's entries, real
   directories where the overlay tree has them, the modules the snapshot builds
   as real files -- and run the selected tests with
   ``TORCH_GRADMODE_OVERLAY=0 PYTHONPATH=<tree>`` so that ``import torch``
   loads the mutant (checked by a probe before the run starts);
4. a mutant is *killed* when the tests fail (or time out), and *survives*
   when they pass; a mutant the splice refuses (``SpliceError``) is *invalid*
   and left out of the score.  The score and every survivor's diff (of the
   fragment) are printed.

The default tests are the upstream-bound ones, ``test/autograd/test_grad_mode_*.py``,
``test/autograd/test_autograd_mode_state.py`` and ``test/dynamo/test_suspendable_frames.py``; ``--tests`` runs others
(``project_tests/...`` included).  One mutant tree is kept per job slot and
reused, with the bytecode of its real directories compiled once, so a mutant
costs one splice and one pytest run.  The checkout itself is never written.

Usage::

    nice -n 10 python tools/mutation_test.py --jobs 2 --sample 80 --seed 1
    python tools/mutation_test.py --file torch/utils/_contextlib.py --limit 10
    python tools/mutation_test.py --list      # enumerate mutants only
"""

import argparse
import ast
import concurrent.futures
import difflib
import glob
import importlib.util
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGETS = ["torch/utils/_contextlib.py", "torch/autograd/grad_mode.py", "torch/_dynamo/bytecode_transformation.py"]
OWNED = TARGETS  # fragments the checkout owns; the mutant tree holds their built modules as files
TEST_FILES = sorted(  # the upstream-bound tests
    os.path.relpath(p, CHECKOUT) for p in glob.glob(os.path.join(CHECKOUT, "test", "autograd", "test_grad_mode_*.py"))
) + ["test/autograd/test_autograd_mode_state.py", "test/dynamo/test_suspendable_frames.py"]
TEST_HELPERS = ["project_tests/grad_mode_programs.py"]  # for --tests project_tests/...
DEFAULT_PYTHON = os.path.join(CHECKOUT, ".venv", "bin", "python")
TEST_ENV = {
    "GRAD_MODE_PROPERTY_PROGRAMS": "100",
    "GRAD_MODE_ASYNC_PROPERTY_PROGRAMS": "50",
    "PYTORCH_PRINT_REPRO_ON_FAILURE": "0",
}


# ---------------------------------------------------------------------------
# Mutants
# ---------------------------------------------------------------------------

COMPARE_SWAPS = {
    ast.Eq: ast.NotEq, ast.NotEq: ast.Eq,
    ast.Lt: ast.GtE, ast.GtE: ast.Lt,
    ast.Gt: ast.LtE, ast.LtE: ast.Gt,
    ast.Is: ast.IsNot, ast.IsNot: ast.Is,
    ast.In: ast.NotIn, ast.NotIn: ast.In,
}


def _is_docstring(stmt):
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


class Mutator(ast.NodeTransformer):
    """Walk a module; count mutation points, and apply the one numbered *target*.

    Operators: flip a comparison operator (``==``/``!=``, ``<``/``>=``,
    ``is``/``is not``, ``in``/``not in``); swap ``True``/``False``; negate an
    ``if``/``while``/ternary condition; drop a ``not``; swap ``and``/``or``;
    return ``None`` instead of an expression; replace a statement of a body
    with ``pass`` (in a class body: leave it out); empty a ``finally`` block.
    """

    def __init__(self, target=None):
        self.target = target
        self.count = 0
        self.descriptions = []
        self.applied = None

    def _point(self, node, description):
        """Register a mutation point; True if it is the one to apply."""
        index = self.count
        self.count += 1
        self.descriptions.append((index, getattr(node, "lineno", 0), description))
        if index == self.target:
            self.applied = (index, getattr(node, "lineno", 0), description)
            return True
        return False

    # -- expressions ---------------------------------------------------------

    def visit_Compare(self, node):
        self.generic_visit(node)
        for i, op in enumerate(node.ops):
            swap = COMPARE_SWAPS.get(type(op))
            if swap and self._point(node, f"compare: {type(op).__name__} -> {swap.__name__}"):
                node.ops[i] = swap()
        return node

    def visit_Constant(self, node):
        if node.value is True or node.value is False:
            if self._point(node, f"constant: {node.value} -> {not node.value}"):
                return ast.copy_location(ast.Constant(value=not node.value), node)
        return node

    def visit_BoolOp(self, node):
        self.generic_visit(node)
        other = ast.Or if isinstance(node.op, ast.And) else ast.And
        if self._point(node, f"boolop: {type(node.op).__name__} -> {other.__name__}"):
            node.op = other()
        return node

    def visit_UnaryOp(self, node):
        self.generic_visit(node)
        if isinstance(node.op, ast.Not) and self._point(node, "drop not"):
            return node.operand
        return node

    def visit_IfExp(self, node):
        self.generic_visit(node)
        if self._point(node, "negate ternary condition"):
            node.test = ast.UnaryOp(op=ast.Not(), operand=node.test)
        return node

    # -- statements ------------------------------------------------------------

    def _negate_test(self, node, what):
        if self._point(node, f"negate {what} condition"):
            node.test = ast.copy_location(ast.UnaryOp(op=ast.Not(), operand=node.test), node.test)

    def visit_If(self, node):
        self.generic_visit(node)
        self._negate_test(node, "if")
        return node

    def visit_While(self, node):
        self.generic_visit(node)
        self._negate_test(node, "while")
        return node

    def visit_Return(self, node):
        self.generic_visit(node)
        if node.value is not None and not (isinstance(node.value, ast.Constant) and node.value.value is None):
            if self._point(node, "return None"):
                node.value = None
        return node

    def _visit_try(self, node):
        self.generic_visit(node)
        if node.finalbody and not all(isinstance(s, ast.Pass) for s in node.finalbody):
            if self._point(node.finalbody[0], "empty finally block"):
                node.finalbody = [ast.copy_location(ast.Pass(), node.finalbody[0])]
        return node

    visit_Try = _visit_try
    if hasattr(ast, "TryStar"):
        visit_TryStar = _visit_try

    def generic_visit(self, node):
        super().generic_visit(node)
        # Statement deletion, in every statement list but the module's own.
        if isinstance(node, ast.Module):
            return node
        for field in ("body", "orelse", "finalbody", "handlers"):
            stmts = getattr(node, field, None)
            if not isinstance(stmts, list) or field == "handlers":
                continue
            for i, stmt in enumerate(stmts):
                if not isinstance(stmt, ast.stmt) or isinstance(stmt, (ast.Pass, ast.Import, ast.ImportFrom)):
                    continue
                if _is_docstring(stmt) or isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    continue
                if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
                    continue  # ``...`` bodies
                first = ast.unparse(stmt).splitlines()[0][:60]
                if self._point(stmt, f"delete statement: {first}"):
                    stmts[i] = ast.copy_location(ast.Pass(), stmt)
            if isinstance(node, ast.ClassDef) and len(stmts) > 1:
                # A fragment's class holds definitions only (the splice refuses a
                # ``pass``): a deleted class attribute is left out of the fragment.
                stmts[:] = [s for s in stmts if not isinstance(s, ast.Pass)] or stmts
        return node


def list_mutants(source):
    m = Mutator()
    m.visit(ast.parse(source))
    return m.descriptions


def make_mutant(source, index):
    tree = ast.parse(source)
    m = Mutator(index)
    tree = m.visit(tree)
    ast.fix_missing_locations(tree)
    return ast.unparse(tree), m.applied


def mutant_diff(source, mutated, name):
    original = ast.unparse(ast.parse(source))
    return "".join(difflib.unified_diff(original.splitlines(True), mutated.splitlines(True),
                                        f"a/{name}", f"b/{name}", n=2))


# ---------------------------------------------------------------------------
# Snapshot and mutant trees
# ---------------------------------------------------------------------------


def _load(name, path):
    """Import module *name* from *path*, in place of any copy loaded already (the venv's start-up hook)."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def snapshot(workdir, tests):
    """Copy the pieces a build reads and the tests: the run sees one consistent checkout.

    Returns the snapshot's directory and its splice module.
    """
    snap = os.path.join(workdir, "snapshot")
    shutil.rmtree(snap, ignore_errors=True)
    shutil.copytree(os.path.join(CHECKOUT, "stack"), os.path.join(snap, "stack"))
    os.makedirs(os.path.join(snap, "overlay"))
    for path in glob.glob(os.path.join(CHECKOUT, "overlay", "*.py")):
        shutil.copy2(path, os.path.join(snap, "overlay"))
    splice = _load("_torch_gradmode_splice", os.path.join(snap, "overlay", "_torch_gradmode_splice.py"))
    inputs = [os.path.relpath(p, CHECKOUT) for p in splice.inputs(CHECKOUT)]
    for rel in dict.fromkeys(inputs + OWNED + list(tests) + TEST_HELPERS):
        src = os.path.join(CHECKOUT, rel)
        if os.path.isfile(src) and not rel.startswith(("stack/", "overlay/")):
            os.makedirs(os.path.dirname(os.path.join(snap, rel)), exist_ok=True)
            shutil.copy2(src, os.path.join(snap, rel))
    # The build imports _torch_gradmode_edits by name: the snapshot's too.
    _load("_torch_gradmode_edits", os.path.join(snap, "overlay", "_torch_gradmode_edits.py"))
    return snap, splice


def overlay_tree(python):
    """The current overlay tree's torch/ (built for the checkout if need be)."""
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_GRADMODE_OVERLAY", "TORCH_GRADMODE_STACK")}
    out = subprocess.run([python, "-c", "import torch, os; print(os.path.dirname(torch.__file__))"],
                         capture_output=True, text=True, env=env, cwd=CHECKOUT)
    base = out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else ""
    if not base.startswith(os.path.join(CHECKOUT, "build", "overlay-")):
        raise SystemExit(f"no overlay tree: `import torch` in {python} gives {base!r}\n{out.stderr}")
    return base


def wheel_reader(base):
    """``read(path)``: the wheel's upstream text of repo-relative *path*, or None."""
    site = os.path.dirname(os.path.dirname(os.path.realpath(os.path.join(base, "__init__.py"))))

    def read(path):
        where = os.path.join(site, path)
        if not path.startswith("torch/") or not os.path.isfile(where):
            return None
        with open(where, encoding="utf-8") as f:
            return f.read()

    return read


def build_modules(splice, src, read):
    """The modules of the wheel the build over the pieces at *src* writes: ``{torch/...py: text}``."""
    built = splice.build_install(src, read)
    return {p: t for p, t in built.items() if p.startswith("torch/") and p.endswith(".py")}


def _mirror(src, dst, real_dirs):
    """*dst* like the overlay tree's *src*: links to the wheel, real directories and files where it has them."""
    os.mkdir(dst)
    real_dirs.append(dst)
    for name in os.listdir(src):
        if name == "__pycache__":
            continue
        path = os.path.join(src, name)
        if os.path.islink(path):
            os.symlink(os.path.realpath(path), os.path.join(dst, name))
        elif os.path.isdir(path):
            _mirror(path, os.path.join(dst, name), real_dirs)
        else:
            shutil.copy2(path, os.path.join(dst, name))


def build_tree(root, base, modules, python):
    """A mutant tree at *root* over the overlay tree *base* (its torch/), with *modules* as files."""
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    real_dirs = []
    _mirror(base, os.path.join(root, "torch"), real_dirs)
    for rel, text in modules.items():
        path = os.path.join(root, rel)
        if os.path.islink(path) or not os.path.exists(os.path.dirname(path)):
            raise SystemExit(f"the overlay tree {base} has no file {rel}: is it out of date?")
        write_module(root, rel, text)
    # The overlay is off in the tree (TORCH_GRADMODE_OVERLAY=0), but the
    # modules need the patch's C++ half in torch._C all the same.
    with open(os.path.join(root, "sitecustomize.py"), "w") as f:
        f.write("import _torch_gradmode_overlay\n_torch_gradmode_overlay.install_binding()\n")
    # Bytecode for the real directories, once: the environment may forbid
    # writing it at import time, and compiling torch/*.py on every run is slow.
    for d in real_dirs:
        subprocess.run([python, "-m", "compileall", "-q", "-l", d], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def write_module(root, rel, text):
    path = os.path.join(root, rel)
    with open(path, "w") as f:
        f.write(text)
    # Never let a stale .pyc of an earlier mutant (same size, same second) be used.
    cache = os.path.join(os.path.dirname(path), "__pycache__")
    stem = os.path.splitext(os.path.basename(path))[0] + "."
    if os.path.isdir(cache):
        for name in os.listdir(cache):
            if name.startswith(stem):
                os.unlink(os.path.join(cache, name))


def tree_env(root):
    env = dict(os.environ)
    env.update(TEST_ENV)
    env["TORCH_GRADMODE_OVERLAY"] = "0"
    env["PYTHONPATH"] = root
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def probe(root, python):
    """Check that ``import torch`` in the mutant tree loads the tree's owned modules."""
    names = [rel[:-3].replace("/", ".") for rel in OWNED]
    files = ", ".join(f"{n}.__file__" for n in names)
    code = f"import json, torch, {', '.join(names)}; print(json.dumps([torch.__file__, {files}]))"
    out = subprocess.run([python, "-c", code], env=tree_env(root), capture_output=True, text=True, cwd=root)
    if out.returncode != 0:
        raise SystemExit(f"probe failed in {root}:\n{out.stderr}")
    files = json.loads(out.stdout.strip().splitlines()[-1])
    want = [os.path.join(root, "torch", "__init__.py")] + [os.path.join(root, rel) for rel in OWNED]
    if files != want:
        raise SystemExit(f"probe: torch in {root} resolves to {files}, not {want}")


# The test runs in flight.  Each runs in a process group of its own, so that
# a run that times out -- or a harness that is stopped, while a mutant makes a
# test spin for ever -- leaves no pytest (or subprocess of one) behind.
_RUNNING = set()


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_tests(root, snap, python, timeout, k_expr, test_files=None):
    tests = [t for t in (test_files or TEST_FILES) if os.path.exists(os.path.join(snap, t))]
    cmd = [python, "-m", "pytest", *tests, "-x", "-q", "-p", "no:cacheprovider", "-k", k_expr]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=tree_env(root), cwd=snap, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    _RUNNING.add(proc)
    try:
        stdout, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.communicate()
        return "timeout", time.monotonic() - start, ""
    finally:
        _RUNNING.discard(proc)
    tail = "\n".join(stdout.strip().splitlines()[-3:])
    return ("survived" if proc.returncode == 0 else "killed"), time.monotonic() - start, tail


# ---------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------


_LOG_LINE = re.compile(r"^\[\d+/\d+\] (killed|survived|timeout|invalid) +([\d.]+)s (\S+):(\d+) line (\d+): (.*)$")


def read_log(path, known):
    """Results from the printed output of an earlier run; *known* maps (file, index) to mutants."""
    results = []
    with open(path) as f:
        for line in f:
            match = _LOG_LINE.match(line.rstrip("\n"))
            if not match:
                continue
            status, secs, rel, index, lineno, desc = match.groups()
            m = known.get((rel, int(index)))
            if m is None or m[2] != int(lineno) or m[3] != desc:
                # The sources changed there since: that mutant runs again.
                print(f"{path}: {rel}:{index} (line {lineno}) no longer matches; running it again")
                continue
            results.append({"file": rel, "index": int(index), "line": int(lineno), "description": desc,
                            "status": status, "seconds": float(secs), "diff": "(from an earlier run)"})
    return results


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--file", action="append", choices=TARGETS, help="mutate only this file (repeatable)")
    p.add_argument("--limit", type=int, help="run at most N mutants (after sampling)")
    p.add_argument("--sample", type=int, help="run a random sample of N mutants")
    p.add_argument("--seed", type=int, default=20261129, help="seed of the sample")
    p.add_argument("--only", help="run only these mutants, e.g. 'torch/utils/_contextlib.py:12,40'")
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--timeout", type=float, default=240.0, help="seconds per mutant")
    p.add_argument("--python", default=DEFAULT_PYTHON)
    p.add_argument("--workdir", default="/tmp/grad_mode_mutation")
    p.add_argument("-k", dest="k_expr", default="not TestGradModeInstall", help="pytest -k expression")
    p.add_argument("--tests", nargs="+", help=f"test files to run instead of {TEST_FILES}")
    p.add_argument("--list", action="store_true", help="list the mutants and stop")
    p.add_argument("--json", help="write the results to this file")
    p.add_argument("--shuffle", action="store_true",
                   help="run in a random order (by --seed), so that a run stopped early is a fair sample")
    p.add_argument("--skip-log", action="append", default=[], metavar="LOG",
                   help="the printed output of an earlier run on the same sources: skip the mutants it "
                        "reports and count its results in the score (repeatable)")
    args = p.parse_args(argv)
    # Tests and probes run with the slot or snapshot as cwd: a relative --python must not break.
    args.python = os.path.abspath(args.python) if os.sep in args.python else args.python

    os.makedirs(args.workdir, exist_ok=True)
    snap, splice = snapshot(args.workdir, args.tests or TEST_FILES)
    sources = {}
    for rel in OWNED:
        with open(os.path.join(snap, rel)) as f:
            sources[rel] = f.read()

    mutants = []
    for rel in args.file or TARGETS:
        for index, line, desc in list_mutants(sources[rel]):
            mutants.append((rel, index, line, desc))
    total = len(mutants)
    if args.only:
        rel, _, nums = args.only.rpartition(":")
        wanted = {int(n) for n in nums.split(",")}
        mutants = [m for m in mutants if m[0] == rel and m[1] in wanted]
    if args.sample and args.sample < len(mutants):
        mutants = sorted(random.Random(args.seed).sample(mutants, args.sample), key=lambda m: (m[0], m[1]))
    earlier = []
    for log in args.skip_log:
        earlier.extend(read_log(log, {(m[0], m[1]): m for m in mutants}))
    done = {(r["file"], r["index"]) for r in earlier}
    mutants = [m for m in mutants if (m[0], m[1]) not in done]
    if args.shuffle:
        random.Random(args.seed).shuffle(mutants)
    if args.limit:
        mutants = mutants[: args.limit]
    if earlier:
        print(f"{len(earlier)} results taken from {', '.join(args.skip_log)}", flush=True)
    print(f"{total} mutants in {', '.join(args.file or TARGETS)}; running {len(mutants)}"
          + (f" (random sample, seed {args.seed})" if args.sample and args.sample < total else ""), flush=True)
    if args.list:
        for rel, index, line, desc in mutants:
            print(f"{rel}:{index} line {line}: {desc}")
        return 0

    # Stopped with SIGTERM (kill, a session ending) as with Ctrl-C: run the cleanup below.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        return _run(args, snap, splice, sources, mutants, earlier, total)
    finally:
        for proc in list(_RUNNING):
            _kill_group(proc)


def _run(args, snap, splice, sources, mutants, earlier, total):
    # One tree per job slot, checked, and the unmutated snapshot must pass.
    # Each slot splices from its own copy of the snapshot (``<slot>-src``).
    base = overlay_tree(args.python)
    read = wheel_reader(base)
    modules = build_modules(splice, snap, read)
    print(f"overlay tree: {base}; built from the snapshot: {', '.join(sorted(modules))}", flush=True)
    slots = [os.path.join(args.workdir, f"slot{i}") for i in range(max(1, args.jobs))]
    for root in slots:
        shutil.rmtree(root + "-src", ignore_errors=True)
        shutil.copytree(snap, root + "-src")
        build_tree(root, base, modules, args.python)
        probe(root, args.python)
    print("probe: import torch loads the mutant tree's modules", flush=True)
    status, secs, tail = run_tests(slots[0], snap, args.python, args.timeout * 2, args.k_expr, args.tests)
    print(f"baseline (unmutated snapshot): {status} in {secs:.0f}s\n{tail}", flush=True)
    if status != "survived":
        print("baseline fails: mutation results would mean nothing", file=sys.stderr)
        return 2

    free = list(slots)
    results = list(earlier)

    def run_one(m):
        rel, index, line, desc = m
        root = free.pop()
        try:
            mutated, applied = make_mutant(sources[rel], index)
            assert applied is not None and applied[0] == index, (m, applied)
            diff = mutant_diff(sources[rel], mutated, rel)
            try:
                compile(mutated, rel, "exec")
            except SyntaxError:
                return m, "killed", 0.0, "syntax error", diff
            # The mutated fragment, spliced into upstream's text as the install does.
            with open(os.path.join(root + "-src", rel), "w") as f:
                f.write(mutated)
            try:
                module = build_modules(splice, root + "-src", read)[rel]
            except splice.SpliceError as exc:
                return m, "invalid", 0.0, f"splice refuses it: {exc}", diff
            write_module(root, rel, module)
            status, secs, tail = run_tests(root, snap, args.python, args.timeout, args.k_expr, args.tests)
            return m, status, secs, tail, diff
        finally:
            # Back to the unmutated fragment and module for the next mutant in this slot.
            with open(os.path.join(root + "-src", rel), "w") as f:
                f.write(sources[rel])
            write_module(root, rel, modules[rel])
            free.append(root)

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=len(slots))
    try:
        for n, (m, status, secs, tail, diff) in enumerate(pool.map(run_one, mutants), 1):
            rel, index, line, desc = m
            print(f"[{n}/{len(mutants)}] {status:8s} {secs:5.0f}s {rel}:{index} line {line}: {desc}", flush=True)
            results.append({"file": rel, "index": index, "line": line, "description": desc,
                            "status": status, "seconds": round(secs, 1), "diff": diff})
    finally:
        # Stopped early: start no more mutants (main() kills the runs in flight).
        pool.shutdown(wait=False, cancel_futures=True)

    invalid = [r for r in results if r["status"] == "invalid"]
    for r in invalid:
        print(f"INVALID (not scored) {r['file']}:{r['index']} line {r['line']}: {r['description']}")
    scored = [r for r in results if r["status"] != "invalid"]
    killed = sum(r["status"] in ("killed", "timeout") for r in scored)
    survivors = [r for r in scored if r["status"] == "survived"]
    score = 100.0 * killed / len(scored) if scored else 0.0
    print(f"\nscore: {killed}/{len(scored)} killed = {score:.1f}%"
          + (f" (sample of {len(results)} of {total} mutants, seed {args.seed})" if len(results) < total else "")
          + (f"; {len(invalid)} invalid, not scored" if invalid else ""))
    for r in survivors:
        print(f"\nSURVIVED {r['file']}:{r['index']} line {r['line']}: {r['description']}\n{r['diff']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"total": total, "seed": args.seed, "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
