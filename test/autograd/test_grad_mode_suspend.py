# Owner(s): ["module: autograd"]
"""Grad-mode decorators on generators.

A grad mode used as a decorator covers each step of a generator for the state
its own ``with`` block sets: grad mode for no_grad, enable_grad and
set_grad_enabled, its one flag for each single-flag mode.  The body starts
from its caller's state with the decorator entered, keeps its own changes to
that state across its ``yield``, and its caller gets its own back after every
step.  Any other state the body sees and changes as the undecorated body
would.  Any other decorating context is entered afresh around each step.
"""

import contextlib
import inspect
import itertools
import threading
import weakref

import torch
import torch.autograd.forward_ad as fwAD
from torch.autograd.grad_mode import (
    _force_original_view_tracking,
    enforce_grad_layout_policy,
    set_multithreading_enabled,
)
from torch.fx.experimental.proxy_tensor import make_fx
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


# Where a decorated generator may be stepped under tracing.
TRACERS = ("compile", "compile_fullgraph", "export_strict", "export", "make_fx")


def trace(run, x, tracer):
    """``run(x)``, *run* traced by *tracer* from ``TRACERS``."""
    if tracer.startswith("compile"):
        torch._dynamo.reset()
        return torch.compile(run, backend="eager", fullgraph=tracer != "compile")(x)
    if tracer == "make_fx":
        return make_fx(run, pre_dispatch=True)(x)(x)

    class Module(torch.nn.Module):
        def forward(self, x):
            return run(x)

    strict = tracer == "export_strict"
    return torch.export.export(Module(), (x,), strict=strict).module()(x)


def outputs(tensors):
    """What a step computed: each tensor's value, dtype, grad requirement and inference flag."""
    return [(t.tolist(), t.dtype, t.requires_grad, t.is_inference()) for t in tensors]


# Dynamo would trace the test bodies, which switch and inspect the thread's
# autograd state around generators that the decorators step eagerly.
_DYNAMO_SKIP = "checks thread state around eagerly stepped generators"

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

# The flags a single-flag block sets: query -> the block that flips it.
FLAG_BLOCKS = {
    torch.is_grad_enabled: lambda: torch.set_grad_enabled(not torch.is_grad_enabled()),
    torch._C._is_multithreading_enabled: lambda: set_multithreading_enabled(
        not torch._C._is_multithreading_enabled()
    ),
    torch._C._is_view_replay_enabled: lambda: _force_original_view_tracking(
        not torch._C._is_view_replay_enabled()
    ),
    torch._C._is_grad_layout_enforcement_enabled: lambda: enforce_grad_layout_policy(
        not torch._C._is_grad_layout_enforcement_enabled()
    ),
}

# Each decorator: the context it applies, and the flag its block sets (what
# its bodies carry).  "no_grad_bare" is @torch.no_grad.
DECORATORS = {
    "no_grad": (torch.no_grad, torch.is_grad_enabled),
    "no_grad_bare": (torch.no_grad, torch.is_grad_enabled),
    "enable_grad": (torch.enable_grad, torch.is_grad_enabled),
    "set_grad_enabled_False": (
        lambda: torch.set_grad_enabled(False),
        torch.is_grad_enabled,
    ),
    "set_grad_enabled_True": (
        lambda: torch.set_grad_enabled(True),
        torch.is_grad_enabled,
    ),
    "set_multithreading_enabled": (
        lambda: set_multithreading_enabled(False),
        torch._C._is_multithreading_enabled,
    ),
    "force_original_view_tracking": (
        lambda: _force_original_view_tracking(True),
        torch._C._is_view_replay_enabled,
    ),
    "enforce_grad_layout_policy": (
        lambda: enforce_grad_layout_policy(False),
        torch._C._is_grad_layout_enforcement_enabled,
    ),
}


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


def with_flag(state, flag, value):
    """*state* with *flag*'s entry replaced by *value*."""
    index = _STATE_QUERIES.index(flag)
    return state[:index] + (repr(value),) + state[index + 1 :]


@contextlib.contextmanager
def enter_all(contexts):
    with contextlib.ExitStack() as stack:
        for context in contexts:
            stack.enter_context(context())
        yield


def decorate(decorator, func):
    if decorator == "no_grad_bare":
        return torch.no_grad(func)
    return DECORATORS[decorator][0]()(func)


def mode_under(decorator):
    """The value of the flag *decorator* sets, in its block entered now."""
    context, flag = DECORATORS[decorator]
    with context():
        return flag()


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

    def __exit__(self, *exc_info):
        self.log.append(("exit", exc_info[0]))


@contextlib.contextmanager
def counting(log):
    log.append("enter")
    try:
        yield
    finally:
        log.append(("exit", None))


