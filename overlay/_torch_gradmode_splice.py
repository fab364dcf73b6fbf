"""Build the patched upstream files from upstream's text and the project's pieces.

The project commits no upstream text.  For each upstream Python module the
patch changes it holds, at the upstream path, a *fragment*: only the
definitions (functions, classes, class members, module-level names) the patch
adds or replaces, and the imports they need.  Everything else is an *anchored
edit* (``EDITS``): a function of the target file's text, written against
anchors that upstream's text must contain.  ``stack/series`` orders the pieces
into the steps of the pull request.  The install (over the wheel's files), the
export (over a PyTorch tree), the linters and the per-step checks all build
with :func:`build`.

Rules the splice keeps:

* every byte of the upstream file outside the replaced definitions stays;
* a replaced definition keeps upstream's docstring (a fragment docstring that
  starts with ``.. versionchanged::`` is appended to it; any other is refused);
* a call written ``f(...)`` in a replaced definition is upstream's n-th call
  of ``f`` in that definition, copied whole: its messages stay upstream's;
* a class in a fragment is merged member by member, so the class's docstring
  and the members the patch does not touch stay upstream's;
* a new definition goes after the fragment's previous one present in the file,
  else before its next one, else at the end;
* a name a fragment imports is imported only once a spliced definition uses it,
  and a name upstream imports is dropped once the splice has replaced its last use.
"""

import ast
import hashlib
import io
import os
import re
import sys
import tokenize

TORCH_VERSION = "2.13.0"

# sha256 of torch 2.13.0's copy of each upstream file the splice reads whole
# (the wheel ships them as in the source tree).  The tree-only targets of
# anchored edits (Module.cpp, build_variables.bzl, ...) have no known 2.13.0
# copy here: their anchors are checked instead.
UPSTREAM_SHA256 = {
    "torch/autograd/grad_mode.py": "ddc32c2cc2dfa5e2320f8c8e75b7d048c7661c58e1c9f7304914a22744e2177f",
    "torch/utils/_contextlib.py": "87ddcd20996e0eef4d91c73a72bf943a49d4a76acc6f01174b101a599cc618ac",
    "torch/_dynamo/bytecode_transformation.py": "c9710c7e374c3635a865a3b4ae82480f38cb20330163dc153b0c377abab7ef8e",
    "torch/_dynamo/convert_frame.py": "ca21a952feec825550c3716a95879e9196719718f18cce6238ae6d32139023b9",
    "torch/_dynamo/trace_rules.py": "380d4eee07f0b7e8c2b2e108d36de99f629ddd7c412ed1797bf9f584e07d577c",
    "torch/_dynamo/variables/ctx_manager.py": "2100052a1fc4f64020b187e8cc4080a0e75cceccc78b34402e4ce011663c32fc",
    "torch/_dynamo/variables/functions.py": "c17a1c4aa92ef31f4446314afb3375c073eecb77321097da0cc5c9e6d1dc3621",
    "torch/_dynamo/graph_break_registry.json": "04486a58e13279894d79d48ae15d7c54c1c33dcc9bd7b300c5922d76e97ed9ab",
    "torch/amp/autocast_mode.py": "54977895416574f0d0dee4b1152be1d805bfb71af882d2f2bbcfe8fa65d262bb",
    "torch/cpu/amp/autocast_mode.py": "5c2f0a69cd1729211116ba7c39cdd6d46efbfdc3aaad1b86ff33962a3b9af392",
    "torch/cuda/amp/autocast_mode.py": "b1584cd968d67055c73a9fbfea5e727056473947d2b2a4b979ed12b012128187",
}


class SpliceError(Exception):
    """Upstream's text or the project's pieces do not fit together."""


# -- Steps


