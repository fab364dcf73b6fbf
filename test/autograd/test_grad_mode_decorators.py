# Owner(s): ["module: autograd"]
"""How the grad-mode context managers set the mode, and what they accept."""

from unittest import mock

import torch
from torch.autograd.grad_mode import set_grad_enabled, set_multithreading_enabled
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    skipIfTorchDynamo,
    TestCase,
)


@skipIfTorchDynamo("checks which Python objects the eager context managers build")
class TestGradModeDecorators(TestCase):
    def setUp(self):
        super().setUp()
        # The guard's exit restores the whole autograd state of the thread,
        # should a failing test leave a setting switched.
        guard = torch._C._InferenceMode(torch.is_inference_mode_enabled())
        guard.__enter__()
        self.addCleanup(guard.__exit__, None, None, None)

    @parametrize("usage", ["with", "decorated"])
    def test_no_grad_sets_the_mode_without_set_grad_enabled(self, usage):
        made = []
        init = set_grad_enabled.__init__

        def counted_init(self, mode):
            made.append(mode)
            init(self, mode)

        def grad_mode_inside():
            return torch.is_grad_enabled()

        with mock.patch.object(set_grad_enabled, "__init__", counted_init):
            if usage == "with":
                with torch.no_grad():
                    inside = grad_mode_inside()
            else:
                inside = torch.no_grad()(grad_mode_inside)()
            after = torch.is_grad_enabled()
            self.assertEqual(made, [])
            # The control: the patched __init__ does count a construction.
            torch.set_grad_enabled(True)
            self.assertEqual(made, [True])
        self.assertEqual((inside, after), (False, True))

    def test_set_multithreading_enabled_decorator_leaves_the_setting_alone(self):
        @set_multithreading_enabled(False)
        def setting_inside():
            return torch._C._is_multithreading_enabled()

        self.assertTrue(torch._C._is_multithreading_enabled())
        self.assertFalse(setting_inside())
        self.assertTrue(torch._C._is_multithreading_enabled())
        # As a function, it still switches the setting when made.
        set_multithreading_enabled(False)
        self.assertFalse(torch._C._is_multithreading_enabled())

    @parametrize("mode", [0, None, "off"], name_fn=lambda mode: type(mode).__name__)
    def test_inference_mode_rejects_a_mode_that_is_not_bool(self, mode):
        with self.assertRaisesRegex(TypeError, "mode must be bool"):
            torch.inference_mode(mode)
        self.assertFalse(torch.is_inference_mode_enabled())


instantiate_parametrized_tests(TestGradModeDecorators)


if __name__ == "__main__":
    run_tests()
