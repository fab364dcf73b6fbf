# Owner(s): ["module: autograd"]
"""overlay/_torch_gradmode_splice.py: building upstream's modules from their text and the fragments.

Most tests splice small synthetic "upstream" modules and fragments written to
temporary folders (no upstream text is kept here).  ``TestRealProject`` builds
the real project over the installed wheel's own files, read at test time.
"""

import ast
import difflib
import hashlib
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "overlay"))
import _torch_gradmode_splice as splice  # noqa: E402

# A synthetic upstream module, in upstream's layout: docstring, imports in
# sections, a class with a docstring, attributes and methods, functions, comments.
UPSTREAM = '''\
"""Upstream's module docstring."""

import functools
import sys
from typing import (
    Any,
    TypeVar,
)

import numpy

import torch
from torch._C import is_grad_enabled


# A comment above C.
class C:
    """C's docstring.

    Two paragraphs of it.
    """

    attr: int = 1
    other = 2

    def a(self):
        """a's docstring."""
        return 1

    def b(self):
        return 2

    # A comment above c.
    def c(self):
        """c's docstring."""
        return 3


def f(x):
    """f's docstring.

    It says what f does.
    """
    return x


# A comment above g.
def g(x):
    return -x


def h(x):
    """h's docstring."""
    return x * 2


T = TypeVar("T")
'''


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(textwrap.dedent(text))
    return path


def top_level(text):
    return {splice._name(node): node for node in ast.parse(text).body if splice._name(node)}


def source_of(text, *qualname):
    """The source (decorators and docstring included) of definition *qualname* in *text*."""
    body = ast.parse(text).body
    for name in qualname:
        node = next(n for n in body if splice._name(n) == name)
        body = getattr(node, "body", [])
    lines = text.splitlines(keepends=True)
    return "".join(lines[splice._start(node, lines, False) : node.end_lineno])


def spans(text, qualnames):
    """0-based half-open line ranges of the definitions *qualnames* in *text*."""
    found = []
    for qualname in qualnames:
        body, node = ast.parse(text).body, None
        for name in qualname.split("."):
            node = next(n for n in body if splice._name(n) == name)
            body = getattr(node, "body", [])
        lines = text.splitlines(keepends=True)
        found.append((splice._start(node, lines, False), node.end_lineno))
    return found


class SpliceTestCase(unittest.TestCase):
    def setUp(self):
        super().setUp()
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.tmp = tmp.name

    def fragment(self, text, name="frag.py"):
        return splice.read_fragment(write(os.path.join(self.tmp, name), text))

    def splice(self, fragment_text, names, upstream=UPSTREAM, used=""):
        text, _ = splice.splice(upstream, "pkg/mod.py", self.fragment(fragment_text), names, used)
        compile(text, "pkg/mod.py", "exec")  # still Python
        return text

    def assertOnlyChanged(self, before, after, qualnames, inserted_only=False):
        """Every line of *before* outside the definitions *qualnames* is in *after*, in order."""
        allowed = spans(before, qualnames)
        old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
        for op, i1, i2, _, _ in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
            if op in ("delete", "replace"):
                self.assertFalse(inserted_only, f"upstream lines {i1 + 1}-{i2} changed: {old[i1:i2]}")
                inside = any(lo <= i1 and i2 <= hi for lo, hi in allowed)
                self.assertTrue(inside, f"upstream lines {i1 + 1}-{i2} changed outside {qualnames}: {old[i1:i2]}")


