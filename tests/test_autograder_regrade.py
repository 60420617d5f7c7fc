"""Grading again: the same class twice gives the same grades.csv rows, and a resubmission replaces
the earlier one in the gradebook (one submission per student and assignment, newest scores).

A Canvas download of two students (01_layernorm): ``ann`` hands in the untouched release (fast:
every test fails), ``bob`` the reference. Graded twice into one gradebook; then bob's resubmission
(``-1`` suffix, the untouched release) arrives in a new download and is graded into it too.
"""
from __future__ import annotations

import copy
import csv
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tools.fixture_class import release_dict, solved_dict
from course.release import ROOT, venv_env

pytestmark = pytest.mark.autograder
A = "01_layernorm"


def _grade(src: Path, out: Path, db: Path) -> list[dict]:
    env = dict(venv_env(), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", str(src), "--out", str(out),
                           "--gradebook", str(db), "--jobs", "2", "--no-progress"],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return list(csv.DictReader(open(out / "grades.csv")))


def _submissions(db: Path) -> dict:
    """student id -> the scores of every submission of the assignment the gradebook holds."""
    from nbgrader.api import Gradebook

    out: dict = {}
    with Gradebook(f"sqlite:///{db}") as gb:
        for s in gb.assignment_submissions(A):
            out.setdefault(s.student_id, []).append(float(s.score))
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("regrade")
    name, release = release_dict(A)
    stub = json.dumps(release).encode()
    solved = json.dumps(solved_dict(A)).encode()
    first = tmp / "first.zip"
    with zipfile.ZipFile(first, "w") as zf:  # Canvas: <name>_<userid>_<submissionid>_<file>
        zf.writestr(f"ann_5_100_{name}", stub)
        zf.writestr(f"bob_7_200_{name}", solved)
    db = tmp / "gradebook.db"
    rows1 = _grade(first, tmp / "out1", db)
    after1 = _submissions(db)
    rows2 = _grade(first, tmp / "out2", db)
    after2 = _submissions(db)
    later = tmp / "later.zip"
    with zipfile.ZipFile(later, "w") as zf:  # bob resubmits: the -1 file is the newest
        zf.writestr(f"ann_5_100_{name}", stub)
        zf.writestr(f"bob_7_200_{name}", solved)
        zf.writestr(f"bob_7_201_{Path(name).stem}-1.ipynb", copy.copy(stub))
    rows3 = _grade(later, tmp / "out3", db)
    after3 = _submissions(db)
    return {"rows": (rows1, rows2, rows3), "gb": (after1, after2, after3), "tmp": tmp}


def test_grading_twice_gives_identical_rows(runs):
    rows1, rows2, _ = runs["rows"]
    assert rows1 == rows2
    by = {r["student_id"]: r for r in rows1}
    assert float(by["7"]["score"]) == float(by["7"]["max_score"]) > 0
    assert float(by["5"]["score"]) == 0


def test_regrading_keeps_one_submission_per_student(runs):
    after1, after2, _ = runs["gb"]
    rows = {r["student_id"]: [float(r["score"])] for r in runs["rows"][1]}
    assert after1 == after2 == rows  # one submission each, with the scores of grades.csv


def test_resubmission_replaces_the_earlier_one(runs):
    _, _, rows3 = runs["rows"]
    _, _, after3 = runs["gb"]
    bob = next(r for r in rows3 if r["student_id"] == "7")
    assert float(bob["score"]) == 0, bob  # the -1 file (the untouched release) was graded
    assert "resubmitted" in bob["message"], bob["message"]
    assert after3 == {"5": [0.0], "7": [0.0]}  # still one each: bob's newest score replaced the 15
