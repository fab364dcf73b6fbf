"""Anchored edits: the changes to upstream files that are not definitions.

Each takes the target file's text, its path and the build's context (``root``:
the checkout; ``new``: ``{path: file}`` of the new files of the steps built so
far; ``step_new``: the new files of the step being built) and returns the
edited text.  Each finds its place by anchors in the target's own text, so no
upstream text is kept here; a missing anchor is an error naming the file and
what it looked for.  The splice (``_torch_gradmode_splice.build``) applies
them, for the install and for the export alike.
"""

import ast
import json
import os
import re

from _torch_gradmode_splice import SpliceError

SECTION = "docs/source/notes/grad_mode_suspend_section.md"
# The new test modules' classes that test/test_autograd.py imports (and so runs).
TEST_CLASS_PREFIX = "TestGradMode"


class Binding:
    """A C++ binding a step adds: ``torch/csrc/autograd/python_<name>.cpp``, its header, init and stubs."""

    def __init__(self, name, names):
        self.source = f"torch/csrc/autograd/python_{name}.cpp"
        self.header = f"torch/csrc/autograd/python_{name}.h"
        self.init = f"torch::autograd::init_{name}(module);"
        self.stubs = f"lint/upstream/{name}.pyi"
        # Every torch._C name the binding adds; Dynamo's trace rules must know each.
        self.names = tuple(f"torch._C._{n}" for n in names)


BINDINGS = (
    Binding("autograd_mode_state", ("get_autograd_mode_state", "swap_autograd_mode_state", "swap_grad_enabled")),
    Binding("autocast_state", ("get_autocast_state", "swap_autocast_state")),
)


def _bindings(context):
    """The bindings the step being built adds."""
    return [b for b in BINDINGS if b.source in context["step_new"]]


ExportError = SpliceError


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def _insert_sorted(text, path, pattern, new_line, what):
    """Insert ``new_line`` among the consecutive lines ``pattern`` matches, in sorted order."""
    lines = text.splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if re.match(pattern, line)]
    if not hits:
        raise ExportError(f"{path}: no line matching {pattern!r} to put {what} among")
    # The first run of matching lines only: a later list may match the pattern too.
    run = [hits[0]]
    for i in hits[1:]:
        if i != run[-1] + 1:
            break
        run.append(i)
    at = next((i for i in run if lines[i].strip() > new_line.strip()), run[-1] + 1)
    lines.insert(at, new_line)
    return "".join(lines)


def _already(text, path, needle):
    if needle in text:
        raise ExportError(f"{path} already contains {needle!r}: DIR carries (part of) this patch already")


# -- Wiring edits: each takes DIR's text of one upstream file, returns the new text.


def _test_classes(path, source):
    """Return the ``TestGradMode*`` classes test module *path* defines, read from its source.

    Every module-level ``Test*`` class must be one of them: another would not
    run upstream, where only what ``test_autograd.py`` imports runs.
    """
    tree = ast.parse(_read(source), path)
    classes = [node.name for node in tree.body if isinstance(node, ast.ClassDef) and node.name.startswith("Test")]
    others = [name for name in classes if not name.startswith(TEST_CLASS_PREFIX)]
    if others:
        raise ExportError(
            f"{path}: {', '.join(others)} would not run upstream: test/test_autograd.py imports only "
            f"{TEST_CLASS_PREFIX}* classes (rename it)"
        )
    # instantiate_device_type_tests(C, globals()) replaces C by per-device classes: nothing named C to import.
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) == "instantiate_device_type_tests"
            and node.args
            and getattr(node.args[0], "id", None) in classes
        ):
            raise ExportError(
                f"{path}: {node.args[0].id} is instantiated per device type, so the module has no class of "
                "that name to import; test/test_autograd.py instantiates device-type tests itself"
            )
    return classes


def _module_names(text, path):
    """Return the names a Python module binds at its top level."""
    try:
        tree = ast.parse(text, path)
    except SyntaxError as e:
        raise ExportError(f"{path} is not valid Python ({e.msg}, line {e.lineno})") from None
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.Assign):
            names.update(target.id for target in node.targets if isinstance(target, ast.Name))
    return names


