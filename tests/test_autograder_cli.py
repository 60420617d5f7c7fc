"""The grader's command line (issue 18): SUBMISSIONS is required (the sample class only when named),
``--assignment`` grades only those assignments, a notebook of the wrong assignment is named as
such, an LMS's ``_LATE_`` reaches grades.csv, another class is not merged into an earlier --out
(``--fresh`` starts over), an error exit leaves no --out folder, and no progress bar is drawn into
a stderr that is not a terminal."""
from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from course.release import ROOT, venv_env
from tools.fixture_class import release_dict, solved_dict

pytestmark = pytest.mark.autograder
A, R, BW, RES = "01_layernorm", "02_rmsnorm", "05_backward", "03_residual"


def _grade(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    env = dict(venv_env(), OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "autograder", "grade", *args, "--jobs", "2"],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=900)


def _rows(out: Path) -> dict:
    return {(r["student_id"], r["assignment"]): r for r in csv.DictReader(open(out / "grades.csv", newline=""))}


def _put(path: Path, nb: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb))


def test_no_submissions_outside_a_course_is_an_error_naming_what_is_expected(tmp_path):
    out = tmp_path / "out"
    proc = _grade("--out", str(out), "--no-progress", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "no SUBMISSIONS given" in proc.stderr and "--sample-class" in proc.stderr, proc.stderr
    assert not out.exists()


def test_no_submissions_in_a_course_without_submitted_is_an_error(tmp_path):
    course = tmp_path / "course"
    course.mkdir()
    shutil.copy(ROOT / "nbgrader_config.py", course / "nbgrader_config.py")
    proc = _grade("--out", str(tmp_path / "out"), "--no-progress", cwd=course)
    assert proc.returncode == 2, proc.stderr
    assert "submitted/" in proc.stderr and "--sample-class" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_sample_class_excludes_other_input_and_make_grade_names_it(tmp_path):
    proc = _grade(str(tmp_path), "--sample-class", "--out", str(tmp_path / "out"))
    assert proc.returncode == 2 and "--sample-class" in proc.stderr, proc.stderr
    make = (ROOT / "Makefile").read_text()
    grade = make[make.index("\ngrade:"):].split("\n\n")[0]
    assert "--sample-class" in grade, grade


def test_error_exits_leave_no_out_folder(tmp_path):
    out = tmp_path / "deep" / "out"
    assert _grade(str(tmp_path / "nothing-here"), "--out", str(out)).returncode == 2
    (tmp_path / "class" / "ann" / A).mkdir(parents=True)
    proc = _grade(str(tmp_path / "class"), "--out", str(out), "--assignment", "99_nope")
    assert proc.returncode == 2 and "99_nope" in proc.stderr and A in proc.stderr, proc.stderr
    assert not out.exists() and not out.parent.exists()


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """One class graded with --assignment 01_layernorm (no --no-progress, stderr a pipe):
    ann solved 01 (and handed in a stub 02, not asked for); bob put exercise 05's backward.ipynb in
    01_layernorm/; cho handed in exercise 03's notebook renamed layernorm.ipynb; Canvas user 4242's
    flat file is marked _LATE_. Then another class into the same --out (refused), then with --fresh."""
    tmp = tmp_path_factory.mktemp("cli")
    cls, out = tmp / "class", tmp / "out"
    _put(cls / "ann" / A / release_dict(A)[0], solved_dict(A))
    _put(cls / "ann" / R / release_dict(R)[0], release_dict(R)[1])
    _put(cls / "bob" / A / release_dict(BW)[0], release_dict(BW)[1])
    _put(cls / "cho" / A / release_dict(A)[0], release_dict(RES)[1])
    _put(cls / f"deeduck_LATE_4242_777_{release_dict(A)[0]}", release_dict(A)[1])
    first = _grade(str(cls), "--out", str(out), "--assignment", A)
    got = {"first": first, "rows": _rows(out) if first.returncode == 0 else {},
           "header": (out / "grades.csv").read_text().splitlines()[0] if first.returncode == 0 else "",
           "report": (out / "report.html").read_text() if first.returncode == 0 else ""}
    got["again"] = _grade(str(cls), "--out", str(out), "--assignment", A, "--no-progress")  # a plain regrade
    other = tmp / "other"
    _put(other / "zed" / A / release_dict(A)[0], release_dict(A)[1])
    got["before"] = (out / "grades.csv").read_text() if first.returncode == 0 else ""
    got["other"] = _grade(str(other), "--out", str(out), "--no-progress")
    got["after_other"] = (out / "grades.csv").read_text() if (out / "grades.csv").exists() else ""
    got["fresh"] = _grade(str(other), "--out", str(out), "--no-progress", "--fresh")
    got["fresh_rows"] = _rows(out) if got["fresh"].returncode == 0 else {}
    got["out"] = out
    return got


def test_assignment_grades_only_that_assignment(graded):
    assert graded["first"].returncode == 0, graded["first"].stderr[-3000:]
    assert {a for _, a in graded["rows"]} == {A}, sorted(graded["rows"])  # no 02 row, not even "missing"
    assert sorted(s for s, _ in graded["rows"]) == ["4242", "ann", "bob", "cho"]
    ann = graded["rows"][("ann", A)]
    assert float(ann["score"]) == float(ann["max_score"]) > 0


def test_a_notebook_of_another_assignment_says_whose_it_is(graded):
    bob, cho = graded["rows"][("bob", A)], graded["rows"][("cho", A)]
    assert f"this is {BW}'s notebook" in bob["message"] and f"not {A}'s" in bob["message"], bob["message"]
    assert f"this is {RES}'s notebook" in cho["message"], cho["message"]
    for r in (bob, cho):
        assert "no answer cell" not in r["message"] and float(r["score"]) == 0


def test_late_column_comes_after_review(graded):
    header = graded["header"].split(",")
    assert header[-2:] == ["review", "late"], header
    assert graded["rows"][("4242", A)]["late"] == "yes"
    assert "late" in graded["rows"][("4242", A)]["message"]
    assert all(r["late"] == "" for k, r in graded["rows"].items() if k[0] != "4242")


def test_no_progress_bar_when_stderr_is_not_a_terminal(graded):
    err = graded["first"].stderr
    assert "grading:" not in err and "nb/s" not in err and "\r" not in err, err[-2000:]


def test_another_class_is_refused_and_fresh_starts_over(graded):
    other = graded["other"]
    assert other.returncode == 2, other.stderr[-3000:]
    assert "another class" in other.stderr and "--fresh" in other.stderr, other.stderr
    assert graded["after_other"] == graded["before"]  # nothing written
    fresh = graded["fresh"]
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert sorted(graded["fresh_rows"]) == [("zed", A)]
    out = graded["out"]
    assert not (out / "feedback" / "ann").exists() and (out / "feedback" / "zed").is_dir()
    assert [o["student_id"] for o in json.loads((out / "results.json").read_text())] == ["zed"]


def test_no_command_says_which_to_give():
    proc = subprocess.run([sys.executable, "-m", "autograder"], capture_output=True, text=True,
                          env=dict(venv_env(), PYTHONPATH=str(ROOT)), cwd=ROOT, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "give a command: grade (python -m autograder grade --help)" in proc.stderr, proc.stderr
    assert "required: cmd" not in proc.stderr


def test_a_course_run_that_stops_on_an_error_prints_the_error_alone(tmp_path):
    """An unknown --assignment and a refused --out are told before the 'grading the nbgrader course' line."""
    course = tmp_path / "course"
    shutil.copy(ROOT / "nbgrader_config.py", (course / "submitted" / "ann" / A).mkdir(parents=True) or course)
    _put(course / "submitted" / "ann" / A / release_dict(A)[0], release_dict(A)[1])
    proc = _grade("--out", str(tmp_path / "out"), "--no-progress", "--assignment", "99_nope", cwd=course)
    assert proc.returncode == 2 and "99_nope" in proc.stderr, proc.stderr
    assert "grading the nbgrader course" not in proc.stderr, proc.stderr
    other = tmp_path / "other"
    _put(other / "zed" / A / release_dict(A)[0], release_dict(A)[1])
    assert _grade(str(other), "--out", str(tmp_path / "out"), "--no-progress").returncode == 0
    proc = _grade("--out", str(tmp_path / "out"), "--no-progress", cwd=course)  # ann is another class
    assert proc.returncode == 2 and "another class" in proc.stderr, proc.stderr
    assert "grading the nbgrader course" not in proc.stderr, proc.stderr


def test_a_plain_regrade_says_nothing_was_kept_or_lost(graded):
    again = graded["again"]
    assert again.returncode == 0, again.stderr[-3000:]
    assert "kept 0" not in again.stderr and "earlier rows" not in again.stderr, again.stderr


def test_grades_csv_names_the_file_handed_in(graded):
    assert graded["rows"][("bob", A)]["notebook"] == release_dict(BW)[0]
    assert graded["rows"][("ann", A)]["notebook"] == release_dict(A)[0]
    assert graded["rows"][("4242", A)]["notebook"] == release_dict(A)[0]  # Canvas's prefix is not the student's


def test_report_lists_wrong_notebooks_and_counts_a_mistake_once_per_notebook(graded):
    import html as html_
    import re

    report = html_.unescape(re.sub(r"<[^>]+>", " ", graded["report"]))
    assert "1 assignment," in report and "1 assignments" not in report
    review = report[report.index("Needs review"):report.index("At a glance")]
    assert f"handed in {BW}'s notebook ({release_dict(BW)[0]}) for {A}" in review, review
    assert f"handed in {RES}'s notebook" in review, review
    glance = report[report.index("At a glance"):report.index("Most common mistakes")]
    assert "another assignment's notebook: 2" in glance, glance
    mistakes = graded["report"][graded["report"].index("Most common mistakes"):]
    counts = [int(c) for c in re.findall(r"<tr><td>(\d+)</td>", mistakes.split("</table>")[0])]
    assert counts and max(counts) <= 4, counts  # 4 notebooks graded: no message counted per test


def test_without_bubblewrap_the_grader_says_so_and_writes_nothing(tmp_path):
    """The sandbox's check runs beside the grader's own imports (autograder/__main__.py): its answer
    still stops the run before anything is graded or written, with the message that says what to do."""
    _put(tmp_path / "in" / "ann" / A / "layernorm.ipynb", solved_dict(A))
    env = dict(venv_env(), PATH=str(tmp_path / "no-bin"), OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", str(tmp_path / "in"), "--out",
                           str(tmp_path / "out"), "--no-progress"], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "bubblewrap (bwrap) is not installed" in proc.stderr and "--no-sandbox" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_sandbox_that_cannot_import_torch_stops_the_run_and_writes_nothing(tmp_path):
    """The probe before grading only finds the course's packages (their imports are the first
    zygote's); a zygote that cannot import torch (here: an address space too small for its
    libraries) still stops the whole run, saying why, before any row is made or written."""
    _put(tmp_path / "in" / "ann" / A / "layernorm.ipynb", solved_dict(A))
    _put(tmp_path / "in" / "bob" / A / "layernorm.ipynb", solved_dict(A))
    proc = _grade(str(tmp_path / "in"), "--out", str(tmp_path / "out"), "--no-progress", "--address-space", "300")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "the grading sandbox's interpreter did not start" in proc.stderr, proc.stderr[-2000:]
    assert "--no-sandbox" in proc.stderr
    assert not (tmp_path / "out").exists()
