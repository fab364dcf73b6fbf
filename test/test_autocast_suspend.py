# Owner(s): ["module: amp"]
"""``@torch.autocast`` on generator, coroutine and async generator functions."""

import asyncio
import contextlib
import inspect
import warnings

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    skipIfTorchDynamo,
    TestCase,
)


DEVICES = ("cpu", "cuda", "mtia", "maia", "xpu", "ipu", "hpu", "xla", "mps")
DEVICES += (torch._C._get_privateuse1_backend_name(),)


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


def autocast_state():
    """The whole autocast state of the thread, as Python can read it."""
    nesting = torch.autocast_increment_nesting() - 1
    torch.autocast_decrement_nesting()
    per_device = tuple(
        (torch.is_autocast_enabled(d), torch.get_autocast_dtype(d)) for d in DEVICES
    )
    return per_device, torch.is_autocast_cache_enabled(), nesting


def thread_state():
    """The whole autocast state and the grad mode."""
    return autocast_state(), torch.is_grad_enabled()


@contextlib.contextmanager
def callers_autocast_state():
    """Put back every device type's flag and dtype and the cache flag on exit."""
    per_device, cache, _ = autocast_state()
    try:
        yield
    finally:
        for device, (enabled, dtype) in zip(DEVICES, per_device):
            torch.set_autocast_enabled(device, enabled)
            torch.set_autocast_dtype(device, dtype)
        torch.set_autocast_cache_enabled(cache)


def in_bf16_body(callers):
    """What a ``bf16`` body sees of its caller's ``autocast_state()``: all but the CPU's and the cache flag."""
    per_device, _, nesting = callers
    cpu = DEVICES.index("cpu")
    per_device = per_device[:cpu] + ((True, torch.bfloat16),) + per_device[cpu + 1 :]
    return per_device, True, nesting + 1


def bf16(func):
    return torch.autocast("cpu", dtype=torch.bfloat16)(func)