class Step:
    """One pull request of the stack: ``stack/<name>/step`` read."""

    def __init__(self, root, name):
        self.root, self.name = root, name
        self.folder = os.path.join(root, "stack", name)
        self.defines, self.new, self.edits, self.exempt = {}, [], [], None
        where = os.path.join(self.folder, "step")
        with open(where) as f:
            for number, line in enumerate(f, 1):
                words = line.split("#", 1)[0].split()
                if not words:
                    continue
                verb, args = words[0], words[1:]
                if verb == "define" and len(args) >= 2:
                    self.defines.setdefault(args[0], []).extend(args[1:])
                elif verb == "new" and len(args) == 1:
                    self.new.append(args[0])
                elif verb == "edit" and len(args) == 1:
                    self.edits.append(args[0])
                elif verb == "exempt" and args:
                    self.exempt = " ".join(args)
                else:
                    raise SpliceError(f"{where}:{number}: cannot read {line.strip()!r}")

    def source(self, path):
        """This step's version of project file *path*: its own copy, else the checkout's."""
        own = os.path.join(self.folder, path)
        return own if os.path.isfile(own) else os.path.join(self.root, path)

    @property
    def tests(self):
        return [p for p in self.new if p.startswith("test/") and p.endswith(".py")]

    def description(self):
        return _read(os.path.join(self.folder, "DESCRIPTION.md"))


def series(root):
    """Return the steps of ``stack/series``, in order."""
    with open(os.path.join(root, "stack", "series")) as f:
        return [Step(root, name) for name in (line.strip() for line in f) if name and not name.startswith("#")]


def inputs(root):
    """Every project file a build may read (for cache keys)."""
    here = os.path.dirname(os.path.abspath(__file__))
    found = {os.path.join(here, name) for name in ("_torch_gradmode_splice.py", "_torch_gradmode_edits.py")}
    found |= {os.path.join(root, "stack", "series"), os.path.join(root, "lint", "upstream", "autograd_mode_state.pyi")}
    for step in series(root):
        found.add(os.path.join(step.folder, "step"))
        for path in [*step.defines, *step.new]:
            found.update({step.source(path), os.path.join(root, path)})
    return sorted(p for p in found if os.path.isfile(p))


# -- Fragments


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def _name(node):
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return node.name
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        return node.targets[0].id
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return node.target.id
    return None


def _docstring(node):
    body = getattr(node, "body", None)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        if isinstance(body[0].value.value, str):
            return body[0]
    return None


def _start(node, lines, comments):
    """First line (0-based) of *node*: its decorators, and its comment lines above if *comments*."""
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]) - 1
    while comments and start > 0 and lines[start - 1].strip().startswith("#"):
        start -= 1
    return start


class Piece:
    """One definition of a fragment: its text (comments above included) and parsed node."""

    def __init__(self, node, lines, members=None):
        self.node, self.name = node, _name(node)
        self.first = _start(node, lines, True)  # the 0-based fragment line its text starts at
        self.text = "".join(lines[self.first : node.end_lineno])
        self.members = members  # {name: Piece} of a class, else None
        # ``def f(...): ...`` stands for upstream's f: it only says where the pieces around it go.
        body = getattr(node, "body", None) or []
        self.stub = (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and len(body) == 1
            and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            and body[0].value.value is Ellipsis
        )


def read_fragment(path):
    """Return ``({name: Piece}, [import nodes])`` of fragment *path*, in file order."""
    text = _read(path)
    lines = text.splitlines(keepends=True)
    pieces, imports = {}, []
    for node in ast.parse(text, path).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.append(node)
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue  # the fragment's own docstring
        name = _name(node)
        if name is None:
            raise SpliceError(f"{path}:{node.lineno}: a fragment holds definitions and imports only")
        members = None
        if isinstance(node, ast.ClassDef):
            members = {}
            for member in node.body:
                if member is _docstring(node):
                    continue
                if _name(member) is None:
                    raise SpliceError(f"{path}:{member.lineno}: class {name} holds definitions only")
                members[_name(member)] = Piece(member, lines)
        pieces[name] = Piece(node, lines, members)
    return pieces, imports


def fragment_names(path):
    """The top-level names fragment *path* defines (a class of upstream's stands for its members)."""
    return [name for name, piece in read_fragment(path)[0].items() if not piece.stub]


# -- Splicing one module


def _nodes(text, path):
    try:
        return ast.parse(text, path).body
    except SyntaxError as e:
        raise SpliceError(f"{path}: not valid Python after splicing ({e.msg}, line {e.lineno})") from None


def _find(body, name, path):
    found = [n for n in body if _name(n) == name]
    if len(found) > 1:
        raise SpliceError(f"{path}: {name} is defined {len(found)} times; the splice cannot tell which to replace")
    return found[0] if found else None


def _header_end(text):
    """Index of the line (0-based) that ends a def's or class's header in *text*."""
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.NEWLINE:
            return tok.start[0] - 1
    raise SpliceError(f"no header in {text[:60]!r}")


