# A fragment of torch/amp/autocast_mode.py: the definitions the patch adds or
# replaces there, and the imports they need (see overlay/_torch_gradmode_splice.py).
import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch


# What autocast sets for a device type, and so what a body it decorates
# carries between steps.
_AUTOCAST_STATE: tuple[Callable[[str], Any], Callable[[Any], Any]] = (
    torch._C._get_autocast_state,
    torch._C._swap_autocast_state,
)


def _copy(autocast_instance):
    """A copy of *autocast_instance* to enter, keeping what it replaces apart from the instance's."""
    if torch.compiler.is_dynamo_compiling():
        return autocast_instance  # Dynamo keeps no state on the instance
    cls = type(autocast_instance)
    ctx = object.__new__(cls)  # not cls.__new__: the deprecated spellings' warns
    ctx.__dict__.update(autocast_instance.__dict__)
    for k in cls.__mro__:
        slots = vars(k).get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if hasattr(autocast_instance, name):
                setattr(ctx, name, getattr(autocast_instance, name))
    return ctx


def _capture(autocast_instance, capture, device):
    """*capture* of *autocast_instance*'s device type, as a body enters its copy of it."""
    if torch.compiler.is_dynamo_compiling():
        # Dynamo cannot trace the binding, nor read the instance's device: it
        # only checks that each step leaves *device*'s state as found.
        nesting = torch.autocast_increment_nesting() - 1
        torch.autocast_decrement_nesting()
        # Where a swap would: at the step's start and end (test_no_cast_crosses_a_traced_step).
        torch.clear_autocast_cache()
        return (
            torch.is_autocast_enabled(device),
            torch.get_autocast_dtype(device),
            torch.is_autocast_cache_enabled(),
            nesting,
        )
    return capture(autocast_instance.device)


def _call_in_autocast(autocast_instance, func):
    """Wrap *func* to run as in a ``with`` block of a copy of *autocast_instance*, at less cost."""
    ctx = autocast_instance

    @functools.wraps(func)
    def decorate_autocast(*args, **kwargs):
        # Under Dynamo, and for torch.export's mode, which is told of each enter and exit.
        if (
            torch.compiler.is_dynamo_compiling()
            or torch._C._is_torch_function_mode_enabled()
        ):
            with _copy(ctx):
                return func(*args, **kwargs)
        device = ctx.device  # read at each call, as a with block reads the instance
        prev = torch.is_autocast_enabled(device)
        prev_dtype = torch.get_autocast_dtype(device)
        prev_cache = torch.is_autocast_cache_enabled()
        torch.set_autocast_enabled(device, ctx._enabled)
        torch.set_autocast_dtype(device, ctx.fast_dtype)
        torch.autocast_increment_nesting()
        torch.set_autocast_cache_enabled(ctx._cache_enabled)
        try:
            return func(*args, **kwargs)
        finally:
            if torch.autocast_decrement_nesting() == 0:
                torch.clear_autocast_cache()
            torch.set_autocast_enabled(device, prev)
            torch.set_autocast_dtype(device, prev_dtype)
            torch.set_autocast_cache_enabled(prev_cache)

    return decorate_autocast


def autocast_decorator(autocast_instance, func):
    # Each call enters a copy of the instance, so that a recursive call no
    # longer leaves its caller in autocast; generator, coroutine and async
    # generator bodies carry their autocast state from step to step.  A
    # subclass that carries nothing is entered around each call, as before.
    # Imported here: torch.utils imports torch.amp.
    from torch.utils._contextlib import _declared, context_decorator

    carried = _declared(autocast_instance, "_carried_state")
    if carried is None:

        @functools.wraps(func)
        def decorate_autocast(*args, **kwargs):
            with autocast_instance:
                return func(*args, **kwargs)

    else:
        if inspect.isclass(func):  # decorated as the function that makes one, as before
            cls = func
            func = functools.wraps(cls)(lambda *args, **kwargs: cls(*args, **kwargs))
        capture, swap = carried
        decorate_autocast = context_decorator(
            functools.partial(_copy, autocast_instance),
            func,
            carried=(
                functools.partial(
                    _capture, autocast_instance, capture, autocast_instance.device
                ),
                swap,
            ),
            wrap_call=functools.partial(_call_in_autocast, autocast_instance),
        )
    decorate_autocast.__script_unsupported = ...
    return decorate_autocast


class autocast:
    _carried_state = _AUTOCAST_STATE
