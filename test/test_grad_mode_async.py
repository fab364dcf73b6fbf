# Owner(s): ["module: autograd"]
"""Grad-mode decorators on ``async def`` coroutines and async generators.

The generator half of the contract is tested in ``test_autograd.py``; this file
tests the async half.  A decorated coroutine or async generator's body sees at
every point the grad-mode state it would see if it ran uninterrupted inside
``with <decorator>:`` on a thread of its own that starts in the caller's state
at the body's first entry, and every other task on the event loop sees, after
each of its own awaits, only the mode it set itself.

* ``TestGradModeAsyncCoroutines`` -- the issue example, for every decorator;
* ``TestGradModeAsyncGenerators`` -- every step, asend/athrow/aclose and loop finalisation;
* ``TestGradModeAsyncTaskIsolation`` -- concurrent tasks each keep their own mode;
* ``TestGradModeAsyncCancellation`` -- cancellation and timeouts land in the body's mode;
* ``TestGradModeAsyncProtocol`` -- everything but the mode is as undecorated;
* ``TestGradModeAsyncProperty`` -- random programs, decorated on this thread's event loop
  among noise tasks vs undecorated on a thread and event loop of their own;
* ``TestGradModeAnyio`` -- the same under anyio, on its asyncio and trio backends.

Only one *undecorated* task may change the mode and keep it across an await:
grad mode is thread state, so two undecorated tasks that both do would see each
other's modes whatever the decorators do.  The noise tasks that stand for
"other tasks" are therefore decorated coroutines that change their own mode in
their bodies, and the one undecorated task of each test is its driver.
"""

import asyncio
import functools
import gc
import inspect
import os
import random
import sys
import traceback
import unittest
from unittest import mock

import torch
from torch.testing._internal.common_utils import run_tests, TestCase

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from grad_mode_programs import (  # noqa: E402
    BLOCKS,
    Boom,
    CALLER_SETUPS,
    context_of,
    DECORATORS,
    enter_all,
    generate_program,
    autograd_state,
    mode_state,
    on_own_thread,
    state_inside,
)

try:
    import anyio
except ImportError:
    anyio = None
try:
    import trio
except ImportError:
    trio = None

PROPERTY_PROGRAMS = int(os.environ.get("GRAD_MODE_ASYNC_PROPERTY_PROGRAMS", "500"))
PROPERTY_SEED = int(os.environ.get("GRAD_MODE_ASYNC_PROPERTY_SEED", "20261130"))

# The state of a fresh thread: grad mode on, inference mode off.
PLAIN = (True, False)

# What an async generator's aclose() raises when its body yields in response.
IGNORED_GENERATOR_EXIT = ("raise", "RuntimeError", "async generator ignored GeneratorExit")

# Guards that took a leaked inference mode off this thread (see tearDown); kept
# alive because destroying one would restore the state it replaced.
_RESCUE_GUARDS = []


def state_from(setup, make, *blocks):
    """The mode a body sees inside decorator *make* (and *blocks*) when its caller is in *setup*."""

    def probe():
        with enter_all(setup), context_of(make), enter_all(blocks):
            return mode_state()

    return on_own_thread(probe)


class GradModeAsyncTestCase(TestCase):
    def tearDown(self):
        # A leaked mode would make every later test fail for the wrong reason:
        # put the thread back in the plain state, then report the leak.
        leaked = mode_state()
        if leaked[1]:
            _RESCUE_GUARDS.append(torch._C._InferenceMode(False))
        torch._C._set_grad_enabled(True)
        super().tearDown()
        self.assertEqual(leaked, PLAIN, "the test left the thread in another grad mode")


# ---------------------------------------------------------------------------
# Noise: decorated tasks that keep changing their own mode
# ---------------------------------------------------------------------------


