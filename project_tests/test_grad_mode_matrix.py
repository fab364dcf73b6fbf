# Owner(s): ["module: autograd"]
"""Grad-mode decorators on functions that suspend.

A grad mode used as a decorator on a generator, an ``async def`` coroutine or
an async generator carries exactly the state its own ``with`` block sets
(issue #24): grad mode for ``no_grad``, ``enable_grad`` and
``set_grad_enabled``; its one flag for ``set_multithreading_enabled``,
``enforce_grad_layout_policy`` and ``_force_original_view_tracking``; the
whole autograd state and the inference key bits for ``inference_mode``.  The
body starts from its caller's state with the decorator entered at its first
step, keeps its own changes to that state across its suspensions, and the
caller gets its own back after every step; every other kind of state the body
sees and changes exactly as the undecorated body would (see
docs/project/notes/grad_mode_suspend.md).  Every other decorating context
carries nothing: it is entered afresh around each step, as on stock torch.

So a test of state compares the whole autograd state (``autograd_state``, the
state matrix's probe) that body and caller see with what they see running the
*reference*: the undecorated body, with only the part of the state the
decorator carries swapped around each step (``reference``).

The exhaustive project-only matrix; the test classes:

* generators: ``TestGradModeGenerators`` (the basic cases, for every decorator),
  ``TestGradModeBodyContinuity`` (the body keeps what it carries across
  ``yield``), ``TestGradModeCallerIsolation`` (the caller gets what the body
  carries back after every step, and sees the rest as undecorated),
  ``TestGradModeGeneratorProtocol`` (everything else is unchanged);
* coroutines and async generators: ``TestGradModeAsyncCoroutines``,
  ``TestGradModeAsyncGenerators``, ``TestGradModeAsyncTaskIsolation`` (the other
  tasks of the event loop keep what they carry), ``TestGradModeAsyncCancellation``,
  ``TestGradModeAsyncProtocol``;
* reliability: ``TestGradModeFaults`` (critical exceptions, ``GeneratorExit``
  ignored, PEP 479, re-entrant stepping, context managers that raise),
  ``TestGradModeThreads``, ``TestGradModeGarbageCollection``,
  ``TestGradModeBadInput``, ``TestGradModeDriverDetails``,
  ``TestGradModeOtherContextManagers`` (the other switches of
  ``torch.autograd.grad_mode``);
* scope: ``TestGradModeScopeMatrix`` (contexts that carry nothing, on every
  kind of function that suspends).
"""

import asyncio
import concurrent.futures
import contextlib
import functools
import gc
import inspect
import itertools
import os
import random
import sys
import threading
import traceback
import tracemalloc
import types
import unittest
import warnings
from collections.abc import Callable
from typing import NamedTuple
from unittest import mock

import torch
import torch.autograd.forward_ad as fwAD
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    skipIfTorchDynamo,
    TEST_NUMPY,
    TestCase,
)
from torch.utils._contextlib import _DecoratorContextManager, context_decorator


# The whole-state probe is the state matrix's.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_grad_mode_state_matrix import autograd_state  # noqa: E402


# Under PYTORCH_TEST_WITH_DYNAMO=1 Dynamo traces the test bodies themselves,
# which switch and inspect the thread's autograd state around suspended
# bodies the decorators step eagerly: the checks would test Dynamo's
# modelling of those calls, not the decorators.
_DYNAMO_SKIP = "checks thread state around eagerly stepped suspended bodies"


class Boom(Exception):
    """The exception bodies raise, catch, and have thrown at them."""


class CMError(Exception):
    """The exception a faulty context manager raises."""


def mode_state():
    """Grad mode and inference mode: what the hand-written checks spell out."""
    return (torch.is_grad_enabled(), torch.is_inference_mode_enabled())


PLAIN = (True, False)  # a fresh thread's
NO_GRAD = (False, False)
INFERENCE = (False, True)
INFERENCE_GRAD = (True, True)


# Every grad-mode decorator in every spelling; a factory returns what goes
# after the ``@``.  A single-flag mode's factory switches its flag when called
# (the function form); decorating with what it returns switches it back.
DECORATORS = {
    "no_grad": lambda: torch.no_grad(),
    "no_grad_bare": lambda: torch.no_grad,
    "enable_grad": lambda: torch.enable_grad(),
    "enable_grad_bare": lambda: torch.enable_grad,
    "set_grad_enabled_False": lambda: torch.set_grad_enabled(False),
    "set_grad_enabled_True": lambda: torch.set_grad_enabled(True),
    "inference_mode": lambda: torch.inference_mode(),
    "inference_mode_bare": lambda: torch.inference_mode,
    "inference_mode_False": lambda: torch.inference_mode(False),
    "set_multithreading_enabled_False": lambda: (
        torch.autograd.set_multithreading_enabled(False)
    ),
    "set_multithreading_enabled_True": lambda: (
        torch.autograd.set_multithreading_enabled(True)
    ),
    "enforce_grad_layout_policy_False": lambda: (
        torch.autograd.grad_mode.enforce_grad_layout_policy(False)
    ),
    "enforce_grad_layout_policy_True": lambda: (
        torch.autograd.grad_mode.enforce_grad_layout_policy(True)
    ),
    "force_original_view_tracking_True": lambda: (
        torch.autograd.grad_mode._force_original_view_tracking(True)
    ),
    "force_original_view_tracking_False": lambda: (
        torch.autograd.grad_mode._force_original_view_tracking(False)
    ),
}


class Carry(NamedTuple):
    """The part of the thread state a decorated body carries: ``capture()``
    reads it, ``install(value)`` sets it, and *fields* are its positions in
    ``autograd_state()``."""

    name: str
    capture: Callable
    install: Callable
    fields: tuple


# The positions of autograd_state()'s entries (see the state matrix).
_FIELDS = (
    "grad",
    "inference",
    "fwd_grad",
    "multithreading",
    "view_replay",
    "grad_layout",
    "graph_exec_group",
    "include_keys",
    "exclude_keys",
)


def _flag(name, capture, install):
    return Carry(name, capture, install, (_FIELDS.index(name),))


GRAD = _flag("grad", torch._C.is_grad_enabled, torch._C._set_grad_enabled)
MULTITHREADING = _flag(
    "multithreading",
    torch._C._is_multithreading_enabled,
    torch._C._set_multithreading_enabled,
)
GRAD_LAYOUT = _flag(
    "grad_layout",
    torch._C._is_grad_layout_enforcement_enabled,
    torch._C._set_grad_layout_enforcement_enabled,
)
VIEW_REPLAY = _flag(
    "view_replay", torch._C._is_view_replay_enabled, torch._C._set_view_replay_enabled
)
# inference_mode's: the whole AutogradState and the inference key bits, which
# only the binding installs (looked up when used: stock torch lacks it, and
# this module must import there too).
WHOLE = Carry(
    "autograd_state",
    lambda: torch._C._get_autograd_mode_state(),
    lambda state: torch._C._swap_autograd_mode_state(state),
    tuple(range(len(_FIELDS))),
)

# What each decorator carries: what its own ``with`` block sets.
CARRIES = {
    name: (
        GRAD
        if name.startswith(("no_grad", "enable_grad", "set_grad_enabled"))
        else WHOLE
        if name.startswith("inference_mode")
        else MULTITHREADING
        if name.startswith("set_multithreading_enabled")
        else GRAD_LAYOUT
        if name.startswith("enforce_grad_layout_policy")
        else VIEW_REPLAY
    )
    for name in DECORATORS
}


def as_carried(carry, state, own):
    """*state* (an ``autograd_state()``) with the part *carry* covers taken from
    *own*."""
    return tuple(
        mine if i in carry.fields else theirs
        for i, (theirs, mine) in enumerate(zip(state, own))
    )


# Mode blocks a body opens, including autograd state that the decorators
# carry without setting it.
BLOCKS = {
    "no_grad": torch.no_grad,
    "enable_grad": torch.enable_grad,
    "set_grad_enabled_True": lambda: torch.set_grad_enabled(True),
    "set_grad_enabled_False": lambda: torch.set_grad_enabled(False),
    "inference_mode": torch.inference_mode,
    "inference_mode_False": lambda: torch.inference_mode(False),
    "multithreading_off": lambda: torch.autograd.set_multithreading_enabled(False),
    "view_replay_on": lambda: torch.autograd.grad_mode._force_original_view_tracking(
        True
    ),
    "layout_relaxed": lambda: torch.autograd.grad_mode.enforce_grad_layout_policy(
        False
    ),
    "fwd_grad_off": lambda: torch.autograd.forward_ad._set_fwd_grad_enabled(False),
}

# The blocks whose state a decorator of each carry carries whole.
CARRIED_BLOCKS = {
    GRAD: ["no_grad", "enable_grad", "set_grad_enabled_True", "set_grad_enabled_False"],
    MULTITHREADING: ["multithreading_off"],
    VIEW_REPLAY: ["view_replay_on"],
    GRAD_LAYOUT: ["layout_relaxed"],
    WHOLE: list(BLOCKS),
}

# Modes a caller may be in: the context managers to enter, in order.
CALLER_SETUPS = {
    "plain": [],
    "no_grad": [torch.no_grad],
    "inference_mode": [torch.inference_mode],
    "inference_mode_enable_grad": [torch.inference_mode, torch.enable_grad],
    "no_grad_inference_mode_False": [
        torch.no_grad,
        lambda: torch.inference_mode(False),
    ],
    "multithreading_off": [lambda: torch.autograd.set_multithreading_enabled(False)],
    "view_replay_no_grad": [
        lambda: torch.autograd.grad_mode._force_original_view_tracking(True),
        torch.no_grad,
    ],
    "fwd_grad_off": [lambda: torch.autograd.forward_ad._set_fwd_grad_enabled(False)],
    "layout_relaxed_inference_mode": [
        lambda: torch.autograd.grad_mode.enforce_grad_layout_policy(False),
        torch.inference_mode,
    ],
}

# The first four caller setups, with their modes spelt out.
CALLER_MODES = {
    "plain": PLAIN,
    "no_grad": NO_GRAD,
    "inference_mode": INFERENCE,
    "inference_mode_enable_grad": INFERENCE_GRAD,
}


def context_of(make):
    """The context manager a decorator factory stands for (a bare spelling gives
    a class)."""
    ctx = make()
    return ctx() if isinstance(ctx, type) else ctx


@contextlib.contextmanager
def enter_all(factories):
    with contextlib.ExitStack() as stack:
        for factory in factories:
            stack.enter_context(factory())
        yield


def on_own_thread(fn, *args):
    """``fn(*args)`` on a new thread, which starts in the default autograd state."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(fn, *args).result()


def state_inside(make, *blocks, caller=(), probe=mode_state):
    """What *probe* shows inside decorator *make* (and *blocks*) when its caller
    is in *caller*, from a fresh thread's state: what a body decorated with a
    grad mode sees at its first step."""

    def run():
        with enter_all(caller), context_of(make), enter_all(blocks):
            return probe()

    return on_own_thread(run)


# ---------------------------------------------------------------------------
# The reference: the undecorated body, with only the carried part swapped
# ---------------------------------------------------------------------------


class _Carried:
    """The contract for one body of a decorator that carries *carry*: the
    caller's carried state is put aside and the body's installed around each
    step; the body's starts as the caller's with the decorator entered."""

    def __init__(self, make, carry):
        self.make, self.carry = make, carry
        self.started, self.state, self.caller = False, None, []

    def __enter__(self):
        self.caller.append(self.carry.capture())
        if not self.started:
            self.started = True
            with context_of(self.make):
                self.state = self.carry.capture()
        self.carry.install(self.state)

    def __exit__(self, *exc_info):
        self.state = self.carry.capture()
        self.carry.install(self.caller.pop())


def _steps(carried, start):
    """Step ``start()`` (a generator, coroutine or awaitable, made at the first
    step, as the decorators make the body) inside *carried*, relaying sends,
    throws and closes to it."""
    it = start()
    method, arg = it.send, None
    while True:
        try:
            with carried:
                value = method(arg)
        except StopIteration as stop:
            return stop.value
        try:
            arg = yield value
        except BaseException as exc:  # GeneratorExit too: thrown in, in its state
            method, arg = it.throw, exc
        else:
            method = it.send


# _steps as a generator-based coroutine, to await (a copy: types.coroutine
# would flag _steps itself).
_stepped = types.FunctionType(
    _steps.__code__.replace(
        co_flags=_steps.__code__.co_flags | inspect.CO_ITERABLE_COROUTINE
    ),
    _steps.__globals__,
    "_stepped",
)


def reference(decorator, func):
    """The function that ``DECORATORS[decorator]()(func)`` must behave as: *func*
    undecorated, each step of its body with only the state the decorator
    carries swapped in, as the contract says, for a generator, a coroutine or
    an async generator function."""
    make, carry = DECORATORS[decorator], CARRIES[decorator]
    if inspect.isasyncgenfunction(func):

        @functools.wraps(func)
        async def async_generator(*args, **kwargs):
            carried, body = _Carried(make, carry), func(*args, **kwargs)
            method, arg = body.asend, None
            while True:
                try:
                    value = await _stepped(carried, functools.partial(method, arg))
                except StopAsyncIteration:
                    return
                try:
                    arg = yield value
                except BaseException as exc:
                    method, arg = body.athrow, exc
                else:
                    method = body.asend

        return async_generator
    if inspect.iscoroutinefunction(func):
        # A coroutine, not _stepped's generator: asyncio's tasks take only
        # coroutines from Python 3.12 on.
        @functools.wraps(func)
        async def coroutine(*args, **kwargs):
            body = functools.partial(func, *args, **kwargs)
            return await _stepped(_Carried(make, carry), body)

        return coroutine

    # Not ``yield from`` _steps: a body that ignores a close would be closed
    # again when the delegating frame ends.
    @functools.wraps(func)
    def generator(*args, **kwargs):
        return _steps(_Carried(make, carry), functools.partial(func, *args, **kwargs))

    return generator


def both_ways(decorator, func, run):
    """``run(f)`` on a fresh thread for *func* decorated with *decorator*, and
    for its reference: the two must be equal."""
    decorated = on_own_thread(run, DECORATORS[decorator]()(func))
    expected = on_own_thread(run, reference(decorator, func))
    return decorated, expected


@types.coroutine
def suspend(value=None):
    """Suspend a coroutine once, handing *value* to whoever drives it."""
    return (yield value)


def drive(awaitable, sends=()):
    """Drive *awaitable* by hand (no event loop); return its result."""
    it = awaitable.__await__()
    try:
        it.send(None)
        for v in sends:
            it.send(v)
        while True:
            it.send(None)
    except StopIteration as stop:
        return stop.value


# Guards that took a leaked inference mode off this thread (see tearDown); kept
# alive because destroying one would restore the state it replaced.
_RESCUE_GUARDS = []


class GradModeTestCase(TestCase):
    def tearDown(self):
        # A leaked mode would make every later test fail for the wrong reason:
        # put the thread back in the plain state, then report the leak.
        leaked = mode_state()
        if leaked[1]:
            _RESCUE_GUARDS.append(torch._C._InferenceMode(False))
        torch._C._set_grad_enabled(True)
        super().tearDown()
        self.assertEqual(leaked, PLAIN, "the test left the thread in another grad mode")

    def assertKeepsMetadata(self, wrapped, func):
        """*wrapped* carries *func*'s name, docstring, module and signature."""
        self.assertIs(wrapped.__wrapped__, func)
        self.assertEqual(wrapped.__name__, func.__name__)
        self.assertEqual(wrapped.__qualname__, func.__qualname__)
        self.assertEqual(wrapped.__doc__, "Doc.")
        self.assertEqual(wrapped.__module__, func.__module__)
        self.assertEqual(inspect.signature(wrapped), inspect.signature(func))


# ---------------------------------------------------------------------------
# Generators
# ---------------------------------------------------------------------------


@skipIfTorchDynamo(_DYNAMO_SKIP)
class TestGradModeGenerators(GradModeTestCase):
    """The cases of PR #49017, for every grad-mode decorator: the body sees
    its caller's state with what the decorator carries as the decorator sets
    it, and the caller gets its own back."""

    def own_view(self, decorator, caller_state):
        """What a body that changes nothing itself, started from a plain caller,
        sees when stepped from a caller in *caller_state*."""
        own = state_inside(DECORATORS[decorator], probe=autograd_state)
        return as_carried(CARRIES[decorator], caller_state, own)

    @parametrize("decorator", list(DECORATORS))
    def test_generator_functions(self, decorator):
        def gen(n):
            for i in range(n):
                yield i, autograd_state()

        def run(func):
            out = []
            for caller_grad in (True, False):
                with torch.set_grad_enabled(caller_grad):
                    caller = autograd_state()
                    for i, (value, seen) in enumerate(func(3)):
                        out.append((value, seen, caller))
                        self.assertEqual(value, i)
                        self.assertEqual(autograd_state(), caller)
            return out

        decorated, expected = both_ways(decorator, gen, run)
        self.assertEqual(decorated, expected)
        for _, seen, caller in decorated:
            self.assertEqual(seen, self.own_view(decorator, caller))

    @parametrize("decorator", list(DECORATORS))
    def test_generator_based_coroutines_with_send(self, decorator):
        def coro():
            total = 0
            while True:
                x = yield total, autograd_state()
                if x is None:
                    return total
                total += x

        def run(func):
            c = func()
            steps = [(next(c), autograd_state())]
            for x in (1, 2, 3):
                with torch.set_grad_enabled(x % 2 == 0):
                    before = autograd_state()
                    steps.append((c.send(x), before))
                    self.assertEqual(autograd_state(), before)
            with self.assertRaises(StopIteration) as cm:
                c.send(None)
            self.assertEqual(cm.exception.value, 6)
            return steps

        decorated, expected = both_ways(decorator, coro, run)
        self.assertEqual(decorated, expected)
        for (_, seen), caller in decorated:
            self.assertEqual(seen, self.own_view(decorator, caller))

    @parametrize("decorator", list(DECORATORS))
    def test_benign_exceptions(self, decorator):
        make = DECORATORS[decorator]
        expected = state_inside(make)

        @make()
        def gen():
            seen = []
            while True:
                try:
                    yield seen
                except Boom:
                    seen.append(mode_state())

        g = gen()
        seen = next(g)
        for _ in range(3):
            self.assertIs(g.throw(Boom()), seen)
            self.assertEqual(torch.is_grad_enabled(), True)
        self.assertEqual(seen, [expected] * 3)

    @parametrize("decorator", list(DECORATORS))
    @parametrize(
        "exc_type", [KeyboardInterrupt, SystemExit], name_fn=lambda exc: exc.__name__
    )
    def test_critical_exceptions(self, decorator, exc_type):
        make = DECORATORS[decorator]
        expected = state_inside(make)
        seen = []

        @make()
        def gen():
            try:
                yield 1
            except exc_type:
                seen.append(mode_state())
                raise

        g = gen()
        next(g)
        with self.assertRaises(exc_type):
            g.throw(exc_type())
        self.assertEqual(seen, [expected])
        self.assertEqual(mode_state(), PLAIN)

    @parametrize("decorator", list(DECORATORS))
    def test_exit_and_close(self, decorator):
        # Closed from a no_grad caller: the body's clean-up sees that caller's
        # state with what the decorator carries as the body's own (a
        # set_multithreading_enabled body sees the caller's no_grad).
        def gen(seen):
            try:
                yield 1
            except GeneratorExit:
                seen.append(("exit", autograd_state()))
                raise
            finally:
                seen.append(("finally", autograd_state()))

        def run(func):
            seen = []
            g = func(seen)
            next(g)
            with torch.no_grad():
                caller = autograd_state()
                g.close()
                self.assertEqual(autograd_state(), caller)
            return seen, caller

        decorated, expected = both_ways(decorator, gen, run)
        self.assertEqual(decorated, expected)
        seen, caller = decorated
        own = self.own_view(decorator, caller)
        self.assertEqual(seen, [("exit", own), ("finally", own)])


