"""tools/export_pr.py on small PyTorch-shaped trees the tests build.

The trees hold, for the upstream files the splice checks by hash (the modules
it splices into and Dynamo's files), the installed wheel's own copies, read at
test time (this repository keeps no upstream text); for the other files the
patch edits, stand-ins: a few lines each, with the lines the anchored edits
look for.  ``--squash --out FILE`` writes one patch; ``--out-dir D`` the stack,
one patch a step of ``stack/series``.
"""

import ast
import os
import re
import subprocess
import sys
import tempfile
import unittest

from torch.testing._internal.common_utils import run_tests, TestCase

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPORT = os.path.join(ROOT, "tools", "export_pr.py")
DESCRIPTION = os.path.join(ROOT, "tools", "pr_description.md")
sys.path.insert(0, os.path.join(ROOT, "overlay"))
import _torch_gradmode_edits as edits  # noqa: E402
import _torch_gradmode_splice as splice  # noqa: E402

# Stand-ins for upstream files the splice does not check by hash: only the shape the edits rely on.
STAND_INS = {
    "version.txt": "2.13.0a0\n",
    "test/test_autograd.py": (
        "import torch\n\n\nclass TestAutograd:\n    pass\n\n\n"
        "from autograd.test_complex import TestAutogradComplex  # noqa: F401\n"
        "from autograd.test_functional import TestAutogradFunctional  # noqa: F401\n"
        "from autograd.test_logging import TestAutogradLogging  # noqa: F401\n\n\n"
        'if __name__ == "__main__":\n    run_tests()\n'
    ),
    "torch/csrc/Module.cpp": (
        "#include <torch/csrc/autograd/generated/python_return_types.h>\n"
        "#include <torch/csrc/autograd/python_cpp_function.h>\n"
        "#include <torch/csrc/autograd/python_legacy_variable.h>\n"
        "#include <torch/csrc/autograd/python_variable.h>\n"
        "#include <torch/csrc/jit/python/init.h>\n\n"
        "PyObject* initModule() {\n"
        "  torch::autograd::initAutogradClosureBindings(module);\n"
        "  torch::autograd::init_legacy_variable(module);\n"
        "  torch::python::init_bindings(module);\n"
        "}\n"
    ),
    "build_variables.bzl": (
        "libtorch_python_core_sources = [\n"
        '    "torch/csrc/autograd/init.cpp",\n'
        '    "torch/csrc/autograd/python_anomaly_mode.cpp",\n'
        '    "torch/csrc/autograd/python_cpp_function.cpp",\n'
        '    "torch/csrc/autograd/python_variable.cpp",\n'
        '    "torch/csrc/jit/python/init.cpp",\n'
        "]\n\n"
        "libtorch_python_distributed_sources = [\n"
        '    "torch/csrc/autograd/python_zzz.cpp",\n'
        "]\n"
    ),
    "torch/_C/__init__.pyi.in": (
        "default_generator: Generator\n\n"
        "# Defined in torch/csrc/autograd/init.cpp\n"
        "def _set_grad_enabled(enabled: _bool) -> None: ...\n"
        "def is_grad_enabled() -> _bool: ...\n"
        "def is_inference_mode_enabled() -> _bool: ...\n"
    ),
    "docs/source/notes/autograd.md": (
        "# Autograd mechanics\n\n"
        "## Locally disabling gradient computation\n\n"
        "### Grad Modes\n\n"
        "There are three grad modes, all of which can be toggled with context\n"
        "managers and decorators.\n\n"
        "```{list-table}\n```\n\n"
        "### No-grad Mode\n\n"
        "Computations in no-grad mode are not recorded.\n\n"
        "### Inference Mode\n\n"
        "Inference mode is the extreme version of no-grad mode.\n\n"
        "### Evaluation Mode (``nn.Module.eval()``)\n\n"
        "Evaluation mode is not a mechanism to locally disable gradient computation.\n\n"
        "## In-place operations with autograd\n"
    ),
}

SECTION = edits.SECTION
NOTES = "docs/source/notes/autograd.md"
CTX_MANAGER = "torch/_dynamo/variables/ctx_manager.py"
STEPS = splice.series(ROOT)
# The upstream modules the steps splice definitions into.
SPLICED = sorted({path for step in STEPS for path in step.defines})
# The edits that only add lines (wiring the new files in).
ADD_ONLY = {"torch/csrc/Module.cpp", "build_variables.bzl", "torch/_C/__init__.pyi.in", "torch/_dynamo/trace_rules.py"}
GIT_ID = ("-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false")
_WHEEL = {}


