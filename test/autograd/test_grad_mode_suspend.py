# Owner(s): ["module: autograd"]
"""Grad-mode decorators on generators.

A grad mode (no_grad, enable_grad, set_grad_enabled, inference_mode) used as
a decorator covers each step of a generator: the body starts from its caller's
autograd state with the decorator applied, keeps the mode blocks it opens
across its own ``yield``, and its caller gets exactly its own autograd state
back after every step.  Any other decorating context is entered afresh around
each step and owns no autograd state.
"""

import contextlib
import functools
import inspect
import itertools
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
# autograd state around generators that the decorators step eagerly.
_DYNAMO_SKIP = "checks thread state around eagerly stepped generators"

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


class AutogradStateTestCase(TestCase):
    def setUp(self):
        super().setUp()
        # Should a failing test leave the thread's autograd state changed, the
        # guard's exit puts all of it back, with the local dispatch key sets,
        # as it found them: no failure spills into the tests after it.
        guard = torch._C._InferenceMode(torch.is_inference_mode_enabled())
        guard.__enter__()
        self.addCleanup(guard.__exit__, None, None, None)


@skipIfTorchDynamo(_DYNAMO_SKIP)
class TestGradModeSuspend(AutogradStateTestCase):
    def step_in_each_caller_mode(self, gen):
        """Step *gen* to its end from each caller mode in turn, checking each
        step gives the caller back its whole state; return the generator's result."""
        for contexts in itertools.cycle(CALLER_MODES):
            with enter_all(contexts):
                before = autograd_state()
                try:
                    gen.send(None)
                except StopIteration as stop:
                    return stop.value
                finally:
                    self.assertEqual(autograd_state(), before)

    @parametrize("decorator", DECORATORS)
    def test_body_keeps_its_own_blocks(self, decorator):
        seen = []

        def gen():
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
            result = self.step_in_each_caller_mode(decorate(decorator, gen)())
        self.assertEqual(result, "done")
        self.assertEqual(seen[0], first)
        inside = seen[1]
        self.assertNotEqual(inside, first)
        self.assertEqual(seen[1:-1], [inside] * (len(CALLER_MODES) + 1))
        self.assertEqual(seen[-1], first)

    @parametrize("decorator", DECORATORS)
    def test_caller_gets_its_own_state_back(self, decorator):
        body_blocks = (
            lambda: torch.inference_mode(not torch.is_inference_mode_enabled()),
            lambda: torch.set_grad_enabled(not torch.is_grad_enabled()),
            no_multithreading,
            lambda: _force_original_view_tracking(True),
            lambda: fwAD._set_fwd_grad_enabled(False),
            lambda: enforce_grad_layout_policy(False),
        )

        def gen():
            with contextlib.ExitStack() as stack:
                for block in body_blocks:
                    stack.enter_context(block())
                    yield
                torch._C._set_graph_exec_group(GraphExecGroup())
                torch._C._set_grad_enabled(not torch.is_grad_enabled())
                yield

        self.step_in_each_caller_mode(decorate(decorator, gen)())

    @parametrize("decorator", DECORATORS)
    def test_send_throw_close(self, decorator):
        log = []

        def gen():
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

        body = decorate(decorator, gen)()
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

    @parametrize("decorator", DECORATORS)
    def test_exceptions_propagate_unchanged(self, decorator):
        def gen(exc, where):
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
                body = decorate(decorator, gen)(exc, where)
                if where != "raised on entry":
                    body.send(None)  # to the yield
                with torch.inference_mode():
                    before = autograd_state()
                    with self.assertRaises(error) as caught:
                        body.throw(exc) if where == "thrown in" else body.send(None)
                    self.assertIs(caught.exception, exc)
                    self.assertEqual(autograd_state(), before)

    @parametrize("decorator", DECORATORS)
    def test_generator_that_ignores_generator_exit_stays_resumable(self, decorator):
        def gen():
            with no_multithreading():
                try:
                    yield autograd_state()
                except GeneratorExit:
                    pass
                yield "ignored GeneratorExit"
                yield autograd_state()

        body = decorate(decorator, gen)()
        first = next(body)
        with torch.inference_mode():
            before = autograd_state()
            with self.assertRaisesRegex(RuntimeError, "ignored GeneratorExit"):
                body.close()
            self.assertEqual(autograd_state(), before)
            self.assertEqual(next(body), first)
        body.close()

    @parametrize("decorator", DECORATORS)
    def test_close_and_finalisation_run_in_the_body_mode(self, decorator):
        for end in ("closed", "dropped"):
            with self.subTest(end=end):
                log = []

                def gen():
                    with no_multithreading():
                        try:
                            log.append(autograd_state())
                            yield
                        finally:
                            log.append(autograd_state())

                body = decorate(decorator, gen)()
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

    def test_keeps_kind_and_metadata(self):
        def gen(a, b=1):
            """Doc."""
            yield a

        for decorator in DECORATORS:
            with self.subTest(decorator=decorator):
                decorated = decorate(decorator, gen)
                self.assertTrue(inspect.isgeneratorfunction(decorated))
                self.assertFalse(inspect.iscoroutinefunction(decorated))
                self.assertFalse(inspect.isasyncgenfunction(decorated))
                for name in ("__name__", "__qualname__", "__doc__", "__module__"):
                    self.assertEqual(getattr(decorated, name), getattr(gen, name))
                self.assertIs(decorated.__wrapped__, gen)
                self.assertEqual(inspect.signature(decorated), inspect.signature(gen))
                self.assertTrue(inspect.isgenerator(decorated(1)))


