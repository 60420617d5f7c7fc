"""The book's diagrams: hand-written SVG files under chapters/diagrams/.

Each one must be a self-contained picture that renders offline: well-formed XML with an <svg>
root, a <title> for screen readers, no scripts or event handlers, no reference to anything outside
the file (no URLs, no external images or fonts), and text in a generic font family. Each one must
be used by a chapter, in a {figure} directive with alt text and a caption, and appear as an image
in the built page. The browser tests (tests/test_book_browser.py) check that every image loaded.
"""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = pytest.mark.book

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = ROOT / "chapters"
DIAGRAMS = CHAPTERS / "diagrams"
HTML = ROOT / "_build" / "html"
SVG_NS = "http://www.w3.org/2000/svg"
XLINK_HREF = "{http://www.w3.org/1999/xlink}href"
GENERIC_FONTS = {"serif", "sans-serif", "monospace", "system-ui"}
MIN_DIAGRAMS = 6

SVGS = sorted(DIAGRAMS.glob("*.svg"))
SVG_IDS = [p.name for p in SVGS]
# what a figure directive that shows a diagram looks like in a chapter's MyST source
FIGURE_RE = re.compile(r"^(`{3,}|:{3,})\{figure\}\s+(\S*diagrams/([\w.-]+\.svg))\s*$")


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _chapter_sources() -> list[Path]:
    return sorted(p for p in CHAPTERS.rglob("*.md") if "diagrams" not in p.parts)


def _figures() -> list[dict]:
    """Every {figure} of a diagram in the chapters: file, chapter, options, caption lines."""
    found = []
    for md in _chapter_sources():
        lines = md.read_text(encoding="utf-8").splitlines()
        i = 0
        while i < len(lines):
            m = FIGURE_RE.match(lines[i].strip())
            if not m:
                i += 1
                continue
            fence, target, name = m.group(1), m.group(2), m.group(3)
            options, body = {}, []
            i += 1
            while i < len(lines) and lines[i].strip() != fence:
                line = lines[i].strip()
                opt = re.match(r"^:(\w[\w-]*):\s*(.*)$", line)
                if opt and not body:
                    options[opt.group(1)] = opt.group(2)
                elif line:
                    body.append(line)
                i += 1
            found.append({"name": name, "target": target, "chapter": md, "options": options,
                          "caption": body})
            i += 1
    return found


FIGURES = _figures()


def test_enough_diagrams():
    assert len(SVGS) >= MIN_DIAGRAMS, (
        f"{len(SVGS)} SVG files under {DIAGRAMS.relative_to(ROOT)}, at least {MIN_DIAGRAMS} expected")


@pytest.mark.parametrize("svg", SVGS, ids=SVG_IDS)
def test_parses_with_svg_root_and_title(svg):
    root = ET.parse(svg).getroot()          # raises on malformed XML
    assert root.tag == f"{{{SVG_NS}}}svg", f"{svg.name}: root element is {root.tag}, not an SVG <svg>"
    assert root.get("viewBox"), f"{svg.name}: no viewBox, so it cannot scale to the page width"
    children = list(root)
    assert children and _local(children[0].tag) == "title", (
        f"{svg.name}: the first child of <svg> must be its <title> (read by screen readers)")
    assert (children[0].text or "").strip(), f"{svg.name}: empty <title>"


@pytest.mark.parametrize("svg", SVGS, ids=SVG_IDS)
def test_self_contained(svg):
    """No scripts, no event handlers, no URL, no reference to another file or an external font."""
    raw = svg.read_text(encoding="utf-8")
    # namespace declarations name the SVG vocabulary; they are not fetched
    without_ns = re.sub(r'\sxmlns(:\w+)?="[^"]*"', "", raw)
    for bad in ("http:", "https:", "//", "ftp:", "file:", "@import", "@font-face"):
        assert bad not in without_ns, f"{svg.name}: contains {bad!r}"
    root = ET.parse(svg).getroot()
    for el in root.iter():
        tag = _local(el.tag)
        assert tag not in {"script", "foreignObject", "iframe", "object", "embed"}, (
            f"{svg.name}: <{tag}> is not allowed")
        for attr, value in el.attrib.items():
            name = _local(attr)
            assert not name.lower().startswith("on"), f"{svg.name}: event handler {name}= on <{tag}>"
            if name == "href" or attr == XLINK_HREF:
                assert value.startswith("#"), (
                    f"{svg.name}: <{tag} href={value!r}> points outside the file")
            for ref in re.findall(r"url\(([^)]*)\)", value):
                assert ref.strip("'\" ").startswith("#"), (
                    f"{svg.name}: url({ref}) points outside the file")
            fonts = [value] if name == "font-family" else (
                re.findall(r"font-family\s*:\s*([^;]+)", value) if name == "style" else [])
            for font in fonts:
                families = {f.strip().strip("'\"").lower() for f in font.split(",")}
                assert families & GENERIC_FONTS, (
                    f"{svg.name}: font-family {font!r} names no generic family "
                    f"({', '.join(sorted(GENERIC_FONTS))})")
        if tag == "style":
            css = el.text or ""
            assert "url(" not in css.replace("url(#", ""), f"{svg.name}: <style> loads a URL"


@pytest.mark.parametrize("svg", SVGS, ids=SVG_IDS)
def test_has_text_in_generic_font(svg):
    """Labels are real <text> (selectable, searchable, scalable), in a generic font family."""
    root = ET.parse(svg).getroot()
    texts = [el for el in root.iter() if _local(el.tag) == "text"]
    assert texts, f"{svg.name}: no <text> element"
    assert root.get("font-family"), f"{svg.name}: set a generic font-family on the <svg> element"


@pytest.mark.parametrize("svg", SVGS, ids=SVG_IDS)
def test_used_by_a_chapter_with_caption_and_alt(svg):
    uses = [f for f in FIGURES if f["name"] == svg.name]
    assert uses, f"{svg.name} is not shown by any chapter in a {{figure}} directive"
    for fig in uses:
        where = f"{fig['chapter'].relative_to(ROOT)} ({svg.name})"
        assert (fig["chapter"].parent / fig["target"]).resolve() == svg.resolve(), (
            f"{where}: the figure's path {fig['target']} does not lead to {svg.relative_to(ROOT)}")
        assert fig["options"].get("alt", "").strip(), f"{where}: the figure has no :alt: text"
        assert fig["caption"], f"{where}: the figure has no caption"


def test_every_diagram_figure_exists():
    names = {p.name for p in SVGS}
    missing = [f"{f['chapter'].relative_to(ROOT)}: {f['target']}" for f in FIGURES
               if f["name"] not in names]
    assert not missing, f"figures of diagrams that do not exist: {missing}"


@pytest.mark.parametrize("svg", SVGS, ids=SVG_IDS)
def test_in_built_page(svg):
    """The built page of every chapter that uses the diagram shows it as an <img>."""
    if not (HTML / "index.html").exists():
        pytest.fail(f"{HTML} is missing: build the book first with `make book`", pytrace=False)
    for fig in (f for f in FIGURES if f["name"] == svg.name):
        page = HTML / fig["chapter"].relative_to(ROOT).with_suffix(".html")
        html = page.read_text(encoding="utf-8")
        srcs = re.findall(r'<img[^>]*\bsrc="([^"]+)"', html)
        assert any(Path(src).name == svg.name for src in srcs), (
            f"{page.relative_to(ROOT)} has no <img> showing {svg.name}: {srcs}")
