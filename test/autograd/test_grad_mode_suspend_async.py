# Owner(s): ["module: autograd"]
"""Grad-mode decorators on coroutines and async generators.

A grad mode used as a decorator covers each step of an ``async def``
coroutine or async generator for the state its own ``with`` block sets: grad
mode for no_grad, enable_grad and set_grad_enabled, its one flag for
set_multithreading_enabled, enforce_grad_layout_policy and
_force_original_view_tracking, and the whole autograd state for
inference_mode.  The body starts from its caller's state with the decorator
entered at its first step, keeps its own changes to that state across its
``await``/``yield``, and whoever steps it (an event loop's task, or a caller
sending to it) gets its own back after every step.  Any other state the body
sees and changes exactly as the undecorated body would, so each test of state
compares the whole autograd state with the undecorated body's, where only the
part the decorator carries may differ.  Any other decorating context is
entered around the call that makes the body, as before: it carries nothing.

Most bodies here are written once, as a plain generator function (a
"script"), and run as each kind of function by ``of_kind``; ``start`` steps
each kind through the generator protocol (``send``, ``throw``, ``close``).
"""

import asyncio
import contextlib
import functools
import gc
import inspect
import itertools
import sys
import threading
import types
import warnings
import weakref

import torch
import torch.autograd.forward_ad as fwAD
from torch.autograd.grad_mode import (
    _force_original_view_tracking,
    enforce_grad_layout_policy,
    set_multithreading_enabled,
)
from torch.testing._internal.common_utils import (
    disable_gc,
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    skipIfTorchDynamo,
    TestCase,
)
from torch.utils._contextlib import _DecoratorContextManager, context_decorator
from torch.utils.checkpoint import GraphExecGroup


# Dynamo would trace the test bodies, which switch and inspect the thread's
# autograd state around bodies that the decorators step eagerly.
_DYNAMO_SKIP = "checks thread state around eagerly stepped suspended bodies"

KINDS = ("coroutine", "async_generator")

# The whole autograd state of a thread: its flags, and the local dispatch key
# sets whose bits inference mode toggles.
_STATE_QUERIES = (
    torch.is_grad_enabled,
    torch.is_inference_mode_enabled,
    torch._C._is_fwd_grad_enabled,
    torch._C._is_multithreading_enabled,
    torch._C._is_view_replay_enabled,
    torch._C._is_grad_layout_enforcement_enabled,
    torch._C._get_graph_exec_group,
    torch._C._dispatch_tls_local_include_set,
    torch._C._dispatch_tls_local_exclude_set,
)

# Each decorator: the context it applies, and the part of the autograd state
# its block sets, which the bodies it decorates carry.  "no_grad_bare" is
# @torch.no_grad.
_GRAD_MODE = (torch.is_grad_enabled,)
DECORATORS = {
    "no_grad": (torch.no_grad, _GRAD_MODE),
    "no_grad_bare": (torch.no_grad, _GRAD_MODE),
    "enable_grad": (torch.enable_grad, _GRAD_MODE),
    "set_grad_enabled_False": (lambda: torch.set_grad_enabled(False), _GRAD_MODE),
    "set_grad_enabled_True": (lambda: torch.set_grad_enabled(True), _GRAD_MODE),
    "set_multithreading_enabled": (
        lambda: set_multithreading_enabled(False),
        (torch._C._is_multithreading_enabled,),
    ),
    "force_original_view_tracking": (
        lambda: _force_original_view_tracking(True),
        (torch._C._is_view_replay_enabled,),
    ),
    "enforce_grad_layout_policy": (
        lambda: enforce_grad_layout_policy(False),
        (torch._C._is_grad_layout_enforcement_enabled,),
    ),
    "inference_mode": (torch.inference_mode, _STATE_QUERIES),
    "inference_mode_False": (lambda: torch.inference_mode(False), _STATE_QUERIES),
}

# Blocks that each flip one flag a single-flag decorator sets: entered
# together, they change the state each decorator carries and, but for
# inference_mode's (all of it), some state it does not.
FLAG_BLOCKS = (
    lambda: torch.set_grad_enabled(not torch.is_grad_enabled()),
    lambda: set_multithreading_enabled(not torch._C._is_multithreading_enabled()),
    lambda: _force_original_view_tracking(not torch._C._is_view_replay_enabled()),
    lambda: enforce_grad_layout_policy(
        not torch._C._is_grad_layout_enforcement_enabled()
    ),
)


def no_multithreading():
    return set_multithreading_enabled(False)


# A caller's graph execution group: one for every run, so that the state of
# an undecorated body and of the decorated one name the same group.
CALLER_GROUP = GraphExecGroup()

