"""The built book in a real browser: headless Chromium (Debian's) driven by selenium.

Run after ``make book`` (``make test`` builds the book first). Every page of _build/html is
served from a local http.server on 127.0.0.1 and loaded once; the tests check what a reader
would see: math typeset by MathJax, images loaded, internal links resolving, search working, and
no request leaving the machine. A screenshot of a chapter lands in _build/artifacts/.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path
from urllib.parse import unquote, urldefrag, urlparse

import pytest
from browser import chrome, served

pytestmark = pytest.mark.book

ROOT = Path(__file__).resolve().parent.parent
HTML = ROOT / "_build" / "html"
ARTIFACTS = ROOT / "_build" / "artifacts"
SKIP_PAGES = {"genindex.html", "search.html"}


def _pages() -> list[str]:
    if not (HTML / "index.html").exists():
        return []
    return sorted(str(p.relative_to(HTML)) for p in HTML.rglob("*.html")
                  if "_static" not in p.parts and "_sources" not in p.parts
                  and p.name not in SKIP_PAGES and p.relative_to(HTML).as_posix() != "index.html")  # the root: a redirect


PAGES = _pages()


@pytest.fixture(scope="session")
def site():
    with served(HTML) as url:
        yield url


@pytest.fixture(scope="session")
def browser():
    driver = chrome(width=1280, height=2000)
    yield driver
    driver.quit()


# Waits for MathJax's startup promise and for every image to finish loading, then reports.
PAGE_REPORT_JS = """
const done = arguments[arguments.length - 1];
const settle = (window.MathJax && MathJax.startup && MathJax.startup.promise)
    ? MathJax.startup.promise : Promise.resolve();
const imgs = Array.from(document.images).map(img => img.complete ? Promise.resolve() :
    new Promise(r => { img.onload = r; img.onerror = r; }));
