# mypy: allow-untyped-defs
"""Context managers that also decorate functions of every kind.

A grad-mode context manager used as a decorator must keep its promise for the
whole body of the function it decorates.  For a plain function that is a
``with`` block around the call.  A generator, a coroutine or an async
generator is different: its body runs in *steps*, and between two steps the
thread runs someone else's code.  Grad mode and inference mode are thread-local
C++ state, not Python frame state, so a mode set by the body would leak to
whoever runs next, and a mode set by the caller would leak into the body.

What the decorators own is the thread's *autograd mode state*: its
``c10::AutogradState`` (grad mode, inference mode, forward AD,
multithreading, view replay, grad-layout enforcement) and the dispatch key
bits inference mode toggles (switched with inference mode itself, so that
autograd keys other code excludes stay that code's).  A decorated body carries its own from step to
step, starting from the caller's with the decorator's ``with`` block applied;
the caller gets its own back exactly after every step.  Every other piece of
thread state (autocast, dispatch and torch-function modes and their keys,
other dispatch key bits, saved-tensor hooks) is never read or written here: a
decorated body changes it exactly as it would undecorated.  Only that split
can be kept exact: suspended bodies resume in any order, so restoring
everything a step changed would undo what the body meant to leave in force,
and no guard can restore a part of the state; hence
``torch._C._swap_autograd_mode_state``, which installs a saved state and
returns the one it replaced (torch/csrc/autograd/python_autograd_mode_state.cpp).

This module treats every suspendable body the same way (the design of PR
#49017, extended):

* :class:`_BodyMode` holds the state of one running body, computes its
  starting state, and runs the steps that take more than a swap: those of a
  context without a known effect (:class:`_ReenteringBodyMode`) and of a
  body Dynamo must not see;
* :func:`_driver` makes the one step driver: it relays ``send``/``throw``/
  ``close`` from the caller to the body, one step at a time, swapping the
  body's state in and the caller's back in its own frame
  (:func:`_async_driver` is its coroutine twin);
* thin wrappers make a generator function, a coroutine function or an async
  generator function of the same kind around it;
* :func:`context_decorator` picks the wrapper by the kind of function.
"""

import contextlib
import functools
import inspect
import sys
import types
import warnings
from collections.abc import Callable
from typing import Any, cast, overload, TypeVar
from typing_extensions import Self

import torch._C as _C
from torch._C import (
    _AutogradModeState,
    _get_autograd_mode_state,
    _set_grad_enabled,
    _swap_autograd_mode_state,
    is_grad_enabled,
)


# Used for annotating the decorator usage of _DecoratorContextManager (e.g.,
# 'no_grad' and 'enable_grad').
# See https://mypy.readthedocs.io/en/latest/generics.html#declaring-decorators
FuncType = Callable[..., Any]
F = TypeVar("F", bound=FuncType)


# ---------------------------------------------------------------------------
# How mode state is switched
# ---------------------------------------------------------------------------


