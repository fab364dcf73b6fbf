#!/usr/bin/env python3
"""Write this project's pull request against a PyTorch v2.13.0 tree, as one patch.

Usage::

    python tools/export_pr.py --upstream DIR --out FILE [--skip-missing]

DIR is a PyTorch v2.13.0 source tree: a whole checkout, or a folder holding at
least the files the patch touches (``CONTRIBUTING.md`` says how to make one
from the torch 2.13.0 wheel and the upstream files the search index holds).
FILE gets one commit in ``git format-patch`` form, ready for ``git am
--keep-non-patch`` (which keeps the subject's ``[autograd]``) or
``git apply`` at the root of DIR.  The commit carries:

* the files listed in ``tools/upstream_bound.txt``, as they are in this
  checkout (the two modules replace DIR's; the rest are new files), except
  the sections it lists as ``SECTION -> TARGET``, which are inserted into
  the upstream file TARGET instead (the docs section goes into the autograd
  notes, after the "Grad Modes" material);
* small wiring edits to upstream files, computed against DIR when this runs
  (so that no upstream text is ever kept in this repository): the binding
  registered in ``torch._C`` and in the build, its type stubs, its Dynamo trace
  rules, the new test module's ``TestGradMode*`` classes imported by
  ``test/test_autograd.py``, and the docs section.

The commit message is ``tools/pr_description.md``: the pull request's
description.  A wiring target DIR lacks is an error, unless ``--skip-missing``
exports without that edit (and says so); an anchor DIR's copy lacks is always
an error, naming the file and the line it looked for.
"""

import argparse
import ast
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MANIFEST = os.path.join(ROOT, "tools", "upstream_bound.txt")
DESCRIPTION = os.path.join(ROOT, "tools", "pr_description.md")
STUBS = os.path.join(ROOT, "lint", "upstream", "autograd_mode_state.pyi")
TORCH_VERSION = "2.13"

BINDING_HEADER = "torch/csrc/autograd/python_autograd_mode_state.h"
BINDING_SOURCE = "torch/csrc/autograd/python_autograd_mode_state.cpp"
BINDING_INIT = "torch::autograd::init_autograd_mode_state(module);"
NOTES = "docs/source/notes/autograd.md"
# The new test module's classes that test/test_autograd.py imports (and so runs).
TEST_CLASS_PREFIX = "TestGradMode"
# The upstream modules the patch replaces whole; every other listed file is new.
REPLACED = ("torch/utils/_contextlib.py", "torch/autograd/grad_mode.py")
# Every torch._C name the binding adds; Dynamo's trace rules must know each.
BINDING_NAMES = (
    "torch._C._get_autograd_mode_state",
    "torch._C._swap_autograd_mode_state",
)


class ExportError(Exception):
    """A problem with DIR or with this checkout that stops the export."""


def _entries():
    """Return ``(path, target)`` for each line of ``upstream_bound.txt``; target is None for a file."""
    entries = []
    with open(MANIFEST) as f:
        for number, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            path, arrow, target = (part.strip() for part in line.partition("->"))
            if arrow and not (path and target):
                raise ExportError(f"tools/upstream_bound.txt:{number}: expected 'SECTION -> TARGET', got {line!r}")
            entries.append((path, target or None))
    return entries


def manifest():
    """Return the upstream-bound paths, in the order ``upstream_bound.txt`` lists them (sections included)."""
    return [path for path, _ in _entries()]


def sections():
    """Return ``{section: target}``: the listed files inserted into an upstream file, not carried whole."""
    return {path: target for path, target in _entries() if target}


def carried():
    """Return the listed files the patch carries at their own paths."""
    return [path for path, target in _entries() if not target]


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


def _test_classes(path, root=ROOT):
    """Return the ``TestGradMode*`` classes test module *path* defines, read from its source.

    Every module-level ``Test*`` class must be one of them: another would not
    run upstream, where only what ``test_autograd.py`` imports runs.
    """
    with open(os.path.join(root, path)) as f:
        tree = ast.parse(f.read(), path)
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