@skipIfTorchDynamo(_DYNAMO_SKIP)
class TestGradModeBodyContinuity(GradModeTestCase):
    """What the body sets itself of the state its decorator carries stays in
    force for it across its own ``yield``s; the rest is the thread's, as
    undecorated."""

    def test_issue_example(self):
        @torch.no_grad()
        def gen():
            with torch.enable_grad():
                yield torch.is_grad_enabled()
                yield torch.is_grad_enabled()
            yield torch.is_grad_enabled()

        self.assertEqual(list(gen()), [True, True, False])

    @parametrize("decorator", list(DECORATORS))
    @parametrize("block", list(BLOCKS))
    def test_each_decorator_around_each_block(self, decorator, block):
        # The body sees its whole block at every step; between steps its
        # caller has its own back of what the decorator carries, and the rest
        # of the block is the thread's, as undecorated: a no_grad body's
        # inference_mode or multithreading block reaches its caller.
        make, bmake, carry = DECORATORS[decorator], BLOCKS[block], CARRIES[decorator]

        def gen(seen):
            with bmake():
                for _ in range(3):
                    seen.append(autograd_state())
                    yield
            seen.append(autograd_state())
            yield

        def run(func):
            seen, between = [], []
            for _ in func(seen):
                between.append(autograd_state())
            return seen, between

        decorated, expected = both_ways(decorator, gen, run)
        self.assertEqual(decorated, expected)
        outside = state_inside(make, probe=autograd_state)
        inside = state_inside(make, bmake, probe=autograd_state)
        plain = on_own_thread(autograd_state)
        self.assertEqual(
            decorated,
            (
                [inside] * 3 + [outside],
                [as_carried(carry, inside, plain)] * 3
                + [as_carried(carry, outside, plain)],
            ),
        )

    def test_set_grad_enabled_as_a_call_persists(self):
        @torch.no_grad()
        def gen():
            torch.set_grad_enabled(True)
            yield torch.is_grad_enabled()
            yield torch.is_grad_enabled()
            torch.set_grad_enabled(False)
            yield torch.is_grad_enabled()

        with torch.no_grad():
            self.assertEqual(list(gen()), [True, True, False])
            self.assertFalse(torch.is_grad_enabled())

    def test_graph_built_across_yields(self):
        # The practical point: a body that trains inside enable_grad across
        # yields records a usable graph on every step.
        w = torch.ones(2, requires_grad=True)

        @torch.no_grad()
        def gen():
            with torch.enable_grad():
                y = w * 2
                yield
                z = (y * 3).sum()
                yield
            z.backward()
            yield z.requires_grad

        self.assertEqual(list(gen())[-1], True)
        self.assertEqual(w.grad.tolist(), [6.0, 6.0])


@skipIfTorchDynamo(_DYNAMO_SKIP)
class TestGradModeCallerIsolation(GradModeTestCase):
    """After every step the caller has its own back of what the decorator
    carries; the rest it sees as the undecorated body's caller does."""

    @parametrize("decorator", list(DECORATORS))
    def test_open_inference_block_reaches_caller_unless_carried(self, decorator):
        # inference_mode carries the whole autograd state: its body's open
        # inference block does not reach the caller, whose tensors between
        # steps are ordinary and can train.  No other decorator carries
        # inference mode: the block reaches the caller as the undecorated
        # body's does, with the caller's own part of what the decorator
        # carries back (a no_grad body leaks it with the caller's grad mode).
        def gen():
            with torch.inference_mode():
                yield torch.is_inference_mode_enabled()
                yield torch.is_inference_mode_enabled()
            yield torch.is_inference_mode_enabled()

        def run(func):
            results, between = [], []
            for value in func():
                results.append(value)
                x = torch.ones(1, requires_grad=True)
                try:
                    (x * 2).sum().backward()
                    trained = x.grad.item()
                except RuntimeError:
                    trained = None
                between.append((autograd_state(), torch.ones(1).is_inference(), trained))
            return results, between

        decorated, expected = both_ways(decorator, gen, run)
        self.assertEqual(decorated, expected)
        results, between = decorated
        after_block = state_inside(DECORATORS[decorator])[1]
        self.assertEqual(results, [True, True, after_block])
        leaks = CARRIES[decorator] is not WHOLE
        self.assertEqual([made for _, made, _ in between], [leaks, leaks, False])
        if not leaks:
            plain = on_own_thread(autograd_state)
            self.assertEqual(between, [(plain, False, 2.0)] * 3)

    @parametrize("decorator", list(DECORATORS))
    @parametrize("caller", list(CALLER_SETUPS))
    def test_open_block_dropped_while_suspended(self, caller, decorator):
        # Dropped while suspended in its own inference block, the body is
        # closed in its own state; the block reaches the caller until then
        # unless the decorator carries it (inference_mode), and its exit
        # gives the caller its whole state back either way.
        def gen(seen):
            with torch.inference_mode():
                try:
                    yield 1
                finally:
                    seen.append(autograd_state())

        def run(func):
            seen = []
            with enter_all(CALLER_SETUPS[caller]):
                before = autograd_state()
                g = func(seen)
                next(g)
                suspended = autograd_state()
                del g
                if not seen:  # not freed at once: left to the collector
                    gc.collect()
                return before, suspended, autograd_state(), seen

        decorated, expected = both_ways(decorator, gen, run)
        self.assertEqual(decorated, expected)
        before, suspended, after, seen = decorated
        self.assertEqual(after, before)
        carry = CARRIES[decorator]
        inside = state_inside(
            DECORATORS[decorator],
            torch.inference_mode,
            caller=CALLER_SETUPS[caller],
            probe=autograd_state,
        )
        self.assertEqual(seen, [inside])
        self.assertEqual(suspended, as_carried(carry, inside, before))

    @parametrize("decorator", list(DECORATORS))
    def test_caller_changes_between_steps_reach_body_as_undecorated(self, decorator):
        # What the decorator carries the body keeps as its first step set it,
        # whatever its caller does between steps; every other change of its
        # caller's reaches it as it reaches the undecorated body (a caller's
        # multithreading, view-replay or forward-AD change reaches a no_grad
        # body; a caller's no_grad reaches a set_multithreading_enabled(False)
        # body); and each caller gets its whole state back.
        def gen(seen):
            while True:
                seen.append(autograd_state())
                yield

        def run(func):
            seen, between = [], []
            g = func(seen)
            for setup in CALLER_SETUPS.values():
                with enter_all(setup):
                    before = autograd_state()
                    next(g)
                    between.append((before, autograd_state()))
            g.close()
            return seen, between

        decorated, expected = both_ways(decorator, gen, run)
        self.assertEqual(decorated, expected)
        seen, between = decorated
        self.assertEqual([after for _, after in between], [b for b, _ in between])
        carry = CARRIES[decorator]
        own = state_inside(DECORATORS[decorator], probe=autograd_state)
        self.assertEqual(seen, [as_carried(carry, b, own) for b, _ in between])
        by_caller = dict(zip(CALLER_SETUPS, seen))
        fields = {name: _FIELDS.index(name) for name in _FIELDS}
        if decorator == "no_grad":
            self.assertFalse(by_caller["multithreading_off"][fields["multithreading"]])
            self.assertTrue(by_caller["view_replay_no_grad"][fields["view_replay"]])
            self.assertFalse(by_caller["fwd_grad_off"][fields["fwd_grad"]])
            self.assertTrue(by_caller["inference_mode"][fields["inference"]])
        if decorator == "set_multithreading_enabled_False":
            self.assertFalse(by_caller["no_grad"][fields["grad"]])
            self.assertFalse(by_caller["plain"][fields["multithreading"]])

    @parametrize("caller", list(CALLER_SETUPS))
    def test_restored_when_step_raises_or_returns(self, caller):
        @torch.inference_mode()
        def gen():
            torch.set_grad_enabled(True)
            yield 1
            raise Boom

        with enter_all(CALLER_SETUPS[caller]):
            before = mode_state()
            g = gen()
            next(g)
            self.assertEqual(mode_state(), before)
            with self.assertRaises(Boom):
                next(g)
            self.assertEqual(mode_state(), before)


@skipIfTorchDynamo(_DYNAMO_SKIP)
class TestGradModeGeneratorProtocol(GradModeTestCase):
    """Everything but the mode is as for the undecorated generator."""

    @parametrize("decorator", list(DECORATORS))
    def test_kind_and_metadata(self, decorator):
        def gen(a, b=2):
            """Doc."""
            yield a + b

        wrapped = DECORATORS[decorator]()(gen)
        self.assertTrue(inspect.isgeneratorfunction(wrapped))
        self.assertKeepsMetadata(wrapped, gen)
        self.assertEqual(list(wrapped(1)), [3])

    def test_return_value(self):
        @torch.no_grad()
        def gen():
            yield 1
            return "done"  # noqa: B901

        def outer():
            return (yield from gen())

        self.assertEqual(list(outer()), [1])
        g = outer()
        next(g)
        with self.assertRaises(StopIteration) as cm:
            next(g)
        self.assertEqual(cm.exception.value, "done")

    def test_pep479(self):
        @torch.no_grad()
        def gen():
            yield 1
            raise StopIteration("inner")

        g = gen()
        next(g)
        with self.assertRaisesRegex(RuntimeError, "generator raised StopIteration"):
            next(g)

    @parametrize("carried", [False, True])
    def test_throw_uses_one_argument_form(self, carried):
        # A generator-like object whose throw() accepts only the exception:
        # the three-argument form (deprecated in Python 3.12) must never be
        # used.  Closed, a body that carries state has GeneratorExit thrown
        # in, in its state; one whose context carries nothing is closed with
        # its close() inside a fresh context, as on stock torch.
        class OneArgThrow:
            def __init__(self):
                self.thrown = []
                self.closed = []

            def __iter__(self):
                return self

            def __next__(self):
                return self.send(None)

            def send(self, value):
                return "sent"

            def throw(self, exc):
                self.thrown.append(exc)
                if isinstance(exc, GeneratorExit):
                    raise exc
                return "caught"

            def close(self):
                self.closed.append(torch.is_grad_enabled())

        inner = OneArgThrow()
        state = torch.no_grad._carried_state if carried else None
        g = torch.utils._contextlib._wrap_generator(
            torch.no_grad, lambda: inner, state
        )()
        self.assertEqual(next(g), "sent")
        err = Boom()
        self.assertEqual(g.throw(err), "caught")
        self.assertEqual(inner.thrown, [err])
        g.close()
        if carried:
            self.assertEqual(len(inner.thrown), 2)
            self.assertIsInstance(inner.thrown[-1], GeneratorExit)
            self.assertEqual(inner.closed, [])
        else:
            self.assertEqual(inner.thrown, [err])
            self.assertEqual(inner.closed, [False])
        self.assertEqual(mode_state(), PLAIN)

    def test_traceback_shows_body_frame(self):
        @torch.no_grad()
        def body_with_a_distinctive_name():
            yield 1
            raise Boom("from the body")

        g = body_with_a_distinctive_name()
        next(g)
        try:
            next(g)
        except Boom as e:
            names = [f.name for f in traceback.extract_tb(e.__traceback__)]
        self.assertIn("body_with_a_distinctive_name", names)

    def test_thrown_exception_gets_no_foreign_context(self):
        def gen():
            try:
                yield 1
            except Boom:
                pass
            raise ValueError("after")

        for wrapped in (gen, torch.no_grad()(gen)):
            g = wrapped()
            next(g)
            with self.assertRaises(ValueError) as cm:
                g.throw(Boom())
            self.assertIsNone(cm.exception.__context__, wrapped)

    def test_generator_exit_ignored(self):
        @torch.no_grad()
        def gen():
            try:
                yield 1
            except GeneratorExit:
                yield 2

        g = gen()
        next(g)
        with self.assertRaisesRegex(RuntimeError, "ignored GeneratorExit"):
            g.close()
        self.assertEqual(mode_state(), PLAIN)
        # As undecorated, the body stays suspended and can still be resumed.
        self.assertEqual(inspect.getgeneratorstate(g), inspect.GEN_SUSPENDED)
        with self.assertRaises(StopIteration):
            next(g)

    def test_nested_decorators(self):
        @torch.no_grad()
        @torch.enable_grad()
        def gen():
            yield mode_state()
            with torch.inference_mode():
                yield mode_state()

        with torch.no_grad():
            self.assertEqual(list(gen()), [PLAIN, INFERENCE])
            self.assertEqual(mode_state(), NO_GRAD)

    def test_recursion_and_interleaving(self):
        @torch.no_grad()
        def walk(depth):
            yield depth, torch.is_grad_enabled()
            if depth:
                with torch.enable_grad():
                    yield from walk(depth - 1)

        self.assertEqual(list(walk(2)), [(2, False), (1, False), (0, False)])

        @torch.no_grad()
        def counter(tag):
            for i in range(3):
                with torch.enable_grad():
                    yield tag, i, torch.is_grad_enabled()
                yield tag, i, torch.is_grad_enabled()

        a, b = counter("a"), counter("b")
        got = [x for pair in zip(a, b) for x in pair]
        self.assertEqual([g for *_, g in got], [True, True, False, False] * 3)

    def test_stepping_re_entrantly_is_refused(self):
        holder = []

        @torch.no_grad()
        def gen():
            yield next(holder[0])

        g = gen()
        holder.append(g)
        with self.assertRaisesRegex(ValueError, "already executing"):
            next(g)
        self.assertEqual(mode_state(), PLAIN)

    def test_methods_static_and_class(self):
        class Model:
            @torch.no_grad()
            def gen(self):
                yield torch.is_grad_enabled()

            @torch.no_grad()
            @staticmethod
            def static_gen():
                yield torch.is_grad_enabled()

            @torch.no_grad()
            @classmethod
            def class_gen(cls):
                yield cls, torch.is_grad_enabled()

        self.assertEqual(list(Model().gen()), [False])
        self.assertEqual(list(Model.static_gen()), [False])
        self.assertEqual(list(Model().static_gen()), [False])
        self.assertEqual(list(Model.class_gen()), [(Model, False)])
        self.assertTrue(inspect.isgeneratorfunction(Model.static_gen))

    def test_other_decorator_context_managers_reenter_each_step(self):
        # A subclass outside torch is not a grad mode: a fresh clone is
        # entered around every step, and the body's own grad mode block is
        # the thread's between steps, as undecorated.
        log = []

        class Tracing(_DecoratorContextManager):
            def __enter__(self):
                log.append("enter")

            def __exit__(self, *exc):
                log.append("exit")

        @Tracing()
        def gen():
            with torch.no_grad():
                yield torch.is_grad_enabled()
                yield torch.is_grad_enabled()

        between = []
        for seen in gen():
            between.append((seen, torch.is_grad_enabled(), list(log)))
        self.assertEqual(
            between,
            [
                (False, False, ["enter", "exit"]),
                (False, False, ["enter", "exit"] * 2),
            ],
        )
        self.assertEqual(log, ["enter", "exit"] * 3)
        self.assertTrue(torch.is_grad_enabled())

    def test_forward_ad_dual_level_generator(self):
        @fwAD.dual_level()
        def gen():
            x = fwAD.make_dual(torch.ones(2), torch.full((2,), 2.0))
            yield fwAD.unpack_dual(x * 3).tangent.tolist()

        self.assertEqual(list(gen()), [[6.0, 6.0]])


# ---------------------------------------------------------------------------
# Coroutines and async generators
#
# A decorated coroutine or async generator's body sees at every point the state
# it would see if it ran uninterrupted inside ``with <decorator>:`` on a thread
# of its own that starts in the caller's state at the body's first entry, for
# the state the decorator carries; the rest of the thread state it shares with
# whatever runs on the thread, as the undecorated body does.  Every other task
# on the event loop gets back, after each of its own awaits, what its own
# decorator carries as it left it, and sees the rest as it is.
#
# Only one *undecorated* task may change the state and keep it across an
# await: it is thread state, so two undecorated tasks that both do would see
# each other's changes whatever the decorators do.  The noise tasks that stand
# for "other tasks" are therefore decorated coroutines that change only state
# their decorator carries, and the one undecorated task of each test is its
# driver.
# ---------------------------------------------------------------------------


class TaskStates:
    """What the tasks of one event loop must see after their awaits.

    The one undecorated task records its whole state before each of its
    awaits (``main``); the decorated tasks change only what their decorators
    carry, so a decorated task that resumes finds the thread in that state,
    with the part its decorator carries as it left it.
    """

    def __init__(self):
        self.main = None
        self.problems = []
        self.awaits = 0

    async def main_sleep(self):
        """An await of the undecorated task, checked: it sees its whole state."""
        want = self.main = autograd_state()
        await asyncio.sleep(0)
        self.check_whole("undecorated main task", want)

    def check_whole(self, who, want):
        got = autograd_state()
        if got != want:
            self.problems.append((who, want, got))

    def check(self, who, carry, want):
        """After an await of a task decorated to carry *carry*, which saw *want*
        before it."""
        self.awaits += 1
        got = autograd_state()
        expected = as_carried(carry, self.main, want)
        if got != expected:
            self.problems.append((who, expected, got))

    def check_carried(self, who, carry, want):
        """Only the carried part: for a body stepped from another decorated one."""
        got = autograd_state()
        if [got[i] for i in carry.fields] != [want[i] for i in carry.fields]:
            self.problems.append((who, want, got))


