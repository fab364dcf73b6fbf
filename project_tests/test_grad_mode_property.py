# Owner(s): ["module: autograd"]
"""The differential property tests: random programs (``grad_mode_programs.py``),
each decorated body run on this thread against an oracle that runs the same
body undecorated, uninterrupted, on a thread of its own.

* ``TestGradModeGeneratorProperty`` -- generators;
* ``TestGradModeAsyncProperty`` -- coroutines and async generators, the decorated
  body on this thread's event loop among noise tasks, the oracle on a thread and
  event loop of its own.

The hand-written tests of the same contract are in ``test_grad_mode_matrix.py``.
"""

import asyncio
import gc
import os
import random
import sys
from unittest import mock

import torch
from torch.testing._internal.common_utils import run_tests, TestCase

# grad_mode_programs puts this directory on the path.
from grad_mode_programs import (
    Boom,
    CALLER_LIST,
    context_of,
    DECORATOR_LIST,
    enter_all,
    generate_program,
    autograd_state,
    on_own_thread,
    run_oracle_generator,
    run_subject_generator,
)
import test_grad_mode_matrix as suspend_tests  # the module: pytest would run its classes here too

PROPERTY_PROGRAMS = int(os.environ.get("GRAD_MODE_PROPERTY_PROGRAMS", "2000"))
PROPERTY_SEED = int(os.environ.get("GRAD_MODE_PROPERTY_SEED", "20261129"))
ASYNC_PROPERTY_PROGRAMS = int(os.environ.get("GRAD_MODE_ASYNC_PROPERTY_PROGRAMS", "500"))
ASYNC_PROPERTY_SEED = int(os.environ.get("GRAD_MODE_ASYNC_PROPERTY_SEED", "20261130"))


class TestGradModeGeneratorProperty(TestCase):
    """Random bodies and drivers, decorated on this thread vs undecorated on a thread of their own."""

    def test_matches_oracle(self):
        rng = random.Random(PROPERTY_SEED)
        mismatches = []
        for index in range(PROPERTY_PROGRAMS):
            program = generate_program(rng)
            oracle = run_oracle_generator(program)
            subject = run_subject_generator(program)
            if oracle != subject:
                mismatches.append((index, program, oracle, subject))
                if len(mismatches) >= 3:
                    break
        if mismatches:
            index, program, oracle, subject = mismatches[0]
            self.fail(
                f"{len(mismatches)} mismatching program(s) (seed {PROPERTY_SEED}); first, #{index}:\n"
                f"{program.describe()}\noracle:  {oracle}\nsubject: {subject}"
            )


# ---------------------------------------------------------------------------
# Coroutines and async generators
# ---------------------------------------------------------------------------


def _make_suspend():
    """``suspend()`` for random bodies: alternately a bare yield to the loop and a future to wait on."""
    count = 0

    async def suspend():
        nonlocal count
        count += 1
        if count % 3:
            await asyncio.sleep(0)
        else:
            future = asyncio.get_running_loop().create_future()
            asyncio.get_running_loop().call_soon(future.set_result, None)
            await future

    return suspend


async def _arequest(agen, req, n):
    """Make one request of an async generator; return its outcome (as ``_request`` does for generators)."""
    try:
        if req == "next":
            return ("yield", await agen.asend(None))
        if req == "send":
            return ("yield", await agen.asend(f"v{n}"))
        if req == "throw":
            return ("yield", await agen.athrow(Boom(f"t{n}")))
        await agen.aclose()
        return ("closed",)
    except StopAsyncIteration:
        return ("stop",)
    except BaseException as exc:  # noqa: B902 -- every outcome is recorded
        return ("raise", type(exc).__name__, str(exc))


async def _acall(coroutine):
    try:
        return ("return", await coroutine)
    except BaseException as exc:  # noqa: B902 -- every outcome is recorded
        return ("raise", type(exc).__name__, str(exc))


def _quiet(loop):
    # Bodies that ignore GeneratorExit make the loop's finalisation report
    # errors; the records are compared instead.
    loop.set_exception_handler(lambda loop, context: None)


