# Owner(s): ["module: dynamo"]
"""Dynamo does not convert frames that can suspend (generators, coroutines,
async generators): they run as plain Python, whether torch.compile is applied
to their function or they are resumed in a compiled function; nor does it
model a context manager decorating such a function."""

import asyncio
import json
import os
import types

import torch
import torch._dynamo.test_case
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
)


async def double(x):
    return x * 2


async def double_after_suspending(x):
    await asyncio.sleep(0)
    return x * 2


async def multiples_after_suspending(x):
    await asyncio.sleep(0)
    yield x
    await asyncio.sleep(0)
    yield x * 2


def multiples(x):
    yield x
    yield x * 2


def run(awaitable):
    # Drive an awaitable to its result, as an event loop would.
    while True:
        try:
            awaitable.send(None)
        except StopIteration as stop:
            return stop.value


DECORATORS = {
    "no_grad": torch.no_grad,
    "enable_grad": torch.enable_grad,
    "set_grad_enabled_false": lambda: torch.set_grad_enabled(False),
    "set_grad_enabled_true": lambda: torch.set_grad_enabled(True),
    "inference_mode": torch.inference_mode,
    "autocast": lambda: torch.autocast("cpu", dtype=torch.bfloat16),
}


def thread_state():
    # The thread's autograd flags and its CPU autocast state.
    return (
        torch.is_grad_enabled(),
        torch.is_inference_mode_enabled(),
        torch._C._is_fwd_grad_enabled(),
        torch._C._is_multithreading_enabled(),
        torch._C._is_view_replay_enabled(),
        torch.is_autocast_enabled("cpu"),
        torch.get_autocast_dtype("cpu"),
        torch.is_autocast_cache_enabled(),
    )


class SuspendableFrameTests(torch._dynamo.test_case.TestCase):
    def test_is_suspendable(self):
        from torch._dynamo.bytecode_transformation import is_suspendable

        iterable_coroutine = types.coroutine(lambda: (yield))
        for fn in (multiples, double, multiples_after_suspending, iterable_coroutine):
            self.assertTrue(is_suspendable(fn.__code__))
        self.assertFalse(is_suspendable(run.__code__))

    def test_coroutine_run_by_compiled_function(self):
        fn = torch.compile(lambda x, coro: run(coro) + 1, backend="eager")
        x = torch.randn(4)
        for coroutine_function in (double, double_after_suspending):
            self.assertEqual(fn(x, coroutine_function(x)), x * 2 + 1)

    def test_async_generator_stepped_by_compiled_function(self):
        fn = torch.compile(lambda x, agen: run(agen.asend(None)) + 1, backend="eager")
        x = torch.randn(4)
        agen = multiples_after_suspending(x)
        self.assertEqual(fn(x, agen), x + 1)
        self.assertEqual(fn(x, agen), x * 2 + 1)

    def test_generator_stepped_by_compiled_function(self):
        fn = torch.compile(lambda x, gen: sum(gen) + 1, backend="eager")
        x = torch.randn(4)
        self.assertEqual(fn(x, multiples(x)), x * 3 + 1)

    def test_compiled_coroutine_function(self):
        x = torch.randn(4)
        coro = torch.compile(double_after_suspending, backend="eager")(x)
        self.assertEqual(run(coro), x * 2)

    def test_compiled_async_generator_function(self):
        x = torch.randn(4)
        agen = torch.compile(multiples_after_suspending, backend="eager")(x)
        self.assertEqual(run(agen.asend(None)), x)
        self.assertEqual(run(agen.asend(None)), x * 2)

    def test_context_decorating_a_generator_function_in_compiled_code(self):
        # Its context applies at each step of the body, where Dynamo would
        # enter it only around the call that makes the generator: it breaks.
        def fn(x):
            @torch.no_grad()
            def scaled(x):
                yield x * 2

            return next(scaled(x))

        x = torch.ones(2, requires_grad=True)
        self.assertFalse(fn(x).requires_grad)
        with self.assertRaisesRegex(
            torch._dynamo.exc.Unsupported, "decorating a generator or coroutine"
        ) as caught:
            torch.compile(fn, backend="eager", fullgraph=True)(x)
        # Registered, as Dynamo's graph-break lint requires.
        registry = os.path.join(
            os.path.dirname(torch._dynamo.__file__), "graph_break_registry.json"
        )
        with open(registry) as f:
            entries = {e["Gb_type"]: e for v in json.load(f).values() for e in v}
        entry = entries.get(caught.exception.gb_type)
        self.assertIsNotNone(entry, "not in graph_break_registry.json")
        self.assertIn(entry["Explanation"], str(caught.exception))
        torch._dynamo.reset()
        self.assertFalse(torch.compile(fn, backend="eager")(x).requires_grad)

    @parametrize("caller_grad", [True, False])
    @parametrize("decorator", list(DECORATORS))
    def test_caller_state_after_context_decorating_a_generator_function(
        self, decorator, caller_grad
    ):
        # torch.set_grad_enabled(mode) sets the mode as it is made; the graph
        # break before its use must not leave that mode to the caller.
        def fn(x):
            @DECORATORS[decorator]()
            def scaled(x):
                yield x * 2

            return next(scaled(x))

        x = torch.ones(2, requires_grad=True)
        with torch.set_grad_enabled(caller_grad):
            before = thread_state()
            expected = fn(x)
            got = torch.compile(fn, backend="eager")(x)
            self.assertEqual(thread_state(), before)
        self.assertEqual(got.requires_grad, expected.requires_grad)
        self.assertEqual(got, expected)

    @parametrize("block", ["no_grad", "enable_grad", "inference_mode"])
    @parametrize("decorator", list(DECORATORS))
    def test_context_decorating_a_generator_function_in_a_with_block(
        self, decorator, block
    ):
        # The break falls inside the block, which Dynamo exits and enters again.
        def fn(x):
            with DECORATORS[block]():

                @DECORATORS[decorator]()
                def scaled(x):
                    yield x * 2

                y = next(scaled(x))
            return y, x * 3, torch.is_grad_enabled()

        x = torch.ones(2, requires_grad=True)
        before = thread_state()
        expected = fn(x)
        got = torch.compile(fn, backend="eager")(x)
        self.assertEqual(thread_state(), before)
        self.assertEqual(
            [t.requires_grad for t in got[:2]], [t.requires_grad for t in expected[:2]]
        )
        self.assertEqual(got, expected)


instantiate_parametrized_tests(SuspendableFrameTests)


if __name__ == "__main__":
    from torch._dynamo.test_case import run_tests

    run_tests()