def flip_carried(carry):
    """Change what *carry* covers, as a call (never undone)."""
    if carry is WHOLE:
        torch.set_grad_enabled(not torch.is_grad_enabled())
    else:
        carry.install(not carry.capture())


class NoiseTasks:
    """Decorated tasks that each keep changing what their decorator carries and
    check their state after every await.

    Each is a coroutine decorated with one of ``DECORATORS`` whose body enters
    random blocks of the state its decorator carries and flips that state by
    call between ``await asyncio.sleep(0)``; after every await it must see
    its own of that state as before, and the rest as the undecorated task
    left it (``TaskStates``).  Must be created inside a running event loop.
    """

    def __init__(self, count, seed, states):
        self.states = states
        self._stopped = False
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._make(seed, k)()) for k in range(count)]

    def _make(self, seed, k):
        name, make = list(DECORATORS.items())[(seed + k) % len(DECORATORS)]
        carry = CARRIES[name]
        blocks = [BLOCKS[block] for block in CARRIED_BLOCKS[carry]]

        @make()
        async def noise():
            rng = random.Random(seed * 1009 + k)
            while not self._stopped:
                with blocks[rng.randrange(len(blocks))]():
                    for _ in range(rng.randint(1, 3)):
                        await self._checked_sleep(name, carry)
                if rng.random() < 0.5:
                    flip_carried(carry)
                await self._checked_sleep(name, carry)

        return noise

    async def _checked_sleep(self, name, carry):
        want = autograd_state()
        await asyncio.sleep(0)
        self.states.check(f"noise {name}", carry, want)

    async def stop(self):
        self._stopped = True
        await asyncio.gather(*self._tasks)


@skipIfTorchDynamo(_DYNAMO_SKIP)
class TestGradModeAsyncCoroutines(GradModeTestCase):
    """The body of a decorated ``async def`` runs under the decorator at every step."""

    def test_issue_example(self):
        @torch.no_grad()
        async def f():
            await asyncio.sleep(0)
            return torch.is_grad_enabled()

        self.assertTrue(inspect.iscoroutinefunction(f))
        self.assertIs(asyncio.run(f()), False)
        self.assertTrue(torch.is_grad_enabled())

    @parametrize("decorator", list(DECORATORS))
    def test_every_decorator(self, decorator):
        make = DECORATORS[decorator]
        expected = state_inside(make)

        @make()
        async def f():
            await asyncio.sleep(0)
            return mode_state()

        self.assertTrue(inspect.iscoroutinefunction(f))
        self.assertEqual(asyncio.run(f()), expected)
        self.assertEqual(mode_state(), PLAIN)

    @parametrize("decorator", list(DECORATORS))
    @parametrize("caller", list(CALLER_SETUPS))
    def test_every_decorator_from_every_caller_mode(self, decorator, caller):
        make, setup = DECORATORS[decorator], CALLER_SETUPS[caller]
        expected = state_inside(make, caller=setup)

        @make()
        async def f(n):
            seen = [mode_state()]
            for i in range(n):
                # Both a bare yield to the loop and a real future.
                await asyncio.sleep(0 if i % 2 else 0.0001)
                seen.append(mode_state())
            return seen

        async def main():
            before = mode_state()
            seen = await f(4)
            self.assertEqual(mode_state(), before)
            return seen

        with enter_all(setup):
            before = mode_state()
            self.assertEqual(asyncio.run(main()), [expected] * 5)
            self.assertEqual(mode_state(), before)

    @parametrize("decorator", list(DECORATORS))
    @parametrize("block", list(BLOCKS))
    def test_own_block_spans_awaits(self, decorator, block):
        # The body sees its whole block after every await; another task that
        # runs while it is suspended in it sees the rest of the block, but
        # not what the decorator carries, as it sees the undecorated body's.
        make, bmake, carry = DECORATORS[decorator], BLOCKS[block], CARRIES[decorator]

        async def f(seen):
            with bmake():
                for _ in range(3):
                    await asyncio.sleep(0)
                    seen.append(autograd_state())
            await asyncio.sleep(0)
            seen.append(autograd_state())

        def run(func):
            seen, others = [], []

            async def other(body):
                while not body.done():
                    others.append(autograd_state())
                    await asyncio.sleep(0)

            async def main():
                body = asyncio.ensure_future(func(seen))
                await asyncio.gather(body, other(body))

            asyncio.run(main())
            return seen, others, autograd_state()

        decorated, expected = both_ways(decorator, f, run)
        self.assertEqual(decorated, expected)
        outside = state_inside(make, probe=autograd_state)
        inside = state_inside(make, bmake, probe=autograd_state)
        plain = on_own_thread(autograd_state)
        seen, others, after = decorated
        self.assertEqual(seen, [inside] * 3 + [outside])
        self.assertEqual(after, plain)
        self.assertEqual(
            others,
            [as_carried(carry, inside, plain)] * 3 + [as_carried(carry, outside, plain)],
        )

    def test_set_grad_enabled_as_a_call_persists_across_awaits(self):
        @torch.no_grad()
        async def f():
            seen = [torch.is_grad_enabled()]
            torch.set_grad_enabled(True)
            await asyncio.sleep(0)
            seen.append(torch.is_grad_enabled())
            await asyncio.sleep(0)
            seen.append(torch.is_grad_enabled())
            torch.set_grad_enabled(False)
            await asyncio.sleep(0)
            seen.append(torch.is_grad_enabled())
            return seen

        async def main():
            seen = await f()
            self.assertTrue(torch.is_grad_enabled())
            return seen

        self.assertEqual(asyncio.run(main()), [False, True, True, False])

    def test_graph_built_across_awaits(self):
        w = torch.ones(2, requires_grad=True)

        @torch.no_grad()
        async def step():
            frozen = w * 2
            with torch.enable_grad():
                y = w * 2
                await asyncio.sleep(0)
                z = (y * 3).sum()
                await asyncio.sleep(0)
            z.backward()
            return frozen.requires_grad, z.requires_grad

        self.assertEqual(asyncio.run(step()), (False, True))
        self.assertEqual(w.grad.tolist(), [6.0, 6.0])

    def test_awaiting_decorated_from_decorated(self):
        @torch.enable_grad()
        async def inner():
            first = mode_state()
            await asyncio.sleep(0)
            with torch.no_grad():
                await asyncio.sleep(0)
                return first, mode_state()

        @torch.no_grad()
        async def outer():
            first = mode_state()
            with torch.inference_mode():
                got = await inner()
                after = mode_state()
            await asyncio.sleep(0)
            return first, got, after, mode_state()

        self.assertEqual(
            asyncio.run(outer()),
            (NO_GRAD, (INFERENCE_GRAD, INFERENCE), INFERENCE, NO_GRAD),
        )


@skipIfTorchDynamo(_DYNAMO_SKIP)
class TestGradModeAsyncGenerators(GradModeTestCase):
    """Every step of a decorated async generator runs under the decorator."""

    @parametrize("decorator", list(DECORATORS))
    def test_every_step_under_every_decorator(self, decorator):
        # The caller changes its state between steps: what the decorator
        # carries, the body keeps as its first step set it; the rest reaches
        # it as it reaches the undecorated body.  The first step is taken from
        # inside inference_mode+enable_grad.
        callers = list(CALLER_SETUPS.values())
        callers = callers[3:] + callers[:3]

        async def agen():
            got = None
            for _ in range(len(callers)):
                resumed = autograd_state()
                await asyncio.sleep(0)
                got = yield got, resumed, autograd_state()

        def run(func):
            async def main():
                self.assertTrue(inspect.isasyncgenfunction(func))
                ag = func()
                out = []
                for n, setup in enumerate(callers):
                    with enter_all(setup):
                        before = autograd_state()
                        step = ag.__anext__() if n == 0 else ag.asend(f"v{n}")
                        out.append((await step, before))
                        self.assertEqual(autograd_state(), before)
                with self.assertRaises(StopAsyncIteration):
                    await ag.asend("last")
                return out

            return asyncio.run(main())

        decorated, expected = both_ways(decorator, agen, run)
        self.assertEqual(decorated, expected)
        own = state_inside(
            DECORATORS[decorator], caller=callers[0], probe=autograd_state
        )
        sent = [None] + [f"v{n}" for n in range(1, len(callers))]
        mine = [as_carried(CARRIES[decorator], before, own) for _, before in decorated]
        self.assertEqual(
            [item for item, _ in decorated],
            [(v, seen, seen) for v, seen in zip(sent, mine)],
        )

    def test_async_for(self):
        @torch.inference_mode()
        async def agen(n):
            for i in range(n):
                await asyncio.sleep(0)
                yield i, mode_state()

        async def main():
            out = []
            async for item in agen(3):
                out.append(item)
                self.assertEqual(mode_state(), PLAIN)
            return out

        self.assertEqual(asyncio.run(main()), [(i, INFERENCE) for i in range(3)])

    @parametrize("decorator", list(DECORATORS))
    @parametrize("block", list(BLOCKS))
    def test_own_block_spans_yields_and_awaits(self, decorator, block):
        # The body sees its whole block at every step; between steps its
        # caller has its own back of what the decorator carries, and the rest
        # of the block is the caller's, as undecorated.
        make, bmake, carry = DECORATORS[decorator], BLOCKS[block], CARRIES[decorator]

        async def agen():
            with bmake():
                yield autograd_state()
                await asyncio.sleep(0)
                yield autograd_state()
                await asyncio.sleep(0)
                yield autograd_state()
            await asyncio.sleep(0)
            yield autograd_state()

        def run(func):
            async def main():
                out = []
                async for seen in func():
                    out.append((seen, autograd_state()))
                return out

            return asyncio.run(main())

        decorated, expected = both_ways(decorator, agen, run)
        self.assertEqual(decorated, expected)
        outside = state_inside(make, probe=autograd_state)
        inside = state_inside(make, bmake, probe=autograd_state)
        plain = on_own_thread(autograd_state)
        self.assertEqual(
            decorated,
            [(inside, as_carried(carry, inside, plain))] * 3
            + [(outside, as_carried(carry, outside, plain))],
        )

    @parametrize("decorator", list(DECORATORS))
    def test_athrow_caught_under_mode(self, decorator):
        # Thrown in from each caller in turn: the body's handler sees that
        # caller's state with what the decorator carries as the body keeps it
        # (its enable_grad block, for the grad modes), before and after an
        # await; the caller gets its own back.
        async def agen(seen):
            with torch.enable_grad():
                while True:
                    try:
                        yield len(seen)
                    except Boom as exc:
                        seen.append((exc.args[0], autograd_state()))
                        await asyncio.sleep(0)
                        seen.append(("after await", autograd_state()))

        def run(func):
            seen, callers = [], []

            async def main():
                with torch.no_grad():
                    ag = func(seen)
                    self.assertEqual(await ag.__anext__(), 0)
                for n, setup in enumerate(CALLER_SETUPS.values()):
                    with enter_all(setup):
                        before = autograd_state()
                        callers.append(before)
                        # The one-argument form: the exception carries its own
                        # traceback.
                        self.assertEqual(await ag.athrow(Boom(n)), 2 * (n + 1))
                        self.assertEqual(autograd_state(), before)
                await ag.aclose()

            asyncio.run(main())
            return seen, callers

        decorated, expected = both_ways(decorator, agen, run)
        self.assertEqual(decorated, expected)
        seen, callers = decorated
        inside = state_inside(
            DECORATORS[decorator],
            torch.enable_grad,
            caller=[torch.no_grad],
            probe=autograd_state,
        )
        want = []
        for n, caller in enumerate(callers):
            mine = as_carried(CARRIES[decorator], caller, inside)
            want += [(n, mine), ("after await", mine)]
        self.assertEqual(seen, want)

    def test_athrow_uncaught_propagates_with_body_frame(self):
        @torch.no_grad()
        async def body_with_a_distinctive_name():
            try:
                yield 1
            finally:
                finally_state.append(mode_state())

        finally_state = []

        async def main():
            ag = body_with_a_distinctive_name()
            await ag.__anext__()
            err = Boom("thrown")
            try:
                await ag.athrow(err)
            except Boom as exc:
                self.assertIs(exc, err)
                names = [f.name for f in traceback.extract_tb(exc.__traceback__)]
            self.assertIn("body_with_a_distinctive_name", names)
            with self.assertRaises(StopAsyncIteration):
                await ag.__anext__()

        asyncio.run(main())
        self.assertEqual(finally_state, [NO_GRAD])

    def test_athrow_uses_one_argument_form(self):
        # An async-generator-like object whose athrow() accepts only the
        # exception: the three-argument form must never be used.
        async def step(tag):
            # Like the awaitables of a real async generator: a coroutine,
            # run by the wrapper in the body's mode.
            await asyncio.sleep(0)
            return tag, mode_state()

        async def reraise(exc):
            raise exc

        class OneArgAthrow:
            def __init__(self):
                self.thrown = []

            def asend(self, value):
                return step("sent")

            def athrow(self, exc):
                self.thrown.append(exc)
                if isinstance(exc, GeneratorExit):
                    return reraise(exc)
                return step("caught")

        inner = OneArgAthrow()
        wrapped = torch.utils._contextlib._wrap_async_generator(
            torch.no_grad, lambda: inner, torch.no_grad._carried_state
        )

        async def main():
            ag = wrapped()
            self.assertEqual(await ag.__anext__(), ("sent", NO_GRAD))
            err = Boom()
            self.assertEqual(await ag.athrow(err), ("caught", NO_GRAD))
            self.assertEqual(inner.thrown, [err])
            await ag.aclose()
            self.assertIsInstance(inner.thrown[-1], GeneratorExit)

        asyncio.run(main())

    @parametrize("decorator", list(DECORATORS))
    @parametrize("block", list(BLOCKS))
    def test_aclose_runs_finally_under_mode(self, decorator, block):
        # Closed from inside inference_mode: the clean-up inside the body's
        # block sees, before and after an await, what the decorator carries as
        # the block set it and the rest as its closer's (a no_grad body: its
        # closer's inference mode), as the reference does; the closer gets
        # back its own of what the decorator carries.
        make, bmake, carry = DECORATORS[decorator], BLOCKS[block], CARRIES[decorator]

        async def agen(seen):
            try:
                with bmake():
                    try:
                        yield 1
                    except GeneratorExit:
                        seen.append(("exit", autograd_state()))
                        # Async clean-up may await.
                        await asyncio.sleep(0)
                        seen.append(("exit after await", autograd_state()))
                        raise
            finally:
                seen.append(("finally", autograd_state()))

        def run(func):
            seen = []

            async def main():
                ag = func(seen)
                self.assertEqual(await ag.__anext__(), 1)
                with torch.inference_mode():
                    closer = autograd_state()
                    await ag.aclose()
                    after = autograd_state()
                with self.assertRaises(StopAsyncIteration):
                    await ag.__anext__()
                return closer, after

            return seen, *asyncio.run(main())

        decorated, expected = both_ways(decorator, agen, run)
        self.assertEqual(decorated, expected)
        seen, closer, after = decorated
        inside = state_inside(make, bmake, probe=autograd_state)
        mine = as_carried(carry, closer, inside)
        self.assertEqual(seen[:2], [("exit", mine), ("exit after await", mine)])
        self.assertEqual(as_carried(carry, after, closer), after)
        if carry is WHOLE:
            outside = state_inside(make, probe=autograd_state)
            self.assertEqual(seen[2], ("finally", outside))
            self.assertEqual(after, closer)

    @parametrize("decorator", list(DECORATORS))
    def test_shutdown_closes_live_generators_in_body_mode(self, decorator):
        # Generators still suspended when asyncio.run ends are closed by the
        # loop's shutdown_asyncgens, all at once: each must be closed through
        # its wrapper (in the body's mode), never directly.
        make = DECORATORS[decorator]
        expected = state_inside(make)
        seen, keep = [], []

        @make()
        async def agen():
            try:
                yield
            finally:
                seen.append(mode_state())

        async def main():
            for _ in range(16):
                ag = agen()
                await ag.asend(None)
                keep.append(ag)

        asyncio.run(main())
        self.assertEqual(seen, [expected] * 16)

    def test_aclose_ignored_leaves_generator_resumable(self):
        # A body that yields in response to aclose(): aclose() fails, the
        # caller's mode is intact, and the body can be resumed, with the same
        # outcomes as undecorated (whose open block leaks, which is the point).
        def make_agen(decorate):
            async def agen():
                with torch.enable_grad():
                    try:
                        yield 1
                    finally:
                        yield 2

            return torch.no_grad()(agen) if decorate else agen

        async def run(agen):
            outcomes, caller_modes = [], []
            with torch.no_grad():
                ag = agen()
                await ag.asend(None)
                try:
                    await ag.aclose()
                except RuntimeError as e:
                    outcomes.append(("aclose", str(e)))
                caller_modes.append(mode_state())
                try:
                    outcomes.append(("resume", await ag.asend(None)))
                except BaseException as e:
                    outcomes.append(("resume", type(e).__name__))
                caller_modes.append(mode_state())
            return outcomes, caller_modes

        expected, _ = on_own_thread(lambda: asyncio.run(run(make_agen(False))))
        outcomes, caller_modes = asyncio.run(run(make_agen(True)))
        self.assertEqual(outcomes, expected)
        self.assertEqual(
            expected[0], ("aclose", "async generator ignored GeneratorExit")
        )
        self.assertEqual(caller_modes, [NO_GRAD, NO_GRAD])

    def test_dropped_after_an_ignored_close_is_closed_again_in_its_mode(self):
        # The loop's finalizer closes the wrapper once; a body that ignored
        # that is closed a second time through the decorator when dropped, as
        # a generator is, and its inference-mode guard is undone in its own
        # state: left to Python, the guard's restore put the body's no_grad on
        # the thread (a 100,000-program property run found it, 2026-12-01).
        log = []

        @torch.no_grad()
        async def body():
            with torch.inference_mode():
                try:
                    yield 1
                except GeneratorExit:
                    log.append(("ignored", mode_state()))
                    yield 2

        async def main():
            # Not logged: a captured log record would keep the frames alive.
            asyncio.get_running_loop().set_exception_handler(lambda *args: None)
            b = body()
            await b.__anext__()
            del b
            await asyncio.sleep(0)

        before = autograd_state()
        asyncio.run(main())
        gc.collect()
        self.assertEqual(autograd_state(), before)
        self.assertEqual(log, [("ignored", INFERENCE)])

    def test_cycle_collected_mid_clean_up_reports_what_undecorated_does(self):
        # Collected in a cycle without a loop: the wrapper's close leaves the
        # body awaiting in its clean-up, and the body's own finalizer must not
        # close it again while it runs (found by a user, 2026-12-01).
        def unraisables(decorate):
            async def agen():
                try:
                    yield 1
                finally:
                    await suspend()

            body = (torch.no_grad()(agen) if decorate else agen)()
            with contextlib.suppress(StopIteration):
                body.asend(None).send(None)
            seen = []
            with mock.patch.object(
                sys, "unraisablehook", lambda u: seen.append(repr(u.exc_value))
            ):
                cycle = [body]
                cycle.append(cycle)
                del cycle, body
                gc.collect()
            return seen

        expected = unraisables(False)
        self.assertEqual(
            expected, [repr(RuntimeError("async generator ignored GeneratorExit"))]
        )
        self.assertEqual(unraisables(True), expected)

    @parametrize("decorator", list(DECORATORS))
    def test_loop_finalisation_runs_finally_under_mode(self, decorator):
        # Break out of ``async for`` and let the event loop finalise the
        # abandoned generator (its asyncgen finalizer hook schedules aclose(),
        # run as asyncio.run shuts down).  No await in the ``finally``: the
        # loop closes before the clean-up task's second step, decorated or not.
        # The body's enable_grad block reaches its no_grad caller unless the
        # decorator carries grad mode; its finally sees the loop's state (a
        # fresh thread's, but for the grad mode its block's exit put back:
        # the no_grad it found) with what the decorator carries as the body's.
        make, carry = DECORATORS[decorator], CARRIES[decorator]

        async def agen(seen):
            try:
                with torch.enable_grad():
                    seen.append(("body", autograd_state()))
                    yield 1
                    yield 2
            finally:
                seen.append(("finally", autograd_state()))

        def run(func):
            seen = []

            async def main():
                with torch.no_grad():
                    async for x in func(seen):
                        seen.append(("got", x, autograd_state()))
                        break

            asyncio.run(main())
            return seen

        decorated, expected = both_ways(decorator, agen, run)
        self.assertEqual(decorated, expected)
        caller = [torch.no_grad]
        outside = state_inside(make, caller=caller, probe=autograd_state)
        inside = state_inside(make, torch.enable_grad, caller=caller, probe=autograd_state)
        no_grad = state_inside(torch.no_grad, probe=autograd_state)
        self.assertEqual(
            decorated,
            [
                ("body", inside),
                ("got", 1, as_carried(carry, inside, no_grad)),
                ("finally", as_carried(carry, no_grad, outside)),
            ],
        )

    @parametrize("decorator", list(DECORATORS))
    def test_shutdown_finalises_generator_of_cancelled_task(self, decorator):
        # A task still iterating when asyncio.run returns is cancelled by it;
        # the generator it held is then finalised by the shutting-down loop,
        # whose state (a fresh thread's) the body's finally sees with what
        # the decorator carries as the body's.
        make, carry = DECORATORS[decorator], CARRIES[decorator]

        async def agen(seen):
            try:
                yield 1
                yield 2
            finally:
                seen.append(("finally", autograd_state()))

        def run(func):
            seen = []

            async def consumer(started):
                with torch.no_grad():
                    async for _ in func(seen):
                        started.set()
                        await asyncio.sleep(3600)

            async def main():
                started = asyncio.Event()
                asyncio.get_running_loop().create_task(consumer(started))
                await started.wait()

            asyncio.run(main())
            return seen

        decorated, expected = both_ways(decorator, agen, run)
        self.assertEqual(decorated, expected)
        outside = state_inside(make, caller=[torch.no_grad], probe=autograd_state)
        plain = on_own_thread(autograd_state)
        self.assertEqual(decorated, [("finally", as_carried(carry, plain, outside))])

    def test_return_ends_iteration(self):
        @torch.no_grad()
        async def agen():
            yield mode_state()
            await asyncio.sleep(0)
            return

        async def main():
            return [x async for x in agen()]

        self.assertEqual(asyncio.run(main()), [NO_GRAD])


