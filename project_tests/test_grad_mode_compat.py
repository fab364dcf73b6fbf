# Owner(s): ["module: autograd"]
"""Compatibility of the grad-mode decorators with the rest of PyTorch.

Stock torch 2.13.0 is the reference: the probes below are run in-process
(against whatever ``import torch`` loads, normally this checkout's modules) and,
once per test run, in a subprocess with ``TORCH_GRADMODE_OVERLAY=0`` (stock
torch).  Each probe returns a JSON-able dict; the tests compare the two.

Covered: ``torch.compile`` (eager backend, ``fullgraph=True``) and
``torch._dynamo.explain`` of decorated functions, nested decorators and the
``with`` form; ``torch.jit.script`` of ``no_grad``/``set_grad_enabled`` blocks;
a user ``_DecoratorContextManager`` subclass on every kind of function;
``forward_ad.dual_level``; a few ``torch.optim`` steps; Dynamo around decorated
coroutines and generators.
"""

import asyncio
import functools
import json
import os
import subprocess
import sys

import torch
import torch._dynamo
import torch.autograd.forward_ad as fwAD
from torch.testing._internal.common_utils import run_tests, TestCase
from torch.utils._contextlib import _DecoratorContextManager

# torch 2.13.0's Dynamo corrupts memory when a compiled function runs a
# coroutine through an ``async def`` wrapper (a wrapper written outside torch
# aborts on stock torch under PYTHONMALLOC=debug), so these runs crash at
# random, with or without this patch's decorators.  Kept, skipped, as the
# record of what an upstream Dynamo fix must make pass (see the notes page).
STOCK_ENV_SWITCH = "TORCH_GRADMODE_OVERLAY"


def _x():
    return torch.arange(1.0, 5.0).requires_grad_()


def _describe(t):
    """A JSON-able description of a tensor result."""
    return {
        "values": [round(v, 6) for v in t.detach().reshape(-1).tolist()],
        "requires_grad": bool(t.requires_grad),
        "is_inference": bool(t.is_inference()),
    }


def _attempt(f):
    try:
        return {"ok": True, "result": f()}
    except Exception as e:  # noqa: BLE001 -- the error kind is part of the result
        return {"ok": False, "error": type(e).__name__}


# ---------------------------------------------------------------------------
# Decorated functions for torch.compile
# ---------------------------------------------------------------------------


def _body(x):
    return x * 2 + 1


def _make_decorated():
    """name -> (function, fullgraph)."""
    cases = {}

    @torch.no_grad()
    def no_grad_call(x):
        return _body(x)

    @torch.no_grad
    def no_grad_bare(x):
        return _body(x)

    @torch.enable_grad()
    def enable_grad_call(x):
        return _body(x)

    @torch.enable_grad
    def enable_grad_bare(x):
        return _body(x)

    @torch.inference_mode()
    def inference_call(x):
        return _body(x)

    @torch.inference_mode
    def inference_bare(x):
        return _body(x)

    @torch.inference_mode(False)
    def inference_false(x):
        return _body(x)

    @torch.set_grad_enabled(False)
    def set_grad_false(x):
        return _body(x)

    @torch.no_grad()
    def nested_inner_enable(x):
        return enable_grad_call(x) + no_grad_call(x)

    @torch.no_grad()
    @torch.enable_grad()
    def stacked_no_grad_enable(x):
        return _body(x)

    @torch.enable_grad()
    @torch.no_grad()
    def stacked_enable_no_grad(x):
        return _body(x)

    @torch.enable_grad()
    def nested_enable_calls_no_grad(x):
        y = no_grad_call(x)
        return y * x

    def with_no_grad(x):
        with torch.no_grad():
            y = _body(x)
        return y + x

    def with_enable_grad_in_no_grad(x):
        with torch.no_grad():
            a = _body(x)
            with torch.enable_grad():
                b = _body(x)
        return a, b

    def with_inference_mode(x):
        with torch.inference_mode():
            y = _body(x)
        return y

    for name, fn in [
        ("no_grad_call", no_grad_call),
        ("no_grad_bare", no_grad_bare),
        ("enable_grad_call", enable_grad_call),
        ("enable_grad_bare", enable_grad_bare),
        ("inference_call", inference_call),
        ("inference_bare", inference_bare),
        ("inference_false", inference_false),
        ("nested_inner_enable", nested_inner_enable),
        ("stacked_no_grad_enable", stacked_no_grad_enable),
        ("stacked_enable_no_grad", stacked_enable_no_grad),
        ("nested_enable_calls_no_grad", nested_enable_calls_no_grad),
        ("with_no_grad", with_no_grad),
        ("with_enable_grad_in_no_grad", with_enable_grad_in_no_grad),
        ("with_inference_mode", with_inference_mode),
    ]:
        cases[name] = (fn, True)
    # Not fullgraph-compilable on stock torch either.
    cases["set_grad_false"] = (set_grad_false, False)
    return cases


