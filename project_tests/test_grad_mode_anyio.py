# Owner(s): ["module: autograd"]
"""Decorated coroutines and async generators under anyio, on its asyncio and trio
backends.

The decorators know nothing of asyncio: the contract holds under any event loop.
Project-only: anyio and trio are no test dependencies of PyTorch.
"""

import os
import sys
import unittest

import torch
from torch.testing._internal.common_utils import run_tests

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "test", "autograd"))
import test_grad_mode_matrix as suspend_tests  # noqa: E402 -- the module: pytest would run its classes here too
from test_grad_mode_matrix import mode_state  # noqa: E402

try:
    import anyio
except ImportError:
    anyio = None
try:
    import trio
except ImportError:
    trio = None


@unittest.skipIf(anyio is None, "anyio is not installed")
class TestGradModeAnyio(suspend_tests.GradModeTestCase):
    """The decorators know nothing of asyncio: the same holds under anyio's backends."""

    def run_scenario(self, backend):
        violations = []
        cancelled = []

        @torch.no_grad()
        async def coro():
            seen = [mode_state()]
            with torch.enable_grad():
                await anyio.sleep(0)
                seen.append(mode_state())
                await anyio.sleep(0.0001)
                seen.append(mode_state())
            await anyio.sleep(0)
            seen.append(mode_state())
            return seen

        @torch.inference_mode()
        async def agen():
            for _ in range(2):
                with torch.enable_grad():
                    await anyio.sleep(0)
                    got = yield mode_state()
                await anyio.sleep(0)
                yield got, mode_state()

        @torch.inference_mode()
        async def waits_forever():
            with torch.enable_grad():
                try:
                    await anyio.sleep(3600)
                except anyio.get_cancelled_exc_class():
                    cancelled.append(mode_state())
                    raise

        @torch.enable_grad()
        async def noise(stop):
            flip = False
            while not stop:
                flip = not flip
                torch.set_grad_enabled(flip)
                await anyio.sleep(0)
                if mode_state() != (flip, False):
                    violations.append((backend, flip, mode_state()))

        async def main():
            stop = []
            async with anyio.create_task_group() as tg:
                tg.start_soon(noise, stop)
                with torch.no_grad():
                    got = await coro()
                    self.assertEqual(mode_state(), (False, False))
                    ag = agen()
                    steps = [await ag.asend(None)]
                    self.assertEqual(mode_state(), (False, False))
                    with torch.inference_mode(False):
                        steps.append(await ag.asend("a"))
                        steps.append(await ag.asend("b"))
                    steps.append(await ag.asend("c"))
                    await ag.aclose()
                    with anyio.move_on_after(0.001):
                        await waits_forever()
                    self.assertEqual(mode_state(), (False, False))
                stop.append(True)
            return got, steps

        got, steps = anyio.run(main, backend=backend)
        self.assertEqual(got, [(False, False), (True, False), (True, False), (False, False)])
        self.assertEqual(steps, [(True, True), ("a", (False, True)), (True, True), ("c", (False, True))])
        self.assertEqual(cancelled, [(True, True)])
        self.assertEqual(violations, [])

    def test_asyncio_backend(self):
        self.run_scenario("asyncio")

    @unittest.skipIf(trio is None, "trio is not installed")
    def test_trio_backend(self):
        self.run_scenario("trio")


if __name__ == "__main__":
    run_tests()
