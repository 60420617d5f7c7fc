"""Issue 18, the instructor's side: what the instructors' pages (docs/, the book's "For
instructors" part, which issue 29 moved out of the README) and nbgrader_config.py say, and the
autograded notebook's first cell (no total that grading by hand would make stale)."""
from __future__ import annotations

import re

import pytest

from course.release import ROOT

pytestmark = pytest.mark.autograder
DOCS = ROOT / "docs"
#: the README and every instructors' page, as one text (what a test looks for may sit on any page)
ALL_PAGES = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))])
#: the page of the end-to-end path (release, collect, grade, formgrader, feedback)
COURSE_PAGE = (DOCS / "nbgrader_course.md").read_text()
INDEX_PAGE = (DOCS / "index.md").read_text()
AUTOGRADING_PAGE = (DOCS / "autograding.md").read_text()
A = "01_layernorm"


def test_the_exchange_root_is_set_once_in_the_course_config():
    """Step 5's `jupyter lab` reads nbgrader_config.py, not the command line: the exchange lives
    there, and no command of the pages passes --Exchange.root (which only some commands would get)."""
    from autograder.nbgrader import course_dir as nbgrader_course

    course = nbgrader_course.load(ROOT)
    assert course.config.Exchange.root == "/usr/local/share/nbgrader/exchange"
    assert "c.Exchange.root" in (ROOT / "nbgrader_config.py").read_text()
    commands = [ln for ln in ALL_PAGES.splitlines() if re.match(r"\s*(nbgrader|jupyter|python -m autograder)", ln)]
    assert commands and not any("--Exchange.root" in ln for ln in commands)


def test_readme_gives_no_shared_account_advice_and_says_what_is_safe():
    assert "several students share one account" not in ALL_PAGES
    assert "Do not let students share one account" in COURSE_PAGE
    assert "unix account of their own" in COURSE_PAGE and "learning-management system" in COURSE_PAGE


def test_readme_says_how_to_import_a_roster_and_which_grades_are_final():
    assert "nbgrader db student import roster.csv" in COURSE_PAGE and "None, None" in COURSE_PAGE
    assert "id,first_name,last_name,email" in COURSE_PAGE
    assert "authoritative" in COURSE_PAGE and "nbgrader export" in COURSE_PAGE
    assert "no setting that hides or disables it" in INDEX_PAGE  # the Autograde button


def test_readme_documents_the_cli_of_issue_18():
    for s in ("--sample-class", "--assignment NAME", "--fresh", "another class", "`late`"):
        assert s in AUTOGRADING_PAGE, s


def test_autograded_notebook_states_no_total(tmp_path):
    """The formgrader's feedback page has nbgrader's own Score header (manual grades included): the
    course grader's first cell lists each autograded test's points, never a total of its own."""
    from autograder.nbgrader.course_dir import build_notebook
    from autograder.report.outcome import Outcome, TestResult
    from autograder.intake.plan import release_cells

    release = ROOT / "exercises" / A / "layernorm.ipynb"
    tests = [c for c in release_cells(release) if c["role"] == "test"]
    o = Outcome("ann", A, notebook="layernorm.ipynb", status="graded", message="1 of 2 tests passed")
    o.tests = [TestResult(c["grade_id"], "doc", float(c["points"]) if i == 0 else 0.0, float(c["points"]), i == 0)
               for i, c in enumerate(tests)]
    o.score, o.max_score = sum(t.points for t in o.tests), sum(t.max_points for t in o.tests)
    nb = build_notebook(release, None, o)
    head = "".join(nb.cells[0].source)
    assert "score:" not in head.lower() and f"{o.score:g} / {o.max_score:g}" not in head, head
    assert "autograded tests" in head and "manual" in head
    t0 = o.tests[0]
    assert f"{t0.points:g} / {t0.max_points:g}  {t0.grade_id}" in head


def test_class_data_written_into_the_course_is_git_ignored_and_survives_make_clean():
    """What the steps of "From release to feedback" write into the course folder (step 4's --out, nbgrader export's
    grades.csv, the roster) is git-ignored and outside _build/ (which `make clean` removes)."""
    import subprocess

    step4 = re.search(r"python -m autograder grade submitted --out (\S+)", COURSE_PAGE).group(1)
    assert not step4.startswith("_build")
    for path in (step4 + "/grades.csv", "grades.csv", "roster.csv"):
        res = subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT)
        assert res.returncode == 0, f"{path} is not git-ignored"
    clean = re.search(r"^clean:\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert step4 not in clean and "grades.csv" not in clean


def test_readme_regenerates_feedback_with_force_and_keeps_the_course_private():
    """Without --force, generate_feedback skips a student whose feedback exists, even after a
    manual score changed; on a shared machine the course folder must not be readable by students."""
    assert "nbgrader generate_feedback --force 01_layernorm" in COURSE_PAGE
    assert "chmod 700" in COURSE_PAGE and "Keep the course folder private" in COURSE_PAGE


def test_the_instructors_pages_are_in_the_book_under_their_own_caption():
    """Issue 29: the README points at them; the book builds them in a part of their own."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    part = next(p for p in toc["parts"] if p["caption"].startswith("For instructors"))
    files = [part["chapters"][0]["file"]] + [s["file"] for s in part["chapters"][0].get("sections", [])]
    assert sorted(files) == sorted(f"docs/{p.stem}" for p in DOCS.glob("*.md"))
    readme = (ROOT / "README.md").read_text()
    assert all(f"(docs/{p.name})" in readme for p in DOCS.glob("*.md"))
    assert len(readme) < 8000 and "make book" in readme and "make test" in readme