def _results(out):
    if isinstance(out, tuple):
        return [_describe(t) for t in out]
    return [_describe(out)]


def probe_compile():
    out = {}
    for name, (fn, fullgraph) in _make_decorated().items():
        case = {}
        # Under no_grad in the caller, too: the decorator must override it.
        for caller in ("grad", "no_grad"):
            torch._dynamo.reset()
            ctx = torch.enable_grad() if caller == "grad" else torch.no_grad()
            with ctx:
                case["eager_" + caller] = _attempt(lambda: _results(fn(_x())))
                compiled = torch.compile(fn, backend="eager", fullgraph=fullgraph)
                case["compiled_" + caller] = _attempt(lambda: _results(compiled(_x())))
                case["grad_after_" + caller] = torch.is_grad_enabled()
        torch._dynamo.reset()

        def explain():
            e = torch._dynamo.explain(fn)(_x())
            return {"graph_count": e.graph_count, "graph_break_count": e.graph_break_count}

        case["explain"] = _attempt(explain)
        torch._dynamo.reset()
        out[name] = case
    return out


# ---------------------------------------------------------------------------
# TorchScript
# ---------------------------------------------------------------------------


def _script_no_grad(x):
    with torch.no_grad():
        y = x * 2
    return y + x


def _script_set_grad_enabled(x, flag: bool):
    prev = torch.is_grad_enabled()
    torch.set_grad_enabled(flag)
    y = x * 3
    torch.set_grad_enabled(prev)
    return y


def _script_set_grad_enabled_false(x):
    torch.set_grad_enabled(False)
    y = x * 3
    torch.set_grad_enabled(True)
    return y, x + 1


def _script_with_set_grad_enabled(x):
    # ``with torch.set_grad_enabled(...)`` is not scriptable on stock torch 2.13.0:
    # only compared with stock (same error kind expected).
    with torch.set_grad_enabled(False):
        y = x * 3
    return y


class _ScriptModule(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)
        with torch.no_grad():
            self.lin.weight.copy_(torch.arange(8.0).reshape(2, 4) / 10)
            self.lin.bias.fill_(0.5)

    def forward(self, x):
        with torch.no_grad():
            a = self.lin(x)
        torch.set_grad_enabled(False)
        b = self.lin(x) * 2
        torch.set_grad_enabled(True)
        c = self.lin(x) + 1
        return a, b, c


def probe_jit():
    out = {}

    def run_fn(fn, *args):
        scripted = torch.jit.script(fn)
        res = scripted(*args)
        res = res if isinstance(res, tuple) else (res,)
        return [_describe(t) for t in res]

    out["no_grad"] = _attempt(lambda: run_fn(_script_no_grad, _x()))
    out["set_grad_enabled_false"] = _attempt(lambda: run_fn(_script_set_grad_enabled_false, _x()))
    out["set_grad_enabled_flag_false"] = _attempt(lambda: run_fn(_script_set_grad_enabled, _x(), False))
    out["set_grad_enabled_flag_true"] = _attempt(lambda: run_fn(_script_set_grad_enabled, _x(), True))
    out["with_set_grad_enabled"] = _attempt(lambda: run_fn(_script_with_set_grad_enabled, _x()))

    def run_module():
        m = torch.jit.script(_ScriptModule())
        return [_describe(t) for t in m(_x())]

    out["module"] = _attempt(run_module)
    out["grad_after"] = torch.is_grad_enabled()
    return out


