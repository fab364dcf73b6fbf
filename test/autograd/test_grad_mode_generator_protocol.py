# Owner(s): ["module: autograd"]
"""How a context used as a decorator steps a generator.

The wrapper relays ``send``, ``throw`` and ``close`` to the body, entering
the context around each step, and keeps nothing the body yields or is sent.
"""

import contextlib
import functools
import inspect
import types
import warnings
import weakref

import torch
from torch.testing._internal.common_utils import (
    disable_gc,
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    skipIfTorchDynamo,
    TestCase,
)
from torch.utils._contextlib import _DecoratorContextManager, context_decorator


class Boom(Exception):
    pass


class Payload:
    """An object to watch the lifetime of with a weak reference."""


class Counting(_DecoratorContextManager):
    """A context that only logs being entered and left."""

    def __init__(self, log):
        self.log = log

    def clone(self):
        return Counting(self.log)

    def __enter__(self):
        self.log.append("enter")

    def __exit__(self, *exc_info):
        self.log.append(("exit", exc_info[0]))


@contextlib.contextmanager
def counting(log):
    log.append("enter")
    try:
        yield
    finally:
        log.append(("exit", None))


METHOD_KINDS = {"staticmethod": staticmethod, "classmethod": classmethod}


@skipIfTorchDynamo("steps generators eagerly around the thread's state")
class TestGradModeGeneratorProtocol(TestCase):
    @parametrize("context", ["DecoratorContextManager", "context_decorator"])
    def test_close_exits_as_on_a_clean_close(self, context):
        # The body is closed inside the context, whose __exit__ sees no
        # exception, even when the body's finally runs.
        log = []
        make_decorator = {
            "DecoratorContextManager": Counting,
            "context_decorator": lambda log: lambda func: context_decorator(
                lambda: counting(log), func
            ),
        }[context]

        def gen():
            try:
                yield
            finally:
                log.append("finally")

        body = make_decorator(log)(gen)()
        next(body)
        log.clear()
        body.close()
        self.assertEqual(log, ["enter", "finally", ("exit", None)])

    def test_suppressed_exception_ends_the_generator(self):
        @contextlib.contextmanager
        def suppressing():
            with contextlib.suppress(Boom):
                yield

        def gen():
            yield 1
            raise Boom

        body = context_decorator(suppressing, gen)()
        self.assertEqual(list(body), [1])

    def test_close_with_a_suppressing_exit_closes(self):
        class Suppressing(Counting):
            def __exit__(self, *exc_info):
                super().__exit__(*exc_info)
                return True

        log = []

        def gen():
            yield
            yield

        body = Suppressing(log)(gen)()
        next(body)
        body.close()  # not "generator ignored GeneratorExit"
        self.assertEqual(log[-1], ("exit", None))
        self.assertEqual(inspect.getgeneratorstate(body), inspect.GEN_CLOSED)

    def test_yielded_value_is_freed_once_the_caller_drops_it(self):
        @torch.no_grad()
        def gen():
            while True:
                yield Payload()

        body = gen()
        with disable_gc():
            value = weakref.ref(next(body))
            self.assertIsNone(value())
        body.close()

    @parametrize("fail", ("raise", "throw", "caught"))
    def test_failing_step_leaves_no_cycle(self, fail):
        @torch.no_grad()
        def gen():
            witness = Payload()
            try:
                yield weakref.ref(witness)
            except Boom:
                if fail != "caught":
                    raise
                return
            raise Boom

        with disable_gc():
            body = gen()
            witness = next(body)
            try:
                body.throw(Boom()) if fail != "raise" else next(body)
            except (Boom, StopIteration):
                pass
            self.assertIsNone(witness())

    def test_partial_without_warnings(self):
        def gen(n):
            for _ in range(n):
                yield torch.is_grad_enabled()

        with warnings.catch_warnings():
            warnings.simplefilter("error")
            body = torch.no_grad()(functools.partial(gen, 2))()
            self.assertEqual([next(body), next(body)], [False, False])
            self.assertTrue(torch.is_grad_enabled())
            body.close()

    def test_sent_value_is_not_kept(self):
        @torch.no_grad()
        def gen():
            while True:
                yield  # and drops what it is sent

        with disable_gc():
            body = gen()
            next(body)
            sent = Payload()
            ref = weakref.ref(sent)
            body.send(sent)
            del sent
            self.assertIsNone(ref())
            body.close()

    def test_thrown_in_with_one_argument(self):
        # throw(type, value, traceback) is deprecated since Python 3.12.
        def gen():
            try:
                yield
            except Boom as exc:
                yield exc

        body = torch.no_grad()(gen)()
        next(body)
        boom = Boom()
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            self.assertIs(body.throw(boom), boom)
        body.close()

    def test_thrown_in_traceback_ends_in_the_body(self):
        def gen():
            yield

        body = torch.no_grad()(gen)()
        next(body)
        try:
            body.throw(Boom())
        except Boom as exc:
            frames = [tb.tb_frame.f_code for tb in _tracebacks(exc.__traceback__)]
        self.assertEqual(frames[-1], gen.__code__)
        self.assertEqual(frames.count(gen.__code__), 1)

    def test_thrown_in_under_fullgraph_compile(self):
        # Dynamo models no traceback objects: the trim is skipped there.
        @torch.no_grad()
        def gen(x):
            try:
                yield x * 2
            except Boom:
                yield x * 5

        def run(x):
            body = gen(x)
            next(body)
            return body.throw(Boom())

        x = torch.ones(2, requires_grad=True)
        compiled = torch.compile(run, backend="eager", fullgraph=True)(x)
        self.assertEqual(compiled, run(x))
        self.assertFalse(compiled.requires_grad)

    @parametrize("kind", ["staticmethod", "classmethod"])
    def test_method_objects_keep_their_kind(self, kind):
        def gen(*args):
            yield torch.is_grad_enabled()

        class Holder:
            decorated = torch.no_grad()(METHOD_KINDS[kind](gen))

        self.assertIsInstance(vars(Holder)["decorated"], METHOD_KINDS[kind])
        self.assertEqual(list(Holder.decorated()), [False])

    def test_non_callable_is_refused(self):
        with self.assertRaisesRegex(TypeError, "only decorate a function.*not int"):
            torch.no_grad()(1)

    def test_types_coroutine_stays_awaitable(self):
        @torch.no_grad()
        @types.coroutine
        def gen():
            yield torch.is_grad_enabled()

        async def main():
            return await gen()

        coroutine = main()
        self.assertFalse(coroutine.send(None))
        coroutine.close()


def _tracebacks(tb):
    while tb is not None:
        yield tb
        tb = tb.tb_next


instantiate_parametrized_tests(TestGradModeGeneratorProtocol)


if __name__ == "__main__":
    run_tests()
