# Owner(s): ["module: autograd"]
"""How this checkout is laid over the installed torch wheel (project-only).

* ``TestGradModeInstall`` -- ``import torch`` loads the modules the overlay
  built from the wheel's text and this checkout's fragments, from one tree
  (``build/overlay-<env>/<hash>/torch``), in this process, in subprocesses and
  in spawned workers, and not with ``TORCH_GRADMODE_OVERLAY=0``; the C++ half
  is in ``torch._C``; ``setup.py`` says so when there is no C++ compiler;
* ``TestOverlayTree`` -- the trees: built files and links to the wheel, keyed
  by what they are built from, so that an edit of a fragment in a copy of this
  checkout is seen by the next interpreter without reinstalling;
* ``TestGradModeInstallRefusesOtherTorch`` -- with another torch than 2.13.x,
  ``setup.py`` refuses and the start-up hook stays off, saying why.

The ``setup.py`` runs build from a temporary copy of just this project's build
inputs, never in the checkout (nor in a PyTorch tree the tests may sit in).
"""

import ast
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import torch
from torch.testing._internal.common_utils import run_tests, TestCase

CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(CHECKOUT, "overlay"))
import _torch_gradmode_overlay as overlay  # noqa: E402
import _torch_gradmode_splice as splice  # noqa: E402

MODULES = ("torch/utils/_contextlib.py", "torch/autograd/grad_mode.py")
# A tree: TREE_ROOT/<hash of its inputs>/torch/...
TREE = re.compile(re.escape(overlay.TREE_ROOT + os.sep) + r"[0-9a-f]{16}\Z")

# What setup.py reads: itself, the build configuration, the start-up hook, the
# lint plugin it registers and the C++ sources it compiles.
BUILD_INPUTS = (
    "setup.py",
    "pyproject.toml",
    "overlay/_torch_gradmode_overlay.py",
    "overlay/_torch_gradmode_C.cpp",
    "lint/__init__.py",
    "lint/flake8_torch_gradmode.py",
    "torch/csrc/autograd/python_autograd_mode_state.h",
    "torch/csrc/autograd/python_autograd_mode_state.cpp",
)


def looks_like_this_project(root):
    """Whether *root* holds this project's setup.py (not, say, PyTorch's own)."""
    if not all(os.path.isfile(os.path.join(root, rel)) for rel in BUILD_INPUTS):
        return False
    with open(os.path.join(root, "setup.py")) as f:
        return 'name="torch-gradmode-patch"' in f.read()


