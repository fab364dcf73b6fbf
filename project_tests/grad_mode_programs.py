"""Random programs and the two ways of running them, for the differential tests.

A *program* is a random body (a generator function, or an async generator or
coroutine function in the async tests), a decorator and a driver: the list of
requests its caller makes (``next``, ``send``, ``throw``, ``close``), each made
from inside a random caller setup.  Decorators, the blocks a body opens, the
switches it flips and the caller setups cover the grad modes, the single-flag
modes and autocast, so that callers and bodies change state a decorator
carries and state it does not.

By the contract (issue #24), a decorated suspendable body carries exactly the
state its decorator's own ``with`` block sets: it starts from its caller's
state with the decorator entered at its first step, keeps its own changes to
that state across suspensions, and its caller gets its own back after every
step; for every other kind of state it behaves as the undecorated body.

* The *oracle* runs the undecorated body.  For a decorator that carries flags
  (the grad modes, the single-flag modes, autocast: see ``Carry``) it runs it
  on the caller's thread and swaps only that state around each request: the
  caller's is saved and the body's installed (at its first step: the caller's
  with the decorator entered), and after the step the body's is saved and the
  caller's put back; the decorator is exited in the body's state where the
  body ends.  Everything else the caller changes reaches the body, and
  everything else the body changes reaches the caller.  ``inference_mode``
  carries the whole autograd state and the inference key bits, which Python
  cannot install: the oracle runs the body on a thread of its own that enters
  the caller's setup and the decorator at the body's first step, and hands the
  state ``inference_mode`` does not carry (autocast) over from the caller
  before each step and back after it.
* The *subject* runs the decorated body.

Each runs on a fresh thread of its own, the caller's, which makes every
request from inside its setup and records a leak whenever its state after a
request differs from before it: by the contract a body may leave state its
decorator does not carry changed, as the undecorated body would, and such a
leak must not reach a later program.  Both return the same kind of record --
every state the body observed, every request's outcome -- so one ``==``
compares them.

The tables are this module's own (the matrices in ``test_grad_mode_matrix.py``
and ``test_grad_mode_state_matrix.py`` have theirs).
"""

import asyncio
import concurrent.futures
import contextlib
import gc
import random
import warnings
from typing import Any, Callable, NamedTuple

import torch
from test_grad_mode_matrix import enter_all, on_own_thread

C = torch._C


class Boom(Exception):
    """The exception bodies raise, catch, and have thrown at them."""


# ---------------------------------------------------------------------------
# The state a body or a caller observes
# ---------------------------------------------------------------------------

DEVICES = ("cpu", "cuda")  # the autocast device types the tables touch


def autocast_nesting():
    """The thread's autocast nesting count (ATen has no getter: one step up and back tells it)."""
    count = torch.autocast_increment_nesting()
    torch.autocast_decrement_nesting()
    return count - 1


STATE_FIELDS = (
    "grad",
    "inference",
    "fwd_grad",
    "multithreading",
    "view_replay",
    "layout_enforcement",
    "graph_exec_group",
    "local_include_set",
    "local_exclude_set",
    *(f"autocast_{device}_{what}" for device in DEVICES for what in ("enabled", "dtype")),
    "autocast_cache",
    "autocast_nesting",
)


def observed_state():
    """Everything of the thread state the tables change, as a body or a caller sees it.

    Every ``AutogradState`` flag the Python API exposes, the thread's local
    dispatch key sets (inference mode's bits, autocast's enabled bits and all
    the rest), and autocast's flag and dtype per device type, cache flag and
    nesting count.
    """
    state = [
        C.is_grad_enabled(),
        C.is_inference_mode_enabled(),
        C._is_fwd_grad_enabled(),
        C._is_multithreading_enabled(),
        C._is_view_replay_enabled(),
        C._is_grad_layout_enforcement_enabled(),
        C._get_graph_exec_group(),
        repr(C._dispatch_tls_local_include_set()),
        repr(C._dispatch_tls_local_exclude_set()),
    ]
    for device in DEVICES:
        state += [torch.is_autocast_enabled(device), str(torch.get_autocast_dtype(device))]
    state += [torch.is_autocast_cache_enabled(), autocast_nesting()]
    return tuple(state)


# ---------------------------------------------------------------------------
# What a decorator carries: the oracle's own capture and install, from the
# public setters (not the patch's pairs)
# ---------------------------------------------------------------------------