class NoiseTasks:
    """Decorated tasks that each keep changing their own mode and check it after every await.

    Each is a coroutine decorated with one of ``DECORATORS`` whose body enters
    random mode blocks and calls ``torch.set_grad_enabled`` between
    ``await asyncio.sleep(0)``; after every await it must see the mode it had
    before it.  Must be created inside a running event loop.
    """

    def __init__(self, count, seed):
        self.violations = []
        self.awaits = 0
        self._stopped = False
        self._tasks = [asyncio.get_running_loop().create_task(self._make(seed, k)()) for k in range(count)]

    def _make(self, seed, k):
        name, make = DECORATORS[(seed + k) % len(DECORATORS)]

        @make()
        async def noise():
            rng = random.Random(seed * 1009 + k)
            while not self._stopped:
                with BLOCKS[rng.randrange(len(BLOCKS))][1]():
                    for _ in range(rng.randint(1, 3)):
                        await self._checked_sleep(name)
                if rng.random() < 0.5:
                    torch.set_grad_enabled(rng.random() < 0.5)
                await self._checked_sleep(name)

        return noise

    async def _checked_sleep(self, name):
        want = autograd_state()
        await asyncio.sleep(0)
        self.awaits += 1
        got = autograd_state()
        if got != want:
            self.violations.append((name, want, got))

    async def stop(self):
        self._stopped = True
        await asyncio.gather(*self._tasks)


# ---------------------------------------------------------------------------
# Coroutines
# ---------------------------------------------------------------------------


class TestGradModeAsyncCoroutines(GradModeAsyncTestCase):
    """The body of a decorated ``async def`` runs under the decorator at every step."""

    def test_issue_example(self):
        @torch.no_grad()
        async def f():
            await asyncio.sleep(0)
            return torch.is_grad_enabled()

        self.assertTrue(inspect.iscoroutinefunction(f))
        self.assertIs(asyncio.run(f()), False)
        self.assertTrue(torch.is_grad_enabled())

    def test_every_decorator(self):
        for name, make in DECORATORS:
            with self.subTest(name):
                expected = state_inside(make)

                @make()
                async def f():
                    await asyncio.sleep(0)
                    return mode_state()

                self.assertTrue(inspect.iscoroutinefunction(f))
                self.assertEqual(asyncio.run(f()), expected)
                self.assertEqual(mode_state(), PLAIN)

    def test_every_decorator_from_every_caller_mode(self):
        for name, make in DECORATORS:
            for setup_name, setup in CALLER_SETUPS:
                with self.subTest(decorator=name, caller=setup_name):
                    expected = state_from(setup, make)

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

    def test_own_block_spans_awaits(self):
        for dname, dmake in DECORATORS:
            for bname, bmake in BLOCKS:
                with self.subTest(decorator=dname, block=bname):
                    outside = state_inside(dmake)
                    inside = state_inside(dmake, bmake)

                    @dmake()
                    async def f():
                        seen = []
                        with bmake():
                            for _ in range(3):
                                await asyncio.sleep(0)
                                seen.append(mode_state())
                        await asyncio.sleep(0)
                        seen.append(mode_state())
                        return seen

                    self.assertEqual(asyncio.run(f()), [inside] * 3 + [outside])

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

        self.assertEqual(asyncio.run(outer()),
                         ((False, False), ((True, True), (False, True)), (False, True), (False, False)))


# ---------------------------------------------------------------------------
# Async generators
# ---------------------------------------------------------------------------


