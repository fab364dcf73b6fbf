"""flake8 plugin: suspension points inside thread-state ``with`` blocks (``TGM``).

Grad mode, inference mode, autograd's other flags and autocast are
thread-local.  A generator, coroutine or async generator that suspends --
``yield``, ``yield from``, ``await``, ``async for``, ``async with`` -- while a
``with`` block of its own that sets such state is open hands the thread to its
caller, or to other tasks on the event loop, with the block's state still in
force: the state leaks out, and the caller's leaks in.  With this patch a
decorator form carries the state its own ``with`` block sets: it switches the
body's state in only while the body runs (see
``docs/project/notes/grad_mode_suspend.md``).  It carries nothing else, so a
block setting other state still leaks from a decorated body.

Codes:

* ``TGM001`` -- ``yield`` or ``yield from`` inside such a block, in a body with
  none of the decorators below.
* ``TGM002`` -- ``await``, ``async for`` or ``async with`` inside one, in such a
  body.
* ``TGM003`` -- ``yield`` or ``yield from`` inside such a block, in a body with
  some of the decorators below that, together, do not carry all the block
  sets.  The message names the decorator that would carry it.
* ``TGM004`` -- ``await``, ``async for`` or ``async with`` inside one, in such a
  body.

Blocks, and what the decorator of the same name carries:

* ``torch.no_grad``, ``torch.enable_grad``, ``torch.set_grad_enabled``: grad
  mode.
* ``torch.autograd.set_multithreading_enabled``: the multithreading flag.
* ``torch.autograd.grad_mode.enforce_grad_layout_policy``: the
  layout-enforcement flag.
* ``torch.autograd.grad_mode._force_original_view_tracking``: the view-replay
  flag.
* ``torch.inference_mode``: the whole autograd state, grad mode and the three
  flags above included (what ``c10::InferenceMode`` sets).
* ``torch.autocast`` and ``torch.amp.autocast`` (the device type their first
  argument or ``device_type=``), ``torch.cpu.amp.autocast`` (cpu),
  ``torch.cuda.amp.autocast`` (cuda): that device type's autocast state only.

A body keeps a block open across its suspension points when its decorators,
together, carry everything the block sets: ``with torch.no_grad():`` in an
``@torch.enable_grad()`` body, ``with torch.enable_grad():`` in an
``@torch.inference_mode()`` one.  Any other decorator carries nothing.

What counts:

* The ``with``/``async with`` item must be a *call* of one of the names above,
  reached through the modules that define or export it (``torch``,
  ``torch.autograd``, ``torch.autograd.grad_mode``, ``torch.amp``,
  ``torch.amp.autocast_mode``, ``torch.cpu.amp``, ``torch.cuda.amp``, ...).  A
  decorator may be the call or the bare name (``@torch.no_grad``).  Import
  aliases are resolved statically, module-wide (``import torch as t``,
  ``from torch import no_grad as ng``, ``from torch.autograd import grad_mode``,
  ...); rebinding such a name later, or a context manager kept in a variable
  (``ctx = torch.no_grad(); with ctx:``), is not followed.
* An autocast device type that is not a string literal (a variable, ``*args``,
  a bare ``@torch.autocast``) is unknown, and the conservative choice is taken:
  no decorator carries a block of unknown device type, and a decorator of
  unknown device type carries no block, so such a block is reported (silence it
  with ``# noqa: TGM003`` where the device types are known to agree).
* Suspending inside nested blocks reports the innermost block the body does
  not carry, once.
* Items of the same ``with`` statement after a state-setting one are evaluated
  inside its state, so an ``await`` there is reported; the call's own arguments
  (and earlier items) are evaluated before the state is entered and are not.
* Nested ``def``/``async def``/``lambda``/``class`` bodies are other frames:
  their suspension points do not suspend the enclosing function, and the
  enclosing function's decorators do not carry their blocks.  Their decorators,
  default values and base classes are evaluated in place and are checked.
* Comprehensions: an ``await`` (or ``async for``) in a list, set or dict
  comprehension inside an ``async def`` suspends the enclosing coroutine, so it
  is reported.  A generator expression is evaluated lazily by whoever iterates
  it: only its first iterable, which is evaluated in place, is checked.  (A
  ``yield`` in a comprehension or generator expression is a syntax error.)

Register it with the ``flake8.extension`` entry point
``TGM = flake8_torch_gradmode:GradModeChecker``, or as a local plugin::

    [flake8:local-plugins]
    extension =
        TGM = flake8_torch_gradmode:GradModeChecker
    paths =
        ./lint
"""