# ---------------------------------------------------------------------------
# torch.optim
# ---------------------------------------------------------------------------


def probe_optim():
    out = {}
    for name in ("sgd_momentum", "adam"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
        if name == "sgd_momentum":
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        else:
            opt = torch.optim.Adam(model.parameters(), lr=0.01)
        data = torch.linspace(-1, 1, 15).reshape(5, 3)
        target = torch.linspace(0, 1, 5).reshape(5, 1)
        for _ in range(4):
            opt.zero_grad()
            loss = ((model(data) - target) ** 2).mean()
            loss.backward()
            opt.step()
        out[name] = {
            "params": [p.detach().reshape(-1).tolist() for p in model.parameters()],
            "requires_grad": [p.requires_grad for p in model.parameters()],
            "grad_enabled": torch.is_grad_enabled(),
        }
    return out


# ---------------------------------------------------------------------------
# Dynamo around decorated generators
# ---------------------------------------------------------------------------


@torch.no_grad()
def _decorated_gen(x, n):
    for i in range(n):
        yield x * (i + 1)


def _consume_gen(x):
    total = torch.zeros_like(x)
    for v in _decorated_gen(x, 3):
        total = total + v
    return total


def probe_generator_compile():
    torch._dynamo.reset()
    eager = _attempt(lambda: _describe(_consume_gen(_x()))["values"])
    compiled = torch.compile(_consume_gen, backend="eager")
    comp = _attempt(lambda: _describe(compiled(_x()))["values"])
    torch._dynamo.reset()
    return {"eager": eager, "compiled": comp, "grad_after": torch.is_grad_enabled()}


def _reached_depth(run):
    """How deep *run(record)* recurses before RecursionError, at a recursion limit of 1000."""
    best = [0]
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        run(lambda d: best.__setitem__(0, max(best[0], d)))
    except RecursionError:
        pass
    finally:
        sys.setrecursionlimit(limit)
    return best[0]


def probe_generator_depth():
    def run(record):
        @torch.no_grad()
        def walk(d):
            record(d)
            yield d
            yield from walk(d + 1)

        for _ in walk(1):
            pass

    return _reached_depth(run)


def probe_coroutine_depth():
    def run(record):
        @torch.no_grad()
        async def walk(d):
            record(d)
            return await walk(d + 1)

        asyncio.run(walk(1))

    return _reached_depth(run)


PROBES = {
    "generator_depth": probe_generator_depth,
    "coroutine_depth": probe_coroutine_depth,
    "compile": probe_compile,
    "jit": probe_jit,
    "optim": probe_optim,
    "generator_compile": probe_generator_compile,
}


@functools.lru_cache(maxsize=None)
def _stock_results():
    """Run every probe once in a stock-torch subprocess."""
    env = dict(os.environ)
    env[STOCK_ENV_SWITCH] = "0"
    # Stock means the wheel's torch.  A PYTHONPATH may lay another torch over
    # it (tools/mutation_test.py puts each mutant there); the reference must
    # not load that too.
    env.pop("PYTHONPATH", None)
    here = os.path.dirname(os.path.abspath(__file__))
    code = (
        "import json, sys; sys.path.insert(0, {!r}); import test_grad_mode_compat as m; "
        "print('@@RESULT@@' + json.dumps({{k: f() for k, f in m.PROBES.items()}}))"
    ).format(here)
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, cwd=here, capture_output=True, text=True, timeout=600
    )
    if proc.returncode != 0:
        raise RuntimeError(f"stock probe subprocess failed:\n{proc.stderr[-4000:]}")
    for line in proc.stdout.splitlines():
        if line.startswith("@@RESULT@@"):
            return json.loads(line[len("@@RESULT@@"):])
    raise RuntimeError(f"no result from stock probe subprocess:\n{proc.stdout[-2000:]}")


def _stock(name):
    return _stock_results()[name]


def _local(name):
    # Through JSON, so both sides have the same types.
    return json.loads(json.dumps(PROBES[name]()))