def wheel_torch_dir():
    if "dir" not in _WHEEL:
        proc = subprocess.run(
            [sys.executable, "-c", "import torch, os; print(os.path.dirname(torch.__file__))"],
            env=dict(os.environ, TORCH_GRADMODE_OVERLAY="0"), capture_output=True, text=True, check=True, cwd=os.sep,
        )
        _WHEEL["dir"] = proc.stdout.strip()
    return _WHEEL["dir"]


def wheel_text(path):
    """The installed wheel's copy of upstream file *path* (``torch/...``), or None."""
    where = os.path.join(os.path.dirname(wheel_torch_dir()), path)
    if not os.path.isfile(where):
        return None
    with open(where, encoding="utf-8") as f:
        return f.read()


def upstream_files(**overrides):
    """A tree's files: the wheel's copies of the hash-checked files, the stand-ins, then *overrides*."""
    files = {path: wheel_text(path) for path in splice.UPSTREAM_SHA256}
    files = {path: text for path, text in files.items() if text is not None}
    files.update(STAND_INS)
    files.update(overrides)
    return {path: text for path, text in files.items() if text is not None}


def make_tree(where, files=None):
    for path, text in (upstream_files() if files is None else files).items():
        full = os.path.join(where, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as f:
            f.write(text)
    git(where, "init", "-q")
    git(where, "add", "-A")
    git(where, *GIT_ID, "commit", "-qm", "upstream")


def git(cwd, *args):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def read(path, root=ROOT):
    with open(os.path.join(root, path), encoding="utf-8") as f:
        return f.read()


def reader(root):
    def read_upstream(path):
        where = os.path.join(root, path)
        return read(path, root) if os.path.isfile(where) else None

    return read_upstream


def run_export(*args, env=None):
    return subprocess.run([sys.executable, EXPORT, *args], capture_output=True, text=True, env=env)


def patched_paths(patch):
    return re.findall(r"^diff --git a/(\S+) b/", patch, re.M)


def new_files():
    """``{path: checkout file}`` of the new files, the last step's version of each."""
    newest = {}
    for step in STEPS:
        for path in step.new:
            newest[path] = step.source(path)
    return newest


def new_test_modules():
    return [p for p in new_files() if p.startswith("test/autograd/") and p.endswith(".py")]


def gradmode_classes(path):
    return sorted(re.findall(r"^class (TestGradMode\w*)\b", read(os.path.relpath(new_files()[path], ROOT)), re.M))


class ExportTestCase(TestCase):
    def setUp(self):
        super().setUp()
        self._tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self._tmp.cleanup)
        self.tmp = self._tmp.name
        self.tree = os.path.join(self.tmp, "pytorch")
        self.out = os.path.join(self.tmp, "pr.patch")
        self.out_dir = os.path.join(self.tmp, "series")

    def export_ok(self, *extra):
        proc = run_export("--upstream", self.tree, "--squash", "--out", self.out, *extra)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(self.out) as f:
            return f.read(), proc.stderr

    def export_series_ok(self, *extra):
        proc = run_export("--upstream", self.tree, "--out-dir", self.out_dir, *extra)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        return sorted(os.listdir(self.out_dir)), proc.stderr

    def export_fails(self, *extra):
        """Both forms fail with one clear line (exit 2), writing nothing."""
        errors = []
        for args in (("--squash", "--out", self.out), ("--out-dir", self.out_dir)):
            proc = run_export("--upstream", self.tree, *args, *extra)
            self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
            self.assertFalse(os.path.exists(self.out))
            self.assertFalse(os.path.isdir(self.out_dir) and os.listdir(self.out_dir))
            self.assertNotIn("Traceback", proc.stderr)
            lines = proc.stderr.strip().splitlines()
            self.assertEqual(len(lines), 1, proc.stderr)
            self.assertTrue(lines[0].startswith("export_pr: error: "), proc.stderr)
            errors.append(lines[0])
        self.assertEqual(errors[0], errors[1])
        return errors[0]

    def apply(self, patch_file):
        git(self.tree, *GIT_ID, "am", "-q", "--keep-non-patch", patch_file)


