"""axe-core (WCAG 2.1 A and AA rules) over every built page, in headless Chromium (issue 27, item 5).

axe-core comes from npm at a pinned version, into _build/axe/ (``make test`` installs it, as it
does the class server's proxy). Each page of _build/html is served on 127.0.0.1, loaded, and
axe's WCAG 2.0/2.1 A and AA rules run on it. A violation of impact "serious" or "critical" fails
the page, unless KNOWN lists it: the theme's own markup that no page or setting of the course
can change, each entry with its reason.
"""
from __future__ import annotations

from pathlib import Path

import pytest
from browser import chrome, served

pytestmark = pytest.mark.book

ROOT = Path(__file__).resolve().parent.parent
HTML = ROOT / "_build" / "html"
AXE_VERSION = "4.10.3"  # the Makefile's AXE_VERSION
AXE = ROOT / "_build" / "axe" / "node_modules" / "axe-core" / "axe.min.js"
TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]
FAILING = {"serious", "critical"}
SKIP_PAGES = {"genindex.html", "search.html"}
# (rule id, CSS selector of the node) that the course cannot fix, with the reason
KNOWN: dict[tuple[str, str], str] = {}


def _pages() -> list[str]:
    if not (HTML / "index.html").exists():
        return []
    return sorted(p.relative_to(HTML).as_posix() for p in HTML.rglob("*.html")
                  if "_static" not in p.parts and "_sources" not in p.parts
                  and p.name not in SKIP_PAGES and p.relative_to(HTML).as_posix() != "index.html")


PAGES = _pages()

RUN_AXE_JS = """
const done = arguments[arguments.length - 1];
axe.run(document, {runOnly: {type: 'tag', values: arguments[0]}, resultTypes: ['violations']})
  .then(r => done(r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
      nodes: v.nodes.map(n => [n.target.join(' '), n.html.slice(0, 120)])}))))
  .catch(e => done({error: String(e)}));
"""


@pytest.fixture(scope="module")
def violations():
    if not AXE.exists():
        pytest.fail(f"{AXE} is missing: `make test` installs axe-core@{AXE_VERSION} from npm", pytrace=False)
    source = AXE.read_text(encoding="utf-8")

    with served(HTML) as url:
        return _run_axe(url, source)


def _run_axe(url, source):
    driver = chrome(width=1280, height=900)
    try:
        out = {}
        for page in PAGES:
            driver.get(f"{url}/{page}")
            driver.execute_script(source)
            found = driver.execute_async_script(RUN_AXE_JS, TAGS)
            assert "error" not in found, f"{page}: axe failed: {found}"
            out[page] = found
        return out
    finally:
        driver.quit()


def test_axe_is_the_pinned_version():
    if not AXE.exists():
        pytest.fail(f"{AXE} is missing: `make test` installs axe-core@{AXE_VERSION} from npm", pytrace=False)
    assert f"axe v{AXE_VERSION}" in AXE.read_text(encoding="utf-8")[:300]
    makefile = (ROOT / "Makefile").read_text()
    assert f"AXE_VERSION := {AXE_VERSION}" in makefile


@pytest.mark.parametrize("page", PAGES)
def test_no_serious_accessibility_violation(violations, page):
    bad = [f"{v['id']} ({v['impact']}: {v['help']}): {node}"
           for v in violations[page] if v["impact"] in FAILING
           for node in v["nodes"] if (v["id"], node[0]) not in KNOWN]
    assert not bad, f"{page}:\n" + "\n".join(bad)