class TestDocstrings(SpliceTestCase):
    def test_replaced_function_keeps_upstreams_docstring(self):
        text = self.splice(
            """
            def f(x):
                return x + 100
            """,
            ["f"],
        )
        new_f = source_of(text, "f")
        self.assertIn("return x + 100\n", new_f)
        self.assertNotIn("return x\n", new_f)
        self.assertEqual(ast.get_docstring(top_level(text)["f"]), ast.get_docstring(top_level(UPSTREAM)["f"]))
        # Upstream's docstring lines, byte for byte, right after the header.
        self.assertTrue(new_f.startswith('def f(x):\n    """f\'s docstring.\n\n    It says what f does.\n    """\n'),
                        new_f)
        self.assertOnlyChanged(UPSTREAM, text, ["f"])

    def test_a_function_without_upstream_docstring_gets_none(self):
        text = self.splice("def g(x):\n    return -x - 1\n", ["g"])
        self.assertIsNone(ast.get_docstring(top_level(text)["g"]))
        self.assertIn("# A comment above g.\ndef g(x):\n    return -x - 1\n", text)

    def test_versionchanged_docstring_is_appended(self):
        text = self.splice(
            '''
            def f(x):
                """.. versionchanged:: 2.14
                    Takes tensors too.
                """
                return x + 100
            ''',
            ["f"],
        )
        doc = ast.get_docstring(top_level(text)["f"])
        self.assertEqual(doc, "f's docstring.\n\nIt says what f does.\n\n"
                              ".. versionchanged:: 2.14\n    Takes tensors too.")
        self.assertIn("return x + 100\n", source_of(text, "f"))
        self.assertEqual(source_of(text, "f").count('"""'), 2)

    def test_versionchanged_on_a_member(self):
        text = self.splice(
            '''
            class C:
                def a(self):
                    """.. versionchanged:: 2.14
                        Returns 10.
                    """
                    return 10
            ''',
            ["C.a"],
        )
        self.assertEqual(ast.get_docstring(top_level(text)["C"].body[3]),
                         "a's docstring.\n\n.. versionchanged:: 2.14\n    Returns 10.")

    def test_other_docstring_on_a_replaced_definition_is_refused(self):
        for names, fragment, qualname in (
            (["f"], '''
                def f(x):
                    """A docstring of our own."""
                    return x
                ''', "f"),
            (["C.a"], '''
                class C:
                    def a(self):
                        """Rewritten: not a versionchanged paragraph."""
                        return 10
                ''', "C.a"),
        ):
            with self.subTest(qualname=qualname):
                message = rf"pkg/mod.py: {qualname} would rewrite upstream's docstring"
                with self.assertRaisesRegex(splice.SpliceError, message):
                    self.splice(fragment, names)

    def test_versionchanged_without_an_upstream_docstring_is_refused(self):
        fragment = '''
            def g(x):
                """.. versionchanged:: 2.14
                    Negates twice.
                """
                return x
            '''
        with self.assertRaisesRegex(splice.SpliceError, "g has no upstream docstring to append"):
            self.splice(fragment, ["g"])

    def test_a_new_definitions_docstring_is_its_own(self):
        text = self.splice('def k():\n    """k\'s own."""\n    return 0\n', ["k"])
        self.assertEqual(ast.get_docstring(top_level(text)["k"]), "k's own.")


class TestClasses(SpliceTestCase):
    def test_merged_member_by_member(self):
        text = self.splice(
            """
            class C:
                def b(self):
                    return 20
            """,
            ["C"],
        )
        self.assertIn("return 20\n", source_of(text, "C", "b"))
        # The class's docstring, attributes and untouched members stay upstream's, byte for byte.
        for qualname in (("C", "a"), ("C", "c")):
            self.assertEqual(source_of(text, *qualname), source_of(UPSTREAM, *qualname))
        head = UPSTREAM[UPSTREAM.index("# A comment above C.") : UPSTREAM.index("    def a(self)")]
        self.assertIn(head, text)
        self.assertIn("    # A comment above c.\n    def c(self):", text)
        self.assertOnlyChanged(UPSTREAM, text, ["C.b"])

    def test_qualified_member_only(self):
        fragment = """
            class C:
                def a(self):
                    return 10

                def b(self):
                    return 20
            """
        text = self.splice(fragment, ["C.b"])
        self.assertEqual(source_of(text, "C", "a"), source_of(UPSTREAM, "C", "a"))
        self.assertIn("return 20", source_of(text, "C", "b"))
        both = self.splice(fragment, ["C"])
        self.assertIn("return 10", source_of(both, "C", "a"))
        self.assertIn("return 20", source_of(both, "C", "b"))

    def test_new_member_after_its_fragment_sibling(self):
        text = self.splice(
            """
            class C:
                def a(self): ...

                def a2(self):
                    return 15
            """,
            ["C"],
        )
        names = [splice._name(n) for n in top_level(text)["C"].body[1:]]
        self.assertEqual(names, ["attr", "other", "a", "a2", "b", "c"])
        # The stub only positions: a is upstream's.
        self.assertEqual(source_of(text, "C", "a"), source_of(UPSTREAM, "C", "a"))
        self.assertOnlyChanged(UPSTREAM, text, [], inserted_only=True)

    def test_first_new_member_goes_after_the_class_docstring(self):
        text = self.splice("class C:\n    _carried = None\n", ["C._carried"])
        names = [splice._name(n) for n in top_level(text)["C"].body[1:]]
        self.assertEqual(names, ["_carried", "attr", "other", "a", "b", "c"])
        self.assertOnlyChanged(UPSTREAM, text, [], inserted_only=True)

    def test_member_of_a_class_upstream_lacks(self):
        with self.assertRaisesRegex(splice.SpliceError, "upstream has no class D"):
            self.splice("class D:\n    def a(self):\n        return 1\n", ["D.a"])

    def test_class_and_function_of_the_same_name(self):
        with self.assertRaisesRegex(splice.SpliceError, "C is a class in one of upstream and the fragment only"):
            self.splice("def C():\n    return 1\n", ["C"])
        with self.assertRaisesRegex(splice.SpliceError, "no class f to put f.x in"):
            self.splice("class f:\n    x = 1\n", ["f"])