def run_oracle_async(program):
    """Record the undecorated body, run uninterrupted on a thread and event loop of its own."""

    async def main():
        _quiet(asyncio.get_running_loop())
        log = []
        body = program.body()(lambda tag: log.append((tag, autograd_state())), _make_suspend())
        outcomes = []
        first_setup = CALLER_LIST[program.first_entry_setup()][1]
        with enter_all(first_setup), context_of(DECORATOR_LIST[program.decorator][1]):
            if program.kind == "coroutine":
                outcomes.append(await _acall(body))
            else:
                for n, (req, _) in enumerate(program.driver):
                    outcomes.append(await _arequest(body, req, n))
        # Snapshot before the loop finalises a body left suspended.
        return list(log), outcomes

    def run():
        record = asyncio.run(main())
        # Finalise what is left here, on this thread: left to the cyclic
        # collector, an undecorated body suspended in a mode block would run
        # its ``with`` exit on whatever thread the collector next interrupts
        # (the leak the decorators prevent) and upset a later program.
        gc.collect(1)
        return record

    return on_own_thread(run)


def run_subject_async(program, seed):
    """Record the decorated body, run on this thread's event loop among noise tasks.

    Each request is made from inside its caller mode, and a leak is recorded
    whenever the caller's mode after the request differs from before it.
    Returns the record and the noise tasks' violations.
    """

    async def main():
        _quiet(asyncio.get_running_loop())
        noise = suspend_tests.NoiseTasks(3, seed)
        await asyncio.sleep(0)
        log = []
        decorated = DECORATOR_LIST[program.decorator][1]()(program.body())
        body = decorated(lambda tag: log.append((tag, autograd_state())), _make_suspend())
        outcomes = []
        if program.kind == "coroutine":
            requests = [("await", program.first_entry_setup())]
        else:
            requests = program.driver
        for n, (req, setup) in enumerate(requests):
            with enter_all(CALLER_LIST[setup][1]):
                before = autograd_state()
                if req == "await":
                    outcomes.append(await _acall(body))
                else:
                    outcomes.append(await _arequest(body, req, n))
                after = autograd_state()
            if after != before:
                outcomes.append(("caller mode leaked", before, after))
        record = list(log), outcomes
        await noise.stop()
        return record, noise.violations

    before = suspend_tests.mode_state()
    (log, outcomes), violations = asyncio.run(main())
    # A body that ignored GeneratorExit is closed once more by Python itself
    # when finalised, outside the decorator: do that on a thread of its own.
    on_own_thread(lambda: gc.collect(1))
    after = suspend_tests.mode_state()
    if after != before:
        outcomes.append(("thread mode changed by the event loop", before, after))
        if after[1]:
            suspend_tests._RESCUE_GUARDS.append(torch._C._InferenceMode(False))
        torch._C._set_grad_enabled(before[0])
    return (log, outcomes), violations


class TestGradModeAsyncProperty(suspend_tests.GradModeTestCase):
    """Random bodies and drivers: decorated among noise tasks vs undecorated on a thread of their own."""

    def check_matches_oracle(self, kind):
        rng = random.Random(f"{ASYNC_PROPERTY_SEED}-{kind}")
        mismatches = []
        original_hook = sys.unraisablehook

        def hook(unraisable):
            # An undecorated body that ignored GeneratorExit complains again
            # when the oracle drops it; nothing to see.
            if not (isinstance(unraisable.exc_value, RuntimeError)
                    and "ignored GeneratorExit" in str(unraisable.exc_value)):
                original_hook(unraisable)

        with mock.patch.object(sys, "unraisablehook", hook):
            for index in range(ASYNC_PROPERTY_PROGRAMS):
                program = generate_program(rng, kind=kind)
                oracle = run_oracle_async(program)
                subject, violations = run_subject_async(program, seed=index)
                if oracle != subject or violations:
                    mismatches.append((index, program, oracle, subject, violations))
                    if len(mismatches) >= 3:
                        break
        if mismatches:
            index, program, oracle, subject, violations = mismatches[0]
            self.fail(
                f"{len(mismatches)} mismatching {kind} program(s) (seed {ASYNC_PROPERTY_SEED}); first, #{index}:\n"
                f"{program.describe()}\noracle:  {oracle}\nsubject: {subject}\n"
                f"noise task violations: {violations[:5]}"
            )

    def test_coroutines_match_oracle(self):
        self.check_matches_oracle("coroutine")

    def test_async_generators_match_oracle(self):
        self.check_matches_oracle("async_generator")


if __name__ == "__main__":
    run_tests()