def copy_of_build_inputs(test):
    """A temporary directory holding a copy of BUILD_INPUTS, removed after *test*;
    skips *test* when the checkout is not this project."""
    if not looks_like_this_project(CHECKOUT):
        raise unittest.SkipTest(f"{CHECKOUT} does not hold this project's setup.py")
    tmp = tempfile.TemporaryDirectory()
    test.addCleanup(tmp.cleanup)
    for rel in BUILD_INPUTS:
        dst = os.path.join(tmp.name, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(os.path.join(CHECKOUT, rel), dst)
    return tmp.name


def wheel_torch_dir():
    proc = subprocess.run(
        [sys.executable, "-c", "import torch, os; print(os.path.dirname(torch.__file__))"],
        env=dict(os.environ, TORCH_GRADMODE_OVERLAY="0"), capture_output=True, text=True, check=True, cwd=os.sep,
    )
    return proc.stdout.strip()


def top_level_names(path):
    with open(path, encoding="utf-8") as f:
        return {splice._name(node) for node in ast.parse(f.read(), path).body} - {None}


def tree_of(module_file, rel):
    """The overlay tree *module_file* (a module's ``__file__``, at *rel* in the tree) was loaded from."""
    path = os.path.realpath(module_file)
    suffix = os.sep + rel
    if not path.endswith(suffix):
        raise AssertionError(f"{path} is not at {rel}")
    return path[: -len(suffix)]


class TestGradModeInstall(TestCase):
    def test_modules_come_from_the_overlay_tree(self):
        import torch.autograd.grad_mode as grad_mode
        import torch.utils._contextlib as contextlib_mod

        wheel = wheel_torch_dir()
        trees = set()
        for mod, rel in ((contextlib_mod, MODULES[0]), (grad_mode, MODULES[1])):
            tree = tree_of(mod.__file__, rel)
            self.assertRegex(tree, TREE)
            trees.add(tree)
            built = os.path.join(tree, rel)
            # A file of the tree, built: not the wheel's, not the checkout's fragment.
            self.assertFalse(os.path.islink(built), built)
            with open(built) as f, open(os.path.join(wheel, os.path.relpath(rel, "torch"))) as g:
                self.assertNotEqual(f.read(), g.read(), rel)
            # Every top-level definition of the fragment and of upstream's module is in it.
            names = top_level_names(built)
            self.assertLessEqual(set(splice.fragment_names(os.path.join(CHECKOUT, rel))), names, rel)
            self.assertLessEqual(top_level_names(os.path.join(wheel, os.path.relpath(rel, "torch"))), names, rel)
        self.assertEqual(len(trees), 1)
        self.assertTrue(callable(contextlib_mod._driver))
        self.assertTrue(callable(contextlib_mod._wrap_async_generator))
        # Each grad mode carries what its own block sets: grad mode alone, or
        # (inference_mode) the binding's whole autograd state.
        for cls in (grad_mode.no_grad, grad_mode.enable_grad, grad_mode.set_grad_enabled):
            self.assertIs(cls._carried_state, grad_mode._GRAD_MODE_STATE)
        self.assertIs(grad_mode.inference_mode._carried_state, grad_mode._INFERENCE_MODE_STATE)
        self.assertEqual(
            grad_mode._INFERENCE_MODE_STATE,
            (contextlib_mod._get_autograd_mode_state, torch._C._swap_autograd_mode_state),
        )

    def test_the_tree_links_to_the_wheel(self):
        wheel = wheel_torch_dir()
        tree = os.path.dirname(os.path.dirname(os.path.abspath(torch.__file__)))
        self.assertRegex(tree, TREE)
        # Everything but the built files is a link to the wheel's.
        self.assertTrue(os.path.islink(os.path.join(tree, "torch", "__init__.py")))
        self.assertEqual(os.path.realpath(torch.__file__), os.path.join(wheel, "__init__.py"))
        self.assertEqual(os.path.realpath(os.path.join(tree, "torch", "nn")), os.path.join(wheel, "nn"))
        self.assertFalse(os.path.islink(os.path.join(tree, "torch", "utils")))  # it holds a built file
        self.assertTrue(os.path.islink(os.path.join(tree, "torch", "utils", "data")))
        for rel in MODULES:
            self.assertFalse(os.path.islink(os.path.join(tree, rel)), rel)

    def test_the_tree_is_what_the_splice_builds(self):
        probe = "import torch.utils._contextlib as m; print(m.__file__)"
        loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
        tree = tree_of(loaded.stdout.strip(), MODULES[0])
        wheel = wheel_torch_dir()
        self.assertEqual(tree, overlay.build_tree(wheel, overlay.selected_steps()))
        built = splice.build(CHECKOUT, overlay.selected_steps(), overlay._reader(wheel),
                             only=lambda p: p.startswith("torch/") and p.endswith(".py"))
        self.assertTrue(built)
        for rel, text in built.items():
            with open(os.path.join(tree, rel), encoding="utf-8") as f:
                self.assertEqual(f.read(), text, rel)

    def test_torch_lives_in_one_directory(self):
        # Dynamo decides what to trace by file location: our modules must sit
        # inside the directory that torch.__file__ names.
        import torch.utils._contextlib as contextlib_mod

        torch_dir = os.path.dirname(torch.__file__)
        self.assertTrue(contextlib_mod.__file__.startswith(torch_dir + os.sep))
        self.assertTrue(torch.autograd.grad_mode.__file__.startswith(torch_dir + os.sep))

    def test_overlay_switch_and_subprocesses(self):
        probe = "import os, torch.utils._contextlib as m; print(os.path.realpath(m.__file__))"
        on = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
        self.assertRegex(tree_of(on.stdout.strip(), MODULES[0]), TREE)
        self.assertIn("_driver", top_level_names(on.stdout.strip()))
        env = dict(os.environ, TORCH_GRADMODE_OVERLAY="0")
        off = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                             check=True, env=env)
        stock = off.stdout.strip()
        self.assertEqual(stock, os.path.join(wheel_torch_dir(), "utils", "_contextlib.py"))
        self.assertFalse(stock.startswith(overlay.TREE_ROOT + os.sep))
        self.assertNotIn("_driver", top_level_names(stock))

    def test_binding_is_in_torch_C(self):
        # The hook registers the C++ half where upstream's torch._C defines it.
        self.assertTrue(callable(torch._C._swap_autograd_mode_state))
        self.assertIsInstance(torch._C._get_autograd_mode_state(), torch._C._AutogradModeState)
        with self.assertRaisesRegex(TypeError, "expected a state from _get_autograd_mode_state"):
            torch._C._swap_autograd_mode_state(True)

    def test_setup_without_compiler_says_so(self):
        env = dict(os.environ, CXX="/nonexistent/c++")
        done = subprocess.run([sys.executable, "setup.py", "build_ext"], cwd=copy_of_build_inputs(self), env=env,
                              capture_output=True, text=True)
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("error: no C++ compiler ('/nonexistent/c++' not found)", done.stderr)

    def test_overlay_reaches_spawned_processes(self):
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(1) as pool:
            path = pool.apply(_contextlib_path)
        import torch.utils._contextlib as contextlib_mod

        self.assertRegex(tree_of(path, MODULES[0]), TREE)
        self.assertEqual(path, os.path.realpath(contextlib_mod.__file__))


