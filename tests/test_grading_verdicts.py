"""Verdicts of the course grader on honest-but-unusual work and on attacks, in exercises 02, 04, 05 and 06
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


def run_grader(tmp):
    """``python -m autograder grade tmp/submitted --out tmp/out`` (2 jobs, one torch thread each):
    (grades.csv's rows, results.json's records), each by student."""
    out = tmp / "out"
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", str(tmp / "submitted"), "--out", str(out),
                           "--jobs", "2", "--no-progress"], capture_output=True, text=True,
                          env=dict(venv_env(), OMP_NUM_THREADS="1"), cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {r["student_id"]: r for r in csv.DictReader(open(out / "grades.csv"))}
    results = {r["student_id"]: r for r in json.loads((out / "results.json").read_text())}
    return rows, results


def grade(tmp, assignment):
    cases = build(tmp / "submitted", assignment=assignment, kinds=("solution", "stub", "hostile", "right"))
    return (cases, *run_grader(tmp))


@pytest.mark.parametrize("assignment", ["02_rmsnorm", "04_transformer_block", "05_backward", "06_streams"])
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
            elif c.loses == "none":  # an attack on the grader itself (its output), not on the points
                assert float(row["score"]) == full, (c.student, row["message"])
            else:
                assert set(c.loses) <= lost, (c.student, c.loses, lost)


def test_a_flag_reaches_the_csv_the_json_the_report_and_the_formgraders_comment(tmp_path):
    """One flagged submission graded into an nbgrader course: the reason (with cell and line) is in
    grades.csv's review column, results.json, the report's "Needs review" list and the gradebook's
    comment on the first answer cell; the honest one has none of it, and the flag cost no point."""
    import copy

    from test_formgrader import A, NB, api_for, grade, hand_in, make_course, max_score
    from tools.fixture_class import solved_dict

    course = make_course(tmp_path)
    hand_in(course, "alice", solved_dict(A), "2025-03-01 09:00:00.000000 UTC")
    flagged = copy.deepcopy(solved_dict(A))
    answer = next(c for c in flagged["cells"] if c.get("metadata", {}).get("nbgrader", {}).get("solution"))
    src = "".join(answer["source"]) if isinstance(answer["source"], list) else answer["source"]
    answer["source"] = "import gc\n" + src
    hand_in(course, "zoe", flagged, "2025-03-01 09:30:00.000000 UTC")
    out = tmp_path / "out"
    grade(course / "submitted", out)

    rows = {r["student_id"]: r for r in csv.DictReader(open(out / "grades.csv"))}
    assert float(rows["zoe"]["score"]) == max_score() == float(rows["alice"]["score"])
    assert rows["zoe"]["review"] == f"imports gc: import gc (answer cell {answer['metadata']['nbgrader']['grade_id']}, line 1)"
    assert rows["alice"]["review"] == ""
    results = {r["student_id"]: r for r in json.loads((out / "results.json").read_text())}
    assert results["zoe"]["review"] == [rows["zoe"]["review"]] and results["alice"]["review"] == []
    report = (out / "report.html").read_text()
    section = report[report.index('id="needs-review"'):report.index("At a glance")]
    assert "zoe / 01_layernorm" in section and "imports gc" in section and "alice" not in section

    api = api_for(course)
    from nbgrader.api import Gradebook
    with Gradebook(api.coursedir.db_url) as gb:
        comments = {s: [c.comment for c in gb.find_submission_notebook(NB, A, s).comments if c.comment]
                    for s in ("alice", "zoe")}
    assert len(comments["zoe"]) == 1 and "for a person to review" in comments["zoe"][0] \
        and "imports gc" in comments["zoe"][0], comments
    assert comments["alice"] == []