class _BodyMode:
    """The autograd mode state of one suspendable body, for a context with a known effect.

    ``state`` is the body's state, swapped in around each step by
    :func:`_driver`: what the body would see running uninterrupted on a thread
    of its own.  :meth:`begin` sets it at the body's first entry; steps that
    take more than a swap (a body Dynamo must not see, a re-entered context)
    go through :meth:`step`.
    """

    __slots__ = ("state", "eager", "_ctx_factory")

    def __init__(self, ctx_factory, eager):
        self._ctx_factory = ctx_factory
        # True for coroutines and async generators: see _without_dynamo.
        self.eager = eager
        self.state: _AutogradModeState | None = None

    def begin(self):
        """Give the body its starting state, unless it has one: the caller's, with the context applied."""
        if self.state is None:
            self.state = self._run(self._start)

    def step(self, method, arg):
        """Run ``method(arg)``, one step of the body, in the body's state."""
        return self._run(self._step, method, arg)

    def abandon(self, close):
        """Run ``close()``, which closes a body left suspended by a failed step, in the body's state.

        Only a re-entered context can fail a step without the body's help (its
        ``clone``, ``__enter__`` or ``__exit__`` raised).  Dropping the body
        would close it later in whatever state the thread then has, and its
        own ``with`` exits would force their saved modes onto that code; so
        close it now, without the failing context.  What closing raises is
        dropped: the failure already propagating is the one to report.
        """
        self._ctx_factory = contextlib.nullcontext
        try:
            self.step(_call, close)
        except Exception:
            pass

    def _run(self, func, *args):
        return _without_dynamo(func, *args) if self.eager else func(*args)

    def _start(self):
        with self._ctx_factory():
            return _get_autograd_mode_state()

    def _step(self, method, arg):
        state = self.state
        if state is None:
            # Not reached: begin() runs before any step, and a body whose
            # begin() failed never started, so nothing abandons it.  This
            # narrows the type for mypy (upstream's ruff bans assert, S101).
            raise RuntimeError("the body has no autograd mode state: it never started")
        caller = _swap_autograd_mode_state(state)
        try:
            return method(arg)
        finally:
            self.state = _swap_autograd_mode_state(caller)


class _ReenteringBodyMode(_BodyMode):
    """A :class:`_BodyMode` for a context without a known effect, entered afresh around every step.

    Such contexts (``dual_level``, third-party subclasses) may do more than
    set autograd mode state, so each step gets a fresh one.  For autograd
    mode state the body is treated as under the built-in decorators: it
    starts from what the context sets, and from then on carries its own,
    swapped in inside the context.
    """

    __slots__ = ("_saved",)

    def __init__(self, ctx_factory, eager):
        super().__init__(ctx_factory, eager)
        self._saved = None  # ``state`` stays None: every step goes through step()

    def begin(self):
        pass  # the context is entered at the first step, like at every other

    def _step(self, method, arg):
        caller = _get_autograd_mode_state()
        try:
            with self._ctx_factory():
                if self._saved is None:
                    entered = _get_autograd_mode_state()
                else:
                    entered = _swap_autograd_mode_state(self._saved)
                try:
                    return method(arg)
                finally:
                    # The context exits in the state it entered.
                    self._saved = _swap_autograd_mode_state(entered)
        finally:
            _swap_autograd_mode_state(caller)


def _body_mode(ctx_factory, reenter, eager):
    return (_ReenteringBodyMode if reenter else _BodyMode)(ctx_factory, eager)


def _call(function):
    return function()


def _close_async_generator(agen, pending):
    """Close async generator *agen* at once, as ``close()`` closes a generator.

    *pending* is the ``asend``/``athrow`` awaitable of its last step: if that
    step left the body suspended at an ``await``, the body is closed there.
    A body that awaits again while closing cannot be finished without the
    event loop, and is left suspended there.
    """
    try:
        if agen.ag_running:
            pending.throw(GeneratorExit())
        else:
            if pending is not None:
                # Never started (the step failed before it): Python 3.13
                # warns that an unstarted asend was never awaited.
                pending.close()
            agen.aclose().send(None)
    except (GeneratorExit, StopIteration, StopAsyncIteration):
        # Closed; GeneratorExit must not escape _BodyMode.abandon, which
        # drops only ordinary exceptions.
        pass


def _finalize_async_generator(mode, agen):
    """Close async generator *agen*, found unreachable before its wrapper, in its mode."""
    mode.abandon(functools.partial(_close_async_generator, agen, None))


# Dynamo's eval-frame callback, switched off around the steps of a body it
# must not see (see _without_dynamo).  Bound from torch._C, which is loaded
# already: this imports no part of torch._dynamo.
_eval_frame = getattr(getattr(_C, "_dynamo", None), "eval_frame", None)
if _eval_frame is not None:
    _get_eval_frame_callback = _eval_frame.get_eval_frame_callback
    _set_eval_frame = _eval_frame.set_eval_frame
else:  # pragma: no cover - a build without Dynamo

    def _get_eval_frame_callback():
        return None

    def _set_eval_frame(callback):
        return None


