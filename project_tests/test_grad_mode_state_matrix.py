# Owner(s): ["module: autograd"]
"""What a decorated generator, coroutine or async generator owns of the thread
state, and what not.

The grad-mode decorators own the autograd mode state (``c10::AutogradState``
and the dispatch key bits inference mode toggles).  For it, the body starts
from its caller's state with the decorator applied, and the caller gets its
own back after every step.  Everything else -- autocast, Python dispatch
modes, dispatch key guards -- a decorated body changes exactly as the same
body undecorated would.
"""

import concurrent.futures
import contextlib
import types
from unittest import mock

import torch
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    skipIfTorchDynamo,
    TestCase,
)


# Under PYTORCH_TEST_WITH_DYNAMO=1 Dynamo traces the test bodies themselves,
# which switch and inspect the thread's autograd state around suspended
# bodies the decorators step eagerly: the checks would test Dynamo's
# modelling of those calls, not the decorators.
_DYNAMO_SKIP = "checks thread state around eagerly stepped suspended bodies"


def autograd_state():
    """The whole autograd mode state a body or a caller can observe.

    Every ``AutogradState`` flag the Python API exposes, and the thread's
    local dispatch key sets: the bits inference mode toggles and, so that a
    change to any other bit shows too, all the rest.
    """
    C = torch._C
    return (
        C.is_grad_enabled(),
        C.is_inference_mode_enabled(),
        C._is_fwd_grad_enabled(),
        C._is_multithreading_enabled(),
        C._is_view_replay_enabled(),
        C._is_grad_layout_enforcement_enabled(),
        C._get_graph_exec_group(),
        repr(C._dispatch_tls_local_include_set()),
        repr(C._dispatch_tls_local_exclude_set()),
    )


def _decorators():
    """Every grad-mode decorator in every spelling: (name, factory of what goes
    after the ``@``)."""
    for cls in (torch.no_grad, torch.enable_grad, torch.inference_mode):
        yield cls.__name__, lambda cls=cls: cls()
        yield f"{cls.__name__}_bare", lambda cls=cls: cls
    for cls, mode in (
        (torch.set_grad_enabled, False),
        (torch.set_grad_enabled, True),
        (torch.inference_mode, False),
    ):
        yield f"{cls.__name__}_{mode}", lambda cls=cls, mode=mode: cls(mode)


DECORATORS = dict(_decorators())


def context_of(make):
    """The context manager a decorator factory stands for (a bare spelling gives
    a class)."""
    ctx = make()
    return ctx() if isinstance(ctx, type) else ctx


