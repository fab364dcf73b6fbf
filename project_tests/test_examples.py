# Owner(s): ["module: autograd"]
"""Run the examples in ``examples/`` and check their reports.

Each example runs in a subprocess, with this patch and on stock torch 2.13.0
(``TORCH_GRADMODE_OVERLAY=0``), and prints its ``main()`` report as JSON on its
last line (``--json``).  With the patch each exits 0 and its report meets the
contract; on stock torch each exits 1, for the reasons checked below.
"""

import ast
import json
import os
import re
import subprocess
import sys

from torch.testing._internal.common_utils import run_tests, TestCase


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "overlay"))
import _torch_gradmode_overlay  # noqa: E402
EXAMPLES = os.path.join(REPO, "examples")
# The patched modules are built from the wheel's text and the checkout's
# fragments into a tree build/overlay-<env>/<hash>/torch/... (the overlay's TREE_ROOT).
BUILT_CONTEXTLIB = re.compile(
    re.escape(os.path.join(os.path.realpath(REPO), "build", "overlay-"))
    + r"[0-9a-f]{12}/[0-9a-f]{16}/torch/utils/_contextlib\.py\Z"
)
# Definitions the patch adds to torch/utils/_contextlib.py (upstream's has none of them).
ADDED = ("_Body", "_driver", "_wrap_coroutine", "_wrap_async_generator")


def defined_names(path):
    with open(path, encoding="utf-8") as f:
        return {
            node.name for node in ast.parse(f.read(), path).body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        }


def assert_built(test, path):
    """*path* is the _contextlib module this environment's overlay tree built: the fragment's definitions in it."""
    test.assertRegex(path, BUILT_CONTEXTLIB)
    test.assertTrue(path.startswith(_torch_gradmode_overlay.TREE_ROOT + os.sep), path)
    test.assertFalse(os.path.islink(path), f"{path} is a link, not a built file")
    names = defined_names(path)
    for name in ADDED:
        test.assertIn(name, names, path)
    # Upstream's definitions are there too: a whole module, not the fragment.
    test.assertIn("_NoParamDecoratorContextManager", names, path)


def assert_stock(test, path):
    """*path* is the wheel's own _contextlib module: outside the overlay trees, none of the patch's definitions."""
    test.assertNotRegex(path, BUILT_CONTEXTLIB)
    test.assertFalse(path.startswith(os.path.join(os.path.realpath(REPO), "build") + os.sep), path)
    test.assertTrue(path.endswith(os.path.join("torch", "utils", "_contextlib.py")), path)
    names = defined_names(path)
    test.assertIn("_DecoratorContextManager", names, path)
    for name in ADDED:
        test.assertNotIn(name, names, path)


def run_example(name, stock=False):
    env = dict(os.environ)
    env.pop("TORCH_GRADMODE_OVERLAY", None)
    if stock:
        env["TORCH_GRADMODE_OVERLAY"] = "0"
    proc = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, name), "--json"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
    )
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise AssertionError(f"{name} printed nothing (rc {proc.returncode}):\n{proc.stderr}")
    return proc.returncode, json.loads(lines[-1]), proc


class TestRLPolicy(TestCase):
    def test_patched(self):
        rc, r, proc = run_example("rl_policy.py")
        self.assertEqual(rc, 0, proc.stdout + proc.stderr)
        self.assertTrue(r["ok"])
        assert_built(self, r["contextlib"])
        # The policy's actions are computed without grad ...
        self.assertEqual(r["policy_body_grad_enabled"], [False])
        self.assertEqual(r["policy_logits_require_grad"], [False])
        self.assertEqual(r["policy_actions_require_grad"], [False])
        self.assertEqual(r["policy_warmup_logits_require_grad"], [True])
        # ... while the learner, between policy steps, trains with autograd.
        self.assertEqual(r["learner_grad_enabled"], [True])
        self.assertEqual(r["learner_inference_mode"], [False])
        self.assertEqual(r["learner_steps_failed"], 0)
        self.assertEqual(r["learner_steps_ok"], 400)
        self.assertEqual(r["inference_observations"], 0)
        self.assertGreaterEqual(r["greedy_accuracy_after"], 0.8)
        self.assertGreater(r["greedy_accuracy_after"], r["greedy_accuracy_before"])
        self.assertTrue(r["caller_grad_enabled_after"])

    def test_stock_loses_the_warmup_block_after_its_first_step(self):
        rc, r, proc = run_example("rl_policy.py", stock=True)
        self.assertEqual(rc, 1, proc.stdout + proc.stderr)
        self.assertFalse(r["ok"])
        assert_stock(self, r["contextlib"])
        self.assertEqual(r["policy_warmup_logits_require_grad"], [False, True])
        self.assertEqual(r["learner_inference_mode"], [False])
        self.assertEqual(r["learner_steps_failed"], 0)


class TestDataLoaderGenerator(TestCase):
    def test_patched(self):
        rc, r, proc = run_example("dataloader_generator.py")
        self.assertEqual(rc, 0, proc.stdout + proc.stderr)
        self.assertTrue(r["ok"])
        # Two spawned workers, both loading the module the main process loads, from the overlay tree.
        self.assertEqual(len(r["worker_pids"]), 2)
        self.assertNotIn(r["main_pid"], r["worker_pids"])
        assert_built(self, r["main_contextlib"])
        self.assertEqual(r["worker_contextlib"], [r["main_contextlib"]])
        # The body starts in the decorator's mode; its own enable_grad block
        # keeps grad on across every yield; after the block, the decorator's mode.
        self.assertEqual(r["grad_at_start"], [False])
        self.assertEqual(r["grad_in_enable_grad_block"], [True] * 8)
        self.assertEqual(r["derivatives"], [3.0 * x * x for x in range(8)])
        self.assertEqual(r["grad_after_block"], [False])
        self.assertTrue(r["caller_grad_enabled_after"])

    def test_stock_loses_the_body_block_after_the_first_resume(self):
        rc, r, proc = run_example("dataloader_generator.py", stock=True)
        self.assertEqual(rc, 1, proc.stdout + proc.stderr)
        self.assertFalse(r["ok"])
        self.assertEqual(r["worker_contextlib"], [r["main_contextlib"]])
        assert_stock(self, r["main_contextlib"])
        self.assertEqual(r["grad_in_enable_grad_block"], [True, False, False, False] * 2)
        self.assertEqual(r["derivatives"], [0.0, None, None, None, 48.0, None, None, None])


if __name__ == "__main__":
    run_tests()
