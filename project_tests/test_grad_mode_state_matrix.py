# Owner(s): ["module: autograd"]
"""What a decorated generator, coroutine or async generator owns of the thread
state, and what not.

A grad-mode decorator owns, and a body it decorates carries, exactly the state
its own ``with`` block sets (issue #24): grad mode for ``no_grad``,
``enable_grad`` and ``set_grad_enabled``; its one flag for
``set_multithreading_enabled``, ``enforce_grad_layout_policy`` and
``_force_original_view_tracking``; the whole autograd mode state
(``c10::AutogradState`` and the dispatch key bits inference mode toggles) for
``inference_mode``.  For that state the body starts from its caller's with the
decorator applied, keeps its own across its suspensions, and the caller gets
its own back after every step.  Everything else -- the rest of the autograd
state, autocast, Python dispatch modes, dispatch key guards -- a decorated
body sees and changes exactly as the same body undecorated would.
"""

import concurrent.futures
import contextlib
import types
import warnings
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
    after the ``@``).  A single-flag mode's factory switches its flag when
    called (the function form); decorating with what it returns switches it
    back."""
    for cls in (torch.no_grad, torch.enable_grad, torch.inference_mode):
        yield cls.__name__, lambda cls=cls: cls()
        yield f"{cls.__name__}_bare", lambda cls=cls: cls
    grad_mode = torch.autograd.grad_mode
    for cls, mode in (
        (torch.set_grad_enabled, False),
        (torch.set_grad_enabled, True),
        (torch.inference_mode, False),
        (grad_mode.set_multithreading_enabled, False),
        (grad_mode.set_multithreading_enabled, True),
        (grad_mode.enforce_grad_layout_policy, False),
        (grad_mode.enforce_grad_layout_policy, True),
        (grad_mode._force_original_view_tracking, True),
        (grad_mode._force_original_view_tracking, False),
    ):
        yield f"{cls.__name__}_{mode}", lambda cls=cls, mode=mode: cls(mode)


DECORATORS = dict(_decorators())

# The positions in autograd_state() of what each decorator carries: grad mode,
# its one flag, or (inference_mode) all of it.
_GRAD, _MULTITHREADING, _VIEW_REPLAY, _GRAD_LAYOUT = 0, 3, 4, 5
CARRIED = {
    name: (
        (_GRAD,)
        if name.startswith(("no_grad", "enable_grad", "set_grad_enabled"))
        else tuple(range(9))
        if name.startswith("inference_mode")
        else (_MULTITHREADING,)
        if name.startswith("set_multithreading_enabled")
        else (_GRAD_LAYOUT,)
        if name.startswith("enforce_grad_layout_policy")
        else (_VIEW_REPLAY,)
    )
    for name in DECORATORS
}


def as_carried(decorator, state, own):
    """*state* (an ``autograd_state()``) with the part *decorator* carries taken
    from *own*."""
    carried = CARRIED[decorator]
    return tuple(
        mine if i in carried else theirs
        for i, (theirs, mine) in enumerate(zip(state, own))
    )


def context_of(make):
    """The context manager a decorator factory stands for (a bare spelling gives
    a class)."""
    ctx = make()
    return ctx() if isinstance(ctx, type) else ctx


def on_own_thread(fn, *args):
    """``fn(*args)`` on a new thread, which starts in the default autograd state."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(fn, *args).result()


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
    decorator applied; afterwards it keeps its own of what the decorator
    carries, and shares the rest with its callers, as undecorated."""

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

    @parametrize("setting", list(CALLER_SETTINGS))
    @parametrize("decorator", DECORATOR_NAMES)
    @parametrize("kind", KINDS)
    def test_caller_change_between_steps_reaches_body_unless_carried(
        self, kind, decorator, setting
    ):
        # The caller takes the first step plainly and the others inside a
        # setting: the body sees what the undecorated body sees, but for what
        # its decorator carries, which stays as its first step set it (a
        # caller's multithreading, view-replay, forward-AD or layout change
        # reaches a no_grad body; only inference_mode's body sees none).
        enter_setting = CALLER_SETTINGS[setting]

        def run(decorated):
            seen, after = [], []

            @contextlib.contextmanager
            def around(n):
                with enter_setting() if n else contextlib.nullcontext():
                    yield
                    after.append(autograd_state())

            body = _body(kind, contextlib.nullcontext, autograd_state, seen)
            if decorated:
                body = _decorator(decorator)()(body)
            _drive(kind, body, lambda: None, around)
            return seen, after

        def first():
            with context_of(_decorator(decorator)):
                return autograd_state()

        seen, after = on_own_thread(run, True)
        undecorated_seen, undecorated_after = on_own_thread(run, False)
        own = on_own_thread(first)
        self.assertEqual(len(seen), STEPS + 1)
        self.assertEqual(
            seen, [as_carried(decorator, state, own) for state in undecorated_seen]
        )
        self.assertEqual(after, undecorated_after)

    @parametrize("setting", list(CALLER_SETTINGS))
    @parametrize("decorator", DECORATOR_NAMES)
    @parametrize("kind", KINDS)
    def test_body_block_reaches_caller_unless_carried(self, kind, decorator, setting):
        # The body opens a setting's block across its suspensions: it keeps
        # the whole block, and its plain caller sees what the undecorated
        # body's does, but for what the decorator carries, which it gets back
        # as its own (the block of a no_grad body reaches its caller, but for
        # grad mode; inference_mode's reaches it not at all).
        enter_setting = CALLER_SETTINGS[setting]

        def run(decorated):
            seen, between = [], []
            body = _body(kind, enter_setting, autograd_state, seen)
            if decorated:
                body = _decorator(decorator)()(body)
            _drive(kind, body, lambda: between.append(autograd_state()))
            return seen, between

        def inside():
            with context_of(_decorator(decorator)), enter_setting():
                return autograd_state()

        seen, between = on_own_thread(run, True)
        undecorated_seen, undecorated_between = on_own_thread(run, False)
        own, plain = on_own_thread(inside), on_own_thread(autograd_state)
        self.assertEqual(len(seen), STEPS + 1)
        self.assertEqual(
            seen, [as_carried(decorator, state, own) for state in undecorated_seen]
        )
        self.assertEqual(
            between,
            [as_carried(decorator, state, plain) for state in undecorated_between],
        )


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
    """A subclass of a grad mode carries its parent's state unless it overrides
    clone, __enter__ or __exit__ without declaring its own _carried_state: one
    that keeps them (overriding only __init__, or nothing) is a grad mode,
    whose body keeps its own block across its suspensions.  One that
    overrides clone, __enter__ or __exit__ (which may set more) carries nothing
    and decorates as on stock torch: it is entered around each step of a
    generator, whose block it overrides from the second step on, and around
    only the call that makes a coroutine or async generator, whose block runs
    as undecorated."""

    @parametrize(
        "subclass",
        [
            "plain",
            "overriding_init",
            "overriding_clone",
            "overriding_enter",
            "overriding_exit",
            "overriding_enter_redeclaring",
        ],
    )
    @parametrize("kind", KINDS)
    def test_body_block_under_a_subclass(self, kind, subclass):
        class Plain(torch.no_grad):
            pass

        class OverridingInit(torch.no_grad):
            def __init__(self):
                super().__init__()
                self.tag = "made here"

        class OverridingClone(torch.no_grad):
            def clone(self):
                return OverridingClone()

        class OverridingEnter(torch.no_grad):
            def __enter__(self):
                super().__enter__()

        class OverridingExit(torch.no_grad):
            def __exit__(self, *exc_info):
                super().__exit__(*exc_info)

        class OverridingEnterRedeclaring(torch.no_grad):
            _carried_state = torch.no_grad._carried_state

            def __enter__(self):
                super().__enter__()

        cls = {
            "plain": Plain,
            "overriding_init": OverridingInit,
            "overriding_clone": OverridingClone,
            "overriding_enter": OverridingEnter,
            "overriding_exit": OverridingExit,
            "overriding_enter_redeclaring": OverridingEnterRedeclaring,
        }[subclass]

        def run(decorate):
            seen, between = [], []
            body = decorate(_body(kind, torch.enable_grad, torch.is_grad_enabled, seen))
            with torch.no_grad():
                _drive(kind, body, lambda: between.append(torch.is_grad_enabled()))
            return seen, between

        def around_the_call(func):
            # Stock torch's plain-function wrapper: the context is entered
            # around the call that makes the body only.
            def call():
                with cls():
                    return func()

            return call

        carried = ([True] * (STEPS + 1), [False] * STEPS)
        entered_each_step = ([True] + [False] * STEPS, [False] * STEPS)
        if subclass not in ("overriding_clone", "overriding_enter", "overriding_exit"):
            expected = carried
        elif kind == "generator":
            expected = entered_each_step
        else:
            expected = on_own_thread(run, around_the_call)
        self.assertEqual(on_own_thread(run, cls()), expected)


# autocast as a decorator carries its own device type's autocast state: that
# device's flag and dtype, the cache flag and the nesting count; every other
# device type's autocast state, and the autograd state, its body shares with
# its callers, as undecorated.

_AUTOCAST_DEVICES = ("cpu", "cuda")


def autocast_nesting():
    """The thread's autocast nesting count (ATen has no getter: one step up and
    back tells it)."""
    count = torch.autocast_increment_nesting()
    torch.autocast_decrement_nesting()
    return count - 1


def _without_autocast_keys(keyset_repr):
    inner = keyset_repr.removeprefix("DispatchKeySet(").removesuffix(")")
    return tuple(n for n in inner.split(", ") if n and not n.startswith("Autocast"))


def autocast_and_autograd_state():
    """autograd_state(), then each device type's autocast flag and dtype, the
    cache flag and the nesting count.  The key sets are without their
    Autocast keys: a device type's is its autocast flag, which comes after."""
    state = list(autograd_state())
    state[7:9] = map(_without_autocast_keys, state[7:9])
    for device in _AUTOCAST_DEVICES:
        state += [torch.is_autocast_enabled(device), torch.get_autocast_dtype(device)]
    return (*state, torch.is_autocast_cache_enabled(), autocast_nesting())


