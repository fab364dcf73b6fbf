"""Install this checkout's grad-mode patch over an installed torch 2.13 wheel.

``pip install -e .`` builds the patch's C++ half
(``torch/csrc/autograd/python_autograd_mode_state.cpp``) against the headers and
``libc10`` of the torch installed in the target environment, and installs the
start-up hook (``overlay/_torch_gradmode_overlay.py``) with a ``.pth`` file that
runs it, so every later ``import torch`` in this environment loads
``torch/utils/_contextlib.py`` and ``torch/autograd/grad_mode.py`` from this
checkout.  ``pip uninstall torch-gradmode-patch`` removes both and restores stock
behaviour.
"""

import os
import shutil
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "overlay"))
import _torch_gradmode_overlay as overlay  # noqa: E402

PTH_NAME = "torch_gradmode_patch.pth"
PTH_LINE = "import _torch_gradmode_overlay; _torch_gradmode_overlay._activate_from_pth()\n"


def _target_torch_dir():
    """The ``torch`` package of the environment being installed into, or None.

    pip's default build isolation hides the target environment's packages from
    ``sys.path`` but not its prefix: look there when the path has no torch.
    """
    torch_dir = overlay.wheel_torch_dir()
    if torch_dir is not None:
        # The wheel's own directory, not the overlay's link tree.
        return os.path.dirname(os.path.realpath(os.path.join(torch_dir, "__init__.py")))
    for key in ("platlib", "purelib"):
        candidate = os.path.join(sysconfig.get_paths()[key], "torch")
        if os.path.isfile(os.path.join(candidate, "version.py")):
            return candidate
    return None


def _torch_or_exit():
    torch_dir = _target_torch_dir()
    if torch_dir is None:
        sys.exit(
            "error: torch is not installed in this environment; install torch 2.13.x first "
            "(pip install torch==2.13.0), then this patch (pip install -e .)"
        )
    try:
        overlay.check_version(overlay.torch_version(torch_dir))
    except RuntimeError as exc:
        sys.exit(f"error: {exc}")
    return torch_dir


class build_ext_against_torch(build_ext):
    """Build the binding against the installed torch's headers and libraries."""

    def run(self):
        torch_dir = _torch_or_exit()
        version = overlay.torch_version(torch_dir)
        lib = os.path.join(torch_dir, "lib")
        for ext in self.extensions:
            ext.include_dirs[:0] = [HERE, os.path.join(torch_dir, "include")]
            ext.library_dirs.append(lib)
            ext.runtime_library_dirs.append(lib)
            ext.define_macros.append(("TORCH_GRADMODE_BUILT_FOR", f'"{version}"'))
        super().run()

    def build_extensions(self):
        # The compiler setuptools will run (sysconfig's CXX, or $CXX), not a guess.
        for command in (self.compiler.compiler_so, self.compiler.compiler_cxx, self.compiler.linker_so):
            if command and shutil.which(command[0]) is None:
                sys.exit(
                    f"error: no C++ compiler ({command[0]!r} not found): the patch's C++ half needs one "
                    "(on Debian: apt-get install g++; or set CXX and CC)"
                )
        super().build_extensions()


class build_py_with_pth(build_py):
    """Ship the ``.pth`` start-up hook at the root of the (editable) wheel."""

    def run(self):
        super().run()
        target = os.path.join(self.build_lib, PTH_NAME)
        os.makedirs(self.build_lib, exist_ok=True)
        with open(target, "w") as f:
            f.write(PTH_LINE)

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, PTH_NAME)]


class editable_wheel_with_pth(editable_wheel):
    """Add the ``.pth`` start-up hook to the editable wheel too.

    setuptools' editable wheels hold only the path hook it writes itself, so the
    strategy that writes it is wrapped to add ours beside it.
    """

    def _select_strategy(self, *args, **kwargs):
        strategy = super()._select_strategy(*args, **kwargs)

        class WithPth:
            def __enter__(self):
                strategy.__enter__()
                return self

            def __exit__(self, *exc):
                return strategy.__exit__(*exc)

            def __call__(self, wheel, files, mapping):
                strategy(wheel, files, mapping)
                wheel.writestr(PTH_NAME, PTH_LINE)

        return WithPth()


if any(cmd in sys.argv for cmd in ("bdist_wheel", "editable_wheel", "develop", "install")):
    _torch_or_exit()
if any(cmd in sys.argv for cmd in ("bdist_wheel", "install")) and "editable_wheel" not in sys.argv:
    # The start-up hook builds the patched modules from this checkout at every start.
    sys.exit(f"error: this patch installs from its checkout only: pip install -e {HERE}")

setup(
    name="torch-gradmode-patch",
    version="0.2.0",
    description="Suspend-aware grad-mode decorators for torch 2.13 (generators, coroutines, async generators)",
    python_requires=">=3.10",
    package_dir={"": "overlay", "torch_gradmode_lint": "lint"},
    py_modules=["_torch_gradmode_overlay", "_torch_gradmode_splice", "_torch_gradmode_edits"],
    packages=["torch_gradmode_lint"],
    ext_modules=[
        Extension(
            "_torch_gradmode_C",
            # The upstream-bound binding, and the project-only module that loads it.
            sources=[
                "torch/csrc/autograd/python_autograd_mode_state.cpp",
                "torch/csrc/autograd/python_autocast_state.cpp",
                "overlay/_torch_gradmode_C.cpp",
            ],
            libraries=["c10", "torch_cpu", "torch_python"],
            extra_compile_args=["-std=c++20", "-O2", "-D_GLIBCXX_USE_CXX11_ABI=1"],
            language="c++",
        )
    ],
    # flake8 picks up the TGM checker (yield/await inside a mode's ``with`` its decorators do not carry).
    entry_points={"flake8.extension": ["TGM = torch_gradmode_lint.flake8_torch_gradmode:GradModeChecker"]},
    cmdclass={
        "build_ext": build_ext_against_torch,
        "build_py": build_py_with_pth,
        "editable_wheel": editable_wheel_with_pth,
    },
)