def _insert_import(text, path, module, block):
    """Insert import *block* of *module* among the first run of ``from autograd.* import``s, in order."""
    tree = ast.parse(text, path)
    run = []
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("autograd."):
            run.append(node)
        elif run:
            break
    if not run:
        raise ExportError(f"{path}: no 'from autograd.* import' lines to put the import of {module} among")
    later = [node for node in run if node.module > module]
    lines = text.splitlines(keepends=True)
    at = later[0].lineno - 1 if later else run[-1].end_lineno
    return "".join(lines[:at]) + block + "".join(lines[at:])


def wire_test_imports(text, path, context):
    """Import the step's new test modules' ``TestGradMode*`` classes beside ``autograd/test_complex.py``'s."""
    for test in (p for p in context["step_new"] if p.startswith("test/autograd/") and p.endswith(".py")):
        module = os.path.splitext(os.path.relpath(test, "test"))[0].replace(os.sep, ".")
        _already(text, path, f"from {module} import")
        names = sorted(_test_classes(test, context["new"][test]))
        if not names:
            raise ExportError(f"{test}: defines no {TEST_CLASS_PREFIX}* class to import")
        taken = sorted(set(names) & _module_names(text, path))
        if taken:
            raise ExportError(f"{path} already defines or imports {', '.join(taken)}, which {test} defines too")
        line = f"from {module} import {', '.join(names)}  # noqa: F401\n"
        if len(line) > 89:
            body = "".join(f"    {name},\n" for name in names)
            line = f"from {module} import (  # noqa: F401\n{body})\n"
        text = _insert_import(text, path, module, line)
    return text


def wire_module_init(text, path, context):
    """Register each binding in ``torch._C``: include its header, call its init beside the legacy variable's."""
    for b in _bindings(context):
        _already(text, path, b.header)
        text = _insert_sorted(
            text, path, r"#include <torch/csrc/autograd/", f"#include <{b.header}>\n", "the binding's #include"
        )
        anchor = re.compile(r"^(\s*)torch::autograd::init_legacy_variable\(module\);\n", re.M)
        m = anchor.search(text)
        if not m:
            raise ExportError(f"{path}: no line matching {anchor.pattern!r} to put the binding's init after")
        text = text[:m.end()] + f"{m.group(1)}{b.init}\n" + text[m.end():]
    return text


def _in_list(text, path, opener, closer, edit):
    """Apply ``edit`` to the block from ``opener`` to the first ``closer`` after it, only."""
    start = text.find(opener)
    end = text.find(closer, start) if start >= 0 else -1
    if end < 0:
        raise ExportError(f"{path}: no {opener.strip()!r} ... {closer.strip()!r} list to edit")
    return text[:start] + edit(text[start:end]) + text[end:]


def wire_build_list(text, path, context):
    """Add each binding's source to ``libtorch_python_core_sources``."""
    for b in _bindings(context):
        _already(text, path, b.source)
        text = _in_list(
            text, path, "libtorch_python_core_sources = [", "\n]",
            lambda block, b=b: _insert_sorted(
                block, path, r'\s+"torch/csrc/autograd/python_\w+\.cpp",', f'    "{b.source}",\n',
                "the binding's source in libtorch_python_core_sources",
            ),
        )
    return text


def wire_stubs(text, path, context):
    """Declare each binding's type and functions in a section before ``_set_grad_enabled``'s."""
    for b in _bindings(context):
        block = _read(os.path.join(context["root"], b.stubs)).strip("\n") + "\n\n"
        _already(text, path, b.names[-1].rsplit(".", 1)[1])
        anchor = re.compile(r"^# Defined in torch/csrc/autograd/init\.cpp\ndef _set_grad_enabled\(", re.M)
        m = anchor.search(text)
        if not m:
            raise ExportError(f"{path}: no line matching {anchor.pattern!r} to put the binding's stubs before")
        text = text[:m.start()] + block + text[m.start():]
    return text