_AUTOGRAD_FIELDS = 9  # len(autograd_state())


def _autocast_fields(device):
    """The positions in autocast_and_autograd_state() of what autocast(device)
    carries."""
    at = _AUTOGRAD_FIELDS + 2 * _AUTOCAST_DEVICES.index(device)
    end = _AUTOGRAD_FIELDS + 2 * len(_AUTOCAST_DEVICES)
    return (at, at + 1, end, end + 1)


@contextlib.contextmanager
def _autocast_set(device=None, enabled=None, dtype=None, cache=None):
    """Set a device type's autocast flag or dtype, or the cache flag, as a block."""
    saved = autocast_and_autograd_state()
    try:
        if enabled is not None:
            torch.set_autocast_enabled(device, enabled)
        if dtype is not None:
            torch.set_autocast_dtype(device, dtype)
        if cache is not None:
            torch.set_autocast_cache_enabled(cache)
        yield
    finally:
        base = _AUTOGRAD_FIELDS
        for i, dev in enumerate(_AUTOCAST_DEVICES):
            torch.set_autocast_enabled(dev, saved[base + 2 * i])
            torch.set_autocast_dtype(dev, saved[base + 2 * i + 1])
        torch.set_autocast_cache_enabled(saved[base + 2 * len(_AUTOCAST_DEVICES)])