@skipIfTorchDynamo(_DYNAMO_SKIP)
class TestGradModeAsyncTaskIsolation(GradModeTestCase):
    """Every task sees, after each of its own awaits, only the mode it set itself."""

    def test_noise_tasks_with_coroutines_and_async_generators(self):
        # Every decorated task keeps, across its awaits, what its decorator
        # carries, and sees the rest as the undecorated task changes it (a
        # no_grad task sees the driver's inference mode, multithreading and
        # view-replay changes); the undecorated driver keeps its whole state.
        states = TaskStates()
        decorators = list(DECORATORS.items())

        def carried_blocks(name):
            return [BLOCKS[block] for block in CARRIED_BLOCKS[CARRIES[name]]]

        def make_coroutine(k):
            name, make = decorators[k % len(decorators)]
            carry, blocks = CARRIES[name], carried_blocks(name)

            @make()
            async def coroutine():
                rng = random.Random(k)
                for _ in range(20):
                    with blocks[rng.randrange(len(blocks))]():
                        want = autograd_state()
                        await asyncio.sleep(0)
                        states.check(f"coroutine {name}", carry, want)
                    want = autograd_state()
                    await asyncio.sleep(0)
                    states.check(f"coroutine {name}", carry, want)
                return k

            return coroutine

        def make_agen(k):
            name, make = decorators[k % len(decorators)]
            carry, blocks = CARRIES[name], carried_blocks(name)

            @make()
            async def agen():
                rng = random.Random(100 + k)
                for i in range(10):
                    with blocks[rng.randrange(len(blocks))]():
                        want = autograd_state()
                        await asyncio.sleep(0)
                        states.check_carried(f"async generator {name}", carry, want)
                        yield i
                        states.check_carried(
                            f"async generator {name} after yield", carry, want
                        )
                    want = autograd_state()
                    await asyncio.sleep(0)
                    states.check_carried(f"async generator {name}", carry, want)

            return agen

        def make_consumer(k):
            name, make = decorators[(k + 4) % len(decorators)]
            carry = CARRIES[name]

            @make()
            async def consumer():
                out = []
                ag = make_agen(k)()
                while True:
                    want = autograd_state()
                    try:
                        out.append(await ag.__anext__())
                    except StopAsyncIteration:
                        break
                    finally:
                        states.check(f"consumer {name}", carry, want)
                    flip_carried(carry)
                return out

            return consumer

        async def main():
            noise = NoiseTasks(4, seed=7, states=states)
            n = len(decorators)
            tasks = [asyncio.create_task(make_coroutine(k)()) for k in range(n)]
            tasks += [asyncio.create_task(make_consumer(k)()) for k in range(n)]
            # This undecorated task keeps changing its own state too.
            rng = random.Random(3)
            setups = list(CALLER_SETUPS.values())
            awaits = 0
            while not all(task.done() for task in tasks):
                with enter_all(setups[rng.randrange(len(setups))]):
                    for _ in range(rng.randint(1, 3)):
                        await states.main_sleep()
                        awaits += 1
            states.main = autograd_state()
            results = await asyncio.gather(*tasks)
            await noise.stop()
            self.assertGreater(awaits, 10)
            return results

        results = on_own_thread(asyncio.run, main())
        n = len(decorators)
        self.assertEqual(results, list(range(n)) + [list(range(10))] * n)
        self.assertGreater(states.awaits, 200)
        self.assertEqual(states.problems, [])

    @parametrize("decorator", list(DECORATORS))
    def test_suspended_inference_block_reaches_other_tasks_unless_carried(
        self, decorator
    ):
        # inference_mode carries the whole autograd state: while its body is
        # suspended inside its own inference-mode block, another task makes
        # ordinary tensors and can train.  No other decorator carries
        # inference mode: the block reaches the other task as the undecorated
        # body's does, with that task's own part of what the decorator
        # carries (after a no_grad body, its own grad mode).
        async def server(results, ready, release):
            with torch.inference_mode():
                ready.set()
                await release.wait()
                results.append(torch.ones(1).is_inference())

        def run(func):
            results = []

            async def main():
                ready, release = asyncio.Event(), asyncio.Event()
                task = asyncio.create_task(func(results, ready, release))
                before = autograd_state()
                await ready.wait()
                # The body is suspended inside its inference-mode block.
                during = autograd_state()
                made = torch.ones(1).is_inference()
                x = torch.ones(1, requires_grad=True)
                try:
                    (x * 2).sum().backward()
                    trained = x.grad.item()
                except RuntimeError:
                    trained = None
                release.set()
                await task
                return before, during, made, trained

            return results, asyncio.run(main())

        decorated, expected = both_ways(decorator, server, run)
        self.assertEqual(decorated, expected)
        results, (before, during, made, trained) = decorated
        self.assertEqual(results, [True])
        carry = CARRIES[decorator]
        inside = state_inside(
            DECORATORS[decorator], torch.inference_mode, probe=autograd_state
        )
        self.assertEqual(during, as_carried(carry, inside, before))
        if carry is WHOLE:
            self.assertEqual((during, made, trained), (before, False, 2.0))
        else:
            self.assertTrue(made)

    @parametrize("decorator", list(DECORATORS))
    @parametrize("caller", list(CALLER_SETUPS))
    def test_coroutine_dropped_while_suspended(self, caller, decorator):
        # A coroutine object closed (here: collected) while suspended inside
        # its own inference-mode block runs its clean-up in its own state for
        # what the decorator carries; the block reaches its caller until then
        # unless the decorator carries it (inference_mode), and its exit gives
        # the caller its whole state back either way.
        async def f(seen):
            try:
                with torch.inference_mode():
                    await asyncio.sleep(0)
            finally:
                seen.append(autograd_state())

        def run(func):
            seen = []
            with enter_all(CALLER_SETUPS[caller]):
                before = autograd_state()
                coro = func(seen)
                coro.send(None)  # runs to asyncio.sleep(0)'s bare yield
                suspended = autograd_state()
                del coro
                if not seen:  # not freed at once: left to the collector
                    gc.collect()
                return before, suspended, autograd_state(), seen

        decorated, expected = both_ways(decorator, f, run)
        self.assertEqual(decorated, expected)
        before, suspended, after, seen = decorated
        self.assertEqual(after, before)
        make, setup, carry = DECORATORS[decorator], CALLER_SETUPS[caller], CARRIES[decorator]
        inside = state_inside(make, torch.inference_mode, caller=setup, probe=autograd_state)
        self.assertEqual(suspended, as_carried(carry, inside, before))
        outside = state_inside(make, caller=setup, probe=autograd_state)
        self.assertEqual(seen, [outside])


def _suspended_in_block(make, bmake, seen):
    """A decorated coroutine that waits forever inside its own *bmake* block,
    recording what it sees."""

    @make()
    async def body(started):
        try:
            with bmake():
                try:
                    started.set()
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    seen.append(("except", autograd_state()))
                    await asyncio.sleep(0)  # clean-up may await
                    seen.append(("except after await", autograd_state()))
                    raise
                finally:
                    seen.append(("inner finally", autograd_state()))
        finally:
            seen.append(("finally", autograd_state()))

    return body


# Callers of the cancellation tests: plain, and inference_mode+enable_grad.
CANCELLING_CALLERS = ["plain", "inference_mode_enable_grad"]
HAS_ASYNCIO_TIMEOUT = hasattr(asyncio, "timeout")


@skipIfTorchDynamo(_DYNAMO_SKIP)
class TestGradModeAsyncCancellation(GradModeTestCase):
    """CancelledError and timeouts land where the body is suspended, in its
    state: its whole block (what its decorator carries as its own, the rest as
    it left it on the thread, which its canceller has not changed)."""

    def check_cancellation(self, cancel, raised, decorator, block, caller):
        """*cancel(body, started)* is a coroutine that gets the body cancelled; it
        must raise *raised*."""
        make, bmake = DECORATORS[decorator], BLOCKS[block]
        setup = CALLER_SETUPS[caller]
        inside = state_inside(make, bmake, caller=setup, probe=autograd_state)
        outside = state_inside(make, caller=setup, probe=autograd_state)
        seen = []
        body = _suspended_in_block(make, bmake, seen)

        async def main():
            with enter_all(setup):
                before = autograd_state()
                with self.assertRaises(raised):
                    await cancel(body, asyncio.Event())
                self.assertEqual(autograd_state(), before)

        asyncio.run(main())
        self.assertEqual(
            seen,
            [
                ("except", inside),
                ("except after await", inside),
                ("inner finally", inside),
                ("finally", outside),
            ],
        )

    @parametrize("decorator", list(DECORATORS))
    @parametrize("block", list(BLOCKS))
    @parametrize("caller", CANCELLING_CALLERS)
    def test_task_cancel(self, decorator, block, caller):
        async def cancel(body, started):
            task = asyncio.create_task(body(started))
            await started.wait()
            task.cancel()
            await task

        self.check_cancellation(
            cancel, asyncio.CancelledError, decorator, block, caller
        )

    @parametrize("decorator", list(DECORATORS))
    @parametrize("block", list(BLOCKS))
    @parametrize("caller", CANCELLING_CALLERS)
    def test_wait_for_timeout(self, decorator, block, caller):
        async def cancel(body, started):
            await asyncio.wait_for(body(started), timeout=0.001)

        self.check_cancellation(cancel, asyncio.TimeoutError, decorator, block, caller)

    @unittest.skipIf(not HAS_ASYNCIO_TIMEOUT, "asyncio.timeout is new in Python 3.11")
    @parametrize("decorator", list(DECORATORS))
    @parametrize("block", list(BLOCKS))
    @parametrize("caller", CANCELLING_CALLERS)
    def test_asyncio_timeout(self, decorator, block, caller):
        async def cancel(body, started):
            async with asyncio.timeout(0.001):
                await body(started)

        self.check_cancellation(cancel, TimeoutError, decorator, block, caller)

    @unittest.skipIf(not HAS_ASYNCIO_TIMEOUT, "asyncio.timeout is new in Python 3.11")
    @parametrize("decorator", list(DECORATORS))
    @parametrize("caller", CANCELLING_CALLERS)
    def test_timeout_inside_the_body(self, decorator, caller):
        make, setup = DECORATORS[decorator], CALLER_SETUPS[caller]
        outside = state_inside(make, caller=setup)
        inside = state_inside(make, torch.no_grad, caller=setup)

        @make()
        async def f():
            first = mode_state()
            with torch.no_grad():
                try:
                    async with asyncio.timeout(0.001):
                        await asyncio.sleep(3600)
                except TimeoutError:
                    return first, mode_state()

        with enter_all(setup):
            self.assertEqual(asyncio.run(f()), (outside, inside))

    @parametrize("decorator", list(DECORATORS))
    def test_cancel_during_async_generator_step(self, decorator):
        make = DECORATORS[decorator]
        inside = state_inside(make, torch.enable_grad, caller=[torch.no_grad])
        seen = []

        @make()
        async def agen(started):
            with torch.enable_grad():
                yield 1
                try:
                    started.set()
                    await asyncio.sleep(3600)
                    yield 2
                except asyncio.CancelledError:
                    seen.append(("body", mode_state()))
                    raise

        async def consumer(started):
            with torch.no_grad():
                try:
                    async for _ in agen(started):
                        pass
                except asyncio.CancelledError:
                    seen.append(("consumer", mode_state()))
                    raise

        async def main():
            started = asyncio.Event()
            task = asyncio.create_task(consumer(started))
            await started.wait()
            task.cancel()
            with self.assertRaises(asyncio.CancelledError):
                await task
            self.assertEqual(mode_state(), PLAIN)

        asyncio.run(main())
        self.assertEqual(seen, [("body", inside), ("consumer", NO_GRAD)])