_VERSIONCHANGED = ".. versionchanged::"


def _with_docstring(piece, old, lines, path, qualname):
    """*piece*'s text carrying upstream definition *old*'s docstring (*old*: ``(node, lines)`` or None)."""
    old, lines = old if old is not None else (None, lines)
    theirs, ours = _docstring(old) if old is not None else None, _docstring(piece.node)
    appended = ours is not None and ours.value.value.strip().startswith(_VERSIONCHANGED)
    if theirs is None or (ours is not None and not appended):
        if old is not None:
            piece = _Text(piece, "".join(_with_calls(piece, old, lines, path, qualname)))
        if theirs is not None:
            raise SpliceError(f"{path}: {qualname} would rewrite upstream's docstring (only append a "
                              f"'{_VERSIONCHANGED}' paragraph)")
        if appended:
            raise SpliceError(f"{path}: {qualname} has no upstream docstring to append {_VERSIONCHANGED} to")
        return piece.text
    doc = "".join(lines[theirs.lineno - 1 : theirs.end_lineno])
    own = _with_calls(piece, old, lines, path, qualname)
    def_at = piece.node.lineno - 1 - piece.first
    head = def_at + _header_end("".join(own[def_at:]))
    if appended:
        first, last = ours.lineno - 1 - piece.first, ours.end_lineno - piece.first
        indent = re.match(r"[ \t]*", own[first]).group(0)
        body = _docstring_text("".join(own[first:last]), ours.col_offset)
        stripped = doc.rstrip()
        quote, inner = stripped[-3:], stripped[:-3].rstrip()
        doc = f"{inner}\n\n" + "".join(f"{indent}{line}".rstrip() + "\n" for line in body) + f"{indent}{quote}\n"
        own = own[:first] + own[last:]
    rest = "".join(own[head + 1 :])
    if re.match(r"[ \t]*(def|class|async def|@)\b", rest):
        doc += "\n"  # a nested definition is set off from the docstring, as ruff formats it
    return "".join(own[: head + 1]) + doc + rest


class _Text:
    """*piece* with another text of the same first lines."""

    def __init__(self, piece, text):
        self.__dict__.update(piece.__dict__)
        self.text = text


def _calls(node):
    """The calls and assignments in *node*, in source order, by their callee's or targets' source."""
    found = {}
    nodes = (n for n in ast.walk(node) if isinstance(n, (ast.Call, ast.Assign)))
    for n in sorted(nodes, key=lambda n: (n.lineno, n.col_offset)):
        key = ast.unparse(n.func) if isinstance(n, ast.Call) else " = ".join(map(ast.unparse, n.targets)) + " ="
        found.setdefault(key, []).append(n)
    return found


def _is_ellipsis(node):
    return isinstance(node, ast.Constant) and node.value is Ellipsis


def _with_calls(piece, old, lines, path, qualname):
    """*piece*'s lines, each call written ``f(...)`` being upstream's same call (its n-th of ``f``), whole.

    So a replaced definition keeps upstream's messages where it raises or
    warns as upstream does, without the project writing them.  An assignment
    written ``x = ...`` is upstream's n-th assignment to ``x``, whole, alike.
    """
    own = piece.text.splitlines(keepends=True)
    theirs = _calls(old)
    marked = [
        (name, n, call)
        for name, calls in _calls(piece.node).items()
        for n, call in enumerate(calls)
        if isinstance(call, ast.Assign) and _is_ellipsis(call.value)
        or isinstance(call, ast.Call) and len(call.args) == 1 and not call.keywords and _is_ellipsis(call.args[0])
    ]
    for name, n, call in sorted(marked, key=lambda m: (m[2].lineno, m[2].col_offset), reverse=True):
        if n >= len(theirs.get(name, ())):
            what = f"assignment {n + 1} to {name[:-2]}" if isinstance(call, ast.Assign) else f"call {n + 1} of {name}"
            raise SpliceError(f"{path}: {qualname}: upstream's definition has no {what} to copy")
        up = theirs[name][n]
        source = "".join(lines[up.lineno - 1 : up.end_lineno])
        source = source[up.col_offset : len(source) - len(lines[up.end_lineno - 1]) + up.end_col_offset]
        shift = call.col_offset - up.col_offset
        first, *rest = source.splitlines(keepends=True)
        source = first + "".join(" " * shift + line if shift >= 0 else line[-shift:] for line in rest)
        at, end = call.lineno - 1 - piece.first, call.end_lineno - 1 - piece.first
        own[at : end + 1] = (own[at][: call.col_offset] + source + own[end][call.end_col_offset :]).splitlines(
            keepends=True
        )
    return own