def wire_trace_rules(text, path, context):
    """Make Dynamo graph-break on each binding's functions: map them to ``SkipFunctionVariable``.

    They change thread-local state and return an opaque object, so they must
    never be put in a graph.  They go in ``manual_torch_name_rule_map`` among
    its other ``"torch._C.<name>": SkipFunctionVariable,`` entries (the first
    run of them, beside ``torch._C._to_dlpack`` upstream), in order.
    """
    names = [name for b in _bindings(context) for name in b.names]
    for name in names:
        _already(text, path, f'"{name}"')

    def edit(block):
        for name in names:
            block = _insert_sorted(
                block, path, r'\s+"torch\._C\.[\w.]+": SkipFunctionVariable,$',
                f'    "{name}": SkipFunctionVariable,\n',
                f"the skip rule of {name} in manual_torch_name_rule_map",
            )
        return block

    return _in_list(text, path, "manual_torch_name_rule_map: ", "\n}", edit)


def wire_notes_section(text, path, context):
    """Insert the docs section after the notes' "Grad Modes" material, or replace an earlier step's version.

    That material is "Grad Modes" and one subsection per mode, "Inference Mode"
    the last: the section goes before the heading (and its label, if any) that
    follows "Inference Mode", or at the end of the file.  Each step that edits
    the notes carries its own version of the section (``stack/<step>/`` +
    ``SECTION``), which replaces the one an earlier step of the same build put there.
    """
    source = context.get("source", lambda p: os.path.join(context["root"], p))
    block = _read(source(SECTION)).strip("\n") + "\n"
    first = block.splitlines()[0]
    if path in context.get("edited", ()):
        start = text.index(first)
        heading = re.compile(r"^#{1,3} ", re.M)
        own = heading.search(text, start + len(first))  # the section's own heading
        end = heading.search(text, own.end()) if own else None
        at = end.start() if end else len(text)
        label = re.search(r"^\([\w-]+\)=\n\s*\Z", text[start:at], re.M)
        if label:
            at = start + label.start()
        old = text[start:at].rstrip("\n") + "\n"
        return text[:start] + block + text[start + len(old):]
    _already(text, path, first)
    start = re.search(r"^### Inference Mode[ \t]*\n", text, re.M)
    if not start:
        raise ExportError(f"{path}: no '### Inference Mode' heading to put {SECTION} after its subsection")
    heading = re.compile(r"^#{1,3} ", re.M).search(text, start.end())
    at = heading.start() if heading else len(text)
    label = re.search(r"^\([\w-]+\)=\n\s*\Z", text[start.end():at], re.M)
    if label:
        at = start.end() + label.start()
    # Only added lines: a blank line before the section and after it, as between upstream's.
    head, tail = text[:at], text[at:]
    gap = "" if head.endswith("\n\n") else "\n" if head.endswith("\n") else "\n\n"
    return head + gap + block + ("\n" + tail if tail else "")


def wire_convert_frame(text, path, context):
    """Have ``convert_frame`` refuse every suspendable frame, not generators only.

    Its one use of ``is_generator`` (and the import of it) becomes
    ``is_suspendable``: coroutine and async generator frames were converted.
    """
    _already(text, path, "is_suspendable")
    swaps = (("    is_generator,\n", "    is_suspendable,\n"), ("if is_generator(code):", "if is_suspendable(code):"))
    for old, new in swaps:
        if text.count(old) != 1:
            raise ExportError(f"{path}: expected one {old.strip()!r} to replace, found {text.count(old)}")
        text = text.replace(old, new)
    return text


# The graph break wire_ctx_manager adds, as wire_graph_break_registry records it
# (the explanation in the lines the check's source splits it into).
GRAPH_BREAK_LINES = (
    "Dynamo cannot model how a context manager decorating a generator or ",
    "coroutine function applies to its body, which runs after the call ",
    "that makes the generator or coroutine returns.",
)
GRAPH_BREAK = {
    "Gb_type": "Context manager decorating a generator or coroutine function",
    "Context": "str(fn)",
    "Explanation": "".join(GRAPH_BREAK_LINES),
    "Hints": ["Decorate the function outside the compiled region."],
}


