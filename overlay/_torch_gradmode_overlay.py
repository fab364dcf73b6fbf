"""Start-up hook that lays this checkout's torch modules over the installed wheel.

``pip install -e .`` installs a ``.pth`` file that imports this module when the
interpreter starts.  It keeps a *link tree* -- a directory ``torch/`` whose
entries are symbolic links to the installed wheel's ``torch`` package, except
for the files this checkout owns, which link to the checkout -- and puts the
tree's parent first on ``sys.path``.  ``import torch`` then loads the whole
package from one directory, which matters because Dynamo decides what to trace
by file location; edits in the checkout take effect without a rebuild because
the owned files are links.

The tree is rebuilt when the torch install or the set of owned files changes.
Set ``TORCH_GRADMODE_OVERLAY=0`` to run one process against stock torch.
"""

import hashlib
import importlib.abc
import importlib.util
import os
import shutil
import sys
import warnings

SUPPORTED_TORCH = ("2.13",)
ENV_SWITCH = "TORCH_GRADMODE_OVERLAY"

_OVERLAY_DIR = os.path.dirname(os.path.realpath(__file__))
CHECKOUT = os.path.dirname(_OVERLAY_DIR)
# One link tree per environment: the venvs of one checkout (one per Python,
# say) each have their own torch, and a shared tree would follow whichever
# started an interpreter last, under the feet of the others.
_ENV_KEY = hashlib.sha256(os.path.realpath(sys.prefix).encode()).hexdigest()[:12]
TREE_ROOT = os.path.join(CHECKOUT, "build", f"overlay-{_ENV_KEY}")


def owned_files():
    """Return the paths, relative to ``torch/``, of the modules this checkout replaces."""
    top = os.path.join(CHECKOUT, "torch")
    found = []
    for dirpath, dirnames, filenames in os.walk(top):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith(".py"):
                found.append(os.path.relpath(os.path.join(dirpath, name), top))
    return found


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


def _stamp(torch_dir, owned):
    st = os.stat(os.path.join(torch_dir, "__init__.py"))
    return "\n".join([torch_dir, str(st.st_mtime_ns), str(st.st_ino)] + owned)


def _link_dir(wheel_dir, ours_dir, dst, owned_here):
    """Fill new directory *dst* with links to *wheel_dir*, taking *owned_here* from *ours_dir*."""
    os.mkdir(dst)
    owned_subdirs = {rel.split(os.sep, 1)[0] for rel in owned_here if os.sep in rel}
    for name in os.listdir(wheel_dir):
        if name != "__pycache__" and name not in owned_subdirs and name not in owned_here:
            os.symlink(os.path.join(wheel_dir, name), os.path.join(dst, name))
    for rel in owned_here:
        if os.sep not in rel:
            os.symlink(os.path.join(ours_dir, rel), os.path.join(dst, rel))
    for sub in sorted(owned_subdirs):
        inner = [rel.split(os.sep, 1)[1] for rel in owned_here if rel.startswith(sub + os.sep)]
        _link_dir(os.path.join(wheel_dir, sub), os.path.join(ours_dir, sub), os.path.join(dst, sub), inner)


def build_tree(torch_dir, owned):
    """(Re)build the link tree under a temporary name, then swap it in atomically."""
    os.makedirs(os.path.dirname(TREE_ROOT), exist_ok=True)
    tmp = f"{TREE_ROOT}.tmp{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.mkdir(tmp)
    _link_dir(torch_dir, os.path.join(CHECKOUT, "torch"), os.path.join(tmp, "torch"), owned)
    with open(os.path.join(tmp, "STAMP"), "w") as f:
        f.write(_stamp(torch_dir, owned))
    old = f"{TREE_ROOT}.old{os.getpid()}"
    if os.path.isdir(TREE_ROOT):
        os.rename(TREE_ROOT, old)
    try:
        os.rename(tmp, TREE_ROOT)
    except OSError:
        # Another process won the race and installed an equivalent tree.
        shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
    return TREE_ROOT


def _tree_is_current(torch_dir, owned):
    try:
        with open(os.path.join(TREE_ROOT, "STAMP")) as f:
            return f.read() == _stamp(torch_dir, owned)
    except OSError:
        return False


class _BindingRegistrar(importlib.abc.MetaPathFinder):
    """Adds the patch's C++ binding to ``torch._C`` as soon as ``torch._C`` is loaded.

    Upstream, ``torch._C`` registers the binding itself; over a prebuilt wheel
    it comes from ``_torch_gradmode_C``, built by the install.  It must be in
    place before ``torch.utils._contextlib`` is imported, which ``import torch``
    does right after loading ``torch._C``.
    """

    def __init__(self, torch_version):
        self._torch_version = torch_version

    def find_spec(self, name, path, target=None):
        if name != "torch._C":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is not None:
            spec.loader = _RegisteringLoader(spec.loader, self._torch_version)
        return spec


class _RegisteringLoader(importlib.abc.Loader):
    def __init__(self, loader, torch_version):
        self._loader = loader
        self._torch_version = torch_version

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
        _torch_gradmode_C.register_into(module)


def activate():
    """Put the link tree first on ``sys.path``; called from the ``.pth`` file at start-up."""
    if os.environ.get(ENV_SWITCH, "1") == "0" or TREE_ROOT in sys.path:
        return
    torch_dir = wheel_torch_dir()
    if torch_dir is None:
        warnings.warn("torch grad-mode patch: torch is not installed; overlay inactive")
        return
    version = torch_version(torch_dir)
    check_version(version)
    owned = owned_files()
    if not _tree_is_current(torch_dir, owned):
        build_tree(torch_dir, owned)
    sys.path.insert(0, TREE_ROOT)
    install_binding(version)


def install_binding(version=None):
    """Have the next ``import torch`` register the patch's C++ half in ``torch._C``.

    *version* is the installed torch's (read from the wheel when not given):
    the C++ half must have been built against it.
    """
    if version is None:
        version = torch_version(wheel_torch_dir())
    if not any(isinstance(finder, _BindingRegistrar) for finder in sys.meta_path):
        sys.meta_path.insert(0, _BindingRegistrar(version))


def _activate_from_pth():
    # A start-up hook must never stop the interpreter from starting: report and carry on.
    try:
        activate()
    except Exception as exc:  # noqa: BLE001
        sys.stderr.write(f"torch grad-mode patch: overlay inactive: {exc}\n")
