"""Sphinx configuration for the grad-mode patch's docs.

Build with ``bash tools/build_docs.sh`` (HTML with warnings as errors, then the
doctest builder).  ``import torch`` must load this checkout's modules, i.e. run
Sphinx with the venv that has the patch installed.
"""

import re

from docutils import nodes

project = "torch grad-mode decorators for suspendable functions"
author = "torch-gradmode-patch contributors"
copyright = "PyTorch contributors"

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.doctest",
    # The notes page is MyST Markdown, as upstream's notes are.
    "myst_parser",
]

exclude_patterns = ["build"]
html_theme = "alabaster"

autodoc_member_order = "bysource"
autodoc_typehints = "none"

# The doctest builder: ``>>>`` examples run with torch imported, each page in
# the default grad mode (the documents share one thread).
doctest_global_setup = "import torch\ntorch.set_grad_enabled(True)"
# Pages of upstream's docstrings, as the patch leaves them: upstream runs their
# examples with xdoctest (tools/lint_upstream.sh does too), not sphinx's doctest.
_UPSTREAM_EXAMPLES = {"grad_mode_api"}
doctest_test_doctest_blocks = "default"

_PROMPT = re.compile(r"^\s*>>> ", re.MULTILINE)


def _literal_examples_to_doctests(app, doctree):
    """Make literal blocks that hold ``>>>`` sessions doctest blocks.

    The torch docstrings introduce their examples with ``Example::``, and the
    MyST notes page puts them in ```` ```python ```` fences; both make a
    literal block, and ``sphinx.ext.doctest`` only collects doctest blocks
    (and its own directives).  A literal block whose text starts with a
    ``>>>`` prompt is turned into a doctest block (rendered the same way), so
    the doctest builder runs it.  Other literal blocks are left alone.
    """
    if app.env.docname in _UPSTREAM_EXAMPLES:
        for block in list(doctree.findall(nodes.doctest_block)):
            block.replace_self(nodes.literal_block(block.astext(), block.astext()))
        return
    for block in list(doctree.findall(nodes.literal_block)):
        text = block.astext()
        if "testnodetype" in block or not text.lstrip().startswith(">>> ") or not _PROMPT.search(text):
            continue
        new = nodes.doctest_block(text, text)
        new.source, new.line = block.source, block.line
        block.replace_self(new)


def setup(app):
    app.connect("doctree-read", _literal_examples_to_doctests)
    return {"parallel_read_safe": True}
