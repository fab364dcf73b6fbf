#!/usr/bin/env python3
"""Assemble a PyTorch v2.13.0 tree for tools/export_pr.py from what this machine can read.

Usage::

    python tools/make_upstream_tree.py --out DIR [--tests TESTS] [--sources SOURCES]

DIR becomes a git repository holding, at their upstream paths:

* from the installed torch 2.13.0 wheel (found with the overlay off): every
  file of the wheel the patch touches -- the modules it changes, Dynamo's trace rules, ``convert_frame.py``,
  ``bytecode_transformation.py``, ``variables/ctx_manager.py``,
  ``variables/functions.py`` and ``graph_break_registry.json``,
  ``torch/version.py`` -- and ``torch/_C/__init__.pyi`` as
  ``torch/_C/__init__.pyi.in`` (the wheel's stub is generated from that file,
  whose text it carries verbatim around the lines the patch edits);
* from TESTS, a folder laid out as ``../shared/upstream-tests.md`` says
  (``test_autograd.py``, ``autograd/``, ``expect/``, ``dynamo/``): ``test/...``;
* from SOURCES, a folder of upstream files at their upstream paths (for
  example ``torch/csrc/Module.cpp``, ``build_variables.bzl``,
  ``docs/source/notes/autograd.md``, read from the search index): copied as
  they are.

A real PyTorch v2.13.0 checkout needs none of this.  Nothing here is ever
copied into this repository.
"""

import argparse
import os
import shutil
import subprocess
import sys

WHEEL_FILES = {
    "torch/utils/_contextlib.py": "utils/_contextlib.py",
    "torch/autograd/grad_mode.py": "autograd/grad_mode.py",
    "torch/_dynamo/trace_rules.py": "_dynamo/trace_rules.py",
    "torch/_dynamo/convert_frame.py": "_dynamo/convert_frame.py",
    "torch/_dynamo/bytecode_transformation.py": "_dynamo/bytecode_transformation.py",
    "torch/_dynamo/variables/ctx_manager.py": "_dynamo/variables/ctx_manager.py",
    "torch/_dynamo/graph_break_registry.json": "_dynamo/graph_break_registry.json",
    "torch/_dynamo/variables/functions.py": "_dynamo/variables/functions.py",
    "torch/amp/autocast_mode.py": "amp/autocast_mode.py",
    "torch/cpu/amp/autocast_mode.py": "cpu/amp/autocast_mode.py",
    "torch/cuda/amp/autocast_mode.py": "cuda/amp/autocast_mode.py",
    "torch/version.py": "version.py",
    "torch/_C/__init__.pyi.in": "_C/__init__.pyi",
}


def die(message):
    print(f"make_upstream_tree: error: {message}", file=sys.stderr)
    sys.exit(2)


def wheel_dir(python):
    """The installed torch package's directory and version, with this checkout's overlay switched off."""
    try:
        proc = subprocess.run(
            [python, "-c", "import os, torch; print(os.path.dirname(torch.__file__)); print(torch.__version__)"],
            env=dict(os.environ, TORCH_GRADMODE_OVERLAY="0"), capture_output=True, text=True,
            cwd=os.sep,  # not a checkout, whose torch/ would shadow the installed one
        )
    except OSError as e:
        die(f"--python {python}: {e.strerror}")
    if proc.returncode:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        die(f"--python {python} cannot import torch: {last}")
    where, version = proc.stdout.split()
    if not version.startswith("2.13."):
        die(f"--python {python} has torch {version}; the tree must be v2.13.0's")
    return where, version


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, metavar="DIR")
    parser.add_argument("--tests", metavar="TESTS", help="upstream test files, laid out as test/ is")
    parser.add_argument("--sources", metavar="SOURCES", help="other upstream files, at their upstream paths")
    parser.add_argument("--python", default=sys.executable, help="the Python whose torch wheel to read")
    args = parser.parse_args(argv)
    if os.path.exists(args.out):
        parser.error(f"--out {args.out} exists; give a new directory")
    parent = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(parent) or not os.access(parent, os.W_OK):
        parser.error(f"--out {args.out}: cannot create it in {parent}")
    for name in ("tests", "sources"):
        where = getattr(args, name)
        if where and not os.path.isdir(where):
            parser.error(f"--{name} {where}: no such directory")
    if args.tests and not os.path.isfile(os.path.join(args.tests, "test_autograd.py")):
        parser.error(f"--tests {args.tests} has no test_autograd.py (laid out as upstream's test/)")
    if args.sources and os.path.isfile(os.path.join(args.sources, "test_autograd.py")):
        parser.error(f"--sources {args.sources} holds test_autograd.py: --tests and --sources swapped?")

    wheel, version = wheel_dir(args.python)
    try:
        build(args, wheel)
    except (OSError, subprocess.CalledProcessError) as e:
        shutil.rmtree(args.out, ignore_errors=True)
        die(f"building {args.out} failed ({e}); nothing was left behind")
    print(f"make_upstream_tree: {args.out} holds torch {version} from {wheel}"
          + (f", tests from {args.tests}" if args.tests else "")
          + (f", sources from {args.sources}" if args.sources else ""))
    return 0


def build(args, wheel):
    for path, rel in WHEEL_FILES.items():
        dst = os.path.join(args.out, path)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copyfile(os.path.join(wheel, rel), dst)
    ignore = shutil.ignore_patterns("__pycache__", ".pytest_cache", "parts", "*.md")
    if args.tests:
        shutil.copytree(args.tests, os.path.join(args.out, "test"), ignore=ignore, dirs_exist_ok=True)
    if args.sources:
        for dirpath, _, filenames in os.walk(args.sources):
            for filename in filenames:
                src = os.path.join(dirpath, filename)
                rel = os.path.relpath(src, args.sources)
                if rel.startswith(("parts", "_from_wheel", "dynamo_experiments")) or rel == "REPORT.md":
                    continue
                dst = os.path.join(args.out, rel)
                if os.path.exists(dst):
                    continue  # the wheel's copy is the v2.13.0 one
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.copyfile(src, dst)
    # Without the user's git config or GIT_DIR (a hook's, say): a plain repository.
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    env.update(GIT_CONFIG_GLOBAL=os.devnull, GIT_CONFIG_NOSYSTEM="1")
    identity = ["-c", "user.name=upstream", "-c", "user.email=upstream@localhost", "-c", "commit.gpgsign=false"]
    for cmd in (["init", "-q"], ["add", "-A"], [*identity, "commit", "-qm", "PyTorch v2.13.0 (assembled)"]):
        subprocess.run(["git", "-c", "core.autocrlf=false", *cmd], cwd=args.out, check=True, env=env,
                       capture_output=True)


if __name__ == "__main__":
    sys.exit(main())