class Carry:
    """A kind of thread state a decorated body carries: ``capture()`` reads it, ``install(value)`` sets it."""

    def __init__(self, name, capture, install):
        self.name, self.capture, self.install = name, capture, install

    def __repr__(self):
        return f"<carry {self.name}>"


def _flag(name, get, set_):
    return Carry(name, get, set_)


def _autocast(devices):
    """Autocast's flag and dtype for *devices*, its cache flag and its nesting count."""

    def capture():
        per_device = tuple((torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in devices)
        return per_device, torch.is_autocast_cache_enabled(), autocast_nesting()

    def install(value):
        per_device, cache, nesting = value
        for device, (enabled, dtype) in zip(devices, per_device):
            torch.set_autocast_enabled(device, enabled)
            torch.set_autocast_dtype(device, dtype)
        torch.set_autocast_cache_enabled(cache)
        now = autocast_nesting()
        for _ in range(now, nesting):
            torch.autocast_increment_nesting()
        for _ in range(nesting, now):
            torch.autocast_decrement_nesting()

    return Carry(f"autocast{list(devices)}", capture, install)


GRAD = _flag("grad", C.is_grad_enabled, C._set_grad_enabled)
MULTITHREADING = _flag("multithreading", C._is_multithreading_enabled, C._set_multithreading_enabled)
LAYOUT = _flag("layout", C._is_grad_layout_enforcement_enabled, C._set_grad_layout_enforcement_enabled)
VIEW_REPLAY = _flag("view_replay", C._is_view_replay_enabled, C._set_view_replay_enabled)
AUTOCAST_CPU = _autocast(("cpu",))
AUTOCAST_CUDA = _autocast(("cuda",))
# Every device type's autocast state: what inference_mode hands over between
# its body's thread and its caller's.  (Autocast carries its own device
# type's alone: a caller's change to another's reaches the body.)
AUTOCAST_ALL = _autocast(DEVICES)


def _autograd_flags():
    return (
        C.is_grad_enabled(),
        C.is_inference_mode_enabled(),
        C._is_fwd_grad_enabled(),
        C._is_multithreading_enabled(),
        C._is_view_replay_enabled(),
        C._is_grad_layout_enforcement_enabled(),
    )


# inference_mode: the whole AutogradState and the inference key bits, which
# only a thread of its own keeps (no install); its capture is for the noise
# tasks' checks.
INFERENCE = Carry("autograd_state", _autograd_flags, None)


# ---------------------------------------------------------------------------
# The tables
# ---------------------------------------------------------------------------


def quietly(make):
    """``make()`` with its warnings dropped (the deprecated spellings, cuda autocast on a CPU build)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return make()


def context_of(make):
    """The context manager a decorator factory stands for (a bare spelling gives a class)."""
    ctx = quietly(make)
    return ctx() if isinstance(ctx, type) else ctx


class Decorator(NamedTuple):
    make: Callable[[], Any]  # what goes after the ``@``
    carry: Carry
    # The decorator's state at decoration (autocast reads the thread's dtype
    # and cache flag when it is made): called where the subject decorates, it
    # returns the factory of the context the oracle enters at the first step.
    prepare: Callable[[], Callable[[], Any]]


def _grad_mode(make, carry):
    # Made anew at the first step, as clone() does (the single-flag modes set
    # their flag when made).
    return Decorator(make, carry, lambda: lambda: context_of(make))


def _autocast_decorator(make, carry):
    def prepare():
        instance = quietly(make)  # made at decoration, entered at the first step
        return lambda: instance

    return Decorator(make, carry, prepare)


DECORATORS = {
    "no_grad": _grad_mode(lambda: torch.no_grad(), GRAD),
    "no_grad_bare": _grad_mode(lambda: torch.no_grad, GRAD),
    "enable_grad": _grad_mode(lambda: torch.enable_grad(), GRAD),
    "enable_grad_bare": _grad_mode(lambda: torch.enable_grad, GRAD),
    "set_grad_enabled_False": _grad_mode(lambda: torch.set_grad_enabled(False), GRAD),
    "set_grad_enabled_True": _grad_mode(lambda: torch.set_grad_enabled(True), GRAD),
    "inference_mode": _grad_mode(lambda: torch.inference_mode(), INFERENCE),
    "inference_mode_bare": _grad_mode(lambda: torch.inference_mode, INFERENCE),
    "inference_mode_False": _grad_mode(lambda: torch.inference_mode(False), INFERENCE),
    "set_multithreading_enabled_False": _grad_mode(
        lambda: torch.autograd.set_multithreading_enabled(False), MULTITHREADING
    ),
    "set_multithreading_enabled_True": _grad_mode(
        lambda: torch.autograd.set_multithreading_enabled(True), MULTITHREADING
    ),
    "enforce_grad_layout_policy_True": _grad_mode(
        lambda: torch.autograd.grad_mode.enforce_grad_layout_policy(True), LAYOUT
    ),
    "enforce_grad_layout_policy_False": _grad_mode(
        lambda: torch.autograd.grad_mode.enforce_grad_layout_policy(False), LAYOUT
    ),
    "force_original_view_tracking_True": _grad_mode(
        lambda: torch.autograd.grad_mode._force_original_view_tracking(True), VIEW_REPLAY
    ),
    "force_original_view_tracking_False": _grad_mode(
        lambda: torch.autograd.grad_mode._force_original_view_tracking(False), VIEW_REPLAY
    ),
    "autocast_cpu_bf16": _autocast_decorator(lambda: torch.autocast("cpu", dtype=torch.bfloat16), AUTOCAST_CPU),
    "amp_autocast_cpu_f16_nocache": _autocast_decorator(
        lambda: torch.amp.autocast("cpu", dtype=torch.float16, cache_enabled=False), AUTOCAST_CPU
    ),
    "autocast_cpu_disabled": _autocast_decorator(lambda: torch.autocast("cpu", enabled=False), AUTOCAST_CPU),
    "cpu_amp_autocast": _autocast_decorator(lambda: torch.cpu.amp.autocast(), AUTOCAST_CPU),
    # On a CPU build cuda autocast warns and disables itself: still its own
    # device type's flag, dtype, cache flag and nesting that it sets.
    "autocast_cuda": _autocast_decorator(lambda: torch.autocast("cuda"), AUTOCAST_CUDA),
}


class SetAutocastEnabled:
    """A block that switches one device type's autocast flag and puts it back (no nesting, no dtype)."""

    def __init__(self, device, enabled):
        self.device, self.enabled = device, enabled

    def __enter__(self):
        self.prev = torch.is_autocast_enabled(self.device)
        torch.set_autocast_enabled(self.device, self.enabled)

    def __exit__(self, *exc):
        torch.set_autocast_enabled(self.device, self.prev)


# Blocks a body opens: every kind of state, carried or not by its decorator.
BLOCKS = {
    "no_grad": torch.no_grad,
    "enable_grad": torch.enable_grad,
    "set_grad_enabled_True": lambda: torch.set_grad_enabled(True),
    "set_grad_enabled_False": lambda: torch.set_grad_enabled(False),
    "inference_mode": torch.inference_mode,
    "inference_mode_False": lambda: torch.inference_mode(False),
    "multithreading_off": lambda: torch.autograd.set_multithreading_enabled(False),
    "multithreading_on": lambda: torch.autograd.set_multithreading_enabled(True),
    "view_replay_on": lambda: torch.autograd.grad_mode._force_original_view_tracking(True),
    "layout_relaxed": lambda: torch.autograd.grad_mode.enforce_grad_layout_policy(False),
    "fwd_grad_off": lambda: torch.autograd.forward_ad._set_fwd_grad_enabled(False),
    "autocast_cpu_f16": lambda: torch.autocast("cpu", dtype=torch.float16),
    "autocast_cpu_off_nocache": lambda: torch.autocast("cpu", enabled=False, cache_enabled=False),
    "autocast_cuda_flag_on": lambda: SetAutocastEnabled("cuda", True),
}

# Statements a body runs that switch one kind of state for good.
SWITCHES = [
    "torch.set_grad_enabled(True)",
    "torch.set_grad_enabled(False)",
    "torch._C._set_multithreading_enabled({})",
    "torch._C._set_view_replay_enabled({})",
    "torch._C._set_grad_layout_enforcement_enabled({})",
    "torch.set_autocast_enabled('cpu', {})",
    "torch.set_autocast_enabled('cuda', {})",
    "torch.set_autocast_dtype('cpu', torch.{})",
]

# Setups a caller may be in: the context managers to enter, in order.
CALLER_SETUPS = {
    "plain": [],
    "no_grad": [torch.no_grad],
    "inference_mode": [torch.inference_mode],
    "inference_mode_enable_grad": [torch.inference_mode, torch.enable_grad],
    "no_grad_inference_mode_False": [torch.no_grad, lambda: torch.inference_mode(False)],
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
    "autocast_cpu_f16": [lambda: torch.autocast("cpu", dtype=torch.float16)],
    "autocast_cpu_nocache_no_grad": [
        lambda: torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False),
        torch.no_grad,
    ],
    "autocast_cuda_flag": [lambda: SetAutocastEnabled("cuda", True)],
    "autocast_cuda_flag_cpu_off_multithreading_off": [
        lambda: SetAutocastEnabled("cuda", True),
        lambda: torch.autocast("cpu", enabled=False),
        lambda: torch.autograd.set_multithreading_enabled(False),
    ],
    "view_replay_layout_relaxed_autocast_cpu": [
        lambda: torch.autograd.grad_mode._force_original_view_tracking(True),
        lambda: torch.autograd.grad_mode.enforce_grad_layout_policy(False),
        lambda: torch.autocast("cpu"),
    ],
}

