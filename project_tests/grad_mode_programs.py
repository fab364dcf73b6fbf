"""Random programs and the two ways of running them, for the differential tests.

A *program* is a random body (a generator function, or an async generator or
coroutine function in the async tests), a grad-mode decorator and a driver: the
list of requests its caller makes (``next``, ``send``, ``throw``, ``close``),
each made from inside a random caller mode.

* The *oracle* runs the undecorated body on a thread of its own that starts in
  the caller's mode at the body's first entry, inside ``with <decorator>:``,
  and drives it from that thread without ever changing the mode: by the
  contract, what the decorated body sees must be what this body sees.
* The *subject* runs the decorated body on the test's thread while the caller
  switches its own mode before every request, and records a leak whenever the
  caller's mode after a request differs from before it.

Both return the same kind of record -- every mode the body observed, every
request's outcome -- so one ``==`` compares them.
"""

import contextlib
import gc
import threading

import torch


class Boom(Exception):
    """The exception random bodies raise, catch, and have thrown at them."""


def mode_state():
    """Grad mode and inference mode: the short view the hand-written tests spell out."""
    return (torch.is_grad_enabled(), torch.is_inference_mode_enabled())


def autograd_state():
    """The whole autograd mode state a body or a caller can observe, for the oracles.

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


# Every grad-mode decorator, in every spelling.  A factory returns what goes
# after the ``@``.
DECORATORS = [
    ("no_grad()", lambda: torch.no_grad()),
    ("no_grad", lambda: torch.no_grad),
    ("enable_grad()", lambda: torch.enable_grad()),
    ("enable_grad", lambda: torch.enable_grad),
    ("set_grad_enabled(False)", lambda: torch.set_grad_enabled(False)),
    ("set_grad_enabled(True)", lambda: torch.set_grad_enabled(True)),
    ("inference_mode()", lambda: torch.inference_mode()),
    ("inference_mode", lambda: torch.inference_mode),
    ("inference_mode(False)", lambda: torch.inference_mode(False)),
]

# Mode blocks a body opens: (source text, factory).
BLOCKS = [
    ("torch.no_grad()", torch.no_grad),
    ("torch.enable_grad()", torch.enable_grad),
    ("torch.set_grad_enabled(True)", lambda: torch.set_grad_enabled(True)),
    ("torch.set_grad_enabled(False)", lambda: torch.set_grad_enabled(False)),
    ("torch.inference_mode()", torch.inference_mode),
    ("torch.inference_mode(False)", lambda: torch.inference_mode(False)),
    # Autograd state the grad-mode decorators own without setting it.
    ("torch.autograd.set_multithreading_enabled(False)", lambda: torch.autograd.set_multithreading_enabled(False)),
    ("torch.autograd.grad_mode._force_original_view_tracking(True)",
     lambda: torch.autograd.grad_mode._force_original_view_tracking(True)),
    ("torch.autograd.forward_ad._set_fwd_grad_enabled(False)",
     lambda: torch.autograd.forward_ad._set_fwd_grad_enabled(False)),
]

# Modes a caller may be in: (name, context managers to enter in order).
CALLER_SETUPS = [
    ("plain", []),
    ("no_grad", [torch.no_grad]),
    ("inference_mode", [torch.inference_mode]),
    ("inference_mode+enable_grad", [torch.inference_mode, torch.enable_grad]),
    ("no_grad+inference_mode(False)", [torch.no_grad, lambda: torch.inference_mode(False)]),
    ("no multithreading", [lambda: torch.autograd.set_multithreading_enabled(False)]),
    ("view replay+no_grad", [lambda: torch.autograd.grad_mode._force_original_view_tracking(True), torch.no_grad]),
    ("no forward AD", [lambda: torch.autograd.forward_ad._set_fwd_grad_enabled(False)]),
    ("relaxed layout+inference_mode",
     [lambda: torch.autograd.grad_mode.enforce_grad_layout_policy(False), torch.inference_mode]),
]


def context_of(make):
    """The context manager a decorator factory stands for (bare spellings give a class)."""
    ctx = make()
    return ctx() if isinstance(ctx, type) else ctx


@contextlib.contextmanager
def enter_all(factories):
    with contextlib.ExitStack() as stack:
        for factory in factories:
            stack.enter_context(factory())
        yield


def on_own_thread(fn):
    """Run ``fn()`` on a new thread (fresh grad-mode state) and return its result."""
    box = {}

    def target():
        try:
            box["result"] = fn()
        except BaseException as exc:  # noqa: B902 -- re-raised on the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["result"]


def state_inside(make, *blocks):
    """The mode a body sees inside decorator *make* (and *blocks*) from the default state."""

    def probe():
        with context_of(make), enter_all(blocks):
            return mode_state()

    return on_own_thread(probe)


class Program:
    """One random body with its decorator, caller modes and driver."""

    def __init__(self, source, decorator, driver, kind="generator"):
        self.source = source
        self.decorator = decorator  # index into DECORATORS
        self.driver = driver  # [(request, caller setup index)]
        self.kind = kind

    def body(self):
        """A fresh undecorated body function compiled from the source."""
        namespace = {"torch": torch, "Boom": Boom}
        exec(self.source, namespace)
        return namespace["body"]

    def first_entry_setup(self):
        """The caller mode in force when the body is first entered.

        Sending a value other than None to a body that has not started fails
        without entering it; the first other request enters it (or, for
        ``throw`` and ``close``, finishes it without running it at all).
        """
        for req, setup in self.driver:
            if req != "send":
                return setup
        return self.driver[-1][1]

    def describe(self):
        name = DECORATORS[self.decorator][0]
        steps = ", ".join(f"{req}@{CALLER_SETUPS[c][0]}" for req, c in self.driver)
        return f"@torch.{name}\n{self.source}\ndriver: {steps}"


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
                self.emit(depth, f"torch.set_grad_enabled({rng.random() < 0.5})")
            elif choice < 0.95:
                self.emit(depth, f"raise Boom({self.tag()})")
            else:
                t = self.tag()
                self.emit(depth, f"return {t}" if self.kind != "async_generator" else "return")
            return
        if roll < 0.75:
            self.emit(depth, f"with {rng.choice(BLOCKS)[0]}:")
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
        driver.append((req, rng.randrange(len(CALLER_SETUPS))))
    driver.append(("close", rng.randrange(len(CALLER_SETUPS))))
    return Program(source, rng.randrange(len(DECORATORS)), driver, kind)


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


def run_oracle_generator(program):
    """Record the undecorated body, run uninterrupted on a thread of its own."""

    def run():
        log = []
        gen = program.body()(lambda tag: log.append((tag, autograd_state())))
        outcomes = []
        first_setup = CALLER_SETUPS[program.first_entry_setup()][1]
        with enter_all(first_setup), context_of(DECORATORS[program.decorator][1]):
            for n, (req, _) in enumerate(program.driver):
                outcomes.append(_request(gen, req, n))
        # Snapshot before the generator is dropped: a body that ignored
        # GeneratorExit runs again when it is finalised.
        snapshot = list(log), outcomes
        # Finalise it here, on this thread: left to the cyclic collector, an
        # undecorated body suspended in a mode block would run its ``with``
        # exit on whatever thread the collector next interrupts -- the very
        # leak the decorators exist to prevent -- and upset a later program.
        del gen
        gc.collect(1)  # the young generations hold this program's cycles
        return snapshot

    return on_own_thread(run)


def run_subject_generator(program):
    """Record the decorated body, run on this thread while the caller's mode changes."""
    log = []
    decorated = DECORATORS[program.decorator][1]()(program.body())
    gen = decorated(lambda tag: log.append((tag, autograd_state())))
    outcomes = []
    for n, (req, setup) in enumerate(program.driver):
        with enter_all(CALLER_SETUPS[setup][1]):
            before = autograd_state()
            outcomes.append(_request(gen, req, n))
            after = autograd_state()
        if after != before:
            outcomes.append(("caller mode leaked", before, after))
    snapshot = list(log), outcomes
    # A body that ignored GeneratorExit is closed again when finalised, the
    # second time by Python itself, outside the decorator (as undecorated, it
    # then runs outside any ``with`` it was in): finalise it on a thread of
    # its own so that it cannot reach a later program.
    holder = [gen]
    del gen, decorated
    on_own_thread(lambda: (holder.clear(), gc.collect(1)))
    return snapshot