Promise.all([settle, ...imgs]).then(() => {
  const main = document.querySelector('main') || document.body;
  const clone = main.cloneNode(true);
  clone.querySelectorAll('mjx-container, script, style, pre, code, .highlight, .cell_output')
       .forEach(e => e.remove());
  done({
    mathjax: !!window.MathJax,
    mjx: document.querySelectorAll('mjx-container').length,
    mjxErrors: document.querySelectorAll('mjx-merror').length,
    mathSpans: document.querySelectorAll('.math').length,
    text: clone.innerText,
    images: Array.from(document.images).map(i => [i.currentSrc || i.src, i.naturalWidth]),
    links: Array.from(document.querySelectorAll('a[href]')).map(a => a.href),
    requests: performance.getEntriesByType('resource').map(e => e.name)
              .concat([location.href]),
  });
}).catch(err => done({error: String(err)}));
"""


@pytest.fixture(scope="session")
def reports(site, browser):
    """Load every page once; return {page: report}."""
    out = {}
    for page in PAGES:
        browser.get(f"{site}/{page}")
        rep = browser.execute_async_script(PAGE_REPORT_JS)
        assert "error" not in rep, f"{page}: {rep.get('error')}"
        out[page] = rep
    return out


def _local(url: str, site: str) -> bool:
    return url.startswith(site + "/") or url == site or url.startswith(("data:", "blob:", "about:"))


def test_pages_were_found():
    assert PAGES, f"no pages under {HTML}: build the book with `make book`"
    assert "chapters/01_depth.html" in PAGES
    # the instructors' part (docs/, issue 29) is checked like every other page
    assert {f"docs/{p.stem}.html" for p in (ROOT / "docs").glob("*.md")} <= set(PAGES)


@pytest.mark.parametrize("page", PAGES)
def test_math_typeset(reports, page):
    """MathJax ran, typeset every math element without errors, and no raw TeX delimiters remain."""
    rep = reports[page]
    if rep["mathSpans"]:  # Sphinx loads MathJax only on pages that have math
        assert rep["mathjax"], f"{page}: MathJax did not load"
        assert rep["mjx"] >= rep["mathSpans"], (
            f"{page}: {rep['mathSpans']} math elements but only {rep['mjx']} typeset")
    assert rep["mjxErrors"] == 0, f"{page}: {rep['mjxErrors']} MathJax errors"
    raw = [m for m in ("$$", "\\(", "\\)", "\\[", "\\]", "\\frac", "\\sqrt") if m in rep["text"]]
    assert not raw, f"{page}: raw TeX left in the text: {raw}"


@pytest.mark.parametrize("page", PAGES)
def test_images_loaded(reports, page):
    bad = [src for src, width in reports[page]["images"] if not width]
    assert not bad, f"{page}: images that did not load: {bad}"


@pytest.mark.parametrize("page", PAGES)
def test_no_external_requests(reports, site, page):
    """Every request the page made (scripts, fonts, styles, images) went to 127.0.0.1."""
    outside = [u for u in reports[page]["requests"] if not _local(u, site)]
    assert not outside, f"{page}: requests left the machine: {outside}"


@pytest.mark.parametrize("page", PAGES)
def test_local_requests_found(reports, site, page):
    """Every file the page asked the local server for (MathJax's fonts and extensions included) exists."""
    missing = []
    for url in reports[page]["requests"]:
        if not url.startswith(site + "/"):
            continue
        path = HTML / unquote(urlparse(url).path).lstrip("/")
        if not (path.is_file() or (path.is_dir() and (path / "index.html").is_file())):
            missing.append(url)
    assert not missing, f"{page}: requests for files that are not in the site: {missing}"


@functools.lru_cache(maxsize=None)
def _ids(path: Path) -> frozenset:
    text = path.read_text(encoding="utf-8", errors="replace")
    return frozenset(re.findall(r'\bid="([^"]+)"', text))


@pytest.mark.parametrize("page", PAGES)
def test_internal_links_resolve(reports, site, page):
    """Every link to this site points at an existing file, and its #anchor exists there."""
    broken = []
    for href in reports[page]["links"]:
        if not href.startswith(site):
            continue
        url, frag = urldefrag(href)
        path = HTML / unquote(urlparse(url).path).lstrip("/")
        if path.is_dir():
            path = path / "index.html"
        if not path.exists():
            broken.append(href)
        elif frag and path.suffix == ".html" and unquote(frag) not in _ids(path):
            broken.append(href)
    assert not broken, f"{page}: broken internal links: {broken}"


def test_downloads_present():
    """The exercise pages' download links point at the student notebooks, copied into the site."""
    notebooks = list((HTML / "_downloads").rglob("*.ipynb"))
    names = {p.name for p in notebooks}
    for name in ["layernorm.ipynb", "rmsnorm.ipynb", "residual.ipynb", "transformer_block.ipynb"]:
        assert name in names, f"{name} is not among the site's downloads: {sorted(names)}"


def test_search_finds_rmsnorm(site, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as EC
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(f"{site}/search.html?q=RMSNorm")
    WebDriverWait(browser, 30).until(
        EC.presence_of_element_located((By.CSS_SELECTOR, "#search-results ul.search li")))
    hits = [a.get_attribute("href") for a in
            browser.find_elements(By.CSS_SELECTOR, "#search-results ul.search li a")]
    assert any("04_rmsnorm" in h for h in hits), f"search for RMSNorm did not find the chapter: {hits}"


def test_no_cdn_mathjax_in_html():
    """Sphinx's default MathJax URL appears in no built page."""
    bad = [str(p.relative_to(HTML)) for p in HTML.rglob("*.html")
           if re.search(r"cdn\.jsdelivr\.net|mathjax@3/es5", p.read_text(errors="replace"))]
    assert not bad, f"pages loading MathJax from a CDN: {bad}"


def test_screenshot_chapter(site, browser):
    """Save a screenshot of a chapter with math and a plot, for a person to look at."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    browser.get(f"{site}/chapters/02_residual.html")
    browser.execute_async_script(PAGE_REPORT_JS)
    shot = ARTIFACTS / "02_residual.png"
    assert browser.save_screenshot(str(shot)), "screenshot failed"
    assert shot.stat().st_size > 10_000


EXERCISE_PAGES = [p for p in PAGES if p.startswith("chapters/exercises/")]


@pytest.mark.parametrize("page", EXERCISE_PAGES)
def test_exercise_page_lists_its_tests_in_a_real_table(site, browser, page):
    """The "What the tests check" table is an HTML table (myst-nb renders a cell's Markdown output
    as GitHub-flavoured Markdown here; as CommonMark it would be raw pipe text)."""
    browser.get(f"{site}/{page}")
    rows = browser.execute_script(
        "return Array.from(document.querySelectorAll('main table tr')).map(r => r.innerText);")
    text = browser.execute_script("return (document.querySelector('main') || document.body).innerText;")
    assert any("points" in r for r in rows) and len(rows) >= 5, rows
    assert "| test (grade id)" not in text and "|---|" not in text


@pytest.mark.parametrize("page", EXERCISE_PAGES)
def test_exercise_page_launch_links_open_the_notebook_itself(reports, page):
    links = [u for u in reports[page]["links"] if "colab.research.google.com" in u or "mybinder.org" in u]
    assert len(links) == 2, links
    nb = "exercises/" + page.split("/")[-1].replace(".html", "")
    assert all(nb in u and ".ipynb" in u for u in links), links


def test_no_placeholder_or_source_launch_urls_in_the_book():
    """No theme launch button (it would open a page's .md source) and no placeholder host."""
    for path in HTML.rglob("*.html"):
        page = path.read_text(errors="replace")
        assert "example.edu" not in page and "example.com" not in page, path
        assert not re.search(r"(colab\.research\.google\.com|mybinder\.org)[^\"']*\.md\b", page), path
