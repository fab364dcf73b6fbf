# Owner(s): ["module: autograd"]
"""The ``TGM`` flake8 plugin (``lint/flake8_torch_gradmode.py``).

The checker class is run directly on source snippets; real ``flake8`` is run in
a subprocess with the plugin registered through its ``flake8.extension`` entry
point, as ``pip install -e .`` installs it.
"""

import ast
import os
import subprocess
import sys
import tempfile
import textwrap

from torch.testing._internal.common_utils import run_tests, TestCase


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINT_DIR = os.path.join(REPO, "lint")
EXAMPLES_DIR = os.path.join(REPO, "examples")
sys.path.insert(0, LINT_DIR)

from flake8_torch_gradmode import GradModeChecker  # noqa: E402


def check(source):
    """[(line, col, code)] the checker reports for *source*."""
    tree = ast.parse(textwrap.dedent(source))
    return [(line, col, msg.split()[0]) for line, col, msg, _ in GradModeChecker(tree).run()]


def messages(source):
    return [msg for _, _, msg, _ in GradModeChecker(ast.parse(textwrap.dedent(source))).run()]


class TestTruePositives(TestCase):
    def test_yield_in_no_grad(self):
        src = """
            import torch
            def gen():
                with torch.no_grad():
                    yield 1
        """
        self.assertEqual(check(src), [(5, 8, "TGM001")])
        self.assertEqual(messages(src), [
            "TGM001 yield inside 'with torch.no_grad()': the mode leaks to the caller while the "
            "generator is suspended; decorate the function with @torch.no_grad() instead"
        ])

    def test_each_mode_and_spelling(self):
        for item, suggest in [
            ("torch.no_grad()", "torch.no_grad()"),
            ("torch.enable_grad()", "torch.enable_grad()"),
            ("torch.set_grad_enabled(False)", "torch.set_grad_enabled(False)"),
            ("torch.set_grad_enabled(mode=flag)", "torch.set_grad_enabled(mode=flag)"),
            ("torch.inference_mode()", "torch.inference_mode()"),
            ("torch.inference_mode(False)", "torch.inference_mode(False)"),
            ("torch.autograd.no_grad()", "torch.no_grad()"),
            ("torch.autograd.grad_mode.no_grad()", "torch.no_grad()"),
            ("torch.autograd.grad_mode.inference_mode()", "torch.inference_mode()"),
        ]:
            with self.subTest(item=item):
                src = f"import torch\ndef gen(flag):\n    with {item}:\n        yield 1\n"
                msgs = messages(src)
                self.assertEqual(len(msgs), 1)
                self.assertIn(f"'with {item}'", msgs[0])
                self.assertIn(f"@{suggest} instead", msgs[0])

    def test_yield_from_and_yield_expression(self):
        src = """
            import torch
            def gen(it):
                with torch.no_grad():
                    x = yield
                    yield from it
        """
        self.assertEqual(check(src), [(5, 12, "TGM001"), (6, 8, "TGM001")])
        self.assertTrue(messages(src)[1].startswith("TGM001 yield from inside"))

    def test_async_suspension_points(self):
        src = """
            import torch
            async def f(q, cm):
                with torch.inference_mode():
                    await q
                    async for x in q:
                        pass
                    async with cm:
                        pass
        """
        self.assertEqual(check(src), [(5, 8, "TGM002"), (6, 8, "TGM002"), (8, 8, "TGM002")])
        whats = [m.split(" inside")[0] for m in messages(src)]
        self.assertEqual(whats, ["TGM002 await", "TGM002 async for", "TGM002 async with"])
        self.assertIn("leaks to other tasks on the event loop", messages(src)[0])

    def test_async_with_grad_mode_item(self):
        src = """
            import torch
            async def f(q):
                async with torch.no_grad():
                    await q
        """
        self.assertEqual(check(src), [(5, 8, "TGM002")])

    def test_nested_blocks_report_innermost_once(self):
        src = """
            import torch
            def gen():
                with torch.no_grad():
                    with torch.enable_grad():
                        yield 1
                    yield 2
        """
        msgs = messages(src)
        self.assertEqual(len(msgs), 2)
        self.assertIn("'with torch.enable_grad()'", msgs[0])
        self.assertIn("'with torch.no_grad()'", msgs[1])

    def test_inside_other_statements_in_block(self):
        src = """
            import torch
            def gen(xs):
                with torch.no_grad():
                    for x in xs:
                        if x:
                            try:
                                yield x
                            finally:
                                pass
        """
        self.assertEqual(check(src), [(8, 20, "TGM001")])

    def test_later_with_items_are_inside(self):
        src = """
            import torch
            async def f(q):
                with torch.no_grad(), (await q):
                    pass
        """
        self.assertEqual(check(src), [(4, 27, "TGM002")])

    def test_await_in_comprehension_suspends_outer(self):
        src = """
            import torch
            async def f(q):
                with torch.no_grad():
                    a = [await x for x in q]
                    b = {x async for x in q}
                    c = {k: await v for k, v in q}
        """
        self.assertEqual([c for _, _, c in check(src)], ["TGM002"] * 3)

    def test_generator_expression_first_iterable_is_in_place(self):
        src = """
            import torch
            async def f(q):
                with torch.no_grad():
                    g = (x for x in await q)
        """
        self.assertEqual(check(src), [(5, 24, "TGM002")])

    def test_nested_function_defaults_and_decorators_are_in_place(self):
        src = """
            import torch
            async def f(q):
                with torch.no_grad():
                    @(await q)
                    def inner(a=(await q)):
                        pass
                    g = lambda b=(await q): b
        """
        self.assertEqual([c for _, _, c in check(src)], ["TGM002"] * 3)

    def test_undecorated_inner_function_in_decorated_one(self):
        src = """
            import torch
            @torch.no_grad()
            def outer():
                def inner():
                    with torch.enable_grad():
                        yield 1
                return inner
        """
        self.assertEqual(check(src), [(7, 12, "TGM001")])


