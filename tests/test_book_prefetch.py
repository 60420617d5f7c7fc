"""The book's pages run two at a time before Jupyter Book does (book/prefetch.py).

The prefetch only saves time if Jupyter Book then finds each page in its cache: the page must be
read into the same notebook, so that jupyter-cache gives it the same key. ``make test`` runs after
``make book``, whose cache holds every page as Jupyter Book itself read and stored it.
"""
from __future__ import annotations

import pytest

from book import prefetch


def test_every_notebook_page_of_the_toc_is_prefetched():
    names = {p.relative_to(prefetch.ROOT).as_posix() for p in prefetch.pages()}
    assert {"chapters/09_real_models.md", "chapters/exercises/01_layernorm.md"} <= names
    assert "chapters/intro.md" not in names  # plain Markdown: nothing to execute
    assert not any(n.startswith(("solutions/", "exercises/", "tests/")) for n in names)


def test_the_prefetch_reads_each_page_under_the_key_jupyter_book_cached_it():
    from jupyter_cache import get_cache

    if not (prefetch.CACHE / "global.db").exists():
        pytest.skip("no book built here (make book)")
    cache = get_cache(str(prefetch.CACHE))
    missing = []
    for p in prefetch.pages():
        try:
            cache.match_cache_notebook(prefetch.read(p))
        except KeyError:
            missing.append(p.relative_to(prefetch.ROOT).as_posix())
    assert missing == [], f"read under another key than Jupyter Book's, so run twice: {missing}"


def test_the_longest_pages_go_first():
    from jupyter_cache import get_cache

    cache = get_cache(str(prefetch.CACHE)) if (prefetch.CACHE / "global.db").exists() else None
    order = sorted(prefetch.pages(), key=lambda p: -prefetch._hint(cache, p)) if cache else \
        sorted(prefetch.pages(), key=lambda p: -prefetch.SLOW.get(p.relative_to(prefetch.ROOT).as_posix(), 0))
    assert order[0].name == "12_streams.md"  # the longest in prefetch.SLOW (chapter 09 reads a record now)