class TestPlacement(SpliceTestCase):
    def order(self, text):
        return [splice._name(n) for n in ast.parse(text).body if splice._name(n)]

    def test_after_its_previous_fragment_sibling(self):
        text = self.splice("def f(x): ...\n\n\ndef new(x):\n    return x\n\n\ndef h(x): ...\n", ["new"])
        self.assertEqual(self.order(text), ["C", "f", "new", "g", "h", "T"])
        self.assertIn('    return x\n\n\ndef new(x):\n    return x\n\n\n# A comment above g.\n', text)
        self.assertOnlyChanged(UPSTREAM, text, [], inserted_only=True)

    def test_before_its_next_when_no_previous_is_upstream(self):
        text = self.splice("def new(x):\n    return x\n\n\ndef g(x): ...\n", ["new"])
        self.assertEqual(self.order(text), ["C", "f", "new", "g", "h", "T"])
        # Before g's comment, which belongs to g.
        self.assertIn("def new(x):\n    return x\n\n\n# A comment above g.\ndef g(x):", text)
        self.assertOnlyChanged(UPSTREAM, text, [], inserted_only=True)

    def test_at_the_end_when_no_neighbour_is_upstream(self):
        text = self.splice("def new(x):\n    return x\n\n\ndef other():\n    pass\n", ["new", "other"])
        self.assertEqual(self.order(text), ["C", "f", "g", "h", "T", "new", "other"])
        self.assertTrue(text.startswith(UPSTREAM.rstrip("\n") + "\n\n\ndef new(x):"), text[len(UPSTREAM) - 40 :])
        self.assertOnlyChanged(UPSTREAM, text, [], inserted_only=True)

    def test_new_definitions_follow_each_other_in_fragment_order(self):
        fragment = "def h(x): ...\n\n\ndef n1():\n    pass\n\n\ndef n2():\n    pass\n"
        self.assertEqual(self.order(self.splice(fragment, ["n1", "n2"]))[-4:], ["h", "n1", "n2", "T"])
        # n2 first, then n1: n1 still goes between h and n2.
        self.assertEqual(self.order(self.splice(fragment, ["n2", "n1"]))[-4:], ["h", "n1", "n2", "T"])

    def test_placeholder_stubs_are_not_definitions(self):
        with self.assertRaisesRegex(splice.SpliceError, "f is a placeholder in the fragment"):
            self.splice("def f(x): ...\n", ["f"])
        # A stub member of a class the splice merges whole stays upstream's.
        text = self.splice("class C:\n    def a(self): ...\n\n    def b(self):\n        return 20\n", ["C"])
        self.assertEqual(source_of(text, "C", "a"), source_of(UPSTREAM, "C", "a"))

    def test_unknown_name(self):
        with self.assertRaisesRegex(splice.SpliceError, "the fragment defines no nothing"):
            self.splice("def f(x):\n    return 1\n", ["nothing"])

    def test_every_byte_outside_replaced_spans_stays(self):
        fragment = '''
            import os


            class C:
                def a(self): ...

                def a2(self):
                    return os.sep

                def c(self):
                    return 30


            def f(x):
                """.. versionchanged:: 2.14
                    More.
                """
                return x + 1


            def n():
                pass
            '''
        text = self.splice(fragment, ["C", "f", "n"])
        self.assertOnlyChanged(UPSTREAM, text, ["C.c", "f"])
        # And the check itself notices a change outside them.
        with self.assertRaises(AssertionError):
            self.assertOnlyChanged(UPSTREAM, text, ["C.c"])