@skipIfTorchDynamo(_DYNAMO_SKIP)
class TestGradModeAsyncProtocol(GradModeTestCase):
    """Everything but the mode is as for the undecorated function."""

    @parametrize("decorator", list(DECORATORS))
    def test_coroutine_kind_and_metadata(self, decorator):
        async def coro(a, b=2):
            """Doc."""
            await asyncio.sleep(0)
            return a + b, mode_state()

        make = DECORATORS[decorator]
        wrapped = make()(coro)
        self.assertTrue(inspect.iscoroutinefunction(wrapped))
        self.assertFalse(inspect.isasyncgenfunction(wrapped))
        self.assertKeepsMetadata(wrapped, coro)
        result = wrapped(1)
        self.assertTrue(asyncio.iscoroutine(result))
        self.assertTrue(inspect.iscoroutine(result))
        self.assertEqual(asyncio.run(result), (3, state_inside(make)))

    @parametrize("decorator", list(DECORATORS))
    def test_async_generator_kind_and_metadata(self, decorator):
        async def agen(a, b=2):
            """Doc."""
            await asyncio.sleep(0)
            yield a + b, mode_state()

        make = DECORATORS[decorator]
        wrapped = make()(agen)
        self.assertTrue(inspect.isasyncgenfunction(wrapped))
        self.assertFalse(inspect.iscoroutinefunction(wrapped))
        self.assertKeepsMetadata(wrapped, agen)
        result = wrapped(1)
        self.assertTrue(inspect.isasyncgen(result))

        async def main():
            return [x async for x in result]

        self.assertEqual(asyncio.run(main()), [(3, state_inside(make))])

    def test_without_parentheses(self):
        @torch.no_grad
        async def no_grad_coro():
            await asyncio.sleep(0)
            return mode_state()

        @torch.inference_mode
        async def inference_coro():
            await asyncio.sleep(0)
            return mode_state()

        @torch.enable_grad
        async def enable_grad_coro():
            await asyncio.sleep(0)
            return mode_state()

        @torch.no_grad
        async def no_grad_agen():
            await asyncio.sleep(0)
            yield mode_state()

        @torch.inference_mode
        async def inference_agen():
            await asyncio.sleep(0)
            yield mode_state()

        async def main():
            with torch.no_grad():
                got = [
                    await no_grad_coro(),
                    await inference_coro(),
                    await enable_grad_coro(),
                ]
            got += [x async for x in no_grad_agen()]
            got += [x async for x in inference_agen()]
            return got

        for f in (no_grad_coro, inference_coro, enable_grad_coro):
            self.assertTrue(inspect.iscoroutinefunction(f))
        for f in (no_grad_agen, inference_agen):
            self.assertTrue(inspect.isasyncgenfunction(f))
        self.assertEqual(
            asyncio.run(main()), [NO_GRAD, INFERENCE, PLAIN, NO_GRAD, INFERENCE]
        )

    def test_return_value_and_exception(self):
        @torch.no_grad()
        async def body_with_a_distinctive_name(fail):
            await asyncio.sleep(0)
            if fail:
                raise Boom(mode_state())
            return {"state": mode_state()}

        async def main():
            self.assertEqual(
                await body_with_a_distinctive_name(False), {"state": NO_GRAD}
            )
            try:
                await body_with_a_distinctive_name(True)
            except Boom as exc:
                self.assertEqual(exc.args, (NO_GRAD,))
                self.assertIsNone(exc.__context__)
                names = [f.name for f in traceback.extract_tb(exc.__traceback__)]
            self.assertIn("body_with_a_distinctive_name", names)
            self.assertEqual(mode_state(), PLAIN)

        asyncio.run(main())

    def test_async_generator_exception_and_context(self):
        @torch.no_grad()
        async def agen_with_a_distinctive_name():
            try:
                yield 1
            except Boom:
                pass
            await asyncio.sleep(0)
            raise ValueError(mode_state())

        async def main():
            ag = agen_with_a_distinctive_name()
            await ag.__anext__()
            try:
                await ag.athrow(Boom())
            except ValueError as exc:
                # No context the undecorated body would not give it.
                self.assertIsNone(exc.__context__)
                names = [f.name for f in traceback.extract_tb(exc.__traceback__)]
                state = exc.args[0]
            self.assertIn("agen_with_a_distinctive_name", names)
            return state

        self.assertEqual(asyncio.run(main()), NO_GRAD)

    def test_methods_static_and_class(self):
        class Model:
            @torch.no_grad()
            async def coro(self):
                await asyncio.sleep(0)
                return self, torch.is_grad_enabled()

            @torch.no_grad()
            @staticmethod
            async def static_coro():
                await asyncio.sleep(0)
                return torch.is_grad_enabled()

            @torch.no_grad()
            @classmethod
            async def class_coro(cls):
                await asyncio.sleep(0)
                return cls, torch.is_grad_enabled()

            @staticmethod
            @torch.no_grad()
            async def static_below():
                await asyncio.sleep(0)
                return torch.is_grad_enabled()

            @torch.inference_mode()
            async def agen(self):
                await asyncio.sleep(0)
                yield self, torch.is_inference_mode_enabled()

            @torch.inference_mode()
            @staticmethod
            async def static_agen():
                await asyncio.sleep(0)
                yield torch.is_inference_mode_enabled()

            @torch.inference_mode
            @classmethod
            async def class_agen(cls):
                await asyncio.sleep(0)
                yield cls, torch.is_inference_mode_enabled()

        m = Model()

        async def main():
            return [
                await m.coro(),
                await Model.static_coro(),
                await m.static_coro(),
                await Model.class_coro(),
                await m.class_coro(),
                await Model.static_below(),
                [x async for x in m.agen()],
                [x async for x in Model.static_agen()],
                [x async for x in m.static_agen()],
                [x async for x in Model.class_agen()],
            ]

        self.assertEqual(
            asyncio.run(main()),
            [
                (m, False),
                False,
                False,
                (Model, False),
                (Model, False),
                False,
                [(m, True)],
                [True],
                [True],
                [(Model, True)],
            ],
        )
        self.assertTrue(inspect.iscoroutinefunction(Model.static_coro))
        self.assertTrue(inspect.iscoroutinefunction(m.class_coro))
        self.assertTrue(inspect.isasyncgenfunction(Model.static_agen))
        self.assertTrue(inspect.isasyncgenfunction(m.agen))

    def test_nested_decorators(self):
        @torch.no_grad()
        @torch.enable_grad()
        async def coro():
            await asyncio.sleep(0)
            first = mode_state()
            with torch.inference_mode():
                await asyncio.sleep(0)
                return first, mode_state()

        @torch.inference_mode()
        @torch.no_grad()
        @torch.inference_mode(False)
        async def agen():
            await asyncio.sleep(0)
            yield mode_state()
            with torch.no_grad():
                await asyncio.sleep(0)
                yield mode_state()

        async def main():
            with torch.no_grad():
                got = [await coro(), [x async for x in agen()]]
                self.assertEqual(mode_state(), NO_GRAD)
            return got

        self.assertTrue(inspect.iscoroutinefunction(coro))
        self.assertTrue(inspect.isasyncgenfunction(agen))
        self.assertEqual(asyncio.run(main()), [(PLAIN, INFERENCE), [PLAIN, NO_GRAD]])

    def test_recursion_and_gather(self):
        @torch.no_grad()
        async def walk(depth):
            await asyncio.sleep(0)
            out = [(depth, torch.is_grad_enabled())]
            if depth:
                with torch.enable_grad():
                    out += await walk(depth - 1)
                    out.append(("back", torch.is_grad_enabled()))
            return out

        async def main():
            return await asyncio.gather(walk(2), walk(1))

        self.assertEqual(
            asyncio.run(main()),
            [
                [(2, False), (1, False), (0, False), ("back", True), ("back", True)],
                [(1, False), (0, False), ("back", True)],
            ],
        )

    def test_functools_partial_of_decorated(self):
        @torch.inference_mode()
        async def scale(t, factor):
            await asyncio.sleep(0)
            return t * factor

        double = functools.partial(scale, factor=2)
        self.assertTrue(inspect.iscoroutinefunction(double))
        out = asyncio.run(double(torch.ones(2)))
        self.assertTrue(out.is_inference())
        self.assertEqual(out.tolist(), [2.0, 2.0])


# ---------------------------------------------------------------------------
# Faults
# ---------------------------------------------------------------------------


def faulty(where, at, log=None):
    """A _DecoratorContextManager whose ``where`` (enter/exit/clone) raises on its
    ``at``-th call."""
    calls = {"n": 0}

    class Faulty(_DecoratorContextManager):
        def _tick(self, name):
            if log is not None:
                log.append(name)
            if name == where:
                calls["n"] += 1
                if calls["n"] == at:
                    raise CMError(name)

        def __enter__(self):
            self._tick("enter")

        def __exit__(self, *exc):
            self._tick("exit")

        def clone(self):
            self._tick("clone")
            return Faulty()

    return Faulty()


# (kind of function, at which call the context manager fails): a plain
# function enters its context only once.
FAULT_CASES = [
    (kind, at)
    for kind in ("plain", "gen", "coro", "agen")
    for at in (1, 2)
    if not (kind == "plain" and at == 2)
]


@skipIfTorchDynamo(_DYNAMO_SKIP)
class TestGradModeFaults(GradModeTestCase):
    @parametrize("caller", list(CALLER_MODES))
    @parametrize(
        "exc_type", [KeyboardInterrupt, SystemExit], name_fn=lambda exc: exc.__name__
    )
    def test_critical_exception_raised_in_body(self, exc_type, caller):
        # Started from *caller*, raising from a plain caller's second step: the
        # body keeps its no_grad and sees the second caller's inference mode,
        # not the first's, as the undecorated body would.
        def body(seen):
            seen.append(autograd_state())
            with torch.enable_grad():
                yield 1
            seen.append(autograd_state())
            try:
                raise exc_type("stop")
            finally:
                seen.append(autograd_state())

        def run(func):
            seen = []
            g = func(seen)
            with enter_all(CALLER_SETUPS[caller]):
                before = autograd_state()
                self.assertEqual(next(g), 1)
                self.assertEqual(autograd_state(), before)
            with self.assertRaises(exc_type):
                next(g)
            self.assertEqual(inspect.getgeneratorstate(g), inspect.GEN_CLOSED)
            return seen, autograd_state()

        decorated, expected = both_ways("no_grad", body, run)
        self.assertEqual(decorated, expected)
        first = state_inside(
            torch.no_grad, caller=CALLER_SETUPS[caller], probe=autograd_state
        )
        no_grad = state_inside(torch.no_grad, probe=autograd_state)
        plain = on_own_thread(autograd_state)
        self.assertEqual(decorated, ([first, no_grad, no_grad], plain))

    @parametrize("caller", list(CALLER_MODES))
    @parametrize(
        "exc_type", [KeyboardInterrupt, SystemExit], name_fn=lambda exc: exc.__name__
    )
    def test_critical_exception_thrown_in(self, exc_type, caller):
        # Started from a plain caller, thrown in from *caller*: the handler
        # sees the body's own grad mode (its enable_grad block) and the
        # thrower's inference mode, as the undecorated body would.
        def gen(seen):
            with torch.enable_grad():
                try:
                    yield 1
                except exc_type:
                    seen.append(("except", autograd_state()))
                    raise
                finally:
                    seen.append(("finally", autograd_state()))

        def run(func):
            seen = []
            g = func(seen)
            next(g)
            err = exc_type("thrown")
            with enter_all(CALLER_SETUPS[caller]):
                before = autograd_state()
                with self.assertRaises(exc_type) as cm:
                    g.throw(err)
                self.assertEqual(autograd_state(), before)
            self.assertIs(cm.exception, err)
            return seen, before

        decorated, expected = both_ways("no_grad", gen, run)
        self.assertEqual(decorated, expected)
        seen, thrower = decorated
        plain = on_own_thread(autograd_state)
        mine = as_carried(GRAD, thrower, plain)
        self.assertEqual(seen, [("except", mine), ("finally", mine)])

    def test_critical_exception_thrown_in_and_caught(self):
        @torch.inference_mode()
        def gen():
            while True:
                try:
                    yield mode_state()
                except KeyboardInterrupt:
                    pass

        g = gen()
        self.assertEqual(next(g), INFERENCE)
        with torch.no_grad():
            self.assertEqual(g.throw(KeyboardInterrupt()), INFERENCE)
            self.assertEqual(mode_state(), NO_GRAD)
        g.close()

    @parametrize("caller", list(CALLER_MODES))
    def test_generator_exit_caught_and_yield(self, caller):
        # A no_grad body closed while suspended inside its own inference
        # block, which reached its closer as undecorated, ignores the close:
        # its handler sees its closer's state (the block's inference mode
        # among it) with its own grad mode, and the closer gets its own back.
        def gen(seen):
            with torch.inference_mode():
                try:
                    yield 1
                except GeneratorExit:
                    seen.append(autograd_state())
                    yield 2
                seen.append(autograd_state())
            yield 3

        def run(func):
            seen = []
            g = func(seen)
            next(g)
            with enter_all(CALLER_SETUPS[caller]):
                closer = autograd_state()
                with self.assertRaisesRegex(RuntimeError, "ignored GeneratorExit"):
                    g.close()
                self.assertEqual(autograd_state(), closer)
            self.assertEqual(inspect.getgeneratorstate(g), inspect.GEN_SUSPENDED)
            self.assertEqual(next(g), 3)
            g.close()
            self.assertEqual(inspect.getgeneratorstate(g), inspect.GEN_CLOSED)
            return seen, closer, autograd_state()

        decorated, expected = both_ways("no_grad", gen, run)
        self.assertEqual(decorated, expected)
        seen, closer, after = decorated
        inside = state_inside(torch.no_grad, torch.inference_mode, probe=autograd_state)
        self.assertEqual(seen[0], as_carried(GRAD, closer, inside))
        self.assertEqual([s[:2] for s in seen], [INFERENCE, INFERENCE])
        self.assertEqual(after, on_own_thread(autograd_state))

    @parametrize("caller", list(CALLER_MODES))
    def test_stop_iteration_in_body_pep479(self, caller):
        def body():
            yield 1
            raise StopIteration("inner")

        outcomes = []
        for fn in (body, torch.no_grad()(body)):
            g = fn()
            next(g)
            with enter_all(CALLER_SETUPS[caller]):
                with self.assertRaises(RuntimeError) as cm:
                    next(g)
                self.assertEqual(mode_state(), CALLER_MODES[caller])
            self.assertIsInstance(cm.exception.__cause__, StopIteration)
            outcomes.append(str(cm.exception))
        self.assertEqual(outcomes[0], outcomes[1])

    def test_stop_iteration_from_next_in_body(self):
        # The classic PEP 479 mistake: next() of an exhausted iterator inside
        # the body.
        @torch.enable_grad()
        def gen():
            it = iter([])
            yield 0
            yield next(it)

        with torch.no_grad():
            g = gen()
            next(g)
            with self.assertRaisesRegex(RuntimeError, "generator raised StopIteration"):
                next(g)
            self.assertEqual(mode_state(), NO_GRAD)

    def test_reentrant_stepping(self):
        holder = []

        @torch.inference_mode()
        def gen():
            with torch.enable_grad():
                try:
                    yield next(holder[0])
                except ValueError as e:
                    yield ("caught", str(e), mode_state())

        g = gen()
        holder.append(g)
        with torch.no_grad():
            tag, msg, state = next(g)
            self.assertEqual(mode_state(), NO_GRAD)
        self.assertEqual(tag, "caught")
        self.assertIn("already executing", msg)
        self.assertEqual(state, INFERENCE_GRAD)
        self.assertEqual(mode_state(), PLAIN)

    def test_reentrant_coroutine_send(self):
        holder = []

        @torch.no_grad()
        async def coro():
            holder[0].send(None)

        c = coro()
        holder.append(c)
        with self.assertRaisesRegex(
            (ValueError, RuntimeError), "already executing|already running"
        ):
            c.send(None)
        self.assertEqual(mode_state(), PLAIN)

    # -- context managers that raise -----------------------------------------

    def _caller_mode_after_fault(self, kind, where, at):
        """Run a function of *kind* decorated with a faulty context manager in each
        caller mode but the plain one; return the outcomes."""
        ctx = faulty(where, at)

        def plain():
            return mode_state()

        def gen():
            yield mode_state()
            yield mode_state()

        async def coro():
            await suspend()
            return mode_state()

        async def agen():
            yield mode_state()
            await suspend()
            yield mode_state()

        async def consume(it):
            return [x async for x in it]

        fn = ctx({"plain": plain, "gen": gen, "coro": coro, "agen": agen}[kind])
        results = []
        for caller, state in list(CALLER_MODES.items())[1:]:
            raised = None
            with enter_all(CALLER_SETUPS[caller]):
                try:
                    if kind == "plain":
                        fn()
                    elif kind == "gen":
                        list(fn())
                    elif kind == "coro":
                        drive(fn())
                    else:
                        drive(consume(fn()))
                except CMError as e:
                    raised = str(e)
                results.append((raised, mode_state() == state))
            self.assertEqual(mode_state(), PLAIN)
        return results

    # A context (not a grad mode: entered around every step of a generator,
    # and, as on stock torch, around only the call of a plain function,
    # coroutine or async generator) whose clone, __enter__ or __exit__ raises:
    # its error propagates and the caller's mode is intact.  A body it leaves
    # suspended is closed when it is collected, as stock torch does with a
    # generator.
    @parametrize("kind,at", FAULT_CASES)
    @parametrize("where", ["enter", "exit", "clone"])
    def test_context_manager_raises(self, where, kind, at):
        results = self._caller_mode_after_fault(kind, where, at)
        # The call that makes the ``at``-th entry raises: a generator's first
        # (it enters at each step), else the ``at``-th, as each call enters
        # once.  Other calls (the counter is before or past ``at``) don't.
        failing = 0 if kind == "gen" else at - 1
        self.assertEqual(results[failing], (where, True))
        for i, (raised, intact) in enumerate(results):
            self.assertTrue(intact)
            if i != failing:
                self.assertIsNone(raised)

    def test_context_manager_raises_on_every_step(self):
        # No step at all can run: the body never starts, the caller's mode is
        # intact.
        class AlwaysFails(_DecoratorContextManager):
            def __enter__(self):
                raise CMError("enter")

            def __exit__(self, *exc):
                pass

        started = []

        @AlwaysFails()
        def gen():
            started.append(1)
            yield 1

        for caller, state in CALLER_MODES.items():
            with enter_all(CALLER_SETUPS[caller]):
                with self.assertRaises(CMError):
                    next(gen())
                self.assertEqual(mode_state(), state)
        self.assertEqual(started, [])

    # -- asyncio cancellation and timeouts -------------------------------------

    # A no_grad body suspended inside its own inference block: the block
    # reaches the other tasks as the undecorated body's does, with their own
    # grad mode, until the cancellation lands in the body, in its state, and
    # the block's exit gives the thread its whole state back.

    @staticmethod
    async def _cancellable(seen):
        seen.append(("start", autograd_state()))
        with torch.inference_mode():
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                seen.append(("except", autograd_state()))
                raise
            finally:
                seen.append(("finally", autograd_state()))
        seen.append(("after", autograd_state()))

    def check_cancelled(self, seen, others):
        no_grad = state_inside(torch.no_grad, probe=autograd_state)
        inside = state_inside(torch.no_grad, torch.inference_mode, probe=autograd_state)
        plain = on_own_thread(autograd_state)
        self.assertEqual(
            seen, [("start", no_grad), ("except", inside), ("finally", inside)]
        )
        during, after = others[:-1], others[-1]
        self.assertEqual(during, [as_carried(GRAD, inside, plain)] * len(during))
        self.assertEqual(after, plain)

    def test_task_cancelled_while_suspended_in_own_block(self):
        def run(func):
            seen, others = [], []

            async def main():
                task = asyncio.ensure_future(func(seen))
                for _ in range(3):
                    await asyncio.sleep(0)
                    others.append(autograd_state())
                task.cancel()
                with self.assertRaises(asyncio.CancelledError):
                    await task
                others.append(autograd_state())

            asyncio.run(main())
            return seen, others

        decorated, expected = both_ways("no_grad", self._cancellable, run)
        self.assertEqual(decorated, expected)
        self.check_cancelled(*decorated)

    def test_wait_for_timeout_while_suspended_in_own_block(self):
        def run(func):
            seen, others = [], []

            async def other(body):
                for _ in range(5):  # by then wait_for's task runs the body
                    await asyncio.sleep(0)
                others.append(autograd_state())
                while not body.done():
                    await asyncio.sleep(0)

            async def main():
                body = asyncio.ensure_future(asyncio.wait_for(func(seen), 0.01))
                await other(body)
                with self.assertRaises(asyncio.TimeoutError):
                    await body
                others.append(autograd_state())

            asyncio.run(main())
            return seen, others

        decorated, expected = both_ways("no_grad", self._cancellable, run)
        self.assertEqual(decorated, expected)
        self.check_cancelled(*decorated)

    def test_async_generator_cancelled_while_suspended_in_own_block(self):
        # An enable_grad async generator suspended in its own inference block:
        # the block reaches the undecorated task that drives the consumer, with
        # that task's own grad mode (no_grad), until the cancellation.
        async def agen(seen):
            with torch.inference_mode():
                yield 1
                try:
                    await asyncio.sleep(30)
                except asyncio.CancelledError:
                    seen.append(("except", autograd_state()))
                    raise
                finally:
                    seen.append(("finally", autograd_state()))

        def run(func):
            seen, main_states = [], []

            async def consume():
                async for _ in func(seen):
                    pass

            async def main():
                # The one undecorated task: its own state is recorded.
                with torch.no_grad():
                    task = asyncio.ensure_future(consume())
                    await asyncio.sleep(0)
                    await asyncio.sleep(0)
                    main_states.append(autograd_state())
                    task.cancel()
                    with self.assertRaises(asyncio.CancelledError):
                        await task
                    main_states.append(autograd_state())

            asyncio.run(main())
            return seen, main_states

        decorated, expected = both_ways("enable_grad", agen, run)
        self.assertEqual(decorated, expected)
        seen, main_states = decorated
        caller = [torch.no_grad]
        inside = state_inside(
            torch.enable_grad, torch.inference_mode, caller=caller, probe=autograd_state
        )
        no_grad = state_inside(torch.no_grad, probe=autograd_state)
        self.assertEqual(seen, [("except", inside), ("finally", inside)])
        self.assertEqual(main_states, [as_carried(GRAD, inside, no_grad), no_grad])

    # -- tracebacks ------------------------------------------------------------

    def test_tracebacks_include_body_frame(self):
        def names(exc):
            return [f.name for f in traceback.extract_tb(exc.__traceback__)]

        @torch.no_grad()
        def distinctive_plain():
            raise CMError("plain")

        @torch.no_grad()
        def distinctive_gen():
            yield 1
            raise CMError("gen")

        @torch.inference_mode()
        async def distinctive_coro():
            await suspend()
            raise CMError("coro")

        @torch.enable_grad()
        async def distinctive_agen():
            yield 1
            await suspend()
            raise CMError("agen")

        def caught(fn, exc_type=CMError):
            # Not assertRaises: it strips the traceback.
            try:
                fn()
            except exc_type as e:
                return e
            self.fail("nothing raised")

        async def consume():
            return [x async for x in distinctive_agen()]

        self.assertIn("distinctive_plain", names(caught(distinctive_plain)))
        self.assertIn("distinctive_gen", names(caught(lambda: list(distinctive_gen()))))
        self.assertIn(
            "distinctive_coro", names(caught(lambda: drive(distinctive_coro())))
        )
        self.assertIn("distinctive_agen", names(caught(lambda: drive(consume()))))

        # Thrown in and re-raised: the body's frame is there too.
        g = distinctive_gen()
        next(g)
        exc = caught(lambda: g.throw(KeyboardInterrupt()), KeyboardInterrupt)
        self.assertIn("distinctive_gen", names(exc))
        # Formatting the traceback (locals included) works.
        formatted = traceback.TracebackException.from_exception(
            exc, capture_locals=True
        ).format()
        self.assertIn("distinctive_gen", "".join(formatted))

    def test_thrown_in_traceback_ends_in_the_body_as_undecorated(self):
        # The wrapper's own frame, where the exception was thrown in, is not
        # the last entry: the body's (or what it awaits) is, as undecorated
        # (found by a user, 2026-12-01).
        def last_frame(exc):
            return list(traceback.walk_tb(exc.__traceback__))[-1][0].f_code.co_name

        def gen():
            yield 1

        async def coro():
            await suspend()

        async def agen():
            yield 1

        def thrown(body, first, throw):
            first(body)
            try:
                throw(body, CMError("thrown"))
            except CMError as e:
                return last_frame(e)
            self.fail("nothing raised")

        kinds = [
            (gen, next, lambda b, e: b.throw(e)),
            (coro, lambda b: b.send(None), lambda b, e: b.throw(e)),
            (
                agen,
                lambda b: drive(b.__anext__()),
                lambda b, e: drive(b.athrow(e)),
            ),
        ]
        for body, first, throw in kinds:
            with self.subTest(kind=body.__name__):
                undecorated = thrown(body(), first, throw)
                self.assertIn(undecorated, (body.__name__, "suspend"))
                decorated = torch.no_grad()(body)
                self.assertEqual(thrown(decorated(), first, throw), undecorated)


