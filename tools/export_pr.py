#!/usr/bin/env python3
"""Write this project's pull request against a PyTorch v2.13.0 tree: the stack, or one patch.

Usage::

    python tools/export_pr.py --upstream DIR --out-dir D [--skip-missing]
    python tools/export_pr.py --upstream DIR --squash --out FILE [--skip-missing]

``--steps K`` exports the first K steps only.

DIR is a PyTorch v2.13.0 source tree: a whole checkout, or a folder holding at
least the files the patch touches (``tools/make_upstream_tree.py`` makes one
from the torch 2.13.0 wheel and the upstream files the search index holds).
``--out-dir`` gets the steps of ``stack/series`` as a ``git format-patch``
series (``0001-....patch``, one commit a step, its ``DESCRIPTION.md`` the
message), to apply in order with ``git am --keep-non-patch`` at the root of
DIR; ``--squash`` writes the whole stack as one commit whose message is
``tools/pr_description.md``.

Every file is built from DIR's own text by ``overlay/_torch_gradmode_splice.py``,
as the install builds it from the wheel: the definitions a step adds or
replaces are spliced into DIR's modules (every other byte stays DIR's), new
files are carried whole, and the anchored edits are computed against DIR's
files.  An edit target DIR lacks is an error, unless ``--skip-missing``
exports without that edit (and says so); an anchor DIR's copy lacks is always
an error, naming the file and the line it looked for.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DESCRIPTION = os.path.join(ROOT, "tools", "pr_description.md")
TORCH_VERSION = "2.13"
sys.path.insert(0, os.path.join(ROOT, "overlay"))
import _torch_gradmode_splice as splice  # noqa: E402


class ExportError(Exception):
    """A problem with DIR or with this checkout that stops the export."""


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


def check_out_dir(out_dir):
    """Refuse an --out-dir the series cannot be written to."""
    if not out_dir:
        raise ExportError("--out-dir is empty: give the folder to write the series to")
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ExportError(f"--out-dir {out_dir} is a file; give a folder")
    if os.path.isdir(out_dir) and [n for n in os.listdir(out_dir) if n.endswith(".patch")]:
        raise ExportError(f"--out-dir {out_dir} already holds patches; give an empty folder")


def _reader(upstream):
    def read(path):
        where = os.path.join(upstream, path)
        return _read(where, f"--upstream {upstream}: {path}") if os.path.isfile(where) else None

    return read


def _squash_message(steps, count):
    """The whole stack's description, or for the first *count* steps theirs, one after another."""
    if count is None or count == len(splice.series(ROOT)):
        return _read(DESCRIPTION, DESCRIPTION)
    subjects = [step.description().split("\n", 1)[0] for step in steps]
    head = f"[stack] steps 1-{count}: {subjects[-1]}\n\n"
    return head + "\n\n".join(f"# Step {k}: {d}" for k, d in enumerate((s.description() for s in steps), 1))


def export(upstream, out=None, out_dir=None, skip_missing=False, count=None):
    """Write the stack (to *out_dir*) or one squashed patch (to *out*); return what was skipped.

    The result is ``(missing, empty)``: the edit targets DIR lacks, and the
    steps that change nothing in DIR once those are left out.
    """
    check_tree(upstream)
    check_out(out) if out_dir is None else check_out_dir(out_dir)
    upstream = os.path.abspath(upstream)
    steps = splice.series(ROOT)
    if count is not None:
        if not 1 <= count <= len(steps):
            raise ExportError(f"--steps {count}: the stack has steps 1 to {len(steps)}")
        steps = steps[:count]
    read = _reader(upstream)
    for step in steps:
        for path in step.new:
            if os.path.exists(os.path.join(upstream, path)):
                raise ExportError(f"--upstream {upstream} already has {path}, which the patch adds: "
                                  "DIR carries (part of) it")
    missing, states = [], []
    try:
        for k in range(1, len(steps) + 1):
            states.append(splice.build(ROOT, steps[:k], read, missing=missing))
    except splice.SpliceError as e:
        raise ExportError(str(e)) from None
    missing = sorted(set(missing))
    if missing and not skip_missing:
        raise ExportError(
            f"--upstream {upstream} lacks {', '.join(missing)}, which the patch edits "
            "(use a fuller tree, or --skip-missing to export without those edits)"
        )
    env = _git_env(_identity())
    empty = []
    with tempfile.TemporaryDirectory() as work:
        # The base commit holds DIR's copy of every file the patch changes.
        for path in states[-1]:
            if read(path) is not None:
                _write(os.path.join(work, path), read(path))
        _git(work, "init", "-q", env=env)
        _git(work, "add", "-A", env=env)
        _git(work, "commit", "-q", "--allow-empty", "-m", "base", env=env)
        commits = list(zip(steps, states)) if out is None else [(None, states[-1])]
        for step, state in commits:
            for path, text in state.items():
                _write(os.path.join(work, path), text)
            _git(work, "add", "-A", env=env)
            if not _git(work, "status", "--porcelain", env=env).strip():
                empty.append(step.name)
                continue
            message = os.path.join(work, ".git", "MESSAGE")
            _write(message, step.description() if step else _squash_message(steps, count))
            _git(work, "commit", "-q", "--cleanup=verbatim", "-F", message, env=env)
        if out is not None:
            patch = _git(work, "format-patch", "-1", "--stdout", "--no-signature", "--no-numbered", "HEAD", env=env)
            try:
                with open(out, "wb") as f:
                    f.write(patch)
            except OSError as e:
                raise ExportError(f"--out {out}: {e.strerror}") from None
        else:
            os.makedirs(out_dir, exist_ok=True)
            _git(work, "format-patch", "-q", "--no-signature", "--numbered", "-o", os.path.abspath(out_dir),
                 "HEAD~%d" % (len(steps) - len(empty)), env=env)
    return missing, empty


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
    parser.add_argument("--out-dir", metavar="D", help="write the stack there, one patch a step")
    parser.add_argument("--squash", action="store_true", help="write the whole stack as one patch to --out")
    parser.add_argument("--out", metavar="FILE", help="with --squash: where to write the patch")
    parser.add_argument(
        "--skip-missing", action="store_true", help="export without the edits of files DIR lacks"
    )
    parser.add_argument("--steps", type=int, metavar="K", help="the first K steps only")
    args = parser.parse_args(argv)
    if args.squash != bool(args.out) or (args.squash and args.out_dir) or not (args.squash or args.out_dir):
        parser.error("give --out-dir D for the stack, or --squash --out FILE for one patch")
    try:
        skipped, empty = export(args.upstream, args.out, args.out_dir, args.skip_missing, args.steps)
    except ExportError as e:
        print(f"export_pr: error: {e}", file=sys.stderr)
        return 2
    for path in skipped:
        print(f"export_pr: {path} not in --upstream: exported without its edit", file=sys.stderr)
    for name in empty:
        print(f"export_pr: step {name} changes nothing in --upstream: left out", file=sys.stderr)
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "stack", "torch", "test", "docs/source", "lint/upstream", "overlay"],
        cwd=ROOT, capture_output=True, text=True,
    ).stdout.split("\n")
    for line in filter(None, dirty):
        print(f"export_pr: warning: exported {line[3:]} with uncommitted changes", file=sys.stderr)
    print(f"export_pr: wrote {args.out or args.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
