"""Start-up hook that lays this checkout's patch over the installed torch wheel.

``pip install -e .`` installs a ``.pth`` file that imports this module when the
interpreter starts.  It builds the patched modules from the wheel's own files
and the checkout's pieces (``_torch_gradmode_splice``: every step of
``stack/series``, or the first ``$TORCH_GRADMODE_STACK`` of them), and keeps a
*tree*: a directory ``torch/`` whose entries are symbolic links to the wheel's
``torch`` package, except the built modules, which are files of the tree.  It
puts the tree first on ``sys.path``, so ``import torch`` loads the whole
package from one directory (Dynamo decides what to trace by file location).

Trees are cached under ``build/`` by the hash of everything they are built
from, and written under a temporary name then renamed, so an edit is seen by
the next interpreter and processes that start together (spawned DataLoader
workers) never see half a tree.  Set ``TORCH_GRADMODE_OVERLAY=0`` to run one
process against stock torch.
"""

import hashlib
import importlib.abc
import importlib.util
import os
import shutil
import sys
import time
import warnings

import _torch_gradmode_splice as splice

SUPPORTED_TORCH = ("2.13",)
ENV_SWITCH = "TORCH_GRADMODE_OVERLAY"
STACK_SWITCH = "TORCH_GRADMODE_STACK"
# The C++ sources a step may add, and the function of _torch_gradmode_C that
# registers each in torch._C.
BINDINGS = {
    "torch/csrc/autograd/python_autograd_mode_state.cpp": "register_into",
    "torch/csrc/autograd/python_autocast_state.cpp": "register_autocast_into",
}

_OVERLAY_DIR = os.path.dirname(os.path.realpath(__file__))
CHECKOUT = os.path.dirname(_OVERLAY_DIR)
# One link tree per environment: the venvs of one checkout (one per Python,
# say) each have their own torch, and a shared tree would follow whichever
# started an interpreter last, under the feet of the others.
_ENV_KEY = hashlib.sha256(os.path.realpath(sys.prefix).encode()).hexdigest()[:12]
TREE_ROOT = os.path.join(CHECKOUT, "build", f"overlay-{_ENV_KEY}")


def wheel_torch_dir():
    """Locate the installed ``torch`` package without importing it."""
    # find_spec consults sys.path, so it must run before the tree is put on it.
    spec = importlib.util.find_spec("torch")
    # A checkout's own torch/ (no __init__.py) is only a namespace package.
    if spec is None or not spec.origin or not os.path.isfile(spec.origin):
        return None
    return os.path.dirname(os.path.realpath(spec.origin))


def torch_version(torch_dir):
    """Read ``torch.__version__`` from ``torch/version.py`` without importing torch."""
    with open(os.path.join(torch_dir, "version.py")) as f:
        for line in f:
            if line.startswith("__version__"):
                return line.split("=", 1)[1].strip().strip("'\"")
    raise RuntimeError(f"no __version__ in {torch_dir}/version.py")


def check_version(version):
    """Raise a clear error unless *version* is a torch release this patch supports."""
    if not any(version == v or version.startswith(v + ".") for v in SUPPORTED_TORCH):
        raise RuntimeError(
            f"this grad-mode patch supports torch {', '.join(v + '.x' for v in SUPPORTED_TORCH)} "
            f"only, but torch {version} is installed; install a supported torch "
            "(pip install torch==2.13.0) or uninstall the patch"
        )


def _link_dir(wheel_dir, dst, built):
    """Fill new directory *dst* with links to *wheel_dir*, except the files *built* (``{relpath: text}``)."""
    os.mkdir(dst)
    subdirs = {rel.split(os.sep, 1)[0] for rel in built if os.sep in rel}
    for name in os.listdir(wheel_dir):
        if name != "__pycache__" and name not in subdirs and name not in built:
            os.symlink(os.path.join(wheel_dir, name), os.path.join(dst, name))
    for rel, text in built.items():
        if os.sep not in rel:
            with open(os.path.join(dst, rel), "w", encoding="utf-8") as f:
                f.write(text)
    for sub in sorted(subdirs):
        inner = {rel.split(os.sep, 1)[1]: text for rel, text in built.items() if rel.startswith(sub + os.sep)}
        _link_dir(os.path.join(wheel_dir, sub), os.path.join(dst, sub), inner)


class StackSelectionError(RuntimeError):
    """The steps asked for do not exist: ``import torch`` must fail rather than run stock torch."""


class _Refuse(importlib.abc.MetaPathFinder):
    """Makes ``import torch`` raise *message*."""

    def __init__(self, message):
        self._message = message

    def find_spec(self, name, path, target=None):
        if name == "torch":
            raise ImportError(f"torch grad-mode patch: {self._message} (or {ENV_SWITCH}=0 for stock torch)")
        return None


def selected_steps():
    """The steps ``$TORCH_GRADMODE_STACK`` selects: a number (the first N) or a step's name; default all."""
    steps = splice.series(CHECKOUT)
    want = os.environ.get(STACK_SWITCH, "").strip()
    if not want:
        return steps
    names = [step.name for step in steps]
    if want.isascii() and want.isdigit() and int(want) <= len(steps):
        return steps[: int(want)]
    if want in names:
        return steps[: names.index(want) + 1]
    raise StackSelectionError(
        f"{STACK_SWITCH}={want!r}: give 0 to {len(steps)} or a step of stack/series ({', '.join(names)})"
    )


def _reader(torch_dir):
    base = os.path.dirname(torch_dir)

    def read(path):
        where = os.path.join(base, path)
        if not path.startswith("torch/") or not os.path.isfile(where):
            return None
        with open(where, encoding="utf-8") as f:
            return f.read()

    return read