# Modes a caller steps a body from: the contexts to enter, in order.
CALLER_MODES = (
    (),
    (torch.no_grad,),
    (torch.inference_mode,),
    (torch.inference_mode, torch.enable_grad),
    (no_multithreading,),
    (lambda: _force_original_view_tracking(True), torch.no_grad),
    (lambda: fwAD._set_fwd_grad_enabled(False),),
    (lambda: enforce_grad_layout_policy(False), torch.inference_mode),
    (lambda: CALLER_GROUP,),
    FLAG_BLOCKS,
)


def autograd_state():
    return tuple(repr(query()) for query in _STATE_QUERIES)


def as_carried(decorator, state, own):
    """*state* with the part of it that *decorator* carries taken from *own*.

    Where the undecorated body (or its caller) sees *state*, the decorated
    body (or its caller) sees this, *own* being the state the decorated body
    (or its caller) keeps for itself.
    """
    carried = DECORATORS[decorator][1]
    return tuple(
        mine if query in carried else theirs
        for query, theirs, mine in zip(_STATE_QUERIES, state, own)
    )


@contextlib.contextmanager
def enter_all(contexts):
    with contextlib.ExitStack() as stack:
        for context in contexts:
            stack.enter_context(context())
        yield


@contextlib.contextmanager
def state_restored():
    """After the block, put the thread's whole autograd state back as it was
    before it, whatever blocks the bodies stepped in it left open."""
    saved = torch._C._get_autograd_mode_state()
    try:
        yield
    finally:
        torch._C._swap_autograd_mode_state(saved)


def decorate(decorator, func):
    if decorator == "no_grad_bare":
        return torch.no_grad(func)
    return DECORATORS[decorator][0]()(func)


def state_under(decorator, *blocks):
    """The state a body starts in when called now, after opening *blocks*."""
    with DECORATORS[decorator][0](), enter_all(blocks):
        return autograd_state()


@types.coroutine
def delegate(steps):
    return (yield from steps)


@types.coroutine
def pause(value=None):
    """Suspend the awaiting coroutine, handing *value* to whoever steps it."""
    return (yield value)


def of_kind(kind, script):
    """A function of *kind* whose body runs *script*, suspending where it yields."""
    if kind == "coroutine":

        async def coroutine(*args):
            return await delegate(script(*args))

        return coroutine

    async def async_generator(*args):  # ``yield from`` for an async generator
        steps = script(*args)
        try:
            value = next(steps)
            while True:
                try:
                    request = yield value
                except BaseException as exc:
                    value = steps.throw(exc)
                else:
                    value = steps.send(request)
        except StopIteration:
            return

    return async_generator


def run_now(awaitable):
    """The result of an awaitable that completes without suspending."""
    try:
        awaitable.send(None)
    except StopIteration as stop:
        return stop.value
    except StopAsyncIteration:
        raise StopIteration from None  # exhausted, as a generator says it
    finally:
        del awaitable  # an athrow awaitable holds what it raises: no cycle
    raise AssertionError("the step suspended")


class AsyncGeneratorSteps:
    """Steps an async generator that never awaits, as a generator."""

    def __init__(self, agen):
        self.agen = agen

    def send(self, value):
        return run_now(self.agen.asend(value))

    def throw(self, exc):
        try:
            return run_now(self.agen.athrow(exc))
        finally:
            del exc  # what this raises holds this frame: no cycle

    def close(self):
        return run_now(self.agen.aclose())


def start(kind, func, *args):
    """Call *func*; return its body, to step with send, throw and close."""
    body = func(*args)
    return AsyncGeneratorSteps(body) if kind == "async_generator" else body


async def run_in_task(kind, func):
    """Run *func*'s body in the current task, letting other tasks run between steps."""
    if kind == "coroutine":
        return await func()
    async for _ in func():
        await asyncio.sleep(0)


def step_in_each_caller_mode(body):
    """Step *body* to its end from each caller mode in turn; return its result
    and the caller's state before and after each step."""
    steps = []
    for contexts in itertools.cycle(CALLER_MODES):
        with enter_all(contexts):
            before = autograd_state()
            try:
                body.send(None)
            except StopIteration as stop:
                return stop.value, steps
            finally:
                steps.append((before, autograd_state()))
    raise AssertionError("unreachable")


class Boom(Exception):
    pass


class Payload:
    """An object to watch the lifetime of with a weak reference."""


class Counting(_DecoratorContextManager):
    """A context that carries nothing: it only logs being entered and left."""

    def __init__(self, log):
        self.log = log

    def clone(self):
        return Counting(self.log)

    def __enter__(self):
        self.log.append("enter")

    def __exit__(self, exc_type, *exc_info):
        self.log.append(("exit", exc_type))


