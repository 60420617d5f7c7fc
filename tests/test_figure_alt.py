"""Every plot a chapter draws has alt text that says what it shows (issue 27, item 5).

A plot is drawn by a code cell, and myst-nb gives the image the alt text of that cell's
``mystnb: image: alt:`` option; without it the built page's alt is the image's file name, a hash.
The first tests read the chapters' sources: each cell that makes a figure has an alt text of a
few sentences, and makes one figure only (a cell's alt is shared by its images). The last reads
the built pages: every image a notebook cell produced carries its cell's alt text, never its file
name. The SVG diagrams' alt text is checked in tests/test_diagrams.py.
"""
from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = ROOT / "chapters"
HTML = ROOT / "_build" / "html"
# what a cell that draws a figure calls (pyplot's figure makers)
MAKES_FIGURE = re.compile(r"\bplt\.(subplots|figure|subplot_mosaic)\(")
# myst-nb names a cell's output image by the SHA-256 of its bytes
GENERATED = re.compile(r"(?:^|/)_images/([0-9a-f]{64})\.(png|jpe?g|svg|gif)$")
MIN_ALT = 80  # characters: a sentence that names the axes and says what the lines do


def _notebook_chapters() -> list[Path]:
    return sorted(p for p in CHAPTERS.rglob("*.md")
                  if "diagrams" not in p.parts and p.read_text(encoding="utf-8").startswith("---\njupytext:"))


def _figure_cells(md: Path) -> list[tuple[str, dict]]:
    """(source, metadata) of each code cell in ``md`` that makes a figure, in page order."""
    from myst_nb.core.read import read_myst_markdown_notebook

    nb = read_myst_markdown_notebook(md.read_text(encoding="utf-8"))
    return [(c.source, c.metadata) for c in nb.cells
            if c.cell_type == "code" and MAKES_FIGURE.search(c.source)]


CELLS = [(md, i, src, meta) for md in _notebook_chapters()
         for i, (src, meta) in enumerate(_figure_cells(md))]
IDS = [f"{md.stem}-figure{i + 1}" for md, i, _, _ in CELLS]


def _alt(meta: dict) -> str:
    return str(((meta.get("mystnb") or {}).get("image") or {}).get("alt") or "").strip()


def bad_alt(alt: str, filename: str = "") -> str | None:
    """Why ``alt`` is not alt text for a plot, or None when it is."""
    if not alt:
        return "no alt text"
    if filename and alt in (filename, Path(filename).name, Path(filename).stem):
        return f"the alt text is the file name {filename!r}"
    if re.fullmatch(r"[\w./-]+\.(png|jpe?g|svg|gif)", alt) or re.fullmatch(r"[0-9a-f]{32,}", alt):
        return f"the alt text {alt!r} is a file name or a hash"
    if len(alt) < MIN_ALT:
        return f"the alt text is {len(alt)} characters, too short to say what the plot shows: {alt!r}"
    return None


def test_the_chapters_draw_plots():
    assert len(CELLS) >= 20, f"only {len(CELLS)} figure cells found: is MAKES_FIGURE still right?"


@pytest.mark.parametrize("md, i, src, meta", CELLS, ids=IDS)
def test_each_figure_cell_has_alt_text(md, i, src, meta):
    problem = bad_alt(_alt(meta))
    assert problem is None, (
        f"{md.relative_to(ROOT)}, figure {i + 1}: {problem}. Give the code cell a "
        "`mystnb: image: alt:` option that says what the plot shows.")


@pytest.mark.parametrize("md, i, src, meta", CELLS, ids=IDS)
def test_each_figure_cell_makes_one_figure(md, i, src, meta):
    assert len(MAKES_FIGURE.findall(src)) == 1, (
        f"{md.relative_to(ROOT)}, figure {i + 1}: a cell's alt text goes to all of its images; "
        "draw one figure per cell")


def test_the_check_rejects_file_names_and_empty_alt():
    name = "0a4c41a31a64bcb538a9b16dd4063b27a1f888297b82cc56e1c7bfd1b03dff57.png"
    assert bad_alt("") and bad_alt(name, f"_images/{name}") and bad_alt(name)
    assert bad_alt(name[:-4]) and bad_alt("plot")
    assert bad_alt("Training loss against step for four variants; the deep post-norm one stays "
                   "highest while the others fall together.") is None


class _Images(HTMLParser):
    def __init__(self):
        super().__init__()
        self.images: list[dict] = []

    def handle_starttag(self, tag, attrs):
        if tag == "img":
            self.images.append(dict(attrs))


def _generated_images(page: Path) -> list[tuple[str, str]]:
    parser = _Images()
    parser.feed(page.read_text(encoding="utf-8"))
    return [(img.get("src", ""), img.get("alt") or "") for img in parser.images
            if GENERATED.search(img.get("src", ""))]


@pytest.mark.book
def test_the_built_pages_give_each_plot_its_alt_text():
    if not (HTML / "index.html").exists():
        pytest.fail(f"{HTML} is missing: build the book first with `make book`", pytrace=False)
    problems, seen = [], 0
    for md in _notebook_chapters():
        page = HTML / md.relative_to(ROOT).with_suffix(".html")
        if not page.exists():
            problems.append(f"{page.relative_to(ROOT)} was not built")
            continue
        images = _generated_images(page)
        seen += len(images)
        for src, alt in images:
            problem = bad_alt(alt, src)
            if problem:
                problems.append(f"{page.relative_to(HTML)}: {src}: {problem}")
        expected = [" ".join(_alt(meta).split()) for _, meta in _figure_cells(md)]
        got = [" ".join(alt.split()) for _, alt in images]
        if got != expected:
            problems.append(f"{page.relative_to(HTML)}: the images' alt texts are not those of the "
                            f"page's figure cells, in order ({len(got)} images, {len(expected)} cells)")
    assert seen >= 20, f"only {seen} generated images in the built chapters"
    assert not problems, "\n".join(problems)