import ast
from typing import NamedTuple

__all__ = ["GradModeChecker"]
__version__ = "0.2.0"

# Parts of the thread state, as messages name them.
_GRAD = "grad mode"
_INFERENCE = "inference mode"
_MULTITHREADING = "the multithreading flag"
_LAYOUT = "the layout-enforcement flag"
_VIEW = "the view-replay flag"
_ORDER = (_GRAD, _INFERENCE, _MULTITHREADING, _LAYOUT, _VIEW)
# The thread's whole c10::AutogradState, which c10::InferenceMode sets.
_AUTOGRAD = frozenset(_ORDER)


def _autocast_part(device):
    """The part of the thread state autocast of *device* sets (None: not known statically)."""
    return ("autocast", device)


def _qualified(modules, names, value):
    """``{module.name: value}`` for each module and name."""
    return {f"{mod}.{name}": value for mod in modules for name in names}


_AUTOGRAD_MODULES = ("torch.autograd", "torch.autograd.grad_mode")
# Fully qualified name -> (public spelling used in messages, the parts its block
# sets and its decorator carries).
_MODES = {
    **{f"{mod}.{name}": (f"torch.{name}", frozenset({_GRAD}))
       for mod in ("torch", *_AUTOGRAD_MODULES) for name in ("no_grad", "enable_grad", "set_grad_enabled")},
    **_qualified(("torch", *_AUTOGRAD_MODULES), ("inference_mode",), ("torch.inference_mode", _AUTOGRAD)),
    **_qualified(_AUTOGRAD_MODULES, ("set_multithreading_enabled",),
                 ("torch.autograd.set_multithreading_enabled", frozenset({_MULTITHREADING}))),
    **_qualified(_AUTOGRAD_MODULES, ("enforce_grad_layout_policy",),
                 ("torch.autograd.grad_mode.enforce_grad_layout_policy", frozenset({_LAYOUT}))),
    **_qualified(_AUTOGRAD_MODULES, ("_force_original_view_tracking",),
                 ("torch.autograd.grad_mode._force_original_view_tracking", frozenset({_VIEW}))),
}
# Fully qualified name -> (public spelling, device type; None: the call's argument).
_AUTOCASTS = {
    **_qualified(("torch", "torch.amp", "torch.amp.autocast_mode"), ("autocast",), ("torch.autocast", None)),
    **_qualified(("torch.cpu.amp", "torch.cpu.amp.autocast_mode"), ("autocast",), ("torch.cpu.amp.autocast", "cpu")),
    **_qualified(("torch.cuda.amp", "torch.cuda.amp.autocast_mode"), ("autocast",),
                 ("torch.cuda.amp.autocast", "cuda")),
}

_YIELD = "yield"
_AWAIT = "await"
# (suspension, whether the body has decorators that are targets) -> code.
_CODES = {(_YIELD, False): "TGM001", (_AWAIT, False): "TGM002", (_YIELD, True): "TGM003", (_AWAIT, True): "TGM004"}
_LEAKS = {
    _YIELD: "leaks to the caller while the generator is suspended",
    _AWAIT: "leaks to other tasks on the event loop while the coroutine is suspended",
}
_UNDECORATED = "{code} {what} inside 'with {item}': the mode {leaks}; decorate the function with @{suggest} instead"
_DECORATED = (
    "{code} {what} inside 'with {item}', which sets {sets}, in a body decorated with {decorators}, "
    "which {carry}: it {leaks}; {remedy}"
)
_UNKNOWN_DEVICE = "its device type is not a string literal, so no decorator is taken to carry it"


class _Block(NamedTuple):
    """An open ``with`` item that sets thread state."""

    item: str
    suggest: str
    parts: frozenset


class _Decorator(NamedTuple):
    """A decorator of the current frame that is one of the targets."""

    source: str
    carries: frozenset


