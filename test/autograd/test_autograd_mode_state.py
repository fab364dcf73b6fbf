# Owner(s): ["module: autograd"]
"""The binding that captures and installs a thread's autograd mode state, and
generators decorated with inference_mode, which carry it.

``torch._C._get_autograd_mode_state()`` captures the calling thread's state;
``torch._C._swap_autograd_mode_state(state)`` installs one and returns the
state it replaced.  A captured state restores the thread's autograd flags and
its whole local dispatch key set.  The state returned by installing a captured
one is a body's: it carries only the key bits it changed itself, unless its
inference mode differs from the thread it is installed in.  The caller's state
returned by installing a body's gives back only the bits inference mode
toggles: the others are the thread's while a body steps.
``torch._C._swap_grad_enabled(enabled)`` sets grad mode and returns the
previous mode: the grad-mode decorators' swap.
"""

import contextlib
import gc
import os
import subprocess
import sys
import textwrap
import threading
import weakref

import torch
import torch.autograd.forward_ad as fwAD
from torch._C import DispatchKey, DispatchKeySet
from torch.autograd.grad_mode import (
    _force_original_view_tracking,
    enforce_grad_layout_policy,
    set_multithreading_enabled,
)
from torch.fx.experimental.proxy_tensor import make_fx
from torch.overrides import TorchFunctionMode
from torch.testing._internal.common_utils import (
    instantiate_parametrized_tests,
    parametrize,
    run_tests,
    skipIfTorchDynamo,
    TestCase,
)
from torch.utils.checkpoint import GraphExecGroup


# Where a decorated generator may be stepped under tracing.
TRACERS = ("compile", "compile_fullgraph", "export_strict", "export", "make_fx")


def trace(run, x, tracer):
    """``run(x)``, *run* traced by *tracer* from ``TRACERS``."""
    if tracer.startswith("compile"):
        torch._dynamo.reset()
        return torch.compile(run, backend="eager", fullgraph=tracer != "compile")(x)
    if tracer == "make_fx":
        return make_fx(run, pre_dispatch=True)(x)(x)

    class Module(torch.nn.Module):
        def forward(self, x):
            return run(x)

    strict = tracer == "export_strict"
    return torch.export.export(Module(), (x,), strict=strict).module()(x)


def outputs(tensors):
    """What a step computed: each tensor's value, dtype, grad requirement and inference flag."""
    return [(t.tolist(), t.dtype, t.requires_grad, t.is_inference()) for t in tensors]


def capture():
    return torch._C._get_autograd_mode_state()


def swap(state):
    return torch._C._swap_autograd_mode_state(state)


_STATE_QUERIES = (
    torch.is_grad_enabled,
    torch.is_inference_mode_enabled,
    torch._C._is_fwd_grad_enabled,
    torch._C._is_multithreading_enabled,
    torch._C._is_view_replay_enabled,
    torch._C._is_grad_layout_enforcement_enabled,
    torch._C._get_graph_exec_group,
    torch._C._dispatch_tls_local_include_set,
    torch._C._dispatch_tls_local_exclude_set,
)


def autograd_state():
    # A key set's raw bits: its repr leaves out the backend bits.
    values = (query() for query in _STATE_QUERIES)
    return tuple(
        v.raw_repr() if isinstance(v, DispatchKeySet) else repr(v) for v in values
    )


def excluding(*keys):
    keyset = DispatchKeySet(keys[0])
    for key in keys[1:]:
        keyset = keyset | DispatchKeySet(key)
    return torch._C._ExcludeDispatchKeyGuard(keyset)


def is_excluded(key):
    return torch._C._dispatch_tls_local_exclude_set().has(key)


# Contexts that each change one part of the state.
CHANGES = {
    "grad_mode": torch.no_grad,
    "inference_mode": torch.inference_mode,
    "fwd_grad": lambda: fwAD._set_fwd_grad_enabled(False),
    "multithreading": lambda: set_multithreading_enabled(False),
    "view_replay": lambda: _force_original_view_tracking(True),
    "grad_layout": lambda: enforce_grad_layout_policy(False),
    "graph_exec_group": GraphExecGroup,
    "autograd_key_excluded": lambda: excluding(DispatchKey.AutogradOther),
}


@contextlib.contextmanager
def all_changes():
    with contextlib.ExitStack() as stack:
        for change in CHANGES.values():
            stack.enter_context(change())
        yield