def loud_no_grad(log):
    class LoudNoGrad(torch.no_grad):
        """Overrides __enter__ and declares nothing, so it carries nothing."""

        def __enter__(self):
            log.append("enter")
            return super().__enter__()

    return LoudNoGrad()


# Contexts that carry nothing, as decorators: name -> (make the decorator
# from a log, the grad mode the body sees for a caller's).
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
        step gives the caller back its whole state; return the generator's
        result and the caller's state at each step."""
        callers = []
        for contexts in itertools.cycle(CALLER_MODES):
            with enter_all(contexts):
                before = autograd_state()
                callers.append(before)
                try:
                    gen.send(None)
                except StopIteration as stop:
                    return stop.value, callers
                finally:
                    self.assertEqual(autograd_state(), before)

    @parametrize("decorator", DECORATORS)
    def test_body_keeps_its_own_block_and_sees_the_rest_of_the_callers_state(
        self, decorator
    ):
        flag = DECORATORS[decorator][1]
        seen = []

        def gen():
            seen.append(autograd_state())
            with FLAG_BLOCKS[flag]():
                for _ in CALLER_MODES:
                    seen.append(autograd_state())
                    yield
                seen.append(autograd_state())
            seen.append(autograd_state())
            return "done"  # noqa: B901 (the result, in StopIteration)

        result, callers = self.step_in_each_caller_mode(decorate(decorator, gen)())
        self.assertEqual(result, "done")
        mode = mode_under(decorator)
        # Its own flag as its blocks left it, everything else its caller's.
        expected = (
            [with_flag(callers[0], flag, mode)]
            + [with_flag(caller, flag, not mode) for caller in callers]
            + [with_flag(callers[-1], flag, mode)]
        )
        self.assertEqual(seen, expected)

    @parametrize("decorator", DECORATORS)
    def test_caller_gets_its_own_state_back(self, decorator):
        flag = DECORATORS[decorator][1]

        def gen():
            with FLAG_BLOCKS[flag]():
                yield
            with FLAG_BLOCKS[flag]():
                yield
                FLAG_BLOCKS[flag]().__enter__()  # the function form, never undone
                yield
            yield

        self.step_in_each_caller_mode(decorate(decorator, gen)())

    @parametrize("decorator", DECORATORS)
    def test_state_it_does_not_carry_is_the_callers_as_undecorated(self, decorator):
        flag = DECORATORS[decorator][1]
        others = [query for query in FLAG_BLOCKS if query is not flag]

        def gen():
            while True:
                yield [query() for query in others]

        for body in (gen(), decorate(decorator, gen)()):
            seen = []
            next(body)
            for query in others:
                with FLAG_BLOCKS[query]():
                    seen.append(next(body))
            body.close()
            if body.gi_code is gen.__code__:
                undecorated = seen
        self.assertEqual(seen, undecorated)
        flipped = [[not q() if q is query else q() for q in others] for query in others]
        self.assertEqual(seen, flipped)

    @parametrize("decorator", DECORATORS)
    def test_block_it_does_not_carry_leaks_as_undecorated(self, decorator):
        # A block of state the decorator does not carry, left open across a
        # yield, is the caller's between steps, as in the undecorated body.
        def gen():
            with torch.inference_mode(not torch.is_inference_mode_enabled()):
                yield
                yield

        for body in (gen(), decorate(decorator, gen)()):
            next(body)
            self.assertTrue(torch.is_inference_mode_enabled())
            body.close()
            self.assertFalse(torch.is_inference_mode_enabled())

    @parametrize("decorator", DECORATORS)
    def test_send_throw_close(self, decorator):
        flag = DECORATORS[decorator][1]
        log = []

        def gen():
            mode = flag()
            try:
                log.append((yield "first"))
                try:
                    yield "second"
                except Boom:
                    log.append(("caught", flag() == mode))
                yield "third"
            finally:
                log.append(("finally", flag() == mode))

        body = decorate(decorator, gen)()
        with FLAG_BLOCKS[flag]():
            self.assertEqual(body.send(None), "first")
        with torch.no_grad(), no_multithreading():
            self.assertEqual(body.send("sent"), "second")
            before = autograd_state()
            self.assertEqual(body.throw(Boom()), "third")
            self.assertEqual(autograd_state(), before)
        with torch.inference_mode():
            before = autograd_state()
            body.close()
            self.assertEqual(autograd_state(), before)
        self.assertEqual(log, ["sent", ("caught", True), ("finally", True)])

    @parametrize("decorator", DECORATORS)
    def test_exceptions_propagate_unchanged(self, decorator):
        flag = DECORATORS[decorator][1]

        def gen(exc, where):
            mode = flag()
            if where == "raised on entry":
                raise exc
            try:
                yield
                if where == "raised on resume":
                    raise exc
            except BaseException:
                self.assertEqual(flag(), mode)
                raise

        errors = (Boom, KeyboardInterrupt, SystemExit, GeneratorExit)
        wheres = ("raised on entry", "raised on resume", "thrown in")
        for error, where in itertools.product(errors, wheres):
            with self.subTest(error=error.__name__, where=where):
                exc = error("the original")
                body = decorate(decorator, gen)(exc, where)
                if where != "raised on entry":
                    body.send(None)  # to the yield
                with torch.inference_mode(), FLAG_BLOCKS[flag]():
                    before = autograd_state()
                    with self.assertRaises(error) as caught:
                        body.throw(exc) if where == "thrown in" else body.send(None)
                    self.assertIs(caught.exception, exc)
                    self.assertEqual(autograd_state(), before)

    @parametrize("decorator", DECORATORS)
    def test_generator_that_ignores_generator_exit_stays_resumable(self, decorator):
        flag = DECORATORS[decorator][1]

        def gen():
            with FLAG_BLOCKS[flag]():
                try:
                    yield flag()
                except GeneratorExit:
                    pass
                yield "ignored GeneratorExit"
                yield flag()

        body = decorate(decorator, gen)()
        first = next(body)
        with torch.inference_mode(), FLAG_BLOCKS[flag]():
            before = autograd_state()
            with self.assertRaisesRegex(RuntimeError, "ignored GeneratorExit"):
                body.close()
            self.assertEqual(autograd_state(), before)
            self.assertEqual(next(body), first)
        body.close()

    @parametrize("decorator", DECORATORS)
    def test_close_and_finalisation_run_in_the_body_mode(self, decorator):
        flag = DECORATORS[decorator][1]
        for end in ("closed", "dropped"):
            with self.subTest(end=end):
                log = []

                def gen():
                    with FLAG_BLOCKS[flag]():
                        try:
                            log.append(flag())
                            yield
                        finally:
                            log.append(flag())

                body = decorate(decorator, gen)()
                body.send(None)
                with torch.inference_mode(), GraphExecGroup(), FLAG_BLOCKS[flag]():
                    before = autograd_state()
                    if end == "closed":
                        body.close()
                    else:
                        del body
                    self.assertEqual(autograd_state(), before)
                self.assertEqual(log, [not mode_under(decorator)] * 2)

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

    def test_stacked_decorators_each_carry_their_own(self):
        @torch.no_grad()
        @set_multithreading_enabled(False)
        def gen():
            while True:
                with torch.enable_grad(), no_multithreading():
                    pass
                yield torch.is_grad_enabled(), torch._C._is_multithreading_enabled()

        body = gen()
        with torch.enable_grad():
            self.assertEqual(next(body), (False, False))
            self.assertTrue(torch._C._is_multithreading_enabled())
            self.assertTrue(torch.is_grad_enabled())
        body.close()