def _dotted(node):
    """``a.b.c`` for a chain of Attribute nodes ending in a Name, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def _star_names(module):
    """The public target names ``from module import *`` binds."""
    names = (full.rpartition(".") for full in (*_MODES, *_AUTOCASTS))
    return [name for mod, _, name in names if mod == module and not name.startswith("_")]


def _collect_aliases(tree):
    """Map each local name bound by an import of torch to the qualified name it stands for."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name != "torch" and not a.name.startswith("torch."):
                    continue
                if a.asname:
                    aliases[a.asname] = a.name
                else:
                    # ``import torch.autograd`` binds ``torch``.
                    aliases[a.name.split(".")[0]] = "torch"
        elif isinstance(node, ast.ImportFrom):
            if node.level or not node.module:
                continue
            if node.module != "torch" and not node.module.startswith("torch."):
                continue
            for a in node.names:
                if a.name == "*":
                    for name in _star_names(node.module):
                        aliases.setdefault(name, f"{node.module}.{name}")
                    continue
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    return aliases


def _autocast_device(call):
    """The device type a ``torch.autocast(...)`` call names as a string literal, else None."""
    if not isinstance(call, ast.Call):
        return None
    arg = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "device_type"), None)
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value
    return None


def _describe_part(part):
    """Words for one part of the thread state."""
    if isinstance(part, str):
        return part
    device = part[1]
    return f"{device} autocast state" if device is not None else "autocast state of an unknown device type"


def _describe(parts):
    """Words for a set of parts of the thread state."""
    rest = set(parts)
    words = []
    if _AUTOGRAD <= rest:
        words.append("the whole autograd state")
        rest -= _AUTOGRAD
    words += [p for p in _ORDER if p in rest]
    words += sorted(_describe_part(p) for p in rest if not isinstance(p, str))
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