class TestAutocastSuspend(TestCase):
    def setUp(self):
        super().setUp()
        self.lin = torch.nn.Linear(4, 4)
        self.x = torch.randn(2, 4)
        self.outside = autocast_state()

    def tearDown(self):
        self.assertEqual(autocast_state(), self.outside)
        super().tearDown()

    def dtype(self):
        return self.lin(self.x).dtype

    def test_generator_steps_run_in_autocast(self):
        @bf16
        def stream(n):
            for _ in range(n):
                yield self.dtype()

        seen = []
        for dtype in stream(3):
            seen.append(dtype)
            self.assertEqual(autocast_state(), self.outside)
            self.assertEqual(self.dtype(), torch.float32)
        self.assertEqual(seen, [torch.bfloat16] * 3)

    def test_coroutine_runs_in_autocast_and_other_tasks_do_not(self):
        seen = []

        @bf16
        async def predict():
            seen.append(self.dtype())
            await asyncio.sleep(0)
            seen.append(self.dtype())
            return self.dtype()

        async def other():
            for _ in range(3):
                seen.append(("other", autocast_state() == self.outside))
                await asyncio.sleep(0)

        async def main():
            return await asyncio.gather(predict(), other())

        result, _ = asyncio.run(main())
        self.assertEqual(result, torch.bfloat16)
        self.assertEqual(seen.count(torch.bfloat16), 2)
        self.assertEqual(
            [s for s in seen if isinstance(s, tuple)], [("other", True)] * 3
        )

    def test_async_generator_steps_run_in_autocast(self):
        @bf16
        async def stream(n):
            for _ in range(n):
                await asyncio.sleep(0)
                yield self.dtype()

        async def main():
            seen = []
            async for dtype in stream(3):
                self.assertEqual(autocast_state(), self.outside)
                seen.append(dtype)
            return seen

        self.assertEqual(asyncio.run(main()), [torch.bfloat16] * 3)

    def own_block(self, decorator):
        """What a body that keeps its own disabled block across a yield computes in, at each step."""

        @decorator
        def stream():
            with torch.autocast("cpu", enabled=False):
                yield self.dtype()
                yield self.dtype()
            yield self.dtype()

        return list(stream())

    def test_own_block_across_yield_is_kept(self):
        self.assertEqual(
            self.own_block(bf16), [torch.float32, torch.float32, torch.bfloat16]
        )

    def test_caller_block_is_its_own_after_each_step(self):
        @bf16
        def stream(n):
            for _ in range(n):
                yield self.dtype()

        with torch.autocast("cpu", dtype=torch.float16):
            inside = autocast_state()
            for dtype in stream(2):
                self.assertEqual(dtype, torch.bfloat16)
                self.assertEqual(autocast_state(), inside)
                # No cast cached by the body reaches the caller.
                self.assertEqual(self.dtype(), torch.float16)

    def test_no_cast_crosses_a_bodys_start_or_end(self):
        @bf16
        def stream(n):
            for _ in range(n):
                yield self.dtype()

        @bf16
        async def predict():
            return self.dtype()

        with torch.autocast("cpu", dtype=torch.float16):
            self.assertEqual(
                self.dtype(), torch.float16
            )  # cached before the first step
            self.assertEqual(list(stream(2)), [torch.bfloat16] * 2)
            self.assertEqual(self.dtype(), torch.float16)  # after the body's end
            self.assertEqual(asyncio.run(predict()), torch.bfloat16)
            self.assertEqual(self.dtype(), torch.float16)

    def test_no_cast_crosses_steps_whatever_the_states_between(self):
        # Each body casts, then suspends in a disabled block: the states
        # swapped at the step boundaries are alike, the casts made are not.
        def body():
            seen = [self.dtype()]
            with torch.autocast("cpu", enabled=False):
                yield
            seen.append(self.dtype())
            yield seen

        half = torch.autocast("cpu", dtype=torch.float16)(body)()
        brain = bf16(body)()
        next(half)
        next(brain)
        with torch.no_grad():
            self.lin.weight.zero_()
        self.assertEqual(next(half), [torch.float16] * 2)
        self.assertEqual(next(brain), [torch.bfloat16] * 2)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            self.assertEqual(self.lin(self.x), self.lin.bias.expand(2, 4).bfloat16())

    def test_a_class_is_decorated_as_the_function_that_makes_one(self):
        @bf16
        class Made:
            def __init__(self):
                self.enabled = torch.is_autocast_enabled("cpu")

        self.assertTrue(Made().enabled)
        self.assertEqual(Made.__name__, "Made")

    def test_subclass_that_only_sets_its_arguments_carries_state(self):
        class BF16(torch.autocast):
            def __init__(self):
                super().__init__("cpu", dtype=torch.bfloat16)

        self.assertEqual(
            self.own_block(BF16()), [torch.float32, torch.float32, torch.bfloat16]
        )

    def test_subclass_with_slots(self):
        class Base(torch.autocast):
            __slots__ = ("base",)

        class Slotted(Base):
            __slots__ = ("note",)

            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.note = self.base = "kept"

            def __enter__(self):
                # AttributeError unless the slots were copied.
                if self.note != self.base:
                    raise AssertionError(self.note)
                return super().__enter__()

        @Slotted("cpu", dtype=torch.bfloat16)
        def call():
            return self.dtype()

        self.assertEqual(call(), torch.bfloat16)

    def test_interleaved_dtypes_compute_in_their_own(self):
        def stream(n):
            for _ in range(n):
                yield self.dtype()

        half = torch.autocast("cpu", dtype=torch.float16)(stream)(3)
        brain = bf16(stream)(3)
        pairs = [(next(half), next(brain)) for _ in range(3)]
        self.assertEqual(pairs, [(torch.float16, torch.bfloat16)] * 3)

    def test_recursive_call_leaves_caller_as_it_was(self):
        @bf16
        def depth(n):
            return depth(n - 1) if n else self.dtype()

        self.assertEqual(depth(2), torch.bfloat16)
        self.assertEqual(autocast_state(), self.outside)

    def test_grad_mode_is_not_autocasts(self):
        def body():
            torch.set_grad_enabled(False)
            yield
            yield torch.is_grad_enabled()

        plain, decorated = body(), bf16(body)()
        try:
            for gen in (plain, decorated):
                next(gen)
                self.assertFalse(torch.is_grad_enabled())
                torch.set_grad_enabled(True)
                self.assertTrue(next(gen))
        finally:
            torch.set_grad_enabled(True)

    def test_stacked_with_grad_mode(self):
        def body():
            yield torch.is_grad_enabled(), self.dtype()

        for stacked in (torch.no_grad()(bf16(body)), bf16(torch.no_grad()(body))):
            self.assertEqual(list(stacked()), [(False, torch.bfloat16)])
            self.assertTrue(torch.is_grad_enabled())

    def step_with_caller_changes(self, gen):
        """Step *gen* thrice; before each, change the caller's autocast state and grad mode."""
        settings = (
            (True, torch.bfloat16, False),
            (False, torch.float16, True),
            (True, torch.float16, False),
        )
        seen = []
        with callers_autocast_state(), torch.enable_grad():
            for cuda_on, cuda_dtype, grad in settings:
                torch.set_autocast_enabled("cuda", cuda_on)
                torch.set_autocast_dtype("cuda", cuda_dtype)
                torch.set_autocast_dtype("cpu", torch.float16)
                torch.set_autocast_cache_enabled(False)
                torch.set_grad_enabled(grad)
                before = thread_state()
                seen.append((before, next(gen)))
                self.assertEqual(thread_state(), before)
        return seen

    def test_other_device_types_are_the_callers_at_each_step(self):
        def body():
            while True:
                yield thread_state(), self.dtype()

        plain = self.step_with_caller_changes(body())
        decorated = self.step_with_caller_changes(bf16(body)())
        for (_, (seen, dtype)), (_, (own, own_dtype)) in zip(plain, decorated):
            callers, grad = seen
            self.assertEqual(own, (in_bf16_body(callers), grad))
            self.assertEqual((dtype, own_dtype), (torch.float32, torch.bfloat16))

    def test_stacked_with_grad_mode_each_carries_its_own(self):
        def body():
            while True:
                yield thread_state(), self.dtype()

        for stacked in (torch.no_grad()(bf16(body)), bf16(torch.no_grad()(body))):
            for (callers, _), (own, dtype) in self.step_with_caller_changes(stacked()):
                self.assertEqual(own, (in_bf16_body(callers), False))
                self.assertEqual(dtype, torch.bfloat16)

    def test_call_reads_the_instance_at_each_call(self):
        def stream():
            yield self.dtype()

        ac = torch.autocast("cpu", dtype=torch.bfloat16)
        call, gen = ac(self.dtype), ac(stream)
        ac.fast_dtype = torch.float16
        self.assertEqual(call(), torch.float16)
        self.assertEqual(list(gen()), [torch.float16])
        ac._enabled = False
        self.assertEqual(call(), torch.float32)
        self.assertEqual(list(gen()), [torch.float32])

    def test_device_specific_spelling(self):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            ctx = torch.cpu.amp.autocast(dtype=torch.bfloat16)

        @ctx
        def stream():
            yield self.dtype()
            with torch.autocast("cpu", enabled=False):
                yield self.dtype()

        self.assertEqual(list(stream()), [torch.bfloat16, torch.float32])

    def test_subclass_that_carries_nothing_is_entered_around_the_call(self):
        # Overriding __enter__ without declaring _carried_state, it carries
        # nothing: entered around the call that makes the body, as before,
        # never around the body's steps.
        entered = []

        class Counting(torch.autocast):
            def __enter__(self):
                entered.append(self)
                return super().__enter__()

        @Counting("cpu", dtype=torch.bfloat16)
        def stream():
            yield self.dtype()
            yield self.dtype()

        @Counting("cpu", dtype=torch.bfloat16)
        def call():
            return self.dtype()

        self.assertEqual(list(stream()), [torch.float32] * 2)
        self.assertEqual(len(entered), 1)
        self.assertEqual(call(), torch.bfloat16)
        self.assertFalse(torch.is_autocast_enabled("cpu"))

    def test_close_and_exceptions_are_the_bodys(self):
        closed = []

        @bf16
        def stream():
            try:
                yield 1
                yield 2
            except ValueError as e:
                yield ("caught", torch.is_autocast_enabled("cpu"), str(e))
            finally:
                closed.append(torch.is_autocast_enabled("cpu"))

        gen = stream()
        self.assertEqual(next(gen), 1)
        self.assertEqual(gen.throw(ValueError("x")), ("caught", True, "x"))
        gen.close()
        self.assertEqual(closed, [True])

    def test_function_kinds_and_metadata(self):
        def gen():
            yield

        async def coro():
            pass

        async def agen():
            yield

        for func, check in (
            (gen, inspect.isgeneratorfunction),
            (coro, inspect.iscoroutinefunction),
            (agen, inspect.isasyncgenfunction),
        ):
            wrapped = bf16(func)
            self.assertTrue(check(wrapped))
            self.assertEqual(wrapped.__wrapped__, func)
            self.assertEqual(wrapped.__name__, func.__name__)

    def test_export_records_a_decorated_call(self):
        lin = self.lin

        class Model(torch.nn.Module):
            @torch.autocast("cpu", dtype=torch.bfloat16)
            def inner(self, x):
                return lin(x)

            def forward(self, x):
                return self.inner(x) + 1

        model = Model()
        ep = torch.export.export(model, (self.x,), strict=False)
        targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
        self.assertIn("wrap_with_autocast", targets)
        self.assertEqual(ep.module()(self.x), model(self.x))

    def test_export_of_a_partly_stepped_generator(self):
        lin = self.lin

        @bf16
        def stream(x):
            yield lin(x)
            yield lin(x)

        class Model(torch.nn.Module):
            def forward(self, x):
                it = stream(x)
                first = next(it)
                return first.float() + lin(x), lin(x).dtype == torch.float32

        model = Model()
        ep = torch.export.export(model, (self.x,), strict=False)
        self.assertEqual(ep.module()(self.x)[0], model(self.x)[0])
        self.assertTrue(model(self.x)[1])

    def test_compiled_call_is_eager_without_graph_break(self):
        from torch._dynamo.testing import CompileCounter

        @bf16
        def inner(x):
            return self.lin(x)

        def outer(x):
            return inner(x) + 1

        counter = CompileCounter()
        compiled = torch.compile(outer, backend=counter, fullgraph=True)
        self.assertEqual(compiled(self.x), outer(self.x))
        self.assertEqual(counter.frame_count, 1)

    def test_states_are_equal_where_they_are_alike(self):
        outside = torch._C._get_autocast_state("cpu")
        self.assertTrue(outside == torch._C._get_autocast_state("cpu"))
        self.assertFalse(outside != torch._C._get_autocast_state("cpu"))
        self.assertNotEqual(outside, torch._C._get_autocast_state("cuda"))
        self.assertNotEqual(outside, outside.__class__)
        for ctx in (
            torch.autocast("cpu"),
            torch.autocast("cpu", enabled=False),  # its nesting count
            torch.autocast("cpu", enabled=False, cache_enabled=False),
        ):
            with self.subTest(ctx=ctx), ctx:
                self.assertNotEqual(torch._C._get_autocast_state("cpu"), outside)
        with (
            callers_autocast_state()
        ):  # another device type's flag is not the CPU's state
            torch.set_autocast_enabled("cuda", not torch.is_autocast_enabled("cuda"))
            self.assertEqual(torch._C._get_autocast_state("cpu"), outside)