@contextlib.contextmanager
def counting(log):
    log.append("enter")
    exc_type = None
    try:
        yield
    except BaseException as exc:
        exc_type = type(exc)
        raise
    finally:
        log.append(("exit", exc_type))


def loud_no_grad(log):
    class LoudNoGrad(torch.no_grad):
        """Overrides __enter__ and __exit__ and declares nothing: it carries nothing."""

        def __enter__(self):
            log.append("enter")
            return super().__enter__()

        def __exit__(self, exc_type, *exc_info):
            log.append(("exit", exc_type))
            return super().__exit__(exc_type, *exc_info)

    return LoudNoGrad()


def stance():
    """The stance torch.compiler.set_stance sets."""
    return torch._dynamo.eval_frame._stance.stance


# Contexts that carry nothing, as decorators made from a log.
OTHER_CONTEXTS = {
    "set_stance": lambda log: torch.compiler.set_stance("force_eager"),
    "DecoratorContextManager": Counting,
    "context_decorator": (
        lambda log: lambda func: context_decorator(lambda: counting(log), func)
    ),
    "no_grad_overriding_enter_and_exit": loud_no_grad,
}


class AsyncAutogradStateTestCase(TestCase):
    def setUp(self):
        super().setUp()
        # Should a failing test leave the thread's autograd state changed, the
        # guard's exit puts all of it back, with the local dispatch key sets,
        # as it found them: no failure spills into the tests after it.
        guard = torch._C._InferenceMode(torch.is_inference_mode_enabled())
        guard.__enter__()
        self.addCleanup(guard.__exit__, None, None, None)


