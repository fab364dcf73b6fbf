# Owner(s): ["module: autograd"]
"""Grad-mode decorators on functions that suspend: generators (here) and, in
``test_grad_mode_async.py``, coroutines and async generators.

The classes follow the contract clause by clause (see
docs/source/notes/grad_mode_suspend.rst):

* ``TestGradModeInstall`` -- these tests run against this checkout's modules;
* ``TestGradModeGenerators`` -- the cases of PR #49017, for every decorator;
* ``TestGradModeBodyContinuity`` -- the body keeps its own mode across ``yield``;
* ``TestGradModeCallerIsolation`` -- the caller's mode is the same after every step;
* ``TestGradModeGeneratorProtocol`` -- everything else about the function is unchanged;
* ``TestGradModeGeneratorProperty`` -- all of it at once, on random programs, against
  an oracle that runs the undecorated body on a thread of its own.
"""

import inspect
import os
import random
import subprocess
import sys
import traceback

import torch
from torch.testing._internal.common_utils import run_tests, TestCase

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from grad_mode_programs import (  # noqa: E402
    Boom,
    CALLER_SETUPS,
    DECORATORS,
    enter_all,
    generate_program,
    mode_state,
    run_oracle_generator,
    run_subject_generator,
    state_inside,
)

CHECKOUT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROPERTY_PROGRAMS = int(os.environ.get("GRAD_MODE_PROPERTY_PROGRAMS", "2000"))
PROPERTY_SEED = int(os.environ.get("GRAD_MODE_PROPERTY_SEED", "20261129"))


def decorators():
    """(name, decorator factory) for every grad-mode decorator and spelling."""
    return [(name, make) for name, make in DECORATORS]


class TestGradModeInstall(TestCase):
    def test_modules_come_from_this_checkout(self):
        import torch.autograd.grad_mode as grad_mode
        import torch.utils._contextlib as contextlib_mod

        for mod, rel in ((contextlib_mod, "torch/utils/_contextlib.py"),
                         (grad_mode, "torch/autograd/grad_mode.py")):
            self.assertEqual(os.path.realpath(mod.__file__), os.path.join(CHECKOUT, rel))

    def test_torch_lives_in_one_directory(self):
        # Dynamo decides what to trace by file location: our modules must sit
        # inside the directory that torch.__file__ names.
        import torch.utils._contextlib as contextlib_mod

        torch_dir = os.path.dirname(torch.__file__)
        self.assertTrue(contextlib_mod.__file__.startswith(torch_dir + os.sep))
        self.assertTrue(torch.autograd.grad_mode.__file__.startswith(torch_dir + os.sep))

    def test_overlay_switch_and_subprocesses(self):
        probe = "import os, torch.utils._contextlib as m; print(os.path.realpath(m.__file__))"
        ours = os.path.join(CHECKOUT, "torch", "utils", "_contextlib.py")
        on = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
        self.assertEqual(on.stdout.strip(), ours)
        env = dict(os.environ, TORCH_GRADMODE_OVERLAY="0")
        off = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                             check=True, env=env)
        self.assertNotEqual(off.stdout.strip(), ours)
        self.assertTrue(off.stdout.strip().endswith(os.path.join("torch", "utils", "_contextlib.py")))

    def test_binding_is_in_torch_C(self):
        # The hook registers the C++ half where upstream's torch._C defines it.
        self.assertTrue(callable(torch._C._swap_autograd_mode_state))
        self.assertIsInstance(torch._C._get_autograd_mode_state(), torch._C._AutogradModeState)
        with self.assertRaisesRegex(TypeError, "expected a state from _get_autograd_mode_state"):
            torch._C._swap_autograd_mode_state(True)

    def test_setup_without_compiler_says_so(self):
        env = dict(os.environ, CXX="/nonexistent/c++")
        done = subprocess.run([sys.executable, "setup.py", "build_ext"], cwd=CHECKOUT, env=env,
                              capture_output=True, text=True)
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("error: no C++ compiler ('/nonexistent/c++' not found)", done.stderr)

    def test_overlay_reaches_spawned_processes(self):
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(1) as pool:
            path = pool.apply(_contextlib_path)
        self.assertEqual(path, os.path.join(CHECKOUT, "torch", "utils", "_contextlib.py"))