def wire_test_imports(text, path):
    """Import the new test modules' ``TestGradMode*`` classes beside ``autograd/test_complex.py``'s."""
    for test in (p for p in carried() if p.startswith("test/autograd/")):
        module = os.path.splitext(os.path.relpath(test, "test"))[0].replace(os.sep, ".")
        _already(text, path, f"from {module} import")
        names = sorted(_test_classes(test))
        if not names:
            raise ExportError(f"{test}: defines no {TEST_CLASS_PREFIX}* class to import")
        taken = sorted(set(names) & _module_names(text, path))
        if taken:
            raise ExportError(f"{path} already defines or imports {', '.join(taken)}, which {test} defines too")
        line = f"from {module} import {', '.join(names)}  # noqa: F401\n"
        if len(line) > 89:
            body = "".join(f"    {name},\n" for name in names)
            line = f"from {module} import (  # noqa: F401\n{body})\n"
        text = _insert_sorted(text, path, r"from autograd\.\w+ import ", line, f"the import of {module}")
    return text


def wire_module_init(text, path):
    """Register the binding in ``torch._C``: include its header, call its init beside the legacy variable's."""
    _already(text, path, BINDING_HEADER)
    text = _insert_sorted(
        text, path, r"#include <torch/csrc/autograd/", f"#include <{BINDING_HEADER}>\n", "the binding's #include"
    )
    anchor = re.compile(r"^(\s*)torch::autograd::init_legacy_variable\(module\);\n", re.M)
    m = anchor.search(text)
    if not m:
        raise ExportError(f"{path}: no line matching {anchor.pattern!r} to put the binding's init after")
    return text[:m.end()] + f"{m.group(1)}{BINDING_INIT}\n" + text[m.end():]


def _in_list(text, path, opener, closer, edit):
    """Apply ``edit`` to the block from ``opener`` to the first ``closer`` after it, only."""
    start = text.find(opener)
    end = text.find(closer, start) if start >= 0 else -1
    if end < 0:
        raise ExportError(f"{path}: no {opener.strip()!r} ... {closer.strip()!r} list to edit")
    return text[:start] + edit(text[start:end]) + text[end:]


def wire_build_list(text, path):
    """Add the binding's source to ``libtorch_python_core_sources``."""
    _already(text, path, BINDING_SOURCE)
    return _in_list(
        text, path, "libtorch_python_core_sources = [", "\n]",
        lambda block: _insert_sorted(
            block, path, r'\s+"torch/csrc/autograd/python_\w+\.cpp",', f'    "{BINDING_SOURCE}",\n',
            "the binding's source in libtorch_python_core_sources",
        ),
    )


def wire_stubs(text, path):
    """Declare the binding's type and functions in a section before ``_set_grad_enabled``'s."""
    with open(STUBS) as f:
        block = f.read().strip("\n") + "\n\n"
    _already(text, path, "_swap_autograd_mode_state")
    anchor = re.compile(r"^# Defined in torch/csrc/autograd/init\.cpp\ndef _set_grad_enabled\(", re.M)
    m = anchor.search(text)
    if not m:
        raise ExportError(f"{path}: no line matching {anchor.pattern!r} to put the binding's stubs before")
    return text[:m.start()] + block + text[m.start():]


def wire_trace_rules(text, path):
    """Make Dynamo graph-break on the binding's functions: map them to ``SkipFunctionVariable``.

    Both change thread-local state and return an opaque object, so they must
    never be put in a graph.  They go in ``manual_torch_name_rule_map`` among
    its other ``"torch._C.<name>": SkipFunctionVariable,`` entries (the first
    run of them, beside ``torch._C._to_dlpack`` upstream), in order.
    """
    for name in BINDING_NAMES:
        _already(text, path, f'"{name}"')

    def edit(block):
        for name in BINDING_NAMES:
            block = _insert_sorted(
                block, path, r'\s+"torch\._C\.[\w.]+": SkipFunctionVariable,$',
                f'    "{name}": SkipFunctionVariable,\n',
                f"the skip rule of {name} in manual_torch_name_rule_map",
            )
        return block

    return _in_list(text, path, "manual_torch_name_rule_map: ", "\n}", edit)


