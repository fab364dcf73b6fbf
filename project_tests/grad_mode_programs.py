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

import gc
import os
import sys

import torch

# The exhaustive matrices own the helpers (tables of decorators, blocks and
# caller modes, the whole-state probe, the own-thread runner): use theirs.
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_grad_mode_state_matrix import autograd_state  # noqa: E402
from test_grad_mode_matrix import (  # noqa: E402
    BLOCKS,
    Boom,
    CALLER_SETUPS,
    context_of,
    DECORATORS,
    enter_all,
    on_own_thread,
)

# The tables by position: a program names its decorator and caller modes by
# index, so that one random draw picks one.
DECORATOR_LIST = list(DECORATORS.items())
CALLER_LIST = list(CALLER_SETUPS.items())
BLOCK_NAMES = list(BLOCKS)


class Program:
    """One random body with its decorator, caller modes and driver."""

    def __init__(self, source, decorator, driver, kind="generator"):
        self.source = source
        self.decorator = decorator  # index into DECORATOR_LIST
        self.driver = driver  # [(request, index into CALLER_LIST)]
        self.kind = kind

    def body(self):
        """A fresh undecorated body function compiled from the source."""
        namespace = {"torch": torch, "Boom": Boom, "blocks": BLOCKS}
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
        name = DECORATOR_LIST[self.decorator][0]
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
        first_setup = CALLER_LIST[program.first_entry_setup()][1]
        with enter_all(first_setup), context_of(DECORATOR_LIST[program.decorator][1]):
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
    decorated = DECORATOR_LIST[program.decorator][1]()(program.body())
    gen = decorated(lambda tag: log.append((tag, autograd_state())))
    outcomes = []
    for n, (req, setup) in enumerate(program.driver):
        with enter_all(CALLER_LIST[setup][1]):
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
