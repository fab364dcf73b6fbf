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

    def test_decorated_body_keeps_its_own_kind_of_block(self):
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
                with torch.no_grad():
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


def body(decorators, item, suspension="yield 1", imports="import torch"):
    """Source of a function under *decorators* that suspends inside ``with item:``, and that line's number."""
    head = "async def" if "await" in suspension else "def"
    lines = [imports, *decorators, f"{head} f(q):", f"    with {item}:", f"        {suspension}"]
    return "\n".join(lines) + "\n", imports.count("\n") + len(decorators) + 4


# (decorator, a block it does not carry), one or more of each kind of block.
UNCARRIED = [
    ("@torch.autocast('cpu')", "torch.no_grad()"),
    ("@torch.autograd.set_multithreading_enabled(False)", "torch.enable_grad()"),
    ("@torch.autograd.grad_mode.enforce_grad_layout_policy(False)", "torch.set_grad_enabled(False)"),
    ("@torch.no_grad()", "torch.autograd.set_multithreading_enabled(False)"),
    ("@torch.enable_grad()", "torch.autograd.grad_mode.enforce_grad_layout_policy(False)"),
    ("@torch.set_grad_enabled(True)", "torch.autograd.grad_mode._force_original_view_tracking(True)"),
    ("@torch.no_grad()", "torch.inference_mode()"),
    ("@torch.autograd.set_multithreading_enabled(False)", "torch.inference_mode(False)"),
    ("@torch.inference_mode()", "torch.autocast('cpu')"),
    ("@torch.no_grad()", "torch.cuda.amp.autocast()"),
    ("@torch.enable_grad()", "torch.cpu.amp.autocast()"),
    ("@torch.inference_mode()", "torch.amp.autocast(device_type='cuda')"),
]

# (decorator, a block it carries).
CARRIED = [
    ("@torch.no_grad()", "torch.enable_grad()"),
    ("@torch.enable_grad()", "torch.set_grad_enabled(False)"),
    ("@torch.set_grad_enabled(False)", "torch.no_grad()"),
    ("@torch.autograd.set_multithreading_enabled(False)", "torch.autograd.set_multithreading_enabled(True)"),
    ("@torch.autograd.grad_mode.enforce_grad_layout_policy(False)",
     "torch.autograd.enforce_grad_layout_policy(True)"),
    ("@torch.autograd._force_original_view_tracking(False)",
     "torch.autograd.grad_mode._force_original_view_tracking(True)"),
    ("@torch.inference_mode()", "torch.inference_mode(False)"),
    ("@torch.autocast('cpu')", "torch.autocast('cpu', dtype=torch.bfloat16)"),
    ("@torch.amp.autocast(device_type='cuda')", "torch.cuda.amp.autocast()"),
    ("@torch.cpu.amp.autocast()", "torch.autocast(device_type='cpu', enabled=False)"),
]