class TestFalsePositives(TestCase):
    def test_nested_def_lambda_class(self):
        src = """
            import torch
            async def f():
                with torch.no_grad():
                    def g():
                        yield 1
                    async def h(q):
                        await q
                    k = lambda: (yield)
                    class C:
                        def m(self):
                            yield 2
                        async def n(self, q):
                            await q
                return g, h, k, C
        """
        self.assertEqual(check(src), [])

    def test_generator_expressions(self):
        src = """
            import torch
            async def f(q):
                with torch.no_grad():
                    g = (await x for x in q)
                    h = (y async for y in q)
                    return g, h
        """
        self.assertEqual(check(src), [])

    def test_plain_comprehensions(self):
        src = """
            import torch
            def f(q):
                with torch.no_grad():
                    return [x for x in q], {x: x for x in q}
        """
        self.assertEqual(check(src), [])

    def test_other_context_managers(self):
        src = """
            import contextlib
            import torch
            def gen(lock):
                with open("f") as fh, lock:
                    yield fh
                with contextlib.suppress(KeyError):
                    yield 1
                with torch.autograd.profiler.profile():
                    yield 2
                with torch.autograd.forward_ad.dual_level():
                    yield 3
                with torch.no_grad:  # not a call: not a grad-mode block
                    yield 4
        """
        self.assertEqual(check(src), [])

    def test_grad_mode_call_arguments_are_outside(self):
        src = """
            import torch
            async def f(q):
                with torch.set_grad_enabled(await q):
                    pass
        """
        self.assertEqual(check(src), [])

    def test_suspension_after_block(self):
        src = """
            import torch
            def gen():
                with torch.no_grad():
                    x = 1
                yield x
        """
        self.assertEqual(check(src), [])

    def test_decorated_function_is_exempt(self):
        src = """
            import torch
            from torch import no_grad as ng
            @torch.no_grad()
            def a():
                with torch.enable_grad():
                    yield 1
            @torch.no_grad
            def b():
                with torch.enable_grad():
                    yield 1
            @torch.set_grad_enabled(False)
            async def c(q):
                with torch.inference_mode():
                    await q
            @ng()
            async def d(q):
                with torch.enable_grad():
                    yield await q
            class K:
                @staticmethod
                @torch.inference_mode()
                def e():
                    with torch.inference_mode(False):
                        yield 1
        """
        self.assertEqual(check(src), [])

    def test_unrelated_names(self):
        src = """
            import mylib
            from mylib import no_grad
            no_grad2 = None
            def gen():
                with no_grad():
                    yield 1
                with mylib.no_grad():
                    yield 2
                with torch.no_grad():  # torch never imported: an unknown name
                    yield 3
        """
        self.assertEqual(check(src), [])