# The tables by position: a program names its decorator and caller setups by
# index, so that one random draw picks one.
DECORATOR_LIST = list(DECORATORS.items())
CALLER_LIST = list(CALLER_SETUPS.items())
BLOCK_NAMES = list(BLOCKS)


@contextlib.contextmanager
def collected_where_run():
    """No automatic collection while a program runs.

    A body left suspended (one that ignored GeneratorExit, say) runs its
    ``with`` exits where the collector finalises it, on whatever thread the
    collector happens to run, and would change that thread's state: another
    program's, or the test's.  So each run ends with ``gc.collect(1)`` on its
    own thread, and while it runs nothing is collected, so that nothing of it
    is promoted out of the young generations that collection examines (a full
    collection costs some 100 ms with torch loaded).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class Worker:
    """A thread of its own that runs the calls it is handed, one at a time."""

    def __init__(self):
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)

    def call(self, fn, *args):
        return self._pool.submit(fn, *args).result()

    def close(self):
        self._pool.shutdown()


# ---------------------------------------------------------------------------
# Programs
# ---------------------------------------------------------------------------


class Program:
    """One random body with its decorator, caller setups and driver."""

    def __init__(self, source, decorator, driver, kind="generator"):
        self.source = source
        self.decorator = decorator  # index into DECORATOR_LIST
        self.driver = driver  # [(request, index into CALLER_LIST)]
        self.kind = kind

    @property
    def decorator_name(self):
        return DECORATOR_LIST[self.decorator][0]

    @property
    def spec(self):
        return DECORATOR_LIST[self.decorator][1]

    def body(self):
        """A fresh undecorated body function compiled from the source."""
        namespace = {"torch": torch, "Boom": Boom, "blocks": BLOCKS}
        exec(self.source, namespace)
        return namespace["body"]

    def decorated(self):
        """A fresh decorated body function (decorated on the calling thread)."""
        return quietly(self.spec.make)(self.body())

    def first_entry_setup(self):
        """The caller setup in force when the body is first entered.

        Sending a value other than None to a body that has not started fails
        without entering it; the first other request enters it (or, for
        ``throw`` and ``close``, finishes it without running it at all).
        """
        for req, setup in self.driver:
            if req != "send":
                return setup
        return self.driver[-1][1]

    def describe(self):
        name = self.decorator_name
        steps = ", ".join(f"{req}@{CALLER_LIST[c][0]}" for req, c in self.driver)
        return f"decorator: {name}\n{self.source}\ndriver: {steps}"


class _BodyWriter:
    """Writes the source of a random body."""

    def __init__(self, rng, kind):
        self.rng = rng
        self.kind = kind
        self.tags = 0
        self.lines = []

    def tag(self):
        self.tags += 1
        return self.tags

    def emit(self, depth, text):
        self.lines.append("    " * depth + text)

    def block(self, depth, budget):
        """Emit at least one statement at *depth*; *budget* bounds nesting."""
        for _ in range(self.rng.randint(1, 3)):
            self.statement(depth, budget)

    def suspend(self, depth):
        t = self.tag()
        if self.kind == "coroutine":
            self.emit(depth, "await suspend()")
            self.emit(depth, f"log({t})")
        else:
            self.emit(depth, f"got = yield {t}")
            self.emit(depth, f"log(({t}, got))")
            if self.kind == "async_generator" and self.rng.random() < 0.5:
                self.emit(depth, "await suspend()")
                self.emit(depth, f"log({self.tag()})")

    def switch(self):
        rng = self.rng
        text = rng.choice(SWITCHES)
        arg = rng.choice(["float16", "bfloat16"]) if "dtype" in text else rng.random() < 0.5
        return text.format(arg)

    def statement(self, depth, budget):
        rng = self.rng
        roll = rng.random()
        if budget <= 0 or roll < 0.35:
            choice = rng.random()
            if choice < 0.55:
                self.suspend(depth)
            elif choice < 0.75:
                self.emit(depth, f"log({self.tag()})")
            elif choice < 0.9:
                self.emit(depth, self.switch())
            elif choice < 0.95:
                self.emit(depth, f"raise Boom({self.tag()})")
            else:
                t = self.tag()
                self.emit(depth, f"return {t}" if self.kind != "async_generator" else "return")
            return
        if roll < 0.75:
            self.emit(depth, f"with blocks[{rng.choice(BLOCK_NAMES)!r}]():")
            self.block(depth + 1, budget - 1)
        elif roll < 0.9:
            self.emit(depth, "try:")
            self.block(depth + 1, budget - 1)
            self.emit(depth, "except Boom:")
            self.emit(depth + 1, f"log({self.tag()})")
            if rng.random() < 0.5:
                self.block(depth + 1, budget - 1)
        else:
            self.emit(depth, "try:")
            self.block(depth + 1, budget - 1)
            self.emit(depth, "finally:")
            self.emit(depth + 1, f"log({self.tag()})")
            if rng.random() < 0.3:
                self.block(depth + 1, budget - 1)

    def source(self):
        header = {
            "generator": "def body(log):",
            "coroutine": "async def body(log, suspend):",
            "async_generator": "async def body(log, suspend):",
        }[self.kind]
        self.lines = [header]
        self.emit(1, f"log({self.tag()})")
        self.block(1, 3)
        if self.kind == "generator" and "yield" not in "\n".join(self.lines):
            self.suspend(1)
        if self.kind == "async_generator" and "yield" not in "\n".join(self.lines):
            self.emit(1, "got = yield 0")
        return "\n".join(self.lines) + "\n"


def generate_program(rng, kind="generator"):
    """A random program of the given kind."""
    source = _BodyWriter(rng, kind).source()
    requests = ["next", "send", "send", "throw", "close"] if kind != "coroutine" else ["send"]
    driver = []
    for _ in range(rng.randint(1, 8)):
        req = rng.choice(requests)
        driver.append((req, rng.randrange(len(CALLER_LIST))))
    driver.append(("close", rng.randrange(len(CALLER_LIST))))
    return Program(source, rng.randrange(len(DECORATOR_LIST)), driver, kind)


# ---------------------------------------------------------------------------
# Requests, and the caller around each
# ---------------------------------------------------------------------------


def _request(gen, req, n):
    """Make one request of a generator; return its outcome."""
    try:
        if req == "next":
            return ("yield", next(gen))
        if req == "send":
            return ("yield", gen.send(f"v{n}"))
        if req == "throw":
            return ("yield", gen.throw(Boom(f"t{n}")))
        gen.close()
        return ("closed",)
    except StopIteration as stop:
        return ("return", stop.value)
    except BaseException as exc:  # noqa: B902 -- every outcome is recorded
        return ("raise", type(exc).__name__, str(exc))


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


def _requests(program):
    """The caller's requests: the driver's, or for a coroutine one ``await`` from the first entry's setup."""
    if program.kind == "coroutine":
        return [("await", program.first_entry_setup())]
    return program.driver


