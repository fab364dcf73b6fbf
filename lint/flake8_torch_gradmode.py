"""flake8 plugin: suspension points inside grad-mode ``with`` blocks (``TGM``).

Grad mode and inference mode are thread-local.  A generator, coroutine or async
generator that suspends -- ``yield``, ``yield from``, ``await``, ``async for``,
``async with`` -- while a ``with torch.no_grad():`` (``enable_grad``,
``set_grad_enabled``, ``inference_mode``) block of its own is open hands the
thread to its caller, or to other tasks on the event loop, with the block's mode
still in force: the mode leaks out, and the caller's leaks in.  The decorator
form switches the mode in only while the body runs (see
``docs/source/notes/grad_mode_suspend.md``).

Codes:

* ``TGM001`` -- ``yield`` or ``yield from`` inside a grad-mode ``with`` block.
* ``TGM002`` -- ``await``, ``async for`` or ``async with`` inside one.

What counts:

* The ``with``/``async with`` item must be a *call* of ``no_grad``,
  ``enable_grad``, ``set_grad_enabled`` or ``inference_mode`` reached through
  ``torch``, ``torch.autograd`` or ``torch.autograd.grad_mode``.  Import aliases
  are resolved statically, module-wide (``import torch as t``,
  ``from torch import no_grad as ng``, ``from torch.autograd import grad_mode``,
  ...); rebinding such a name later, or a context manager kept in a variable
  (``ctx = torch.no_grad(); with ctx:``), is not followed.
* Items of the same ``with`` statement after the grad-mode one are evaluated
  inside its mode, so an ``await`` there is reported; the grad-mode call's own
  arguments (and earlier items) are evaluated before the mode is entered and
  are not.
* Nested ``def``/``async def``/``lambda``/``class`` bodies are other frames:
  their suspension points do not suspend the enclosing function.  Their
  decorators, default values and base classes are evaluated in place and are
  checked.
* Comprehensions: an ``await`` (or ``async for``) in a list, set or dict
  comprehension inside an ``async def`` suspends the enclosing coroutine, so it
  is reported.  A generator expression is evaluated lazily by whoever iterates
  it: only its first iterable, which is evaluated in place, is checked.  (A
  ``yield`` in a comprehension or generator expression is a syntax error.)
* A function decorated with a grad-mode decorator (``@torch.no_grad()``,
  ``@torch.no_grad``, ``@torch.set_grad_enabled(False)``, ...) is exempt: with
  this patch the decorator runs every step of the body in the body's own mode
  and restores the caller's after each step, so a block the body keeps open
  across ``yield``/``await`` no longer leaks (torch 2.13.0's decorators did not
  do that).

Register it with the ``flake8.extension`` entry point
``TGM = flake8_torch_gradmode:GradModeChecker``, or as a local plugin::

    [flake8:local-plugins]
    extension =
        TGM = flake8_torch_gradmode:GradModeChecker
    paths =
        ./lint
"""

import ast

__all__ = ["GradModeChecker"]
__version__ = "0.1.0"

_MODE_NAMES = ("no_grad", "enable_grad", "set_grad_enabled", "inference_mode")
_MODULES = ("torch", "torch.autograd", "torch.autograd.grad_mode")
# Fully qualified name -> the public spelling used in messages.
_TARGETS = {f"{mod}.{name}": f"torch.{name}" for mod in _MODULES for name in _MODE_NAMES}

_TEMPLATES = {
    "TGM001": (
        "TGM001 {what} inside 'with {item}': the mode leaks to the caller while the generator is "
        "suspended; decorate the function with @{suggest} instead"
    ),
    "TGM002": (
        "TGM002 {what} inside 'with {item}': the mode leaks to other tasks on the event loop while "
        "the coroutine is suspended; decorate the function with @{suggest} instead"
    ),
}


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
                    # ``from torch import *`` exports the four decorators.
                    if node.module in _MODULES:
                        for name in _MODE_NAMES:
                            aliases.setdefault(name, f"{node.module}.{name}")
                    continue
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
    return aliases


class _Visitor(ast.NodeVisitor):
    def __init__(self, aliases):
        self.aliases = aliases
        self.errors = []
        # Innermost open grad-mode ``with`` item of the current frame, or None.
        self.block = None
        # Whether the current frame is exempt (decorated with a grad-mode decorator).
        self.exempt = False

    # -- name resolution -------------------------------------------------

    def _resolve(self, node):
        dotted = _dotted(node)
        if dotted is None:
            return None
        head, _, rest = dotted.partition(".")
        if head not in self.aliases:
            return None
        full = self.aliases[head] + ("." + rest if rest else "")
        return _TARGETS.get(full)

    def _grad_mode_item(self, expr):
        """(source text, suggested decorator) if *expr* is a grad-mode call, else None."""
        if not isinstance(expr, ast.Call):
            return None
        public = self._resolve(expr.func)
        if public is None:
            return None
        args = ", ".join([ast.unparse(a) for a in expr.args] + [ast.unparse(k) for k in expr.keywords])
        return ast.unparse(expr), f"{public}({args})"

    def _is_grad_mode_decorator(self, dec):
        target = dec.func if isinstance(dec, ast.Call) else dec
        return self._resolve(target) is not None

    # -- reporting -------------------------------------------------------

    def _report(self, node, code, what):
        if self.block is None or self.exempt:
            return
        item, suggest = self.block
        self.errors.append((node.lineno, node.col_offset, _TEMPLATES[code].format(
            what=what, item=item, suggest=suggest)))

    # -- frames ----------------------------------------------------------

    def _in_new_frame(self, body, exempt=False):
        saved = self.block, self.exempt
        self.block, self.exempt = None, exempt
        try:
            for node in body:
                self.visit(node)
        finally:
            self.block, self.exempt = saved

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
        exempt = any(self._is_grad_mode_decorator(d) for d in node.decorator_list)
        self._in_new_frame(node.body, exempt=exempt)

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
            self._report(node, "TGM002", "async with")
        saved = self.block
        try:
            for item in node.items:
                self.visit(item.context_expr)
                if item.optional_vars is not None:
                    self.visit(item.optional_vars)
                found = self._grad_mode_item(item.context_expr)
                if found is not None:
                    self.block = found
            for stmt in node.body:
                self.visit(stmt)
        finally:
            self.block = saved

    def visit_With(self, node):
        self._visit_with(node, is_async=False)

    def visit_AsyncWith(self, node):
        self._visit_with(node, is_async=True)

    # -- suspension points -----------------------------------------------

    def visit_Yield(self, node):
        self._report(node, "TGM001", "yield")
        self.generic_visit(node)

    def visit_YieldFrom(self, node):
        self._report(node, "TGM001", "yield from")
        self.generic_visit(node)

    def visit_Await(self, node):
        self._report(node, "TGM002", "await")
        self.generic_visit(node)

    def visit_AsyncFor(self, node):
        self._report(node, "TGM002", "async for")
        self.generic_visit(node)

    def visit_comprehension(self, node):
        if node.is_async:
            self._report(node.target, "TGM002", "async for")
        self.generic_visit(node)


class GradModeChecker:
    """flake8 AST checker for ``yield``/``await`` inside grad-mode ``with`` blocks."""

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