def _without_dynamo(func, *args, **kwargs):
    """Return ``func(*args, **kwargs)``, called with Dynamo's eval-frame callback off.

    Used to make, step and close coroutine and async-generator bodies.
    Dynamo cannot compile them, but takes only
    ``CO_GENERATOR`` for the sign of a suspendable frame: a coroutine or async
    generator function called while a compiled region's callback is active --
    in a graph break, around ``asyncio.run`` say -- has its frame converted.
    The converted body reads grad mode when it is traced, not when it runs;
    and on CPython 3.11 its ``RETURN_GENERATOR`` copies the converted frame,
    which is larger, into a coroutine object sized for the original code: a
    heap overrun, and a crash later.  So such bodies run eagerly, as under
    ``torch._dynamo.disable``; what they call that was compiled explicitly
    still runs compiled.  Outside a compiled region the callback is off
    already, and this costs one check.
    """
    if _get_eval_frame_callback() is None:
        return func(*args, **kwargs)
    prior = _set_eval_frame(None)
    try:
        return func(*args, **kwargs)
    finally:
        _set_eval_frame(prior)


def _is_closed(body):
    """Whether *body*, a coroutine or async generator, has finished."""
    if isinstance(body, types.CoroutineType):
        return inspect.getcoroutinestate(body) == inspect.CORO_CLOSED
    if isinstance(body, types.AsyncGeneratorType):
        return body.ag_frame is None
    return False


def _is_suspended(body):
    """Whether *body*, a generator or coroutine, is suspended at a ``yield`` or ``await``."""
    # inspect rather than gi_suspended/cr_suspended, which Python 3.10 lacks.
    if isinstance(body, types.GeneratorType):
        return inspect.getgeneratorstate(body) == inspect.GEN_SUSPENDED
    if isinstance(body, types.CoroutineType):
        return inspect.getcoroutinestate(body) == inspect.CORO_SUSPENDED
    return False


def _forget_step_locals(tb):
    """Clear the locals of the finished step frames in traceback *tb*."""
    while tb is not None:
        if tb.tb_frame.f_code in _STEP_CODES:
            try:
                tb.tb_frame.clear()
            except RuntimeError:  # still executing: not one of ours to clear
                pass
        tb = tb.tb_next


_STEP_CODES = frozenset(
    f.__code__
    for f in (
        _BodyMode.step,
        _BodyMode._run,
        _BodyMode._step,
        _ReenteringBodyMode._step,
        _without_dynamo,
    )
)


# ---------------------------------------------------------------------------
# One step driver shared by every suspendable kind
# ---------------------------------------------------------------------------


