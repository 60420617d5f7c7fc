"""A Sphinx extension: one line per notebook page as the build reads it, with the seconds it took.

Sphinx's own "reading sources..." line names a page before it is read and says nothing while
myst-nb executes it (chapter 09 trains for minutes), nor afterwards. This prints, once a page's
notebook has run or come from the cache::

    book: [ 9/27] chapters/09_real_models: executed in 612.3 s
    book: [10/27] chapters/10_backward: from the cache (0.4 s)

The index counts the pages Sphinx reads in this build; pages without code cells get no line.
Loaded from ``_config.yml`` (``sphinx.extra_extensions``), so ``make book`` and a plain
``jupyter-book build .`` both print it.
"""
from __future__ import annotations

import sys
import time

from sphinx.util import logging

logger = logging.getLogger(__name__)


def line(index: int, total: int, docname: str, seconds: float, executed: bool) -> str:
    """The progress line for one page (kept apart so the format is tested without a build)."""
    width = len(str(total))
    what = f"executed in {seconds:.1f} s" if executed else f"from the cache ({seconds:.1f} s)"
    return f"book: [{index:>{width}}/{total}] {docname}: {what}"


def _before_read(app, env, docnames) -> None:
    env.book_progress = {"total": len(docnames), "done": 0, "start": {}}


def _source_read(app, docname, source) -> None:
    state = getattr(app.env, "book_progress", None)
    if state is not None:
        state["start"][docname] = (time.monotonic(), time.time())


def _doctree_read(app, doctree) -> None:
    env = app.env
    state = getattr(env, "book_progress", None)
    if state is None:
        return
    docname = env.docname
    state["done"] += 1
    started = state["start"].pop(docname, None)
    from myst_nb.sphinx_ import NbMetadataCollector

    exec_data = NbMetadataCollector.get_exec_data(env, docname)
    if exec_data is None or started is None:  # not a notebook page
        return
    mono0, wall0 = started
    # myst-nb stamps a fresh run with the time it finished, a cached one with the cache's date
    executed = exec_data.get("mtime", 0) >= wall0
    seconds = exec_data.get("runtime") if executed and exec_data.get("runtime") else time.monotonic() - mono0
    logger.info(line(state["done"], state["total"], docname, seconds, executed))
    sys.stdout.flush()  # a build piped into a log shows each line as the page finishes


def setup(app):
    app.connect("env-before-read-docs", _before_read)
    app.connect("source-read", _source_read)
    app.connect("doctree-read", _doctree_read)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
