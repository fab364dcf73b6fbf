"""Overhead of the grad-mode decorators, against the hand-written limit and stock torch 2.13.0.

For each decorator (``no_grad()``, ``enable_grad()``, ``set_grad_enabled(False)``,
``inference_mode()``, ``autocast("cpu", dtype=torch.bfloat16)``) and each use -- a decorated call, a ``with`` block, a
generator step, a coroutine step, an async-generator step -- it measures, in
nanoseconds per operation:

(a) ``bare``: the operation with no mode switching at all;
(b) ``limit``: the least any correct wrapper must do, written inline in the same
    process -- read the grad mode, set it with ``torch._C._set_grad_enabled``,
    run, restore (for ``inference_mode``: a ``torch._C._InferenceMode`` guard;
    for ``autocast("cpu", dtype=torch.bfloat16)``: read the CPU autocast flag and
    dtype, set them, step the nesting count, run, restore);
(c) ``patched``: this checkout's decorator;
(d) ``stock``: stock torch 2.13.0's decorator (``TORCH_GRADMODE_OVERLAY=0``).

Every trial runs one worker subprocess for this checkout and one for stock, in
alternating order; each time is the best of its worker's repeats, and the report
gives the minimum over the trials (the least noisy estimate on a shared machine) of:

* overhead ratio ``(c - a) / (b - a)``: 1.0 is the limit;
* speed-up ``(d - a) / (c - a)``: how much less overhead than stock;
* noise: the spread (max/min) of ``bare`` across trials.

Then memory: bytes per suspended decorated generator and coroutine
(tracemalloc), and the cost of a generator step with 1 and with 100,000
suspended decorated generators alive.

    python benchmarks/grad_mode_bench.py            # full run, a few minutes
    python benchmarks/grad_mode_bench.py --smoke    # seconds; what CI runs
"""

import argparse
import asyncio  # noqa: F401 -- imported by the worker for a fair start-up
import json
import os
import subprocess
import sys
import timeit
import tracemalloc
import types

AUTOCAST = "autocast(cpu, bfloat16)"
DECORATORS = ["no_grad()", "enable_grad()", "set_grad_enabled(False)", "inference_mode()", AUTOCAST]
USES = ["call", "with", "generator step", "coroutine step", "async-generator step"]
# Uses where torch 2.13.0's decorator leaves the body's mode alone: no stock ratio is printed.
STOCK_SKIPS = {(name, use) for name in DECORATORS for use in ("coroutine step", "async-generator step")}
STOCK_SKIPS.add((AUTOCAST, "generator step"))


# ---------------------------------------------------------------------------
# Worker: measures one torch (whatever ``import torch`` gives in this process)
# ---------------------------------------------------------------------------


class _Suspend:
    """An awaitable that suspends its awaiter once, like a loop's ``sleep(0)``."""

    __slots__ = ()

    def __await__(self):
        yield


def _noop():
    pass


def _gen():
    while True:
        yield


async def _coro(k):
    suspend = _Suspend()
    for _ in range(k):
        await suspend


async def _agen(k):
    suspend = _Suspend()
    for i in range(k):
        await suspend
        yield i


def _floor_context(C, target, inference):
    """The least a context-manager *class* written in Python can cost: one made per block,
    doing only the limit's C calls in its ``__enter__`` and ``__exit__``."""
    if inference:
        class Floor:
            __slots__ = ("guard",)

            def __enter__(self):
                self.guard = C._InferenceMode(True)

            def __exit__(self, exc_type, exc, tb):
                self.guard.__exit__(None, None, None)
    else:
        ge, sg = C.is_grad_enabled, C._set_grad_enabled

        class Floor:
            __slots__ = ("prev",)

            def __enter__(self):
                self.prev = ge()
                sg(target)

            def __exit__(self, exc_type, exc, tb):
                sg(self.prev)
    return Floor


