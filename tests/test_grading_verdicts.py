"""Verdicts of the course grader on honest-but-unusual work and on attacks, in exercises 02 and 05
(exercise 01's class is tests/test_autograder_hostile.py), graded as students hand them in.

Honest work keeps full marks with nothing flagged; an attack scores no more than it deserves, or
its row is flagged for review naming the line that does it.
"""
from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest

from course.release import venv_env
from tools.fixture_class import build

pytestmark = [pytest.mark.autograder, pytest.mark.slow]


def grade(tmp, assignment):
    cases = build(tmp / "submitted", assignment=assignment, kinds=("solution", "stub", "hostile", "right"))
    out = tmp / "out"
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", str(tmp / "submitted"), "--out", str(out),
                           "--jobs", "2", "--no-progress"], capture_output=True, text=True,
                          env=dict(venv_env(), OMP_NUM_THREADS="1"), cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["student_id"]: r for r in csv.DictReader(open(out / "grades.csv"))}
    results = {r["student_id"]: r for r in json.loads((out / "results.json").read_text())}
    return cases, rows, results


@pytest.mark.parametrize("assignment", ["02_rmsnorm", "05_backward"])
def test_honest_work_keeps_full_marks_unflagged_and_attacks_gain_nothing_unseen(tmp_path, assignment):
    cases, rows, results = grade(tmp_path, assignment)
    full = float(rows["solution"]["max_score"])
    assert float(rows["solution"]["score"]) == full and rows["solution"]["review"] == ""
    assert float(rows["stub"]["score"]) == 0
    assert any(c.kind == "right" for c in cases)
    for c in cases:
        row = rows[c.student]
        if c.kind == "right":
            assert float(row["score"]) == full, (c.student, row["message"])
            assert row["review"] == "", (c.student, row["review"])
        elif c.kind == "hostile":
            lost = {t["grade_id"] for t in results[c.student]["tests"] if not t["passed"]}
            if c.review:
                assert c.review in row["review"] and ", line " in row["review"], (c.student, row["review"])
            elif c.loses == "all":
                assert float(row["score"]) == 0, (c.student, row["score"])
            else:
                assert set(c.loses) <= lost, (c.student, c.loses, lost)