class _Visitor(ast.NodeVisitor):
    def __init__(self, aliases):
        self.aliases = aliases
        self.errors = []
        # Open state-setting ``with`` items of the current frame, innermost last.
        self.blocks = []
        # The current frame's decorators that are targets.
        self.decorators = ()

    # -- name resolution -------------------------------------------------

    def _resolve(self, node):
        """The fully qualified name *node* stands for, else None."""
        dotted = _dotted(node)
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        if head not in self.aliases:
            return None
        return self.aliases[head] + ("." + rest if rest else "")

    def _parts(self, expr):
        """(public spelling, parts) of a call or bare name of a target, else None."""
        full = self._resolve(expr.func if isinstance(expr, ast.Call) else expr)
        if full in _MODES:
            return _MODES[full]
        if full in _AUTOCASTS:
            public, device = _AUTOCASTS[full]
            return public, frozenset({_autocast_part(device or _autocast_device(expr))})
        return None

    def _block(self, expr):
        """The block a ``with`` item *expr* opens, if it is a call of a target, else None."""
        found = self._parts(expr) if isinstance(expr, ast.Call) else None
        if found is None:
            return None
        public, parts = found
        args = ", ".join([ast.unparse(a) for a in expr.args] + [ast.unparse(k) for k in expr.keywords])
        return _Block(ast.unparse(expr), f"{public}({args})", parts)

    def _decorator(self, dec):
        """The decorator *dec* if it is a target, else None."""
        found = self._parts(dec)
        if found is None:
            return None
        # A decorator of unknown device type carries no block.
        carries = frozenset(p for p in found[1] if p != _autocast_part(None))
        return _Decorator("@" + ast.unparse(dec), carries)

    # -- reporting -------------------------------------------------------

    def _carried(self):
        """The parts of the thread state the frame's decorators carry, together."""
        return frozenset().union(*(d.carries for d in self.decorators))

    def _leaking_block(self):
        """The innermost open block the frame's decorators do not carry, else None."""
        carried = self._carried()
        return next((b for b in reversed(self.blocks) if not b.parts <= carried), None)

    def _message(self, block, suspension, what):
        """The report for *what* (a *suspension*) inside *block*."""
        code = _CODES[suspension, bool(self.decorators)]
        if self.decorators:
            return self._decorated_message(code, block, suspension, what)
        return _UNDECORATED.format(code=code, what=what, item=block.item, leaks=_LEAKS[suspension],
                                   suggest=block.suggest)

    def _decorated_message(self, code, block, suspension, what):
        """The report for a body whose decorators that are targets do not carry *block*."""
        carried = self._carried()
        verb = "carries" if len(self.decorators) == 1 else "carry"
        carry = f"{verb} only {_describe(carried)}" if carried else f"{verb} no state known statically"
        if _autocast_part(None) in block.parts:
            remedy = _UNKNOWN_DEVICE
        else:
            remedy = f"a body decorated with @{block.suggest} would carry it"
        return _DECORATED.format(code=code, what=what, item=block.item, sets=_describe(block.parts),
                                 decorators=" and ".join(d.source for d in self.decorators), carry=carry,
                                 leaks=_LEAKS[suspension], remedy=remedy)

    def _report(self, node, suspension, what):
        block = self._leaking_block()
        if block is not None:
            self.errors.append((node.lineno, node.col_offset, self._message(block, suspension, what)))

    # -- frames ----------------------------------------------------------

    def _in_new_frame(self, body, decorators=()):
        saved = self.blocks, self.decorators
        self.blocks, self.decorators = [], decorators
        try:
            for node in body:
                self.visit(node)
        finally:
            self.blocks, self.decorators = saved

    def _visit_arguments_in_place(self, args):
        for d in args.defaults:
            self.visit(d)
        for d in args.kw_defaults:
            if d is not None:
                self.visit(d)

    def _visit_function(self, node):
        for dec in node.decorator_list:
            self.visit(dec)
        self._visit_arguments_in_place(node.args)
        decorators = tuple(d for d in map(self._decorator, node.decorator_list) if d is not None)
        self._in_new_frame(node.body, decorators)

    visit_FunctionDef = _visit_function
    visit_AsyncFunctionDef = _visit_function

    def visit_Lambda(self, node):
        self._visit_arguments_in_place(node.args)
        self._in_new_frame([node.body])

    def visit_ClassDef(self, node):
        for dec in node.decorator_list:
            self.visit(dec)
        for b in node.bases:
            self.visit(b)
        for k in node.keywords:
            self.visit(k)
        self._in_new_frame(node.body)

    def visit_GeneratorExp(self, node):
        # Only the first iterable is evaluated where the expression is written.
        self.visit(node.generators[0].iter)

    # -- with blocks -----------------------------------------------------

    def _visit_with(self, node, is_async):
        if is_async:
            self._report(node, _AWAIT, "async with")
        depth = len(self.blocks)
        try:
            for item in node.items:
                self.visit(item.context_expr)
                if item.optional_vars is not None:
                    self.visit(item.optional_vars)
                block = self._block(item.context_expr)
                if block is not None:
                    self.blocks.append(block)
            for stmt in node.body:
                self.visit(stmt)
        finally:
            del self.blocks[depth:]

    def visit_With(self, node):
        self._visit_with(node, is_async=False)

    def visit_AsyncWith(self, node):
        self._visit_with(node, is_async=True)

    # -- suspension points -----------------------------------------------

    def visit_Yield(self, node):
        self._report(node, _YIELD, "yield")
        self.generic_visit(node)

    def visit_YieldFrom(self, node):
        self._report(node, _YIELD, "yield from")
        self.generic_visit(node)

    def visit_Await(self, node):
        self._report(node, _AWAIT, "await")
        self.generic_visit(node)

    def visit_AsyncFor(self, node):
        self._report(node, _AWAIT, "async for")
        self.generic_visit(node)

    def visit_comprehension(self, node):
        if node.is_async:
            self._report(node.target, _AWAIT, "async for")
        self.generic_visit(node)


class GradModeChecker:
    """flake8 AST checker for ``yield``/``await`` inside thread-state ``with`` blocks."""

    name = "flake8-torch-gradmode"
    version = __version__

    def __init__(self, tree, filename="(none)"):
        self.tree = tree
        self.filename = filename

    def run(self):
        visitor = _Visitor(_collect_aliases(self.tree))
        visitor.visit(self.tree)
        for line, col, msg in sorted(visitor.errors):
            yield line, col, msg, type(self)