class TestAliases(TestCase):
    def _one(self, imports, item):
        src = f"{imports}\ndef gen():\n    with {item}:\n        yield 1\n"
        return check(src)

    def test_resolved(self):
        for imports, item in [
            ("import torch as t", "t.no_grad()"),
            ("from torch import no_grad", "no_grad()"),
            ("from torch import no_grad as ng", "ng()"),
            ("from torch import enable_grad as eg", "eg()"),
            ("from torch import autograd", "autograd.set_grad_enabled(True)"),
            ("from torch import autograd as ag", "ag.grad_mode.no_grad()"),
            ("import torch.autograd", "torch.autograd.inference_mode()"),
            ("import torch.autograd as ag", "ag.no_grad()"),
            ("import torch.autograd.grad_mode as gm", "gm.enable_grad()"),
            ("from torch.autograd import grad_mode", "grad_mode.no_grad()"),
            ("from torch.autograd import no_grad as ang", "ang()"),
            ("from torch.autograd.grad_mode import inference_mode as im", "im()"),
            ("from torch import *", "no_grad()"),
            ("def f():\n    import torch as tt", "tt.no_grad()"),
        ]:
            with self.subTest(imports=imports, item=item):
                line = imports.count("\n") + 4
                self.assertEqual(self._one(imports, item), [(line, 8, "TGM001")])

    def test_not_resolved(self):
        for imports, item in [
            ("import torch as t", "torch.no_grad()"),
            ("from torch import nn", "nn.no_grad()"),
            ("from torch import no_grad as ng", "no_grad()"),
            ("from torch.utils import _contextlib", "_contextlib.no_grad()"),
            ("from .torch import no_grad", "no_grad()"),
            ("import torchvision as torch", "torch.no_grad()"),
        ]:
            with self.subTest(imports=imports, item=item):
                self.assertEqual(self._one(imports, item), [])

    def test_message_names_source_spelling_and_canonical_decorator(self):
        src = "from torch import set_grad_enabled as sge\ndef gen():\n    with sge(False):\n        yield\n"
        (msg,) = messages(src)
        self.assertIn("'with sge(False)'", msg)
        self.assertIn("@torch.set_grad_enabled(False) instead", msg)

    def test_checker_metadata(self):
        self.assertEqual(GradModeChecker.name, "flake8-torch-gradmode")
        self.assertTrue(GradModeChecker.version)
        tree = ast.parse("import torch\ndef g():\n    with torch.no_grad():\n        yield\n")
        (report,) = GradModeChecker(tree).run()
        self.assertEqual(report[:2], (4, 8))
        self.assertIs(report[3], GradModeChecker)


BAD_SOURCE = """\
import torch


def gen():
    with torch.no_grad():
        yield 1


async def coro(q):
    with torch.enable_grad():
        await q
"""


def _flake8(args, cwd=REPO):
    return subprocess.run(
        [sys.executable, "-m", "flake8", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


class TestFlake8Subprocess(TestCase):
    """Real flake8, in a subprocess, with the plugin as ``pip install -e .`` registers it."""

    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.bad = os.path.join(self.tmp.name, "bad.py")
        with open(self.bad, "w") as f:
            f.write(BAD_SOURCE)

    def test_plugin_is_registered(self):
        # flake8 lists entry-point plugins by their distribution's name (and
        # wraps its --version output, so compare without white space).
        self.assertIn("torch-gradmode-patch", "".join(_flake8(["--version"]).stdout.split()))

    def test_reports_and_noqa(self):
        r = _flake8(["--isolated", "--select", "TGM", self.bad])
        self.assertEqual(r.returncode, 1, r.stdout + r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(len(lines), 2, r.stdout)
        self.assertIn(":6:9: TGM001 yield inside 'with torch.no_grad()'", lines[0])
        self.assertIn(":11:9: TGM002 await inside 'with torch.enable_grad()'", lines[1])
        # noqa works as for any flake8 code.
        with open(self.bad, "w") as f:
            f.write(BAD_SOURCE.replace("yield 1", "yield 1  # noqa: TGM001"))
        r = _flake8(["--isolated", "--select", "TGM", self.bad])
        self.assertEqual(len(r.stdout.splitlines()), 1, r.stdout)

    def test_examples_are_clean(self):
        # The examples that keep a raw block open across an await on purpose
        # say so with ``# noqa: TGM002``; nothing else may be reported.
        r = _flake8(["--isolated", "--select", "TGM", EXAMPLES_DIR])
        self.assertEqual((r.returncode, r.stdout), (0, ""), r.stderr)


if __name__ == "__main__":
    run_tests()