def _caller_step(setup, outcomes, make):
    """Make one request (``make()``) from inside caller *setup*; record it and any leak into the caller."""
    with enter_all(CALLER_LIST[setup][1]):
        before = observed_state()
        outcomes.append(make())
        after = observed_state()
    if after != before:
        outcomes.append(("caller state changed", before, after))


async def _acaller_step(setup, outcomes, make):
    with enter_all(CALLER_LIST[setup][1]):
        before = observed_state()
        outcomes.append(await make())
        after = observed_state()
    if after != before:
        outcomes.append(("caller state changed", before, after))


def _finished(body):
    """Whether a generator, async generator or coroutine has ended."""
    frame = getattr(body, "gi_frame", getattr(body, "ag_frame", getattr(body, "cr_frame", None)))
    return frame is None


def _starts(body, req):
    """Whether request *req* runs *body* for the first time, if it has not run yet (and so enters its decorator).

    Only ``next`` starts a generator or an async generator: a value other
    than None sent to one that has not started fails without running it, and
    ``throw`` or ``close`` finish it without running it.
    """
    return req == "await" or (req == "next" and not _finished(body))


# ---------------------------------------------------------------------------
# The oracle
# ---------------------------------------------------------------------------


class _Swapped:
    """The oracle's hand at one undecorated body: its carried state, swapped in around each request.

    ``caller = before(req)`` saves the caller's carried state and installs the
    body's; at the body's first step it enters the decorator's context instead,
    in the caller's state.  ``after(caller)`` saves the body's and puts the
    caller's back; where the body has ended it first exits the decorator's
    context, in the body's state.  A request that has not started the body
    swaps nothing.

    For an async body a request may take several steps, the body suspending
    to the event loop in between: the oracle's loop runs nothing else that
    reads or changes the thread's state, so one swap around the request is the
    same as one around each step.
    """

    def __init__(self, carry, ctx_factory, body):
        self.carry, self.ctx_factory, self.body = carry, ctx_factory, body
        self.ctx = None
        self.state = None
        self.entered = False

    def before(self, req):
        if not self.entered and not _starts(self.body, req):
            return None
        caller = self.carry.capture()
        if not self.entered:
            self.entered = True
            self.ctx = self.ctx_factory()
            self.ctx.__enter__()
        else:
            self.carry.install(self.state)
        return caller

    def after(self, caller):
        if caller is None:
            return
        if self.ctx is not None and _finished(self.body):
            ctx, self.ctx = self.ctx, None
            ctx.__exit__(None, None, None)
        self.state = self.carry.capture()
        self.carry.install(caller)


