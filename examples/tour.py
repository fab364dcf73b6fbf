"""A short tour: what decorated generators and coroutines see, and what their callers see.

Run it twice to compare: ``TORCH_GRADMODE_OVERLAY=0 python examples/tour.py``
(stock torch 2.13.0) and ``python examples/tour.py`` (this patch); or
``bash tools/tour.sh`` does both.
"""

import asyncio
import inspect
import os

import torch
import torch.utils._contextlib


def state():
    return f"grad={torch.is_grad_enabled()!s:5} inference={torch.is_inference_mode_enabled()!s:5}"


def show(title, got, expected):
    verdict = "ok   " if got == expected else "WRONG"
    print(f"  [{verdict}] {title}: got {got}, contract says {expected}")


def main():
    source = os.path.realpath(torch.utils._contextlib.__file__)
    print(f"torch {torch.__version__}, torch/utils/_contextlib.py from {source}\n")

    print("1. A body's own mode block that spans a yield keeps its mode:")

    @torch.no_grad()
    def gen():
        with torch.enable_grad():
            yield torch.is_grad_enabled()
            yield torch.is_grad_enabled()
        yield torch.is_grad_enabled()

    show("list(gen())", list(gen()), [True, True, False])

    print("\n2. A body suspended inside its own inference_mode block does not leak it:")

    @torch.no_grad()
    def reader():
        with torch.inference_mode():
            yield torch.ones(1)

    it = reader()
    next(it)
    show("caller's inference mode after next()", torch.is_inference_mode_enabled(), False)
    show("a tensor the caller makes is an inference tensor", torch.ones(1).is_inference(), False)
    it.close()

    print("\n3. async def bodies run under the decorator, and stay coroutine functions:")

    @torch.no_grad()
    async def step():
        await asyncio.sleep(0)
        return torch.is_grad_enabled()

    show("asyncio.run(step()) sees grad", asyncio.run(step()), False)
    show("inspect.iscoroutinefunction(step)", inspect.iscoroutinefunction(step), True)

    print("\n4. An async generator streams under inference mode; another task keeps its own mode:")

    @torch.inference_mode()
    async def stream(n):
        for _ in range(n):
            await asyncio.sleep(0)
            yield torch.is_inference_mode_enabled()

    async def trainer(seen):
        # Deliberately the raw pattern the TGM lint flags: this task's grad mode
        # is on the thread whenever it is suspended, and the decorated stream
        # must still see only its own.
        with torch.enable_grad():
            for _ in range(6):
                await asyncio.sleep(0)  # noqa: TGM002
                seen.append(torch.is_grad_enabled() and not torch.is_inference_mode_enabled())

    async def both():
        seen = []
        task = asyncio.create_task(trainer(seen))
        streamed = [x async for x in stream(3)]
        await task
        return streamed, all(seen)

    streamed, trainer_ok = asyncio.run(both())
    show("what the stream saw", streamed, [True, True, True])
    show("trainer task kept grad on at every await", trainer_ok, True)

    print(f"\nCaller's state at the end: {state()}")


if __name__ == "__main__":
    main()
