# Owner(s): ["module: autograd"]
"""How this checkout is laid over the installed torch wheel (project-only).

* ``TestGradModeInstall`` -- ``import torch`` loads this checkout's modules from
  one directory, in this process, in subprocesses and in spawned workers, and
  not with ``TORCH_GRADMODE_OVERLAY=0``; the C++ half is in ``torch._C``;
  ``setup.py`` says so when there is no C++ compiler;
* ``TestGradModeInstallRefusesOtherTorch`` -- with another torch than 2.13.x,
  ``setup.py`` refuses and the start-up hook stays off, saying why.

The ``setup.py`` runs build from a temporary copy of just this project's build
inputs, never in the checkout (nor in a PyTorch tree the tests may sit in).
"""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import torch
from torch.testing._internal.common_utils import run_tests, TestCase

CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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


class TestGradModeInstall(TestCase):
    def test_modules_come_from_this_checkout(self):
        import torch.autograd.grad_mode as grad_mode
        import torch.utils._contextlib as contextlib_mod

        for mod, rel in ((contextlib_mod, "torch/utils/_contextlib.py"),
                         (grad_mode, "torch/autograd/grad_mode.py")):
            self.assertEqual(os.path.realpath(mod.__file__), os.path.join(CHECKOUT, rel))

    def test_torch_lives_in_one_directory(self):
        # Dynamo decides what to trace by file location: our modules must sit
        # inside the directory that torch.__file__ names.
        import torch.utils._contextlib as contextlib_mod

        torch_dir = os.path.dirname(torch.__file__)
        self.assertTrue(contextlib_mod.__file__.startswith(torch_dir + os.sep))
        self.assertTrue(torch.autograd.grad_mode.__file__.startswith(torch_dir + os.sep))

    def test_overlay_switch_and_subprocesses(self):
        probe = "import os, torch.utils._contextlib as m; print(os.path.realpath(m.__file__))"
        ours = os.path.join(CHECKOUT, "torch", "utils", "_contextlib.py")
        on = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
        self.assertEqual(on.stdout.strip(), ours)
        env = dict(os.environ, TORCH_GRADMODE_OVERLAY="0")
        off = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                             check=True, env=env)
        self.assertNotEqual(off.stdout.strip(), ours)
        self.assertTrue(off.stdout.strip().endswith(os.path.join("torch", "utils", "_contextlib.py")))

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
        self.assertEqual(path, os.path.join(CHECKOUT, "torch", "utils", "_contextlib.py"))


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