def run_oracle_generator(program):
    """Record the undecorated generator body, with its decorator's state swapped around each request."""
    if program.spec.carry is INFERENCE:
        with collected_where_run():
            return _run_on_body_thread(program)

    def run():
        ctx_factory = program.spec.prepare()
        log = []
        gen = program.body()(lambda tag: log.append((tag, observed_state())))
        hand = _Swapped(program.spec.carry, ctx_factory, gen)
        outcomes = []

        def make(req, n):
            caller = hand.before(req)
            try:
                return _request(gen, req, n)
            finally:
                hand.after(caller)

        for n, (req, setup) in enumerate(program.driver):
            _caller_step(setup, outcomes, lambda: make(req, n))
        snapshot = list(log), outcomes
        # A body that ignored GeneratorExit runs again when it is finalised:
        # here, on this thread, after the snapshot.
        gen = hand = None  # the cells make reads too: the body is dropped here
        gc.collect(1)  # the young generations hold this program's cycles
        return snapshot

    with collected_where_run():
        return on_own_thread(run)


def run_oracle_async(program):
    """Record the undecorated coroutine or async generator, on an event loop of this thread's own."""
    if program.spec.carry is INFERENCE:
        with collected_where_run():
            return _run_on_body_thread(program)

    async def main():
        _quiet(asyncio.get_running_loop())
        ctx_factory = program.spec.prepare()
        log = []
        body = program.body()(lambda tag: log.append((tag, observed_state())), make_suspend())
        hand = _Swapped(program.spec.carry, ctx_factory, body)
        outcomes = []

        async def make(req, n):
            caller = hand.before(req)
            try:
                if req == "await":
                    return await _acall(body)
                return await _arequest(body, req, n)
            finally:
                hand.after(caller)

        for n, (req, setup) in enumerate(_requests(program)):
            await _acaller_step(setup, outcomes, lambda: make(req, n))
        # Snapshot before the loop finalises a body left suspended.
        return list(log), outcomes

    def run():
        record = asyncio.run(main())
        gc.collect(1)  # what is left, here, on this thread
        return record

    with collected_where_run():
        return on_own_thread(run)


