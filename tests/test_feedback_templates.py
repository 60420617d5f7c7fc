"""The feedback pages and the class report (autograder/report/feedback.py, autograder/report/templates/) without
grading anything: outcomes made here, with hostile values wherever a submission can put text (student
id and name, the checks' messages, notes, cell errors). The template engine escapes every one of them;
the report's links to feedback pages are URL-quoted and lead to the files write_all writes; the
pages are self-contained (inline PNG plots, no scripts, no external URLs) and show no test code."""
from __future__ import annotations

import re
import tomllib
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import jinja2
import pytest

from autograder.report import feedback
from autograder.grade import Outcome
from autograder.grade import TestResult as Result
from autograder.intake.ingest import safe_id

pytestmark = pytest.mark.autograder

ROOT = Path(__file__).resolve().parents[1]
TEMPLATES = ROOT / "autograder" / "report" / "templates"
XSS = '<script>alert(1)</script>"onmouseover=alert(2) x=\'y\' Tom & Jerry'
# An id as a submission can give it (ingest keeps ids as given, only "/" and NUL are replaced):
# URL-special characters, an attribute break-out, an entity, a tag.
HOSTILE_ID = safe_id('a b#1?x%41&"onmouseover=alert(2)<script>alert(1)')
IDS = [HOSTILE_ID, "zoë", "王芳", "ada"]
A1, A2 = "01_layernorm", "02_rmsnorm"
HIDDEN = "### BEGIN HIDDEN TESTS\nassert run('layernorm_secret')"


def _tests(i: int, hostile: bool) -> list[Result]:
    msg = ("wrong: " + XSS) if hostile else f"wrong by {i}.5"
    return [Result("layernorm_parameters", "weight and bias of the right shape", 2.0, 2.0, True),
            Result("layernorm_matches_torch", "same output as torch's", 0.0, 3.0, False, msg),
            Result("layernorm_benchmark", "vectorized: within a factor of torch's time", 2.0, 2.0, True,
                       "ratio fine" + (" " + XSS if hostile else ""),
                       {"ratio": 1.5 + i, "yours_ms": 0.3, "report": "rows  ratio\n4096  1.5" + (XSS if hostile else "")},
                       "benchmark")]


def _outcomes() -> list[Outcome]:
    outs = []
    for i, s in enumerate(IDS):
        hostile = s == HOSTILE_ID
        outs.append(Outcome(s, A1, student_name=("Name " + XSS) if hostile else s.title(), notebook="layernorm.ipynb",
                            score=4.0, max_score=7.0, status="timeout" if hostile else "graded",
                            message=("msg " + XSS) if hostile else "2 of 3 tests passed", tests=_tests(i, hostile),
                            notes=["note " + XSS] if hostile else [],
                            cell_errors=[{"label": "cell " + XSS, "error": "ZeroDivisionError: " + XSS}] if hostile else [],
                            output_tail=HIDDEN))
    outs.append(Outcome("zoë", A2, notebook="rmsnorm.ipynb", max_score=5.0, status="missing", message="not submitted"))
    outs.append(Outcome(HOSTILE_ID, "?", status="unknown-assignment", message="matches no assignment: " + XSS))
    return outs


class _Page(HTMLParser):
    """The text a browser shows, and the tags and attributes it reads."""

    def __init__(self, html: str):
        super().__init__(convert_charrefs=True)
        self.text, self.tags, self.attrs = [], [], []
        self.feed(html)
        self.close()
        self.text = "".join(self.text)

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs += [(tag, k, v) for k, v in attrs]

    def handle_data(self, data):
        self.text += [data]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    outs = _outcomes()
    feedback.write_all(outs, out)
    return {"out": out, "outcomes": outs, "report": (out / "report.html").read_text(encoding="utf-8"),
            "pages": {p: p.read_text(encoding="utf-8") for p in (out / "feedback").rglob("*.html")}}


def _hostile_page(written) -> str:
    return written["pages"][written["out"] / "feedback" / HOSTILE_ID / A1 / "layernorm.html"]