class TestImports(SpliceTestCase):
    def test_added_only_when_used(self):
        fragment = """
            import json
            from typing import cast


            def uses_json():
                return json.dumps(1)


            def uses_nothing():
                return 1
            """
        text = self.splice(fragment, ["uses_nothing"])
        self.assertNotIn("import json", text)
        self.assertNotIn("cast", text)
        text = self.splice(fragment, ["uses_json"])
        self.assertIn("import json\n", text)
        self.assertNotIn("cast", text)

    def test_used_by_an_earlier_step(self):
        fragment = "import json\n\n\ndef later():\n    return 1\n"
        self.assertNotIn("import json", self.splice(fragment, ["later"]))
        self.assertIn("import json\n", self.splice(fragment, ["later"], used="x = json.loads('1')\n"))

    def test_merged_into_an_existing_parenthesised_import(self):
        fragment = "from typing import cast, Callable\n\n\ndef k() -> Callable:\n    return cast(int, 1)\n"
        text = self.splice(fragment, ["k"])
        self.assertIn("from typing import (\n    Any,\n    Callable,\n    cast,\n    TypeVar,\n)\n", text)
        self.assertEqual(text.count("from typing import"), 1)
        self.assertOnlyChanged(UPSTREAM, text, [], inserted_only=True)

    def test_merged_into_an_existing_one_line_import_sorted_case_insensitively(self):
        fragment = ("from torch._C import _set_grad_enabled, Generator\n\n\n"
                    "def k():\n    return _set_grad_enabled, Generator\n")
        text = self.splice(fragment, ["k"])
        self.assertIn("from torch._C import _set_grad_enabled, Generator, is_grad_enabled\n", text)
        self.assertEqual(text.count("from torch._C import"), 1)

    def test_already_imported(self):
        text = self.splice("import sys\nfrom typing import Any\n\n\ndef k() -> Any:\n    return sys\n", ["k"])
        self.assertEqual(text.count("import sys\n"), 1)
        self.assertEqual(text.count("    Any,\n"), 1)

    def test_new_import_in_its_section(self):
        fragment = """
            import contextlib
            import types
            import torch.nn
            import zlib
            from collections.abc import Callable
            from torch.utils import _pytree


            def k():
                return contextlib, types, torch.nn, zlib, Callable, _pytree
            """
        text = self.splice(fragment, ["k"])
        head = text[: text.index("# A comment above C.")]
        self.assertEqual(
            head,
            '"""Upstream\'s module docstring."""\n\n'
            "import contextlib\nimport functools\nimport sys\nimport types\nimport zlib\n"
            "from collections.abc import Callable\n"
            "from typing import (\n    Any,\n    TypeVar,\n)\n\n"
            "import numpy\n\n"
            "import torch\nimport torch.nn\n"
            "from torch._C import is_grad_enabled\nfrom torch.utils import _pytree\n\n\n",
        )

    def test_a_section_of_its_own(self):
        upstream = "import sys\n\n\ndef f():\n    pass\n"
        fragment = "import torch\n\n\ndef k():\n    return torch\n"
        text = self.splice(fragment, ["k"], upstream=upstream)
        self.assertTrue(text.startswith("import sys\n\nimport torch\n\n\ndef f():"), text)

    def test_no_import_block(self):
        with self.assertRaisesRegex(splice.SpliceError, "no import block to add 'import torch'"):
            self.splice("import torch\n\n\ndef k():\n    return torch\n", ["k"], upstream="def f():\n    pass\n")