class TestCompileCompat(TestCase):
    def setUp(self):
        super().setUp()
        torch._dynamo.reset()

    def tearDown(self):
        torch._dynamo.reset()
        super().tearDown()

    def test_compile_decorated_matches_stock(self):
        local = _local("compile")
        stock = _stock("compile")
        self.assertEqual(sorted(local), sorted(stock))
        for name in stock:
            for key in stock[name]:
                with self.subTest(case=name, what=key):
                    self.assertEqual(local[name][key], stock[name][key], msg=f"{name} / {key}")

    def test_compile_decorated_matches_eager(self):
        # Independent of stock: where compiling worked, it agrees with eager.
        local = _local("compile")
        for name, case in local.items():
            for caller in ("grad", "no_grad"):
                with self.subTest(case=name, caller=caller):
                    self.assertTrue(case["eager_" + caller]["ok"], msg=name)
                    if case["compiled_" + caller]["ok"]:
                        self.assertEqual(case["compiled_" + caller], case["eager_" + caller], msg=name)
                    self.assertEqual(case["grad_after_" + caller], caller == "grad")

    def test_fullgraph_decorators_compile(self):
        # The decorators stock compiles with fullgraph=True still compile.
        local = _local("compile")
        stock = _stock("compile")
        for name, (_, fullgraph) in _make_decorated().items():
            if fullgraph and stock[name]["compiled_grad"]["ok"]:
                with self.subTest(case=name):
                    self.assertTrue(local[name]["compiled_grad"]["ok"], msg=name)
                    self.assertTrue(local[name]["compiled_no_grad"]["ok"], msg=name)

    def test_decorated_generator_under_compile(self):
        local = _local("generator_compile")
        self.assertTrue(local["eager"]["ok"])
        self.assertTrue(local["compiled"]["ok"], msg=str(local))
        self.assertEqual(local["compiled"]["result"], local["eager"]["result"])
        self.assertEqual(local["eager"], _stock("generator_compile")["eager"])
        self.assertTrue(local["grad_after"])

    # Run in a fresh interpreter each: a crash inside Dynamo must fail the test, not the run.
    _ASYNC_PRELUDE = """
import asyncio, json, torch

@torch.no_grad()
async def double(x):
    await asyncio.sleep(0)  # suspends: the body is resumed inside the graph break
    return x * 2

seen = {}

@torch.no_grad()
async def body(x):
    seen["grad"] = torch.is_grad_enabled()
    return x * 2

def fn(x):
    y = x + 1
    z = asyncio.run(double(y))
    return z + y

def fn2(x):
    return asyncio.run(body(x)) + 0

def x_():
    return torch.arange(1.0, 5.0).requires_grad_()

res = {}
"""

    def _run_async_snippet(self, code):
        # Python's debug allocator turns a heap overrun into an abort every
        # time, instead of a crash now and then.
        proc = subprocess.run(
            [sys.executable, "-c", self._ASYNC_PRELUDE + code + "\nprint('@@RESULT@@' + json.dumps(res))"],
            capture_output=True, text=True, timeout=90, env=dict(os.environ, PYTHONMALLOC="debug"),
        )
        self.assertEqual(proc.returncode, 0, msg=f"rc {proc.returncode}:\n{proc.stderr[-3000:]}")
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("@@RESULT@@")][-1]
        return json.loads(line[len("@@RESULT@@"):])

    _COMPILE_FN = """
out = torch.compile(fn, backend="eager")(x_())
res["values"] = out.detach().tolist()
res["requires_grad"] = out.requires_grad
res["grad_after"] = torch.is_grad_enabled()
"""
    _COMPILE_FN2 = """
out2 = torch.compile(fn2, backend="eager")(x_())
res["values2"] = out2.detach().tolist()
res["requires_grad2"] = out2.requires_grad
res["seen"] = seen["grad"]
"""

    def _check_fn(self, res):
        x = _x().detach()
        self.assertEqual(res["values"], ((x + 1) * 3).tolist())
        self.assertTrue(res["requires_grad"])  # via "+ y"
        self.assertTrue(res["grad_after"])

    def _check_fn2(self, res):
        self.assertEqual(res["values2"], (_x().detach() * 2).tolist())
        # The patch's semantics: the async body runs under no_grad.
        self.assertFalse(res["seen"])
        self.assertFalse(res["requires_grad2"])

    def test_compile_calling_decorated_async(self):
        # asyncio.run inside a compiled function: a graph break, run eagerly, right result.
        self._check_fn(self._run_async_snippet(self._COMPILE_FN))

    # During the graph break at asyncio.run, torch 2.13.0's Dynamo would
    # convert the coroutine body's frame (it takes only CO_GENERATOR for a sign
    # of a suspendable frame) and trace it when it is created, outside the
    # body's mode: the body would read grad mode as True.  Its steps run with
    # Dynamo's callback off (_EagerBodyMode), so it reads the decorator's mode.
    def test_compile_calling_decorated_async_grad_mode(self):
        self._check_fn2(self._run_async_snippet(self._COMPILE_FN2))

    # On CPython 3.11 the frame Dynamo converts (see above) is larger than the
    # coroutine object made for the original code: a heap overrun that
    # crashed this sequence at random (and aborts it every time under
    # PYTHONMALLOC=debug) until bodies were made and stepped with Dynamo's
    # callback off.  An undecorated ``async def`` called the same way still
    # hits it on torch 2.13.0.
    def test_compile_two_functions_calling_decorated_async(self):
        res = self._run_async_snippet(self._COMPILE_FN + self._COMPILE_FN2)
        self._check_fn(res)
        self._check_fn2(res)

    def test_explain_calling_decorated_async(self):
        res = self._run_async_snippet("""
e = torch._dynamo.explain(fn)(x_())
res["graph_break_count"] = e.graph_break_count
""")
        self.assertGreaterEqual(res["graph_break_count"], 1)

    def test_compile_calling_decorated_async_generator(self):
        res = self._run_async_snippet("""
@torch.inference_mode()
async def stream(x):
    for i in range(3):
        await asyncio.sleep(0)
        yield (x * i).sum().item(), torch.is_inference_mode_enabled()

@torch.inference_mode()
async def collect(x):
    return [item async for item in stream(x)]

def fn3(x):
    return x + 1, asyncio.run(collect(x))

out3, items = torch.compile(fn3, backend="eager")(x_())
res["items"] = items
res["requires_grad3"] = out3.requires_grad
res["after3"] = [torch.is_grad_enabled(), torch.is_inference_mode_enabled()]
""")
        self.assertEqual(res["items"], [[0.0, True], [10.0, True], [20.0, True]])
        self.assertTrue(res["requires_grad3"])
        self.assertEqual(res["after3"], [True, False])

    # After its first step a body takes the fast path; that path too must
    # switch Dynamo's callback off while the caller is in a graph break, or
    # an undecorated coroutine the body creates there (helper below) has its
    # frame converted: the heap overrun again.
    def test_compile_decorated_async_creating_coroutine_after_suspending(self):
        res = self._run_async_snippet("""
async def helper(x):
    await asyncio.sleep(0)
    return x * 3, torch.is_grad_enabled()

@torch.no_grad()
async def later(x):
    for _ in range(3):
        await asyncio.sleep(0)  # a few fast-path steps first
    return await helper(x)

def fn4(x):
    y, grad = asyncio.run(later(x))
    return x + y, grad

out4, grad4 = torch.compile(fn4, backend="eager")(x_())
res["values4"] = out4.detach().tolist()
res["grad4"] = grad4
res["requires_grad4"] = out4.requires_grad
""")
        self.assertEqual(res["values4"], (_x().detach() * 4).tolist())
        self.assertFalse(res["grad4"])
        self.assertTrue(res["requires_grad4"])  # via "x +"

    # The same heap overrun as above, without the fix.
    def test_recompile_after_reset_calling_decorated_async(self):
        # torch.compile, torch._dynamo.reset(), then compile (or explain) the same function again.
        res = self._run_async_snippet("""
res["first"] = torch.compile(fn, backend="eager")(x_()).detach().tolist()
torch._dynamo.reset()
res["second"] = torch.compile(fn, backend="eager")(x_()).detach().tolist()
""")
        self.assertEqual(res["first"], res["second"])