# Decorators: the device type each carries, and what goes after the ``@``.
AUTOCAST_DECORATORS = {
    "autocast_cpu_bf16": ("cpu", lambda: torch.autocast("cpu", dtype=torch.bfloat16)),
    "autocast_cpu_disabled": (
        "cpu",
        lambda: torch.autocast("cpu", dtype=torch.bfloat16, enabled=False),
    ),
    "cpu_amp_autocast": ("cpu", lambda: torch.cpu.amp.autocast(dtype=torch.bfloat16)),
}

# Changes of the autocast and autograd state: a caller's between steps, or a
# body's block across its suspensions.
AUTOCAST_CHANGES = {
    "cpu_off": lambda: _autocast_set("cpu", enabled=False),
    "cpu_on_float16": lambda: _autocast_set("cpu", enabled=True, dtype=torch.float16),
    "cuda_on": lambda: _autocast_set("cuda", enabled=True),
    "cuda_bfloat16": lambda: _autocast_set("cuda", dtype=torch.bfloat16),
    "cache_off": lambda: _autocast_set(cache=False),
    "no_grad": torch.no_grad,
    "inference_mode": torch.inference_mode,
}


def _quietly(make):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the deprecated torch.cpu.amp spelling
        return make()


def _as_autocast_carried(device, state, own):
    carried = _autocast_fields(device)
    return tuple(
        mine if i in carried else theirs
        for i, (theirs, mine) in enumerate(zip(state, own))
    )