class TestSquash(ExportTestCase):
    def setUp(self):
        super().setUp()
        make_tree(self.tree)

    def test_applies_and_builds_what_the_install_builds(self):
        original = {path: read(path, self.tree) for path in SPLICED}
        self.export_ok()
        git(self.tree, "apply", "--check", self.out)
        self.apply(self.out)
        installed = splice.build_install(ROOT, lambda p: original.get(p, wheel_text(p)))
        for path in SPLICED:
            self.assertNotEqual(read(path, self.tree), original[path], path)
            self.assertEqual(read(path, self.tree), installed[path], path)
            compile(read(path, self.tree), path, "exec")
        self.assertIn("def _driver(", read("torch/utils/_contextlib.py", self.tree))
        self.assertIn("torch/utils/_contextlib.py", SPLICED)
        for path, source in new_files().items():
            self.assertEqual(read(path, self.tree), read(os.path.relpath(source, ROOT)), path)
        # The section is not a file of its own upstream: its text is in the notes.
        self.assertFalse(os.path.exists(os.path.join(self.tree, SECTION)))
        self.assertIn(read(SECTION), read(NOTES, self.tree))

    def test_touches_only_its_files_and_few_upstream_lines(self):
        patch, _ = self.export_ok()
        expected = set(new_files())
        for step in STEPS:
            expected |= set(step.defines) | set(step.edits)
        self.assertEqual(sorted(patched_paths(patch)), sorted(expected))
        stat = git(self.tree, "apply", "--numstat", self.out)
        for line in stat.splitlines():
            added, removed, path = line.split("\t")
            if path == "test/test_autograd.py":
                # One import statement a new test module, however many classes it names.
                self.assertEqual(removed, "0", path)
                hunks = patch.split(f"b/{path}\n", 1)[1].split("diff --git")[0]
                added_lines = re.findall(r"^\+(?!\+\+)(.*)$", hunks, re.M)
                statements = ast.parse("\n".join(added_lines)).body
                self.assertTrue(all(isinstance(s, ast.ImportFrom) for s in statements), added_lines)
                expected_modules = sorted("autograd." + os.path.splitext(os.path.basename(p))[0]
                                          for p in new_test_modules())
                self.assertEqual(sorted(s.module for s in statements), expected_modules)
            elif path == NOTES:
                # The section and a blank line after it, nothing of upstream's touched.
                self.assertEqual(removed, "0", path)
                self.assertEqual(int(added), len(read(SECTION).splitlines()) + 1, path)
            elif path in new_files():
                self.assertEqual(removed, "0", f"{path} is new: nothing of upstream's to remove")
            elif path in ADD_ONLY:
                self.assertEqual(removed, "0", path)
                self.assertLessEqual(int(added), 8 * len(edits.BINDINGS), path)  # a few lines a binding
            elif path not in SPLICED:  # an anchored change of upstream's code: a few lines
                # Dynamo's graph break: its message's fields take the lines, in the call
                # and in its registry entry.
                limit = {CTX_MANAGER: 20, "torch/_dynamo/graph_break_registry.json": 16}.get(path, 8)
                self.assertLessEqual(int(removed), 8, path)
                self.assertLessEqual(int(added), limit, path)

    def test_wiring_lands_where_upstream_keeps_its_likes(self):
        self.export_ok()
        git(self.tree, "apply", self.out)
        # One import a new test module, among upstream's "from autograd.* import", all in module order.
        imports = [node.module for node in ast.parse(read("test/test_autograd.py", self.tree)).body
                   if isinstance(node, ast.ImportFrom) and node.module.startswith("autograd.")]
        for path in new_test_modules():
            self.assertEqual(imports.count("autograd." + os.path.splitext(os.path.basename(path))[0]), 1, imports)
        self.assertEqual(imports, sorted(imports))
        module_cpp = read("torch/csrc/Module.cpp", self.tree)
        self.assertIn("#include <torch/csrc/autograd/python_autocast_state.h>\n"
                      "#include <torch/csrc/autograd/python_autograd_mode_state.h>\n"
                      "#include <torch/csrc/autograd/python_cpp_function.h>\n", module_cpp)
        # Each step puts its init right after the legacy variable's: the later step's first.
        self.assertIn("  torch::autograd::init_legacy_variable(module);\n"
                      "  torch::autograd::init_autocast_state(module);\n"
                      "  torch::autograd::init_autograd_mode_state(module);\n", module_cpp)
        bzl = read("build_variables.bzl", self.tree)
        core = bzl.split("libtorch_python_distributed_sources")[0]
        self.assertIn('    "torch/csrc/autograd/python_anomaly_mode.cpp",\n'
                      '    "torch/csrc/autograd/python_autocast_state.cpp",\n'
                      '    "torch/csrc/autograd/python_autograd_mode_state.cpp",\n'
                      '    "torch/csrc/autograd/python_cpp_function.cpp",\n', core)
        stubs = read("torch/_C/__init__.pyi.in", self.tree)
        for binding in edits.BINDINGS:
            self.assertEqual(bzl.count(binding.source), 1)
            for name in binding.names:
                self.assertIn(name.rsplit(".", 1)[1], stubs)
                self.assertLess(stubs.index(name.rsplit(".", 1)[1]), stubs.index("def _set_grad_enabled"))
            self.assertIn(f"# Defined in {binding.source}\n", stubs)
        self.assertIn("_AutogradModeState", stubs)
        self.assertIn("_AutocastState", stubs)
        # Graph breaks, among the torch._C skips inside manual_torch_name_rule_map of the wheel's rules.
        before = wheel_text("torch/_dynamo/trace_rules.py")
        rules = read("torch/_dynamo/trace_rules.py", self.tree)
        compile(rules, "trace_rules.py", "exec")
        manual = rules[rules.index("manual_torch_name_rule_map: "):]
        manual = manual[:manual.index("\n}")]
        names = [name for binding in edits.BINDINGS for name in binding.names]
        lines = manual.splitlines()
        skip = re.compile(r'\s+"torch\._C\.[\w.]+": SkipFunctionVariable,$')
        for name in names:
            self.assertEqual(rules.count(f'"{name}"'), 1)
            self.assertIn(f'    "{name}": SkipFunctionVariable,\n', manual)
            at = lines.index(f'    "{name}": SkipFunctionVariable,')
            self.assertTrue(skip.match(lines[at - 1]) or skip.match(lines[at + 1]), lines[at - 2 : at + 3])
        for name in names:
            rules = rules.replace(f'    "{name}": SkipFunctionVariable,\n', "")
        self.assertEqual(rules, before)
        notes = read(NOTES, self.tree)
        # After the last grad mode's subsection, before the next heading, blank lines around it.
        self.assertIn("version of no-grad mode.\n\n" + read(SECTION) + "\n### Evaluation Mode", notes)

    def test_commit_message_is_the_description(self):
        patch, _ = self.export_ok()
        description = read(os.path.relpath(DESCRIPTION, ROOT))
        subject = description.splitlines()[0]
        headers = patch.split("\n\n", 1)[0].replace("\n ", " ")  # git folds long header lines
        self.assertIn(f"Subject: [PATCH] {subject}\n", headers + "\n")
        # Markdown headings survive (git's default cleanup would drop them as comments).
        headings = re.findall(r"^## .*$", description, re.M)
        self.assertTrue(headings)
        for heading in headings:
            self.assertIn(f"\n{heading}\n", patch)

    def test_a_prefix_carries_its_steps_descriptions(self):
        steps = splice.series(ROOT)
        patch, _ = self.export_ok("--steps", "3")
        self.assertIn("[stack] steps 1-3:", patch.split("\n\n", 1)[0].replace("\n ", " "))
        for k, step in enumerate(steps, 1):
            subject = step.description().splitlines()[0]
            (self.assertIn if k <= 3 else self.assertNotIn)(subject, patch.replace("\n ", " "))

    def test_reproducible(self):
        first, _ = self.export_ok()
        second, _ = self.export_ok()
        self.assertEqual(first, second)

    def test_already_patched_tree_is_refused(self):
        self.export_ok()
        self.apply(self.out)
        os.remove(self.out)
        err = self.export_fails()
        self.assertIn("DIR carries", err)

    def test_partly_patched_tree_is_refused(self):
        for path in sorted(new_files()):
            with self.subTest(path=path):
                full = os.path.join(self.tree, path)
                os.makedirs(os.path.dirname(full), exist_ok=True)
                with open(full, "w") as f:
                    f.write("// an older copy\n")
                err = self.export_fails()
                self.assertIn(f"already has {path}, which the patch adds", err)
                os.remove(full)
        # A module the splice reads whose text is not 2.13.0's: patched already, or changed.
        built = splice.build_install(ROOT, reader(self.tree))
        checked = sorted({p for step in STEPS for p in [*step.defines, *step.edits]} & set(splice.UPSTREAM_SHA256))
        self.assertIn("torch/_dynamo/trace_rules.py", checked)
        for path in checked:
            with self.subTest(path=path):
                original = read(path, self.tree)
                for text in ([built[path]] if path in built else []) + [original + "# one more line\n"]:
                    with open(os.path.join(self.tree, path), "w") as f:
                        f.write(text)
                    err = self.export_fails()
                    self.assertIn(f"{path} is not torch 2.13.0's", err)
                with open(os.path.join(self.tree, path), "w") as f:
                    f.write(original)
        self.export_ok()  # all restored
        os.remove(self.out)
        os.remove(os.path.join(self.tree, "torch/autograd/grad_mode.py"))
        err = self.export_fails()
        self.assertRegex(err, r"the target lacks torch/autograd/grad_mode\.py, which step \S+ changes")

    def test_crlf_and_non_utf8_are_refused(self):
        path = os.path.join(self.tree, "torch/csrc/Module.cpp")
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(data.replace(b"\n", b"\r\n"))
        self.assertIn("torch/csrc/Module.cpp has CRLF line endings", self.export_fails())
        with open(path, "wb") as f:
            f.write(data + b"// caf\xe9\n")
        self.assertIn("torch/csrc/Module.cpp is not UTF-8", self.export_fails())

    def test_bad_out(self):
        for out, message in (
            (self.tmp, "is a directory"),
            (os.path.join(self.tmp, "no", "pr.patch"), "no such directory"),
        ):
            with self.subTest(out=out):
                proc = run_export("--upstream", self.tree, "--squash", "--out", out)
                self.assertEqual(proc.returncode, 2)
                self.assertIn(message, proc.stderr)
                self.assertNotIn("Traceback", proc.stderr)

    def test_bad_arguments(self):
        for args in (
            ("--out", self.out),  # --out without --squash
            ("--squash",),
            ("--squash", "--out", ""),
            ("--squash", "--out", self.out, "--out-dir", self.out_dir),
            (),
        ):
            with self.subTest(args=args):
                proc = run_export("--upstream", self.tree, *args)
                self.assertEqual(proc.returncode, 2)
                self.assertIn("give --out-dir D for the stack, or --squash --out FILE for one patch", proc.stderr)
                self.assertFalse(os.path.exists(self.out))
                self.assertFalse(os.path.exists(self.out_dir))

    def test_user_git_settings_do_not_reach_the_patch(self):
        first, _ = self.export_ok()
        config = os.path.join(self.tmp, "gitconfig")
        with open(config, "w") as f:
            f.write("[diff]\n\tnoprefix = true\n\tcontext = 7\n[format]\n\tsignOff = true\n"
                    "[commit]\n\tgpgsign = true\n[core]\n\tabbrev = 7\n")
        elsewhere = os.path.join(self.tmp, "elsewhere")
        os.makedirs(elsewhere)
        git(elsewhere, "init", "-q")
        env = dict(os.environ, GIT_CONFIG_GLOBAL=config, GIT_DIR=os.path.join(elsewhere, ".git"))
        proc = run_export("--upstream", self.tree, "--squash", "--out", self.out, env=env)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(self.out) as f:
            self.assertEqual(f.read(), first)
        # Nothing was committed to the repository GIT_DIR named.
        log = subprocess.run(["git", "log", "--all", "--oneline"], cwd=elsewhere, capture_output=True, text=True)
        self.assertEqual(log.stdout, "")