class TestDecoratedBodies(TestCase):
    """A decorated body keeps open across a suspension only the blocks its decorators carry."""

    def test_uncarried_block_across_yield(self):
        for decorator, item in UNCARRIED:
            with self.subTest(decorator=decorator, item=item):
                src, line = body([decorator], item)
                self.assertEqual(check(src), [(line, 8, "TGM003")])

    def test_uncarried_block_across_await(self):
        for decorator, item in UNCARRIED:
            with self.subTest(decorator=decorator, item=item):
                src, line = body([decorator], item, "await q")
                self.assertEqual(check(src), [(line, 8, "TGM004")])

    def test_carried_block(self):
        # The same body with a block of another kind is reported: the decorator
        # carries only what its own block sets.
        for decorator, item in CARRIED:
            with self.subTest(decorator=decorator, item=item):
                self.assertEqual(check(body([decorator], item)[0]), [])
                other = "torch.inference_mode()" if "autocast" in decorator else "torch.autocast('cpu')"
                src, line = body([decorator], other)
                self.assertEqual(check(src), [(line, 8, "TGM003")])

    def test_inference_mode_carries_the_autograd_state(self):
        src = """
            import torch
            @torch.inference_mode()
            async def f(q):
                with torch.no_grad():
                    await q
                with torch.enable_grad(), torch.set_grad_enabled(True):
                    yield 1
                with torch.autograd.set_multithreading_enabled(False):
                    await q
                with torch.autograd.grad_mode.enforce_grad_layout_policy(False):
                    yield 2
                with torch.autograd.grad_mode._force_original_view_tracking(True):
                    await q
                with torch.autocast("cpu"):
                    yield 3
        """
        self.assertEqual(check(src), [(16, 8, "TGM003")])

    def test_stacked_decorators_carry_the_union(self):
        src = """
            import functools
            import torch
            @functools.wraps(print)
            @torch.autocast("cpu")
            @torch.no_grad()
            def f():
                with torch.enable_grad(), torch.autocast("cpu"):
                    yield 1
                with torch.autocast("cuda"):
                    yield 2
                with torch.inference_mode():
                    yield 3
        """
        self.assertEqual(check(src), [(11, 8, "TGM003"), (13, 8, "TGM003")])
        self.assertIn("in a body decorated with @torch.autocast('cpu') and @torch.no_grad(), which carry only "
                      "grad mode and cpu autocast state:", messages(src)[0])

    def test_decorator_spellings_and_aliases(self):
        for imports, decorator in [
            ("from torch import no_grad", "@no_grad"),
            ("from torch import no_grad", "@no_grad()"),
            ("import torch", "@torch.no_grad"),
            ("import torch as t", "@t.enable_grad()"),
            ("from torch import set_grad_enabled as sge", "@sge(False)"),
            ("from torch.autograd import grad_mode as gm", "@gm.no_grad()"),
            ("from torch import *", "@enable_grad()"),
            ("import torch.autograd", "@torch.autograd.grad_mode.no_grad()"),
        ]:
            with self.subTest(imports=imports, decorator=decorator):
                lines = [imports, "import torch", decorator, "def f():",
                         "    with torch.enable_grad():", "        yield 1",
                         "    with torch.inference_mode():", "        yield 2"]
                self.assertEqual(check("\n".join(lines) + "\n"), [(8, 8, "TGM003")])

    def test_nested_blocks_report_innermost_uncarried(self):
        src = """
            import torch
            @torch.no_grad()
            def f():
                with torch.inference_mode():
                    with torch.enable_grad():
                        yield 1
                with torch.enable_grad():
                    with torch.autograd.set_multithreading_enabled(False):
                        with torch.no_grad():
                            yield 2
        """
        self.assertEqual(check(src), [(7, 12, "TGM003"), (11, 16, "TGM003")])
        msgs = messages(src)
        self.assertIn("'with torch.inference_mode()'", msgs[0])
        self.assertIn("'with torch.autograd.set_multithreading_enabled(False)'", msgs[1])

    def test_other_decorators_exempt_nothing(self):
        src = """
            import contextlib
            import functools
            import torch
            class K:
                @staticmethod
                @contextlib.contextmanager
                def f():
                    with torch.autocast("cpu"):
                        yield
                @functools.cache
                async def g(q):
                    with torch.autograd.set_multithreading_enabled(False):
                        await q
        """
        self.assertEqual(check(src), [(10, 12, "TGM001"), (14, 12, "TGM002")])

    def test_enclosing_decorators_do_not_carry_inner_frames(self):
        src = """
            import torch
            @torch.inference_mode()
            def outer():
                @torch.no_grad()
                def inner():
                    with torch.inference_mode():
                        yield 1
                with torch.inference_mode():
                    yield inner
        """
        self.assertEqual(check(src), [(8, 12, "TGM003")])

    def test_message_yield(self):
        src = """
            import torch
            @torch.no_grad()
            def f():
                with torch.inference_mode():
                    yield 1
        """
        self.assertEqual(messages(src), [
            "TGM003 yield inside 'with torch.inference_mode()', which sets the whole autograd state, in a body "
            "decorated with @torch.no_grad(), which carries only grad mode: it leaks to the caller while the "
            "generator is suspended; a body decorated with @torch.inference_mode() would carry it"
        ])

    def test_message_await(self):
        src = """
            from torch import autocast
            import torch.autograd.grad_mode as gm
            @autocast("cpu")
            @gm.inference_mode
            async def f(q):
                async with gm.set_multithreading_enabled(False):
                    with autocast(device_type="cuda", dtype=None):
                        await q
        """
        self.assertEqual(messages(src), [
            "TGM004 await inside 'with autocast(device_type='cuda', dtype=None)', which sets cuda autocast "
            "state, in a body decorated with @autocast('cpu') and @gm.inference_mode, which carry only the whole "
            "autograd state and cpu autocast state: it leaks to other tasks on the event loop while the "
            "coroutine is suspended; a body decorated with @torch.autocast(device_type='cuda', dtype=None) "
            "would carry it"
        ])


class TestAutocastDevice(TestCase):
    def test_other_device_flagged_same_device_not(self):
        src = """
            import torch
            @torch.autocast("cpu")
            def f():
                with torch.autocast("cpu", dtype=torch.bfloat16), torch.cpu.amp.autocast():
                    yield 1
                with torch.autocast("cuda"):
                    yield 2
                with torch.cuda.amp.autocast():
                    yield 3
            @torch.cuda.amp.autocast()
            async def g(q):
                with torch.autocast(device_type="cuda", enabled=False):
                    await q
                with torch.amp.autocast("cpu"):
                    await q
        """
        self.assertEqual(check(src), [(8, 8, "TGM003"), (10, 8, "TGM003"), (16, 8, "TGM004")])
        self.assertIn("which carries only cpu autocast state", messages(src)[0])

    def test_unknown_device_is_never_carried(self):
        # Conservative: a device type that is not a string literal matches none.
        src = """
            import torch
            @torch.autocast(dev)
            def f(dev):
                with torch.autocast(dev):
                    yield 1
            @torch.autocast("cpu")
            def g(dev, args):
                with torch.autocast(device_type=dev):
                    yield 1
                with torch.autocast(*args):
                    yield 2
            @torch.autocast
            def h():
                with torch.autocast("cpu"):
                    yield 1
        """
        self.assertEqual(check(src), [(6, 8, "TGM003"), (10, 8, "TGM003"), (12, 8, "TGM003"), (16, 8, "TGM003")])
        msgs = messages(src)
        self.assertIn("which sets autocast state of an unknown device type, in a body decorated with "
                      "@torch.autocast(dev), which carries no state known statically", msgs[0])
        self.assertTrue(msgs[0].endswith(
            "its device type is not a string literal, so no decorator is taken to carry it"), msgs[0])
        self.assertIn("which carries no state known statically", msgs[3])

    def test_unknown_device_decorator_still_a_decorated_body(self):
        src = """
            import torch
            @torch.autocast(dev)
            def f():
                with torch.no_grad():
                    yield 1
        """
        self.assertEqual(check(src), [(6, 8, "TGM003")])


