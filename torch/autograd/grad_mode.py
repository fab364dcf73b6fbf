# mypy: allow-untyped-defs
from collections.abc import Callable
from typing import Any, cast

import torch

# The grad-mode ``__enter__``/``__exit__`` methods call these by their bare
# names: for a ``with`` block, looking up ``torch._C._set_grad_enabled``
# through two modules costs more than the call itself.  TorchScript,
# which compiles ``no_grad``, resolves the names to the same builtins.
from torch._C import (
    _get_autograd_mode_state,
    _set_grad_enabled,
    _swap_autograd_mode_state,
    is_grad_enabled,
)
from torch.utils._contextlib import (
    _call_in_inference_mode,
    _call_with_grad_mode,
    _DecoratorContextManager,
    _NoParamDecoratorContextManager,
    F,
)


__all__ = [
    "no_grad",
    "enable_grad",
    "set_grad_enabled",
    "inference_mode",
    "set_multithreading_enabled",
    "enforce_grad_layout_policy",
]


# What the grad-mode decorators own: see torch/utils/_contextlib.py.
_AUTOGRAD_MODE_STATE = (_get_autograd_mode_state, _swap_autograd_mode_state)


class no_grad(_NoParamDecoratorContextManager):
    r"""Context manager and decorator that turns gradient tracking off.

    Inside it, operations are not recorded by autograd: every result has
    ``requires_grad=False`` even when its inputs require grad, which saves the
    memory autograd would keep for a backward pass.  Use it for inference and
    for updates you never want to differentiate through.  Factory functions
    that take a ``requires_grad`` argument (and :class:`torch.nn.Parameter`)
    still honour that argument.

    The mode is thread-local: other threads keep their own.

    As a decorator, ``@torch.no_grad()`` or ``@torch.no_grad``, it covers the
    whole body of the function, whatever its kind:

    * a plain function runs inside ``with torch.no_grad():``;
    * a generator, ``async def`` coroutine or async generator runs each step of
      its body with grad off, and hands control back to its caller (at each
      ``yield`` or ``await`` that suspends it) with the caller's own mode
      restored; a mode the body sets itself, say with
      ``with torch.enable_grad():`` around a ``yield``, stays in force for the
      body until the body leaves that block.  The decorated function keeps its
      kind for :mod:`inspect`.

    .. versionchanged:: 2.14
        As a decorator, it covers the body of an ``async def`` coroutine or an
        async generator (it used to cover only the call that created it), and
        a generator's body keeps a mode block of its own across ``yield``
        without leaking it to the caller (the decorator used to override it
        at every resume).  See :ref:`grad-mode-suspend-doc`.

    .. note::
        :ref:`locally-disable-grad-doc` compares this with the other ways
        of turning gradient tracking off or on for part of a program.

    .. note::
        Forward-mode AD is not affected: see :ref:`forward-mode-ad`.  To stop
        forward gradients, unpack the dual tensors instead.

    Example::

        >>> x = torch.tensor([1.0], requires_grad=True)
        >>> with torch.no_grad():
        ...     y = x * 2
        >>> y.requires_grad
        False
        >>> @torch.no_grad()
        ... def halve(t):
        ...     return t / 2
        >>> halve(x).requires_grad
        False
        >>> @torch.no_grad
        ... def running_means(ts):
        ...     total = torch.zeros(1)
        ...     for n, t in enumerate(ts, 1):
        ...         total += t
        ...         yield total / n
        >>> [m.requires_grad for m in running_means([x, 3 * x])]
        [False, False]
        >>> torch.is_grad_enabled()  # the caller's mode is untouched
        True
        >>> with torch.no_grad():
        ...     w = torch.nn.Parameter(torch.ones(2))
        >>> w.requires_grad
        True
    """

    _carried_state = _AUTOGRAD_MODE_STATE
    _wrap_call = staticmethod(_call_with_grad_mode)

    def __init__(self) -> None:
        if not torch._jit_internal.is_scripting():
            super().__init__()
        # Declares ``prev`` for TorchScript, which compiles this class.
        self.prev = False

    def __enter__(self) -> None:
        self.prev = is_grad_enabled()
        if torch._jit_internal.is_scripting():
            torch.set_grad_enabled(False)
        else:
            # The C function directly: torch.set_grad_enabled builds another
            # context manager object, which TorchScript needs and eager does not.
            _set_grad_enabled(False)

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        if torch._jit_internal.is_scripting():
            torch.set_grad_enabled(self.prev)
        else:
            _set_grad_enabled(self.prev)