@skipIfTorchDynamo("traces the generators itself")
class TestAutocastSuspendTraced(TestCase):
    """Stepped in traced code, an autocast generator computes what it does eagerly, or tracing fails."""

    @staticmethod
    def steps(shape):
        """Three steps of a ``bf16`` generator whose body or caller changes autocast as *shape* says."""
        own = {
            "own_block": torch.autocast("cpu", enabled=False),
            "same_block": torch.autocast("cpu", dtype=torch.bfloat16),  # its nesting
        }

        @bf16
        def gen(x):
            yield x @ x
            with own.get(shape, contextlib.nullcontext()):
                yield x @ x
                yield x @ x

        def run(x):
            g = gen(x)
            caller = shape == "caller_changes"
            with (
                torch.autocast("cpu", enabled=False)
                if caller
                else contextlib.nullcontext()
            ):
                first = next(g)
            with (
                torch.autocast("cpu", dtype=torch.float16)
                if caller
                else contextlib.nullcontext()
            ):
                second = next(g)
            return first, second, next(g)

        return run

    @parametrize("shape", ["plain", "own_block", "same_block", "caller_changes"])
    @parametrize("tracer", TRACERS)
    def test_traced_generator(self, shape, tracer):
        run, x = self.steps(shape), torch.eye(2, requires_grad=True)
        if shape.endswith("block") and tracer != "compile":
            with self.assertRaisesRegex(Exception, "of its own"):
                trace(run, x, tracer)
        else:  # the default compile runs the own block's steps eagerly
            self.assertEqual(outputs(trace(run, x, tracer)), outputs(run(x)))

    def test_started_eagerly_then_traced(self):
        # Export's tracer records autocast's blocks, not the swaps of a body
        # that carries: its step is traced as a fresh one's, if it is one, else
        # the body is closed in its own state.
        ends = []

        @bf16
        def gen(x):
            try:
                yield x @ x
                yield x @ x
                with torch.autocast("cpu", enabled=False):
                    yield x @ x
                    yield x @ x
            finally:
                ends.append(autocast_state()[::2])  # not make_fx's cache flag

        x = torch.eye(2, requires_grad=True)
        eager, traced = gen(x), gen(x)
        self.assertEqual(outputs([next(traced)]), outputs([next(eager)]))
        step = make_fx(lambda x: next(traced), pre_dispatch=True)(x)
        self.assertEqual(outputs([step(x)]), outputs([next(eager)]))
        next(traced)  # eagerly, into its own block
        before = thread_state()
        with self.assertRaisesRegex(RuntimeError, "of its own"):
            make_fx(lambda x: next(traced), pre_dispatch=True)(x)
        self.assertEqual(thread_state(), before)
        next(eager)
        eager.close()
        self.assertEqual(ends[0], ends[1])

    @parametrize("tracer", TRACERS)
    def test_module_iterating_a_generator_method(self, tracer):
        # The carried autocast decides the dtype, and the generator ends inside
        # the traced code (stock compiled this in float32, never in autocast).
        class Model(torch.nn.Module):
            @bf16
            def steps(self, x):
                for _ in range(3):
                    x = x @ x
                    yield x

            def forward(self, x):
                return list(self.steps(x))

        x, model = torch.eye(2, requires_grad=True) * 1.5, Model()
        eager = outputs(model(x))
        self.assertEqual(eager[0][1], torch.bfloat16)
        self.assertEqual(outputs(trace(model, x, tracer)), eager)

    def test_started_eagerly_then_closed_in_traced_code(self):
        # Its context was entered outside the trace: it is left unseen by the
        # tracer too, which has no entry of it to pop.
        @bf16
        def gen(x):
            yield x @ x
            yield x @ x

        x = torch.eye(2)
        body = gen(x)
        next(body)
        before = thread_state()
        make_fx(lambda x: (body.close(), x + 1)[1], pre_dispatch=True)(x)
        self.assertEqual(thread_state(), before)
        self.assertIsNone(body.gi_frame)

    @parametrize("tracer", ["compile", "compile_fullgraph", "export", "make_fx"])
    def test_no_cast_crosses_a_traced_step(self, tracer):
        # As the swaps of an eager step clear the cast cache, so does a traced
        # step: the body's bfloat16 cast of a weight does not reach the
        # caller's float16 block (strict export keeps no clear: not here).
        @bf16
        def gen(w):
            yield w @ w

        def run(w):
            with torch.autocast("cpu", dtype=torch.float16):
                first = next(gen(w))
                return first, w @ w

        w = torch.eye(2, requires_grad=True)
        eager = outputs(run(w))
        self.assertEqual(
            [dtype for _, dtype, *_ in eager], [torch.bfloat16, torch.float16]
        )
        self.assertEqual(outputs(trace(run, w, tracer)), eager)

    @parametrize("tracer", TRACERS)
    def test_decorated_inside_traced_code(self, tracer):
        # Dynamo breaks the graph where a context decorates a generator
        # function (it would enter it only around the call making the
        # generator): decorated eagerly, its steps are traced as above.
        def run(x):
            @torch.autocast("cpu", dtype=torch.bfloat16)
            def gen(x):
                yield x @ x

            return list(gen(x))

        x = torch.eye(2, requires_grad=True)
        eager = outputs(run(x))
        self.assertEqual(eager[0][1], torch.bfloat16)
        if tracer in ("compile_fullgraph", "export_strict"):
            with self.assertRaisesRegex(Exception, "decorating a generator"):
                trace(run, x, tracer)
        else:
            self.assertEqual(outputs(trace(run, x, tracer)), eager)


instantiate_parametrized_tests(TestAutocastSuspendTraced)

if __name__ == "__main__":
    run_tests()