class TestGradModeAsyncGenerators(GradModeAsyncTestCase):
    """Every step of a decorated async generator runs under the decorator."""

    def test_every_step_under_every_decorator(self):
        # The first step is taken from inside inference_mode+enable_grad.
        callers = CALLER_SETUPS[3:] + CALLER_SETUPS[:3]
        for name, make in DECORATORS:
            with self.subTest(name):
                expected = state_from(callers[0][1], make)

                @make()
                async def agen():
                    got = None
                    for _ in range(len(callers)):
                        resumed = mode_state()
                        await asyncio.sleep(0)
                        got = yield got, resumed, mode_state()

                async def main():
                    self.assertTrue(inspect.isasyncgenfunction(agen))
                    ag = agen()
                    out = []
                    for n, (_, setup) in enumerate(callers):
                        # The caller changes its mode between steps: none of it reaches the body.
                        with enter_all(setup):
                            before = mode_state()
                            out.append(await (ag.__anext__() if n == 0 else ag.asend(f"v{n}")))
                            self.assertEqual(mode_state(), before)
                    with self.assertRaises(StopAsyncIteration):
                        await ag.asend("last")
                    return out

                out = asyncio.run(main())
                sent = [None] + [f"v{n}" for n in range(1, len(callers))]
                self.assertEqual(out, [(v, expected, expected) for v in sent])

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

        self.assertEqual(asyncio.run(main()), [(i, (False, True)) for i in range(3)])

    def test_own_block_spans_yields_and_awaits(self):
        for dname, dmake in DECORATORS:
            for bname, bmake in BLOCKS:
                with self.subTest(decorator=dname, block=bname):
                    outside = state_inside(dmake)
                    inside = state_inside(dmake, bmake)

                    @dmake()
                    async def agen():
                        with bmake():
                            yield mode_state()
                            await asyncio.sleep(0)
                            yield mode_state()
                            await asyncio.sleep(0)
                            yield mode_state()
                        await asyncio.sleep(0)
                        yield mode_state()

                    async def main():
                        out = []
                        async for seen in agen():
                            out.append(seen)
                            self.assertEqual(mode_state(), PLAIN)
                        return out

                    self.assertEqual(asyncio.run(main()), [inside] * 3 + [outside])

    def test_athrow_caught_under_mode(self):
        for name, make in DECORATORS:
            with self.subTest(name):
                inside = state_from([torch.no_grad], make, torch.enable_grad)
                seen = []

                @make()
                async def agen():
                    with torch.enable_grad():
                        while True:
                            try:
                                yield len(seen)
                            except Boom as exc:
                                seen.append((exc.args[0], mode_state()))
                                await asyncio.sleep(0)
                                seen.append(("after await", mode_state()))

                async def main():
                    with torch.no_grad():
                        ag = agen()
                        self.assertEqual(await ag.__anext__(), 0)
                    for n, (_, setup) in enumerate(CALLER_SETUPS):
                        with enter_all(setup):
                            before = mode_state()
                            # The one-argument form: the exception carries its own traceback.
                            self.assertEqual(await ag.athrow(Boom(n)), 2 * (n + 1))
                            self.assertEqual(mode_state(), before)
                    await ag.aclose()

                asyncio.run(main())
                want = []
                for n in range(len(CALLER_SETUPS)):
                    want += [(n, inside), ("after await", inside)]
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
        self.assertEqual(finally_state, [(False, False)])

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
        wrapped = torch.utils._contextlib._wrap_async_generator(torch.no_grad, lambda: inner)

        async def main():
            ag = wrapped()
            self.assertEqual(await ag.__anext__(), ("sent", (False, False)))
            err = Boom()
            self.assertEqual(await ag.athrow(err), ("caught", (False, False)))
            self.assertEqual(inner.thrown, [err])
            await ag.aclose()
            self.assertIsInstance(inner.thrown[-1], GeneratorExit)

        asyncio.run(main())

    def test_aclose_runs_finally_under_mode(self):
        for name, make in DECORATORS:
            for bname, bmake in BLOCKS:
                with self.subTest(decorator=name, block=bname):
                    outside = state_inside(make)
                    inside = state_inside(make, bmake)
                    seen = []

                    @make()
                    async def agen():
                        try:
                            with bmake():
                                try:
                                    yield 1
                                except GeneratorExit:
                                    seen.append(("exit", mode_state()))
                                    # Async clean-up may await.
                                    await asyncio.sleep(0)
                                    seen.append(("exit after await", mode_state()))
                                    raise
                        finally:
                            seen.append(("finally", mode_state()))

                    async def main():
                        ag = agen()
                        self.assertEqual(await ag.__anext__(), 1)
                        with torch.inference_mode():
                            await ag.aclose()
                            self.assertEqual(mode_state(), (False, True))
                        with self.assertRaises(StopAsyncIteration):
                            await ag.__anext__()

                    asyncio.run(main())
                    self.assertEqual(seen, [("exit", inside), ("exit after await", inside), ("finally", outside)])

    def test_shutdown_closes_live_generators_in_body_mode(self):
        # Generators still suspended when asyncio.run ends are closed by the
        # loop's shutdown_asyncgens, all at once: each must be closed through
        # its wrapper (in the body's mode), never directly.
        for name, make in DECORATORS:
            with self.subTest(name):
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
                except BaseException as e:  # noqa: B902 -- compared as recorded
                    outcomes.append(("resume", type(e).__name__))
                caller_modes.append(mode_state())
            return outcomes, caller_modes

        expected, _ = on_own_thread(lambda: asyncio.run(run(make_agen(False))))
        outcomes, caller_modes = asyncio.run(run(make_agen(True)))
        self.assertEqual(outcomes, expected)
        self.assertEqual(expected[0], ("aclose", "async generator ignored GeneratorExit"))
        self.assertEqual(caller_modes, [(False, False), (False, False)])

    def test_loop_finalisation_runs_finally_under_mode(self):
        # Break out of ``async for`` and let the event loop finalise the
        # abandoned generator (its asyncgen finalizer hook schedules aclose(),
        # run as asyncio.run shuts down).  No await in the ``finally``: the
        # loop closes before the clean-up task's second step, decorated or not.
        for name, make in DECORATORS:
            with self.subTest(name):
                outside = state_from([torch.no_grad], make)
                inside = state_from([torch.no_grad], make, torch.enable_grad)
                seen = []

                @make()
                async def agen():
                    try:
                        with torch.enable_grad():
                            seen.append(("body", mode_state()))
                            yield 1
                            yield 2
                    finally:
                        seen.append(("finally", mode_state()))

                async def main():
                    with torch.no_grad():
                        async for x in agen():
                            seen.append(("got", x, mode_state()))
                            break
                        self.assertEqual(mode_state(), (False, False))

                asyncio.run(main())
                self.assertEqual(seen, [("body", inside), ("got", 1, (False, False)), ("finally", outside)])

    def test_shutdown_finalises_generator_of_cancelled_task(self):
        # A task still iterating when asyncio.run returns is cancelled by it;
        # the generator it held is then finalised by the shutting-down loop.
        for name, make in DECORATORS:
            with self.subTest(name):
                outside = state_from([torch.no_grad], make)
                seen = []

                @make()
                async def agen():
                    try:
                        yield 1
                        yield 2
                    finally:
                        seen.append(("finally", mode_state()))

                async def consumer(started):
                    with torch.no_grad():
                        async for x in agen():
                            started.set()
                            await asyncio.sleep(3600)

                async def main():
                    started = asyncio.Event()
                    asyncio.get_running_loop().create_task(consumer(started))
                    await started.wait()

                asyncio.run(main())
                self.assertEqual(seen, [("finally", outside)])

    def test_return_ends_iteration(self):
        @torch.no_grad()
        async def agen():
            yield mode_state()
            await asyncio.sleep(0)
            return

        async def main():
            return [x async for x in agen()]

        self.assertEqual(asyncio.run(main()), [(False, False)])