def _run_on_body_thread(program):
    """The inference_mode oracle: the undecorated body on a thread of its own, which keeps its whole autograd state.

    The caller runs on a thread of its own too.  At the body's first step the
    body's thread enters the caller's setup (the caller's autograd state) and
    the decorator; before every step it takes the caller's autocast state
    (which inference_mode does not carry), and after it hands its own back.
    Where the body ends, the decorator is exited there, after the hand-back:
    by the contract its exit restores the state it carries and nothing else.
    """
    kind = program.kind
    worker = Worker()
    ctx_factory = program.spec.prepare()  # in the test's thread state, as at decoration

    def setup_body():
        held = {"log": [], "setups": contextlib.ExitStack(), "ctx": None, "entered": False}
        if kind == "generator":
            held["body"] = program.body()(lambda tag: held["log"].append((tag, observed_state())))
        else:
            held["loop"] = asyncio.new_event_loop()
            _quiet(held["loop"])
            held["body"] = program.body()(
                lambda tag: held["log"].append((tag, observed_state())), make_suspend()
            )
        return held

    held = worker.call(setup_body)

    def step(req, n, setup, handed):
        body = held["body"]
        if not held["entered"] and _starts(body, req):
            held["entered"] = True
            for factory in CALLER_LIST[setup][1]:
                held["setups"].enter_context(factory())
            AUTOCAST_ALL.install(handed)
            held["ctx"] = ctx_factory()
            held["ctx"].__enter__()
        else:
            AUTOCAST_ALL.install(handed)
        if kind == "generator":
            outcome = _request(body, req, n)
        elif req == "await":
            outcome = held["loop"].run_until_complete(_acall(body))
        else:
            outcome = held["loop"].run_until_complete(_arequest(body, req, n))
        handed = AUTOCAST_ALL.capture()
        if held["ctx"] is not None and _finished(body):
            # Where the body ends, after the hand-back: the decorator's exit
            # restores only what it carries, out of the caller's sight.
            ctx, held["ctx"] = held["ctx"], None
            ctx.__exit__(None, None, None)
        return outcome, handed

    def make(req, n, setup):
        outcome, handed = worker.call(step, req, n, setup, AUTOCAST_ALL.capture())
        AUTOCAST_ALL.install(handed)
        return outcome

    def run():
        outcomes = []
        for n, (req, setup) in enumerate(_requests(program)):
            _caller_step(setup, outcomes, lambda: make(req, n, setup))
        return outcomes

    try:
        outcomes = on_own_thread(run)
        return list(held["log"]), outcomes
    finally:

        def finalise():
            # Here, on the body's thread: a body left suspended in a mode
            # block runs its exit where it is finalised.
            loop = held.pop("loop", None)
            if loop is not None:
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()
            held.pop("body", None)
            gc.collect(1)
            held.pop("setups").close()
            # The decorator's context of a body that never ended: dropped here
            # too (an inference-mode guard puts back, on the thread that
            # destroys it, the state it replaced).
            held.clear()

        worker.call(finalise)
        worker.close()