class TestGradModeInstallRefusesOtherTorch(TestCase):
    """Another torch than 2.13.x: the install refuses, and the start-up hook stays off, saying why."""

    def setUp(self):
        import tempfile

        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        fake = os.path.join(self.tmp.name, "torch")
        os.mkdir(fake)
        with open(os.path.join(fake, "__init__.py"), "w") as f:
            f.write("")
        with open(os.path.join(fake, "version.py"), "w") as f:
            f.write("__version__ = '2.12.1+cpu'\n")
        # The fake torch comes first on the path; the overlay is off so that
        # its link tree does not shadow the fake.
        self.env = dict(os.environ, PYTHONPATH=self.tmp.name, TORCH_GRADMODE_OVERLAY="0")

    def test_setup_refuses(self):
        done = subprocess.run([sys.executable, "setup.py", "bdist_wheel"], cwd=CHECKOUT, env=self.env,
                              capture_output=True, text=True)
        self.assertNotEqual(done.returncode, 0)
        self.assertIn("supports torch 2.13.x only, but torch 2.12.1+cpu is installed", done.stderr)

    def test_startup_hook_stays_off(self):
        env = dict(self.env)
        del env["TORCH_GRADMODE_OVERLAY"]
        done = subprocess.run([sys.executable, "-c", "import torch, sys; print(torch.__file__)"], env=env,
                              capture_output=True, text=True, check=True)
        self.assertIn("overlay inactive", done.stderr)
        self.assertIn("supports torch 2.13.x only", done.stderr)
        self.assertEqual(done.stdout.strip(), os.path.join(self.tmp.name, "torch", "__init__.py"))


def _contextlib_path():
    import torch.utils._contextlib as m

    return os.path.realpath(m.__file__)


class TestGradModeGenerators(TestCase):
    """The cases of PR #49017, for every grad-mode decorator."""

    def test_generator_functions(self):
        for name, make in decorators():
            with self.subTest(name):
                expected = state_inside(make)

                @make()
                def gen(n):
                    for i in range(n):
                        yield i, mode_state()

                for caller_grad in (True, False):
                    with torch.set_grad_enabled(caller_grad):
                        for i, (value, seen) in enumerate(gen(3)):
                            self.assertEqual(value, i)
                            self.assertEqual(seen, expected)
                            self.assertEqual(torch.is_grad_enabled(), caller_grad)

    def test_generator_based_coroutines_with_send(self):
        for name, make in decorators():
            with self.subTest(name):
                expected = state_inside(make)

                @make()
                def coro():
                    total = 0
                    while True:
                        x = yield total, mode_state()
                        if x is None:
                            return total
                        total += x

                c = coro()
                self.assertEqual(next(c), (0, expected))
                for x in (1, 2, 3):
                    with torch.set_grad_enabled(x % 2 == 0):
                        before = mode_state()
                        total, seen = c.send(x)
                        self.assertEqual(mode_state(), before)
                    self.assertEqual(seen, expected)
                with self.assertRaises(StopIteration) as cm:
                    c.send(None)
                self.assertEqual(cm.exception.value, 6)

    def test_benign_exceptions(self):
        for name, make in decorators():
            with self.subTest(name):
                expected = state_inside(make)

                @make()
                def gen():
                    seen = []
                    while True:
                        try:
                            yield seen
                        except Boom:
                            seen.append(mode_state())

                g = gen()
                seen = next(g)
                for _ in range(3):
                    self.assertIs(g.throw(Boom()), seen)
                    self.assertEqual(torch.is_grad_enabled(), True)
                self.assertEqual(seen, [expected] * 3)

    def test_critical_exceptions(self):
        for name, make in decorators():
            for exc_type in (KeyboardInterrupt, SystemExit):
                with self.subTest(name=name, exc=exc_type.__name__):
                    expected = state_inside(make)
                    seen = []

                    @make()
                    def gen():
                        try:
                            yield 1
                        except exc_type:
                            seen.append(mode_state())
                            raise

                    g = gen()
                    next(g)
                    with self.assertRaises(exc_type):
                        g.throw(exc_type())
                    self.assertEqual(seen, [expected])
                    self.assertEqual(mode_state(), (True, False))

    def test_exit_and_close(self):
        for name, make in decorators():
            with self.subTest(name):
                expected = state_inside(make)
                seen = []

                @make()
                def gen():
                    try:
                        yield 1
                    except GeneratorExit:
                        seen.append(("exit", mode_state()))
                        raise
                    finally:
                        seen.append(("finally", mode_state()))

                g = gen()
                next(g)
                with torch.no_grad():
                    g.close()
                    self.assertFalse(torch.is_grad_enabled())
                self.assertEqual(seen, [("exit", expected), ("finally", expected)])