def _driver(start):
    """Return a generator function that runs a body step by step in its own state.

    ``start(*args, **kwargs)`` returns ``(mode, body)``: a :class:`_BodyMode`
    and anything with the generator protocol -- a generator, a coroutine, or
    the awaitable of one ``asend``/``athrow`` of an async generator.
    The driver relays its caller's ``send``/``throw``/``close`` to the body,
    one step each.  It is the wrapper itself (not something the wrapper
    delegates to with ``yield from``), so that a generator that ignores
    ``GeneratorExit`` stays suspended, and resumable, as it would undecorated;
    and it runs the common step itself, so that a step costs one Python frame
    on top of the body's (a decorated recursive generator gets deep).
    """

    def drive(*args, **kwargs):
        mode, body = start(*args, **kwargs)
        # The arguments may hold an exception (an athrow awaitable does),
        # whose traceback would hold this frame: keep no reference.
        del args, kwargs
        eager = mode.eager
        send = body.send  # bound once: every step but a throw uses it
        # A new body is started by sending it None.
        method, arg = send, None
        try:
            # At the body's first entry: the first request to this generator.
            mode.begin()
            while True:
                # The one place the body runs.  ``arg`` may be an exception
                # the caller threw; drop it once delivered, or its traceback
                # (which holds this frame) would keep it alive.
                try:
                    state = mode.state
                    if state is None or (
                        eager and _get_eval_frame_callback() is not None
                    ):
                        # A re-entered context, or Dynamo to keep out.
                        response = mode.step(method, arg)
                    else:
                        # Every other step: the body's state in, the caller's back.
                        caller = _swap_autograd_mode_state(state)
                        try:
                            response = method(arg)
                        finally:
                            mode.state = _swap_autograd_mode_state(caller)
                finally:
                    arg = None
                try:
                    # Hand the body's value to our caller, outside the body's
                    # state, and wait for the caller's next request.
                    arg = yield response
                except BaseException as exc:
                    # The caller threw into us, or closed us (GeneratorExit).
                    # Deliver the exception where the body is suspended, in
                    # its state: its ``except`` and ``finally`` blocks and
                    # ``with`` exits see what they would undecorated.
                    # GeneratorExit goes the same way, so a body that yields
                    # in response makes our caller's close() fail as it would
                    # for the body.  Thrown on the next pass, outside this
                    # ``except`` block, so that what the body raises gets no
                    # __context__ it would not have undecorated; and with the
                    # one-argument ``throw``: the exception carries its own
                    # traceback, and the three-argument form is deprecated
                    # since Python 3.12.
                    method, arg = body.throw, exc
                else:
                    # The caller sent a value (``next`` sends None): resume the body.
                    method = send
        except StopIteration as stop:
            # The body returned: return its value too (PEP 380).
            return stop.value
        except BaseException as exc:
            _after_failure(mode, body)
            # The exception's traceback holds this frame and the finished
            # frames of the step that raised it, which hold the body and,
            # after a throw, the exception itself: break those cycles so
            # that dropping the exception frees everything at once.
            body = send = method = None
            _forget_step_locals(exc.__traceback__)
            raise

    return drive


def _async_driver(start):
    """The coroutine twin of :func:`_driver`: it awaits where :func:`_driver` yields.

    A decorated coroutine is this coroutine function itself, so that a step
    costs one Python frame on top of the body's, as for a generator; an
    ``async def`` awaiting :func:`_driver` costs two, and a decorated
    recursive coroutine went a quarter as deep as an undecorated one.
    """

    async def drive(*args, **kwargs):
        mode, body = start(*args, **kwargs)
        del args, kwargs
        eager = mode.eager
        send = body.send
        method, arg = send, None
        try:
            mode.begin()
            while True:
                # As in _driver.
                try:
                    state = mode.state
                    if state is None or (
                        eager and _get_eval_frame_callback() is not None
                    ):
                        response = mode.step(method, arg)
                    else:
                        caller = _swap_autograd_mode_state(state)
                        try:
                            response = method(arg)
                        finally:
                            mode.state = _swap_autograd_mode_state(caller)
                finally:
                    arg = None
                try:
                    arg = await _suspend(response)
                except BaseException as exc:
                    if type(exc) is GeneratorExit and _is_closed(body):
                        # The cyclic collector finalised the body first: we are
                        # closed too.  (A closed generator re-raises what is
                        # thrown into it; a closed coroutine raises RuntimeError.)
                        raise
                    method, arg = body.throw, exc
                else:
                    method = send
        except StopIteration as stop:
            return stop.value
        except BaseException as exc:
            _after_failure(mode, body)
            body = send = method = None
            _forget_step_locals(exc.__traceback__)
            raise

    return drive


@types.coroutine
def _suspend(value):
    """Suspend the awaiting coroutine, handing *value* to its caller; return what the caller sends."""
    return (yield value)


def _after_failure(mode, body):
    """Clean up after a step of *body* failed, before the exception propagates."""
    if _is_suspended(body):
        # The step failed outside the body: see _BodyMode.abandon.
        mode.abandon(body.close)
    elif (
        isinstance(body, types.CoroutineType)
        and inspect.getcoroutinestate(body) == inspect.CORO_CREATED
    ):
        # The first step failed before the coroutine started: closing it runs
        # none of its code, and keeps Python from warning that it was never
        # awaited -- our caller did await it.
        body.close()