class TestUndecoratedNewKinds(TestCase):
    """Undecorated bodies: the blocks the grad modes did not cover, under the old codes."""

    def test_each_kind_and_spelling(self):
        for item, suggest in [
            ("torch.autograd.set_multithreading_enabled(False)", "torch.autograd.set_multithreading_enabled(False)"),
            ("torch.autograd.grad_mode.set_multithreading_enabled(False)",
             "torch.autograd.set_multithreading_enabled(False)"),
            ("torch.autograd.enforce_grad_layout_policy()", "torch.autograd.grad_mode.enforce_grad_layout_policy()"),
            ("torch.autograd._force_original_view_tracking(True)",
             "torch.autograd.grad_mode._force_original_view_tracking(True)"),
            ("torch.autocast('cuda')", "torch.autocast('cuda')"),
            ("torch.amp.autocast_mode.autocast(device_type='cpu')", "torch.autocast(device_type='cpu')"),
            ("torch.cpu.amp.autocast_mode.autocast()", "torch.cpu.amp.autocast()"),
            ("torch.cuda.amp.autocast(dtype=torch.float16)", "torch.cuda.amp.autocast(dtype=torch.float16)"),
        ]:
            with self.subTest(item=item):
                for suspension, code in [("yield 1", "TGM001"), ("await q", "TGM002")]:
                    src, line = body([], item, suspension)
                    self.assertEqual(check(src), [(line, 8, code)])
                    (msg,) = messages(src)
                    self.assertIn(f"'with {item}': the mode leaks", msg)
                    self.assertIn(f"@{suggest} instead", msg)

    def test_aliases(self):
        for imports, item in [
            ("from torch.cuda.amp import autocast as ca", "ca()"),
            ("from torch import *", "autocast('cpu')"),
            ("from torch.amp import *", "autocast('cpu')"),
            ("from torch.autograd import *", "set_multithreading_enabled(False)"),
            ("import torch.cpu.amp as camp", "camp.autocast()"),
            ("from torch.autograd import grad_mode", "grad_mode._force_original_view_tracking(True)"),
        ]:
            with self.subTest(imports=imports, item=item):
                src, line = body([], item, imports=imports)
                self.assertEqual(check(src), [(line, 8, "TGM001")])

    def test_private_name_not_star_imported(self):
        imports = "from torch.autograd import *\nimport torch"
        src, _ = body([], "_force_original_view_tracking(True)", imports=imports)
        self.assertEqual(check(src), [])
        src, line = body([], "torch.autograd._force_original_view_tracking(True)", imports=imports)
        self.assertEqual(check(src), [(line, 8, "TGM001")])


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


DECORATED_SOURCE = """\
import torch


@torch.no_grad()
def gen():
    with torch.inference_mode():
        yield 1


@torch.autocast("cpu")
async def coro(q):
    with torch.autocast("cuda"):
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

    def test_decorated_reports_and_noqa(self):
        with open(self.bad, "w") as f:
            f.write(DECORATED_SOURCE)
        r = _flake8(["--isolated", "--select", "TGM", self.bad])
        lines = r.stdout.splitlines()
        self.assertEqual(len(lines), 2, r.stdout + r.stderr)
        self.assertIn(":7:9: TGM003 yield inside 'with torch.inference_mode()'", lines[0])
        self.assertIn(":13:9: TGM004 await inside 'with torch.autocast('cuda')'", lines[1])
        # The undecorated body's code does not silence the decorated body's.
        with open(self.bad, "w") as f:
            f.write(DECORATED_SOURCE.replace("yield 1", "yield 1  # noqa: TGM001").replace(
                "await q", "await q  # noqa: TGM004"))
        r = _flake8(["--isolated", "--select", "TGM", self.bad])
        lines = r.stdout.splitlines()
        self.assertEqual(len(lines), 1, r.stdout)
        self.assertIn(":7:9: TGM003", lines[0])

    def test_examples_are_clean(self):
        # The examples that keep a raw block open across an await on purpose
        # say so with ``# noqa: TGM002``; nothing else may be reported.
        r = _flake8(["--isolated", "--select", "TGM", EXAMPLES_DIR])
        self.assertEqual((r.returncode, r.stdout), (0, ""), r.stderr)


if __name__ == "__main__":
    run_tests()