def wire_ctx_manager(text, path, context):
    """Give ``ContextWrappingVariable`` a graph break for the call of a generator or coroutine function it decorates.

    Dynamo models a call of a function a context decorates inside traced code
    as the call inside the context, which for such a function enters it only
    while the call makes the generator: the body's steps ran outside it.  The
    break is at the call (wire_functions), not at the decoration: there the
    wrapped function is rebuilt as ``ctx(fn)``, which leaves the grad mode as
    it found it; a bare ``torch.set_grad_enabled(mode)`` object rebuilt at a
    break saves the mode the graph had already set, and leaks it.
    """
    _already(text, path, "is_suspendable")
    anchor = '            raise AssertionError("Unexpected arg type")\n'
    explanation = "".join(f'                    "{line}"\n' for line in GRAPH_BREAK_LINES)
    method = (
        "\n"
        "    def check_call(\n"
        '        self, fn: "UserFunctionVariable | NestedUserFunctionVariable"\n'
        "    ) -> None:\n"
        "        if is_suspendable(fn.get_code()):\n"
        "            unimplemented(\n"
        f'                gb_type="{GRAPH_BREAK["Gb_type"]}",\n'
        f"                context={GRAPH_BREAK['Context']},\n"
        "                explanation=(\n"
        f"{explanation}"
        "                ),\n"
        "                hints=[\n"
        f'                    "{GRAPH_BREAK["Hints"][0]}",\n'
        "                ],\n"
        "            )\n"
    )
    swaps = (
        ("from ..bytecode_transformation import create_call_function\n",
         "from ..bytecode_transformation import create_call_function, is_suspendable\n"),
        (anchor, anchor + method),
    )
    for old, new in swaps:
        if text.count(old) != 1:
            raise ExportError(f"{path}: expected one {old.strip()!r} to edit, found {text.count(old)}")
        text = text.replace(old, new)
    return text


def wire_functions(text, path, context):
    """Have the functions a context decorates in traced code check each call with ``check_call``.

    In the ``call_function`` of ``WrappedUserFunctionVariable``,
    ``WrappedNestedUserFunctionVariable`` and ``WrappedUserMethodVariable``;
    a skipped function's own wrapper runs eagerly.
    """
    _already(text, path, "check_call")
    check = "        self.context.check_call(self)\n"
    for name in ("WrappedUserMethodVariable", "WrappedUserFunctionVariable", "WrappedNestedUserFunctionVariable"):
        header = f"\nclass {name}("
        if text.count(header) != 1:
            raise ExportError(f"{path}: expected one class {name}, found {text.count(header)}")
        body = text.index(header)
        call = text.find("    ) -> VariableTracker:\n", text.find("    def call_function(\n", body))
        if call < 0 or text.find("\nclass ", body + 1) < call:
            raise ExportError(f"{path}: no call_function in class {name}")
        at = call + len("    ) -> VariableTracker:\n")
        text = text[:at] + check + text[at:]
    return text


def wire_graph_break_registry(text, path, context):
    """Record wire_ctx_manager's graph break in Dynamo's registry, under the next free id."""
    _already(text, path, GRAPH_BREAK["Gb_type"])
    registry = json.loads(text)
    ids = [int(key[2:]) for key in registry if key.startswith("GB") and key[2:].isdigit()]
    if not ids or not text.endswith("\n  ]\n}\n"):
        raise ExportError(f"{path}: expected GBnnnn entries, the file ending in '  ]' and '}}'")
    entry = json.dumps({f"GB{max(ids) + 1:04d}": [GRAPH_BREAK]}, indent=2)
    return text[: -len("\n}\n")] + ",\n" + entry[len("{\n"):] + "\n"


EDITS = {
    "torch/_dynamo/convert_frame.py": wire_convert_frame,
    "test/test_autograd.py": wire_test_imports,
    "torch/csrc/Module.cpp": wire_module_init,
    "build_variables.bzl": wire_build_list,
    "torch/_C/__init__.pyi.in": wire_stubs,
    "torch/_dynamo/trace_rules.py": wire_trace_rules,
    "docs/source/notes/autograd.md": wire_notes_section,
    "torch/_dynamo/variables/ctx_manager.py": wire_ctx_manager,
    "torch/_dynamo/variables/functions.py": wire_functions,
    "torch/_dynamo/graph_break_registry.json": wire_graph_break_registry,
}