class TestGradModeBodyContinuity(TestCase):
    """A mode the body sets itself stays in force for it across its own ``yield``s."""

    def test_issue_example(self):
        @torch.no_grad()
        def gen():
            with torch.enable_grad():
                yield torch.is_grad_enabled()
                yield torch.is_grad_enabled()
            yield torch.is_grad_enabled()

        self.assertEqual(list(gen()), [True, True, False])

    def test_each_decorator_around_each_opposite_block(self):
        blocks = [
            ("enable_grad", torch.enable_grad),
            ("no_grad", torch.no_grad),
            ("set_grad_enabled(True)", lambda: torch.set_grad_enabled(True)),
            ("set_grad_enabled(False)", lambda: torch.set_grad_enabled(False)),
            ("inference_mode()", torch.inference_mode),
            ("inference_mode(False)", lambda: torch.inference_mode(False)),
        ]
        for dname, dmake in decorators():
            for bname, bmake in blocks:
                with self.subTest(decorator=dname, block=bname):
                    outside = state_inside(dmake)
                    inside = state_inside(dmake, bmake)

                    @dmake()
                    def gen():
                        with bmake():
                            yield mode_state()
                            yield mode_state()
                            yield mode_state()
                        yield mode_state()

                    out = []
                    for seen in gen():
                        out.append(seen)
                        self.assertEqual(mode_state(), (True, False))
                    self.assertEqual(out, [inside, inside, inside, outside])

    def test_set_grad_enabled_as_a_call_persists(self):
        @torch.no_grad()
        def gen():
            torch.set_grad_enabled(True)
            yield torch.is_grad_enabled()
            yield torch.is_grad_enabled()
            torch.set_grad_enabled(False)
            yield torch.is_grad_enabled()

        with torch.no_grad():
            self.assertEqual(list(gen()), [True, True, False])
            self.assertFalse(torch.is_grad_enabled())

    def test_graph_built_across_yields(self):
        # The practical point: a body that trains inside enable_grad across
        # yields records a usable graph on every step.
        w = torch.ones(2, requires_grad=True)

        @torch.no_grad()
        def gen():
            with torch.enable_grad():
                y = w * 2
                yield
                z = (y * 3).sum()
                yield
            z.backward()
            yield z.requires_grad

        self.assertEqual(list(gen())[-1], True)
        self.assertEqual(w.grad.tolist(), [6.0, 6.0])


class TestGradModeCallerIsolation(TestCase):
    """After every step the caller's mode is exactly what it was before it."""

    def test_open_inference_block_does_not_leak(self):
        @torch.no_grad()
        def gen():
            with torch.inference_mode():
                yield torch.is_inference_mode_enabled()
                yield torch.is_inference_mode_enabled()
            yield torch.is_inference_mode_enabled()

        g = gen()
        results = []
        for _ in range(3):
            results.append(next(g))
            self.assertEqual(mode_state(), (True, False))
            # Tensors made by the caller between steps are ordinary tensors.
            self.assertFalse(torch.ones(1).is_inference())
            x = torch.ones(1, requires_grad=True)
            (x * 2).sum().backward()
            self.assertEqual(x.grad.item(), 2.0)
        self.assertEqual(results, [True, True, False])

    def test_open_block_dropped_while_suspended(self):
        import gc

        @torch.no_grad()
        def gen():
            with torch.inference_mode():
                yield 1

        for caller in CALLER_SETUPS:
            with self.subTest(caller=caller[0]):
                with enter_all(caller[1]):
                    before = mode_state()
                    g = gen()
                    next(g)
                    self.assertEqual(mode_state(), before)
                    del g
                    gc.collect()
                    self.assertEqual(mode_state(), before)

    def test_caller_changes_between_steps_do_not_reach_body(self):
        @torch.enable_grad()
        def gen():
            while True:
                yield mode_state()

        g = gen()
        for caller in CALLER_SETUPS:
            with enter_all(caller[1]):
                before = mode_state()
                self.assertEqual(next(g), (True, False))
                self.assertEqual(mode_state(), before)

    def test_restored_when_step_raises_or_returns(self):
        @torch.inference_mode()
        def gen():
            torch.set_grad_enabled(True)
            yield 1
            raise Boom

        for caller in CALLER_SETUPS:
            with self.subTest(caller=caller[0]), enter_all(caller[1]):
                before = mode_state()
                g = gen()
                next(g)
                self.assertEqual(mode_state(), before)
                with self.assertRaises(Boom):
                    next(g)
                self.assertEqual(mode_state(), before)


