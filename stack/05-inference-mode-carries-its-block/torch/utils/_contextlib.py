# Step 05's versions of definitions later steps change (see stack/README.md).


class _Body:
    def exit(self, exc):
        if self.ctx is None:
            return  # never entered
        ctx, self.ctx = self.ctx, None
        # Entered outside any trace, it is left unseen by export's tracer too.
        with torch._C.DisableTorchFunction():
            # Whole: inference_mode's guard restores more than the body carries.
            caller = self.capture()
            self.swap(self.state)
            try:
                if isinstance(exc, StopIteration):
                    ctx.__exit__(None, None, None)
                else:
                    return ctx.__exit__(type(exc), exc, exc.__traceback__)
            finally:
                self.swap(caller)


_UNTRACEABLE = (
    "a decorated generator's step left a grad mode or inference mode state of "
    "its own (a block open across a yield, or a mode it set), which "
    "torch.compile and torch.export cannot carry between steps: step it outside "
    "the compiled or exported code"
)


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