class enable_grad(_NoParamDecoratorContextManager):
    r"""Context manager and decorator that turns gradient tracking on.

    It undoes :class:`~no_grad` or :class:`~set_grad_enabled` for the code it
    covers, so that code can build a graph and call ``backward``.  Inside
    :class:`~inference_mode` it turns grad mode on but does not leave
    inference mode.

    The mode is thread-local: other threads keep their own.

    As a decorator, ``@torch.enable_grad()`` or ``@torch.enable_grad``, it
    covers the whole body of a plain function, generator, ``async def``
    coroutine or async generator, step by step, exactly as described for
    :class:`~no_grad`, and leaves the caller's mode as it was after every step.

    .. versionchanged:: 2.14
        As a decorator, it covers ``async def`` and async-generator bodies,
        and generator bodies keep their own mode blocks across ``yield``, as
        for :class:`~no_grad`.

    .. note::
        :ref:`locally-disable-grad-doc` compares this with the other ways
        of turning gradient tracking off or on for part of a program.

    .. note::
        Forward-mode AD is not affected: see :ref:`forward-mode-ad`.

    Example::

        >>> x = torch.tensor([1.0], requires_grad=True)
        >>> with torch.no_grad():
        ...     with torch.enable_grad():
        ...         y = x * 2
        >>> y.requires_grad
        True
        >>> y.backward()
        >>> x.grad
        tensor([2.])
        >>> @torch.enable_grad()
        ... def scaled(t):
        ...     return t * 3
        >>> with torch.no_grad():
        ...     z = scaled(x)
        >>> z.requires_grad
        True
    """

    _carried_state = _AUTOGRAD_MODE_STATE
    _wrap_call = staticmethod(_call_with_grad_mode)

    def __enter__(self) -> None:
        self.prev = is_grad_enabled()
        _set_grad_enabled(True)

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        _set_grad_enabled(self.prev)


class set_grad_enabled(_DecoratorContextManager):
    r"""Turn gradient tracking on or off: as a function, a context manager or a decorator.

    Called as a function, ``torch.set_grad_enabled(mode)`` sets the mode for
    the rest of the thread's work.  Used in a ``with`` statement, it sets the
    mode for the block and restores the previous one after it.  Used as a
    decorator, ``@torch.set_grad_enabled(mode)``, it covers the whole body of
    a plain function, generator, ``async def`` coroutine or async generator,
    step by step, as described for :class:`~no_grad`; the decorator line
    itself leaves the mode as it was.

    The mode is thread-local: other threads keep their own.

    .. versionchanged:: 2.14
        As a decorator, it covers ``async def`` and async-generator bodies,
        and generator bodies keep their own mode blocks across ``yield``, as
        for :class:`~no_grad`.  Called as a function inside a decorated
        generator, ``torch.set_grad_enabled(mode)`` now sets the body's mode
        until the body changes it again, across ``yield`` (it used to be
        undone at the next resume).

    Args:
        mode (bool): ``True`` to turn gradient tracking on, ``False`` to turn
            it off; handy when the choice is only known at run time.

    .. note::
        :ref:`locally-disable-grad-doc` compares this with the other ways
        of turning gradient tracking off or on for part of a program.

    .. note::
        Forward-mode AD is not affected: see :ref:`forward-mode-ad`.

    Example::

        >>> x = torch.tensor([1.0], requires_grad=True)
        >>> training = False
        >>> with torch.set_grad_enabled(training):
        ...     y = x * 2
        >>> y.requires_grad
        False
        >>> _ = torch.set_grad_enabled(False)
        >>> (x * 2).requires_grad
        False
        >>> _ = torch.set_grad_enabled(True)
        >>> (x * 2).requires_grad
        True
    """

    _carried_state = _AUTOGRAD_MODE_STATE
    _wrap_call = staticmethod(_call_with_grad_mode)

    def __init__(self, mode: bool) -> None:
        self.prev = is_grad_enabled()
        self.mode = mode
        _set_grad_enabled(mode)

    def __call__(self, orig_func: F) -> F:
        # The constructor already switched the mode, as the function form
        # must; a decorator must not, so undo it before wrapping.
        _set_grad_enabled(self.prev)
        return super().__call__(orig_func)

    def __enter__(self) -> None:
        _set_grad_enabled(self.mode)

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        _set_grad_enabled(self.prev)

    def __str__(self) -> str:
        return f"{torch.typename(self)}(mode={self.mode})"

    def __repr__(self) -> str:
        return str(self)

    def clone(self) -> "set_grad_enabled":
        r"""Return a new ``set_grad_enabled`` with the same mode."""
        return self.__class__(self.mode)