# ---------------------------------------------------------------------------
# Other tasks on the same event loop
# ---------------------------------------------------------------------------


class TestGradModeAsyncTaskIsolation(GradModeAsyncTestCase):
    """Every task sees, after each of its own awaits, only the mode it set itself."""

    def test_noise_tasks_with_coroutines_and_async_generators(self):
        problems = []

        def check(who, want):
            got = mode_state()
            if got != want:
                problems.append((who, want, got))

        def make_coroutine(k):
            name, make = DECORATORS[k % len(DECORATORS)]

            @make()
            async def coroutine():
                rng = random.Random(k)
                for _ in range(20):
                    with BLOCKS[rng.randrange(len(BLOCKS))][1]():
                        want = mode_state()
                        await asyncio.sleep(0)
                        check(f"coroutine {name}", want)
                    want = mode_state()
                    await asyncio.sleep(0)
                    check(f"coroutine {name}", want)
                return k

            return coroutine

        def make_agen(k):
            name, make = DECORATORS[k % len(DECORATORS)]

            @make()
            async def agen():
                rng = random.Random(100 + k)
                for i in range(10):
                    with BLOCKS[rng.randrange(len(BLOCKS))][1]():
                        want = mode_state()
                        await asyncio.sleep(0)
                        check(f"async generator {name}", want)
                        yield i
                        check(f"async generator {name} after yield", want)
                    want = mode_state()
                    await asyncio.sleep(0)
                    check(f"async generator {name}", want)

            return agen

        def make_consumer(k):
            name, make = DECORATORS[(k + 4) % len(DECORATORS)]

            @make()
            async def consumer():
                out = []
                ag = make_agen(k)()
                while True:
                    want = mode_state()
                    try:
                        out.append(await ag.__anext__())
                    except StopAsyncIteration:
                        break
                    finally:
                        check(f"consumer {name}", want)
                    torch.set_grad_enabled(not torch.is_grad_enabled())
                return out

            return consumer

        async def main():
            noise = NoiseTasks(4, seed=7)
            tasks = [asyncio.create_task(make_coroutine(k)()) for k in range(len(DECORATORS))]
            tasks += [asyncio.create_task(make_consumer(k)()) for k in range(len(DECORATORS))]
            # This undecorated task keeps changing its own mode too.
            rng = random.Random(3)
            awaits = 0
            while not all(task.done() for task in tasks):
                with enter_all(CALLER_SETUPS[rng.randrange(len(CALLER_SETUPS))][1]):
                    for _ in range(rng.randint(1, 3)):
                        want = mode_state()
                        await asyncio.sleep(0)
                        awaits += 1
                        check("undecorated main task", want)
            results = await asyncio.gather(*tasks)
            await noise.stop()
            self.assertGreater(awaits, 10)
            self.assertGreater(noise.awaits, 40)
            return results, noise.violations

        results, noise_violations = asyncio.run(main())
        n = len(DECORATORS)
        self.assertEqual(results, list(range(n)) + [list(range(10))] * n)
        self.assertEqual(problems + noise_violations, [])

    def test_suspended_inference_block_does_not_reach_other_tasks(self):
        results = []

        @torch.no_grad()
        async def server(ready, release):
            with torch.inference_mode():
                ready.set()
                await release.wait()
                results.append(torch.ones(1).is_inference())

        async def main():
            ready, release = asyncio.Event(), asyncio.Event()
            task = asyncio.create_task(server(ready, release))
            await ready.wait()
            # The body is suspended inside its inference-mode block: this
            # task makes ordinary tensors and can train.
            self.assertEqual(mode_state(), PLAIN)
            self.assertFalse(torch.ones(1).is_inference())
            x = torch.ones(1, requires_grad=True)
            (x * 2).sum().backward()
            self.assertEqual(x.grad.item(), 2.0)
            release.set()
            await task

        asyncio.run(main())
        self.assertEqual(results, [True])

    def test_coroutine_dropped_while_suspended(self):
        # A coroutine object closed (here: collected) while suspended inside
        # its own inference-mode block runs its clean-up in its mode and
        # leaves its caller's mode as it was.
        seen = []

        @torch.no_grad()
        async def f():
            try:
                with torch.inference_mode():
                    await asyncio.sleep(0)
            finally:
                seen.append(mode_state())

        for setup_name, setup in CALLER_SETUPS:
            with self.subTest(caller=setup_name), enter_all(setup):
                before = mode_state()
                coro = f()
                coro.send(None)  # runs to asyncio.sleep(0)'s bare yield
                self.assertEqual(mode_state(), before)
                del coro
                gc.collect()
                self.assertEqual(mode_state(), before)
        self.assertEqual(seen, [state_from(setup, torch.no_grad) for _, setup in CALLER_SETUPS])