# Drives one asend/athrow awaitable of an async generator, and is itself awaitable.
_drive_awaitable = types.coroutine(_driver(lambda mode, awaitable: (mode, awaitable)))


# ---------------------------------------------------------------------------
# Thin wrappers, one per kind of function
# ---------------------------------------------------------------------------


def _wrap_generator(ctx_factory, func, *, reenter=True):
    """Wrap generator function *func* so each step of its body runs under ``ctx_factory()``.

    *ctx_factory* must return a fresh context manager on each call, so that
    one-shot context managers work.
    """

    def start(*args, **kwargs):
        return _body_mode(ctx_factory, reenter, eager=False), func(*args, **kwargs)

    generator_context = functools.wraps(func)(_driver(start))
    code = getattr(func, "__code__", None)
    if code is not None and code.co_flags & inspect.CO_ITERABLE_COROUTINE:
        # A ``@types.coroutine`` generator is awaitable; stay awaitable.
        generator_context = types.coroutine(generator_context)
    return generator_context


def _wrap_coroutine(ctx_factory, func, *, reenter=True):
    """Wrap coroutine function *func* so each step of its body runs under ``ctx_factory()``."""

    def start(*args, **kwargs):
        awaitable = _without_dynamo(func, *args, **kwargs)
        # A native coroutine has the generator protocol itself; any other
        # awaitable (from a function merely marked as a coroutine function)
        # is driven through its ``__await__`` iterator.
        if not isinstance(awaitable, types.CoroutineType):
            awaitable = _without_dynamo(awaitable.__await__)
        return _body_mode(ctx_factory, reenter, eager=True), awaitable

    return functools.wraps(func)(_async_driver(start))


def _wrap_async_generator(ctx_factory, func, *, reenter=True):
    """Wrap async generator function *func* so each step of its body runs under ``ctx_factory()``."""

    @functools.wraps(func)
    async def async_generator_context(*args, **kwargs):
        mode = _body_mode(ctx_factory, reenter, eager=True)
        agen = _without_dynamo(func, *args, **kwargs)
        # The body runs only inside the awaitables of asend/athrow; each is
        # driven step by step through the same body mode.  The first one is
        # made with the event loop's async-generator hooks replaced: only this
        # wrapper is registered with the loop, so that the loop (at
        # shutdown_asyncgens, or trio at the end of its run) closes the body
        # through us, in its mode; and the body's own finaliser, which runs
        # only when the cyclic collector reaches the body before this wrapper,
        # closes it in its mode too.
        hooks = sys.get_asyncgen_hooks()
        sys.set_asyncgen_hooks(
            firstiter=None, finalizer=functools.partial(_finalize_async_generator, mode)
        )
        try:
            pending = agen.asend(None)
        finally:
            sys.set_asyncgen_hooks(*hooks)
        while True:
            try:
                value = await _drive_awaitable(mode, pending)
            except StopAsyncIteration:
                return
            except BaseException:
                # The body is alive only if the step failed outside it: see
                # _BodyMode.abandon.  (The driver cannot do this for us: it
                # sees the awaitable, not the async generator.)
                if getattr(agen, "ag_frame", None) is not None:
                    mode.abandon(
                        functools.partial(_close_async_generator, agen, pending)
                    )
                raise
            finally:
                # An athrow awaitable holds the thrown exception, whose
                # traceback holds this frame: drop the cycle.
                pending = None
            try:
                request = yield value
            except BaseException as exc:
                # The caller threw into us, or closed us: aclose() and the
                # loop's finalisation throw GeneratorExit, which goes to the
                # body the same way, so that a body that yields in response
                # makes our caller's aclose() fail and stays resumable, as it
                # would undecorated.  Thrown later, from outside this
                # ``except`` block, for the same reason as in _driver.
                if type(exc) is GeneratorExit and _is_closed(agen):
                    # Finalised first by the cyclic collector (see above).
                    raise
                pending = agen.athrow(exc)
            else:
                pending = agen.asend(request)

    return async_generator_context