def _docstring_text(source, cut):
    """The lines of a docstring written in *source* at column *cut*, dedented by it."""
    lines = ast.literal_eval(source.strip()).rstrip().strip("\n").splitlines()
    return [lines[0].strip()] + [line[cut:] for line in lines[1:]]


def _insert_at(text, line, block):
    lines = text.splitlines(keepends=True)
    return "".join(lines[:line]) + block + "".join(lines[line:])


def _place(text, body, order, name, block, gap, path, class_doc=None):
    """Insert *block* (a new definition) by the fragment order *order*; return the new text."""
    lines = text.splitlines(keepends=True)
    at = order.index(name)
    assign = (ast.Assign, ast.AnnAssign)
    for before in reversed(order[:at]):
        node = _find(body, before, path)
        if node is not None:
            # Class attributes in a row, as upstream writes them, without blank lines.
            together = class_doc is not None and isinstance(node, assign) and block.lstrip().split()[0] != "def"
            return _insert_at(text, node.end_lineno, ("" if together else gap) + block)
    if class_doc is not None:  # first of the class's new members: after its docstring
        return _insert_at(text, class_doc, gap + block)
    for after in order[at + 1 :]:
        node = _find(body, after, path)
        if node is not None:
            return _insert_at(text, _start(node, lines, True), block + gap)
    return text.rstrip("\n") + "\n" + gap + block


def _splice_member(text, cls_name, piece, order, path, base):
    lines = text.splitlines(keepends=True)
    cls = _find(_nodes(text, path), cls_name, path)
    if not isinstance(cls, ast.ClassDef):
        raise SpliceError(f"{path}: no class {cls_name} to put {cls_name}.{piece.name} in")
    old = _find(cls.body, piece.name, path)
    if old is not None:
        theirs = _upstream(base, path, cls_name, piece.name)
        new = _with_docstring(piece, theirs, lines, path, f"{cls_name}.{piece.name}")
        return "".join(lines[: _start(old, lines, False)]) + new + "".join(lines[old.end_lineno :])
    doc = _docstring(cls)
    first = doc.end_lineno if doc is not None else _header_end("".join(lines[cls.lineno - 1 :])) + cls.lineno
    members = [m for m in cls.body if m is not doc]
    return _place(text, members, order, piece.name, piece.text, "\n", path, class_doc=first)


def _upstream(base, path, *qualname):
    """``(node, lines)`` of definition *qualname* in upstream's text *base*, or None."""
    body = _nodes(base, path)
    for name in qualname:
        node = _find(body, name, path)
        if node is None:
            return None
        body = getattr(node, "body", [])
    return node, base.splitlines(keepends=True)


def _splice_definition(text, piece, order, path, base):
    body = _nodes(text, path)
    lines = text.splitlines(keepends=True)
    old = _find(body, piece.name, path)
    if old is None:
        return _place(text, body, order, piece.name, piece.text, "\n\n", path)
    if isinstance(old, ast.ClassDef) != isinstance(piece.node, ast.ClassDef):
        raise SpliceError(f"{path}: {piece.name} is a class in one of upstream and the fragment only")
    new = _with_docstring(piece, _upstream(base, path, piece.name), lines, path, piece.name)
    return "".join(lines[: _start(old, lines, False)]) + new + "".join(lines[old.end_lineno :])


# -- Imports


def _section(module):
    top = module.split(".")[0]
    if top == "torch":
        return 2
    return 0 if top in sys.stdlib_module_names or top == "typing_extensions" else 1


def _key(node):
    if isinstance(node, ast.ImportFrom) and node.level:  # relative imports: a section of their own, last
        return (3, True, "." * node.level + (node.module or ""))
    module = node.module if isinstance(node, ast.ImportFrom) else node.names[0].name
    return (_section(module), isinstance(node, ast.ImportFrom), module.lower())


def _from_import(module, names, multiline):
    names = sorted(set(names), key=str.lower)
    one = f"from {module} import {', '.join(names)}\n"
    if len(one) <= 89 and not multiline:
        return one
    return f"from {module} import (\n" + "".join(f"    {n},\n" for n in names) + ")\n"