class inference_mode(_DecoratorContextManager):
    r"""Context manager and decorator that turns inference mode on or off.

    Inference mode is a stricter :class:`~no_grad`: besides not recording
    operations for autograd, it skips view tracking and version-counter
    updates, which makes inference faster.  Tensors created inside it are
    *inference tensors*; autograd refuses to save them for backward outside
    inference mode.  ``inference_mode(False)`` turns it off for a region nested
    inside one where it is on.

    The mode is thread-local: other threads keep their own.

    As a decorator, ``@torch.inference_mode()`` or ``@torch.inference_mode``,
    it covers the whole body of a plain function, generator, ``async def``
    coroutine or async generator, step by step, as described for
    :class:`~no_grad`: an async model server's ``async def`` endpoint or
    token-streaming async generator computes in inference mode at every step,
    while other tasks on the same event loop keep their own modes.

    .. versionchanged:: 2.14
        As a decorator, it covers ``async def`` and async-generator bodies
        (it used to do nothing for them), and generator bodies keep their own
        mode blocks across ``yield`` without leaking inference mode to the
        caller.  ``mode`` must be a ``bool`` (or the function to decorate):
        other values, such as ``0`` or ``None``, raise :class:`TypeError`
        instead of being taken for the function to decorate.

    .. note::
        :ref:`locally-disable-grad-doc` compares inference mode with the
        other ways of turning gradient tracking off for part of a program.
        Where inference tensors could reach code that records autograd
        graphs, :class:`~no_grad` is the safer choice.

    .. note::
        Unlike :class:`~no_grad`, inference mode also turns off
        :ref:`forward-mode AD <forward-mode-ad>`.

    .. warning::
        Inference mode does not put modules in evaluation mode; call
        ``model.eval()`` as well so that dropout and batch norm behave as they
        should for inference.

    Args:
        mode (bool or function): ``True`` (the default) to turn inference mode
            on, ``False`` to turn it off; or, when used as
            ``@torch.inference_mode`` without parentheses, the function to
            decorate.

    Example::

        >>> x = torch.ones(1, 2, 3, requires_grad=True)
        >>> with torch.inference_mode():
        ...     y = x * x
        >>> y.requires_grad, y.is_inference()
        (False, True)
        >>> @torch.inference_mode()
        ... def square(t):
        ...     return t * t
        >>> square(x).is_inference()
        True
        >>> import asyncio
        >>> @torch.inference_mode()
        ... async def serve(t):
        ...     await asyncio.sleep(0)
        ...     return t * 2, torch.is_inference_mode_enabled()
        >>> out, inside = asyncio.run(serve(x))
        >>> out.is_inference(), inside, torch.is_inference_mode_enabled()
        (True, True, False)
    """

    _carried_state = _AUTOGRAD_MODE_STATE
    _wrap_call = staticmethod(_call_in_inference_mode)

    def __init__(self, mode: bool = True) -> None:
        if not torch._jit_internal.is_scripting():
            super().__init__()
        self.mode = mode

    def __new__(cls, mode=True):
        if isinstance(mode, bool):
            return super().__new__(cls)
        if callable(mode) or isinstance(mode, (staticmethod, classmethod)):
            # ``@torch.inference_mode`` without parentheses passes the function.
            # __call__ takes staticmethod and classmethod objects too (see
            # context_decorator), though its type admits callables only.
            return cls()(cast(Callable[..., Any], mode))
        raise TypeError(
            "torch.inference_mode(): mode must be bool (or, used as @torch.inference_mode "
            f"without parentheses, the function to decorate), not {torch.typename(mode)}"
        )

    def __enter__(self) -> None:
        self._inference_mode_context = torch._C._InferenceMode(self.mode)
        self._inference_mode_context.__enter__()

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        self._inference_mode_context.__exit__(exc_type, exc_value, traceback)

    def clone(self) -> "inference_mode":
        r"""Return a new ``inference_mode`` with the same mode."""
        return self.__class__(self.mode)