def _wrap_function(ctx_factory, func, effect=None):
    """Wrap plain function *func* in a ``with ctx_factory():`` block.

    With a known grad-mode *effect* (see :meth:`_DecoratorContextManager._grad_mode_effect`)
    the mode is switched directly, without building a context manager per
    call; under Dynamo the ``with`` form is kept, as Dynamo models it.
    """
    if effect is None:
        return _wrap_function_in_context(ctx_factory, func)
    kind, mode = effect
    if kind == "grad":
        return _wrap_function_in_grad_mode(ctx_factory, func, mode)
    return _wrap_function_in_inference_mode(ctx_factory, func, mode)


def _wrap_function_in_context(ctx_factory, func):
    @functools.wraps(func)
    def decorate_context(*args, **kwargs):
        with ctx_factory():
            return func(*args, **kwargs)

    return decorate_context


def _wrap_function_in_grad_mode(ctx_factory, func, mode):
    @functools.wraps(func)
    def decorate_context(*args, **kwargs):
        if _is_dynamo_compiling():
            with ctx_factory():
                return func(*args, **kwargs)
        prev = is_grad_enabled()
        _set_grad_enabled(mode)
        try:
            return func(*args, **kwargs)
        finally:
            _set_grad_enabled(prev)

    return decorate_context


def _wrap_function_in_inference_mode(ctx_factory, func, mode):
    @functools.wraps(func)
    def decorate_context(*args, **kwargs):
        if _is_dynamo_compiling():
            with ctx_factory():
                return func(*args, **kwargs)
        with _C._InferenceMode(mode):
            return func(*args, **kwargs)

    return decorate_context


def _is_dynamo_compiling():
    # Bound on first use: torch.compiler is not importable while torch.autograd,
    # which imports this module, is still initialising.
    global _is_dynamo_compiling
    from torch.compiler import is_dynamo_compiling

    _is_dynamo_compiling = is_dynamo_compiling
    return is_dynamo_compiling()


# ---------------------------------------------------------------------------
# Dispatch by kind
# ---------------------------------------------------------------------------


def context_decorator(ctx, func, *, effect=None):
    """Decorate *func* with context manager *ctx*, like :class:`contextlib.ContextDecorator`.

    It differs from the standard library in that it

    1. wraps instead of inheriting, so context managers written in C work;
    2. runs each step of a generator, coroutine or async generator under the
       context, and never the caller's code between steps (c.f.
       https://bugs.python.org/issue37743), keeping the function's kind;
    3. refuses classes, where it is unclear whether only the constructor or
       every method was meant.

    :param ctx: a context manager that can be entered any number of times, or
        a callable returning a fresh context manager each time.
    :param func: the function to decorate.
    :param effect: ``("grad", mode)`` or ``("inference", mode)`` when the
        context's whole effect is to set grad mode or inference mode to
        *mode*; the wrappers then switch the mode themselves and carry the
        body's own mode from step to step.  ``None`` (any other context) enters
        a fresh context around every call and every step.
    """
    if callable(ctx) and hasattr(ctx, "__enter__"):
        raise AssertionError(
            f"{ctx!r} is both callable and a context manager (it has __enter__), "
            "so it is unclear which to use. Pass context_decorator(lambda: ctx()) "
            "for a factory of context managers, or context_decorator(lambda: ctx) "
            "for the context manager itself."
        )
    ctx_factory = ctx if callable(ctx) else (lambda: ctx)

    if inspect.isclass(func):
        raise RuntimeError(
            "Cannot decorate classes: it is unclear whether the context should "
            "apply to the constructor alone or to every method, and decorating "
            "a class where it is defined would stop it from being used as a "
            "type. Decorate the methods that need it instead."
        )
    if isinstance(func, (staticmethod, classmethod)):
        # Decorate the function inside and keep the method kind.
        return type(func)(context_decorator(ctx, func.__func__, effect=effect))
    if not callable(func):
        raise TypeError(
            f"a context manager can only decorate a function or other callable, "
            f"not {type(func).__name__} {func!r}"
        )

    reenter = effect is None
    if inspect.isasyncgenfunction(func):
        return _wrap_async_generator(ctx_factory, func, reenter=reenter)
    if inspect.iscoroutinefunction(func):
        return _wrap_coroutine(ctx_factory, func, reenter=reenter)
    if inspect.isgeneratorfunction(func):
        return _wrap_generator(ctx_factory, func, reenter=reenter)
    return _wrap_function(ctx_factory, func, effect)