def _bound(alias):
    return alias.asname or alias.name.split(".")[0]


def _import(text, node, alias, path):
    """Make module *text* import what fragment import *node*'s *alias* binds, unless it does."""
    body = _nodes(text, path)
    imports = [n for n in body if isinstance(n, (ast.Import, ast.ImportFrom)) and n.col_offset == 0]
    for n in imports:
        if type(n) is type(node) and getattr(n, "module", None) == getattr(node, "module", None):
            if any(a.name == alias.name and a.asname == alias.asname for a in n.names):
                return text
    lines = text.splitlines(keepends=True)
    if isinstance(node, ast.ImportFrom):
        for n in imports:
            if isinstance(n, ast.ImportFrom) and n.module == node.module and not any(a.asname for a in n.names):
                names = [a.name for a in n.names] + [alias.name]
                block = _from_import(n.module, names, n.end_lineno > n.lineno)
                return "".join(lines[: n.lineno - 1]) + block + "".join(lines[n.end_lineno :])
        block = _from_import(node.module, [alias.name], False)
    else:
        block = f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else "") + "\n"
    new = ast.parse(block).body[0]
    later = [n for n in imports if _key(n) > _key(new)]
    if later and _key(later[0])[0] == _key(new)[0]:
        return _insert_at(text, later[0].lineno - 1, block)
    earlier = [n for n in imports if _key(n) <= _key(new)]
    if not earlier:
        raise SpliceError(f"{path}: no import block to add {block.strip()!r} to")
    gap = "\n" if _key(earlier[-1])[0] != _key(new)[0] else ""  # a section of its own
    return _insert_at(text, earlier[-1].end_lineno, gap + block)


def _uses(text, name):
    return re.search(rf"(?<![\w.]){re.escape(name)}\b", text) is not None


# -- Building


def splice(text, path, fragment, names, used="", base=None):
    """Splice the definitions *names* (qualified) of *fragment* into upstream module *text*.

    *used* is the text of the definitions spliced into this module by earlier
    steps: a fragment import is added once any spliced definition uses it.
    *base* is upstream's text (default: *text*): replaced definitions keep its docstrings.
    """
    base = text if base is None else base
    pieces, imports = fragment
    order = list(pieces)
    for qualname in names:
        top, _, member = qualname.partition(".")
        piece = pieces.get(top)
        if piece is None or (member and (piece.members is None or member not in piece.members)):
            raise SpliceError(f"{path}: the fragment defines no {qualname}")
        if (piece.members[member] if member else piece).stub:
            raise SpliceError(f"{path}: {qualname} is a placeholder in the fragment, not a definition")
        if member:
            members = piece.members
            cls = _find(_nodes(text, path), top, path)
            if cls is None:
                raise SpliceError(f"{path}: {qualname}: upstream has no class {top} (define the whole class)")
            text = _splice_member(text, top, members[member], list(members), path, base)
            used += members[member].text
        elif piece.members is not None and _find(_nodes(text, path), top, path) is not None:
            for name, member in piece.members.items():  # upstream's class: every member given
                if not member.stub:
                    text = _splice_member(text, top, member, list(piece.members), path, base)
                    used += member.text
        else:
            text = _splice_definition(text, piece, order, path, base)
            used += piece.text
    for node in imports:
        for alias in node.names:
            if _uses(used, _bound(alias)):
                text = _import(text, node, alias, path)
    return _drop_unused(text, base, path), used