class TestBuild(SpliceTestCase):
    """``build`` over a synthetic checkout: ``stack/series``, steps, fragments."""

    def make_checkout(self, steps, files):
        root = os.path.join(self.tmp, "checkout")
        write(os.path.join(root, "stack", "series"), "".join(f"{name}\n" for name, _ in steps))
        for name, step in steps:
            write(os.path.join(root, "stack", name, "step"), step)
            write(os.path.join(root, "stack", name, "DESCRIPTION.md"), f"{name}\n")
        for path, text in files.items():
            write(os.path.join(root, path), text)
        return root

    def read(self, texts):
        return lambda path: texts.get(path)

    def test_a_steps_own_version_overrides_the_final_fragment(self):
        root = self.make_checkout(
            [("s1", "define pkg/mod.py f g\n"), ("s2", "define pkg/mod.py f\n")],
            {
                "pkg/mod.py": "def f(x):\n    return 'final f'\n\n\ndef g(x):\n    return 'final g'\n",
                "stack/s1/pkg/mod.py": "def f(x):\n    return 'first f'\n",
            },
        )
        steps = splice.series(root)
        self.assertEqual(steps[0].source("pkg/mod.py"), os.path.join(root, "stack", "s1", "pkg", "mod.py"))
        self.assertEqual(steps[1].source("pkg/mod.py"), os.path.join(root, "pkg", "mod.py"))
        read = self.read({"pkg/mod.py": UPSTREAM})
        first = splice.build(root, steps[:1], read, edits={})["pkg/mod.py"]
        self.assertIn("'first f'", source_of(first, "f"))
        self.assertIn("'final g'", source_of(first, "g"))  # not in the step's copy: the checkout's
        last = splice.build(root, steps, read, edits={})["pkg/mod.py"]
        self.assertIn("'final f'", source_of(last, "f"))
        self.assertNotIn("first f", last)
        self.assertEqual(last, splice.build_install(root, read, edits={})["pkg/mod.py"])
        # Docstrings stay upstream's at every step.
        for text in (first, last):
            self.assertEqual(ast.get_docstring(top_level(text)["f"]), ast.get_docstring(top_level(UPSTREAM)["f"]))

    def test_a_steps_own_version_of_a_member(self):
        root = self.make_checkout(
            [("s1", "define pkg/mod.py C.b\n")],
            {"pkg/mod.py": "class C:\n    def b(self):\n        return 'final'\n",
             "stack/s1/pkg/mod.py": "class C:\n    def b(self):\n        return 'own'\n"},
        )
        text = splice.build(root, splice.series(root), self.read({"pkg/mod.py": UPSTREAM}), edits={})["pkg/mod.py"]
        self.assertIn("'own'", source_of(text, "C", "b"))

    def test_a_steps_own_version_of_a_new_class_goes_in_whole(self):
        root = self.make_checkout(
            [("s1", "define pkg/mod.py New\n"), ("s2", "define pkg/mod.py New\n")],
            {"pkg/mod.py": "class New:\n    \"\"\"Final.\"\"\"\n\n    def b(self):\n        return 'final'\n",
             "stack/s1/pkg/mod.py": "class New:\n    \"\"\"Own.\"\"\"\n\n    def b(self):\n        return 'own'\n"},
        )
        steps, read = splice.series(root), self.read({"pkg/mod.py": UPSTREAM})
        first = splice.build(root, steps[:1], read, edits={})["pkg/mod.py"]
        self.assertIn("'own'", source_of(first, "New", "b"))
        self.assertNotIn("final", first.lower())
        self.assertIn("'final'", source_of(splice.build(root, steps, read, edits={})["pkg/mod.py"], "New", "b"))

    def test_a_steps_own_version_must_be_in_the_fragment(self):
        root = self.make_checkout(
            [("s1", "define pkg/mod.py f\n")],
            {"pkg/mod.py": "def f(x):\n    return 1\n", "stack/s1/pkg/mod.py": "def extra():\n    pass\n"},
        )
        with self.assertRaisesRegex(splice.SpliceError, "extra is not a definition of the same kind"):
            splice.build(root, splice.series(root), self.read({"pkg/mod.py": UPSTREAM}), edits={})

    def test_new_files_and_edits(self):
        root = self.make_checkout(
            [("s1", "new pkg/new.py\nedit pkg/other.txt\n"), ("s2", "new pkg/new.py\n")],
            {"pkg/new.py": "final = 1\n", "stack/s1/pkg/new.py": "first = 1\n"},
        )
        steps = splice.series(root)
        edits = {"pkg/other.txt": lambda text, path, context: text + f"edited, new: {sorted(context['new'])}\n"}
        read = self.read({"pkg/other.txt": "other\n"})
        self.assertEqual(splice.build(root, steps[:1], read, edits=edits),
                         {"pkg/new.py": "first = 1\n", "pkg/other.txt": "other\nedited, new: ['pkg/new.py']\n"})
        self.assertEqual(splice.build(root, steps, read, edits=edits)["pkg/new.py"], "final = 1\n")
        missing = []
        self.assertNotIn("pkg/other.txt", splice.build(root, steps, self.read({}), edits=edits, missing=missing))
        self.assertEqual(missing, ["pkg/other.txt"])
        with self.assertRaisesRegex(splice.SpliceError, "step s1: no anchored edit for pkg/other.txt"):
            splice.build(root, steps, read, edits={})

    def test_a_missing_target_of_a_definition(self):
        root = self.make_checkout([("s1", "define pkg/mod.py f\n")], {"pkg/mod.py": "def f(x):\n    return 1\n"})
        with self.assertRaisesRegex(splice.SpliceError, "the target lacks pkg/mod.py, which step s1 changes"):
            splice.build(root, splice.series(root), self.read({}), edits={})

    def test_unreadable_step_line(self):
        root = self.make_checkout([("s1", "define pkg/mod.py\n")], {})
        with self.assertRaisesRegex(splice.SpliceError, r"s1/step:1: cannot read 'define pkg/mod.py'"):
            splice.series(root)

    def test_hash_mismatch_names_the_file(self):
        for path in sorted(splice.UPSTREAM_SHA256):
            with self.subTest(path=path):
                if path.endswith("trace_rules.py"):
                    step, edits = f"edit {path}\n", {path: lambda text, p, c: text}
                    files = {}
                else:
                    step, edits = f"define {path} f\n", {}
                    files = {path: "def f(x):\n    return 1\n"}
                root = self.make_checkout([("s1", step)], files)
                text = "def f(x):\n    return 0\n"
                with self.assertRaisesRegex(splice.SpliceError, rf"^{path} is not torch 2\.13\.0's \(sha256 "):
                    splice.build(root, splice.series(root), self.read({path: text}), edits=edits)
                # check_upstream accepts exactly the text of that hash.
                self.assertNotEqual(hashlib.sha256(text.encode()).hexdigest(), splice.UPSTREAM_SHA256[path])
                splice.check_upstream("pkg/unchecked.py", text)