def _enter_inference_mode(mode):
    """Enter inference mode *mode* and return the guard to pass to :func:`_exit_inference_mode`."""
    guard = torch._C._InferenceMode(mode)
    guard.__enter__()
    return guard


def _exit_inference_mode(mode):
    """Leave the inference mode entered by :func:`_enter_inference_mode`, given its guard."""
    mode.__exit__(None, None, None)


class set_multithreading_enabled(_DecoratorContextManager):
    r"""Choose whether the backward pass may run on per-device worker threads.

    With ``mode=True`` (the default state) the autograd engine runs the
    backward pass of work on :ref:`accelerator<accelerators>` devices on one
    reusable worker thread per device.  With ``mode=False`` it runs the whole
    backward pass on the thread that called it.

    The setting takes effect when the object is created, so it works as a
    plain function call, and is undone on leaving a ``with`` block; it also
    works as a decorator.  It is thread-local.

    .. versionchanged:: 2.14
        As a decorator, ``@set_multithreading_enabled(mode)`` applies the
        setting to the decorated function's calls only; the decoration line
        used to switch it for the rest of the thread's work as well.

    Args:
        mode (bool): ``True`` to allow worker threads, ``False`` to run the
            backward pass on the calling thread.

    .. note::
        :ref:`forward-mode AD <forward-mode-ad>` never uses worker threads,
        so this has no effect on it.
    """

    _carried_state = _AUTOGRAD_MODE_STATE

    def __init__(self, mode: bool) -> None:
        self.prev = torch._C._is_multithreading_enabled()
        torch._C._set_multithreading_enabled(mode)
        self.mode = mode

    def __call__(self, orig_func: F) -> F:
        # The constructor already switched the setting, as the function form
        # must; the decorator line must leave the setting alone.
        torch._C._set_multithreading_enabled(self.prev)
        return super().__call__(orig_func)

    def __enter__(self) -> None:
        pass

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        torch._C._set_multithreading_enabled(self.prev)

    def clone(self) -> "set_multithreading_enabled":
        r"""Return a new ``set_multithreading_enabled`` with the same mode."""
        return self.__class__(self.mode)


