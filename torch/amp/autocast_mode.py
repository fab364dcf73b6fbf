# A fragment of torch/amp/autocast_mode.py: the definitions the patch adds or
# replaces there, and the imports they need (see overlay/_torch_gradmode_splice.py).
import functools
from collections.abc import Callable
from typing import Any

import torch


# What autocast sets, and so what a body it decorates carries between steps.
_AUTOCAST_STATE: tuple[Callable[[], Any], Callable[[Any], Any]] = (
    torch._C._get_autocast_state,
    torch._C._swap_autocast_state,
)


def _copy(autocast_instance):
    """A copy of *autocast_instance* to enter, keeping what it replaces apart from the instance's."""
    if torch.compiler.is_dynamo_compiling():
        return autocast_instance  # Dynamo keeps no state on the instance
    ctx = object.__new__(type(autocast_instance))
    ctx.__dict__.update(autocast_instance.__dict__)
    return ctx


def autocast_decorator(autocast_instance, func):
    # Each call enters a copy of the instance, so that a recursive call no
    # longer leaves its caller in autocast; generator, coroutine and async
    # generator bodies carry their autocast state from step to step.
    # Imported here: torch.utils imports torch.amp.
    from torch.utils._contextlib import context_decorator

    # A subclass that overrides any of these may do more than autocast.
    names = {"__init__", "__enter__", "__exit__"}
    owner = next(
        vars(k) for k in type(autocast_instance).__mro__ if names & vars(k).keys()
    )
    decorate_autocast = context_decorator(
        functools.partial(_copy, autocast_instance),
        func,
        carried=owner.get("_carried_state"),
    )
    decorate_autocast.__script_unsupported = ...
    return decorate_autocast


class autocast:
    _carried_state = _AUTOCAST_STATE
