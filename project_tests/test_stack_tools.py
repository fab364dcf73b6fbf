"""The stack's tools refuse what they cannot check or build, with one clear line."""

import os
import subprocess
import sys
import tempfile

from torch.testing._internal.common_utils import run_tests, TestCase

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def tool(name, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "tools", name), *args],
                          capture_output=True, text=True, cwd=ROOT)


class TestStackTools(TestCase):
    def test_check_stack_refuses_an_unknown_step(self):
        for step in ("99-typo", "4"):
            done = tool("check_stack.py", "--only", step)
            self.assertEqual(done.returncode, 2, done.stdout)
            self.assertIn(f"--only {step}: not a step of stack/series", done.stderr)

    def test_make_upstream_tree_refuses_swapped_folders(self):
        with tempfile.TemporaryDirectory() as tmp:
            tests, sources = os.path.join(tmp, "tests"), os.path.join(tmp, "sources")
            os.makedirs(os.path.join(sources, "torch", "csrc"))
            os.makedirs(tests)
            with open(os.path.join(tests, "test_autograd.py"), "w") as f:
                f.write("# stand-in\n")
            done = tool("make_upstream_tree.py", "--out", os.path.join(tmp, "tree"),
                        "--tests", sources, "--sources", tests)
            self.assertNotEqual(done.returncode, 0)
            self.assertIn("has no test_autograd.py", done.stderr)
            self.assertFalse(os.path.exists(os.path.join(tmp, "tree")))


if __name__ == "__main__":
    run_tests()
