"""What the grader leaves in an output folder, and the gradebook stock nbgrader works on.

* grading into an existing ``--out`` merges: a regrade replaces that student's rows, other
  students' rows from earlier runs stay (grades.csv, results.json, report.html); an unreadable
  results.json is refused instead of silently losing rows;
* the stock-nbgrader commands of docs/index.md, in their order (``nbgrader generate_assignment`` then
  ``nbgrader autograde``), work on a copy of the course whose ``exercises/`` is already there.
"""
from __future__ import annotations

import csv
import json
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from tools.fixture_class import release_dict, solved_dict
from course.release import ROOT, differences, venv_env

pytestmark = pytest.mark.autograder
A = "01_layernorm"


R = "02_rmsnorm"


def _grade(src: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(venv_env(), OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "autograder", "grade", str(src), "--out", str(out),
                           "--jobs", "2", "--no-progress", *extra], capture_output=True, text=True, env=env, cwd=ROOT)


def _rows(out: Path) -> dict:
    return {(r["student_id"], r["assignment"]): r for r in csv.DictReader(open(out / "grades.csv", newline=""))}


def _class(root: Path, files: dict) -> Path:
    """``files``: (student, assignment) -> notebook bytes, in the submitted layout."""
    for (s, a), data in files.items():
        name, _ = release_dict(a)
        (root / s / a).mkdir(parents=True)
        (root / s / a / name).write_bytes(data)
    return root


def _stub(a: str) -> bytes:
    return json.dumps(release_dict(a)[1]).encode()


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three runs into one --out: ann's 01 (solved: full marks); then bob's 01 and ann's 02 (a
    download without ann's 01); then ann's 01 again, now an unreadable file."""
    tmp = tmp_path_factory.mktemp("outdir")
    out = tmp / "out"
    got = {}
    for i, files in enumerate([{("ann", A): json.dumps(solved_dict(A)).encode()},
                               {("bob", A): _stub(A), ("ann", R): _stub(R)},
                               {("ann", A): b"{"}], 1):
        proc = _grade(_class(tmp / f"class{i}", files), out)
        assert proc.returncode == 0, proc.stderr[-3000:]
        got[i] = {"rows": _rows(out), "stderr": proc.stderr,
                  "json": json.loads((out / "results.json").read_text()),
                  "report": (out / "report.html").read_text()}
        from nbgrader.api import Gradebook
        with Gradebook(f"sqlite:///{out / 'gradebook.db'}") as gb:
            subs = [(s.student_id, a, float(s.score)) for a in (A, R) for s in gb.assignment_submissions(a)]
        assert len({s[:2] for s in subs}) == len(subs)  # one submission per student and assignment
        got.setdefault("gb", {})[i] = {s[:2]: s[2] for s in subs}
    got["out"] = out
    return got


def test_second_run_into_the_same_out_keeps_the_first_runs_students(runs):
    rows = runs[2]["rows"]
    assert sorted(rows) == [("ann", A), ("ann", R), ("bob", A), ("bob", R)], sorted(rows)
    assert rows[("ann", A)]["status"] == "graded"  # run 1's row, not run 2's 'not submitted'
    assert float(rows[("ann", A)]["score"]) == float(rows[("ann", A)]["max_score"]) > 0
    assert rows[("ann", R)]["status"] == rows[("bob", A)]["status"] == "graded"
    assert rows[("bob", R)]["message"] == "not submitted"
    assert sorted((o["student_id"], o["assignment"]) for o in runs[2]["json"]) == sorted(rows)
    assert all(o["tests"] for o in runs[2]["json"])  # full outcomes, tests included
    report = runs[2]["report"]
    assert "2 students, 2 assignments, 4 rows" in report
    assert f"feedback/ann/{A}/" in report and f"feedback/bob/{A}/" in report
    assert "regraded 3 rows, kept 1 row of earlier runs" in runs[2]["stderr"], runs[2]["stderr"][-2000:]


def test_regrade_replaces_that_students_row_and_keeps_the_others(runs):
    before, after = runs[2]["rows"], runs[3]["rows"]
    assert sorted(after) == sorted(before)
    assert after[("ann", A)]["status"] == "unreadable", after[("ann", A)]
    for k in [("ann", R), ("bob", A), ("bob", R)]:
        assert after[k] == before[k]
    assert len(runs[3]["json"]) == 4
    assert "regraded 1 row, kept 3 rows of earlier runs" in runs[3]["stderr"], runs[3]["stderr"][-2000:]


def test_gradebook_keeps_an_earlier_submission_a_later_download_lacks(runs):
    """Run 2 had no 01 for ann: her gradebook submission from run 1 (full marks) is not replaced
    by a 'not submitted' one; run 3's regrade replaces it. One submission each."""
    assert runs["gb"][2][("ann", A)] == float(runs[2]["rows"][("ann", A)]["max_score"]) > 0
    assert runs["gb"][3][("ann", A)] == 0
    for i in (2, 3):
        assert runs["gb"][i] == {k: float(r["score"]) for k, r in runs[i]["rows"].items()}


def test_unreadable_results_json_is_refused_and_nothing_is_overwritten(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.json").write_text('[{"student_id": "ann", "assign')  # cut off
    (out / "grades.csv").write_text("student_id,assignment,score,max_score\nann,01_layernorm,15,15\n")
    proc = _grade(_class(tmp_path / "class", {("bob", A): _stub(A)}), out)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "results.json" in proc.stderr and "another --out" in proc.stderr, proc.stderr
    assert "ann,01_layernorm,15,15" in (out / "grades.csv").read_text()


def _nbgrader(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The instructors' pages' command: ``.venv/bin/nbgrader ...`` (this interpreter's script)."""
    exe = Path(sys.executable).parent / "nbgrader"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "nbgrader"]
    return subprocess.run([*cmd, *args], cwd=cwd, capture_output=True, text=True, env=venv_env(), timeout=900)


def test_readme_stock_nbgrader_commands_work_in_order(tmp_path):
    """docs/index.md ("For instructors"): `nbgrader generate_assignment 01_layernorm` then `nbgrader autograde
    01_layernorm` in a course directory whose exercises/ already holds the release (as this
    repository's does): the autograde succeeds and a solved submission gets full marks."""
    course = tmp_path / "course"
    course.mkdir()
    shutil.copy(ROOT / "nbgrader_config.py", course / "nbgrader_config.py")
    for d in ("solutions", "exercises"):
        shutil.copytree(ROOT / d, course / d, ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    name, _ = release_dict(A)
    sub = course / "submitted" / "ann" / A
    sub.mkdir(parents=True)
    (sub / name).write_text(json.dumps(solved_dict(A), indent=1))
    gen = _nbgrader("generate_assignment", A, cwd=course)
    assert gen.returncode == 0, gen.stdout + gen.stderr
    assert differences(course / "exercises", ROOT / "exercises") == []  # the same release
    auto = _nbgrader("autograde", A, cwd=course)
    assert auto.returncode == 0, (auto.stdout + auto.stderr)[-4000:]
    assert "No assignment with ID" not in auto.stdout + auto.stderr

    from nbgrader.api import Gradebook
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        s = gb.find_submission(A, "ann")
        assert s.max_score > 0 and s.score == s.max_score, (s.score, s.max_score)