def on_own_thread(fn):
    """``fn()`` on a new thread, which starts in the default autograd state."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(fn).result()


KINDS = ("generator", "coroutine", "async_generator")
DECORATOR_NAMES = list(DECORATORS)
STEPS = 3

# The dispatch keys inference mode toggles (owned by the decorators).
_OWNED_KEY_NAMES = ("ADInplaceOrView", "Autograd")


def _decorator(name):
    return DECORATORS[name]


@types.coroutine
def _suspend():
    yield


def _body(kind, enter, observe, log):
    """An undecorated body of *kind* that opens ``enter()`` and suspends inside it."""
    if kind == "generator":

        def body():
            with enter():
                for _ in range(STEPS):
                    log.append(observe())
                    yield
                log.append(observe())

    elif kind == "coroutine":

        async def body():
            with enter():
                for _ in range(STEPS):
                    log.append(observe())
                    await _suspend()
                log.append(observe())

    else:

        async def body():
            with enter():
                for _ in range(STEPS):
                    log.append(observe())
                    yield
                log.append(observe())

    return body


def _steps(kind, body):
    """Run *body* to the end from this thread, yielding whenever it is suspended."""
    if kind == "generator":
        for _ in body():
            yield
        return
    if kind == "coroutine":
        coro = body()
        with contextlib.suppress(StopIteration):
            while True:
                coro.send(None)
                yield
        return
    agen = body()
    with contextlib.suppress(StopAsyncIteration):
        while True:
            with contextlib.suppress(StopIteration):
                agen.asend(None).send(None)
            yield


def _drive(kind, body, between, around=lambda step: contextlib.nullcontext()):
    """Run *body* to the end, each step inside ``around(n)``, calling *between()*
    at each suspension."""
    steps = _steps(kind, body)
    for n in range(STEPS + 1):
        with around(n):
            suspended = next(steps, False) is None
        if not suspended:
            return
        between()


def unowned_state():
    """The thread state the decorators must not touch, as a body or caller sees it."""
    C = torch._C

    def keys(keyset):
        inner = repr(keyset).removeprefix("DispatchKeySet(").removesuffix(")")
        names = inner.split(", ")
        return tuple(n for n in names if n and not n.startswith(_OWNED_KEY_NAMES))

    return (
        keys(C._dispatch_tls_local_include_set()),
        keys(C._dispatch_tls_local_exclude_set()),
        torch.is_autocast_enabled("cpu"),
        torch.get_autocast_dtype("cpu"),
        len(torch.utils._python_dispatch._get_current_dispatch_mode_stack()),
        len(torch.overrides._get_current_function_mode_stack()),
    )


def _run(kind, decorator, scenario):
    """What the body and its caller see of *scenario*, on a fresh thread;
    undecorated if *decorator* is None."""

    def run():
        enter, observe = scenario()
        seen, between = [], []
        body = _body(kind, enter, lambda: (observe(), unowned_state()), seen)
        if decorator is not None:
            body = _decorator(decorator)()(body)
        _drive(kind, body, lambda: between.append(unowned_state()))
        return seen, between

    return on_own_thread(run)


# Scenarios: a fresh (enter, observe) pair; the body opens enter() and
# observes across its suspensions.


def _autocast():
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    return (lambda: torch.autocast("cpu", dtype=torch.bfloat16)), (lambda: lin(x).dtype)


def _fake_tensor_mode():
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    return FakeTensorMode, (lambda: isinstance(torch.empty(2), FakeTensor))


def _flop_counter_mode():
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    a = torch.randn(4, 4)

    def observe():
        torch.mm(a, a)
        return counter.get_total_flops()

    return (lambda: counter), observe


def _exclude_key_guard():
    key = torch._C.DispatchKey.Functionalize
    keys = torch._C.DispatchKeySet(key)
    return (lambda: torch._C._ExcludeDispatchKeyGuard(keys)), (
        lambda: torch._C._dispatch_tls_is_dispatch_key_excluded(key)
    )


SCENARIOS = {
    "autocast": _autocast,
    "fake_tensor_mode": _fake_tensor_mode,
    "flop_counter_mode": _flop_counter_mode,
    "exclude_dispatch_key_guard": _exclude_key_guard,
}

# Caller settings the body must start from: owned state no decorator sets.
CALLER_SETTINGS = {
    "multithreading_off": lambda: torch.autograd.set_multithreading_enabled(False),
    "view_replay_on": lambda: torch.autograd.grad_mode._force_original_view_tracking(
        True
    ),
    "forward_ad_off": lambda: torch.autograd.forward_ad._set_fwd_grad_enabled(False),
    "grad_layout_relaxed": lambda: torch.autograd.grad_mode.enforce_grad_layout_policy(
        False
    ),
}


@skipIfTorchDynamo(_DYNAMO_SKIP)
class TestGradModeUnownedState(TestCase):
    """State the decorators do not own behaves as if the body were undecorated."""

    @parametrize("scenario", list(SCENARIOS))
    @parametrize("decorator", DECORATOR_NAMES)
    @parametrize("kind", KINDS)
    def test_body_sees_what_it_opened(self, kind, decorator, scenario):
        undecorated = _run(kind, None, SCENARIOS[scenario])
        decorated = _run(kind, decorator, SCENARIOS[scenario])
        self.assertEqual(decorated, undecorated)


@skipIfTorchDynamo(_DYNAMO_SKIP)
class TestGradModeOwnedState(TestCase):
    """The body starts from the caller's whole autograd mode state, with the
    decorator applied."""

    @parametrize("setting", list(CALLER_SETTINGS))
    @parametrize("decorator", DECORATOR_NAMES)
    @parametrize("kind", KINDS)
    def test_body_starts_from_callers_settings(self, kind, decorator, setting):
        enter_setting = CALLER_SETTINGS[setting]

        def expected():
            with enter_setting():
                outside = autograd_state()
                with context_of(_decorator(decorator)):
                    inside = autograd_state()
            return inside, outside

        def actual():
            seen, between = [], []
            with enter_setting():
                body = _decorator(decorator)()(
                    _body(kind, contextlib.nullcontext, autograd_state, seen)
                )
                _drive(kind, body, lambda: between.append(autograd_state()))
            return seen, between

        inside, outside = on_own_thread(expected)
        seen, between = on_own_thread(actual)
        self.assertEqual(seen, [inside] * (STEPS + 1))
        self.assertEqual(between, [outside] * STEPS)


@skipIfTorchDynamo(_DYNAMO_SKIP)
class TestGradModeKeyGuards(TestCase):
    """Autograd keys excluded by other code are not carried with the body."""

    # inference_mode(False) is left out: within such a guard, ``with
    # torch.inference_mode(False):`` lifts the exclusion and the decorator does
    # not (the key bits switch only with inference mode; see the notes' Limits).
    @parametrize(
        "decorator",
        [name for name in DECORATOR_NAMES if name != "inference_mode_False"],
    )
    @parametrize("kind", KINDS)
    def test_first_step_below_autograd(self, kind, decorator):
        # torch excludes the autograd keys around every __torch_dispatch__
        # (at::AutoDispatchBelowAutograd): a body first stepped from there
        # must not keep them excluded once it is stepped from plain code.
        def observe():
            return autograd_state(), (
                torch.ones(1, requires_grad=True) * 2
            ).requires_grad

        def first_below_autograd(n):
            return (
                torch._C._AutoDispatchBelowAutograd()
                if n == 0
                else contextlib.nullcontext()
            )

        def reference():
            # The undecorated body (it opens nothing itself), each step inside
            # the decorator.
            seen, between = [], []

            def around(n):
                stack = contextlib.ExitStack()
                stack.enter_context(first_below_autograd(n))
                stack.enter_context(context_of(_decorator(decorator)))
                return stack

            _drive(
                kind,
                _body(kind, contextlib.nullcontext, observe, seen),
                lambda: between.append(observe()),
                around,
            )
            return seen, between

        def decorated():
            seen, between = [], []
            body = _decorator(decorator)()(
                _body(kind, contextlib.nullcontext, observe, seen)
            )
            _drive(kind, body, lambda: between.append(observe()), first_below_autograd)
            return seen, between

        self.assertEqual(on_own_thread(decorated), on_own_thread(reference))


@skipIfTorchDynamo(_DYNAMO_SKIP)
class TestGradModeOtherContexts(TestCase):
    """A subclass of a grad mode that keeps its __enter__ and __exit__ is a grad
    mode: the body keeps its own block across its suspensions.  One that
    overrides __enter__ is not: it is entered around each step, and the body's
    block is overridden by it from the second step on, as stock torch does for
    generators."""

    @parametrize("subclass", ["plain", "overriding_enter"])
    @parametrize("kind", KINDS)
    def test_body_block_under_a_subclass(self, kind, subclass):
        class Plain(torch.no_grad):
            pass

        class OverridingEnter(torch.no_grad):
            def __enter__(self):
                super().__enter__()

        cls = {"plain": Plain, "overriding_enter": OverridingEnter}[subclass]

        def run():
            seen, between = [], []
            body = cls()(_body(kind, torch.enable_grad, torch.is_grad_enabled, seen))
            with torch.no_grad():
                _drive(kind, body, lambda: between.append(torch.is_grad_enabled()))
            return seen, between

        expected = {
            "plain": ([True] * (STEPS + 1), [False] * STEPS),
            "overriding_enter": ([True] + [False] * STEPS, [False] * STEPS),
        }[subclass]
        self.assertEqual(on_own_thread(run), expected)


@skipIfTorchDynamo(_DYNAMO_SKIP)
class TestGradModeStateCollection(TestCase):
    def test_graph_exec_group_cycle_through_suspended_body_is_collected(self):
        import gc
        import weakref

        from torch.utils.checkpoint import GraphExecGroup

        @torch.no_grad()
        def body():
            yield 1
            yield 2

        group = GraphExecGroup()
        with group:
            gen = body()
            next(gen)  # the body's saved state holds the group
        group.gen = gen  # group -> wrapper -> body mode -> saved state -> group
        alive = weakref.ref(group)
        del gen, group
        gc.collect()
        self.assertIsNone(alive())


class _Mixin:
    def __init__(self, *args, **kwargs):
        self.mixin_initialised = True
        super().__init__(*args, **kwargs)


@skipIfTorchDynamo(_DYNAMO_SKIP)
class TestGradModeCompatibility(TestCase):
    @parametrize(
        "cls", [torch.no_grad, torch.inference_mode], name_fn=lambda cls: cls.__name__
    )
    def test_mixin_init_runs(self, cls):
        mixed = type("Mixed", (cls, _Mixin), {})
        ctx = mixed()
        self.assertTrue(getattr(ctx, "mixin_initialised", False))
        with ctx:
            pass

    def test_inference_mode_enters_its_guard(self):
        entered = []

        class Guard(torch._C._InferenceMode):
            def __enter__(self):
                entered.append(self)
                return super().__enter__()

        with mock.patch.object(torch._C, "_InferenceMode", Guard):
            with torch.inference_mode():
                self.assertTrue(torch.is_inference_mode_enabled())
        self.assertEqual(len(entered), 1)
        self.assertFalse(torch.is_inference_mode_enabled())


instantiate_parametrized_tests(TestGradModeUnownedState)
instantiate_parametrized_tests(TestGradModeOwnedState)
instantiate_parametrized_tests(TestGradModeCompatibility)
instantiate_parametrized_tests(TestGradModeKeyGuards)
instantiate_parametrized_tests(TestGradModeOtherContexts)


if __name__ == "__main__":
    run_tests()