class TestRecursionDepth(TestCase):
    """A step costs few enough frames that decorated recursive bodies go nearly as deep as stock's."""

    def test_recursive_generator(self):
        # Stock's wrapper adds one frame per level, and so does ours.
        self.assertGreaterEqual(_local("generator_depth"), 0.8 * _stock("generator_depth"))

    def test_recursive_coroutine(self):
        # Stock's decorator does nothing for a coroutine's body, so adds no
        # frame per level; ours adds the async def wrapper's and the driver's
        # (and their C-level sends): about a quarter of stock's depth (#25).
        self.assertGreaterEqual(_local("coroutine_depth"), 0.2 * _stock("coroutine_depth"))


class TestJitCompat(TestCase):
    def test_jit_script_matches_stock(self):
        local = _local("jit")
        stock = _stock("jit")
        self.assertEqual(local, stock)

    def test_jit_script_results(self):
        x = _x()
        fn = torch.jit.script(_script_no_grad)
        out = fn(x)
        self.assertEqual(out.detach(), x.detach() * 3)
        self.assertTrue(out.requires_grad)
        y, z = torch.jit.script(_script_set_grad_enabled_false)(x)
        self.assertFalse(y.requires_grad)
        self.assertTrue(z.requires_grad)
        self.assertFalse(torch.jit.script(_script_set_grad_enabled)(x, False).requires_grad)
        self.assertTrue(torch.jit.script(_script_set_grad_enabled)(x, True).requires_grad)
        m = torch.jit.script(_ScriptModule())
        a, b, c = m(x)
        self.assertFalse(a.requires_grad)
        self.assertFalse(b.requires_grad)
        self.assertEqual(b, a * 2)
        self.assertEqual(c, a + 1)
        # c's requires_grad is compared with stock in test_jit_script_matches_stock.
        self.assertTrue(torch.is_grad_enabled())