@skipIfTorchDynamo(_DYNAMO_SKIP)
class TestGradModeOtherContexts(AutogradStateTestCase):
    """Contexts that carry nothing are entered afresh around each step."""

    @parametrize("context", OTHER_CONTEXTS)
    def test_entered_per_step_and_carrying_nothing(self, context):
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

    @parametrize("override", ["nothing", "clone", "__init__", "__enter__", "opt_out"])
    def test_subclass_carries_unless_it_overrides_how_it_is_entered(self, override):
        # A subclass that enters or exits otherwise, without declaring what
        # its block sets, carries nothing: it is entered afresh per step.
        namespace = {
            "nothing": {},
            "clone": {"clone": lambda self: type(self)()},
            "__init__": {"__init__": lambda self: torch.no_grad.__init__(self)},
            "__enter__": {"__enter__": lambda self: torch.no_grad.__enter__(self)},
            "opt_out": {"_carried_state": None},
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
        carries = override in ("nothing", "__init__")
        expected = [False, True, False] if carries else [False] * 3
        self.assertEqual(seen, expected)

    def test_subclass_making_a_richer_context_leaves_none_of_it_on(self):
        # Its clone() sets more than grad mode, which a carry would leave on
        # for the caller between steps: it carries nothing.
        class Richer(torch.no_grad):
            def clone(self):
                stack = contextlib.ExitStack()
                stack.enter_context(torch.no_grad())
                stack.enter_context(set_multithreading_enabled(False))
                return stack.pop_all()

        @Richer()
        def gen():
            yield torch._C._is_multithreading_enabled()
            yield

        body, before = gen(), autograd_state()
        self.assertFalse(next(body))
        self.assertEqual(autograd_state(), before)
        body.close()


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

    def test_exit_that_suppresses_ends_the_body_as_a_with_block_would(self):
        class SuppressingNoGrad(torch.no_grad):
            _carried_state = torch.no_grad._carried_state  # declared: carries grad mode

            def __exit__(self, *exc_info):
                super().__exit__(*exc_info)
                return True

        @SuppressingNoGrad()
        def gen():
            yield torch.is_grad_enabled()
            raise Boom

        self.assertEqual(list(gen()), [False])
        self.assertTrue(torch.is_grad_enabled())

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


@skipIfTorchDynamo("traces the generators itself")
class TestGradModeSuspendTraced(TestCase):
    """Stepped in traced code, a decorated generator computes what it does eagerly, or tracing fails."""

    @staticmethod
    def steps(shape):
        """Three steps of a ``no_grad`` generator whose body or caller changes grad mode as *shape* says."""

        @torch.no_grad()
        def gen(x):
            yield x * 2
            if shape == "own_call":
                torch.set_grad_enabled(True)
            with (
                torch.enable_grad()
                if shape == "own_block"
                else contextlib.nullcontext()
            ):
                yield x * 3
                yield x * 4

        def run(x):
            g = gen(x)
            caller = shape == "caller_changes"
            with torch.no_grad() if caller else contextlib.nullcontext():
                first = next(g)
            with torch.enable_grad() if caller else contextlib.nullcontext():
                second = next(g)
            return first, second, next(g)

        return run

    @parametrize("shape", ["plain", "own_block", "own_call", "caller_changes"])
    @parametrize("tracer", TRACERS)
    def test_traced_generator(self, shape, tracer):
        run, x = self.steps(shape), torch.ones(2, requires_grad=True)
        if shape.startswith("own") and tracer != "compile":
            # Entered at each step, the decorator would drop the body's own mode.
            with self.assertRaisesRegex(Exception, "of its own"):
                trace(run, x, tracer)
        else:  # the default compile runs the body's own mode's steps eagerly
            self.assertEqual(outputs(trace(run, x, tracer)), outputs(run(x)))

    @parametrize("fullgraph", [False, True])
    def test_refusal_is_no_error_traced_code_can_catch(self, fullgraph):
        # Dynamo breaks the graph instead: caught, the error would have made
        # the compiled code take its handler, where eager code never raises.
        @torch.no_grad()
        def gen(x):
            with torch.enable_grad():
                yield x * 2
            yield x * 3

        def run(x):
            try:
                return [y + 0 for y in gen(x)]
            except Exception:
                return [x + 0]

        x = torch.ones(2, requires_grad=True)
        if fullgraph:
            with self.assertRaisesRegex(Exception, "of its own"):
                trace(run, x, "compile_fullgraph")
        else:
            self.assertEqual(outputs(trace(run, x, "compile")), outputs(run(x)))

    def test_generator_first_stepped_in_traced_code_carries_afterwards(self):
        @torch.no_grad()
        def gen(x):
            yield x * 2
            with torch.enable_grad():
                yield x * 3
                yield x * 4

        kept = []

        def first_step(x):
            kept.append(gen(x))
            return next(kept[0])

        make_fx(first_step, pre_dispatch=True)(torch.ones(2, requires_grad=True))
        # Its traced step ended as it began: the rest of it carries its block.
        self.assertEqual([t.requires_grad for t in kept[0]], [True, True])

    def test_eager_generator_while_another_thread_compiles(self):
        # torch.compiler.is_compiling() is true for every thread meanwhile.
        compiling, done = threading.Event(), threading.Event()

        def backend(gm, example_inputs):
            compiling.set()
            done.wait(30)
            return gm.forward

        compiled = torch.compile(lambda x: x + 1, backend=backend)
        thread = threading.Thread(target=compiled, args=(torch.ones(1),))
        thread.start()
        try:
            self.assertTrue(compiling.wait(30))
            run, x = self.steps("own_block"), torch.ones(2, requires_grad=True)
            self.assertEqual([t.requires_grad for t in run(x)], [False, True, True])
        finally:
            done.set()
            thread.join()

    @parametrize("tracer", TRACERS)
    def test_exhausted_generator(self, tracer):
        # Stock's decorated generators fail under fullgraph=True: Dynamo 2.13
        # cannot trace a StopIteration leaving a with block in a generator's frame.
        @torch.no_grad()
        def gen(x):
            yield x * 2
            yield x * 3

        def run(x):
            return list(gen(x))

        x = torch.ones(2, requires_grad=True)
        self.assertEqual(outputs(trace(run, x, tracer)), outputs(run(x)))


instantiate_parametrized_tests(TestGradModeSuspend)
instantiate_parametrized_tests(TestGradModeOtherContexts)
instantiate_parametrized_tests(TestGradModeSuspendFixes)
instantiate_parametrized_tests(TestGradModeSuspendTraced)


if __name__ == "__main__":
    run_tests()