class TestSeries(ExportTestCase):
    def setUp(self):
        super().setUp()
        make_tree(self.tree)

    def test_one_patch_a_step_applied_in_order_builds_each_prefix(self):
        upstream = upstream_files()
        original = upstream.get
        patches, stderr = self.export_series_ok()
        self.assertTrue(all(re.match(r"\d{4}-.*\.patch\Z", p) for p in patches), patches)
        left_out = re.findall(r"^export_pr: step (\S+) changes nothing in --upstream: left out$", stderr, re.M)
        subjects = {step.description().splitlines()[0]: k for k, step in enumerate(STEPS, 1)}
        applied = []
        for patch in patches:
            self.apply(os.path.join(self.out_dir, patch))
            k = subjects[git(self.tree, "log", "-1", "--format=%s").strip()]
            applied.append(STEPS[k - 1].name)
            # After step k, each spliced module is what the first k steps build.
            built = splice.build(ROOT, STEPS[:k], original)
            for path in SPLICED:
                self.assertEqual(read(path, self.tree), built.get(path, upstream[path]), f"{path} after {patch}")
        # Every step is a patch, in the order of the series, or left out as empty, and said so.
        self.assertEqual(sorted(applied + left_out, key=[s.name for s in STEPS].index), [s.name for s in STEPS])
        self.assertEqual(applied, [s.name for s in STEPS if s.name not in left_out])
        for step in STEPS:
            if step.defines or step.new:
                self.assertIn(step.name, applied)
            if not (step.defines or step.new or step.edits):
                self.assertIn(step.name, left_out)
        # The last step: what the install builds.
        installed = splice.build_install(ROOT, original)
        for path in SPLICED:
            self.assertEqual(read(path, self.tree), installed[path], path)
        # The stack and the squashed patch end in the same tree.
        proc = run_export("--upstream", self.tree, "--squash", "--out", self.out)
        self.assertIn("DIR carries", proc.stderr)

    def test_numbered_and_described(self):
        patches, _ = self.export_series_ok()
        for n, patch in enumerate(patches, 1):
            with open(os.path.join(self.out_dir, patch)) as f:
                text = f.read()
            headers = text.split("\n\n", 1)[0].replace("\n ", " ")
            self.assertIn(f"Subject: [PATCH {n}/{len(patches)}] ", headers)
            self.assertTrue(patch.startswith(f"{n:04d}-"), patch)

    def test_reproducible(self):
        first, _ = self.export_series_ok()
        texts = [read(p, self.out_dir) for p in first]
        self.out_dir = os.path.join(self.tmp, "again")
        second, _ = self.export_series_ok()
        self.assertEqual(first, second)
        self.assertEqual(texts, [read(p, self.out_dir) for p in second])

    def test_bad_out_dir(self):
        a_file = os.path.join(self.tmp, "a_file")
        with open(a_file, "w") as f:
            f.write("x\n")
        self.export_series_ok()
        for out_dir, message in ((a_file, "is a file; give a folder"), (self.out_dir, "already holds patches")):
            with self.subTest(out_dir=out_dir):
                proc = run_export("--upstream", self.tree, "--out-dir", out_dir)
                self.assertEqual(proc.returncode, 2)
                self.assertIn(message, proc.stderr)
                self.assertNotIn("Traceback", proc.stderr)