def _code(text, path):
    """*text* without its top-level import statements."""
    lines = text.splitlines(keepends=True)
    for node in reversed(_nodes(text, path)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            del lines[node.lineno - 1 : node.end_lineno]
    return "".join(lines)


def _drop_unused(text, base, path):
    """Remove the names upstream imports and uses whose every use the splice replaced."""
    before, after = _code(base, path), _code(text, path)
    for node in reversed(_nodes(text, path)):
        if not isinstance(node, (ast.Import, ast.ImportFrom)) or node.col_offset:
            continue
        keep = [a for a in node.names if not (_uses(before, _bound(a)) and not _uses(after, _bound(a)))]
        if len(keep) == len(node.names):
            continue
        lines = text.splitlines(keepends=True)
        if not keep:
            block = ""
        elif isinstance(node, ast.ImportFrom) and not any(a.asname for a in keep):
            block = _from_import(node.module, [a.name for a in keep], node.end_lineno > node.lineno)
        else:
            raise SpliceError(f"{path}:{node.lineno}: cannot drop the unused names of this import")
        text = "".join(lines[: node.lineno - 1]) + block + "".join(lines[node.end_lineno :])
    return text


def _overlaid(final, own, where):
    """The final fragment's pieces, with a step's own versions of some of them in their place."""
    pieces = dict(final)
    for name, piece in own.items():
        if name not in final or (piece.members is None) != (final[name].members is None):
            raise SpliceError(f"{where}: {name} is not a definition of the same kind in the checkout's fragment")
        if piece.members is None:
            pieces[name] = piece
            continue
        unknown = set(piece.members) - set(final[name].members)
        if unknown:
            raise SpliceError(f"{where}: {name}.{', '.join(sorted(unknown))} not in the checkout's fragment")
        # A class new to the module goes in whole, as this step writes it; an
        # upstream one member by member.
        merged = Piece.__new__(Piece)
        merged.__dict__.update(piece.__dict__)
        merged.members = {**final[name].members, **piece.members}
        pieces[name] = merged
    return pieces


def check_upstream(path, text):
    """Refuse upstream text that is not torch 2.13.0's."""
    want = UPSTREAM_SHA256.get(path)
    got = hashlib.sha256(text.encode()).hexdigest()
    if want is not None and got != want:
        raise SpliceError(f"{path} is not torch {TORCH_VERSION}'s (sha256 {got[:12]}, expected {want[:12]}): "
                          f"this patch splices into {TORCH_VERSION} only")


def build(root, steps, read, edits=None, missing=None, only=None):
    """Apply *steps* to the upstream files *read(path)* returns; return ``{path: text}`` changed or new.

    *read* returns None for a file the target lacks: an anchored edit of it is
    skipped (and its path added to *missing*, if given); a definition in it is an error.
    With *only*, a predicate on paths, new files and edits of other paths are left out.
    """
    from _torch_gradmode_edits import EDITS  # noqa: PLC0415

    edits = EDITS if edits is None else edits
    out, used, newest, upstream, edited = {}, {}, {}, {}, set()

    def current(path):
        if path not in out:
            text = read(path)
            if text is None:
                return None
            check_upstream(path, text)
            out[path] = upstream[path] = text
        return out[path]

    for step in steps:
        for path, names in step.defines.items():
            text = current(path)
            if text is None:
                raise SpliceError(f"the target lacks {path}, which step {step.name} changes")
            fragment = read_fragment(os.path.join(root, path))
            if step.source(path) != os.path.join(root, path):  # this step's own versions of some
                own = read_fragment(step.source(path))
                fragment = (_overlaid(fragment[0], own[0], step.source(path)), own[1] + fragment[1])
            out[path], used[path] = splice(text, path, fragment, names, used.get(path, ""), upstream[path])
        for path in step.new:
            newest[path] = step.source(path)
            if only is not None and not only(path):
                continue
            if not os.path.isfile(newest[path]):
                raise SpliceError(f"stack/{step.name}/step: new file {path} is not in this checkout")
            out[path] = _read(newest[path])
        # "source": the step's version of a project file; "edited": paths an earlier step edited.
        context = {"root": root, "new": newest, "step_new": step.new, "source": step.source, "edited": set(edited)}
        for path in step.edits:
            if path not in edits:
                raise SpliceError(f"step {step.name}: no anchored edit for {path}")
            if only is not None and not only(path):
                continue
            text = current(path)
            if text is None:
                if missing is not None:
                    missing.append(path)
                continue
            out[path] = edits[path](text, path, context)
            edited.add(path)
    return out


def build_install(root, read, edits=None):
    """What the install builds: every fragment whole, every new file and edit of the stack."""
    steps = series(root)
    merged = Step.__new__(Step)
    merged.root, merged.name, merged.folder = root, "install", os.path.join(root, "stack", "install")
    merged.defines, merged.new, merged.edits, merged.exempt = {}, [], [], None
    for step in steps:
        for path in step.defines:
            merged.defines.setdefault(path, fragment_names(os.path.join(root, path)))
        merged.new += [p for p in step.new if p not in merged.new]
        merged.edits += [p for p in step.edits if p not in merged.edits]
    return build(root, [merged], read, edits)
