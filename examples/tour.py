"""A short tour: what decorated generators and coroutines see, and what their callers see.

A decorated body carries exactly the state its decorator's own ``with`` block
sets (grad mode for ``no_grad``, the multithreading flag for
``set_multithreading_enabled``, ...): it keeps its own changes to that state
across ``yield``/``await``, and its caller gets its own back after every step.
Every other piece of thread state it shares with its caller, as it would
undecorated.

Run it twice to compare: ``TORCH_GRADMODE_OVERLAY=0 python examples/tour.py``
(stock torch 2.13.0) and ``python examples/tour.py`` (this patch); or
``bash tools/tour.sh`` does both.  Each line says what this patch's contract
says; on stock torch some lines say WRONG.
"""

import asyncio
import inspect
import os

import torch
import torch.utils._contextlib


def state():
    return (
        f"grad={torch.is_grad_enabled()!s:5} inference={torch.is_inference_mode_enabled()!s:5} "
        f"multithreading={torch.autograd.is_multithreading_enabled()!s:5}"
    )


def show(title, got, expected):
    verdict = "ok   " if got == expected else "WRONG"
    print(f"  [{verdict}] {title}: got {got}, contract says {expected}")


def main():
    source = os.path.realpath(torch.utils._contextlib.__file__)
    print(f"torch {torch.__version__}, torch/utils/_contextlib.py from {source}\n")

    print("1. A body's own block of its decorator's state keeps its mode across yield:")

    @torch.no_grad()
    def gen():
        with torch.enable_grad():
            yield torch.is_grad_enabled()
            yield torch.is_grad_enabled()
        yield torch.is_grad_enabled()

    show("list(gen())  (stock: [True, False, False])", list(gen()), [True, True, False])

    it = gen()
    next(it)
    show("caller's grad mode while the body is inside its block", torch.is_grad_enabled(), True)
    with torch.no_grad():
        show("the body's block still holds when the caller steps it under no_grad", next(it), True)
    it.close()

    print("\n2. The multithreading flag: carried by its own decorator, the caller's under no_grad:")

    @torch.autograd.set_multithreading_enabled(False)
    def single_threaded():
        with torch.autograd.set_multithreading_enabled(True):
            yield torch.autograd.is_multithreading_enabled()
            yield torch.autograd.is_multithreading_enabled()
        while True:
            yield torch.is_grad_enabled(), torch.autograd.is_multithreading_enabled()

    # Stock's constructor switches the flag off at decoration, and nothing switches it back.
    show("caller's flag after decorating (stock: False)", torch.autograd.is_multithreading_enabled(), True)
    torch.autograd.set_multithreading_enabled(True)
    it = single_threaded()
    got = [next(it), next(it)]
    show("the body's own block across yield (stock: [True, False])", got, [True, True])
    with torch.no_grad():
        show("a caller's no_grad reaches the body (grad, multithreading)", next(it), (False, False))
    show("the caller's flag after each step", torch.autograd.is_multithreading_enabled(), True)
    it.close()

    @torch.no_grad()
    def steps():
        while True:
            yield torch.is_grad_enabled(), torch.autograd.is_multithreading_enabled()

    it = steps()
    next(it)
    torch.autograd.set_multithreading_enabled(False)  # the caller, between two steps
    show(
        "a caller's set_multithreading_enabled(False) reaches a @no_grad body (grad, multithreading)",
        next(it),
        (False, False),
    )
    torch.autograd.set_multithreading_enabled(True)
    it.close()

    print("\n3. State the decorator does not carry is the caller's too, as undecorated:")

    @torch.no_grad()
    def leaky_reader():
        # Deliberately a block no_grad does not carry, which the TGM lint flags.
        with torch.inference_mode():
            yield torch.ones(1)  # noqa: TGM003

    it = leaky_reader()
    next(it)
    show("caller's inference mode while a @no_grad body holds its own block", torch.is_inference_mode_enabled(), True)
    it.close()
    show("... and after close()", torch.is_inference_mode_enabled(), False)

    @torch.inference_mode()
    def reader():
        yield torch.ones(1)

    it = reader()
    show("an @inference_mode body makes inference tensors", next(it).is_inference(), True)
    show("... and its caller does not", torch.ones(1).is_inference(), False)
    it.close()

    print("\n4. async def bodies run under the decorator, and stay coroutine functions:")

    @torch.no_grad()
    async def step():
        await asyncio.sleep(0)
        return torch.is_grad_enabled()

    show("asyncio.run(step()) sees grad", asyncio.run(step()), False)
    show("inspect.iscoroutinefunction(step)", inspect.iscoroutinefunction(step), True)

    print("\n5. An async generator streams under inference mode; another task keeps its own mode:")

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