class TestExportRefusals(ExportTestCase):
    def test_lists_are_searched_only_inside(self):
        make_tree(self.tree, upstream_files(**{"build_variables.bzl": (
            'libtorch_python_core_sources = [\n    "torch/csrc/DataLoader.cpp",\n]\n\n'
            'other_sources = [\n    "torch/csrc/autograd/python_variable.cpp",\n]\n'
        )}))
        err = self.export_fails()
        self.assertIn("build_variables.bzl: no line matching", err)
        self.assertIn("libtorch_python_core_sources", err)

    def test_missing_edit_target(self):
        make_tree(self.tree, upstream_files(**{"torch/csrc/Module.cpp": None}))
        err = self.export_fails()
        self.assertIn("lacks torch/csrc/Module.cpp, which the patch edits", err)
        self.assertIn("--skip-missing", err)
        patch, stderr = self.export_ok("--skip-missing")
        self.assertNotIn("torch/csrc/Module.cpp", patched_paths(patch))
        self.assertIn("torch/csrc/Module.cpp not in --upstream: exported without its edit", stderr)
        git(self.tree, "apply", "--check", self.out)
        self.export_series_ok("--skip-missing")

    def test_missing_anchor(self):
        cpp = STAND_INS["torch/csrc/Module.cpp"].replace("init_legacy_variable", "init_other")
        make_tree(self.tree, upstream_files(**{"torch/csrc/Module.cpp": cpp}))
        err = self.export_fails()
        self.assertIn("torch/csrc/Module.cpp: no line matching", err)
        self.assertIn("init_legacy_variable", err)

    def test_other_version(self):
        make_tree(self.tree, upstream_files(**{"version.txt": "2.12.0\n"}))
        err = self.export_fails()
        self.assertIn("PyTorch 2.12.0", err)
        self.assertIn("v2.13", err)

    def test_not_a_tree(self):
        os.makedirs(self.tree)
        self.assertIn("not a PyTorch tree", self.export_fails())
        self.tree = os.path.join(self.tmp, "nowhere")
        self.assertIn("no such directory", self.export_fails())
        self.tree = os.path.join(self.tmp, "a_file")
        with open(self.tree, "w") as f:
            f.write("x\n")
        self.assertIn("not a directory", self.export_fails())
        self.tree = ""
        self.assertIn("--upstream is empty", self.export_fails())