class TestGradModeGeneratorProtocol(TestCase):
    """Everything but the mode is as for the undecorated generator."""

    def test_kind_and_metadata(self):
        def gen(a, b=2):
            """Doc."""
            yield a + b

        for name, make in decorators():
            with self.subTest(name):
                wrapped = make()(gen)
                self.assertTrue(inspect.isgeneratorfunction(wrapped))
                self.assertIs(wrapped.__wrapped__, gen)
                self.assertEqual(wrapped.__name__, "gen")
                self.assertEqual(wrapped.__doc__, "Doc.")
                self.assertEqual(inspect.signature(wrapped), inspect.signature(gen))
                self.assertEqual(list(wrapped(1)), [3])

    def test_return_value(self):
        @torch.no_grad()
        def gen():
            yield 1
            return "done"

        def outer():
            return (yield from gen())

        self.assertEqual(list(outer()), [1])
        g = outer()
        next(g)
        with self.assertRaises(StopIteration) as cm:
            next(g)
        self.assertEqual(cm.exception.value, "done")

    def test_pep479(self):
        @torch.no_grad()
        def gen():
            yield 1
            raise StopIteration("inner")

        g = gen()
        next(g)
        with self.assertRaisesRegex(RuntimeError, "generator raised StopIteration"):
            next(g)

    def test_throw_uses_one_argument_form(self):
        # A generator-like object whose throw() accepts only the exception:
        # the three-argument form (deprecated in Python 3.12) must never be used.
        class OneArgThrow:
            def __init__(self):
                self.thrown = []

            def __iter__(self):
                return self

            def __next__(self):
                return self.send(None)

            def send(self, value):
                return "sent"

            def throw(self, exc):
                self.thrown.append(exc)
                if isinstance(exc, GeneratorExit):
                    raise exc
                return "caught"

            def close(self):
                pass

        inner = OneArgThrow()
        g = torch.utils._contextlib._wrap_generator(torch.no_grad, lambda: inner)()
        self.assertEqual(next(g), "sent")
        err = Boom()
        self.assertEqual(g.throw(err), "caught")
        self.assertEqual(inner.thrown, [err])
        g.close()
        self.assertIsInstance(inner.thrown[-1], GeneratorExit)

    def test_traceback_shows_body_frame(self):
        @torch.no_grad()
        def body_with_a_distinctive_name():
            yield 1
            raise Boom("from the body")

        g = body_with_a_distinctive_name()
        next(g)
        try:
            next(g)
        except Boom as e:
            names = [f.name for f in traceback.extract_tb(e.__traceback__)]
        self.assertIn("body_with_a_distinctive_name", names)

    def test_thrown_exception_gets_no_foreign_context(self):
        def gen():
            try:
                yield 1
            except Boom:
                pass
            raise ValueError("after")

        for wrapped in (gen, torch.no_grad()(gen)):
            g = wrapped()
            next(g)
            with self.assertRaises(ValueError) as cm:
                g.throw(Boom())
            self.assertIsNone(cm.exception.__context__, wrapped)

    def test_generator_exit_ignored(self):
        @torch.no_grad()
        def gen():
            try:
                yield 1
            except GeneratorExit:
                yield 2

        g = gen()
        next(g)
        with self.assertRaisesRegex(RuntimeError, "ignored GeneratorExit"):
            g.close()
        self.assertEqual(mode_state(), (True, False))
        # As undecorated, the body stays suspended and can still be resumed.
        self.assertEqual(inspect.getgeneratorstate(g), inspect.GEN_SUSPENDED)
        with self.assertRaises(StopIteration):
            next(g)

    def test_nested_decorators(self):
        @torch.no_grad()
        @torch.enable_grad()
        def gen():
            yield mode_state()
            with torch.inference_mode():
                yield mode_state()

        with torch.no_grad():
            self.assertEqual(list(gen()), [(True, False), (False, True)])
            self.assertEqual(mode_state(), (False, False))

    def test_recursion_and_interleaving(self):
        @torch.no_grad()
        def walk(depth):
            yield depth, torch.is_grad_enabled()
            if depth:
                with torch.enable_grad():
                    yield from walk(depth - 1)

        self.assertEqual(list(walk(2)), [(2, False), (1, False), (0, False)])

        @torch.no_grad()
        def counter(tag):
            for i in range(3):
                with torch.enable_grad():
                    yield tag, i, torch.is_grad_enabled()
                yield tag, i, torch.is_grad_enabled()

        a, b = counter("a"), counter("b")
        got = [x for pair in zip(a, b) for x in pair]
        self.assertEqual([g for *_, g in got], [True, True, False, False] * 3)

    def test_stepping_re_entrantly_is_refused(self):
        holder = []

        @torch.no_grad()
        def gen():
            yield next(holder[0])

        g = gen()
        holder.append(g)
        with self.assertRaisesRegex(ValueError, "already executing"):
            next(g)
        self.assertEqual(mode_state(), (True, False))

    def test_methods_static_and_class(self):
        class Model:
            @torch.no_grad()
            def gen(self):
                yield torch.is_grad_enabled()

            @torch.no_grad()
            @staticmethod
            def static_gen():
                yield torch.is_grad_enabled()

            @torch.no_grad()
            @classmethod
            def class_gen(cls):
                yield cls, torch.is_grad_enabled()

        self.assertEqual(list(Model().gen()), [False])
        self.assertEqual(list(Model.static_gen()), [False])
        self.assertEqual(list(Model().static_gen()), [False])
        self.assertEqual(list(Model.class_gen()), [(Model, False)])
        self.assertTrue(inspect.isgeneratorfunction(Model.static_gen))

    def test_other_decorator_context_managers_reenter_each_step(self):
        # A subclass outside torch: a fresh clone is entered around every step,
        # as before, and the grad mode stays isolated from the caller.
        log = []

        class Tracing(torch.utils._contextlib._DecoratorContextManager):
            def __enter__(self):
                log.append("enter")

            def __exit__(self, *exc):
                log.append("exit")

        @Tracing()
        def gen():
            with torch.no_grad():
                yield torch.is_grad_enabled()
                yield torch.is_grad_enabled()

        self.assertEqual(list(gen()), [False, False])
        self.assertEqual(log, ["enter", "exit"] * 3)
        self.assertTrue(torch.is_grad_enabled())

    def test_forward_ad_dual_level_generator(self):
        import torch.autograd.forward_ad as fwAD

        @fwAD.dual_level()
        def gen():
            x = fwAD.make_dual(torch.ones(2), torch.full((2,), 2.0))
            yield fwAD.unpack_dual(x * 3).tangent.tolist()

        self.assertEqual(list(gen()), [[6.0, 6.0]])


class TestGradModeGeneratorProperty(TestCase):
    """Random bodies and drivers, decorated on this thread vs undecorated on a thread of their own."""

    def test_matches_oracle(self):
        rng = random.Random(PROPERTY_SEED)
        mismatches = []
        for index in range(PROPERTY_PROGRAMS):
            program = generate_program(rng)
            oracle = run_oracle_generator(program)
            subject = run_subject_generator(program)
            if oracle != subject:
                mismatches.append((index, program, oracle, subject))
                if len(mismatches) >= 3:
                    break
        if mismatches:
            index, program, oracle, subject = mismatches[0]
            self.fail(
                f"{len(mismatches)} mismatching program(s) (seed {PROPERTY_SEED}); first, #{index}:\n"
                f"{program.describe()}\noracle:  {oracle}\nsubject: {subject}"
            )


if __name__ == "__main__":
    run_tests()