# ---------------------------------------------------------------------------
# Threads
# ---------------------------------------------------------------------------


@skipIfTorchDynamo(_DYNAMO_SKIP)
class TestGradModeThreads(GradModeTestCase):
    """A body carries what its decorator carries from thread to thread; the
    rest of its state is the thread's that steps it, as undecorated (a block
    it leaves open is then in the state of the thread it opened it on)."""

    def test_generator_created_in_one_thread_stepped_from_others(self):
        def gen():
            yield autograd_state()
            with torch.inference_mode():
                yield autograd_state()
                yield autograd_state()
            with torch.enable_grad():
                yield autograd_state()
            yield autograd_state()

        callers = [*CALLER_MODES, "plain"]

        def run(func):
            g = on_own_thread(func)
            results = []
            for caller in callers:

                def step(caller=caller):
                    with enter_all(CALLER_SETUPS[caller]):
                        before = autograd_state()
                        return next(g), before, autograd_state()

                results.append(on_own_thread(step))
            with self.assertRaises(StopIteration):
                next(g)
            return results

        decorated, expected = both_ways("no_grad", gen, run)
        self.assertEqual(decorated, expected)
        # The body's own grad mode goes with it from thread to thread, and
        # each stepping thread gets its own back; inference mode is each
        # step's thread's, but for the step that opens the block (the second
        # step's thread keeps it: it reached that thread, as undecorated).
        self.assertEqual(
            [seen[:2] for seen, _, _ in decorated],
            [NO_GRAD, INFERENCE, (False, CALLER_MODES["inference_mode"][1]), PLAIN, NO_GRAD],
        )
        self.assertEqual(
            [after[0] for _, _, after in decorated],
            [before[0] for _, before, _ in decorated],
        )
        self.assertEqual(decorated[1][2][:2], (CALLER_MODES["no_grad"][0], True))

    def test_parked_generator_closed_from_another_thread(self):
        # Parked inside its own inference block on one thread (which the block
        # reached, as undecorated), closed from another: its finally sees the
        # closing thread's state with its own grad mode.
        def gen(seen):
            with torch.inference_mode():
                try:
                    yield 1
                finally:
                    seen.append(autograd_state())

        def run(func):
            seen = []
            g = func(seen)
            next(g)  # parked inside its inference block, on this thread
            parked = autograd_state()

            def close():
                with torch.no_grad():
                    before = autograd_state()
                    g.close()
                    return before, autograd_state()

            return seen, parked, on_own_thread(close)

        decorated, expected = both_ways("no_grad", gen, run)
        self.assertEqual(decorated, expected)
        seen, parked, (before, after) = decorated
        plain = on_own_thread(autograd_state)
        no_grad = state_inside(torch.no_grad, probe=autograd_state)
        inside = state_inside(torch.no_grad, torch.inference_mode, probe=autograd_state)
        self.assertEqual(parked, as_carried(GRAD, inside, plain))
        self.assertEqual(seen, [no_grad])
        self.assertEqual(before[0], after[0])

    def test_many_threads_many_generators(self):
        # Each thread steps generators of its own, each with a decorator that
        # carries grad mode, inference mode or a flag, from random caller
        # states; every thread's trace is the reference's, the caller gets
        # its own back of what each decorator carries, and each body sees
        # what it set itself in the step that set it.
        n_threads, n_steps = 8, 100
        decorators = [
            "no_grad",
            "enable_grad",
            "set_grad_enabled_False",
            "inference_mode",
            "set_multithreading_enabled_False",
        ]
        barrier = threading.Barrier(n_threads)

        def body():
            while True:
                # The decorator's state, then a block the body keeps open
                # across a yield.
                yield "dec", autograd_state()
                with torch.inference_mode():
                    yield "inf", autograd_state()
                with torch.enable_grad():
                    yield "grad", autograd_state()

        def worker(seed, wrap, wait):
            rng = random.Random(seed)
            if wait:
                barrier.wait(30)
            gens = []
            for _ in range(4):
                name = decorators[rng.randrange(len(decorators))]
                gens.append((wrap(name, body)(), name))
            trace = []
            for _ in range(n_steps):
                g, name = rng.choice(gens)
                grad, inf = rng.random() < 0.5, rng.random() < 0.3
                guard = torch._C._InferenceMode(True) if inf else None
                torch._C._set_grad_enabled(grad)
                try:
                    before = autograd_state()
                    tag, state = next(g)
                    after = autograd_state()
                finally:
                    if guard is not None:
                        guard.__exit__(None, None, None)
                    torch._C._set_grad_enabled(True)
                trace.append((name, tag, state, before, after))
            for g, _ in gens:
                g.close()
            return trace

        def decorate(name, func):
            return DECORATORS[name]()(func)

        with concurrent.futures.ThreadPoolExecutor(max_workers=n_threads) as pool:
            futures = [
                pool.submit(worker, seed, decorate, True) for seed in range(n_threads)
            ]
            traces = [future.result(timeout=120) for future in futures]
        for seed, trace in enumerate(traces):
            self.assertEqual(trace, on_own_thread(worker, seed, reference, False))
            for name, tag, state, before, after in trace:
                carry = CARRIES[name]
                self.assertEqual(as_carried(carry, after, before), after)
                own = state_inside(DECORATORS[name], probe=autograd_state)
                if tag == "dec" and carry is not WHOLE:
                    self.assertEqual(as_carried(carry, state, own), state)
                if tag == "inf":
                    self.assertEqual(state[:2], INFERENCE)
                if tag == "grad":
                    self.assertTrue(state[0])
        self.assertEqual(mode_state(), PLAIN)


# ---------------------------------------------------------------------------
# Garbage collection and memory
# ---------------------------------------------------------------------------


@skipIfTorchDynamo(_DYNAMO_SKIP)
class TestGradModeGarbageCollection(GradModeTestCase):
    def setUp(self):
        super().setUp()
        self._gc_was_enabled = gc.isenabled()

    def tearDown(self):
        if self._gc_was_enabled:
            gc.enable()
        super().tearDown()

    def _dropped_in_cycles(self, caller, decorate):
        """Suspend one body of each kind, decorated with *decorate*, drop it in a
        cycle, collect with the collector's caller in *caller*; return what
        each body's finally saw and the collector's state before and after."""
        seen = {}

        def record(key):
            seen[key] = autograd_state()

        def gen(box):
            try:
                yield 1
            finally:
                record("gen")

        def gen_in_block(box):
            with torch.inference_mode():
                try:
                    yield 1
                finally:
                    record("gen_in_block")

        async def coro(box):
            try:
                await suspend()
            finally:
                record("coro")

        async def agen(box):
            try:
                yield 1
            finally:
                record("agen")

        gen, gen_in_block, coro, agen = map(decorate, (gen, gen_in_block, coro, agen))
        gc.collect()
        gc.disable()
        try:
            for fn in (gen, gen_in_block):
                box = []
                g = fn(box)
                box.append(g)  # generator -> frame -> box -> generator
                next(g)
            box = []
            c = coro(box)
            box.append(c)
            c.send(None)
            box = []
            a = agen(box)
            box.append(a)
            with self.assertRaises(StopIteration):
                a.asend(None).send(None)
            del g, c, a, box
            self.assertEqual(seen, {})
            with enter_all(CALLER_SETUPS[caller]):
                before = autograd_state()
                gc.collect()
                after = autograd_state()
        finally:
            gc.enable()
        return seen, before, after

    @parametrize("collector", list(CALLER_MODES))
    def test_dropped_bodies_finalised_in_their_mode(self, collector):
        # Each no_grad body is closed in its own grad mode, whatever its
        # collector's; the rest of the state its finally sees is the thread's,
        # which holds the inference block the gen_in_block body left open (it
        # reached the thread as undecorated), and that block's exit gives the
        # collector back the rest of the state it was opened in.
        decorated = on_own_thread(
            self._dropped_in_cycles, collector, lambda fn: torch.no_grad()(fn)
        )
        expected = on_own_thread(
            self._dropped_in_cycles, collector, lambda fn: reference("no_grad", fn)
        )
        self.assertEqual(decorated, expected)
        seen, before, after = decorated
        self.assertEqual(sorted(seen), ["agen", "coro", "gen", "gen_in_block"])
        self.assertEqual([state[0] for state in seen.values()], [False] * 4)
        self.assertEqual(seen["gen_in_block"][:2], INFERENCE)
        no_grad = state_inside(torch.no_grad, probe=autograd_state)
        self.assertEqual(after, as_carried(GRAD, no_grad, before))

    def _no_cycles(self, loop):
        gc.collect()
        gc.disable()
        try:
            loop()
            found = gc.collect()
        finally:
            gc.enable()
        self.assertEqual(found, 0)

    def test_generator_wrapper_creates_no_cycles(self):
        @torch.no_grad()
        def gen(n):
            for i in range(n):
                try:
                    with torch.inference_mode():
                        yield i
                except CMError:
                    yield -1
            if n == 3:
                raise CMError("out")

        def loop():
            for _ in range(30):
                self.assertEqual(list(gen(2)), [0, 1])
                g = gen(4)
                next(g)
                self.assertEqual(g.throw(CMError()), -1)
                g.close()  # early close
                g = gen(3)
                next(g)
                try:
                    g.throw(ValueError("not caught"))
                except ValueError:
                    pass
                try:
                    list(gen(3))
                except CMError:
                    pass
                g = gen(2)
                next(g)
                del g  # dropped while parked in its inference block

        self._no_cycles(loop)

    def test_async_generator_wrapper_creates_no_cycles(self):
        @torch.no_grad()
        async def agen(n):
            for i in range(n):
                try:
                    with torch.inference_mode():
                        await suspend()
                        yield i
                except CMError:
                    yield -1
            if n == 3:
                raise CMError("out")

        async def consume(n):
            return [x async for x in agen(n)]

        @torch.no_grad()
        async def coro(fail):
            with torch.inference_mode():
                await suspend()
            if fail:
                raise CMError("out")
            return 1

        def loop():
            for _ in range(30):
                self.assertEqual(drive(consume(2)), [0, 1])
                a = agen(4)
                it = a.asend(None)
                it.send(None)
                with self.assertRaises(StopIteration):
                    it.send(None)
                with self.assertRaises(StopIteration) as cm:
                    a.athrow(CMError()).send(None)
                self.assertEqual(cm.exception.value, -1)
                with self.assertRaises(StopIteration):
                    a.aclose().send(None)  # early close
                try:
                    drive(consume(3))
                except CMError:
                    pass
                a = agen(3)
                it = a.asend(None)
                it.send(None)
                with self.assertRaises(StopIteration):
                    it.send(None)
                try:
                    a.athrow(ValueError("not caught")).send(None)
                except ValueError:
                    pass
                self.assertEqual(drive(coro(False)), 1)
                try:
                    drive(coro(True))
                except CMError:
                    pass

        self._no_cycles(loop)

    def test_async_generator_in_a_cycle_is_finalised_in_its_mode(self):
        # An object that owns its own async generator: the body and its
        # wrapper become garbage together, and the collector may finalise the
        # body first.  It must then be closed in its own mode, not directly.
        seen = []

        class Streamer:
            def __init__(self):
                self.it = self.stream()

            @torch.no_grad()
            async def stream(self):
                try:
                    with torch.enable_grad():
                        while True:
                            await asyncio.sleep(0)
                            yield torch.is_grad_enabled()
                finally:
                    seen.append(("finally", torch.is_grad_enabled()))

        errors = []

        async def main():
            asyncio.get_running_loop().set_exception_handler(
                lambda loop, ctx: errors.append(ctx)
            )
            s = Streamer()
            first = await s.it.__anext__()
            del s
            gc.collect()
            after_gc = torch.is_grad_enabled()
            await asyncio.sleep(0.01)
            return first, after_gc, torch.is_grad_enabled()

        self.assertEqual(asyncio.run(main()), (True, True, True))
        # The decorator's mode, outside the block.
        self.assertEqual(seen, [("finally", False)])
        self.assertEqual(errors, [])

    def test_closing_a_suspended_coroutine_closes_its_body_at_once(self):
        seen = []

        @torch.no_grad()
        async def coro():
            try:
                with torch.enable_grad():
                    await suspend()
            finally:
                seen.append(torch.is_grad_enabled())  # the decorator's mode
                raise CMError("from finally")

        c = coro()
        c.send(None)
        with self.assertRaisesRegex(CMError, "from finally"):  # as undecorated
            c.close()
        self.assertEqual(seen, [False])
        self.assertTrue(torch.is_grad_enabled())

    @parametrize("kind", ["generator", "coroutine"])
    def test_wrapper_closed_after_its_body_closes_quietly(self, kind):
        # What the cyclic collector does when it finalises a body before its
        # wrapper: close the body first, then the wrapper.
        @torch.no_grad()
        def gen():
            yield 1
            yield 2

        @torch.no_grad()
        async def coro():
            await suspend()
            await suspend()

        make, start = {
            "generator": (gen, next),
            "coroutine": (coro, lambda c: c.send(None)),
        }[kind]
        wrapper = make()
        start(wrapper)
        # The body object the suspended wrapper steps, whatever its name there.
        driver = getattr(wrapper, "cr_await", None) or wrapper  # an async def awaits it
        frame = driver.gi_frame
        code = make.__wrapped__.__code__
        (body,) = [
            value
            for value in frame.f_locals.values()
            if code
            in (getattr(value, "gi_code", None), getattr(value, "cr_code", None))
        ]
        body.close()
        wrapper.close()  # neither RuntimeError nor a second close of the body
        self.assertTrue(torch.is_grad_enabled())

    def test_reentered_context_wrappers_create_no_cycles(self):
        # A context that is not a grad mode is re-entered at every step: the
        # step frames in a failure's traceback must not keep the body and the
        # thrown exception alive in a cycle.
        class Plain(_DecoratorContextManager):
            def __enter__(self):
                pass

            def __exit__(self, *exc):
                pass

        @Plain()
        def gen():
            yield 1
            raise CMError("out")

        @Plain()
        async def coro():
            await suspend()
            raise CMError("out")

        def loop():
            for _ in range(30):
                g = gen()
                next(g)
                try:
                    g.throw(ValueError("not caught"))
                except ValueError:
                    pass
                try:
                    list(gen())
                except CMError:
                    pass
                c = coro()
                c.send(None)
                try:
                    c.throw(ValueError("not caught"))
                except ValueError:
                    pass
                try:
                    drive(coro())
                except CMError:
                    pass

        self._no_cycles(loop)

    def test_no_growth(self):
        @torch.no_grad()
        def gen():
            with torch.inference_mode():
                yield 1
            yield 2

        @torch.inference_mode()
        async def agen():
            await suspend()
            yield 1

        async def consume():
            return [x async for x in agen()]

        def work(n):
            for _ in range(n):
                list(gen())
                g = gen()
                next(g)
                g.close()
                g = gen()
                next(g)
                try:
                    g.throw(CMError())
                except CMError:
                    pass
                drive(consume())

        work(100)
        gc.collect()
        objects_before = len(gc.get_objects())
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            work(600)
            gc.collect()
            after = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
        objects_after = len(gc.get_objects())
        self.assertLess(objects_after - objects_before, 200)
        self.assertLess(after - before, 200_000)