# ---------------------------------------------------------------------------
# The subject
# ---------------------------------------------------------------------------


def run_subject_generator(program):
    """Record the decorated body, run on a thread of its own while the caller's setup changes."""

    def run():
        log = []
        decorated = program.decorated()
        gen = decorated(lambda tag: log.append((tag, observed_state())))
        outcomes = []
        for n, (req, setup) in enumerate(program.driver):
            _caller_step(setup, outcomes, lambda: _request(gen, req, n))
        snapshot = list(log), outcomes
        # A body that ignored GeneratorExit is closed again when finalised,
        # the second time by Python itself, outside the decorator: here, on
        # this thread, after the snapshot.
        gen = decorated = None
        gc.collect(1)
        return snapshot

    with collected_where_run():
        return on_own_thread(run)


def run_subject_async(program, seed):
    """Record the decorated body, run on an event loop of its own thread among noise tasks.

    Returns the record and the noise tasks' violations.
    """

    async def main():
        _quiet(asyncio.get_running_loop())
        noise = NoiseTasks(3, seed)
        await asyncio.sleep(0)
        log = []
        decorated = program.decorated()
        body = decorated(lambda tag: log.append((tag, observed_state())), make_suspend())
        outcomes = []

        for n, (req, setup) in enumerate(_requests(program)):
            if req == "await":
                await _acaller_step(setup, outcomes, lambda: _acall(body))
            else:
                await _acaller_step(setup, outcomes, lambda: _arequest(body, req, n))
        record = list(log), outcomes
        await noise.stop()
        return record, noise.violations

    def run():
        result = asyncio.run(main())
        gc.collect(1)  # what is left, here, on this thread
        return result

    with collected_where_run():
        return on_own_thread(run)


# ---------------------------------------------------------------------------
# Async helpers
# ---------------------------------------------------------------------------


def make_suspend():
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


def _quiet(loop):
    # Bodies that ignore GeneratorExit make the loop's finalisation report
    # errors; the records are compared instead.
    loop.set_exception_handler(lambda loop, context: None)


