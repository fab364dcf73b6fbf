"""tools/export_pr.py on small PyTorch-shaped trees the tests build.

The trees hold stand-ins for the upstream files the patch touches: a few
lines each, with the lines the wiring edits anchor on.  One test uses the
installed wheel's own copies of the files it ships (the two modules and
Dynamo's trace rules), so that the anchors are checked against real text too.
"""

import ast
import os
import re
import subprocess
import sys
import tempfile

from torch.testing._internal.common_utils import run_tests, TestCase

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPORT = os.path.join(ROOT, "tools", "export_pr.py")
sys.path.insert(0, os.path.join(ROOT, "tools"))
import export_pr  # noqa: E402

# Stand-ins for upstream files: only the shape the wiring edits rely on.
STAND_INS = {
    "version.txt": "2.13.0a0\n",
    "torch/utils/_contextlib.py": "# stand-in for upstream's torch/utils/_contextlib.py\nX = 1\n",
    "torch/autograd/grad_mode.py": "# stand-in for upstream's torch/autograd/grad_mode.py\nY = 2\n",
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
    "torch/_dynamo/trace_rules.py": (
        '"""Rules; see `manual_torch_name_rule_map` below."""\n'
        "manual_torch_name_rule_map: dict[\n"
        "    str,\n"
        "    type[TorchInGraphFunctionVariable] | type[SkipFunctionVariable],\n"
        "] = {\n"
        '    "torch.onnx.is_in_onnx_export": TorchInGraphFunctionVariable,\n'
        '    "torch._C._skip_one_hop_torch_function": TorchInGraphFunctionVariable,\n'
        '    "torch._C._to_dlpack": SkipFunctionVariable,\n'
        '    "torch.to_dlpack": SkipFunctionVariable,\n'
        '    "torch._C.set_anomaly_enabled": SkipFunctionVariable,\n'
        "}\n\n"
        "other_rule_map = {\n"
        '    "torch._C._aaa": SkipFunctionVariable,\n'
        "}\n\n"
        "torch_c_binding_in_graph_functions = dict.fromkeys(\n"
        "    [\n"
        '        "math.acos",\n'
        '        "torch._C._get_autograd_fallback_mode",\n'
        '        "torch._C._get_cpp_backtrace",\n'
        '        "torch._C._set_grad_enabled",\n'
        '        "torch._C._te.abs",\n'
        "    ],\n"
        "    TorchInGraphFunctionVariable,\n"
        ")\n"
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

SECTION = "docs/source/notes/grad_mode_suspend_section.md"
NOTES = "docs/source/notes/autograd.md"
TEST_MODULE = "test/autograd/test_grad_mode_suspend.py"


def read(path, root=ROOT):
    with open(os.path.join(root, path)) as f:
        return f.read()


def make_tree(where, files=STAND_INS):
    for path, text in files.items():
        full = os.path.join(where, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w") as f:
            f.write(text)
    git(where, "init", "-q")
    git(where, "add", "-A")
    git(where, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "upstream")


def git(cwd, *args):
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def run_export(*args):
    return subprocess.run([sys.executable, EXPORT, *args], capture_output=True, text=True)


def patched_paths(patch):
    return re.findall(r"^diff --git a/(\S+) b/", patch, re.M)


class ExportTestCase(TestCase):
    def setUp(self):
        super().setUp()
        self._tmp = tempfile.TemporaryDirectory()
        self.tmp = self._tmp.name
        self.tree = os.path.join(self.tmp, "pytorch")
        self.out = os.path.join(self.tmp, "pr.patch")

    def tearDown(self):
        self._tmp.cleanup()
        super().tearDown()

    def export_ok(self, *extra):
        proc = run_export("--upstream", self.tree, "--out", self.out, *extra)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(self.out) as f:
            return f.read(), proc.stderr

    def export_fails(self, *extra):
        proc = run_export("--upstream", self.tree, "--out", self.out, *extra)
        self.assertEqual(proc.returncode, 2, proc.stdout + proc.stderr)
        self.assertFalse(os.path.exists(self.out))
        self.assertNotIn("Traceback", proc.stderr)
        return proc.stderr


class TestExport(ExportTestCase):
    def setUp(self):
        super().setUp()
        make_tree(self.tree)

    def test_applies_and_carries_the_checkout(self):
        patch, _ = self.export_ok()
        git(self.tree, "apply", "--check", self.out)
        git(self.tree, "-c", "user.name=t", "-c", "user.email=t@t", "am", "-q", self.out)
        for path in export_pr.carried():
            self.assertEqual(read(path, self.tree), read(path), path)
        # The section is not a file of its own upstream: its text is in the notes.
        self.assertFalse(os.path.exists(os.path.join(self.tree, SECTION)))
        self.assertIn(read(SECTION), read(NOTES, self.tree))

    def test_touches_only_its_files_and_few_upstream_lines(self):
        patch, _ = self.export_ok()
        paths = patched_paths(patch)
        self.assertEqual(sorted(paths), sorted(set(export_pr.carried()) | set(export_pr.WIRING)))
        stat = git(self.tree, "apply", "--numstat", self.out)
        replaced = {"torch/utils/_contextlib.py", "torch/autograd/grad_mode.py"}
        for line in stat.splitlines():
            added, removed, path = line.split("\t")
            if path == "test/test_autograd.py":
                # One import statement, however many classes it names.
                self.assertEqual(removed, "0", path)
                hunks = patch.split(f"b/{path}\n", 1)[1].split("diff --git")[0]
                added_lines = re.findall(r"^\+(?!\+\+)(.*)$", hunks, re.M)
                statements = ast.parse("\n".join(added_lines)).body
                self.assertEqual(len(statements), 1)
                self.assertIsInstance(statements[0], ast.ImportFrom)
                self.assertEqual(statements[0].module, "autograd.test_grad_mode_suspend")
            elif path == NOTES:
                # The section and a blank line after it, nothing of upstream's touched.
                self.assertEqual(removed, "0", path)
                self.assertEqual(int(added), len(read(SECTION).splitlines()) + 1, path)
            elif path in export_pr.WIRING:
                self.assertEqual(removed, "0", path)
                self.assertLessEqual(int(added), 8, path)
            elif path not in replaced:
                self.assertEqual(removed, "0", f"{path} is new: nothing of upstream's to remove")

    def test_wiring_lands_where_upstream_keeps_its_likes(self):
        self.export_ok()
        git(self.tree, "apply", self.out)

        def read(path):
            with open(os.path.join(self.tree, path)) as f:
                return f.read()

        imports = [line for line in read("test/test_autograd.py").splitlines() if line.startswith("from autograd.")]
        self.assertEqual(imports, sorted(imports))
        ours = [line for line in imports if line.startswith("from autograd.test_grad_mode_suspend import")]
        self.assertEqual(len(ours), 1, imports)
        module_cpp = read("torch/csrc/Module.cpp")
        self.assertIn("#include <torch/csrc/autograd/python_autograd_mode_state.h>\n"
                      "#include <torch/csrc/autograd/python_cpp_function.h>\n", module_cpp)
        self.assertIn("  torch::autograd::init_legacy_variable(module);\n"
                      "  torch::autograd::init_autograd_mode_state(module);\n", module_cpp)
        bzl = read("build_variables.bzl")
        core = bzl.split("libtorch_python_distributed_sources")[0]
        self.assertIn('    "torch/csrc/autograd/python_anomaly_mode.cpp",\n'
                      '    "torch/csrc/autograd/python_autograd_mode_state.cpp",\n'
                      '    "torch/csrc/autograd/python_cpp_function.cpp",\n', core)
        self.assertEqual(bzl.count("python_autograd_mode_state"), 1)
        stubs = read("torch/_C/__init__.pyi.in")
        for name in ("_get_autograd_mode_state", "_swap_autograd_mode_state", "_AutogradModeState"):
            self.assertIn(name, stubs)
        rules = read("torch/_dynamo/trace_rules.py")
        for name in export_pr.BINDING_NAMES:
            self.assertIn(f'"{name}"', rules)
        notes = read(NOTES)
        with open(os.path.join(ROOT, SECTION)) as f:
            section = f.read()
        # After the last grad mode's subsection, before the next heading, blank lines around it.
        self.assertIn("version of no-grad mode.\n\n" + section + "\n### Evaluation Mode", notes)
        # Graph breaks, beside the other torch._C skips inside manual_torch_name_rule_map, in order.
        manual = rules[rules.index("manual_torch_name_rule_map: "):]
        manual = manual[:manual.index("\n}")]
        self.assertIn('    "torch._C._skip_one_hop_torch_function": TorchInGraphFunctionVariable,\n'
                      '    "torch._C._get_autograd_mode_state": SkipFunctionVariable,\n'
                      '    "torch._C._swap_autograd_mode_state": SkipFunctionVariable,\n'
                      '    "torch._C._to_dlpack": SkipFunctionVariable,\n', manual)
        for name in export_pr.BINDING_NAMES:
            self.assertEqual(rules.count(f'"{name}"'), 1)
        self.assertNotIn("autograd_mode_state", rules[rules.index("torch_c_binding_in_graph_functions"):])
        self.assertNotIn("autograd_mode_state", rules[rules.index("other_rule_map"):])
        self.assertIn("# Defined in torch/csrc/autograd/python_autograd_mode_state.cpp\n", stubs)
        self.assertLess(stubs.index("_swap_autograd_mode_state"), stubs.index("def _set_grad_enabled"))

    def test_commit_message_is_the_description(self):
        patch, _ = self.export_ok()
        with open(export_pr.DESCRIPTION) as f:
            description = f.read()
        subject = description.splitlines()[0]
        headers = patch.split("\n\n", 1)[0].replace("\n ", " ")  # git folds long header lines
        self.assertIn(f"Subject: [PATCH] {subject}\n", headers + "\n")
        # Markdown headings survive (git's default cleanup would drop them as comments).
        for heading in ("## Summary", "## Motivation", "## Where the binding lives, and its names",
                        "## Release notes", "## BC-breaking notes", "## Test plan", "## Proposed stack"):
            self.assertIn(f"\n{heading}\n", patch)
        self.assertNotIn("RESULTS_TABLE", patch)

    def test_reproducible(self):
        first, _ = self.export_ok()
        second, _ = self.export_ok()
        self.assertEqual(first, second)

    def test_already_patched_tree_is_refused(self):
        self.export_ok()
        git(self.tree, "-c", "user.name=t", "-c", "user.email=t@t", "am", "-q", self.out)
        os.remove(self.out)
        err = self.export_fails()
        self.assertIn("DIR carries", err)

    def test_partly_patched_tree_is_refused(self):
        for path in ("torch/csrc/autograd/python_autograd_mode_state.cpp", "test/autograd/test_grad_mode_suspend.py"):
            with self.subTest(path=path):
                full = os.path.join(self.tree, path)
                os.makedirs(os.path.dirname(full), exist_ok=True)
                with open(full, "w") as f:
                    f.write("// an older copy\n")
                err = self.export_fails()
                self.assertIn(f"already has {path}", err)
                os.remove(full)
        with open(os.path.join(ROOT, "torch/utils/_contextlib.py")) as ours:
            with open(os.path.join(self.tree, "torch/utils/_contextlib.py"), "w") as theirs:
                theirs.write(ours.read())
        self.assertIn("torch/utils/_contextlib.py is already this checkout's", self.export_fails())
        with open(os.path.join(self.tree, "torch/utils/_contextlib.py"), "w") as theirs:
            theirs.write(STAND_INS["torch/utils/_contextlib.py"])
        os.remove(os.path.join(self.tree, "torch/autograd/grad_mode.py"))
        self.assertIn("lacks torch/autograd/grad_mode.py, which the patch replaces", self.export_fails())

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
            ("", "--out is empty"),
        ):
            with self.subTest(out=out):
                proc = run_export("--upstream", self.tree, "--out", out)
                self.assertEqual(proc.returncode, 2)
                self.assertIn(message, proc.stderr)
                self.assertNotIn("Traceback", proc.stderr)

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
        proc = subprocess.run([sys.executable, EXPORT, "--upstream", self.tree, "--out", self.out],
                              capture_output=True, text=True, env=env)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(self.out) as f:
            self.assertEqual(f.read(), first)
        # Nothing was committed to the repository GIT_DIR named.
        log = subprocess.run(["git", "log", "--all", "--oneline"], cwd=elsewhere, capture_output=True, text=True)
        self.assertEqual(log.stdout, "")


class TestExportRefusals(ExportTestCase):
    def test_lists_are_searched_only_inside(self):
        files = dict(STAND_INS)
        files["build_variables.bzl"] = (
            'libtorch_python_core_sources = [\n    "torch/csrc/DataLoader.cpp",\n]\n\n'
            'other_sources = [\n    "torch/csrc/autograd/python_variable.cpp",\n]\n'
        )
        make_tree(self.tree, files)
        err = self.export_fails()
        self.assertIn("build_variables.bzl: no line matching", err)
        self.assertIn("libtorch_python_core_sources", err)

    def test_missing_wiring_target(self):
        files = dict(STAND_INS)
        del files["torch/csrc/Module.cpp"]
        make_tree(self.tree, files)
        err = self.export_fails()
        self.assertIn("torch/csrc/Module.cpp", err)
        self.assertIn("--skip-missing", err)
        patch, stderr = self.export_ok("--skip-missing")
        self.assertNotIn("torch/csrc/Module.cpp", patched_paths(patch))
        self.assertIn("torch/csrc/Module.cpp not in --upstream", stderr)
        git(self.tree, "apply", "--check", self.out)

    def test_missing_anchor(self):
        files = dict(STAND_INS)
        files["torch/csrc/Module.cpp"] = files["torch/csrc/Module.cpp"].replace("init_legacy_variable", "init_other")
        make_tree(self.tree, files)
        err = self.export_fails()
        self.assertIn("torch/csrc/Module.cpp: no line matching", err)
        self.assertIn("init_legacy_variable", err)

    def test_missing_skip_rule_anchor(self):
        files = dict(STAND_INS)
        rules = files["torch/_dynamo/trace_rules.py"]
        # torch._C skips outside the dict do not count.
        files["torch/_dynamo/trace_rules.py"] = rules.replace(
            '    "torch._C._to_dlpack": SkipFunctionVariable,\n', ""
        ).replace('    "torch._C.set_anomaly_enabled": SkipFunctionVariable,\n', "")
        make_tree(self.tree, files)
        err = self.export_fails()
        self.assertIn("torch/_dynamo/trace_rules.py: no line matching", err)
        self.assertIn("manual_torch_name_rule_map", err)
        files["torch/_dynamo/trace_rules.py"] = rules.replace("manual_torch_name_rule_map", "other_map")
        make_tree(self.tree, files)
        err = self.export_fails()
        self.assertIn("torch/_dynamo/trace_rules.py: no 'manual_torch_name_rule_map:'", err)

    def test_other_version(self):
        make_tree(self.tree, dict(STAND_INS, **{"version.txt": "2.12.0\n"}))
        err = self.export_fails()
        self.assertIn("PyTorch 2.12.0", err)
        self.assertIn("v2.13", err)

    def test_not_a_tree(self):
        os.makedirs(self.tree)
        self.assertIn("not a PyTorch tree", self.export_fails())
        self.tree = os.path.join(self.tmp, "nowhere")
        self.assertIn("no such directory", self.export_fails())


class TestExportSection(ExportTestCase):
    """The docs section: short, MyST, and inserted after the grad modes' subsections."""

    def notes_after_export(self, notes):
        make_tree(self.tree, dict(STAND_INS, **{NOTES: notes}))
        self.export_ok()
        git(self.tree, "apply", self.out)
        return read(NOTES, self.tree)

    def test_section_is_short_and_fits_under_a_level_two_heading(self):
        self.assertEqual(export_pr.sections(), {SECTION: NOTES})
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
        make_tree(self.tree, dict(STAND_INS, **{NOTES: notes}))
        err = self.export_fails()
        self.assertIn(f"{NOTES}: no '### Inference Mode' heading", err)

    def test_notes_that_hold_the_section_already_are_refused(self):
        notes = STAND_INS[NOTES] + "\n" + read(SECTION)
        make_tree(self.tree, dict(STAND_INS, **{NOTES: notes}))
        self.assertIn("DIR carries", self.export_fails())

    def test_malformed_manifest_line(self):
        manifest = os.path.join(self.tmp, "upstream_bound.txt")
        with open(manifest, "w") as f:
            f.write("torch/utils/_contextlib.py\ndocs/x.md ->  # no target\n")
        saved = export_pr.MANIFEST
        export_pr.MANIFEST = manifest
        try:
            with self.assertRaisesRegex(export_pr.ExportError, r"upstream_bound.txt:2: expected 'SECTION -> TARGET'"):
                export_pr.sections()
        finally:
            export_pr.MANIFEST = saved


class TestExportTestImports(ExportTestCase):
    """test/test_autograd.py imports the TestGradMode* classes the new module defines, read from it."""

    def write_module(self, text):
        with open(os.path.join(self.tmp, "test_x.py"), "w") as f:
            f.write(text)
        return "test_x.py"

    def test_imports_every_class_the_module_defines(self):
        self.assertEqual([p for p in export_pr.carried() if p.startswith("test/")], [TEST_MODULE])
        defined = sorted(re.findall(r"^class (TestGradMode\w*)\b", read(TEST_MODULE), re.M))
        self.assertTrue(defined)
        make_tree(self.tree)
        self.export_ok()
        git(self.tree, "apply", self.out)
        tree = ast.parse(read("test/test_autograd.py", self.tree))
        imports = [node for node in tree.body if isinstance(node, ast.ImportFrom)
                   and node.module == "autograd.test_grad_mode_suspend"]
        self.assertEqual(len(imports), 1)
        self.assertEqual([alias.name for alias in imports[0].names], defined)

    def test_classes_are_read_from_the_source(self):
        path = self.write_module(
            "import unittest\n\n"
            "class Helper:\n    pass\n\n"
            "class TestGradModeB(unittest.TestCase):\n    class TestInner:\n        pass\n\n"
            "class TestGradModeA(unittest.TestCase):\n    pass\n\n"
            "instantiate_parametrized_tests(TestGradModeA)\n"
        )
        self.assertEqual(export_pr._test_classes(path, root=self.tmp), ["TestGradModeB", "TestGradModeA"])

    def test_a_test_class_that_would_not_run_upstream_is_refused(self):
        path = self.write_module("class TestGradModeA:\n    pass\n\nclass TestOther:\n    pass\n")
        with self.assertRaisesRegex(export_pr.ExportError, r"TestOther would not run upstream"):
            export_pr._test_classes(path, root=self.tmp)

    def test_device_type_classes_are_refused(self):
        path = self.write_module(
            "class TestGradModeA:\n    pass\n\ninstantiate_device_type_tests(TestGradModeA, globals())\n"
        )
        with self.assertRaisesRegex(export_pr.ExportError, r"TestGradModeA is instantiated per device type"):
            export_pr._test_classes(path, root=self.tmp)

    def test_a_name_test_autograd_has_already_is_refused(self):
        name = re.search(r"^class (TestGradMode\w*)\b", read(TEST_MODULE), re.M).group(1)
        files = dict(STAND_INS)
        files["test/test_autograd.py"] = files["test/test_autograd.py"].replace(
            "class TestAutograd:", f"class {name}:\n    pass\n\n\nclass TestAutograd:"
        )
        make_tree(self.tree, files)
        self.assertIn(f"test/test_autograd.py already defines or imports {name}", self.export_fails())


class TestExportAgainstTheWheel(ExportTestCase):
    def test_wheel_files(self):
        """The anchors are found in the wheel's own copies of the files it ships."""
        proc = subprocess.run(
            [sys.executable, "-c", "import torch, os; print(os.path.dirname(torch.__file__))"],
            env=dict(os.environ, TORCH_GRADMODE_OVERLAY="0"), capture_output=True, text=True, check=True,
        )
        wheel = proc.stdout.strip()
        files = dict(STAND_INS)
        for path in ("torch/utils/_contextlib.py", "torch/autograd/grad_mode.py", "torch/_dynamo/trace_rules.py",
                     "torch/version.py"):
            with open(os.path.join(wheel, os.path.relpath(path, "torch"))) as f:
                files[path] = f.read()
        del files["version.txt"]
        make_tree(self.tree, files)
        self.export_ok()
        git(self.tree, "apply", "--check", self.out)
        git(self.tree, "apply", self.out)
        for path in ("torch/utils/_contextlib.py", "torch/autograd/grad_mode.py"):
            with open(os.path.join(ROOT, path)) as ours, open(os.path.join(self.tree, path)) as theirs:
                self.assertEqual(theirs.read(), ours.read(), path)
        with open(os.path.join(self.tree, "torch/_dynamo/trace_rules.py")) as f:
            compile(f.read(), "trace_rules.py", "exec")


if __name__ == "__main__":
    run_tests()