def wire_notes_section(text, path):
    """Insert the docs sections that target the autograd notes after their "Grad Modes" material.

    That material is "Grad Modes" and one subsection per mode, "Inference Mode"
    the last: a section goes before the heading (and its label, if any) that
    follows "Inference Mode", or at the end of the file.
    """
    for section in (s for s, target in sections().items() if target == path):
        block = _read(os.path.join(ROOT, section), section).strip("\n") + "\n"
        _already(text, path, block.splitlines()[0])
        start = re.search(r"^### Inference Mode[ \t]*\n", text, re.M)
        if not start:
            raise ExportError(f"{path}: no '### Inference Mode' heading to put {section} after its subsection")
        heading = re.compile(r"^#{1,3} ", re.M).search(text, start.end())
        at = heading.start() if heading else len(text)
        label = re.search(r"^\([\w-]+\)=\n\s*\Z", text[start.end():at], re.M)
        if label:
            at = start.end() + label.start()
        # Only added lines: a blank line before the section and after it, as between upstream's.
        head, tail = text[:at], text[at:]
        gap = "" if head.endswith("\n\n") else "\n" if head.endswith("\n") else "\n\n"
        text = head + gap + block + ("\n" + tail if tail else "")
    return text


WIRING = {
    "test/test_autograd.py": wire_test_imports,
    "torch/csrc/Module.cpp": wire_module_init,
    "build_variables.bzl": wire_build_list,
    "torch/_C/__init__.pyi.in": wire_stubs,
    "torch/_dynamo/trace_rules.py": wire_trace_rules,
    NOTES: wire_notes_section,
}


# Git's settings a user or a hook may have (diff.noprefix, format.signOff,
# commit.gpgsign, GIT_DIR, ...) change or break the patch: run git with none.
_GIT_CONFIG = ("-c", "core.autocrlf=false", "-c", "core.abbrev=12", "-c", "diff.context=3",
               "-c", "diff.algorithm=myers", "-c", "commit.gpgsign=false", "-c", "i18n.commitEncoding=UTF-8")


def _git_env(extra=None):
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1", LC_ALL="C")
    env.update(extra or {})
    return env


def _git(cwd, *args, env=None):
    proc = subprocess.run(["git", *_GIT_CONFIG, *args], cwd=cwd, capture_output=True, env=env or _git_env())
    if proc.returncode:
        detail = (proc.stderr or proc.stdout).decode(errors="replace").strip() or f"exit status {proc.returncode}"
        raise ExportError(f"git {args[0]} failed: {detail}")
    return proc.stdout