# ---------------------------------------------------------------------------
# Cancellation and timeouts
# ---------------------------------------------------------------------------


def _suspended_in_block(make, bmake, seen):
    """A decorated coroutine that waits forever inside its own *bmake* block, recording what it sees."""

    @make()
    async def body(started):
        try:
            with bmake():
                try:
                    started.set()
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    seen.append(("except", mode_state()))
                    await asyncio.sleep(0)  # clean-up may await
                    seen.append(("except after await", mode_state()))
                    raise
                finally:
                    seen.append(("inner finally", mode_state()))
        finally:
            seen.append(("finally", mode_state()))

    return body


class TestGradModeAsyncCancellation(GradModeAsyncTestCase):
    """CancelledError and timeouts land where the body is suspended, in its mode."""

    CALLERS = [CALLER_SETUPS[0], CALLER_SETUPS[3]]  # plain, inference_mode+enable_grad

    def check_cancellation(self, cancel, raised):
        """*cancel(body, started)* is a coroutine that gets the body cancelled; it must raise *raised*."""
        for name, make in DECORATORS:
            for bname, bmake in BLOCKS:
                for setup_name, setup in self.CALLERS:
                    with self.subTest(decorator=name, block=bname, caller=setup_name):
                        inside = state_from(setup, make, bmake)
                        outside = state_from(setup, make)
                        seen = []
                        body = _suspended_in_block(make, bmake, seen)

                        async def main():
                            with enter_all(setup):
                                before = mode_state()
                                with self.assertRaises(raised):
                                    await cancel(body, asyncio.Event())
                                self.assertEqual(mode_state(), before)

                        asyncio.run(main())
                        self.assertEqual(seen, [("except", inside), ("except after await", inside),
                                                ("inner finally", inside), ("finally", outside)])

    def test_task_cancel(self):
        async def cancel(body, started):
            task = asyncio.create_task(body(started))
            await started.wait()
            task.cancel()
            await task

        self.check_cancellation(cancel, asyncio.CancelledError)

    def test_wait_for_timeout(self):
        async def cancel(body, started):
            await asyncio.wait_for(body(started), timeout=0.001)

        self.check_cancellation(cancel, asyncio.TimeoutError)

    @unittest.skipIf(not hasattr(asyncio, "timeout"), "asyncio.timeout is new in Python 3.11")
    def test_asyncio_timeout(self):
        async def cancel(body, started):
            async with asyncio.timeout(0.001):
                await body(started)

        self.check_cancellation(cancel, TimeoutError)

    @unittest.skipIf(not hasattr(asyncio, "timeout"), "asyncio.timeout is new in Python 3.11")
    def test_timeout_inside_the_body(self):
        for name, make in DECORATORS:
            for setup_name, setup in self.CALLERS:
                with self.subTest(decorator=name, caller=setup_name):
                    outside = state_from(setup, make)
                    inside = state_from(setup, make, torch.no_grad)

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

    def test_cancel_during_async_generator_step(self):
        for name, make in DECORATORS:
            with self.subTest(name):
                inside = state_from([torch.no_grad], make, torch.enable_grad)
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
                self.assertEqual(seen, [("body", inside), ("consumer", (False, False))])


