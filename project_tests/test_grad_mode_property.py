# Owner(s): ["module: autograd"]
"""The differential property tests: random programs (``grad_mode_programs.py``),
each decorated body run against an oracle that runs the same body undecorated
with only the state its decorator carries swapped around each step (for
``inference_mode``: on a thread of its own).

* ``TestGradModeGeneratorProperty`` -- generators;
* ``TestGradModeAsyncProperty`` -- coroutines and async generators, the decorated
  body on an event loop among noise tasks, the oracle on an event loop without.

Autocast is checked to the contract: it carries its own device type's state
only, and a caller's change to another device type's reaches the body.

The hand-written tests of the same contract are in ``test_grad_mode_matrix.py``.
"""

import collections
import os
import random
import sys
from unittest import mock

from torch.testing._internal.common_utils import run_tests, TestCase

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from grad_mode_programs import (  # noqa: E402
    explain,
    generate_program,
    observed_state,
    run_oracle_async,
    run_oracle_generator,
    run_subject_async,
    run_subject_generator,
)

PROPERTY_PROGRAMS = int(os.environ.get("GRAD_MODE_PROPERTY_PROGRAMS", "2000"))
PROPERTY_SEED = int(os.environ.get("GRAD_MODE_PROPERTY_SEED", "20261129"))
ASYNC_PROPERTY_PROGRAMS = int(os.environ.get("GRAD_MODE_ASYNC_PROPERTY_PROGRAMS", "500"))
ASYNC_PROPERTY_SEED = int(os.environ.get("GRAD_MODE_ASYNC_PROPERTY_SEED", "20261130"))
# Stop after this many mismatching programs (0: run them all and count).
MAX_MISMATCHES = int(os.environ.get("GRAD_MODE_PROPERTY_MAX_MISMATCHES", "3"))


class _PropertyTestCase(TestCase):
    """Every program runs on threads of its own: this thread's state must not change."""

    def setUp(self):
        super().setUp()
        self._state = observed_state()

    def tearDown(self):
        super().tearDown()
        self.assertEqual(observed_state(), self._state, "a program changed the test's thread state")

    def check(self, kind, programs, seed, run_oracle, run_subject):
        rng = random.Random(seed if kind == "generator" else f"{seed}-{kind}")
        mismatches, tally = [], collections.Counter()
        for index in range(programs):
            program = generate_program(rng, kind=kind)
            oracle = run_oracle(program)
            subject, violations = run_subject(program, index)
            if oracle == subject and not violations:
                continue
            tally[program.decorator_name] += 1
            if len(mismatches) < 3:
                mismatches.append((index, program, oracle, subject, violations))
            if MAX_MISMATCHES and sum(tally.values()) >= MAX_MISMATCHES:
                break
        if mismatches:
            index, program, oracle, subject, violations = mismatches[0]
            self.fail(
                f"{sum(tally.values())} mismatching {kind} program(s) (seed {seed}; by decorator: {dict(tally)}); "
                f"first, #{index}:\n"
                f"{program.describe()}\n{explain(oracle, subject)}\noracle:  {oracle}\nsubject: {subject}\n"
                f"noise task violations: {violations[:5]}"
            )


class TestGradModeGeneratorProperty(_PropertyTestCase):
    """Random generator bodies and drivers, decorated vs undecorated with the carried state swapped."""

    def test_matches_oracle(self):
        self.check(
            "generator",
            PROPERTY_PROGRAMS,
            PROPERTY_SEED,
            run_oracle_generator,
            lambda program, index: (run_subject_generator(program), []),
        )


class TestGradModeAsyncProperty(_PropertyTestCase):
    """Random async bodies and drivers: decorated among noise tasks vs undecorated with the carried state swapped."""

    def check_matches_oracle(self, kind):
        original_hook = sys.unraisablehook

        def hook(unraisable):
            # An undecorated body that ignored GeneratorExit complains again
            # when the oracle drops it; nothing to see.
            if not (
                isinstance(unraisable.exc_value, RuntimeError)
                and "ignored GeneratorExit" in str(unraisable.exc_value)
            ):
                original_hook(unraisable)

        with mock.patch.object(sys, "unraisablehook", hook):
            self.check(
                kind,
                ASYNC_PROPERTY_PROGRAMS,
                ASYNC_PROPERTY_SEED,
                run_oracle_async,
                lambda program, index: run_subject_async(program, seed=index),
            )

    def test_coroutines_match_oracle(self):
        self.check_matches_oracle("coroutine")

    def test_async_generators_match_oracle(self):
        self.check_matches_oracle("async_generator")


if __name__ == "__main__":
    run_tests()
