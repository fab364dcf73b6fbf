# Owner(s): ["module: autograd"]
"""Plain functions decorated with a grad mode: each call as in a ``with`` block."""

import torch
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    skipIfTorchDynamo,
    TestCase,
)


def mode():
    return torch.is_grad_enabled(), torch.is_inference_mode_enabled()


@skipIfTorchDynamo("checks the thread's mode around eager calls")
class TestGradModeDecoratedCalls(TestCase):
    @parametrize(
        "make", ["set_grad_enabled", "inference_mode"], name_fn=lambda make: make
    )
    def test_decorator_is_read_at_each_call(self, make):
        decorator = {
            "set_grad_enabled": lambda: torch.set_grad_enabled(False),
            "inference_mode": lambda: torch.inference_mode(True),
        }[make]()
        decorated = decorator(mode)
        self.assertEqual(decorated(), (False, make == "inference_mode"))
        decorator.mode = not decorator.mode
        self.assertEqual(decorated(), (True, False))
        self.assertEqual(mode(), (True, False))

    @parametrize("override", ["__enter__", "__init__", "clone"])
    def test_subclass_that_enters_otherwise_is_honoured(self, override):
        log = []

        def logged(method):
            def wrapper(self, *args):
                log.append(override)
                return method(self, *args)

            return wrapper

        method = getattr(torch.no_grad, override)
        subclass = type("LoggedNoGrad", (torch.no_grad,), {override: logged(method)})
        decorated = subclass()(mode)
        log.clear()
        self.assertEqual([decorated(), decorated()], [(False, False)] * 2)
        self.assertEqual(log, [override] * 2)

    @parametrize("decorator", ["no_grad", "enable_grad"])
    def test_under_export(self, decorator):
        # Pre-dispatch tracing records the grad mode switches the call makes.
        @getattr(torch, decorator)()
        def double(x):
            return x * 2

        class Model(torch.nn.Module):
            def forward(self, x):
                return double(x) + 1

        x = torch.ones(2, requires_grad=True)
        with torch.no_grad() if decorator == "enable_grad" else torch.enable_grad():
            expected = Model()(x)
            out = torch.export.export(Model(), (x,)).module()(x)
        self.assertEqual(out, expected)
        self.assertEqual(out.requires_grad, expected.requires_grad)


instantiate_parametrized_tests(TestGradModeDecoratedCalls)


if __name__ == "__main__":
    run_tests()
