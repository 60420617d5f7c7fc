"""The built chapters fit a 1280 px window without sideways scrolling (issue 27, item 5).

book/static/book-layout.css lets the article use the width a wide window has and wraps printed
lines and code at the column's edge. In headless Chromium at 1280 x 900, every chapter page is
loaded and each table, code block and cell output is measured: none may be wider than the box it
sits in (scrollWidth > clientWidth is a sideways scroll bar), and the article must use most of the
window instead of leaving its right third empty.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from browser import chrome, served

pytestmark = pytest.mark.book

ROOT = Path(__file__).resolve().parent.parent
HTML = ROOT / "_build" / "html"
WIDTH = 1280
MIN_ARTICLE = 0.75  # of the window: the theme alone gave the article 740 px of 1280

CHAPTERS = sorted(p.relative_to(ROOT).with_suffix(".html").as_posix()
                  for p in (ROOT / "chapters").rglob("*.md") if "diagrams" not in p.parts)

MEASURE_JS = """
const sel = 'pre, table, div.cell_output, div.output, div.highlight, div.pst-scrollable-table-container';
const article = document.querySelector('article.bd-article') || document.querySelector('main');
const wide = [];
for (const el of article.querySelectorAll(sel)) {
  if (el.scrollWidth > el.clientWidth + 1 && el.clientWidth > 0) {
    wide.push([el.tagName.toLowerCase() + '.' + el.className.split(' ').join('.'),
               el.scrollWidth, el.clientWidth, (el.innerText || '').slice(0, 60)]);
  }
}
return {article: article.getBoundingClientRect().width, window: window.innerWidth,
        pageScroll: document.documentElement.scrollWidth > window.innerWidth + 1, wide: wide};
"""


@pytest.fixture(scope="module")
def site():
    with served(HTML) as url:
        yield url


@pytest.fixture(scope="module")
def measured(site):
    driver = chrome(width=WIDTH, height=900)
    try:
        out = {}
        for page in CHAPTERS:
            driver.get(f"{site}/{page}")
            out[page] = driver.execute_script(MEASURE_JS)
        return out
    finally:
        driver.quit()


@pytest.mark.parametrize("page", CHAPTERS)
def test_nothing_scrolls_sideways_at_1280(measured, page):
    m = measured[page]
    assert not m["pageScroll"], f"{page}: the page itself scrolls sideways at {WIDTH} px"
    assert not m["wide"], f"{page}: wider than their box at {WIDTH} px: {m['wide']}"


@pytest.mark.parametrize("page", CHAPTERS)
def test_the_article_uses_the_window(measured, page):
    m = measured[page]
    assert m["article"] >= MIN_ARTICLE * m["window"], (
        f"{page}: the article is {m['article']:.0f} px of a {m['window']} px window")