def _no_raw_data(html: str):
    assert "<script" not in html.lower()
    assert '"onmouseover' not in html and "'onmouseover" not in html  # quotes escaped: no attribute break-out
    assert "Tom & Jerry" not in html and "Tom &amp; Jerry" in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_feedback_escapes_everything_from_the_submission(written):
    page = _hostile_page(written)
    _no_raw_data(page)
    seen = _Page(page)
    assert seen.tags.count("script") == 0 and not any(k.startswith("on") for _, k, _v in seen.attrs)
    # Escaped, not dropped: a browser shows each value exactly as the submission gave it.
    for shown in ("Name " + XSS, "msg " + XSS, "note " + XSS, "cell " + XSS, "ZeroDivisionError: " + XSS,
                  "wrong: " + XSS, "4096  1.5" + XSS, HOSTILE_ID):
        assert shown in seen.text, shown
    assert "4 / 7" in seen.text and "stopped: time limit" in seen.text and "layernorm_matches_torch" in seen.text


def test_report_escapes_everything_from_the_submission(written):
    report = written["report"]
    _no_raw_data(report)
    seen = _Page(report)
    assert seen.tags.count("script") == 0 and not any(k.startswith("on") for _, k, _v in seen.attrs)
    for shown in ("wrong: " + XSS, "matches no assignment: " + XSS, HOSTILE_ID, "zoë", "王芳"):
        assert shown in seen.text, shown
    assert f"{len(IDS)} students, 2 assignments, {len(written['outcomes'])} rows." in seen.text


def test_report_links_are_quoted_and_lead_to_the_written_pages(written):
    out, report = written["out"], written["report"]
    hrefs = [v for tag, k, v in _Page(report).attrs if tag == "a" and k == "href"]
    assert len(hrefs) == len([o for o in written["outcomes"] if o.notebook])
    resolved = set()
    for h in hrefs:
        assert re.fullmatch(r"[A-Za-z0-9_.~%/-]+", h), f"not URL-quoted: {h!r}"
        parts = urlsplit(h)
        assert not (parts.scheme or parts.netloc or parts.query or parts.fragment), h
        target = out.joinpath(*[unquote(p) for p in h.split("/")])
        assert target.is_file(), f"{h!r} leads to {target}, which write_all did not write"
        resolved.add(target)
    assert resolved == set(written["pages"])  # every feedback page is reachable from the report
    hostile = [h for h in hrefs if unquote(h.split("/")[1]) == HOSTILE_ID]
    assert hostile == ["feedback/a%20b%231%3Fx%2541%26%22onmouseover%3Dalert%282%29%3Cscript%3Ealert%281%29/"
                       "01_layernorm/layernorm.html"]
    assert "feedback/zo%C3%AB/01_layernorm/layernorm.html" in hrefs
    assert "feedback/%E7%8E%8B%E8%8A%B3/01_layernorm/layernorm.html" in hrefs


def test_pages_are_self_contained_and_show_no_test_code(written):
    report = written["report"]
    assert "data:image/png;base64," in report
    for html in [report, *written["pages"].values()]:
        assert "<script" not in html.lower()
        assert "http://" not in html and "https://" not in html
        assert "### BEGIN HIDDEN TESTS" not in html and "layernorm_secret" not in html
        for tag, k, v in _Page(html).attrs:
            if k == "src":
                assert tag == "img" and v.startswith("data:image/png;base64,"), (tag, v[:60])
            if k == "href":
                assert tag == "a" and v.startswith("feedback/"), (tag, v)
        assert "<style>" in html  # the CSS is inline
    page = _hostile_page(written)
    assert "<pre>" in page and "yours_ms" in page  # the benchmark's numbers are shown


def test_templates_escape_by_the_engine():
    env = feedback.environment()
    assert env.autoescape is True and env.undefined is jinja2.StrictUndefined
    for t in ("base.html.j2", "feedback.html.j2", "report.html.j2"):
        src = (TEMPLATES / t).read_text()
        assert "|safe" not in src.replace(" ", "") and "autoescape false" not in src and "<script" not in src
    code = (ROOT / "autograder" / "report" / "feedback.py").read_text()
    assert "html.escape" not in code and "Markup" not in code and "<td" not in code


def test_templates_are_package_data():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    globs = data["autograder.report"]
    for t in TEMPLATES.iterdir():
        if t.is_file():
            assert any(t.relative_to(TEMPLATES.parent).match(g) for g in globs), t