@skipIfTorchDynamo(_DYNAMO_SKIP)
class TestGradModeSuspendAsync(AsyncAutogradStateTestCase):
    def assert_callers_get_their_own_back(self, decorator, steps, undecorated):
        """Each caller of the decorated body gets the part of the state the
        decorator carries back as it was before its step, and the rest as the
        undecorated body's caller does (*undecorated*)."""
        expected = [
            (
                as_carried(decorator, ref_before, before),
                as_carried(decorator, ref_after, before),
            )
            for (before, _), (ref_before, ref_after) in zip(steps, undecorated)
        ]
        self.assertEqual(len(steps), len(undecorated))
        self.assertEqual(steps, expected)

    @parametrize("kind", KINDS)
    @parametrize("decorator", DECORATORS)
    def test_body_keeps_its_own_blocks_and_sees_the_rest_as_undecorated(
        self, decorator, kind
    ):
        def script(seen):
            seen.append(autograd_state())
            with enter_all(FLAG_BLOCKS):
                for _ in CALLER_MODES:
                    seen.append(autograd_state())
                    yield
                seen.append(autograd_state())
            seen.append(autograd_state())
            return "done"  # noqa: B901 (the result, in StopIteration)

        runs = []
        for decorated in (False, True):
            func = of_kind(kind, script)
            func = decorate(decorator, func) if decorated else func
            seen = []
            with state_restored(), torch.inference_mode():
                result, steps = step_in_each_caller_mode(start(kind, func, seen))
            runs.append((seen, steps, result))
        with torch.inference_mode():
            first = state_under(decorator)
            inside = state_under(decorator, *FLAG_BLOCKS)
        (undecorated, undecorated_steps, _), (seen, steps, result) = runs
        if kind == "coroutine":
            self.assertEqual(result, "done")
        own = [first] + [inside] * (len(CALLER_MODES) + 1) + [first]
        self.assertEqual(len(seen), len(own))
        self.assertEqual(
            seen, [as_carried(decorator, s, o) for s, o in zip(undecorated, own)]
        )
        self.assert_callers_get_their_own_back(decorator, steps, undecorated_steps)

    @parametrize("kind", KINDS)
    @parametrize("decorator", DECORATORS)
    def test_caller_gets_its_own_state_back_and_the_rest_as_undecorated(
        self, decorator, kind
    ):
        group = GraphExecGroup()  # one for both runs: the state shows which
        body_blocks = (
            lambda: torch.inference_mode(not torch.is_inference_mode_enabled()),
            *FLAG_BLOCKS,
            lambda: fwAD._set_fwd_grad_enabled(False),
        )

        def script():
            with contextlib.ExitStack() as stack:
                for block in body_blocks:
                    stack.enter_context(block())
                    yield
                torch._C._set_graph_exec_group(group)
                for block in FLAG_BLOCKS:  # the function forms, never undone
                    block()
                yield

        runs = []
        for decorated in (False, True):
            func = of_kind(kind, script)
            func = decorate(decorator, func) if decorated else func
            with state_restored():
                runs.append(step_in_each_caller_mode(start(kind, func))[1])
        undecorated, steps = runs
        self.assert_callers_get_their_own_back(decorator, steps, undecorated)

    @parametrize("kind", KINDS)
    @parametrize("decorator", DECORATORS)
    def test_state_it_does_not_carry_is_its_callers_as_undecorated(
        self, decorator, kind
    ):
        # Between two steps the caller changes each part of the state in turn.
        group = GraphExecGroup()
        callers = (
            *FLAG_BLOCKS,
            torch.inference_mode,
            lambda: fwAD._set_fwd_grad_enabled(False),
            lambda: group,
        )

        def script(seen):
            while True:
                seen.append(autograd_state())
                yield

        runs = []
        for decorated in (False, True):
            func = of_kind(kind, script)
            func = decorate(decorator, func) if decorated else func
            seen = []
            body = start(kind, func, seen)
            body.send(None)
            for caller in callers:
                with caller():
                    body.send(None)
            body.close()
            runs.append(seen)
        undecorated, seen = runs
        own = state_under(decorator)
        self.assertEqual(len(seen), len(callers) + 1)
        self.assertEqual(seen, [as_carried(decorator, s, own) for s in undecorated])

    @parametrize("kind", KINDS)
    @parametrize("decorator", DECORATORS)
    def test_tasks_on_one_loop_keep_their_own_state(self, decorator, kind):
        blocks = {
            "a": torch.no_grad,
            "b": torch.inference_mode,
            "c": no_multithreading,
            "d": lambda: enter_all(FLAG_BLOCKS),
        }

        def script(seen, block):
            with block():
                for _ in range(4):
                    seen.append(autograd_state())
                    yield

        async def noise():  # undecorated, holds a different mode at each await
            await asyncio.sleep(0)  # once the bodies have started from ours
            for contexts in CALLER_MODES:
                with enter_all(contexts):
                    await asyncio.sleep(0)

        async def main(decorated):
            seen = {name: [] for name in blocks}
            bodies = []
            for name, block in blocks.items():
                func = of_kind(kind, functools.partial(script, seen[name], block))
                func = decorate(decorator, func) if decorated else func
                bodies.append(run_in_task(kind, func))
            await asyncio.gather(*bodies[:2], noise(), *bodies[2:])
            return seen

        runs = []
        before = autograd_state()
        for decorated in (False, True):
            with state_restored():
                seen = asyncio.run(main(decorated))
                runs.append((seen, autograd_state()))
        (undecorated, undecorated_after), (seen, after) = runs
        self.assertEqual(after, as_carried(decorator, undecorated_after, before))
        expected = {
            name: [
                as_carried(decorator, s, state_under(decorator, blocks[name]))
                for s in undecorated[name]
            ]
            for name in blocks
        }
        self.assertEqual(seen, expected)

    @parametrize("kind", KINDS)
    @parametrize("decorator", DECORATORS)
    def test_send_throw_close(self, decorator, kind):
        def script(log):
            log.append(("started", autograd_state()))
            try:
                log.append(((yield "first"), autograd_state()))
                try:
                    yield "second"
                except Boom:
                    log.append(("caught", autograd_state()))
                yield "third"
            finally:
                log.append(("finally", autograd_state()))

        group = GraphExecGroup()
        runs = []
        for decorated in (False, True):
            func = of_kind(kind, script)
            func = decorate(decorator, func) if decorated else func
            log = []
            body = start(kind, func, log)
            with torch.inference_mode():
                self.assertEqual(body.send(None), "first")
            with enter_all(FLAG_BLOCKS):
                self.assertEqual(body.send("sent"), "second")
                before = autograd_state()
                self.assertEqual(body.throw(Boom()), "third")
                self.assertEqual(autograd_state(), before)
            with no_multithreading(), group:
                before = autograd_state()
                body.close()
                self.assertEqual(autograd_state(), before)
            runs.append(log)
        undecorated, log = runs
        with torch.inference_mode():
            own = state_under(decorator)
        self.assertEqual(
            [tag for tag, _ in undecorated], ["started", "sent", "caught", "finally"]
        )
        self.assertEqual(
            log,
            [(tag, as_carried(decorator, state, own)) for tag, state in undecorated],
        )

    @parametrize("kind", KINDS)
    @parametrize("decorator", DECORATORS)
    def test_exceptions_propagate_unchanged(self, decorator, kind):
        def script(exc, where, log):
            if where == "raised on entry":
                raise exc
            try:
                yield
                if where == "raised on resume":
                    raise exc
            except BaseException:
                log.append(autograd_state())
                raise

        errors = (Boom, KeyboardInterrupt, SystemExit, GeneratorExit)
        wheres = ("raised on entry", "raised on resume", "thrown in")
        own = state_under(decorator)
        for error, where in itertools.product(errors, wheres):
            with self.subTest(error=error.__name__, where=where):
                runs = []
                for decorated in (False, True):
                    exc = error("the original")
                    func = of_kind(kind, script)
                    func = decorate(decorator, func) if decorated else func
                    log = []
                    body = start(kind, func, exc, where, log)
                    if where != "raised on entry":
                        body.send(None)  # to the yield
                    with torch.inference_mode(), enter_all(FLAG_BLOCKS):
                        before = autograd_state()
                        with self.assertRaises(error) as caught:
                            if where == "thrown in":
                                body.throw(exc)
                            else:
                                body.send(None)
                        self.assertIs(caught.exception, exc)
                        self.assertEqual(autograd_state(), before)
                    runs.append(log)
                undecorated, log = runs
                self.assertEqual(len(undecorated), where != "raised on entry")
                self.assertEqual(
                    log, [as_carried(decorator, s, own) for s in undecorated]
                )

    @parametrize("kind", KINDS)
    @parametrize("decorator", DECORATORS)
    def test_close_and_finalisation_run_in_the_body_mode(self, decorator, kind):
        group = GraphExecGroup()

        def script(log):
            with enter_all(FLAG_BLOCKS):
                try:
                    log.append(autograd_state())
                    yield
                finally:
                    log.append(autograd_state())

        inside = state_under(decorator, *FLAG_BLOCKS)
        for end in ("closed", "dropped"):
            with self.subTest(end=end):
                runs = []
                for decorated in (False, True):
                    func = of_kind(kind, script)
                    func = decorate(decorator, func) if decorated else func
                    log = []
                    with state_restored():
                        body = start(kind, func, log)
                        body.send(None)
                        with torch.inference_mode(), group:
                            before = autograd_state()
                            if end == "closed":
                                body.close()
                            else:
                                del body
                            after = autograd_state()
                    runs.append((log, (before, after)))
                (undecorated, undecorated_step), (log, step) = runs
                self.assertEqual(len(undecorated), 2)
                self.assertEqual(
                    log, [as_carried(decorator, s, inside) for s in undecorated]
                )
                self.assert_callers_get_their_own_back(
                    decorator, [step], [undecorated_step]
                )

    @parametrize("decorator", DECORATORS)
    def test_loop_shutdown_closes_bodies_in_their_mode(self, decorator):
        # The loop's shutdown_asyncgens closes every generator it was told of
        # at once, in no set order: each body must be closed through its
        # wrapper, never before it in the loop's state.
        async def agen(log):
            try:
                log.append(autograd_state())
                yield
            finally:
                log.append(autograd_state())

        async def main(func, logs, alive):
            for log in logs:
                alive.append(func(log))
                await alive[-1].asend(None)  # left suspended for the loop to close

        runs, alive = [], []  # alive past the loop's end: shutdown closes them
        for func in (agen, decorate(decorator, agen)):
            logs = [[] for _ in range(8)]
            with state_restored():
                asyncio.run(main(func, logs, alive))
            runs.append(logs)
        undecorated, logs = runs
        inside = state_under(decorator)
        self.assertEqual([len(log) for log in undecorated], [2] * 8)
        expected = [
            [as_carried(decorator, s, inside) for s in log] for log in undecorated
        ]
        self.assertEqual(logs, expected)

    def test_thread_hooks_see_only_the_wrapper_and_are_kept(self):
        # Whatever async-generator hooks the thread has (trio's, say) are told
        # of the decorated generator, never of the body inside it, and stay
        # installed.
        seen = []

        def firstiter(agen):
            seen.append(("firstiter", agen))

        def finalizer(agen):
            seen.append(("finalizer", agen))

        @torch.no_grad()
        async def async_generator():
            yield torch.is_grad_enabled()

        hooks = sys.get_asyncgen_hooks()
        sys.set_asyncgen_hooks(firstiter, finalizer)
        try:
            agen = async_generator()
            self.assertFalse(run_now(agen.asend(None)))
            self.assertEqual(tuple(sys.get_asyncgen_hooks()), (firstiter, finalizer))
            run_now(agen.aclose())
        finally:
            sys.set_asyncgen_hooks(*hooks)
        self.assertEqual(seen, [("firstiter", agen)])

    @parametrize("kind", KINDS)
    @parametrize("decorator", DECORATORS)
    def test_cancellation_is_delivered_in_the_body_mode(self, decorator, kind):
        async def wait_forever():
            await asyncio.get_running_loop().create_future()

        async def coroutine(log):
            with enter_all(FLAG_BLOCKS):
                log.append(autograd_state())
                try:
                    await wait_forever()
                except asyncio.CancelledError:
                    log.append(autograd_state())
                    raise

        async def async_generator(log):
            await coroutine(log)
            yield

        async def main(func, log):
            task = asyncio.create_task(run_in_task(kind, lambda: func(log)))
            await asyncio.sleep(0)
            with torch.inference_mode():
                before = autograd_state()
                task.cancel()
                with self.assertRaises(asyncio.CancelledError):
                    await task
                return before, autograd_state()

        funcs = {"coroutine": coroutine, "async_generator": async_generator}
        runs = []
        for func in (funcs[kind], decorate(decorator, funcs[kind])):
            log = []
            with state_restored():
                step = asyncio.run(main(func, log))
            runs.append((log, step))
        (undecorated, undecorated_step), (log, step) = runs
        inside = state_under(decorator, *FLAG_BLOCKS)
        self.assertEqual(len(undecorated), 2)
        self.assertEqual(log, [as_carried(decorator, s, inside) for s in undecorated])
        self.assert_callers_get_their_own_back(decorator, [step], [undecorated_step])

    @parametrize("kind", KINDS)
    def test_keeps_kind_and_metadata(self, kind):
        async def coroutine(a, b=1):
            """Doc."""
            return a

        async def async_generator(a, b=1):
            """Doc."""
            yield a

        func = {"coroutine": coroutine, "async_generator": async_generator}[kind]
        predicates = (
            inspect.isgeneratorfunction,
            inspect.iscoroutinefunction,
            inspect.isasyncgenfunction,
        )
        for decorator in DECORATORS:
            with self.subTest(decorator=decorator):
                decorated = decorate(decorator, func)
                self.assertEqual(
                    [p(decorated) for p in predicates], [p(func) for p in predicates]
                )
                for name in ("__name__", "__qualname__", "__doc__", "__module__"):
                    self.assertEqual(getattr(decorated, name), getattr(func, name))
                self.assertIs(decorated.__wrapped__, func)
                self.assertEqual(inspect.signature(decorated), inspect.signature(func))
                body = decorated(1)
                made = (
                    inspect.isgenerator(body),
                    inspect.iscoroutine(body),
                    inspect.isasyncgen(body),
                )
                self.assertEqual(
                    made, (False, kind == "coroutine", kind == "async_generator")
                )
                if kind == "coroutine":
                    body.close()  # never awaited


