# A fragment of torch/utils/_contextlib.py: the definitions the patch adds or
# replaces there, and the imports they need (see overlay/_torch_gradmode_splice.py).
import contextlib
import functools
import inspect
import sys
import types
import warnings
from typing import Any, cast

import torch
from torch._C import (
    _is_torch_function_mode_enabled,
    _set_grad_enabled,
    _swap_grad_enabled,
    is_grad_enabled,
)


class _Body:
    """A body's context, entered at its first step and exited where it ends, and its state."""

    closed = False  # whether its async generator's wrapper relayed a close

    def __init__(self, ctx_factory, carried, agen=False):
        self.ctx_factory, self.agen = ctx_factory, agen
        self.ctx: Any = None
        self.state = None
        self.capture, self.swap = cast(Any, carried or (None, None))

    def exit(self, exc):
        if self.ctx is None or (self.agen and type(exc) is StopIteration):
            return  # never entered, or an async generator's step that yielded
        ctx, self.ctx = self.ctx, None
        # Entered outside any trace, it is left unseen by export's tracer too.
        with torch._C.DisableTorchFunction():
            # Whole: inference_mode's guard restores more than the body carries.
            caller = self.capture()
            self.swap(self.state)
            try:
                if isinstance(exc, (StopIteration, StopAsyncIteration)):
                    ctx.__exit__(None, None, None)
                else:
                    return ctx.__exit__(type(exc), exc, exc.__traceback__)
            finally:
                self.swap(caller)

    def finalize(self, agen):
        """Close *agen* again, in its state, if it ignored its wrapper's close (as generators are)."""
        if self.closed and not agen.ag_running:  # not while its wrapper's close awaits
            with contextlib.suppress(GeneratorExit, StopAsyncIteration):
                _drive_step(self, agen.athrow(GeneratorExit)).send(None)  # type: ignore[attr-defined]


def _traced():
    """Whether Dynamo or make_fx's pre-dispatch tracer (torch.export's) traces this thread."""
    # Not torch.compiler.is_compiling(): it holds for the whole process while any
    # thread compiles (test_eager_generator_while_another_thread_compiles).
    if torch.compiler.is_dynamo_compiling():
        return True
    # Not imported: there is no such tracer before its module is, nor an import
    # at interpreter exit, where a body under a mode may be finalised.
    proxy_tensor = sys.modules.get("torch.fx.experimental.proxy_tensor")
    if proxy_tensor is None or not _is_torch_function_mode_enabled():
        return False
    modes = torch.overrides._get_current_function_mode_stack()
    return any(isinstance(m, proxy_tensor.PreDispatchTorchFunctionMode) for m in modes)


_UNTRACEABLE = (
    "a decorated generator's step left a grad mode, inference mode or autocast "
    "state of its own (a block open across a yield, or a mode it set), which "
    "torch.compile and torch.export cannot carry between steps: step it outside "
    "the compiled or exported code"
)


def _close(body, it):
    """Close *body*'s iterator *it*, suspended in the state the thread is in, then its context."""
    # Unseen by export's tracer: they began outside it.
    with torch._C.DisableTorchFunction():
        it.close()
        body.exit(GeneratorExit())


def _refuse(body, it):
    """Refuse *body*'s step, which traced code cannot carry: closed, unless Dynamo runs it again eagerly."""
    if torch.compiler.is_dynamo_compiling():
        # Not an error traced code could catch: the frame runs eagerly.
        torch._dynamo.graph_break(msg=_UNTRACEABLE)
    _close(body, it)
    raise RuntimeError(_UNTRACEABLE)


def _check_fresh(body, it):
    """Close *body*, in its own state, and raise, unless that state is what a fresh entry gives here."""
    with torch._C.DisableTorchFunction():  # as _close
        with body.ctx_factory():
            fresh = body.state == body.capture()
        if not fresh:
            caller = body.swap(body.state)
            try:
                it.close()
            finally:
                body.state = body.swap(caller)
            body.exit(GeneratorExit())
            raise RuntimeError(_UNTRACEABLE)


def _step_entered(body, it, method, arg):
    """``[method(arg)]`` in a fresh entry of *body*'s context: traced, or a context that carries nothing."""
    try:
        with body.ctx_factory():
            if not body.swap:
                return [method(arg)]
            try:
                entered = body.capture()
            except RuntimeError:  # inference mode, under export's tracer
                _close(body, it)
                raise
            else:
                responses = [method(arg)]
                if body.capture() != entered:
                    _refuse(body, it)
                return responses
        return []  # the context suppressed what ended the body
    finally:
        # What was thrown in holds this frame in its traceback: a cycle.
        arg = None