@skipIfTorchDynamo(_DYNAMO_SKIP)
class TestAutocastCarriesItsDeviceType(TestCase):
    """A body decorated with autocast keeps its own device type's autocast
    state; its callers' changes of other device types' autocast state, and of
    the autograd state, reach it, and its own reach its callers, as
    undecorated."""

    @parametrize("change", list(AUTOCAST_CHANGES))
    @parametrize("decorator", list(AUTOCAST_DECORATORS))
    @parametrize("kind", KINDS)
    def test_caller_change_between_steps_reaches_body_unless_carried(
        self, kind, decorator, change
    ):
        device, make = AUTOCAST_DECORATORS[decorator]
        enter_change = AUTOCAST_CHANGES[change]

        def run(decorated):
            seen, after = [], []

            @contextlib.contextmanager
            def around(n):
                with enter_change() if n else contextlib.nullcontext():
                    yield
                    after.append(autocast_and_autograd_state())

            body = _body(
                kind, contextlib.nullcontext, autocast_and_autograd_state, seen
            )
            if decorated:
                body = _quietly(make)(body)
            _drive(kind, body, lambda: None, around)
            return seen, after

        def first():
            with _quietly(make):
                return autocast_and_autograd_state()

        seen, after = on_own_thread(run, True)
        undecorated_seen, undecorated_after = on_own_thread(run, False)
        own = on_own_thread(first)
        self.assertEqual(len(seen), STEPS + 1)
        self.assertEqual(
            seen,
            [_as_autocast_carried(device, s, own) for s in undecorated_seen],
        )
        self.assertEqual(after, undecorated_after)

    @parametrize("change", list(AUTOCAST_CHANGES))
    @parametrize("decorator", list(AUTOCAST_DECORATORS))
    @parametrize("kind", KINDS)
    def test_body_block_reaches_caller_unless_carried(self, kind, decorator, change):
        device, make = AUTOCAST_DECORATORS[decorator]
        enter_change = AUTOCAST_CHANGES[change]

        def run(decorated):
            seen, between = [], []
            body = _body(kind, enter_change, autocast_and_autograd_state, seen)
            if decorated:
                body = _quietly(make)(body)
            _drive(kind, body, lambda: between.append(autocast_and_autograd_state()))
            return seen, between, autocast_and_autograd_state()

        def inside():
            with _quietly(make), enter_change():
                return autocast_and_autograd_state()

        seen, between, after = on_own_thread(run, True)
        undecorated_seen, undecorated_between, _ = on_own_thread(run, False)
        own = on_own_thread(inside)
        plain = on_own_thread(autocast_and_autograd_state)
        self.assertEqual(len(seen), STEPS + 1)
        self.assertEqual(
            seen, [_as_autocast_carried(device, s, own) for s in undecorated_seen]
        )
        self.assertEqual(
            between,
            [_as_autocast_carried(device, s, plain) for s in undecorated_between],
        )
        self.assertEqual(after, plain)


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
instantiate_parametrized_tests(TestAutocastCarriesItsDeviceType)


if __name__ == "__main__":
    run_tests()