# ---------------------------------------------------------------------------
# Everything else is unchanged
# ---------------------------------------------------------------------------


class TestGradModeAsyncProtocol(GradModeAsyncTestCase):
    """Everything but the mode is as for the undecorated function."""

    def test_coroutine_kind_and_metadata(self):
        async def coro(a, b=2):
            """Doc."""
            await asyncio.sleep(0)
            return a + b, mode_state()

        for name, make in DECORATORS:
            with self.subTest(name):
                wrapped = make()(coro)
                self.assertTrue(inspect.iscoroutinefunction(wrapped))
                self.assertFalse(inspect.isasyncgenfunction(wrapped))
                self.assertIs(wrapped.__wrapped__, coro)
                self.assertEqual(wrapped.__name__, "coro")
                self.assertEqual(wrapped.__qualname__, coro.__qualname__)
                self.assertEqual(wrapped.__doc__, "Doc.")
                self.assertEqual(wrapped.__module__, coro.__module__)
                self.assertEqual(inspect.signature(wrapped), inspect.signature(coro))
                result = wrapped(1)
                self.assertTrue(asyncio.iscoroutine(result))
                self.assertTrue(inspect.iscoroutine(result))
                self.assertEqual(asyncio.run(result), (3, state_inside(make)))

    def test_async_generator_kind_and_metadata(self):
        async def agen(a, b=2):
            """Doc."""
            await asyncio.sleep(0)
            yield a + b, mode_state()

        for name, make in DECORATORS:
            with self.subTest(name):
                wrapped = make()(agen)
                self.assertTrue(inspect.isasyncgenfunction(wrapped))
                self.assertFalse(inspect.iscoroutinefunction(wrapped))
                self.assertIs(wrapped.__wrapped__, agen)
                self.assertEqual(wrapped.__name__, "agen")
                self.assertEqual(wrapped.__qualname__, agen.__qualname__)
                self.assertEqual(wrapped.__doc__, "Doc.")
                self.assertEqual(inspect.signature(wrapped), inspect.signature(agen))
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
                got = [await no_grad_coro(), await inference_coro(), await enable_grad_coro()]
            got += [x async for x in no_grad_agen()] + [x async for x in inference_agen()]
            return got

        for f in (no_grad_coro, inference_coro, enable_grad_coro):
            self.assertTrue(inspect.iscoroutinefunction(f))
        for f in (no_grad_agen, inference_agen):
            self.assertTrue(inspect.isasyncgenfunction(f))
        self.assertEqual(asyncio.run(main()),
                         [(False, False), (False, True), (True, False), (False, False), (False, True)])

    def test_return_value_and_exception(self):
        @torch.no_grad()
        async def body_with_a_distinctive_name(fail):
            await asyncio.sleep(0)
            if fail:
                raise Boom(mode_state())
            return {"state": mode_state()}

        async def main():
            self.assertEqual(await body_with_a_distinctive_name(False), {"state": (False, False)})
            try:
                await body_with_a_distinctive_name(True)
            except Boom as exc:
                self.assertEqual(exc.args, ((False, False),))
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

        self.assertEqual(asyncio.run(main()), (False, False))

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

        self.assertEqual(asyncio.run(main()), [
            (m, False), False, False, (Model, False), (Model, False), False,
            [(m, True)], [True], [True], [(Model, True)],
        ])
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
                self.assertEqual(mode_state(), (False, False))
            return got

        self.assertTrue(inspect.iscoroutinefunction(coro))
        self.assertTrue(inspect.isasyncgenfunction(agen))
        self.assertEqual(asyncio.run(main()), [((True, False), (False, True)), [(True, False), (False, False)]])

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

        self.assertEqual(asyncio.run(main()), [
            [(2, False), (1, False), (0, False), ("back", True), ("back", True)],
            [(1, False), (0, False), ("back", True)],
        ])

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
# Random programs against an oracle
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
        first_setup = CALLER_SETUPS[program.first_entry_setup()][1]
        with enter_all(first_setup), context_of(DECORATORS[program.decorator][1]):
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
        noise = NoiseTasks(3, seed)
        await asyncio.sleep(0)
        log = []
        decorated = DECORATORS[program.decorator][1]()(program.body())
        body = decorated(lambda tag: log.append((tag, autograd_state())), _make_suspend())
        outcomes = []
        if program.kind == "coroutine":
            requests = [("await", program.first_entry_setup())]
        else:
            requests = program.driver
        for n, (req, setup) in enumerate(requests):
            with enter_all(CALLER_SETUPS[setup][1]):
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

    before = mode_state()
    (log, outcomes), violations = asyncio.run(main())
    # A body that ignored GeneratorExit is closed once more by Python itself
    # when finalised, outside the decorator: do that on a thread of its own.
    on_own_thread(lambda: gc.collect(1))
    after = mode_state()
    if after != before:
        outcomes.append(("thread mode changed by the event loop", before, after))
        if after[1]:
            _RESCUE_GUARDS.append(torch._C._InferenceMode(False))
        torch._C._set_grad_enabled(before[0])
    return (log, outcomes), violations


