# Owner(s): ["module: autograd"]
"""Grad-mode decorators on coroutines and async generators.

A grad mode (no_grad, enable_grad, set_grad_enabled, inference_mode) used as
a decorator covers each step of an ``async def`` coroutine or async generator:
the body starts from its caller's autograd state with the decorator applied,
keeps the mode blocks it opens across its own ``await``/``yield``, and whoever
steps it (an event loop's task, or a caller sending to it) gets exactly its
own autograd state back after every step.  Any other decorating context is
entered afresh around each step and owns no autograd state.

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

# The context each grad-mode decorator applies; "no_grad_bare" is @torch.no_grad.
DECORATORS = {
    "no_grad": torch.no_grad,
    "no_grad_bare": torch.no_grad,
    "enable_grad": torch.enable_grad,
    "set_grad_enabled_False": lambda: torch.set_grad_enabled(False),
    "set_grad_enabled_True": lambda: torch.set_grad_enabled(True),
    "inference_mode": torch.inference_mode,
    "inference_mode_False": lambda: torch.inference_mode(False),
}

# The whole autograd state of a thread: the flags a grad mode owns, and the
# local dispatch key sets whose bits inference mode toggles.
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


def no_multithreading():
    return set_multithreading_enabled(False)


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
    (GraphExecGroup,),
)


def autograd_state():
    return tuple(repr(query()) for query in _STATE_QUERIES)


@contextlib.contextmanager
def enter_all(contexts):
    with contextlib.ExitStack() as stack:
        for context in contexts:
            stack.enter_context(context())
        yield


def decorate(decorator, func):
    if decorator == "no_grad_bare":
        return torch.no_grad(func)
    return DECORATORS[decorator]()(func)


def state_under(decorator, *blocks):
    """The state a body starts in when called now, after opening *blocks*."""
    with DECORATORS[decorator](), enter_all(blocks):
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


class Boom(Exception):
    pass


class Payload:
    """An object to watch the lifetime of with a weak reference."""


class Counting(_DecoratorContextManager):
    """A context that is not a grad mode: it only logs being entered and left."""

    def __init__(self, log):
        self.log = log

    def clone(self):
        return Counting(self.log)

    def __enter__(self):
        self.log.append("enter")

    def __exit__(self, *exc_info):
        self.log.append("exit")


@contextlib.contextmanager
def counting(log):
    log.append("enter")
    try:
        yield
    finally:
        log.append("exit")


def loud_no_grad(log):
    class LoudNoGrad(torch.no_grad):
        """Overrides __enter__, so it is no longer a grad mode."""

        def __enter__(self):
            log.append("enter")
            return super().__enter__()

    return LoudNoGrad()


# Contexts that are not grad modes, as decorators: name -> (make the
# decorator from a log, the grad mode the body sees for a caller's).
OTHER_CONTEXTS = {
    "set_stance": (lambda log: torch.compiler.set_stance("force_eager"), None),
    "DecoratorContextManager": (Counting, None),
    "context_decorator": (
        lambda log: lambda func: context_decorator(lambda: counting(log), func),
        None,
    ),
    "no_grad_overriding_enter": (loud_no_grad, False),
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
    def step_in_each_caller_mode(self, body):
        """Step *body* to its end from each caller mode in turn, checking each
        step gives the caller back its whole state; return the body's result."""
        for contexts in itertools.cycle(CALLER_MODES):
            with enter_all(contexts):
                before = autograd_state()
                try:
                    body.send(None)
                except StopIteration as stop:
                    return stop.value
                finally:
                    self.assertEqual(autograd_state(), before)

    @parametrize("kind", KINDS)
    @parametrize("decorator", DECORATORS)
    def test_body_keeps_its_own_blocks(self, decorator, kind):
        seen = []

        def script():
            seen.append(autograd_state())
            with torch.set_grad_enabled(not torch.is_grad_enabled()):
                with no_multithreading():
                    for _ in CALLER_MODES:
                        seen.append(autograd_state())
                        yield
                    seen.append(autograd_state())
            seen.append(autograd_state())
            return "done"  # noqa: B901 (the result, in StopIteration)

        with torch.inference_mode():
            first = state_under(decorator)
            body = start(kind, decorate(decorator, of_kind(kind, script)))
            result = self.step_in_each_caller_mode(body)
        if kind == "coroutine":
            self.assertEqual(result, "done")
        self.assertEqual(seen[0], first)
        inside = seen[1]
        self.assertNotEqual(inside, first)
        self.assertEqual(seen[1:-1], [inside] * (len(CALLER_MODES) + 1))
        self.assertEqual(seen[-1], first)

    @parametrize("kind", KINDS)
    @parametrize("decorator", DECORATORS)
    def test_caller_gets_its_own_state_back(self, decorator, kind):
        body_blocks = (
            lambda: torch.inference_mode(not torch.is_inference_mode_enabled()),
            lambda: torch.set_grad_enabled(not torch.is_grad_enabled()),
            no_multithreading,
            lambda: _force_original_view_tracking(True),
            lambda: fwAD._set_fwd_grad_enabled(False),
            lambda: enforce_grad_layout_policy(False),
        )

        def script():
            with contextlib.ExitStack() as stack:
                for block in body_blocks:
                    stack.enter_context(block())
                    yield
                torch._C._set_graph_exec_group(GraphExecGroup())
                torch._C._set_grad_enabled(not torch.is_grad_enabled())
                yield

        body = start(kind, decorate(decorator, of_kind(kind, script)))
        self.step_in_each_caller_mode(body)

    @parametrize("kind", KINDS)
    @parametrize("decorator", DECORATORS)
    def test_tasks_on_one_loop_keep_their_own_state(self, decorator, kind):
        seen = {}

        def script(name, block):
            with block():
                for _ in range(4):
                    seen.setdefault(name, []).append(autograd_state())
                    yield

        def body(name, block):
            return decorate(decorator, of_kind(kind, lambda: script(name, block)))

        async def noise():  # undecorated, holds a different mode at each await
            await asyncio.sleep(0)  # once the bodies have started from ours
            for contexts in CALLER_MODES:
                with enter_all(contexts):
                    await asyncio.sleep(0)

        async def main():
            await asyncio.gather(
                run_in_task(kind, body("a", torch.no_grad)),
                run_in_task(kind, body("b", torch.inference_mode)),
                noise(),
                run_in_task(kind, body("c", no_multithreading)),
            )

        expected = {
            "a": state_under(decorator, torch.no_grad),
            "b": state_under(decorator, torch.inference_mode),
            "c": state_under(decorator, no_multithreading),
        }
        before = autograd_state()
        asyncio.run(main())
        self.assertEqual(autograd_state(), before)
        self.assertEqual(seen, {name: [s] * 4 for name, s in expected.items()})

    @parametrize("kind", KINDS)
    @parametrize("decorator", DECORATORS)
    def test_send_throw_close(self, decorator, kind):
        log = []

        def script():
            mode = autograd_state()
            try:
                log.append((yield "first"))
                try:
                    yield "second"
                except Boom:
                    log.append(("caught", autograd_state() == mode))
                yield "third"
            finally:
                log.append(("finally", autograd_state() == mode))

        body = start(kind, decorate(decorator, of_kind(kind, script)))
        with torch.inference_mode():
            self.assertEqual(body.send(None), "first")
        with torch.no_grad():
            self.assertEqual(body.send("sent"), "second")
            before = autograd_state()
            self.assertEqual(body.throw(Boom()), "third")
            self.assertEqual(autograd_state(), before)
        with no_multithreading():
            before = autograd_state()
            body.close()
            self.assertEqual(autograd_state(), before)
        self.assertEqual(log, ["sent", ("caught", True), ("finally", True)])

    @parametrize("kind", KINDS)
    @parametrize("decorator", DECORATORS)
    def test_exceptions_propagate_unchanged(self, decorator, kind):
        def script(exc, where):
            mode = autograd_state()
            if where == "raised on entry":
                raise exc
            try:
                yield
                if where == "raised on resume":
                    raise exc
            except BaseException:
                self.assertEqual(autograd_state(), mode)
                raise

        errors = (Boom, KeyboardInterrupt, SystemExit, GeneratorExit)
        wheres = ("raised on entry", "raised on resume", "thrown in")
        for error, where in itertools.product(errors, wheres):
            with self.subTest(error=error.__name__, where=where):
                exc = error("the original")
                func = decorate(decorator, of_kind(kind, script))
                body = start(kind, func, exc, where)
                if where != "raised on entry":
                    body.send(None)  # to the yield
                with torch.inference_mode():
                    before = autograd_state()
                    with self.assertRaises(error) as caught:
                        body.throw(exc) if where == "thrown in" else body.send(None)
                    self.assertIs(caught.exception, exc)
                    self.assertEqual(autograd_state(), before)

    @parametrize("kind", KINDS)
    @parametrize("decorator", DECORATORS)
    def test_close_and_finalisation_run_in_the_body_mode(self, decorator, kind):
        for end in ("closed", "dropped"):
            with self.subTest(end=end):
                log = []

                def script():
                    with no_multithreading():
                        try:
                            log.append(autograd_state())
                            yield
                        finally:
                            log.append(autograd_state())

                body = start(kind, decorate(decorator, of_kind(kind, script)))
                body.send(None)
                with torch.inference_mode(), GraphExecGroup():
                    before = autograd_state()
                    if end == "closed":
                        body.close()
                    else:
                        del body
                    self.assertEqual(autograd_state(), before)
                self.assertEqual(log, [log[0]] * 2)
                self.assertEqual(log[0], state_under(decorator, no_multithreading))

    @parametrize("decorator", DECORATORS)
    def test_asyncio_run_closes_a_suspended_async_generator_in_its_mode(
        self, decorator
    ):
        log = []
        alive = []

        async def agen():
            with no_multithreading():
                try:
                    log.append(autograd_state())
                    yield
                finally:
                    log.append(autograd_state())

        async def main():
            alive.append(decorate(decorator, agen)())
            await alive[0].asend(None)  # left suspended for the loop to close

        asyncio.run(main())
        self.assertEqual(log, [log[0]] * 2)
        self.assertEqual(log[0], state_under(decorator, no_multithreading))

    @parametrize("kind", KINDS)
    @parametrize("decorator", DECORATORS)
    def test_cancellation_is_delivered_in_the_body_mode(self, decorator, kind):
        log = []

        async def wait_forever():
            await asyncio.get_running_loop().create_future()

        async def coroutine():
            with no_multithreading():
                log.append(autograd_state())
                try:
                    await wait_forever()
                except asyncio.CancelledError:
                    log.append(autograd_state())
                    raise

        async def async_generator():
            await coroutine()
            yield

        funcs = {"coroutine": coroutine, "async_generator": async_generator}

        async def main():
            func = decorate(decorator, funcs[kind])
            task = asyncio.create_task(run_in_task(kind, func))
            await asyncio.sleep(0)
            with torch.inference_mode():
                before = autograd_state()
                task.cancel()
                with self.assertRaises(asyncio.CancelledError):
                    await task
                self.assertEqual(autograd_state(), before)

        asyncio.run(main())
        self.assertEqual(log, [state_under(decorator, no_multithreading)] * 2)

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
    """Contexts that are not grad modes are entered afresh around each step."""

    @parametrize("kind", KINDS)
    @parametrize("context", OTHER_CONTEXTS)
    def test_entered_per_step_and_owning_no_grad_mode(self, context, kind):
        make_decorator, body_sees = OTHER_CONTEXTS[context]
        log = []

        def script():
            while True:
                yield torch.is_grad_enabled()

        body = start(kind, make_decorator(log)(of_kind(kind, script)))
        callers = [True, False, True, False]
        seen = []
        for mode in callers:
            with torch.set_grad_enabled(mode):
                seen.append(body.send(None))
                self.assertIs(torch.is_grad_enabled(), mode)
        body.close()
        expected = callers if body_sees is None else [body_sees] * len(callers)
        self.assertEqual(seen, expected)
        if context != "set_stance":
            self.assertEqual(log.count("enter"), len(callers) + 1)  # and close

    @parametrize("kind", KINDS)
    @parametrize("override", ["nothing", "clone", "__init__"])
    def test_subclass_is_a_grad_mode_unless_it_overrides_how_it_is_made(
        self, override, kind
    ):
        # Overriding clone or __init__ (or __enter__/__exit__) may do more
        # than set the autograd state: such a subclass is entered per step.
        namespace = {
            "nothing": {},
            "clone": {"clone": lambda self: type(self)()},
            "__init__": {"__init__": lambda self: torch.no_grad.__init__(self)},
        }[override]
        subclass = type("NoGradSubclass", (torch.no_grad,), namespace)

        def script():
            seen = [torch.is_grad_enabled()]
            with torch.enable_grad():
                yield
                seen.append(torch.is_grad_enabled())
            seen.append(torch.is_grad_enabled())
            yield seen

        body = start(kind, subclass()(of_kind(kind, script)))
        body.send(None)
        with torch.no_grad():
            seen = body.send(None)
            self.assertFalse(torch.is_grad_enabled())
        self.assertTrue(torch.is_grad_enabled())
        body.close()
        # Entered afresh per step, the body's block does not survive its yield.
        expected = (
            [False, True, False] if override == "nothing" else [False, False, False]
        )
        self.assertEqual(seen, expected)


@skipIfTorchDynamo(_DYNAMO_SKIP)
class TestGradModeSuspendAsyncFixes(AsyncAutogradStateTestCase):
    """Cases the previous versions of the decorators got wrong."""

    def test_plain_context_on_a_coroutine_is_entered_per_step(self):
        log = []

        @Counting(log)
        async def body():
            while True:
                await pause(torch.is_grad_enabled())

        coro = body()
        self.assertTrue(coro.send(None))
        with torch.no_grad():
            self.assertFalse(coro.send(None))
        coro.close()
        self.assertEqual(log, ["enter", "exit"] * 3)

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


instantiate_parametrized_tests(TestGradModeSuspendAsync)
instantiate_parametrized_tests(TestGradModeOtherContextsAsync)
instantiate_parametrized_tests(TestGradModeSuspendAsyncFixes)


if __name__ == "__main__":
    run_tests()
