# A fragment of torch/_dynamo/bytecode_transformation.py: the definitions the
# patch adds there, and the imports they need (see overlay/_torch_gradmode_splice.py).
import inspect


def is_generator(code: types.CodeType) -> bool: ...


def is_suspendable(code: types.CodeType) -> bool:
    """True for the code of a generator, coroutine or async generator.

    A frame of such code can suspend and be resumed later, which Dynamo cannot
    convert: it has no resume functions for such frames.
    """
    return bool(
        code.co_flags
        & (
            inspect.CO_GENERATOR
            | inspect.CO_COROUTINE
            | inspect.CO_ITERABLE_COROUTINE
            | inspect.CO_ASYNC_GENERATOR
        )
    )