class TestTraceRulesEdit(TestCase):
    """The trace rules are checked by hash in a tree: their edit's anchors, on synthetic text."""

    RULES = (
        "manual_torch_name_rule_map: dict[\n    str,\n"
        "    type[TorchInGraphFunctionVariable] | type[SkipFunctionVariable],\n] = {\n"
        '    "torch.onnx.is_in_onnx_export": TorchInGraphFunctionVariable,\n'
        '    "torch._C._skip_one_hop_torch_function": TorchInGraphFunctionVariable,\n'
        '    "torch._C._to_dlpack": SkipFunctionVariable,\n'
        '    "torch.to_dlpack": SkipFunctionVariable,\n'
        '    "torch._C.set_anomaly_enabled": SkipFunctionVariable,\n'
        "}\n\n"
        "other_rule_map = {\n"
        '    "torch._C._aaa": SkipFunctionVariable,\n'
        "}\n"
    )
    # The context of the step that adds the autograd mode state binding.
    STEP = {"step_new": [edits.BINDINGS[0].source]}

    def test_in_the_first_run_of_torch_C_skips_of_the_manual_map(self):
        rules = edits.wire_trace_rules(self.RULES, "torch/_dynamo/trace_rules.py", self.STEP)
        self.assertIn('"torch._C._skip_one_hop_torch_function": TorchInGraphFunctionVariable,\n'
                      '    "torch._C._get_autograd_mode_state": SkipFunctionVariable,\n'
                      '    "torch._C._swap_autograd_mode_state": SkipFunctionVariable,\n'
                      '    "torch._C._swap_grad_enabled": SkipFunctionVariable,\n'
                      '    "torch._C._to_dlpack": SkipFunctionVariable,\n', rules)
        self.assertNotIn("autograd_mode_state", rules[rules.index("other_rule_map"):])

    def test_missing_anchors(self):
        rules = self.RULES.replace('    "torch._C._to_dlpack": SkipFunctionVariable,\n', "").replace(
            '    "torch._C.set_anomaly_enabled": SkipFunctionVariable,\n', "")
        with self.assertRaisesRegex(splice.SpliceError,
                                    "torch/_dynamo/trace_rules.py: no line matching.*manual_torch_name_rule_map"):
            edits.wire_trace_rules(rules, "torch/_dynamo/trace_rules.py", self.STEP)
        with self.assertRaisesRegex(splice.SpliceError,
                                    "torch/_dynamo/trace_rules.py: no 'manual_torch_name_rule_map:'"):
            edits.wire_trace_rules(self.RULES.replace("manual_torch_name_rule_map", "other_map"),
                                   "torch/_dynamo/trace_rules.py", self.STEP)

    def test_rules_that_have_the_names_already(self):
        rules = edits.wire_trace_rules(self.RULES, "torch/_dynamo/trace_rules.py", self.STEP)
        with self.assertRaisesRegex(splice.SpliceError, "DIR carries"):
            edits.wire_trace_rules(rules, "torch/_dynamo/trace_rules.py", self.STEP)