def _key(torch_dir, steps):
    """The hash of everything the tree for *steps* is built from."""
    digest = hashlib.sha256(f"{torch_dir}\n{[s.name for s in steps]}\n".encode())
    read = _reader(torch_dir)
    paths = sorted({p for s in steps for p in [*s.defines, *s.edits]})
    for path in [*splice.inputs(CHECKOUT), *paths]:
        text = read(path) if not os.path.isabs(path) else open(path, encoding="utf-8").read()
        digest.update(f"{path}\n{text}\n".encode())
    return digest.hexdigest()[:16]


def _in_wheel(path):
    return path.startswith("torch/") and path.endswith((".py", ".json"))


def build_tree(torch_dir, steps):
    """Return the tree for *steps* over the wheel at *torch_dir*, building it unless it is cached."""
    where = os.path.join(TREE_ROOT, _key(torch_dir, steps))
    if os.path.isdir(where):
        os.utime(where)  # in use: see _prune
        return where
    built = splice.build(CHECKOUT, steps, _reader(torch_dir), only=_in_wheel)
    built = {os.path.relpath(p, "torch"): t for p, t in built.items()}
    os.makedirs(TREE_ROOT, exist_ok=True)
    tmp = f"{where}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.mkdir(tmp)
    _link_dir(torch_dir, os.path.join(tmp, "torch"), built)
    try:
        os.rename(tmp, where)
    except OSError:  # another process built the same tree first
        shutil.rmtree(tmp, ignore_errors=True)
    _prune()
    return where


def _prune(days=7):
    """Remove the trees no interpreter has started from for *days*; a running one may still import from its own."""
    for name in os.listdir(TREE_ROOT):
        old = os.path.join(TREE_ROOT, name)
        if not os.path.isdir(old):
            continue
        try:
            stale = time.time() - os.path.getmtime(old) > days * 86400
        except OSError:
            continue
        if stale:
            # Renamed first: no process may take a tree half removed for a cached one.
            trash = os.path.join(TREE_ROOT, f".trash{os.getpid()}-{name}")
            try:
                os.rename(old, trash)
            except OSError:
                continue
            shutil.rmtree(trash, ignore_errors=True)


def bindings(steps):
    """The registering functions of the C++ bindings *steps* add (``torch._C`` has no other)."""
    return [register for source, register in BINDINGS.items() if any(source in step.new for step in steps)]


class _BindingRegistrar(importlib.abc.MetaPathFinder):
    """Adds the patch's C++ binding to ``torch._C`` as soon as ``torch._C`` is loaded.

    Upstream, ``torch._C`` registers the binding itself; over a prebuilt wheel
    it comes from ``_torch_gradmode_C``, built by the install.  It must be in
    place before ``torch.utils._contextlib`` is imported, which ``import torch``
    does right after loading ``torch._C``.
    """

    def __init__(self, torch_version, registers):
        self._torch_version = torch_version
        self._registers = registers

    def find_spec(self, name, path, target=None):
        if name != "torch._C":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None:
            spec.loader = _RegisteringLoader(spec.loader, self._torch_version, self._registers)
        return spec


class _RegisteringLoader(importlib.abc.Loader):
    def __init__(self, loader, torch_version, registers):
        self._loader = loader
        self._torch_version = torch_version
        self._registers = registers

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        module.__loader__ = self._loader
        try:
            import _torch_gradmode_C
        except ImportError as exc:
            raise ImportError(
                f"torch grad-mode patch: its C++ half is not built ({exc}); reinstall the patch "
                f"(pip install -e {CHECKOUT}) or set {ENV_SWITCH}=0 for stock torch"
            ) from None
        built_for = getattr(_torch_gradmode_C, "built_for_torch", None)
        if built_for != self._torch_version:
            raise ImportError(
                f"torch grad-mode patch: its C++ half was built for torch {built_for}, but torch "
                f"{self._torch_version} is installed; reinstall the patch (pip install -e {CHECKOUT}) "
                f"or set {ENV_SWITCH}=0 for stock torch"
            )
        for register in self._registers:
            getattr(_torch_gradmode_C, register)(module)


def activate():
    """Put the link tree first on ``sys.path``; called from the ``.pth`` file at start-up."""
    if os.environ.get(ENV_SWITCH, "1") == "0" or any(p.startswith(TREE_ROOT + os.sep) for p in sys.path):
        return
    torch_dir = wheel_torch_dir()
    if torch_dir is None:
        warnings.warn("torch grad-mode patch: torch is not installed; overlay inactive")
        return
    version = torch_version(torch_dir)
    check_version(version)
    steps = selected_steps()
    sys.path.insert(0, build_tree(torch_dir, steps))
    if bindings(steps):
        install_binding(version, bindings(steps))


def install_binding(version=None, registers=tuple(BINDINGS.values())):
    """Have the next ``import torch`` register the patch's C++ half in ``torch._C``.

    *version* is the installed torch's (read from the wheel when not given):
    the C++ half must have been built against it.  *registers* names the
    bindings to register (all, by default).
    """
    if version is None:
        version = torch_version(wheel_torch_dir())
    if not any(isinstance(finder, _BindingRegistrar) for finder in sys.meta_path):
        sys.meta_path.insert(0, _BindingRegistrar(version, registers))


def _activate_from_pth():
    # A start-up hook must never stop the interpreter from starting: report and carry on.
    try:
        activate()
    except StackSelectionError as exc:  # asked for steps that are not there: no silent stock torch
        sys.meta_path.insert(0, _Refuse(str(exc)))
    except Exception as exc:  # noqa: BLE001
        sys.stderr.write(f"torch grad-mode patch: overlay inactive: {exc}\n")