def wheel_torch_dir():
    proc = subprocess.run(
        [sys.executable, "-c", "import torch, os; print(os.path.dirname(torch.__file__))"],
        env=dict(os.environ, TORCH_GRADMODE_OVERLAY="0"), capture_output=True, text=True, check=True, cwd=os.sep,
    )
    return proc.stdout.strip()


class TestRealProject(unittest.TestCase):
    """The project's own fragments over the installed wheel's files."""

    @classmethod
    def setUpClass(cls):
        wheel = wheel_torch_dir()
        base = os.path.dirname(wheel)

        def read(path):
            where = os.path.join(base, path)
            if not path.startswith("torch/") or not os.path.isfile(where):
                return None
            with open(where, encoding="utf-8") as f:
                return f.read()

        cls.read = staticmethod(read)
        cls.steps = splice.series(ROOT)
        cls.installed = splice.build_install(ROOT, read)
        cls.stacked = splice.build(ROOT, cls.steps, read, only=lambda p: p.startswith("torch/"))

    def test_the_wheels_files_are_2_13_0s(self):
        for path in splice.UPSTREAM_SHA256:
            text = self.read(path)
            if text is not None:
                splice.check_upstream(path, text)

    def test_all_steps_build_what_the_install_builds(self):
        modules = [p for p in self.installed if p.startswith("torch/") and p.endswith(".py")]
        self.assertIn("torch/utils/_contextlib.py", modules)
        self.assertIn("torch/autograd/grad_mode.py", modules)
        for path in sorted(set(modules) | {p for p in self.stacked if p.endswith(".py")}):
            self.assertEqual(self.stacked.get(path), self.installed.get(path), path)

    def test_the_built_modules_hold_every_fragment_definition(self):
        for path in ("torch/utils/_contextlib.py", "torch/autograd/grad_mode.py"):
            built = top_level(self.installed[path])
            pieces, _ = splice.read_fragment(os.path.join(ROOT, path))
            for name, piece in pieces.items():
                self.assertIn(name, built, path)
                if piece.members is None:
                    if not piece.stub:
                        self.assertIn(piece.text.strip().splitlines()[-1], self.installed[path], f"{path}: {name}")
                    continue
                members = {splice._name(n) for n in built[name].body}
                self.assertLessEqual(set(piece.members), members, f"{path}: {name}")
            self.assertNotIn("_driver", top_level(self.read(path)))  # upstream's has none
        self.assertIn("_driver", top_level(self.installed["torch/utils/_contextlib.py"]))

    def test_upstream_bytes_outside_the_fragment_definitions_stay(self):
        for path in ("torch/utils/_contextlib.py", "torch/autograd/grad_mode.py"):
            before, after = self.read(path), self.installed[path]
            pieces, _ = splice.read_fragment(os.path.join(ROOT, path))
            upstream_names = top_level(before)
            replaced = []
            for name, piece in pieces.items():
                if name not in upstream_names:
                    continue
                if piece.members is None or not isinstance(upstream_names[name], ast.ClassDef):
                    replaced.append(name)
                    continue
                theirs = {splice._name(n) for n in upstream_names[name].body}
                replaced += [f"{name}.{m}" for m, p in piece.members.items() if m in theirs and not p.stub]
            old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
            allowed = spans(before, replaced)
            for op, i1, i2, _, _ in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
                if op in ("delete", "replace"):
                    self.assertTrue(any(lo <= i1 and i2 <= hi for lo, hi in allowed),
                                    f"{path}: upstream lines {i1 + 1}-{i2} changed outside {replaced}")
            # Upstream's docstrings of replaced definitions are all still there.
            for qualname in replaced:
                node = upstream_names[qualname.split(".")[0]]
                if "." in qualname:
                    node = next(n for n in node.body if splice._name(n) == qualname.split(".")[1])
                doc = ast.get_docstring(node, clean=False)
                if doc:
                    self.assertIn(doc.strip().splitlines()[0], after, f"{path}: {qualname}")


