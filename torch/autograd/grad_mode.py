# A fragment of torch/autograd/grad_mode.py: the definitions the patch adds or
# replaces there, and the imports they need (see overlay/_torch_gradmode_splice.py).
from torch.utils._contextlib import _call_in_inference_mode, _call_with_grad_mode


# What every grad mode sets, and so what a body it decorates carries between steps.
_AUTOGRAD_MODE_STATE = (
    torch._C._get_autograd_mode_state,
    torch._C._swap_autograd_mode_state,
)


class no_grad(_NoParamDecoratorContextManager):
    _carried_state = _AUTOGRAD_MODE_STATE
    _wrap_call = staticmethod(_call_with_grad_mode)

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
    _carried_state = _AUTOGRAD_MODE_STATE
    _wrap_call = staticmethod(_call_with_grad_mode)


class set_grad_enabled(_DecoratorContextManager):
    _carried_state = _AUTOGRAD_MODE_STATE
    _wrap_call = staticmethod(_call_with_grad_mode)


class inference_mode(_DecoratorContextManager):
    _carried_state = _AUTOGRAD_MODE_STATE
    _wrap_call = staticmethod(_call_in_inference_mode)

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
    _carried_state = _AUTOGRAD_MODE_STATE

    def __init__(self, mode: bool) -> None: ...

    def __call__(self, orig_func: F) -> F:
        # As set_grad_enabled's: the constructor switched the setting for the
        # function form; as a decorator, it must leave the setting as it was.
        torch._C._set_multithreading_enabled(self.prev)
        return super().__call__(orig_func)


class enforce_grad_layout_policy(_DecoratorContextManager):
    _carried_state = _AUTOGRAD_MODE_STATE


class _force_original_view_tracking(_DecoratorContextManager):
    _carried_state = _AUTOGRAD_MODE_STATE