class enforce_grad_layout_policy(_DecoratorContextManager):
    r"""Choose whether accumulated gradients must follow the gradient layout contract.

    By contract, a gradient accumulated into ``.grad`` has the same strides as
    its parameter (when the parameter is non-overlapping and dense) and is
    row-major contiguous otherwise; optimizers and distributed reducers run
    faster for it.  With ``enable=False`` the engine relaxes this: a gradient
    it may steal is stolen even when its layout differs from the parameter's,
    saving a copy, and the warning about a broken layout contract is not
    shown.  Creating a brand-new gradient (cloning one that cannot be stolen)
    still follows the contract either way.

    The setting takes effect when the object is created and is undone on
    leaving a ``with`` block; it also works as a decorator.  It is
    thread-local.

    Args:
        enable (bool): ``True`` (the default) to enforce the contract,
            ``False`` to relax it.

    Example::

        >>> p = torch.empty(2, 3, 4).permute(2, 0, 1).requires_grad_()
        >>> with torch.autograd.enforce_grad_layout_policy(False):
        ...     (p * 2).sum().backward()
        >>> p.grad.shape
        torch.Size([4, 2, 3])
    """

    _carried_state = _AUTOGRAD_MODE_STATE

    def __init__(self, enable: bool = True) -> None:
        self.prev = torch._C._is_grad_layout_enforcement_enabled()
        torch._C._set_grad_layout_enforcement_enabled(enable)
        self.mode = enable

    def __call__(self, orig_func: F) -> F:
        # As for set_grad_enabled: the decorator line must leave the setting alone.
        torch._C._set_grad_layout_enforcement_enabled(self.prev)
        return super().__call__(orig_func)

    def __enter__(self) -> None:
        pass

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        torch._C._set_grad_layout_enforcement_enabled(self.prev)

    def clone(self) -> "enforce_grad_layout_policy":
        r"""Return a new ``enforce_grad_layout_policy`` with the same setting."""
        return self.__class__(self.mode)


class _force_original_view_tracking(_DecoratorContextManager):
    r"""Choose whether autograd always replays views to regenerate a mutated view.

    When a view of a tensor is modified in place, autograd must rebuild the
    updated view from its base, either by replaying the chain of view
    operations or with one ``as_strided`` call.  With ``mode=True`` it always
    replays; with ``mode=False`` it decides as it normally does.

    The setting takes effect when the object is created, as a function, and
    for the block of a ``with`` statement; it also works as a decorator.  It is
    thread-local.

    Args:
        mode (bool): ``True`` to always replay views, ``False`` for the
            default choice.
    """

    _carried_state = _AUTOGRAD_MODE_STATE

    def __init__(self, mode: bool) -> None:
        self.prev = torch._C._is_view_replay_enabled()
        self.mode = mode
        torch._C._set_view_replay_enabled(mode)

    def __call__(self, orig_func: F) -> F:
        torch._C._set_view_replay_enabled(self.prev)
        return super().__call__(orig_func)

    def __enter__(self) -> None:
        torch._C._set_view_replay_enabled(self.mode)

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        torch._C._set_view_replay_enabled(self.prev)

    def clone(self):
        """Return a new ``_force_original_view_tracking`` with the same mode."""
        return self.__class__(self.mode)


class _unsafe_preserve_version_counter(_DecoratorContextManager):
    r"""Hide in-place changes to some tensors from autograd's version counters.

    .. warning::
        Do not use this unless you know exactly why you need it.  Autograd
        uses version counters to detect tensors modified after being saved
        for backward; hiding a modification can silently corrupt gradients
        anywhere in the program, including code this block never touches.

    On leaving the block, each tensor's version counter is set back to its
    value on entering it.  A legitimate use is freeing the storage of a very
    large saved tensor and filling it again before backward needs it.

    Args:
        tensors (torch.Tensor or tuple of torch.Tensor): the tensors whose
            version counters to preserve.

    .. note::
        :ref:`forward-mode AD <forward-mode-ad>` is not affected.
    """

    def __init__(self, tensors: torch.Tensor | tuple[torch.Tensor, ...]) -> None:
        self.tensors = (tensors,) if isinstance(tensors, torch.Tensor) else tensors
        if not isinstance(self.tensors, tuple):
            raise AssertionError(
                f"tensors must be a tensor or a tuple of tensors, not {type(tensors).__name__}"
            )
        self.prev_versions = tuple(t._version for t in self.tensors)

    def __enter__(self) -> None:
        pass

    # *args takes what the base class's three parameters do.
    # pyrefly: ignore [bad-override]
    def __exit__(self, *args) -> None:
        torch._C._autograd._unsafe_set_version_counter(self.tensors, self.prev_versions)