if __name__ == "__main__":
    unittest.main()


class TestUpstreamCallsAndImports(SpliceTestCase):
    UP = textwrap.dedent('''\
        import sys
        import warnings


        def f(x):
            """Upstream's f."""
            if x is None:
                raise ValueError(
                    "upstream's own words, "
                    f"about {x}"
                )
            warnings.warn("first", stacklevel=2)
            warnings.warn("second", stacklevel=2)
            return sys.maxsize
        ''')

    def test_a_call_written_with_ellipsis_is_upstreams_whole(self):
        text = self.splice('''\
            def f(x):
                if x is None or x == 0:
                    raise ValueError(...)
                warnings.warn(...)
                warnings.warn(...)
                return 0
            ''', ["f"], upstream=self.UP)
        self.assertIn('raise ValueError(\n            "upstream\'s own words, "\n            f"about {x}"\n        )\n',
                      text)
        self.assertLess(text.index('"first"'), text.index('"second"'))
        self.assertIn("x == 0", text)
        self.assertNotIn("(...)", text)

    def test_a_call_upstream_does_not_make_is_refused(self):
        with self.assertRaisesRegex(splice.SpliceError, "no call 1 of TypeError"):
            self.splice('''\
                def f(x):
                    raise TypeError(...)
                ''', ["f"], upstream=self.UP)

    def test_an_assignment_written_with_ellipsis_is_upstreams_whole(self):
        up = textwrap.dedent('''\
            def g():
                def inner():
                    pass

                inner.note = (  # type: ignore[attr-defined]
                    "upstream's note"
                )
                return inner
            ''')
        text = self.splice('''\
            def g():
                inner = object()
                inner.note = ...
                return inner
            ''', ["g"], upstream=up)
        self.assertIn('    inner.note = (  # type: ignore[attr-defined]\n        "upstream\'s note"\n    )\n', text)
        self.assertNotIn("= ...", text)
        with self.assertRaisesRegex(splice.SpliceError, "no assignment 1 to other.note"):
            self.splice('''\
                def g():
                    other.note = ...
                ''', ["g"], upstream=up)

    def test_an_import_whose_last_use_is_replaced_is_dropped(self):
        text = self.splice('''\
            def f(x):
                warnings.warn(...)
                return 0
            ''', ["f"], upstream=self.UP)
        self.assertNotIn("import sys", text)
        self.assertIn("import warnings\n", text)