class TestExportSection(ExportTestCase):
    """The docs section: short, MyST, and inserted after the grad modes' subsections."""

    def notes_after_export(self, notes):
        make_tree(self.tree, upstream_files(**{NOTES: notes}))
        self.export_ok()
        git(self.tree, "apply", self.out)
        return read(NOTES, self.tree)

    def test_section_is_short_and_fits_under_a_level_two_heading(self):
        section = read(SECTION)
        lines = section.splitlines()
        self.assertLessEqual(len(lines), 80)
        self.assertRegex(lines[0], r"^\([\w-]+\)=$")  # a label other pages can link to
        headings = [line for line in lines if re.match(r"#+ ", line)]
        self.assertTrue(headings[0].startswith("### "), headings)
        self.assertFalse([h for h in headings if not h.startswith("###")], headings)
        self.assertIn(">>> ", section)  # one example

    def test_before_the_label_of_the_next_heading(self):
        notes = STAND_INS[NOTES].replace("### Evaluation Mode", "(eval-mode-doc)=\n\n### Evaluation Mode")
        patched = self.notes_after_export(notes)
        self.assertIn("version of no-grad mode.\n\n" + read(SECTION) + "\n(eval-mode-doc)=\n\n### Evaluation", patched)

    def test_at_the_end_when_nothing_follows(self):
        notes = STAND_INS[NOTES].split("### Evaluation Mode")[0].rstrip("\n") + "\n"
        patched = self.notes_after_export(notes)
        self.assertTrue(patched.endswith("version of no-grad mode.\n\n" + read(SECTION)), patched[-300:])

    def test_a_following_higher_level_heading_ends_the_subsection(self):
        notes = STAND_INS[NOTES].replace("### Evaluation Mode (``nn.Module.eval()``)", "## Something else")
        patched = self.notes_after_export(notes)
        self.assertIn(read(SECTION) + "\n## Something else", patched)

    def test_missing_anchor(self):
        notes = STAND_INS[NOTES].replace("### Inference Mode", "### Inference")
        make_tree(self.tree, upstream_files(**{NOTES: notes}))
        err = self.export_fails()
        self.assertIn(f"{NOTES}: no '### Inference Mode' heading", err)

    def test_notes_that_hold_the_section_already_are_refused(self):
        notes = STAND_INS[NOTES] + "\n" + read(SECTION)
        make_tree(self.tree, upstream_files(**{NOTES: notes}))
        self.assertIn("DIR carries", self.export_fails())


