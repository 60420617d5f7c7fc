"""A Sphinx extension: the markup fixes that axe-core asks of the theme and of docutils (issue 27).

tests/test_book_axe.py runs axe-core's WCAG 2.1 A/AA rules over every built page. Two serious or
critical findings come from markup the book does not write itself, and are fixed here as each page
is rendered (``html-page-context``), not by editing the generated files:

- the sidebar's expandable entries (pydata-sphinx-theme's ``<details><summary>``) hold only a
  decorative chevron when the entry has no caption, so a screen reader announces a nameless
  control (rule ``summary-name``): the summary gets an ``aria-label`` naming the entry;
- docutils marks each bibliography entry ``role="doc-biblioentry"``, a role DPUB-ARIA 1.1
  deprecated, inside a ``role="list"``, so the list has no list items (``aria-required-children``):
  each entry becomes a ``listitem``.
"""
from __future__ import annotations

import functools
import re

BIBLIOENTRY = re.compile(r'(<div class="citation" id="[^"]*") role="doc-biblioentry"')


def label_summaries(html: str) -> str:
    """Give every ``<summary>`` that has no text an ``aria-label`` naming its sidebar entry."""
    if "<summary" not in html:
        return html
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, "html.parser")
    for summary in soup.find_all("summary"):
        if summary.get_text(strip=True) or summary.get("aria-label"):
            continue
        item = summary.find_parent("li")
        link = item.find("a") if item is not None else None
        name = link.get_text(" ", strip=True) if link is not None else ""
        summary["aria-label"] = f"Show or hide the pages of {name}" if name else "Show or hide the pages"
    return str(soup)


def _labelled(generate):
    @functools.wraps(generate)
    def wrapper(*args, **kwargs):
        return label_summaries(str(generate(*args, **kwargs)))

    return wrapper


def _page_context(app, pagename, templatename, context, doctree) -> None:
    if callable(context.get("generate_toctree_html")):
        context["generate_toctree_html"] = _labelled(context["generate_toctree_html"])
    if "body" in context:
        context["body"] = BIBLIOENTRY.sub(r'\1 role="listitem"', context["body"])


def setup(app):
    # after the theme (priority 500) has put its toctree function into the context
    app.connect("html-page-context", _page_context, priority=900)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
