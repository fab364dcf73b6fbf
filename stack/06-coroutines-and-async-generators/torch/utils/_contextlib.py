# Step 06's versions of definitions later steps change (see stack/README.md).


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