# ---------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------


def _type_name(value):
    return type(value).__name__


@skipIfTorchDynamo(_DYNAMO_SKIP)
class TestGradModeBadInput(GradModeTestCase):
    @parametrize("bad", [5, None, "text", [1]], name_fn=_type_name)
    def test_decorating_non_callable(self, bad):
        with self.assertRaisesRegex(TypeError, "callable"):
            torch.no_grad()(bad)
        with self.assertRaisesRegex(TypeError, "callable"):
            torch.enable_grad()(bad)
        self.assertEqual(mode_state(), PLAIN)

    def test_decorating_class_warns(self):
        class Model:
            def __init__(self):
                self.state = mode_state()

        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            made = torch.no_grad()(Model)
        self.assertTrue(any(issubclass(x.category, FutureWarning) for x in w))
        obj = made()
        self.assertIsInstance(obj, Model)
        self.assertEqual(obj.state, NO_GRAD)
        self.assertEqual(mode_state(), PLAIN)

    @parametrize("bad", ["yes", None, 1], name_fn=_type_name)
    def test_set_grad_enabled_non_bool(self, bad):
        with self.assertRaisesRegex(TypeError, "enabled.*must be bool"):
            torch.set_grad_enabled(bad)
        self.assertEqual(mode_state(), PLAIN)

    # A non-bool mode such as torch.inference_mode(None) must not be taken for
    # the function of ``@torch.inference_mode`` without parentheses.
    @unittest.skipIf(not TEST_NUMPY, "numpy not found")
    def test_inference_mode_non_bool_names_the_argument(self):
        import numpy as np

        for bad, name in (
            (None, "NoneType"),
            ("yes", "str"),
            (1, "int"),
            (np.True_, "numpy.bool"),
        ):
            with self.assertRaisesRegex(
                TypeError, f"mode must be bool .*, not {name}$"
            ):
                torch.inference_mode(bad)
            self.assertEqual(mode_state(), PLAIN)

    @parametrize("bad", [None, "yes", 1], name_fn=_type_name)
    def test_inference_mode_non_bool_is_refused(self, bad):
        # Whatever the message, no silent object comes back and the mode is
        # untouched.
        with self.assertRaises(TypeError):
            torch.inference_mode(bad)
        self.assertEqual(mode_state(), PLAIN)

    def test_context_decorator_refuses_callable_context_manager(self):
        class Both:
            def __call__(self):
                return self

            def __enter__(self):
                pass

            def __exit__(self, *exc):
                pass

        with self.assertRaisesRegex(AssertionError, "callable"):
            context_decorator(Both(), lambda: 1)

    def test_context_decorator_accepts_factory_and_instance(self):
        log = []

        class CM:
            def __enter__(self):
                log.append("enter")

            def __exit__(self, *exc):
                log.append("exit")

        cm = CM()
        self.assertEqual(context_decorator(lambda: cm, lambda: 1)(), 1)
        self.assertEqual(context_decorator(cm, lambda: 2)(), 2)
        self.assertEqual(log, ["enter", "exit"] * 2)


# ---------------------------------------------------------------------------
# Smaller points of the step driver
# ---------------------------------------------------------------------------


@skipIfTorchDynamo(_DYNAMO_SKIP)
class TestGradModeDriverDetails(GradModeTestCase):
    @parametrize("kind", ["gen", "coro", "agen"])
    @parametrize("caller", list(CALLER_MODES))
    def test_neutral_context_manager_body_starts_in_caller_mode(self, caller, kind):
        # A context manager that is not a grad mode changes nothing of the
        # autograd state: every step of the body sees its caller's mode,
        # whatever that is (see TestGradModeScopeMatrix for callers that change
        # their mode between steps).
        class Neutral(_DecoratorContextManager):
            def __enter__(self):
                pass

            def __exit__(self, *exc):
                pass

        seen = []

        @Neutral()
        def gen():
            seen.append(mode_state())
            yield
            seen.append(mode_state())

        @Neutral()
        async def coro():
            seen.append(mode_state())
            await suspend()
            seen.append(mode_state())

        @Neutral()
        async def agen():
            seen.append(mode_state())
            await suspend()
            yield
            seen.append(mode_state())

        async def consume():
            return [x async for x in agen()]

        runs = {
            "gen": lambda: list(gen()),
            "coro": lambda: drive(coro()),
            "agen": lambda: drive(consume()),
        }
        state = CALLER_MODES[caller]
        with enter_all(CALLER_SETUPS[caller]):
            runs[kind]()
            self.assertEqual(mode_state(), state)
        self.assertEqual(seen, [state, state])

    def test_send_values_and_return_value(self):
        @torch.no_grad()
        def gen():
            got = []
            while len(got) < 3:
                got.append((yield len(got)))
            return got

        g = gen()
        self.assertEqual(next(g), 0)
        self.assertEqual(g.send("a"), 1)
        self.assertEqual(g.send("b"), 2)
        with self.assertRaises(StopIteration) as cm:
            g.send("c")
        self.assertEqual(cm.exception.value, ["a", "b", "c"])

    def test_kinds_preserved(self):
        def gen():
            yield

        async def coro():
            pass

        async def agen():
            yield

        @types.coroutine
        def old_style():
            yield

        dec = torch.no_grad()
        self.assertTrue(inspect.isgeneratorfunction(dec(gen)))
        self.assertTrue(inspect.iscoroutinefunction(dec(coro)))
        self.assertTrue(inspect.isasyncgenfunction(dec(agen)))
        self.assertTrue(
            dec(old_style)().gi_code.co_flags & inspect.CO_ITERABLE_COROUTINE
        )
        # ... and only those: an ordinary generator must not become awaitable.
        self.assertFalse(inspect.isawaitable(dec(gen)()))
        self.assertTrue(inspect.isawaitable(dec(old_style)()))

        @torch.no_grad()
        async def awaits_old_style():
            await dec(old_style)()
            return mode_state()

        self.assertEqual(drive(awaits_old_style()), NO_GRAD)

    def test_set_grad_enabled_repr(self):
        prev = torch.is_grad_enabled()
        try:
            cm = torch.set_grad_enabled(False)
        finally:
            torch._C._set_grad_enabled(prev)
        self.assertEqual(
            repr(cm), "torch.autograd.grad_mode.set_grad_enabled(mode=False)"
        )
        self.assertEqual(str(cm), repr(cm))

    def test_coroutine_function_returning_other_awaitable(self):
        class Awaitable:
            def __await__(self):
                got = yield "step"
                return got, mode_state()

        def marked():
            return Awaitable()

        if hasattr(inspect, "markcoroutinefunction"):
            marked = inspect.markcoroutinefunction(marked)
        else:
            # Before Python 3.12: look like a coroutine function to inspect, as
            # unittest.mock.AsyncMock does, with a coroutine's code object.
            async def code():
                pass

            class Marked:
                __code__ = code.__code__
                __name__ = "marked"
                __defaults__ = __kwdefaults__ = None
                __annotations__ = {}

                def __call__(self):
                    return Awaitable()

            marked = Marked()
            self.assertTrue(inspect.iscoroutinefunction(marked))
        wrapped = torch.no_grad()(marked)
        self.assertTrue(inspect.iscoroutinefunction(wrapped))
        c = wrapped()
        self.assertEqual(c.send(None), "step")
        with self.assertRaises(StopIteration) as cm:
            c.send("value")
        self.assertEqual(cm.exception.value, ("value", NO_GRAD))

    def test_static_and_class_methods_keep_kind(self):
        class M:
            @torch.no_grad()
            @staticmethod
            def s():
                return mode_state()

            @torch.inference_mode()
            @classmethod
            def c(cls):
                return cls, mode_state()

        self.assertIsInstance(M.__dict__["s"], staticmethod)
        self.assertIsInstance(M.__dict__["c"], classmethod)
        self.assertEqual(M.s(), NO_GRAD)
        self.assertEqual(M.c(), (M, INFERENCE))

    def test_body_starts_in_caller_inference_state(self):
        # set_grad_enabled sets, and so carries, only grad mode: the body
        # starts in its first caller's inference mode and sees each later
        # caller's, as undecorated, with the grad mode it keeps.
        def gen(seen):
            seen.append(autograd_state())
            yield
            seen.append(autograd_state())
            yield
            seen.append(autograd_state())

        def run(func):
            seen = []
            g = func(seen)
            with torch.inference_mode():
                next(g)
            next(g)
            with torch.no_grad():
                with self.assertRaises(StopIteration):
                    next(g)
                after = autograd_state()
            return seen, after

        decorated, expected = both_ways("set_grad_enabled_True", gen, run)
        self.assertEqual(decorated, expected)
        seen, after = decorated
        self.assertEqual([state[:2] for state in seen], [INFERENCE_GRAD, PLAIN, PLAIN])
        self.assertEqual(after, state_inside(torch.no_grad, probe=autograd_state))

    @parametrize("caller", list(CALLER_MODES))
    @parametrize("first", list(CALLER_MODES))
    def test_body_changes_persist_in_every_caller_mode(self, first, caller):
        # A no_grad body's own grad-mode changes, by call and by block, persist
        # across its yields whatever its callers; its inference mode is its
        # caller's (the first's, then the later one's) outside its own
        # inference blocks, and its own inside them.
        def gen():
            yield autograd_state()
            torch.set_grad_enabled(True)
            yield autograd_state()
            with torch.inference_mode():
                yield autograd_state()
                with torch.inference_mode(False):
                    yield autograd_state()
                yield autograd_state()
            yield autograd_state()

        def run(func):
            with enter_all(CALLER_SETUPS[first]):
                g = func()
                got = [next(g)]
            with enter_all(CALLER_SETUPS[caller]):
                before = autograd_state()
                got += list(g)
                self.assertEqual(autograd_state(), before)
            return got

        decorated, expected = both_ways("no_grad", gen, run)
        self.assertEqual(decorated, expected)
        want = [NO_GRAD, PLAIN, INFERENCE, PLAIN, INFERENCE, PLAIN]
        got = [state[:2] for state in decorated]
        inf_first, inf_caller = CALLER_MODES[first][1], CALLER_MODES[caller][1]
        self.assertEqual(got[:2], [(want[0][0], inf_first), (want[1][0], inf_caller)])
        self.assertEqual(got[2:5], want[2:5])
        self.assertEqual(got[5], (True, inf_caller))

    @parametrize(
        "declared",
        [
            "by_the_class",
            "inherited",
            "overriding_init",
            "overriding_clone",
            "overridden",
            "redeclared",
        ],
    )
    def test_carried_state_is_read_from_the_defining_class(self, declared):
        # A class declares with _carried_state the thread state its __enter__
        # and __exit__ set; the declaration is read from the class that
        # defines them or clone, so a subclass that overrides only __init__
        # carries its parent's.  Carried: entered once, to start the body's
        # state, which the body keeps across yields.  Not carried (a subclass
        # that overrides clone or __enter__ without declaring it again): entered around
        # every step, which overrides the body's own block from the second
        # step on, as stock torch does for generators.
        carried = (
            torch._C._get_autograd_mode_state,
            torch._C._swap_autograd_mode_state,
        )
        log = []

        class Once(_DecoratorContextManager):
            _carried_state = carried

            def __enter__(self):
                log.append("enter")
                self.prev = torch.is_grad_enabled()
                torch._C._set_grad_enabled(False)

            def __exit__(self, *exc):
                log.append("exit")
                torch._C._set_grad_enabled(self.prev)

        class Inherited(Once):
            pass  # the same __enter__ and __exit__: carried too

        class OverridingInit(Once):
            def __init__(self):  # makes its contexts otherwise: carried still
                super().__init__()
                self.made = True

        class OverridingClone(Once):
            def clone(self):
                log.append("clone")
                return OverridingClone()

        class Overridden(Once):
            def __enter__(self):
                super().__enter__()

        class Redeclared(Overridden):
            _carried_state = carried

            def __exit__(self, *exc):
                super().__exit__(*exc)

        cls, want_log, want_seen = {
            "by_the_class": (Once, ["enter", "exit"], [False, True, True]),
            "inherited": (Inherited, ["enter", "exit"], [False, True, True]),
            "overriding_init": (OverridingInit, ["enter", "exit"], [False, True, True]),
            "overriding_clone": (
                OverridingClone,
                ["clone", "enter", "exit"] * 4,
                [False, True, False],
            ),
            "overridden": (Overridden, ["enter", "exit"] * 4, [False, True, False]),
            "redeclared": (Redeclared, ["enter", "exit"], [False, True, True]),
        }[declared]

        @cls()
        def gen():
            yield torch.is_grad_enabled()
            with torch.enable_grad():
                yield torch.is_grad_enabled()
                yield torch.is_grad_enabled()

        seen = []
        for value in gen():
            seen.append(value)
            self.assertTrue(torch.is_grad_enabled())
        self.assertEqual(seen, want_seen)
        self.assertEqual(log, want_log)

    @parametrize("spelling", ["set_grad_enabled", "inference_mode"])
    def test_plain_call_reads_the_instance_at_each_call(self, spelling):
        # As stock torch, which enters a clone of the instance at each call:
        # a decorated plain function runs in the mode the instance has when
        # it is called, not the one it had when it decorated.
        if spelling == "set_grad_enabled":
            ctx, probe = torch.set_grad_enabled(False), torch.is_grad_enabled
            torch._C._set_grad_enabled(True)  # the constructor's function form
        else:
            ctx, probe = torch.inference_mode(True), torch.is_inference_mode_enabled

        @ctx
        def plain():
            return probe()

        first = plain()
        ctx.mode = not ctx.mode
        self.assertEqual([first, plain()], [not ctx.mode, ctx.mode])
        self.assertEqual(mode_state(), PLAIN)

    @parametrize("overriding", ["__init__", "clone"])
    def test_subclass_making_its_contexts_otherwise(self, overriding):
        # A subclass of no_grad that overrides __init__ still carries grad mode
        # in a generator body (its own block persists across yields); one that
        # overrides clone (which may make more) enters a clone at each step.
        # Their plain calls enter a clone, as stock torch does, rather than
        # take no_grad's direct path.
        log = []
        if overriding == "__init__":

            class Sub(torch.no_grad):
                def __init__(self):
                    log.append("init")
                    super().__init__()

        else:

            class Sub(torch.no_grad):
                def clone(self):
                    log.append("clone")
                    return Sub()

        ctx = Sub()
        log.clear()

        @ctx
        def plain():
            return torch.is_grad_enabled()

        @ctx
        def gen():
            with torch.enable_grad():
                yield torch.is_grad_enabled()
                yield torch.is_grad_enabled()
            yield torch.is_grad_enabled()

        made = "init" if overriding == "__init__" else "clone"
        self.assertEqual([plain(), plain()], [False, False])
        self.assertEqual(log, [made, made])
        log.clear()
        if overriding == "__init__":
            self.assertEqual(list(gen()), [True, True, False])
            self.assertEqual(log, [made])
        else:
            self.assertEqual(list(gen()), [True, False, False])
            self.assertEqual(log, [made] * 4)
        self.assertEqual(mode_state(), PLAIN)

    @parametrize("kind", ["generator", "coroutine", "async_generator"])
    def test_private_wrappers_reenter_by_default(self, kind):
        # _wrap_generator(ctx_factory, func) enters a fresh context around
        # every step.  Called without the carried state (as context_decorator
        # calls it for a context that is not a grad mode), it re-enters: that
        # is the default, as on stock torch.  The async wrappers only carry
        # state: for such a context context_decorator wraps a coroutine or
        # async generator function as stock does, in a plain function that
        # enters the context once, around the call that makes the body, and
        # never around its steps.
        from torch.utils._contextlib import _wrap_generator, context_decorator

        log = []

        class Counting:
            def __enter__(self):
                log.append("enter")

            def __exit__(self, *exc):
                log.append("exit")

        def gen():
            yield 1
            yield 2

        async def coro():
            await suspend()
            await suspend()
            return 3

        async def agen():
            await suspend()
            yield 4

        async def consume(it):
            return [v async for v in it]

        cases = {
            "generator": (lambda: list(_wrap_generator(Counting, gen)()), [1, 2]),
            "coroutine": (
                lambda: drive(context_decorator(lambda: Counting(), coro)()),
                3,
            ),
            "async_generator": (
                lambda: drive(consume(context_decorator(lambda: Counting(), agen)())),
                [4],
            ),
        }
        run, result = cases[kind]
        self.assertEqual(run(), result)
        entries = 3 if kind == "generator" else 1
        self.assertEqual(log, ["enter", "exit"] * entries)

    @parametrize("cls_name", ["CountedNoGrad", "Sub"])
    def test_no_param_subclass_keeps_cooperative_new(self, cls_name):
        # A base with its own __new__ later in the MRO of a subclass of
        # no_grad (a _NoParamDecoratorContextManager) must still be called, by
        # the subclass and by its own subclasses, in a block and as a bare
        # decorator; and a base's __init_subclass__ still runs.
        made = []
        subclassed = []

        class Counted:
            def __new__(cls, *args, **kwargs):
                made.append(cls.__name__)
                return super().__new__(cls)

            def __init_subclass__(cls, **kwargs):
                super().__init_subclass__(**kwargs)
                subclassed.append(cls.__name__)

        class CountedNoGrad(torch.no_grad, Counted):
            pass

        class Sub(CountedNoGrad):
            pass

        self.assertEqual(subclassed, ["CountedNoGrad", "Sub"])
        cls = {"CountedNoGrad": CountedNoGrad, "Sub": Sub}[cls_name]
        with cls():
            self.assertFalse(torch.is_grad_enabled())
        self.assertEqual(made, [cls.__name__])
        self.assertIsInstance(cls(), cls)

        @cls
        def plain():
            return torch.is_grad_enabled()

        self.assertFalse(plain())
        self.assertTrue(torch.is_grad_enabled())
        # Classes without such a base are unaffected.
        made.clear()
        with torch.no_grad(), torch.enable_grad():
            pass
        self.assertEqual(made, [])