def _driver(start):
    """Make a generator function that steps the ``(_Body, iterator)`` that *start* returns."""

    def drive(*args, **kwargs):
        body, it = start(*args, **kwargs)
        del args, kwargs  # the body may drop them
        method = send = it.send
        arg, responses = None, []
        try:
            while True:
                # At its first untraced step: traced steps end as they began.
                if body.ctx is None and body.swap and not _traced():
                    caller, ctx = body.capture(), body.ctx_factory()
                    ctx.__enter__()
                    body.ctx, body.state = ctx, body.swap(caller)
                # Traced, the context is entered at each step instead.
                swap = body.swap if body.ctx is not None else None
                # Export's tracer records grad mode's swaps, and no other state's:
                # the body is stepped as a fresh one, if it is one.
                if (
                    swap
                    and swap is not _swap_grad_enabled
                    and _is_torch_function_mode_enabled()
                    and _traced()
                ):
                    _check_fresh(body, it)
                    swap = None
                if swap:
                    caller = swap(body.state)
                    try:
                        responses.append(method(arg))
                    finally:
                        body.state, caller = swap(caller), None
                else:
                    # Not inline: Dynamo 2.13 cannot trace a StopIteration leaving a with
                    # block in a generator's frame (test_exhausted_generator).
                    responses = _step_entered(body, it, method, arg)
                    if not responses:
                        return  # the context suppressed what ended the body
                arg = None
                try:
                    # Popped as it is handed over: the caller may drop it.
                    arg = yield responses.pop()
                except BaseException as exc:
                    if type(exc) is GeneratorExit and not getattr(it, "cr_frame", 1):
                        raise  # a coroutine the collector finalised first
                    if isinstance(exc, GeneratorExit) and not swap:
                        # Closed in the context, as before: __exit__ sees no exception.
                        with body.ctx_factory():
                            it.close()
                        raise
                    # Thrown next pass (so no __context__), without this frame's entry.
                    if not torch.compiler.is_dynamo_compiling():  # which has no tb_next
                        exc.with_traceback(exc.__traceback__.tb_next)  # type: ignore[union-attr]
                    method, arg = it.throw, exc
                else:
                    method = send
        except StopIteration as stop:
            body.exit(stop)
            return stop.value
        except BaseException as exc:
            if not body.exit(exc):
                raise
        finally:
            # What was thrown in holds this frame in its traceback: a cycle.
            it = method = send = arg = None

    return drive


_drive_step = types.coroutine(_driver(lambda body, awaitable: (body, awaitable)))


def _wrap_generator(ctx_factory, func, carried=None):
    def start(*args, **kwargs):
        return _Body(ctx_factory, carried), func(*args, **kwargs)

    generator_context = functools.wraps(func)(_driver(start))
    code = getattr(func, "__code__", None)  # a functools.partial has none
    if code is not None and code.co_flags & inspect.CO_ITERABLE_COROUTINE:
        return types.coroutine(generator_context)  # stay awaitable
    return generator_context


def _wrap_coroutine(ctx_factory, func, carried):
    """Wrap coroutine function *func* to carry *carried* across its awaits."""

    @functools.wraps(func)
    async def coroutine_context(*args, **kwargs):
        coro = func(*args, **kwargs)
        del args, kwargs  # the body may drop them
        if not isinstance(coro, types.CoroutineType):
            coro = coro.__await__()  # from a function marked as a coroutine's
        return await _drive_step(_Body(ctx_factory, carried), coro)

    return coroutine_context


def _wrap_async_generator(ctx_factory, func, carried):
    """Wrap async generator function *func* to carry *carried* across its awaits and yields."""

    @functools.wraps(func)
    async def async_generator_context(*args, **kwargs):
        agen = func(*args, **kwargs)
        body = _Body(ctx_factory, carried, agen=True)
        del args, kwargs
        # Hidden from the loop, which closes agen in its own state (test_loop_shutdown_closes_bodies_in_their_mode).
        hooks = sys.get_asyncgen_hooks()
        sys.set_asyncgen_hooks(None, body.finalize)
        try:
            step = agen.asend(None)
        finally:
            sys.set_asyncgen_hooks(*hooks)
        values = []
        while True:
            try:
                values.append(await _drive_step(body, step))
            except StopAsyncIteration:
                return
            finally:
                step = None  # an athrow awaitable's exception holds this frame
            if body.ctx is None and body.state is not None:
                return  # its context suppressed what ended the body
            try:  # see _driver; the value sent is not kept either
                step = agen.asend((yield values.pop()))
            except BaseException as exc:
                body.closed = type(exc) is GeneratorExit
                step = agen.athrow(exc.with_traceback(exc.__traceback__.tb_next))  # type: ignore[union-attr]

    return async_generator_context