class TestGradModeAsyncProperty(GradModeAsyncTestCase):
    """Random bodies and drivers: decorated among noise tasks vs undecorated on a thread of their own."""

    def check_matches_oracle(self, kind):
        rng = random.Random(f"{PROPERTY_SEED}-{kind}")
        mismatches = []
        original_hook = sys.unraisablehook

        def hook(unraisable):
            # An undecorated body that ignored GeneratorExit complains again
            # when the oracle drops it; nothing to see.
            if not (isinstance(unraisable.exc_value, RuntimeError)
                    and "ignored GeneratorExit" in str(unraisable.exc_value)):
                original_hook(unraisable)

        with mock.patch.object(sys, "unraisablehook", hook):
            for index in range(PROPERTY_PROGRAMS):
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
                f"{len(mismatches)} mismatching {kind} program(s) (seed {PROPERTY_SEED}); first, #{index}:\n"
                f"{program.describe()}\noracle:  {oracle}\nsubject: {subject}\n"
                f"noise task violations: {violations[:5]}"
            )

    def test_coroutines_match_oracle(self):
        self.check_matches_oracle("coroutine")

    def test_async_generators_match_oracle(self):
        self.check_matches_oracle("async_generator")


# ---------------------------------------------------------------------------
# anyio, on its asyncio and trio backends
# ---------------------------------------------------------------------------