class _grad:
    """``with`` grad mode *target*, restoring the previous mode (the benchmark's own helper)."""

    def __init__(self, C, target):
        self.C, self.target = C, target

    def __enter__(self):
        self.prev = self.C.is_grad_enabled()
        self.C._set_grad_enabled(self.target)

    def __exit__(self, *exc):
        self.C._set_grad_enabled(self.prev)


def _measure_binding(torch, number, repeat):
    """ns per call of the patch's binding, beside torch.is_grad_enabled(); None on stock."""
    C = torch._C
    if not hasattr(C, "_swap_autograd_mode_state"):
        return None
    state = C._get_autograd_mode_state()
    swap, get = C._swap_autograd_mode_state, C._get_autograd_mode_state
    return {
        "is_grad_enabled()": _best(C.is_grad_enabled, number, repeat),
        "_get_autograd_mode_state()": _best(get, number, repeat),
        "_swap_autograd_mode_state(s)": _best(lambda: swap(state), number, repeat),
        "lambda: None (call overhead)": _best(lambda: None, number, repeat),
    }


def _floor_async_generator(types, around_step):
    """The least a per-step wrapper of an async generator can cost.

    Python gives no hook between the steps of an async generator, so a wrapper
    must be an async generator that awaits, for each item, a generator relaying
    each step of the body's ``asend`` awaitable; here each step is wrapped in the
    limit's C calls, without the rest of the contract (``throw``/``close``,
    inference-mode and per-body state).
    """

    @types.coroutine
    def relay(awaitable):
        send = awaitable.send
        try:
            response = around_step(send, None)
            while True:
                response = around_step(send, (yield response))
        except StopIteration as stop:
            return stop.value

    async def wrapper(k):
        agen = _agen(k)
        request = None
        while True:
            try:
                value = await relay(agen.asend(request))
            except StopAsyncIteration:
                return
            request = yield value

    return wrapper


def _context(torch, name):
    """The class and arguments of the context manager *name*."""
    return {
        "no_grad()": (torch.no_grad, ()),
        "enable_grad()": (torch.enable_grad, ()),
        "set_grad_enabled(False)": (torch.set_grad_enabled, (False,)),
        "inference_mode()": (torch.inference_mode, ()),
        AUTOCAST: (torch.autocast, ("cpu", torch.bfloat16)),
    }[name]


def _decorator(torch, name):
    cls, args = _context(torch, name)
    return lambda: cls(*args)


def _best(fn, number, repeat):
    """Best per-call time of ``fn()`` in ns (the minimum is the least noisy estimate)."""
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e9


def _grad_limit(C, target, inference):
    """The limit for a grad mode: read the mode, set it, run, restore (inference mode: a guard)."""
    ge, sg = C.is_grad_enabled, C._set_grad_enabled

    def around_step(send, value=None):
        if inference:
            with C._InferenceMode(True):
                return send(value)
        prev = ge()
        sg(target)
        try:
            return send(value)
        finally:
            sg(prev)

    def limit_around(op):
        if inference:
            def run():
                with C._InferenceMode(True):
                    op()
        else:
            def run():
                prev = ge()
                sg(target)
                op()
                sg(prev)
        return run

    return limit_around, around_step


def _autocast_limit(torch):
    """The limit for autocast: read the CPU autocast state, set it, run, restore."""
    is_on, get_dtype, set_on, set_dtype = (torch.is_autocast_enabled, torch.get_autocast_dtype,
                                           torch.set_autocast_enabled, torch.set_autocast_dtype)
    up, down, clear, bf16 = (torch.autocast_increment_nesting, torch.autocast_decrement_nesting,
                             torch.clear_autocast_cache, torch.bfloat16)

    def around_step(send, value=None):
        prev, prev_dtype = is_on("cpu"), get_dtype("cpu")
        set_on("cpu", True)
        set_dtype("cpu", bf16)
        up()
        try:
            return send(value)
        finally:
            if down() == 0:
                clear()
            set_on("cpu", prev)
            set_dtype("cpu", prev_dtype)

    def limit_around(op):
        return lambda: around_step(lambda _: op())

    return limit_around, around_step