class _DecoratorContextManager:
    """Allow a context manager to be used as a decorator.

    .. versionchanged:: 2.14
        Generators, ``async def`` coroutines and async generators get a fresh
        context around every step, and their autograd mode state is carried
        with the body: a mode the body sets itself stays in force across
        ``yield`` and ``await`` (the context used to override it at every
        step), and the caller gets its own back after every step.
    """

    def __call__(self, orig_func: F) -> F:
        if inspect.isclass(orig_func):
            warnings.warn(
                "Decorating classes is deprecated and will be disabled in "
                "future versions: decorate functions or methods only. To keep "
                "what class decoration does today, decorate the class's "
                "`__init__` method alone.",
                FutureWarning,
                stacklevel=2,
            )
            func = cast(F, lambda *args, **kwargs: orig_func(*args, **kwargs))
        else:
            func = orig_func

        # Only the class that defines _grad_mode_effect is trusted with it: a
        # subclass may do more in __enter__ than its parent did.
        describe = type(self).__dict__.get("_grad_mode_effect")
        effect = describe(self) if describe is not None else None
        return cast(F, context_decorator(self.clone, func, effect=effect))

    def __enter__(self) -> None:
        raise NotImplementedError

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        raise NotImplementedError

    def clone(self):
        """Return a fresh copy of this context manager; override if ``__init__`` takes arguments."""
        return self.__class__()

    def _grad_mode_effect(self):
        """``("grad", mode)`` or ``("inference", mode)`` if entering only sets that mode, else None.

        A subclass defines this to let decorated functions switch the mode
        directly and carry a suspended body's own mode from step to step.
        """
        return None


class _NoParamDecoratorContextManager(_DecoratorContextManager):
    """Allow a context manager to be used as a decorator without parentheses."""

    @overload
    def __new__(cls, orig_func: F) -> F: ...  # type: ignore[misc]
    @overload
    def __new__(cls, orig_func: None = None) -> Self: ...

    def __new__(cls, orig_func: F | None = None) -> Self | F:  # type: ignore[misc]
        if orig_func is None:
            return cls.__new_instance(cls)
        return cls()(orig_func)

    # What ``super().__new__`` finds, looked up once per class rather than on
    # every ``with torch.no_grad():``, where the ``super()`` call cost about
    # a sixth of the whole block.  A subclass whose MRO puts a base with
    # a ``__new__`` of its own after this class gets that one.  Others
    # inherit this entry: TorchScript refuses to compile a class (no_grad)
    # that holds a builtin such as object.__new__ in its own namespace.
    __new_instance: Callable[..., Any] = object.__new__

    # Whether the ``super().__init__()`` of the class's own ``__init__`` (say
    # no_grad's) reaches an ``__init__`` other than object's, such as a
    # mixin's: only then need it be called, for it costs a fifth of a whole
    # ``with torch.no_grad():`` block.
    _cooperative_init = False

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        new = super().__new__
        if new is not cls.__new_instance:
            cls.__new_instance = new
        # The classes that define an ``__init__``, in MRO order: the first one's
        # runs, and its ``super().__init__()`` reaches the second one's.
        defining = [klass for klass in cls.__mro__ if "__init__" in vars(klass)]
        cooperative = (
            len(defining) > 1 and vars(defining[1])["__init__"] is not object.__init__
        )
        if cooperative is not cls._cooperative_init:
            cls._cooperative_init = cooperative