def _read(path, label):
    """Return a file's text, refusing what the export cannot reproduce byte for byte."""
    with open(path, "rb") as f:
        data = f.read()
    if b"\r\n" in data:
        raise ExportError(
            f"{label} has CRLF line endings; PyTorch's files use LF (check DIR out with core.autocrlf=false)"
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ExportError(f"{label} is not UTF-8 text ({e.reason} at byte {e.start})") from None


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(text.encode("utf-8"))


def check_tree(upstream):
    """Refuse a DIR that is not a PyTorch tree, or one of another version."""
    if not upstream:
        raise ExportError("--upstream is empty: give the PyTorch tree's directory")
    if not os.path.exists(upstream):
        raise ExportError(f"--upstream {upstream}: no such directory")
    if not os.path.isdir(upstream):
        raise ExportError(f"--upstream {upstream}: not a directory")
    if not os.path.isfile(os.path.join(upstream, "torch", "utils", "_contextlib.py")):
        raise ExportError(f"--upstream {upstream}: not a PyTorch tree (no torch/utils/_contextlib.py)")
    versions = (
        ("version.txt", r"\A\s*(\S+)"),
        ("torch/version.py", r"__version__\s*(?::\s*\w+\s*)?=\s*['\"]([^'\"]+)"),
    )
    for name, pattern in versions:
        where = os.path.join(upstream, name)
        if os.path.isfile(where):
            m = re.search(pattern, _read(where, f"--upstream {upstream}: {name}"))
            if not m:
                raise ExportError(f"--upstream {upstream}: {name} names no version")
            if not re.match(re.escape(TORCH_VERSION) + r"(\.|$)", m.group(1)):
                raise ExportError(
                    f"--upstream {upstream}: PyTorch {m.group(1)} ({name}); this patch is for v{TORCH_VERSION}"
                )


def check_out(out):
    """Refuse an --out the patch cannot be written to, before any work is done."""
    if not out:
        raise ExportError("--out is empty: give the file to write the patch to")
    if os.path.isdir(out):
        raise ExportError(f"--out {out} is a directory; give a file name")
    folder = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(folder):
        raise ExportError(f"--out {out}: no such directory {folder}")
    if not os.access(folder, os.W_OK) or (os.path.exists(out) and not os.access(out, os.W_OK)):
        raise ExportError(f"--out {out}: not writable")


def check_base(upstream, files):
    """Refuse a DIR that already carries part of the patch, or lacks a module it replaces."""
    for path in files:
        theirs = os.path.join(upstream, path)
        if path in REPLACED:
            if not os.path.isfile(theirs):
                raise ExportError(f"--upstream {upstream} lacks {path}, which the patch replaces")
            if _read(theirs, path) == _read(os.path.join(ROOT, path), path):
                raise ExportError(f"--upstream {upstream}: {path} is already this checkout's: DIR carries the patch")
        elif os.path.exists(theirs):
            raise ExportError(
                f"--upstream {upstream} already has {path}, which the patch adds: DIR carries (part of) it"
            )


def export(upstream, out, skip_missing=False):
    """Write the patch; return the wiring targets skipped for want of a file in DIR."""
    check_tree(upstream)
    check_out(out)
    upstream = os.path.abspath(upstream)
    for path in manifest():
        if not os.path.isfile(os.path.join(ROOT, path)):
            raise ExportError(f"{path} is listed in tools/upstream_bound.txt but this checkout has no such file")
    for section, target in sections().items():
        if target not in WIRING:
            raise ExportError(f"tools/upstream_bound.txt: {section} -> {target}: the export cannot insert there")
    files = carried()
    check_base(upstream, files)
    missing = [p for p in WIRING if not os.path.isfile(os.path.join(upstream, p))]
    if missing and not skip_missing:
        raise ExportError(
            f"--upstream {upstream} lacks {', '.join(missing)}, which the patch edits "
            "(use a fuller tree, or --skip-missing to export without those edits)"
        )
    env = _git_env(_identity())
    with tempfile.TemporaryDirectory() as work:
        # The base commit holds DIR's copy of every file the patch changes.
        wired = [p for p in WIRING if p not in missing]
        for path in [*REPLACED, *wired]:
            _write(os.path.join(work, path), _read(os.path.join(upstream, path), f"--upstream {upstream}: {path}"))
        _git(work, "init", "-q", env=env)
        _git(work, "add", "-A", env=env)
        _git(work, "commit", "-q", "-m", "base", env=env)
        for path in files:
            _write(os.path.join(work, path), _read(os.path.join(ROOT, path), path))
        for path in wired:
            _write(os.path.join(work, path), WIRING[path](_read(os.path.join(work, path), path), path))
        _git(work, "add", "-A", env=env)
        _git(work, "commit", "-q", "--cleanup=verbatim", "-F", DESCRIPTION, env=env)
        patch = _git(work, "format-patch", "-1", "--stdout", "--no-signature", "--no-numbered", "HEAD", env=env)
    try:
        with open(out, "wb") as f:
            f.write(patch)
    except OSError as e:
        raise ExportError(f"--out {out}: {e.strerror}") from None
    return missing


def _identity():
    """Author and dates of the commit: this checkout's HEAD, so that an export is reproducible."""
    proc = subprocess.run(
        ["git", "log", "-1", "--format=%an%n%ae%n%aI"], cwd=ROOT, capture_output=True, text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("GIT_")},
    )
    fields = proc.stdout.splitlines() if proc.returncode == 0 else []
    if len(fields) != 3:
        raise ExportError(f"cannot read this checkout's HEAD commit (its author and date sign the patch): "
                          f"{proc.stderr.strip() or 'not a git checkout'}")
    name, email, date = fields
    return {
        "GIT_AUTHOR_NAME": name, "GIT_AUTHOR_EMAIL": email, "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_NAME": name, "GIT_COMMITTER_EMAIL": email, "GIT_COMMITTER_DATE": date,
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, metavar="DIR", help="a PyTorch v2.13.0 tree")
    parser.add_argument("--out", required=True, metavar="FILE", help="where to write the patch")
    parser.add_argument(
        "--skip-missing", action="store_true", help="export without the wiring edits of files DIR lacks"
    )
    args = parser.parse_args(argv)
    try:
        skipped = export(args.upstream, args.out, args.skip_missing)
    except ExportError as e:
        print(f"export_pr: error: {e}", file=sys.stderr)
        return 2
    for path in skipped:
        print(f"export_pr: {path} not in --upstream: exported without its wiring edit", file=sys.stderr)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", *manifest(), os.path.relpath(DESCRIPTION, ROOT)],
        cwd=ROOT, capture_output=True, text=True,
    ).stdout.split("\n")
    for line in filter(None, dirty):
        print(f"export_pr: warning: exported {line[3:]} with uncommitted changes", file=sys.stderr)
    print(f"export_pr: wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