@unittest.skipIf(anyio is None, "anyio is not installed")
class TestGradModeAnyio(GradModeAsyncTestCase):
    """The decorators know nothing of asyncio: the same holds under anyio's backends."""

    def run_scenario(self, backend):
        violations = []
        cancelled = []

        @torch.no_grad()
        async def coro():
            seen = [mode_state()]
            with torch.inference_mode():
                await anyio.sleep(0)
                seen.append(mode_state())
                await anyio.sleep(0.0001)
                seen.append(mode_state())
            await anyio.sleep(0)
            seen.append(mode_state())
            return seen

        @torch.inference_mode()
        async def agen():
            for _ in range(2):
                with torch.enable_grad():
                    await anyio.sleep(0)
                    got = yield mode_state()
                await anyio.sleep(0)
                yield got, mode_state()

        @torch.inference_mode()
        async def waits_forever():
            with torch.enable_grad():
                try:
                    await anyio.sleep(3600)
                except anyio.get_cancelled_exc_class():
                    cancelled.append(mode_state())
                    raise

        @torch.enable_grad()
        async def noise(stop):
            flip = False
            while not stop:
                flip = not flip
                torch.set_grad_enabled(flip)
                await anyio.sleep(0)
                if mode_state() != (flip, False):
                    violations.append((backend, flip, mode_state()))

        async def main():
            stop = []
            async with anyio.create_task_group() as tg:
                tg.start_soon(noise, stop)
                with torch.no_grad():
                    got = await coro()
                    self.assertEqual(mode_state(), (False, False))
                    ag = agen()
                    steps = [await ag.asend(None)]
                    self.assertEqual(mode_state(), (False, False))
                    with torch.inference_mode(False):
                        steps.append(await ag.asend("a"))
                        steps.append(await ag.asend("b"))
                    steps.append(await ag.asend("c"))
                    await ag.aclose()
                    with anyio.move_on_after(0.001):
                        await waits_forever()
                    self.assertEqual(mode_state(), (False, False))
                stop.append(True)
            return got, steps

        got, steps = anyio.run(main, backend=backend)
        self.assertEqual(got, [(False, False), (False, True), (False, True), (False, False)])
        self.assertEqual(steps, [(True, True), ("a", (False, True)), (True, True), ("c", (False, True))])
        self.assertEqual(cancelled, [(True, True)])
        self.assertEqual(violations, [])

    def test_asyncio_backend(self):
        self.run_scenario("asyncio")

    @unittest.skipIf(trio is None, "trio is not installed")
    def test_trio_backend(self):
        self.run_scenario("trio")


if __name__ == "__main__":
    run_tests()