@skipIfTorchDynamo("switches the thread's autograd state under the tracer")
class TestGradModeAutogradModeState(TestCase):
    def setUp(self):
        super().setUp()
        # The guard's exit restores the thread's autograd state and local
        # dispatch key sets, should a failing test leave them changed.
        guard = torch._C._InferenceMode(torch.is_inference_mode_enabled())
        guard.__enter__()
        self.addCleanup(guard.__exit__, None, None, None)

    def test_captured_state_round_trip(self):
        changes = dict(CHANGES, everything=all_changes)
        for name, change in changes.items():
            with self.subTest(change=name):
                outside = autograd_state()
                saved = capture()
                self.assertIsInstance(saved, torch._C._AutogradModeState)
                with change():
                    inside = autograd_state()
                    self.assertNotEqual(inside, outside)
                    replaced = swap(saved)
                    self.assertEqual(autograd_state(), outside)
                    swap(replaced)
                    self.assertEqual(autograd_state(), inside)
                    saved_inside = capture()
                self.assertEqual(autograd_state(), outside)
                replaced = swap(saved_inside)
                self.assertEqual(autograd_state(), inside)
                swap(replaced)
                self.assertEqual(autograd_state(), outside)

    def test_swap_without_change_is_a_no_op(self):
        with torch.inference_mode(), set_multithreading_enabled(False):
            before = autograd_state()
            body = swap(capture())
            self.assertEqual(autograd_state(), before)
            swap(swap(body))
            self.assertEqual(autograd_state(), before)

    def test_other_dispatch_key_bits_are_the_threads(self):
        # Bits inference mode never toggles belong to the thread while a body steps.
        other = (DispatchKey.Python, DispatchKey.ADInplaceOrView)
        body = swap(capture())
        with excluding(*other):
            caller = swap(body)
            self.assertTrue(all(is_excluded(key) for key in other))
            body = swap(caller)
            self.assertTrue(all(is_excluded(key) for key in other))
        caller = swap(body)
        self.assertFalse(any(is_excluded(key) for key in other))
        swap(caller)

    def test_captured_state_restores_the_whole_key_set(self):
        # What a body's end needs: the guard's exit restores its first step's key set.
        before = autograd_state()
        saved = capture()
        with excluding(DispatchKey.Python, DispatchKey.ADInplaceOrView):
            swap(saved)
            self.assertEqual(autograd_state(), before)

    def test_caller_gets_its_backend_bits_back(self):
        # A body excluding one backend's autograd key sets a backend bit every
        # per-backend key of the set shares: the caller must not keep it.
        caller = capture()
        before = autograd_state()
        with excluding(DispatchKey.AutogradCPU):
            body = swap(caller)
            self.assertEqual(autograd_state(), before)
            with excluding(DispatchKey.AutogradCUDA):
                self.assertFalse(is_excluded(DispatchKey.AutogradCPU))
            caller = swap(body)
            self.assertTrue(is_excluded(DispatchKey.AutogradCPU))
        self.assertEqual(autograd_state(), before)

    def test_body_state_carries_only_the_bits_it_changed(self):
        caller = capture()
        with excluding(DispatchKey.AutogradOther), torch.no_grad():
            body = swap(caller)
        with excluding(DispatchKey.AutogradNestedTensor):
            before = autograd_state()
            resumed = swap(body)
            self.assertFalse(torch.is_grad_enabled())
            # The body's bit, and the thread's bit the body never changed.
            self.assertTrue(is_excluded(DispatchKey.AutogradOther))
            self.assertTrue(is_excluded(DispatchKey.AutogradNestedTensor))
            swap(resumed)
            self.assertEqual(autograd_state(), before)

    def test_body_keeps_the_bits_it_changed_in_earlier_steps(self):
        caller = capture()
        body = swap(caller)  # a first step that changes nothing: no bits owned
        caller = swap(body)
        with excluding(DispatchKey.AutogradOther):  # a step that changes one
            body = swap(caller)
        self.assertFalse(is_excluded(DispatchKey.AutogradOther))
        caller = swap(body)
        body = swap(caller)  # a step that changes nothing
        with excluding(DispatchKey.AutogradNestedTensor):
            caller = swap(body)
            self.assertTrue(is_excluded(DispatchKey.AutogradOther))
            self.assertTrue(is_excluded(DispatchKey.AutogradNestedTensor))
            body = swap(caller)
        caller = swap(body)
        self.assertTrue(is_excluded(DispatchKey.AutogradOther))
        self.assertFalse(is_excluded(DispatchKey.AutogradNestedTensor))
        swap(caller)
        self.assertFalse(is_excluded(DispatchKey.AutogradOther))

    def test_body_started_below_autograd_does_not_carry_the_exclusion(self):
        with excluding(DispatchKey.AutogradOther):
            caller = capture()
            with torch.no_grad():
                body = swap(caller)
        before = autograd_state()
        caller = swap(body)
        self.assertFalse(torch.is_grad_enabled())
        self.assertFalse(is_excluded(DispatchKey.AutogradOther))
        swap(caller)
        self.assertEqual(autograd_state(), before)

    def test_body_in_another_inference_mode_takes_all_the_bits(self):
        for mode in (True, False):
            with self.subTest(inference_mode=mode):
                with torch.inference_mode(not mode):
                    caller = capture()
                    with torch.inference_mode(mode):
                        inside = autograd_state()
                        body = swap(caller)
                    # The thread changed a bit the body never touched.
                    with excluding(DispatchKey.AutogradNestedTensor):
                        before = autograd_state()
                        caller = swap(body)
                        self.assertEqual(autograd_state(), inside)
                        body = swap(caller)
                        self.assertEqual(autograd_state(), before)

    def test_state_in_another_thread(self):
        with torch.inference_mode(), set_multithreading_enabled(False):
            inside = autograd_state()
            saved = capture()
        seen = []

        def worker():
            before = autograd_state()
            replaced = swap(saved)
            seen.append(autograd_state())
            swap(replaced)
            seen.append(autograd_state() == before)

        outside = autograd_state()
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
        self.assertEqual(seen, [inside, True])
        self.assertEqual(autograd_state(), outside)

    def test_state_keeps_its_graph_exec_group_alive_and_collectable(self):
        with GraphExecGroup() as group:
            saved = capture()
        group.saved = saved  # a cycle through the state
        ref = weakref.ref(group)
        del group
        gc.collect()
        self.assertIsNotNone(ref())
        replaced = swap(saved)
        self.assertIs(torch._C._get_graph_exec_group(), ref())
        swap(replaced)
        self.assertIsNone(torch._C._get_graph_exec_group())
        del saved, replaced
        gc.collect()
        self.assertIsNone(ref())

    def test_states_are_equal_where_a_swap_installs_them_alike(self):
        outside = capture()
        self.assertTrue(outside == capture())
        self.assertFalse(outside != capture())
        self.assertNotEqual(outside, outside.__class__)
        for name, change in CHANGES.items():
            with self.subTest(change=name), change():
                self.assertNotEqual(capture(), outside)
        # Key bits inference mode does not toggle are not a state's.
        with excluding(DispatchKey.Python):
            self.assertEqual(capture(), outside)

    def test_bad_arguments_raise_type_error(self):
        before = autograd_state()
        for bad in (None, 1, object(), torch.no_grad()):
            with self.subTest(argument=type(bad).__name__):
                with self.assertRaisesRegex(TypeError, "expected a state"):
                    swap(bad)
                self.assertEqual(autograd_state(), before)
        with self.assertRaises(TypeError):
            torch._C._get_autograd_mode_state(capture())
        with self.assertRaises(TypeError):
            torch._C._swap_autograd_mode_state()
        with self.assertRaises(TypeError):
            torch._C._AutogradModeState()

    def test_swap_grad_enabled_sets_grad_mode_and_returns_the_previous(self):
        with torch.inference_mode(), set_multithreading_enabled(False):
            for enabled in (False, True):
                grad, before = torch.is_grad_enabled(), autograd_state()
                with self.subTest(enabled=enabled):
                    self.assertIs(torch._C._swap_grad_enabled(enabled), grad)
                    # Grad mode (the first item) changed, and nothing else.
                    self.assertEqual(autograd_state(), (repr(enabled), *before[1:]))
                    self.assertIs(torch._C._swap_grad_enabled(grad), enabled)
                    self.assertEqual(autograd_state(), before)
        for bad in (None, 1, "True"):
            with self.subTest(argument=type(bad).__name__):
                with self.assertRaisesRegex(TypeError, "expected a bool"):
                    torch._C._swap_grad_enabled(bad)

    def test_swap_grad_enabled_goes_through_torch_function_modes(self):
        # As the decorators' per-step _set_grad_enabled calls did (torch 2.13.0).
        class Record(TorchFunctionMode):
            def __init__(self):
                super().__init__()
                self.calls = []

            def __torch_function__(self, func, types, args=(), kwargs=None):
                self.calls.append((func, args))
                return func(*args, **(kwargs or {}))

        @torch.no_grad()
        def body():
            while True:
                yield torch.is_grad_enabled()

        gen = body()
        next(gen)  # the first step outside the mode
        before = autograd_state()
        with Record() as mode:
            self.assertIs(next(gen), False)
            self.assertEqual(autograd_state(), before)
        set_grad = torch._C._set_grad_enabled
        self.assertEqual(mode.calls, [(set_grad, (False,)), (set_grad, (True,))])

    def test_export_records_the_grad_mode_of_a_body_started_eagerly(self):
        @torch.no_grad()
        def scale(w):
            while True:
                x = yield
                yield x * w

        gen = scale(torch.tensor(3.0))
        next(gen)

        class Module(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.p = torch.nn.Parameter(torch.tensor(2.0))

            def forward(self, x):
                y = gen.send(x * self.p)
                next(gen)
                return y

        exported = torch.export.export(Module(), (torch.tensor(1.0),))
        self.assertIn("wrap_with_set_grad_enabled", exported.graph_module.code)
        out = exported.module()(torch.tensor(1.0))
        self.assertEqual(out, torch.tensor(6.0))
        self.assertFalse(out.requires_grad)

    def test_export_records_the_own_block_of_a_body_started_eagerly(self):
        # Export's tracer records grad mode's swaps: a body that carries a
        # block of its own is traced in it, and goes on eagerly afterwards.
        @torch.no_grad()
        def gen(x):
            with torch.enable_grad():
                yield x * 2
                yield x * 3
            yield x * 4

        x = torch.ones(2, requires_grad=True)
        g = gen(x)
        self.assertTrue(next(g).requires_grad)
        with torch.no_grad():
            before = autograd_state()
            step = make_fx(lambda x: next(g), pre_dispatch=True)(x)
            self.assertEqual(autograd_state(), before)
            self.assertTrue(step(x).requires_grad)
        self.assertFalse(next(g).requires_grad)


# inference_mode's block sets all of the state, so its bodies carry all of it.
INFERENCE_DECORATORS = {
    "inference_mode": torch.inference_mode,
    "inference_mode_False": lambda: torch.inference_mode(False),
}


@skipIfTorchDynamo("checks thread state around eagerly stepped generators")
class TestGradModeSuspendInferenceMode(TestCase):
    def setUp(self):
        super().setUp()
        guard = torch._C._InferenceMode(torch.is_inference_mode_enabled())
        guard.__enter__()
        self.addCleanup(guard.__exit__, None, None, None)

    def step_in_each_caller_state(self, body):
        """Step *body* from each change of CHANGES in turn; return what it saw."""
        seen = []
        for change in CHANGES.values():
            with change():
                before = autograd_state()
                seen.append(next(body))
                self.assertEqual(autograd_state(), before)
        return seen

    @parametrize("decorator", INFERENCE_DECORATORS)
    def test_body_keeps_its_own_blocks_and_none_of_its_callers(self, decorator):
        def gen():
            with torch.no_grad(), set_multithreading_enabled(False):
                inside = autograd_state()
                while True:
                    yield autograd_state() == inside

        body = INFERENCE_DECORATORS[decorator]()(gen)()
        self.assertEqual(self.step_in_each_caller_state(body), [True] * len(CHANGES))
        body.close()

    @parametrize("decorator", INFERENCE_DECORATORS)
    def test_body_starts_from_the_callers_state_in_the_decorators_mode(self, decorator):
        def gen():
            yield autograd_state()

        with set_multithreading_enabled(False):
            with INFERENCE_DECORATORS[decorator]():
                expected = autograd_state()
            self.assertEqual(next(INFERENCE_DECORATORS[decorator]()(gen)()), expected)

    @parametrize("decorator", INFERENCE_DECORATORS)
    def test_caller_gets_its_whole_state_back(self, decorator):
        def gen():
            with contextlib.ExitStack() as stack:
                for change in CHANGES.values():
                    stack.enter_context(change())
                    yield
                torch._C._set_grad_enabled(not torch.is_grad_enabled())
                while True:
                    yield

        body = INFERENCE_DECORATORS[decorator]()(gen)()
        self.step_in_each_caller_state(body)
        self.step_in_each_caller_state(body)
        body.close()

    @parametrize("decorator", INFERENCE_DECORATORS)
    @parametrize("end", ["exhausted", "closed", "thrown_into"])
    def test_body_that_ends_leaves_the_callers_other_key_bits(self, decorator, end):
        # The guard's exit restores the whole key set of the body's first step.
        def gen():
            yield
            yield

        body = INFERENCE_DECORATORS[decorator]()(gen)()
        next(body)
        with torch.autocast("cpu"), excluding(DispatchKey.Python):
            before = autograd_state()
            if end == "exhausted":
                next(body)
                self.assertIsNone(next(body, None))
            elif end == "closed":
                body.close()
            else:
                self.assertRaises(ValueError, body.throw, ValueError("end"))
            self.assertEqual(autograd_state(), before)
            self.assertTrue(torch.is_autocast_enabled("cpu"))

    def test_inference_mode_false_body_key_guard_does_not_leak(self):
        autograd_cpu = DispatchKeySet(DispatchKey.AutogradCPU)

        @torch.inference_mode(False)
        def body():
            with torch._C._ExcludeDispatchKeyGuard(autograd_cpu):
                yield
                yield

        x = torch.ones(1, requires_grad=True)
        before = autograd_state()
        gen = body()
        for _ in range(2):
            next(gen)
            self.assertEqual(autograd_state(), before)
            self.assertIsNotNone((x * 2).grad_fn)
        gen.close()
        self.assertEqual(autograd_state(), before)


@skipIfTorchDynamo("traces the generators itself")
class TestGradModeSuspendInferenceModeTraced(TestCase):
    """Traced, an inference_mode generator computes as eagerly or tracing fails."""

    @staticmethod
    def steps(shape):
        """Three steps of an ``inference_mode`` generator: *shape* is ``plain``, ``own_block`` or ``caller_changes``."""

        @torch.inference_mode()
        def gen(x):
            yield x * 2
            own = shape == "own_block"
            with torch.inference_mode(False) if own else contextlib.nullcontext():
                yield x * 3
                yield x * 4

        def run(x):
            g = gen(x)
            caller = shape == "caller_changes"
            with torch.no_grad() if caller else contextlib.nullcontext():
                first = next(g)
            with torch.inference_mode(False) if caller else contextlib.nullcontext():
                second = next(g)
            return first, second, next(g)

        return run

    @parametrize("shape", ["plain", "own_block", "caller_changes"])
    @parametrize("tracer", TRACERS)
    def test_traced_generator(self, shape, tracer):
        run, x = self.steps(shape), torch.ones(2, requires_grad=True)
        if tracer in ("compile_fullgraph", "export_strict"):
            # Dynamo cannot read inference mode, to check a step.
            with self.assertRaisesRegex(Exception, "cannot read inference mode"):
                trace(run, x, tracer)
        elif tracer != "compile":
            # Export's tracer drops inference mode from the graph, of any block.
            with self.assertRaisesRegex(RuntimeError, "does not record inference mode"):
                trace(run, x, tracer)
        else:  # run eagerly
            self.assertEqual(outputs(trace(run, x, tracer)), outputs(run(x)))

    def test_body_finalised_at_exit_under_a_mode(self):
        # Finalised at interpreter exit, under a torch function mode (the
        # default device's), a step's check imports nothing: imports fail then.
        script = textwrap.dedent(
            """
            import torch

            torch.set_default_device("cpu")

            @torch.inference_mode()
            def gen():
                yield
                yield

            body = gen()
            next(body)
            """
        )
        here = os.path.dirname(os.path.abspath(__file__))
        result = subprocess.run(
            [sys.executable, "-c", script], cwd=here, capture_output=True, text=True
        )
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertNotIn("Exception ignored", result.stderr)

    @parametrize("own_block", [False, True])
    def test_started_eagerly_then_exported(self, own_block):
        # Refused, the body is closed in its own state: the caller keeps its own.
        ends = []

        @torch.inference_mode()
        def gen(x):
            try:
                with torch.inference_mode(not own_block):
                    yield x * 2
                    yield x * 3
            finally:
                ends.append(torch.is_inference_mode_enabled())

        x = torch.ones(2, requires_grad=True)
        g = gen(x)
        self.assertEqual(next(g).is_inference(), not own_block)
        before = autograd_state()
        message = "of its own" if own_block else "does not record inference mode"
        with self.assertRaisesRegex(RuntimeError, message):
            make_fx(lambda x: next(g), pre_dispatch=True)(x)
        self.assertEqual(autograd_state(), before)
        self.assertEqual(ends, [True])


instantiate_parametrized_tests(TestGradModeSuspendInferenceMode)
instantiate_parametrized_tests(TestGradModeSuspendInferenceModeTraced)


if __name__ == "__main__":
    run_tests()
