"""Install this checkout's grad-mode modules over an installed torch 2.13 wheel.

``pip install --no-build-isolation -e .`` installs the start-up hook
(``overlay/_torch_gradmode_overlay.py``) and a ``.pth`` file that runs it, so
every later ``import torch`` in this environment loads ``torch/utils/_contextlib.py``
and ``torch/autograd/grad_mode.py`` from this checkout.  ``pip uninstall
torch-gradmode-patch`` removes both and restores stock behaviour.
"""

import os
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "overlay"))
import _torch_gradmode_overlay as overlay  # noqa: E402

PTH_NAME = "torch_gradmode_patch.pth"
PTH_LINE = "import _torch_gradmode_overlay; _torch_gradmode_overlay._activate_from_pth()\n"


def _refuse_unsupported_torch():
    # Checked against the environment pip installs into, so this needs
    # --no-build-isolation (an isolated build environment has no torch).
    torch_dir = overlay.wheel_torch_dir()
    if torch_dir is None:
        sys.exit(
            "error: torch is not installed here. Install torch 2.13.x first "
            "(pip install torch==2.13.0) and install this patch with "
            "pip install --no-build-isolation -e ."
        )
    try:
        overlay.check_version(overlay.torch_version(torch_dir))
    except RuntimeError as exc:
        sys.exit(f"error: {exc}")


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
    _refuse_unsupported_torch()

setup(
    name="torch-gradmode-patch",
    version="0.1.0",
    description="Suspend-aware grad-mode decorators for torch 2.13 (generators, coroutines, async generators)",
    python_requires=">=3.10",
    package_dir={"": "overlay", "torch_gradmode_lint": "lint"},
    py_modules=["_torch_gradmode_overlay"],
    packages=["torch_gradmode_lint"],
    # flake8 picks up the TGM checker (yield/await inside a grad-mode ``with``).
    entry_points={"flake8.extension": ["TGM = torch_gradmode_lint.flake8_torch_gradmode:GradModeChecker"]},
    cmdclass={"build_py": build_py_with_pth, "editable_wheel": editable_wheel_with_pth},
)