# ---------------------------------------------------------------------------
# User subclasses of _DecoratorContextManager
# ---------------------------------------------------------------------------


class _Counting(_DecoratorContextManager):
    """Counts enters, exits and clones in a shared log; checks its own balance."""

    def __init__(self, log):
        self.log = log
        self.depth = 0

    def __enter__(self):
        self.log["enter"] += 1
        self.depth += 1
        self.log["active"] += 1

    def __exit__(self, exc_type, exc_value, traceback):
        self.log["exit"] += 1
        self.depth -= 1
        self.log["active"] -= 1
        return False

    def clone(self):
        self.log["clone"] += 1
        return self.__class__(self.log)


def _new_log():
    return {"enter": 0, "exit": 0, "clone": 0, "active": 0}


class TestDecoratorSubclass(TestCase):
    def test_plain_function(self):
        log = _new_log()
        seen = []

        @_Counting(log)
        def f(v):
            seen.append(log["active"])
            return v + 1

        self.assertEqual([f(1), f(2), f(3)], [2, 3, 4])
        self.assertEqual(seen, [1, 1, 1])
        self.assertEqual(log, {"enter": 3, "exit": 3, "clone": 3, "active": 0})

    def test_generator(self):
        log = _new_log()
        seen = []

        @_Counting(log)
        def g(n):
            for i in range(n):
                seen.append(log["active"])
                yield i
            seen.append(log["active"])

        self.assertEqual(list(g(3)), [0, 1, 2])
        # The context is active in every step, and never between steps.
        self.assertEqual(seen, [1, 1, 1, 1])
        self.assertEqual(log["enter"], log["exit"])
        self.assertEqual(log["clone"], log["enter"])
        # One fresh context per step: 3 yields + the final step.
        self.assertEqual(log["clone"], 4)
        self.assertEqual(log["active"], 0)

        # Closed early: balanced too.
        it = g(5)
        next(it)
        self.assertEqual(log["active"], 0)
        it.close()
        self.assertEqual(log["enter"], log["exit"])
        self.assertEqual(log["active"], 0)

    def test_coroutine(self):
        log = _new_log()
        seen = []

        @_Counting(log)
        async def c(v):
            seen.append(log["active"])
            await asyncio.sleep(0)
            seen.append(log["active"])
            return v * 2

        self.assertEqual(asyncio.run(c(4)), 8)
        # As on stock torch, the context is entered once, around the call that
        # makes the coroutine, and is not active in any of its steps.
        self.assertEqual(seen, [0, 0])
        self.assertEqual(log, {"enter": 1, "exit": 1, "clone": 1, "active": 0})

    def test_async_generator(self):
        log = _new_log()
        seen = []

        @_Counting(log)
        async def ag(n):
            for i in range(n):
                seen.append(log["active"])
                await asyncio.sleep(0)
                yield i

        async def main():
            return [v async for v in ag(3)]

        self.assertEqual(asyncio.run(main()), [0, 1, 2])
        # As on stock torch, the context is entered once, around the call that
        # makes the async generator, and is not active in any of its steps.
        self.assertEqual(seen, [0, 0, 0])
        self.assertEqual(log, {"enter": 1, "exit": 1, "clone": 1, "active": 0})

    def test_clone_is_used_per_call(self):
        # Fails if context_decorator is given the instance rather than self.clone.
        class Recorder(_DecoratorContextManager):
            def __init__(self, tag="orig", record=None):
                self.tag = tag
                self.record = record if record is not None else []

            def __enter__(self):
                self.record.append(("enter", self.tag))

            def __exit__(self, *exc):
                self.record.append(("exit", self.tag))

            def clone(self):
                self.record.append(("clone", self.tag))
                return Recorder("clone", self.record)

        rec = Recorder()

        @rec
        def f(v):
            return v

        self.assertEqual(rec.record, [])
        f(1)
        f(2)
        self.assertEqual(rec.record, [("clone", "orig"), ("enter", "clone"), ("exit", "clone")] * 2)


