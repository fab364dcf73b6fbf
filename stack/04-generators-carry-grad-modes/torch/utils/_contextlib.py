# Step 04's versions of definitions later steps change (see stack/README.md).


class _Body:
    """A body's context, entered at its first step and exited where it ends, and its state."""

    def __init__(self, ctx_factory, carried):
        self.ctx_factory = ctx_factory
        self.ctx: Any = None
        self.state = None
        self.capture, self.swap = cast(Any, carried or (None, None))

    def exit(self, exc):
        if self.ctx is None:
            return  # never entered
        ctx, self.ctx = self.ctx, None
        caller = self.swap(self.state)
        try:
            if isinstance(exc, StopIteration):
                ctx.__exit__(None, None, None)
            else:
                return ctx.__exit__(type(exc), exc, exc.__traceback__)
        finally:
            self.swap(caller)


_UNTRACEABLE = (
    "a decorated generator's step left a grad mode of its own (a block open "
    "across a yield, or a mode it set), which torch.compile and torch.export "
    "cannot carry between steps: step it outside the compiled or exported code"
)


def _refuse(body, it):
    """Refuse *body*'s step, which traced code cannot carry: closed, unless Dynamo runs it again eagerly."""
    if torch.compiler.is_dynamo_compiling():
        # Not an error traced code could catch: the frame runs eagerly.
        torch._dynamo.graph_break(msg=_UNTRACEABLE)
    it.close()  # in the state its blocks restore
    raise RuntimeError(_UNTRACEABLE)


def _step_entered(body, it, method, arg):
    """``[method(arg)]`` in a fresh entry of *body*'s context: traced, or a context that carries nothing."""
    try:
        with body.ctx_factory():
            if not body.swap:
                return [method(arg)]
            entered = body.capture()
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


def context_decorator(ctx, func, *, carried=None):
    # carried: (capture, swap) of the state the context sets, which generators carry.
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
        return type(func)(context_decorator(ctx, func.__func__, carried=carried))
    if not callable(func):
        raise TypeError(
            f"a context manager can only decorate a function or other callable, "
            f"not {type(func).__name__} {func!r}"
        )
    if inspect.isgeneratorfunction(func):
        return _wrap_generator(ctx_factory, func, carried)

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

        carried = _declared(self, "_carried_state")
        return cast(F, context_decorator(self.clone, func, carried=carried))