@skipIfTorchDynamo(_DYNAMO_SKIP)
class TestGradModeOtherContexts(AutogradStateTestCase):
    """Contexts that are not grad modes are entered afresh around each step."""

    @parametrize("context", OTHER_CONTEXTS)
    def test_entered_per_step_and_owning_no_grad_mode(self, context):
        make_decorator, body_sees = OTHER_CONTEXTS[context]
        log = []

        def gen():
            while True:
                yield torch.is_grad_enabled()

        body = make_decorator(log)(gen)()
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

    @parametrize("override", ["nothing", "clone", "__init__"])
    def test_subclass_is_a_grad_mode_unless_it_overrides_how_it_is_made(self, override):
        # Overriding clone or __init__ (or __enter__/__exit__) may do more
        # than set the autograd state: such a subclass is entered per step.
        namespace = {
            "nothing": {},
            "clone": {"clone": lambda self: type(self)()},
            "__init__": {"__init__": lambda self: torch.no_grad.__init__(self)},
        }[override]
        subclass = type("NoGradSubclass", (torch.no_grad,), namespace)

        def gen():
            seen = [torch.is_grad_enabled()]
            with torch.enable_grad():
                yield
                seen.append(torch.is_grad_enabled())
            seen.append(torch.is_grad_enabled())
            yield seen

        body = subclass()(gen)()
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
class TestGradModeSuspendFixes(AutogradStateTestCase):
    """Cases the previous versions of the decorators got wrong."""

    def test_set_stance_body_sees_the_callers_grad_mode(self):
        def body():
            while True:
                yield torch.is_grad_enabled()

        gen = torch.compiler.set_stance("force_eager")(body)()
        self.assertTrue(next(gen))
        with torch.no_grad():
            self.assertFalse(next(gen))
        gen.close()

    def test_inference_mode_false_body_key_guard_does_not_leak(self):
        autograd_cpu = torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradCPU)

        @torch.inference_mode(False)
        def body():
            with torch._C._ExcludeDispatchKeyGuard(autograd_cpu):
                yield
                yield

        x = torch.ones(1, requires_grad=True)
        before = autograd_state()
        gen = body()
        for _ in range(2):
            next(gen)
            self.assertEqual(autograd_state(), before)
            self.assertIsNotNone((x * 2).grad_fn)
        gen.close()
        self.assertEqual(autograd_state(), before)

    def test_yielded_value_is_freed_once_the_caller_drops_it(self):
        @torch.no_grad()
        def gen():
            while True:
                yield Payload()

        body = gen()
        with disable_gc():
            value = weakref.ref(next(body))
            self.assertIsNone(value())
        body.close()

    def test_no_reference_to_the_callers_state_between_steps(self):
        @torch.no_grad()
        def gen():
            yield
            yield

        body = gen()
        next(body)
        with disable_gc():
            group = GraphExecGroup()
            with group:
                next(body)
            group = weakref.ref(group)
            self.assertIsNone(group())
        body.close()

    @parametrize("fail", ("raise", "throw", "caught"))
    def test_failing_step_leaves_no_cycle(self, fail):
        @torch.no_grad()
        def gen():
            witness = Payload()
            try:
                yield weakref.ref(witness)
            except Boom:
                if fail != "caught":
                    raise
                return
            raise Boom

        with disable_gc():
            body = gen()
            witness = next(body)
            try:
                body.throw(Boom()) if fail != "raise" else next(body)
            except (Boom, StopIteration):
                pass
            self.assertIsNone(witness())

    def test_partial_without_warnings(self):
        def gen(n):
            for _ in range(n):
                yield torch.is_grad_enabled()

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            body = torch.no_grad()(functools.partial(gen, 2))()
            self.assertEqual([next(body), next(body)], [False, False])
            self.assertTrue(torch.is_grad_enabled())
            body.close()

    def test_sent_value_is_not_kept(self):
        @torch.no_grad()
        def gen():
            while True:
                yield  # and drops what it is sent

        with disable_gc():
            body = gen()
            next(body)
            sent = Payload()
            ref = weakref.ref(sent)
            body.send(sent)
            del sent
            self.assertIsNone(ref())
            body.close()

    def test_compiled_function_steps_a_decorated_generator(self):
        @torch.no_grad()
        def gen(x):
            yield x * 2

        def f(x):
            return next(gen(x)) + 1

        x = torch.ones(2, requires_grad=True)
        out = torch.compile(f, backend="eager", fullgraph=True)(x)
        self.assertFalse(out.requires_grad)
        self.assertEqual(out, f(x))


instantiate_parametrized_tests(TestGradModeSuspend)
instantiate_parametrized_tests(TestGradModeOtherContexts)
instantiate_parametrized_tests(TestGradModeSuspendFixes)


if __name__ == "__main__":
    run_tests()
