# A fragment of torch/autograd/grad_mode.py: the definitions the patch adds or
# replaces there, and the imports they need (see overlay/_torch_gradmode_splice.py).
import functools

from torch.utils._contextlib import (
    _call_in_inference_mode,
    _call_with_grad_mode,
    _get_autograd_mode_state,
)


def _flag_state(is_enabled, set_enabled):
    """The ``(capture, swap)`` pair of the thread-local flag *is_enabled* reads and *set_enabled* sets."""

    def swap(enabled):
        prev = is_enabled()
        set_enabled(enabled)
        return prev

    return is_enabled, swap


_GRAD_MODE_STATE = (torch._C.is_grad_enabled, torch._C._swap_grad_enabled)

_INFERENCE_MODE_STATE = (_get_autograd_mode_state, torch._C._swap_autograd_mode_state)


class no_grad(_NoParamDecoratorContextManager):
    _carried_state = _GRAD_MODE_STATE
    _wrap_call = functools.partialmethod(_call_with_grad_mode, mode=False)

    def __enter__(self) -> None:
        self.prev = torch.is_grad_enabled()
        if torch._jit_internal.is_scripting():
            torch.set_grad_enabled(False)
        else:
            # The C function directly: torch.set_grad_enabled builds another
            # context manager object, which TorchScript needs and eager does not.
            torch._C._set_grad_enabled(False)

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        if torch._jit_internal.is_scripting():
            torch.set_grad_enabled(self.prev)
        else:
            torch._C._set_grad_enabled(self.prev)


class enable_grad(_NoParamDecoratorContextManager):
    _carried_state = _GRAD_MODE_STATE
    _wrap_call = functools.partialmethod(_call_with_grad_mode, mode=True)


class set_grad_enabled(_DecoratorContextManager):
    _carried_state = _GRAD_MODE_STATE
    _wrap_call = _call_with_grad_mode


class inference_mode(_DecoratorContextManager):
    _carried_state = _INFERENCE_MODE_STATE
    _wrap_call = _call_in_inference_mode

    def __new__(cls, mode=True):
        if isinstance(mode, bool):
            return super().__new__(cls)
        # ``@torch.inference_mode`` without parentheses passes the function; a
        # staticmethod or classmethod object is decorated as its function is.
        if not (callable(mode) or isinstance(mode, (staticmethod, classmethod))):
            raise TypeError(
                "torch.inference_mode(): mode must be bool (or, used as "
                "@torch.inference_mode without parentheses, the function to "
                f"decorate), not {torch.typename(mode)}"
            )
        # pyrefly: ignore [bad-specialization]
        return cls()(mode)


class set_multithreading_enabled(_DecoratorContextManager):
    _carried_state = _flag_state(
        torch._C._is_multithreading_enabled, torch._C._set_multithreading_enabled
    )

    def __init__(self, mode: bool) -> None: ...

    def __call__(self, orig_func: F) -> F:
        # As set_grad_enabled's: the constructor switched the setting for the
        # function form; as a decorator, it must leave the setting as it was.
        torch._C._set_multithreading_enabled(self.prev)
        return super().__call__(orig_func)


class enforce_grad_layout_policy(_DecoratorContextManager):
    _carried_state = _flag_state(
        torch._C._is_grad_layout_enforcement_enabled,
        torch._C._set_grad_layout_enforcement_enabled,
    )


class _force_original_view_tracking(_DecoratorContextManager):
    _carried_state = _flag_state(
        torch._C._is_view_replay_enabled, torch._C._set_view_replay_enabled
    )