# ---------------------------------------------------------------------------
# forward AD
# ---------------------------------------------------------------------------


class TestForwardADCompat(TestCase):
    def test_dual_level_context_manager(self):
        x = torch.tensor([1.0, 2.0, 3.0])
        t = torch.tensor([1.0, 0.5, 2.0])
        with fwAD.dual_level():
            dual = fwAD.make_dual(x, t)
            out = dual.sin() * dual
            primal, tangent = fwAD.unpack_dual(out)
        self.assertEqual(primal, x.sin() * x)
        self.assertEqual(tangent, (x.cos() * x + x.sin()) * t)

    def test_dual_level_decorator_function(self):
        @fwAD.dual_level()
        def jvp(x, t):
            dual = fwAD.make_dual(x, t)
            return fwAD.unpack_dual(dual ** 3).tangent

        x = torch.tensor([1.0, -2.0])
        t = torch.tensor([0.5, 1.0])
        self.assertEqual(jvp(x, t), 3 * x ** 2 * t)
        self.assertEqual(jvp(x * 2, t), 3 * (x * 2) ** 2 * t)

    def test_dual_level_decorator_generator(self):
        @fwAD.dual_level()
        def jvps(xs, t):
            for x in xs:
                dual = fwAD.make_dual(x, t)
                yield fwAD.unpack_dual(dual.exp()).tangent

        xs = [torch.tensor([0.0, 1.0]), torch.tensor([2.0, -1.0])]
        t = torch.tensor([1.0, 3.0])
        got = list(jvps(xs, t))
        self.assertEqual(len(got), 2)
        for x, g in zip(xs, got):
            self.assertEqual(g, x.exp() * t)
        # No level left open.
        with fwAD.dual_level():
            pass


# ---------------------------------------------------------------------------
# torch.optim
# ---------------------------------------------------------------------------


class TestOptimCompat(TestCase):
    def test_optim_steps_match_stock(self):
        local = _local("optim")
        stock = _stock("optim")
        self.assertEqual(sorted(local), sorted(stock))
        for name in stock:
            with self.subTest(optimizer=name):
                self.assertTrue(local[name]["grad_enabled"])
                self.assertEqual(local[name]["requires_grad"], stock[name]["requires_grad"])
                self.assertEqual(len(local[name]["params"]), len(stock[name]["params"]))
                for a, b in zip(local[name]["params"], stock[name]["params"]):
                    self.assertTrue(torch.allclose(torch.tensor(a), torch.tensor(b)), msg=name)
        self.assertTrue(torch.is_grad_enabled())


if __name__ == "__main__":
    run_tests()