@skipIfTorchDynamo(_DYNAMO_SKIP)
class TestGradModeOtherContextsAsync(AsyncAutogradStateTestCase):
    """Contexts that carry nothing decorate async bodies as before: they are
    entered around the call that makes the body, never around its steps."""

    def run_body(self, kind, func):
        """Step a body of *kind* made by *func* from two caller modes, throw
        into it and close it; return what it saw and each step's outcome."""
        seen = []

        def script():
            while True:
                try:
                    yield
                except Boom:
                    pass
                finally:
                    seen.append((torch.is_grad_enabled(), stance()))

        body = start(kind, func(of_kind(kind, script)))
        outcomes = []
        for mode in (True, False):
            with torch.set_grad_enabled(mode):
                outcomes.append(body.send(None))
                outcomes.append(torch.is_grad_enabled())
        outcomes.append(body.throw(Boom()))
        body.close()
        return seen, outcomes

    @parametrize("kind", KINDS)
    @parametrize("context", OTHER_CONTEXTS)
    def test_entered_around_the_call_only(self, context, kind):
        log = []
        decorator = OTHER_CONTEXTS[context](log)
        decorated = decorator(of_kind(kind, lambda: iter(())))
        predicates = (inspect.iscoroutinefunction, inspect.isasyncgenfunction)
        self.assertEqual([p(decorated) for p in predicates], [False, False])
        log.clear()

        seen, outcomes = self.run_body(kind, decorator)
        undecorated = self.run_body(kind, lambda func: func)
        self.assertEqual((seen, outcomes), undecorated)
        if context != "set_stance":
            # Entered and left once, around the call, as a plain function.
            self.assertEqual(log, ["enter", ("exit", None)])

    @parametrize("kind", KINDS)
    @parametrize(
        "override",
        ["nothing", "clone", "__init__", "__enter__", "__exit__", "declared"],
    )
    def test_subclass_carries_unless_it_overrides_how_it_is_entered_undeclared(
        self, override, kind
    ):
        # Overriding __enter__, __exit__ or clone may set more than the
        # parent's state: unless the subclass declares what it carries
        # ("declared" overrides __enter__ and declares its parent's), it
        # carries nothing, so the body runs as undecorated.  Overriding
        # __init__ keeps the carry.
        namespace = {
            "nothing": {},
            "clone": {"clone": lambda self: type(self)()},
            "__init__": {"__init__": lambda self: torch.no_grad.__init__(self)},
            "__enter__": {"__enter__": lambda self: torch.no_grad.__enter__(self)},
            "__exit__": {
                "__exit__": lambda self, *exc: torch.no_grad.__exit__(self, *exc)
            },
            "declared": {
                "__enter__": lambda self: torch.no_grad.__enter__(self),
                "_carried_state": torch.no_grad._carried_state,
            },
        }[override]
        subclass = type("NoGradSubclass", (torch.no_grad,), namespace)

        def state():
            return torch.is_grad_enabled(), torch._C._is_multithreading_enabled()

        def script():
            seen = [state()]
            with torch.enable_grad():
                yield
                seen.append(state())
            seen.append(state())
            yield seen

        def run(func):
            with state_restored():
                body = start(kind, func(of_kind(kind, script)))
                body.send(None)
                with torch.no_grad(), no_multithreading():
                    seen = body.send(None)
                    after = state()
                body.close()
                return seen, after, state()

        if override not in ("nothing", "__init__", "declared"):
            self.assertEqual(run(subclass()), run(lambda func: func))
        else:
            expected = [(False, True), (True, False), (False, False)]
            self.assertEqual(run(subclass()), (expected, (False, False), (True, True)))
        # A plain function runs in the mode, with or without the fast path.
        self.assertFalse(subclass()(lambda: torch.is_grad_enabled())())
        self.assertTrue(torch.is_grad_enabled())


