# Step 06's versions of definitions later steps change (see stack/README.md).


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
                    with body.ctx_factory():
                        entered = body.capture() if body.swap else None
                        responses.append(method(arg))
                        if body.swap and body.capture() != entered:
                            it.close()  # in the state its blocks restore
                            raise RuntimeError(
                                "a decorated generator suspended in a grad mode, inference mode or "
                                "autocast state of its own (a block open across the yield, or a "
                                "mode it set), which torch.compile and torch.export cannot carry "
                                "to its next step: step it outside the compiled or exported code"
                            )
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
                    exc = exc.with_traceback(exc.__traceback__.tb_next)  # type: ignore[union-attr]
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
    # carried: (capture, swap) of the state the context sets, which bodies carry.
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
    if carried is not None and inspect.isasyncgenfunction(func):
        return _wrap_async_generator(ctx_factory, func, carried)
    if carried is not None and inspect.iscoroutinefunction(func):
        return _wrap_coroutine(ctx_factory, func, carried)
    if inspect.isgeneratorfunction(func):
        return _wrap_generator(ctx_factory, func, carried)

    @functools.wraps(func)
    def decorate_context(*args, **kwargs):
        # pyrefly: ignore [bad-context-manager]
        with ctx_factory():
            return func(*args, **kwargs)

    return decorate_context