def _measure_decorator(torch, name, number, repeat):
    C = torch._C
    make = _decorator(torch, name)
    inference = name.startswith("inference")
    # The grad mode the decorator sets; enable_grad is measured from no_grad so
    # that every switch really changes the mode.
    target = name == "enable_grad()"
    outer = C._set_grad_enabled(False) if target else None  # noqa: F841

    if name == AUTOCAST:
        limit_around, around_step = _autocast_limit(torch)
    else:
        limit_around, around_step = _grad_limit(C, target, inference)
    out = {}

    # A decorated call.
    decorated = make()(_noop)
    out["call"] = (_best(_noop, number, repeat), _best(limit_around(_noop), number, repeat),
                   _best(decorated, number, repeat))
    # The same call through a with block per call (a fresh context each time):
    # what the grad modes' plain-call fast path (_wrap_call) must beat by 15%.
    from torch.utils._contextlib import context_decorator
    with_per_call = context_decorator(make().clone if name != AUTOCAST else make, _noop)

    # A with block, written out as user code writes it (no factory call or
    # argument unpacking in between, as for the floor below).
    cls, args = _context(torch, name)
    if len(args) > 1:
        def with_block():
            with cls(*args):
                _noop()
    elif args:
        (arg,) = args

        def with_block():
            with cls(arg):
                _noop()
    else:
        def with_block():
            with cls():
                _noop()
    out["with"] = (out["call"][0], out["call"][1], _best(with_block, number, repeat))
    floor_cls = _floor_context(C, target, inference)

    def floor_block():
        with floor_cls():
            _noop()
    floors = {"with": _best(floor_block, number, repeat),
              "call, with block per call": _best(with_per_call, number, repeat)}

    # A generator step.
    bare_it, dec_it = _gen(), make()(_gen)()
    next(bare_it), next(dec_it)
    bare_next = bare_it.__next__
    dec_next = dec_it.__next__
    out["generator step"] = (_best(bare_next, number, repeat), _best(limit_around(bare_next), number, repeat),
                             _best(dec_next, number, repeat))

    # A coroutine step: one send to a coroutine that awaits k times.
    k = max(number // 10, 10)

    def drive(coro, around=None):
        send = coro.send
        try:
            while True:
                if around is None:
                    send(None)
                else:
                    around(send)
        except StopIteration:
            pass

    dec_coro = make()(_coro)
    steps = k + 1
    out["coroutine step"] = (
        _best(lambda: drive(_coro(k)), 1, repeat) / steps,
        _best(lambda: drive(_coro(k), around_step), 1, repeat) / steps,
        _best(lambda: drive(dec_coro(k)), 1, repeat) / steps,
    )

    # An async-generator step: each send to an __anext__ awaitable (two per item).
    dec_agen = make()(_agen)

    def drive_agen(agen, around=None):
        for _ in range(k):
            drive(agen.__anext__(), around)
        try:
            agen.__anext__().send(None)
        except StopAsyncIteration:
            pass

    steps = 2 * k + 1
    out["async-generator step"] = (
        _best(lambda: drive_agen(_agen(k)), 1, repeat) / steps,
        _best(lambda: drive_agen(_agen(k), around_step), 1, repeat) / steps,
        _best(lambda: drive_agen(dec_agen(k)), 1, repeat) / steps,
    )
    floor_agen = _floor_async_generator(types, around_step)
    floors["async-generator step"] = _best(lambda: drive_agen(floor_agen(k)), 1, repeat) / steps

    # The same relay, each step doing what the contract needs: the body's
    # state swapped in and the caller's back (torch._C._swap_autograd_mode_state,
    # the patch's binding), and the check that keeps Dynamo out of the body.
    if hasattr(C, "_swap_autograd_mode_state"):
        swap = C._swap_autograd_mode_state
        eval_frame = getattr(getattr(C, "_dynamo", None), "eval_frame", None)
        callback = eval_frame.get_eval_frame_callback if eval_frame is not None else (lambda: None)
        with (C._InferenceMode(True) if inference else _grad(C, target)):
            body_state = [C._get_autograd_mode_state()]

        def contract_step(send, value=None):
            if callback() is not None:
                raise AssertionError("the benchmark runs outside Dynamo")
            caller = swap(body_state[0])
            try:
                return send(value)
            finally:
                body_state[0] = swap(caller)

        contract_agen = _floor_async_generator(types, contract_step)
        floors["async-generator step, contract swaps"] = (
            _best(lambda: drive_agen(contract_agen(k)), 1, repeat) / steps
        )
    C._set_grad_enabled(True)
    out["floors"] = floors
    return out


def _measure_memory(torch, count):
    """Bytes per suspended decorated generator and coroutine."""
    out = {}
    for kind, func in (("generator", _gen), ("coroutine", _coro)):
        decorated = torch.no_grad()(func)
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        alive = []
        for _ in range(count):
            it = decorated() if kind == "generator" else decorated(10)
            it.send(None)
            alive.append(it)
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        out[kind] = (after - before) / count
        for it in alive:
            it.close()
    return out


def _measure_scaling(torch, alive_count, number, repeat):
    """Step cost of one decorated generator with 1 and with *alive_count* others suspended."""
    decorated = torch.no_grad()(_gen)
    it = decorated()
    next(it)
    alone = _best(it.__next__, number, repeat)
    others = [decorated() for _ in range(alive_count)]
    for other in others:
        next(other)
    crowded = _best(it.__next__, number, repeat)
    return {"1": alone, str(alive_count): crowded}


def worker(number, repeat, memory_count, alive_count):
    import torch

    result = {
        "source": os.path.realpath(torch.utils._contextlib.__file__),
        "times": {name: _measure_decorator(torch, name, number, repeat) for name in DECORATORS},
        "memory": _measure_memory(torch, memory_count),
        "scaling": _measure_scaling(torch, alive_count, number, repeat),
        "binding": _measure_binding(torch, number, repeat),
    }
    json.dump(result, sys.stdout)


# ---------------------------------------------------------------------------
# Driver: alternating subprocesses, medians, report
# ---------------------------------------------------------------------------


def _run_worker(stock, args):
    env = dict(os.environ)
    if stock:
        env["TORCH_GRADMODE_OVERLAY"] = "0"
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--number", str(args.number),
           "--repeat", str(args.repeat), "--memory-count", str(args.memory_count),
           "--alive-count", str(args.alive_count)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--number", type=int, default=20000, help="operations per timing")
    parser.add_argument("--repeat", type=int, default=5, help="timings per measurement (best kept)")
    parser.add_argument("--memory-count", type=int, default=10000)
    parser.add_argument("--alive-count", type=int, default=100000)
    parser.add_argument("--smoke", action="store_true", help="tiny run, to check the script works")
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.trials, args.number, args.repeat, args.memory_count, args.alive_count = 1, 500, 2, 200, 1000
    if args.worker:
        worker(args.number, args.repeat, args.memory_count, args.alive_count)
        return 0

    runs = {"patched": [], "stock": []}
    for trial in range(args.trials):
        order = ("patched", "stock") if trial % 2 == 0 else ("stock", "patched")
        for variant in order:
            runs[variant].append(_run_worker(variant == "stock", args))
    if runs["patched"][0]["source"] == runs["stock"][0]["source"]:
        print("warning: patched and stock loaded the same _contextlib.py; is the patch installed?")

    def med(values):
        return min(values)

    print(f"grad-mode decorator overhead: {args.trials} trial(s) alternating with stock, minima; "
          "ns per operation")
    print(f"{'decorator':25} {'use':21} {'bare':>7} {'limit':>7} {'patched':>8} {'stock':>8}"
          f" {'ratio(c)':>9} {'ratio(d)':>9} {'speed-up':>9}")
    table = {}
    for name in DECORATORS:
        for use in USES:
            bare = med([r["times"][name][use][0] for r in runs["patched"]])
            limit = med([r["times"][name][use][1] for r in runs["patched"]])
            ours = med([r["times"][name][use][2] for r in runs["patched"]])
            stock = med([r["times"][name][use][2] for r in runs["stock"]])
            lim_over = max(limit - bare, 1e-9)
            ratio_ours = (ours - bare) / lim_over
            ratio_stock = (stock - bare) / lim_over
            speed_up = (stock - bare) / max(ours - bare, 1e-9)
            table[(name, use)] = (bare, limit, ours, stock, ratio_ours, ratio_stock, speed_up)
            if (name, use) in STOCK_SKIPS:
                stock_cols = f" {'n/a*':>9} {'n/a*':>9}"
            else:
                stock_cols = f" {ratio_stock:8.2f}x {speed_up:8.2f}x"
            print(f"{name:25} {use:21} {bare:7.0f} {limit:7.0f} {ours:8.0f} {stock:8.0f}"
                  f" {ratio_ours:8.2f}x" + stock_cols)
    print("* stock's decorator does not set the mode in a coroutine or async-generator body, nor autocast in a\n"
          "  generator's (the bugs this patch fixes), so its time there is the bare body's: no ratio compares.")
    print("\nfloors, as overhead ratios against the same limit (what no implementation in Python can beat):")
    print(f"{'decorator':25} {'use':21} {'floor':>8} {'ratio':>9}  floor is")
    floor_kinds = {"with": ("with", "a minimal Python context-manager class made per block"),
                   "call, with block per call": ("call", "the decorator's context entered per call "
                                                         "(the path without the fast one)"),
                   "async-generator step": ("async-generator step",
                                            "a per-item relay doing only the limit's calls"),
                   "async-generator step, contract swaps": (
                       "async-generator step", "the same relay, swapping the body's mode state in and out "
                                               "and checking Dynamo, as the contract needs")}
    for name in DECORATORS[:-1]:  # the grad modes': the floors are written with their calls
        for floor_name, (use, what) in floor_kinds.items():
            bare, limit = table[(name, use)][:2]
            floor = med([r["times"][name]["floors"][floor_name] for r in runs["patched"]])
            print(f"{name:25} {use:21} {floor:8.0f} {(floor - bare) / max(limit - bare, 1e-9):8.2f}x  {what}")
    bares = [r["times"]["no_grad()"]["call"][0] for r in runs["patched"] + runs["stock"]]
    print(f"\nnoise: bare call {min(bares):.0f}..{max(bares):.0f} ns across runs "
          f"(spread {max(bares) / min(bares):.2f}x)")
    for kind in ("generator", "coroutine"):
        ours = med([r["memory"][kind] for r in runs["patched"]])
        stock = med([r["memory"][kind] for r in runs["stock"]])
        print(f"memory per suspended @no_grad {kind}: patched {ours:.0f} B, stock {stock:.0f} B")
    for variant in ("patched", "stock"):
        alone = med([r["scaling"]["1"] for r in runs[variant]])
        crowded = med([r["scaling"][str(args.alive_count)] for r in runs[variant]])
        print(f"{variant} generator step with 1 / {args.alive_count} suspended alive: "
              f"{alone:.0f} / {crowded:.0f} ns")
    print("the patch's binding, ns per call (the limit's own calls for scale):")
    for call in runs["patched"][0]["binding"]:
        print(f"  {call:32} {med([r['binding'][call] for r in runs['patched']]):6.0f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