def _call_with_grad_mode(ctx, func, mode=None):
    """Wrap *func* to run with grad mode *mode* (else ``ctx.mode``, read at each call), at less cost."""

    @functools.wraps(func)
    def decorate_context(*args, **kwargs):
        prev = is_grad_enabled()
        _set_grad_enabled(ctx.mode if mode is None else mode)
        try:
            return func(*args, **kwargs)
        finally:
            _set_grad_enabled(prev)

    return decorate_context


def _call_in_inference_mode(ctx, func):
    """Wrap *func* to run in the inference mode *ctx* sets, as a ``with`` block would, at less cost."""
    ctx_factory = ctx.clone  # Dynamo models a bound method; ctx.clone() it skips

    @functools.wraps(func)
    def decorate_context(*args, **kwargs):
        traced = torch.compiler.is_dynamo_compiling()  # Dynamo cannot trace the guard
        with ctx_factory() if traced else torch._C._InferenceMode(ctx.mode):
            return func(*args, **kwargs)

    return decorate_context


def _get_autograd_mode_state():
    """The thread's autograd mode state, which traced code cannot record: say so, not trace without it."""
    if torch.compiler.is_dynamo_compiling():
        msg = "torch.compile cannot read inference mode to trace an inference_mode-decorated generator"
        torch._dynamo.graph_break(msg=msg)
    elif _traced():
        raise RuntimeError(
            "torch.export does not record inference mode, so it cannot trace an "
            "inference_mode-decorated generator: step it outside the exported code"
        )
    return torch._C._get_autograd_mode_state()


def _declared(ctx, name, methods=("clone", "__enter__", "__exit__")):
    """*ctx*'s *name*, if the first class in its MRO to define *name* or one of *methods* defines it."""
    for klass in type(ctx).__mro__:
        if vars(klass).keys() & {name, *methods}:
            return getattr(ctx, name) if name in vars(klass) else None


def context_decorator(ctx, func, *, carried=None, wrap_call=None):
    # carried: (capture, swap) of the state bodies carry; wrap_call: wraps plain calls.
    if callable(ctx) and hasattr(ctx, "__enter__"):
        raise AssertionError(...)

    if not callable(ctx):

        def ctx_factory():
            return ctx

    else:
        ctx_factory = ctx

    if inspect.isclass(func):
        raise RuntimeError(...)

    if isinstance(func, (staticmethod, classmethod)):
        # Wrap the function inside, by its kind, and keep the method kind.
        return type(func)(
            context_decorator(ctx, func.__func__, carried=carried, wrap_call=wrap_call)
        )
    if not callable(func):
        raise TypeError(
            f"a context manager can only decorate a function or other callable, "
            f"not {type(func).__name__} {func!r}"
        )
    if carried is not None and inspect.isasyncgenfunction(func):
        return _wrap_async_generator(ctx_factory, func, carried)
    if carried is not None and inspect.iscoroutinefunction(func):
        return _wrap_coroutine(ctx_factory, func, carried)
    if inspect.isgeneratorfunction(func):
        return _wrap_generator(ctx_factory, func, carried)
    if wrap_call is not None:
        return wrap_call(func)

    @functools.wraps(func)
    def decorate_context(*args, **kwargs):
        # pyrefly: ignore [bad-context-manager]
        with ctx_factory():
            return func(*args, **kwargs)

    return decorate_context


class _DecoratorContextManager:
    def __call__(self, orig_func: F) -> F:
        if inspect.isclass(orig_func):
            warnings.warn(...)
            func = cast(F, lambda *args, **kwargs: orig_func(*args, **kwargs))
        else:
            func = orig_func

        # What its block sets, and its plain calls' fast path, unless it makes its contexts otherwise.
        carried = _declared(self, "_carried_state")
        made = ("__init__", "clone", "__enter__", "__exit__")
        wrap_call = _declared(self, "_wrap_call", made)
        return cast(
            F, context_decorator(self.clone, func, carried=carried, wrap_call=wrap_call)
        )