# ---------------------------------------------------------------------------
# The other context managers of torch.autograd.grad_mode
# ---------------------------------------------------------------------------

# The thread-local switches besides grad and inference mode: (class, query,
# default).
SWITCHES = {
    "set_multithreading_enabled": (
        torch.autograd.set_multithreading_enabled,
        torch._C._is_multithreading_enabled,
        True,
    ),
    "enforce_grad_layout_policy": (
        torch.autograd.grad_mode.enforce_grad_layout_policy,
        torch._C._is_grad_layout_enforcement_enabled,
        True,
    ),
    "_force_original_view_tracking": (
        torch.autograd.grad_mode._force_original_view_tracking,
        torch._C._is_view_replay_enabled,
        False,
    ),
}


@skipIfTorchDynamo(_DYNAMO_SKIP)
class TestGradModeOtherContextManagers(GradModeTestCase):
    """The other switches, as function, block and decorator."""

    @parametrize("switch", list(SWITCHES))
    def test_block_and_decorator(self, switch):
        cls, query, default = SWITCHES[switch]
        self.assertEqual(query(), default)
        with cls(not default):
            self.assertEqual(query(), not default)
        self.assertEqual(query(), default)

        @cls(not default)
        def plain():
            return query()

        # The decorator line itself leaves the setting alone (see
        # test_set_multithreading_enabled_decorator_line).
        self.assertEqual(query(), default)
        self.assertEqual([plain(), plain()], [not default] * 2)
        self.assertEqual(query(), default)

        @cls(not default)
        def gen():
            yield query()
            yield query()

        self.assertEqual(query(), default)
        self.assertEqual(list(gen()), [not default] * 2)
        self.assertEqual(query(), default)
        self.assertEqual(mode_state(), PLAIN)

    # Stock set_multithreading_enabled, unlike set_grad_enabled,
    # enforce_grad_layout_policy and _force_original_view_tracking, has no
    # __call__ that undoes what its constructor did, so that
    # ``@torch.autograd.set_multithreading_enabled(False)`` on a function
    # turned multithreaded backward off for the whole thread from the
    # decorator line on.  The patch gives it the others' __call__: the
    # decorator line leaves the setting alone.
    def test_set_multithreading_enabled_decorator_line(self):
        try:

            @torch.autograd.set_multithreading_enabled(False)
            def plain():
                return torch._C._is_multithreading_enabled()

            self.assertTrue(torch._C._is_multithreading_enabled())
            self.assertFalse(plain())
        finally:
            torch._C._set_multithreading_enabled(True)

    def test_inference_mode_object_kept_alive(self):
        # The guard must be exited at the end of the block, not when the
        # inference_mode object happens to be freed.
        cm = torch.inference_mode()
        for _ in range(2):
            with cm:
                self.assertTrue(torch.is_inference_mode_enabled())
            self.assertFalse(torch.is_inference_mode_enabled())
            self.assertEqual(mode_state(), PLAIN)

    def test_enforce_grad_layout_policy_default(self):
        # Without an argument it enforces the layout contract (enable=True).
        from torch.autograd.grad_mode import enforce_grad_layout_policy

        query = torch._C._is_grad_layout_enforcement_enabled
        with enforce_grad_layout_policy(False):
            with enforce_grad_layout_policy():
                self.assertTrue(query())
            self.assertFalse(query())
        self.assertTrue(query())

    @parametrize("switch", ["_force_original_view_tracking", "set_grad_enabled"])
    def test_one_object_entered_twice(self, switch):
        # The constructor switches the setting (the function form), __exit__
        # puts the old value back, and a second ``with`` on the same object
        # switches it again: __enter__ applies the mode too.
        # (set_multithreading_enabled and enforce_grad_layout_policy apply it
        # only in the constructor, so they are not reusable.)
        if switch == "set_grad_enabled":
            cls, query, default = torch.set_grad_enabled, torch.is_grad_enabled, True
        else:
            cls, query, default = SWITCHES[switch]
        cm = cls(not default)
        for _ in range(2):
            with cm:
                self.assertEqual(query(), not default)
            self.assertEqual(query(), default)

    @parametrize("switch", list(SWITCHES))
    def test_function_form(self, switch):
        cls, query, default = SWITCHES[switch]
        cm = cls(not default)
        try:
            self.assertEqual(query(), not default)
        finally:
            cm.__exit__(None, None, None)
        self.assertEqual(query(), default)

    def test_unsafe_preserve_version_counter(self):
        from torch.autograd.grad_mode import _unsafe_preserve_version_counter

        a, b = torch.zeros(2), torch.zeros(2)
        versions = (a._version, b._version)
        for tensors in (a, (a, b)):
            with _unsafe_preserve_version_counter(tensors):
                a.add_(1)
                b.add_(1)
                self.assertNotEqual((a._version, b._version), versions)
            restored = (a._version, b._version)
            self.assertEqual(restored[0], versions[0])
            self.assertEqual(
                restored[1], versions[1] if isinstance(tensors, tuple) else restored[1]
            )
            versions = (a._version, b._version)

        # Not usable as a decorator (it has no clone() for its argument).
        with self.assertRaises(AssertionError):
            _unsafe_preserve_version_counter([a])

    def test_enter_and_exit_inference_mode_helpers(self):
        # Private helpers torch.compile's generated code calls.
        from torch.autograd.grad_mode import _enter_inference_mode, _exit_inference_mode

        guard = _enter_inference_mode(True)
        self.assertIsNotNone(guard)
        self.assertEqual(mode_state(), INFERENCE)
        _exit_inference_mode(guard)
        self.assertEqual(mode_state(), PLAIN)

    def test_base_class_is_abstract(self):
        cm = _DecoratorContextManager()
        with self.assertRaises(NotImplementedError):
            cm.__enter__()
        with self.assertRaises(NotImplementedError):
            cm.__exit__(None, None, None)
        self.assertIsInstance(cm.clone(), _DecoratorContextManager)

    def test_context_decorator_refuses_class(self):
        class Model:
            pass

        with self.assertRaisesRegex(RuntimeError, "[Cc]annot decorate classes"):
            context_decorator(lambda: torch.no_grad(), Model)


# ---------------------------------------------------------------------------
# Scope: contexts that are not grad modes
# ---------------------------------------------------------------------------


class _PlainContext(_DecoratorContextManager):
    """A third-party _DecoratorContextManager subclass that sets nothing."""

    def __enter__(self):
        pass

    def __exit__(self, *exc):
        pass


class _PlainManager:
    """A context manager that sets nothing, for context_decorator's factory."""

    def __enter__(self):
        pass

    def __exit__(self, *exc):
        pass


class _NoGradOverridingEnter(torch.no_grad):
    """A subclass of no_grad that overrides __enter__ (and does not declare the
    state it carries): no longer a grad mode."""

    def __enter__(self):
        super().__enter__()


def _current_stance():
    return torch._dynamo.eval_frame._stance.stance


class _ScopeContext(NamedTuple):
    decorator: Callable  # makes what goes after the ``@``
    fresh: Callable  # makes a context as the decoration enters at each step
    cls: Callable  # gives the class of those contexts
    probe: Callable  # shows whether such a context is in force


def _set_stance_class():
    return torch._dynamo.decorators.set_stance


# Every kind of context that is not a grad mode.
SCOPE_CONTEXTS = {
    "set_stance": _ScopeContext(
        lambda: torch.compiler.set_stance("force_eager"),
        lambda: _set_stance_class()("force_eager"),
        _set_stance_class,
        _current_stance,
    ),
    "dual_level": _ScopeContext(
        fwAD.dual_level,
        fwAD.dual_level,
        lambda: fwAD.dual_level,
        lambda: fwAD._current_level,
    ),
    "decorator_context_manager": _ScopeContext(
        _PlainContext, _PlainContext, lambda: _PlainContext, lambda: None
    ),
    "context_decorator_factory": _ScopeContext(
        lambda: functools.partial(context_decorator, lambda: _PlainManager()),
        _PlainManager,
        lambda: _PlainManager,
        lambda: None,
    ),
    "no_grad_subclass_overriding_enter": _ScopeContext(
        _NoGradOverridingEnter,
        _NoGradOverridingEnter,
        lambda: _NoGradOverridingEnter,
        torch.is_grad_enabled,
    ),
}

SCOPE_KINDS = ("generator", "coroutine", "async_generator")
# The caller is in each of these in turn, one per step of the body.
SCOPE_CALLERS = list(CALLER_SETUPS.values())


class _EntrySpy:
    """Records every entry and exit of an object of *cls* while installed, and
    how many are in force."""

    def __init__(self, cls):
        self.cls = cls
        self.log = []
        self.active = 0

    @contextlib.contextmanager
    def installed(self):
        enter, leave = self.cls.__enter__, self.cls.__exit__

        def spy_enter(ctx):
            self.log.append(("enter", ctx))
            self.active += 1
            return enter(ctx)

        def spy_exit(ctx, *exc):
            self.log.append(("exit", ctx))
            self.active -= 1
            return leave(ctx, *exc)

        with mock.patch.object(self.cls, "__enter__", spy_enter):
            with mock.patch.object(self.cls, "__exit__", spy_exit):
                yield self


def _scope_body(kind, block, observe, log):
    """An undecorated body of *kind* that opens ``block()`` in its first step,
    closes it in its last, and logs ``observe()`` once at the start of every
    step: one step per caller in SCOPE_CALLERS.  The async generator's steps
    end at an ``await`` and at a ``yield`` in turn."""
    suspensions = len(SCOPE_CALLERS) - 1
    if kind == "generator":

        def body():
            with block():
                for _ in range(suspensions):
                    log.append(observe())
                    yield
                log.append(observe())

    elif kind == "coroutine":

        async def body():
            with block():
                for _ in range(suspensions):
                    log.append(observe())
                    await suspend()
                log.append(observe())

    else:

        async def body():
            with block():
                for i in range(suspensions):
                    log.append(observe())
                    if i % 2:
                        yield i
                    else:
                        await suspend()
                log.append(observe())

    return body


def _step(kind, made, pending):
    """Take one step of *made*, a body of *kind*; False once it has finished.
    *pending* holds an async generator's ``asend`` awaitable in progress."""
    try:
        if kind == "generator":
            next(made)
        elif kind == "coroutine":
            made.send(None)
        else:
            if not pending:
                pending.append(made.asend(None))
            try:
                pending[0].send(None)
            except StopIteration:
                pending.clear()  # the body yielded: the item is done
    except (StopIteration, StopAsyncIteration):
        return False
    return True


def _run_scope(kind, context, block, decorated):
    """On a fresh thread, run a body of *kind* that opens ``BLOCKS[block]`` (or
    nothing if *block* is None), one step per caller of SCOPE_CALLERS, each
    step inside that caller's setup: *decorated* with *context*, or else
    undecorated, with a fresh context entered as stock torch's decoration
    enters it (what the decoration must amount to): around each step of a
    generator, and around only the call that makes a coroutine or async
    generator, as stock's plain-function wrapper does.

    Returns what the body saw at each step, what the caller saw right after
    each step, the context entries and exits in order (each context named by
    the order of its first entry), and whether every entry was of a new
    object, never of the decorator's own."""
    spec = SCOPE_CONTEXTS[context]

    def run():
        spy = _EntrySpy(spec.cls())

        def observe():
            return autograd_state(), spy.active, spec.probe()

        with spy.installed():
            seen, between = [], []
            body = _scope_body(
                kind, BLOCKS.get(block, contextlib.nullcontext), observe, seen
            )
            if decorated:
                decorator = spec.decorator()
                made, around = decorator(body)(), contextlib.nullcontext
            elif kind == "generator":
                decorator = None
                made, around = body(), spec.fresh
            else:
                decorator = None
                with spec.fresh():
                    made = body()
                around = contextlib.nullcontext
            pending = []
            for setup in itertools.cycle(SCOPE_CALLERS):
                with enter_all(setup):
                    with around():
                        running = _step(kind, made, pending)
                    between.append(observe())
                if not running:
                    break
        entered = [ctx for what, ctx in spy.log if what == "enter"]
        fresh = len({id(ctx) for ctx in entered}) == len(entered) and all(
            ctx is not decorator for ctx in entered
        )
        order = [(what, entered.index(ctx)) for what, ctx in spy.log]
        return seen, between, order, fresh

    return on_own_thread(run)


@skipIfTorchDynamo(_DYNAMO_SKIP)
class TestGradModeScopeMatrix(GradModeTestCase):
    """A context that carries nothing (not a grad mode, or a subclass of one
    that overrides __enter__ or __exit__ without declaring _carried_state):
    the body of a generator, coroutine or async generator it decorates sees
    at every step the autograd state the thread has, as undecorated.  As on
    stock torch, the context is entered afresh around each step of a
    generator, and around only the call that makes a coroutine or async
    generator, never around its steps."""

    def test_issue_example(self):
        def body():
            while True:
                yield torch.is_grad_enabled()

        g = torch.compiler.set_stance("force_eager")(body)()
        self.assertTrue(next(g))
        with torch.no_grad():
            self.assertFalse(next(g))
        self.assertTrue(next(g))
        g.close()

    @parametrize("kind", SCOPE_KINDS)
    @parametrize("context", list(SCOPE_CONTEXTS))
    def test_body_sees_each_callers_state(self, context, kind):
        # The body opens nothing itself.  Each step sees the state of the
        # caller that takes it, with the context entered for a generator's
        # (not for a coroutine's or async generator's: entered around the
        # call only), and the caller has its own back after it: worked out
        # for each step alone, on a thread of its own, so that nothing of an
        # earlier step can carry over.
        spec = SCOPE_CONTEXTS[context]
        per_step = kind == "generator"

        def alone(setup):
            def run():
                spy = _EntrySpy(spec.cls())

                def observe():
                    return autograd_state(), spy.active, spec.probe()

                with spy.installed(), enter_all(setup):
                    with spec.fresh() if per_step else contextlib.nullcontext():
                        inside = observe()
                    return inside, observe()

            return on_own_thread(run)

        expected = [alone(setup) for setup in SCOPE_CALLERS]
        seen, between, order, fresh = _run_scope(kind, context, None, decorated=True)
        self.assertEqual(seen, [inside for inside, _ in expected])
        self.assertEqual(between, [outside for _, outside in expected])
        # Entered afresh around each step of a generator, and only then; once,
        # around the call, for a coroutine or async generator.
        steps = len(SCOPE_CALLERS)
        entries = steps if per_step else 1
        self.assertEqual(
            order, [(what, n) for n in range(entries) for what in ("enter", "exit")]
        )
        self.assertTrue(fresh)
        # The grad mode a step sees is its caller's (set_grad_enabled's False
        # for the no_grad subclass entered around a generator's steps).
        grad = [state[0] for state, _, _ in seen]
        if context == "no_grad_subclass_overriding_enter" and per_step:
            self.assertEqual(grad, [False] * steps)
        else:
            self.assertEqual(grad, [outside[0][0] for _, outside in expected])
            self.assertIn(False, grad)
            self.assertIn(True, grad)

    @parametrize("kind", SCOPE_KINDS)
    @parametrize("context", list(SCOPE_CONTEXTS))
    @parametrize("block", list(BLOCKS))
    def test_body_block_is_the_threads(self, block, context, kind):
        # The body's own mode block, open across its suspensions, is not
        # carried for it: body and caller see what they would with the body
        # undecorated and a fresh context entered as stock torch enters it
        # (around each step of a generator, around the call that makes a
        # coroutine or async generator).
        decorated = _run_scope(kind, context, block, decorated=True)
        reference = _run_scope(kind, context, block, decorated=False)
        self.assertEqual(decorated, reference)
        self.assertTrue(decorated[3])

    @parametrize("kind", ["generator", "coroutine"])
    def test_close_exits_the_context_with_no_exception(self, kind):
        # Closing a generator decorated with a context that carries nothing
        # closes the body with close() inside a fresh context, as stock torch
        # does: the body gets GeneratorExit, the context's __exit__ gets
        # (None, None, None).  A coroutine's context, as on stock, is entered
        # and left (with no exception) around the call only: its close runs
        # outside any.
        log = []

        class Logging(_DecoratorContextManager):
            def __enter__(self):
                log.append("enter")

            def __exit__(self, *exc_info):
                log.append(("exit", exc_info))

        def record_exit():
            log.append("GeneratorExit")

        @Logging()
        def gen():
            try:
                yield 1
            except GeneratorExit:
                record_exit()
                raise

        @Logging()
        async def coro():
            try:
                await suspend()
            except GeneratorExit:
                record_exit()
                raise

        body = {"generator": gen, "coroutine": coro}[kind]()
        body.send(None)
        body.close()
        clean = ("exit", (None, None, None))
        if kind == "generator":
            expected = ["enter", clean, "enter", "GeneratorExit", clean]
        else:
            expected = ["enter", clean, "GeneratorExit"]
        self.assertEqual(log, expected)


instantiate_parametrized_tests(TestGradModeGenerators)
instantiate_parametrized_tests(TestGradModeBodyContinuity)
instantiate_parametrized_tests(TestGradModeCallerIsolation)
instantiate_parametrized_tests(TestGradModeGeneratorProtocol)
instantiate_parametrized_tests(TestGradModeAsyncCoroutines)
instantiate_parametrized_tests(TestGradModeAsyncGenerators)
instantiate_parametrized_tests(TestGradModeAsyncTaskIsolation)
instantiate_parametrized_tests(TestGradModeAsyncCancellation)
instantiate_parametrized_tests(TestGradModeAsyncProtocol)
instantiate_parametrized_tests(TestGradModeFaults)
instantiate_parametrized_tests(TestGradModeGarbageCollection)
instantiate_parametrized_tests(TestGradModeBadInput)
instantiate_parametrized_tests(TestGradModeDriverDetails)
instantiate_parametrized_tests(TestGradModeOtherContextManagers)
instantiate_parametrized_tests(TestGradModeScopeMatrix)


if __name__ == "__main__":
    run_tests()
