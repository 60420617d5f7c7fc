"""The book's build prints one line per notebook page, with its seconds (issue 27, item 6).

book/progress.py is a Sphinx extension that _config.yml loads. These tests build a two-page
project with myst-nb and the extension (one code cell, a few seconds: a kernel starts once) and
read Sphinx's output: the first build executes the page, the second takes it from the cache.
"""
from __future__ import annotations

import io
import re
import textwrap
from pathlib import Path

import yaml

from book import progress

ROOT = Path(__file__).resolve().parent.parent
LINE = re.compile(r"^book: \[\s*(\d+)/(\d+)\] (\S+): (executed in |from the cache \()(\d+\.\d) s\)?$", re.M)


def test_the_line_names_the_page_and_its_seconds():
    assert progress.line(9, 27, "chapters/09_real_models", 612.34, True) == \
        "book: [ 9/27] chapters/09_real_models: executed in 612.3 s"
    assert progress.line(10, 27, "chapters/10_backward", 0.41, False) == \
        "book: [10/27] chapters/10_backward: from the cache (0.4 s)"


def test_the_book_loads_the_extension():
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert "book.progress" in config["sphinx"]["extra_extensions"]


def _build(src: Path, out: Path) -> str:
    from sphinx.application import Sphinx

    status = io.StringIO()
    app = Sphinx(str(src), str(src), str(out / "html"), str(out / "doctrees"), "html",
                 status=status, warning=status, freshenv=True)
    app.build()
    return status.getvalue()


def test_a_build_prints_one_line_per_executed_page_then_cached(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(textwrap.dedent(f"""
        extensions = ["myst_nb", "book.progress"]
        nb_execution_mode = "cache"
        nb_execution_cache_path = {str(tmp_path / "cache")!r}
        exclude_patterns = ["_build"]
    """))
    (src / "index.md").write_text("# Home\n\n```{toctree}\nnb\n```\n")
    (src / "nb.md").write_text(textwrap.dedent("""\
        ---
        jupytext:
          text_representation:
            extension: .md
            format_name: myst
        kernelspec:
          name: python3
          display_name: Python 3
        ---
        # A page with code

        ```{code-cell} ipython3
        import time
        time.sleep(0.3)
        print(6 * 7)
        ```
    """))
    log = _build(src, tmp_path / "out1")
    first = LINE.findall(log)
    assert len(first) == 1, log              # index.md has no code: no line
    index, total, doc, what, seconds = first[0]
    assert (doc, what, total) == ("nb", "executed in ", "2")
    assert float(seconds) >= 0.3
    second = LINE.findall(_build(src, tmp_path / "out2"))
    assert [(d, w) for _, _, d, w, _ in second] == [("nb", "from the cache (")], second