# Run in a fresh interpreter with the overlay of the checkout copy at sys.argv[1]:
# the installed hook is kept off (TORCH_GRADMODE_OVERLAY=0 at start-up), the
# copy's hook is imported in its place and activated, as its .pth would.
ACTIVATE_COPY = """
import os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "overlay"))
for name in ("_torch_gradmode_overlay", "_torch_gradmode_splice", "_torch_gradmode_edits"):
    sys.modules.pop(name, None)
os.environ["TORCH_GRADMODE_OVERLAY"] = "1"
import _torch_gradmode_overlay
assert _torch_gradmode_overlay.CHECKOUT == sys.argv[1], _torch_gradmode_overlay.CHECKOUT
_torch_gradmode_overlay.activate()
import torch.utils._contextlib as m
print(os.path.realpath(m.__file__))
print(getattr(m, "_SPLICE_PROBE", None))
"""


class TestOverlayTree(TestCase):
    """An edit of a fragment is seen by the next interpreter, without reinstalling (in a copy of the checkout)."""

    def setUp(self):
        super().setUp()
        if not looks_like_this_project(CHECKOUT):
            raise unittest.SkipTest(f"{CHECKOUT} does not hold this project's setup.py")
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.copy = os.path.realpath(os.path.join(tmp.name, "checkout"))
        # What a build reads: the overlay (and its C++ half), the stack, and the pieces the steps name.
        shutil.copytree(os.path.join(CHECKOUT, "overlay"), os.path.join(self.copy, "overlay"),
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        shutil.copytree(os.path.join(CHECKOUT, "stack"), os.path.join(self.copy, "stack"))
        for path in splice.inputs(CHECKOUT):
            rel = os.path.relpath(path, CHECKOUT)
            if not rel.startswith(".."):
                os.makedirs(os.path.dirname(os.path.join(self.copy, rel)), exist_ok=True)
                shutil.copy2(path, os.path.join(self.copy, rel))
        self.fragment = os.path.join(self.copy, MODULES[0])

    def start(self):
        done = subprocess.run([sys.executable, "-c", ACTIVATE_COPY, self.copy], capture_output=True, text=True,
                              env=dict(os.environ, TORCH_GRADMODE_OVERLAY="0"), cwd=os.sep)
        self.assertEqual(done.returncode, 0, done.stderr)
        path, probe = done.stdout.split()
        return path, probe

    def edit_fragment(self, value):
        """Make the fragment's ``_driver`` set module global ``_SPLICE_PROBE`` to *value* (the module calls it)."""
        with open(self.fragment) as f:
            text = f.read()
        lines = text.splitlines(keepends=True)
        driver = next(n for n in ast.parse(text).body if getattr(n, "name", None) == "_driver")
        indent = " " * driver.body[0].col_offset
        # First statement of the body after the docstring: the probe runs when the module defines a driver.
        at = driver.body[1].lineno - 1 if ast.get_docstring(driver) else driver.body[0].lineno - 1
        lines.insert(at, f"{indent}global _SPLICE_PROBE\n{indent}_SPLICE_PROBE = {value!r}\n")
        with open(self.fragment, "w") as f:
            f.write("".join(lines))

    def test_a_fragment_edit_is_seen_by_the_next_interpreter(self):
        first, probe = self.start()
        tree_root = os.path.join(self.copy, "build", os.path.basename(overlay.TREE_ROOT))
        self.assertTrue(first.startswith(tree_root + os.sep), first)
        self.assertEqual(probe, "None")
        self.assertEqual(self.start()[0], first)  # cached: the same tree
        self.edit_fragment("edited-1")
        second, probe = self.start()
        self.assertEqual(probe, "edited-1")
        self.assertNotEqual(os.path.dirname(second), os.path.dirname(first))
        self.assertTrue(second.startswith(tree_root + os.sep), second)
        # The first tree is left as it was: a process may still import from it.
        with open(first) as f:
            self.assertNotIn("_SPLICE_PROBE", f.read())
        with open(second) as f:
            self.assertIn("_SPLICE_PROBE = 'edited-1'", f.read())
        # The checkout's own fragment and trees are untouched.
        with open(os.path.join(CHECKOUT, MODULES[0])) as f:
            self.assertNotIn("_SPLICE_PROBE", f.read())

    def test_the_key_follows_the_inputs(self):
        wheel = wheel_torch_dir()
        saved = overlay.CHECKOUT
        overlay.CHECKOUT = self.copy
        try:
            steps = splice.series(self.copy)
            key = overlay._key(wheel, steps)
            self.assertEqual(overlay._key(wheel, steps), key)
            self.assertNotEqual(overlay._key(wheel, steps[:-1]), key)
            self.edit_fragment("edited-2")
            self.assertNotEqual(overlay._key(wheel, steps), key)
        finally:
            overlay.CHECKOUT = saved

    def test_trees_in_use_are_kept_and_stale_ones_removed(self):
        # Every prefix of the stack is a tree: more than the old keep-six rule allowed, while
        # compare_stack.sh runs one prefix in one process and starts the next in another.
        wheel = wheel_torch_dir()
        saved = overlay.CHECKOUT, overlay.TREE_ROOT
        overlay.CHECKOUT = self.copy
        overlay.TREE_ROOT = os.path.join(self.copy, "build", "trees")
        try:
            steps = splice.series(self.copy)
            trees = [overlay.build_tree(wheel, steps[:k]) for k in range(len(steps) + 1)]
            self.assertEqual(len(set(trees)), len(steps) + 1)
            for tree in trees:
                self.assertTrue(os.path.isfile(os.path.join(tree, "torch", "utils", "_contextlib.py")), tree)
            # Unused for longer than the limit: removed by the next build, renamed away first.
            week = 8 * 86400
            os.utime(trees[0], (os.path.getatime(trees[0]) - week, os.path.getmtime(trees[0]) - week))
            overlay.build_tree(wheel, steps[:1])  # cached: uses its tree, prunes nothing
            self.assertTrue(os.path.isdir(trees[0]))
            self.edit_fragment("edited-3")
            overlay.build_tree(wheel, steps)  # a new tree: prunes
            self.assertFalse(os.path.exists(trees[0]))
            self.assertTrue(all(os.path.isdir(t) for t in trees[1:]))
            self.assertEqual([n for n in os.listdir(overlay.TREE_ROOT) if n.startswith(".")], [])
        finally:
            overlay.CHECKOUT, overlay.TREE_ROOT = saved


class TestGradModeInstallRefusesBadRequests(TestCase):
    """Asked for what it cannot give, the install says so rather than run stock torch quietly."""

    def test_unknown_stack_prefix_fails_import(self):
        for value in ("99", "abc", "1.0", "\u00b2", "no-such-step"):
            done = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True,
                                  env=dict(os.environ, TORCH_GRADMODE_STACK=value))
            self.assertNotEqual(done.returncode, 0, value)
            self.assertIn(f"TORCH_GRADMODE_STACK={value!r}: give 0 to", done.stderr)
            self.assertIn("TORCH_GRADMODE_OVERLAY=0 for stock torch", done.stderr)

    def test_a_step_name_selects_its_prefix(self):
        steps = splice.series(CHECKOUT)
        probe = "import torch; print(hasattr(torch._C, '_swap_autograd_mode_state'))"
        # The step that adds the binding: the prefix up to the one before it
        # lacks it, the prefix up to it has it.
        source = "torch/csrc/autograd/python_autograd_mode_state.cpp"
        adds = next(k for k, step in enumerate(steps, 1) if source in step.new)
        self.assertGreater(adds, 1)
        for k, expect in ((adds - 1, "False"), (adds, "True")):
            done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                                  env=dict(os.environ, TORCH_GRADMODE_STACK=steps[k - 1].name))
            self.assertEqual((done.returncode, done.stdout.strip()), (0, expect), done.stderr)

    def test_a_non_editable_install_is_refused(self):
        done = subprocess.run([sys.executable, "setup.py", "bdist_wheel"], cwd=CHECKOUT,
                              capture_output=True, text=True)
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("installs from its checkout only: pip install -e", done.stderr)


