# Owner(s): ["module: autograd"]
"""Run the examples in ``examples/`` and check their reports.

Each example runs in a subprocess, with this patch and on stock torch 2.13.0
(``TORCH_GRADMODE_OVERLAY=0``), and prints its ``main()`` report as JSON on its
last line (``--json``).  With the patch each exits 0 and its report meets the
contract; on stock torch each exits 1, for the reasons checked below.
"""

import json
import os
import subprocess
import sys

from torch.testing._internal.common_utils import run_tests, TestCase


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(REPO, "examples")
CHECKOUT_CONTEXTLIB = os.path.realpath(os.path.join(REPO, "torch", "utils", "_contextlib.py"))


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
        self.assertEqual(r["contextlib"], CHECKOUT_CONTEXTLIB)
        # The policy's actions are computed without grad ...
        self.assertEqual(r["policy_body_grad_enabled"], [False])
        self.assertEqual(r["policy_logits_require_grad"], [False])
        self.assertEqual(r["policy_actions_require_grad"], [False])
        # ... while the learner, between policy steps, trains with autograd.
        self.assertEqual(r["learner_grad_enabled"], [True])
        self.assertEqual(r["learner_inference_mode"], [False])
        self.assertEqual(r["learner_steps_failed"], 0)
        self.assertEqual(r["learner_steps_ok"], 400)
        self.assertEqual(r["inference_observations"], 0)
        self.assertGreaterEqual(r["greedy_accuracy_after"], 0.8)
        self.assertGreater(r["greedy_accuracy_after"], r["greedy_accuracy_before"])
        self.assertTrue(r["caller_grad_enabled_after"])

    def test_stock_leaks_warmup_inference_mode_to_the_learner(self):
        rc, r, proc = run_example("rl_policy.py", stock=True)
        self.assertEqual(rc, 1, proc.stdout + proc.stderr)
        self.assertFalse(r["ok"])
        self.assertNotEqual(r["contextlib"], CHECKOUT_CONTEXTLIB)
        self.assertEqual(r["learner_inference_mode"], [False, True])
        self.assertEqual(r["learner_steps_failed"], 40)
        self.assertEqual(r["inference_observations"], 40)


class TestDataLoaderGenerator(TestCase):
    def test_patched(self):
        rc, r, proc = run_example("dataloader_generator.py")
        self.assertEqual(rc, 0, proc.stdout + proc.stderr)
        self.assertTrue(r["ok"])
        # Two spawned workers, both loading the checkout's module.
        self.assertEqual(len(r["worker_pids"]), 2)
        self.assertNotIn(r["main_pid"], r["worker_pids"])
        self.assertEqual(r["worker_contextlib"], [CHECKOUT_CONTEXTLIB])
        self.assertEqual(r["main_contextlib"], CHECKOUT_CONTEXTLIB)
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
        self.assertNotEqual(r["worker_contextlib"], [CHECKOUT_CONTEXTLIB])
        self.assertEqual(r["grad_in_enable_grad_block"], [True, False, False, False] * 2)
        self.assertEqual(r["derivatives"], [0.0, None, None, None, 48.0, None, None, None])


if __name__ == "__main__":
    run_tests()