class TestExportTestImports(ExportTestCase):
    """test/test_autograd.py imports the TestGradMode* classes each new module defines, read from it."""

    def write_module(self, text):
        path = os.path.join(self.tmp, "test_x.py")
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_imports_every_class_each_module_defines(self):
        self.assertTrue(new_test_modules())
        make_tree(self.tree)
        self.export_ok()
        git(self.tree, "apply", self.out)
        tree = ast.parse(read("test/test_autograd.py", self.tree))
        for path in new_test_modules():
            with self.subTest(path=path):
                module = "autograd." + os.path.splitext(os.path.basename(path))[0]
                imports = [node for node in tree.body if isinstance(node, ast.ImportFrom) and node.module == module]
                self.assertEqual(len(imports), 1)
                defined = gradmode_classes(path)
                self.assertTrue(defined)
                self.assertEqual([alias.name for alias in imports[0].names], defined)

    def test_classes_are_read_from_the_source(self):
        path = self.write_module(
            "import unittest\n\n"
            "class Helper:\n    pass\n\n"
            "class TestGradModeB(unittest.TestCase):\n    class TestInner:\n        pass\n\n"
            "class TestGradModeA(unittest.TestCase):\n    pass\n\n"
            "instantiate_parametrized_tests(TestGradModeA)\n"
        )
        self.assertEqual(edits._test_classes("test/autograd/test_x.py", path), ["TestGradModeB", "TestGradModeA"])

    def test_a_test_class_that_would_not_run_upstream_is_refused(self):
        path = self.write_module("class TestGradModeA:\n    pass\n\nclass TestOther:\n    pass\n")
        with self.assertRaisesRegex(splice.SpliceError, r"TestOther would not run upstream"):
            edits._test_classes("test/autograd/test_x.py", path)

    def test_device_type_classes_are_refused(self):
        path = self.write_module(
            "class TestGradModeA:\n    pass\n\ninstantiate_device_type_tests(TestGradModeA, globals())\n"
        )
        with self.assertRaisesRegex(splice.SpliceError, r"TestGradModeA is instantiated per device type"):
            edits._test_classes("test/autograd/test_x.py", path)

    def test_a_name_test_autograd_has_already_is_refused(self):
        path = new_test_modules()[0]
        name = gradmode_classes(path)[0]
        test_autograd = STAND_INS["test/test_autograd.py"].replace(
            "class TestAutograd:", f"class {name}:\n    pass\n\n\nclass TestAutograd:"
        )
        make_tree(self.tree, upstream_files(**{"test/test_autograd.py": test_autograd}))
        self.assertIn(f"test/test_autograd.py already defines or imports {name}, which {path} defines too",
                      self.export_fails())


class TestExportAgainstTheWheelsStubs(ExportTestCase):
    def test_wheel_stubs(self):
        """The stubs' anchor is in the wheel's torch/_C/__init__.pyi, which carries __init__.pyi.in's text."""
        stubs = wheel_text("torch/_C/__init__.pyi")
        if stubs is None:
            raise unittest.SkipTest("the wheel ships no torch/_C/__init__.pyi")
        make_tree(self.tree, upstream_files(**{"torch/_C/__init__.pyi.in": stubs, "version.txt": None,
                                               "torch/version.py": wheel_text("torch/version.py")}))
        self.export_ok()
        git(self.tree, "apply", self.out)
        patched = read("torch/_C/__init__.pyi.in", self.tree)
        compile(patched, "__init__.pyi", "exec")
        self.assertIn("def _swap_autograd_mode_state(", patched)


if __name__ == "__main__":
    run_tests()