# What each kind of noise task may change: only the state its decorator
# carries, so that it is invisible to every other task.  (An inference_mode
# block is no such thing: its exit restores the whole local key set, the
# autocast bits included, as they were at its entry.)
_GRAD_BLOCKS = [
    torch.no_grad,
    torch.enable_grad,
    lambda: torch.set_grad_enabled(True),
    lambda: torch.set_grad_enabled(False),
]
NOISE = {
    GRAD: (_GRAD_BLOCKS, lambda b: C._set_grad_enabled(b)),
    INFERENCE: (
        _GRAD_BLOCKS
        + [
            lambda: torch.autograd.set_multithreading_enabled(False),
            lambda: torch.autograd.grad_mode._force_original_view_tracking(True),
            lambda: torch.autograd.grad_mode.enforce_grad_layout_policy(False),
            lambda: torch.autograd.forward_ad._set_fwd_grad_enabled(False),
        ],
        lambda b: C._set_grad_enabled(b),
    ),
    MULTITHREADING: (
        [lambda b=b: torch.autograd.set_multithreading_enabled(b) for b in (False, True)],
        C._set_multithreading_enabled,
    ),
    LAYOUT: (
        [lambda b=b: torch.autograd.grad_mode.enforce_grad_layout_policy(b) for b in (False, True)],
        C._set_grad_layout_enforcement_enabled,
    ),
    VIEW_REPLAY: (
        [lambda b=b: torch.autograd.grad_mode._force_original_view_tracking(b) for b in (False, True)],
        C._set_view_replay_enabled,
    ),
    AUTOCAST_CPU: (
        [
            lambda: torch.autocast("cpu", dtype=torch.float16),
            lambda: torch.autocast("cpu", enabled=False),
            lambda: torch.autocast("cpu", cache_enabled=False),
        ],
        lambda b: torch.set_autocast_enabled("cpu", b),
    ),
    AUTOCAST_CUDA: (
        [lambda: SetAutocastEnabled("cuda", True), lambda: SetAutocastEnabled("cuda", False)],
        lambda b: torch.set_autocast_enabled("cuda", b),
    ),
}


class NoiseTasks:
    """Decorated tasks that each keep changing the state their decorator carries and check it after every await.

    Each is a coroutine decorated with one of ``DECORATORS`` whose body enters
    random blocks of its decorator's state and switches it between
    ``await asyncio.sleep(0)``; after every await it must see that state as it
    left it.  Must be created inside a running event loop.
    """

    def __init__(self, count, seed):
        self.violations = []
        self.awaits = 0
        self._stopped = False
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._make(seed, k)()) for k in range(count)]

    def _make(self, seed, k):
        name, spec = DECORATOR_LIST[(seed + k) % len(DECORATOR_LIST)]
        blocks, switch = NOISE[spec.carry]

        async def noise():
            rng = random.Random(seed * 1009 + k)
            while not self._stopped:
                with blocks[rng.randrange(len(blocks))]():
                    for _ in range(rng.randint(1, 3)):
                        await self._checked_sleep(name, spec.carry)
                if rng.random() < 0.5:
                    switch(rng.random() < 0.5)
                await self._checked_sleep(name, spec.carry)

        return quietly(spec.make)(noise)

    async def _checked_sleep(self, name, carry):
        want = carry.capture()
        await asyncio.sleep(0)
        self.awaits += 1
        got = carry.capture()
        if got != want:
            self.violations.append((name, want, got))

    async def stop(self):
        self._stopped = True
        await asyncio.gather(*self._tasks)


def explain(oracle, subject):
    """Where two records first part: which entry of the log or the outcomes, and for states which fields."""

    def fields(a, b):
        if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) == len(STATE_FIELDS):
            return [f"{name}: {x!r} vs {y!r}" for name, x, y in zip(STATE_FIELDS, a, b) if x != y]
        return None

    for part, a, b in zip(("log", "outcomes"), oracle, subject):
        for i in range(max(len(a), len(b))):
            x = a[i] if i < len(a) else "<none>"
            y = b[i] if i < len(b) else "<none>"
            if x == y:
                continue
            lines = [f"{part}[{i}]: oracle {_short(x)}, subject {_short(y)}"]
            if isinstance(x, tuple) and isinstance(y, tuple) and len(x) == len(y):
                for u, v in zip(x, y):
                    diff = fields(u, v)
                    if diff:
                        lines.append("  oracle vs subject state: " + "; ".join(diff))
            for who, entry in (("oracle", x), ("subject", y)):
                if isinstance(entry, tuple) and entry[:1] == ("caller state changed",):
                    lines.append(f"  {who}'s caller, before vs after: " + "; ".join(fields(*entry[1:])))
            return "\n".join(lines)
    return "records equal"


def _short(entry):
    """An entry with its states cut down to their tags."""
    if isinstance(entry, tuple):
        return "(" + ", ".join("<state>" if isinstance(e, tuple) and len(e) == len(STATE_FIELDS) else repr(e)
                               for e in entry) + ")"
    return repr(entry)
