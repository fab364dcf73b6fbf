# Step 03's versions of definitions later steps change (see stack/README.md).


def _driver(start):
    """Make a generator function that steps the ``(context factory, iterator)`` that *start* returns."""

    def drive(*args, **kwargs):
        ctx_factory, it = start(*args, **kwargs)
        del args, kwargs  # the body may drop them
        method, arg, responses = it.send, None, []
        try:
            while True:
                with ctx_factory():
                    responses.append(method(arg))
                if not responses:
                    return  # the context suppressed what ended the body
                arg = None
                try:
                    # Popped as it is handed over: the caller may drop it.
                    arg = yield responses.pop()
                except GeneratorExit:
                    with ctx_factory():
                        it.close()
                    raise
                except BaseException as exc:
                    # Thrown next pass (so no __context__), without this frame's entry.
                    if not torch.compiler.is_dynamo_compiling():  # which has no tb_next
                        exc.with_traceback(exc.__traceback__.tb_next)  # type: ignore[union-attr]
                    method, arg = it.throw, exc
                else:
                    method = it.send
        except StopIteration as stop:
            return stop.value
        finally:
            # What was thrown in holds this frame in its traceback: a cycle.
            it = method = arg = None

    return drive


def _wrap_generator(ctx_factory, func):
    def start(*args, **kwargs):
        return ctx_factory, func(*args, **kwargs)

    generator_context = functools.wraps(func)(_driver(start))
    code = getattr(func, "__code__", None)  # a functools.partial has none
    if code is not None and code.co_flags & inspect.CO_ITERABLE_COROUTINE:
        return types.coroutine(generator_context)  # stay awaitable
    return generator_context


def context_decorator(ctx, func):
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
        return type(func)(context_decorator(ctx, func.__func__))
    if not callable(func):
        raise TypeError(
            f"a context manager can only decorate a function or other callable, "
            f"not {type(func).__name__} {func!r}"
        )
    if inspect.isgeneratorfunction(func):
        return _wrap_generator(ctx_factory, func)

    @functools.wraps(func)
    def decorate_context(*args, **kwargs):
        # pyrefly: ignore [bad-context-manager]
        with ctx_factory():
            return func(*args, **kwargs)

    return decorate_context