@skipIfTorchDynamo(_DYNAMO_SKIP)
class TestGradModeSuspendAsyncFixes(AsyncAutogradStateTestCase):
    """Cases the previous versions of the decorators got wrong."""

    @parametrize("kind", KINDS)
    def test_body_closed_though_its_context_would_fail_to_enter_again(self, kind):
        # Entered afresh at each step, a context whose __enter__ failed at a
        # later step left an async generator unclosed: its finally never ran,
        # not even at the loop's shutdown_asyncgens.  Entered around the call
        # only, it is never entered again.
        log = []

        class EntersOnce(_DecoratorContextManager):
            def __enter__(self):
                if log.count("enter"):
                    raise Boom
                log.append("enter")

            def __exit__(self, *exc_info):
                pass

        async def coroutine():
            try:
                await asyncio.sleep(0)
            finally:
                log.append("finally")

        async def async_generator():
            try:
                yield
                yield
            finally:
                log.append("finally")

        async def main(func):
            if kind == "coroutine":
                return await func()
            keep = func()
            await keep.asend(None)
            await asyncio.sleep(0)
            await keep.asend(None)

        func = {"coroutine": coroutine, "async_generator": async_generator}[kind]
        asyncio.run(main(EntersOnce()(func)))
        self.assertEqual(log, ["enter", "finally"])

    @parametrize("kind", KINDS)
    def test_context_that_suppresses_everything_leaves_the_body_alone(self, kind):
        # Entered afresh at each step, a context suppressing every exception
        # made a decorated coroutine step forever (or raise "cannot reuse
        # already awaited coroutine").  Around the call only, the body's own
        # exception reaches its awaiter.  Run on a thread to bound a hang.
        class SuppressAll(_DecoratorContextManager):
            def __enter__(self):
                pass

            def __exit__(self, *exc_info):
                return True

        async def coroutine():
            await asyncio.sleep(0)
            raise Boom

        async def async_generator():
            yield
            raise Boom

        async def main(func):
            if kind == "coroutine":
                return await func()
            async for _ in func():
                pass

        func = {"coroutine": coroutine, "async_generator": async_generator}[kind]
        outcome = []

        def run():
            try:
                asyncio.run(main(SuppressAll()(func)))
            except BaseException as exc:
                outcome.append(type(exc))
            else:
                outcome.append(None)

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(timeout=60)
        self.assertEqual(outcome, [Boom])

    @parametrize("kind", KINDS)
    def test_exit_that_suppresses_ends_the_body_as_a_with_block_would(self, kind):
        class SuppressingNoGrad(torch.no_grad):
            _carried_state = torch.no_grad._carried_state  # declared: carries grad mode

            def __exit__(self, *exc_info):
                super().__exit__(*exc_info)
                return True

        def script():
            yield torch.is_grad_enabled()
            raise Boom

        body = start(kind, SuppressingNoGrad()(of_kind(kind, script)))
        self.assertFalse(body.send(None))
        with self.assertRaises(StopIteration) as ended:
            body.send(None)
        self.assertIsNone(ended.exception.value)
        self.assertTrue(torch.is_grad_enabled())

    def test_yielded_value_is_freed_once_the_caller_drops_it(self):
        @torch.no_grad()
        async def async_generator():
            while True:
                yield Payload()

        body = start("async_generator", async_generator)
        with disable_gc():
            value = weakref.ref(body.send(None))
            self.assertIsNone(value())
        body.close()

    @parametrize("kind", KINDS)
    def test_no_reference_to_the_callers_state_between_steps(self, kind):
        def script():
            yield
            yield

        body = start(kind, torch.no_grad()(of_kind(kind, script)))
        body.send(None)
        with disable_gc():
            group = GraphExecGroup()
            with group:
                body.send(None)
            group = weakref.ref(group)
            self.assertIsNone(group())
        body.close()

    @parametrize("kind", KINDS)
    @parametrize("fail", ("raise", "throw"))
    def test_failing_step_leaves_no_cycle(self, fail, kind):
        def script():
            witness = Payload()
            yield weakref.ref(witness)
            raise Boom

        with disable_gc():
            body = start(kind, torch.no_grad()(of_kind(kind, script)))
            witness = body.send(None)
            try:
                body.throw(Boom()) if fail == "throw" else body.send(None)
            except Boom:
                pass
            self.assertIsNone(witness())

    @parametrize("kind", KINDS)
    def test_partial_of_each_kind_without_warnings(self, kind):
        def script(n):
            for _ in range(n):
                yield torch.is_grad_enabled()

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            decorated = torch.no_grad()(functools.partial(of_kind(kind, script), 2))
            body = start(kind, decorated)
            self.assertEqual([body.send(None), body.send(None)], [False, False])
            self.assertTrue(torch.is_grad_enabled())
            body.close()

    def test_sent_value_is_not_kept_by_a_coroutine(self):
        def script():
            while True:
                yield  # and drops what it is sent

        with disable_gc():
            body = torch.no_grad()(of_kind("coroutine", script))()
            body.send(None)
            sent = Payload()
            ref = weakref.ref(sent)
            body.send(sent)
            del sent
            self.assertIsNone(ref())
            body.close()

    def test_async_generator_arguments_and_sent_values_are_not_kept(self):
        @torch.no_grad()
        async def agen(payload):
            del payload
            while True:
                yield  # and drops what it is sent

        async def main():
            payload, sent = Payload(), Payload()
            refs = weakref.ref(payload), weakref.ref(sent)
            stream = agen(payload)
            del payload
            await stream.asend(None)
            await stream.asend(sent)
            del sent
            alive = [ref() is not None for ref in refs]
            await stream.aclose()
            return alive

        with disable_gc():
            self.assertEqual(asyncio.run(main()), [False, False])

    def test_async_generator_in_a_cycle_finishes_its_cleanup_in_its_mode(self):
        log = []

        class Request:
            pass

        @torch.no_grad()
        async def stream(request):
            try:
                with torch.enable_grad():
                    while True:
                        yield
            finally:
                log.append(torch.is_grad_enabled())
                await asyncio.sleep(0)  # the event loop finishes the clean-up
                log.append(torch.is_grad_enabled())

        async def main():
            request = Request()
            request.stream = stream(request)
            await request.stream.__anext__()
            del request
            gc.collect()
            for _ in range(5):
                await asyncio.sleep(0)

        asyncio.run(main())
        self.assertEqual(log, [False, False])

    @parametrize("kind", KINDS)
    def test_no_grad_body_sees_multithreading_another_task_sets_between_awaits(
        self, kind
    ):
        # no_grad carries grad mode only: a body it decorates sees the
        # multithreading flag as the loop's thread has it at each step, as
        # the undecorated body does, not as it was when it started.
        async def coroutine(seen):
            for _ in range(3):
                seen.append(autograd_state())
                await asyncio.sleep(0)
            seen.append(autograd_state())

        async def async_generator(seen):
            for _ in range(3):
                seen.append(autograd_state())
                yield
            seen.append(autograd_state())

        async def other():  # steps between the body's steps
            for enabled in (False, True, False):
                torch._C._set_multithreading_enabled(enabled)
                await asyncio.sleep(0)

        async def main(func, seen):
            await asyncio.gather(run_in_task(kind, lambda: func(seen)), other())

        func = {"coroutine": coroutine, "async_generator": async_generator}[kind]
        runs = []
        for body in (func, torch.no_grad()(func)):
            seen = []
            with state_restored():
                asyncio.run(main(body, seen))
            runs.append(seen)
        undecorated, seen = runs
        multithreading = _STATE_QUERIES.index(torch._C._is_multithreading_enabled)
        self.assertEqual(
            [state[multithreading] for state in seen],
            ["True", "False", "True", "False"],
        )
        own = state_under("no_grad")
        self.assertEqual(seen, [as_carried("no_grad", s, own) for s in undecorated])


instantiate_parametrized_tests(TestGradModeSuspendAsync)
instantiate_parametrized_tests(TestGradModeOtherContextsAsync)
instantiate_parametrized_tests(TestGradModeSuspendAsyncFixes)


if __name__ == "__main__":
    run_tests()