class TestGradModeInstallRefusesOtherTorch(TestCase):
    """Another torch than 2.13.x: the install refuses, and the start-up hook stays off, saying why."""

    def setUp(self):
        super().setUp()
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        fake = os.path.join(self.tmp.name, "torch")
        os.mkdir(fake)
        with open(os.path.join(fake, "__init__.py"), "w") as f:
            f.write("")
        with open(os.path.join(fake, "version.py"), "w") as f:
            f.write("__version__ = '2.12.1+cpu'\n")
        # The fake torch comes first on the path; the overlay is off so that
        # its link tree does not shadow the fake.
        self.env = dict(os.environ, PYTHONPATH=self.tmp.name, TORCH_GRADMODE_OVERLAY="0")

    def test_setup_refuses(self):
        done = subprocess.run([sys.executable, "setup.py", "bdist_wheel"], cwd=copy_of_build_inputs(self),
                              env=self.env, capture_output=True, text=True)
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("supports torch 2.13.x only, but torch 2.12.1+cpu is installed", done.stderr)

    def test_startup_hook_stays_off(self):
        env = dict(self.env)
        del env["TORCH_GRADMODE_OVERLAY"]
        done = subprocess.run([sys.executable, "-c", "import torch, sys; print(torch.__file__)"], env=env,
                              capture_output=True, text=True, check=True)
        self.assertIn("overlay inactive", done.stderr)
        self.assertIn("supports torch 2.13.x only", done.stderr)
        self.assertEqual(done.stdout.strip(), os.path.join(self.tmp.name, "torch", "__init__.py"))


def _contextlib_path():
    import torch.utils._contextlib as m

    return os.path.realpath(m.__file__)


if __name__ == "__main__":
    run_tests()
