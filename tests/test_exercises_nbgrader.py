"""Through real ``nbgrader autograde``: solutions earn full marks, released stubs earn zero, wrong
implementations lose the points of the test meant for them, with a message that names the mistake,
and correct-but-unusual ones earn full marks.

Stock nbgrader runs one notebook at a time in a fresh kernel (10 s or more each here, the benchmark
cell included), so it grades a sample: per assignment the solution, the stub, the first
:data:`WRONG_PER_ASSIGNMENT` wrong versions (by name) that aim at different tests and name the
message the student reads, the first right version, and the right versions that say something of
stock nbgrader. That the sample is enough: the stub, graded here, shows that every test cell of the
released notebook fails when its check fails, and the solution that every one passes; which check
fails on which wrong version is shown for *every* fixture, wrong or right, in-process through the
referee's encoding (test_checks_in_process.py), and the course grader grades the right and hostile
classes (test_autograder_hostile.py, test_grading_verdicts.py). The sample here shows that
nbgrader's own machinery gives the same verdicts and shows the same messages.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from concurrent.futures import ThreadPoolExecutor

import nbformat
import pytest

from tools.make_submission import fixtures, submission_from_code, write_submission
from tools.stock import autograde_stock
from course.release import ROOT, assignments

WRONG = ROOT / "tests" / "fixtures" / "wrong"
ALL_WRONG = fixtures(WRONG)
ALL_RIGHT = fixtures(ROOT / "tests" / "fixtures" / "right")


#: wrong versions per assignment in stock nbgrader's sample (aimed at different tests)
WRONG_PER_ASSIGNMENT = 1


def stock_sample(wrong, right):
    """(wrong, right) fixtures stock nbgrader grades: per assignment, the first
    :data:`WRONG_PER_ASSIGNMENT` wrong versions aimed at different tests (``loses[0]``), those with a
    ``message:`` line first, the first right version, and every right version with a
    ``stock nbgrader:`` line."""
    picked_wrong, aims = [], {}
    for fx in sorted(wrong, key=lambda f: (f.assignment, f.message is None, f.name)):
        mine = aims.setdefault(fx.assignment, set())
        if fx.loses and fx.loses[0] not in mine and len(mine) < WRONG_PER_ASSIGNMENT:
            mine.add(fx.loses[0])
            picked_wrong.append(fx)
    picked_right, firsts = [], set()
    for fx in sorted(right, key=lambda f: (f.assignment, f.name)):
        if fx.assignment not in firsts or fx.stock_stderr_costs:
            firsts.add(fx.assignment)
            picked_right.append(fx)
    return picked_wrong, picked_right


FIXTURES, RIGHT_FIXTURES = stock_sample(ALL_WRONG, ALL_RIGHT)


def _kernelspec(fx) -> str | None:
    """A right fixture may ask for its notebook to name another kernel (``kernelspec: NAME``)."""
    m = re.search(r"^kernelspec:\s*(\S+)", fx.code.split('"""')[1] if '"""' in fx.code else "", re.M)
    return m.group(1) if m else None


ASSIGNMENTS = assignments()


def _build_class(submitted, assignment):
    """A solution, a stub, every wrong and every right version of one assignment."""
    src = next((ROOT / "solutions" / assignment).glob("*.ipynb"))
    (submitted / "solution" / assignment).mkdir(parents=True)
    shutil.copy(src, submitted / "solution" / assignment / src.name)
    rel = next((ROOT / "exercises" / assignment).glob("*.ipynb"))
    (submitted / "stub" / assignment).mkdir(parents=True)
    shutil.copy(rel, submitted / "stub" / assignment / rel.name)
    for fx in FIXTURES:
        if fx.assignment == assignment:
            name, nb = submission_from_code(fx.assignment, fx.code)
            write_submission(submitted, f"wrong-{fx.name}", fx.assignment, name, nb)
    for fx in RIGHT_FIXTURES:
        if fx.assignment == assignment:
            name, nb = submission_from_code(fx.assignment, fx.code)
            if _kernelspec(fx):
                nb.metadata["kernelspec"] = {"name": _kernelspec(fx), "display_name": _kernelspec(fx),
                                             "language": "python"}
            write_submission(submitted, f"right-{fx.name}", fx.assignment, name, nb)


@pytest.fixture(scope="session")
def graded(tmp_path_factory):
    """Real nbgrader over the whole class: one course directory per assignment, graded side by
    side (nbgrader grades one notebook at a time; this machine has more than one core)."""
    tmp = tmp_path_factory.mktemp("nbgrader_class")

    def grade(assignment):
        submitted = tmp / assignment / "submitted"
        _build_class(submitted, assignment)
        return autograde_stock(submitted, tmp / assignment / "work", only=[assignment])

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        results = dict(zip(ASSIGNMENTS, pool.map(grade, ASSIGNMENTS)))
    scores = {}
    for res in results.values():
        scores.update({k: v for k, v in res.items() if k != "_timings"})
    courses = {a: tmp / a / "work" / "course" for a in ASSIGNMENTS}
    return scores, courses


def _total(row):
    return sum(s for s, _ in row.values()), sum(m for _, m in row.values())


def _cell_output(courses, student, assignment, grade_id) -> str:
    nb_path = next((courses[assignment] / "autograded" / student / assignment).glob("*.ipynb"))
    nb = nbformat.read(nb_path, as_version=4)
    for cell in nb.cells:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id:
            return json.dumps(cell.get("outputs", []))
    raise AssertionError(f"no cell {grade_id} in {nb_path}")


@pytest.mark.slow
@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_solution_earns_full_marks(graded, assignment):
    scores, _ = graded
    row = scores[("solution", assignment)]
    lost = {g: s for g, s in row.items() if s[0] != s[1]}
    assert not lost, f"the reference solution loses points: {lost}"


@pytest.mark.slow
@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_released_stub_earns_zero(graded, assignment):
    scores, _ = graded
    row = scores[("stub", assignment)]
    earned = {g: s for g, s in row.items() if s[0] != 0}
    assert not earned, f"the untouched stub earns points: {earned}"


@pytest.mark.slow
@pytest.mark.parametrize("fx", FIXTURES, ids=[f"{f.assignment}/{f.name}" for f in FIXTURES])
def test_wrong_version_loses_its_points(graded, fx):
    scores, courses = graded
    row = scores[(f"wrong-{fx.name}", fx.assignment)]
    assert fx.loses, f"{fx.path.name} names no test it must lose (a 'loses:' line)"
    for gid in fx.loses:
        assert gid in row, f"{fx.path.name}: no test {gid!r} in {fx.assignment}"
        assert row[gid][0] == 0, f"{fx.path.name} ({fx.summary}) still earns {row[gid]} on {gid}"
    got, out_of = _total(row)
    assert got < out_of
    if fx.message:
        text = _cell_output(courses, f"wrong-{fx.name}", fx.assignment, fx.loses[0])
        assert fx.message in text, (
            f"{fx.path.name}: the failing test {fx.loses[0]} should say {fx.message!r}; it said: {text[:800]}")


@pytest.mark.slow
@pytest.mark.parametrize("fx", RIGHT_FIXTURES, ids=[f"{f.assignment}/{f.name}" for f in RIGHT_FIXTURES])
def test_right_version_earns_full_marks(graded, fx):
    scores, courses = graded
    row = scores[(f"right-{fx.name}", fx.assignment)]
    lost = {g: s for g, s in row.items() if s[0] != s[1]}
    if fx.stock_stderr_costs:
        # Stock nbgrader zeroes a test cell that writes to stderr (here: the fixture's own logging),
        # whatever the cell tested; the course grader does not (test_autograder_hostile). Every
        # cell lost here must be one that wrote to stderr, and nothing else may be lost.
        student = f"right-{fx.name}"
        for gid in lost:
            outputs = json.loads(_cell_output(courses, student, fx.assignment, gid))
            assert any(o.get("name") == "stderr" for o in outputs) and not any(
                o.get("output_type") == "error" for o in outputs), (
                f"{fx.path.name} loses {gid} under stock nbgrader for another reason than stderr: {outputs}")
        lost = {}
    assert row and not lost, f"{fx.path.name} ({fx.summary}) loses points: {lost}"


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_each_assignment_has_eight_wrong_versions(assignment):
    mine = [f for f in ALL_WRONG if f.assignment == assignment]
    assert len(mine) >= 8, f"{assignment} has {len(mine)} wrong-version fixtures; keep at least 8"


def test_wrong_versions_belong_to_real_assignments():
    stray = {f.assignment for f in ALL_WRONG + ALL_RIGHT} - set(ASSIGNMENTS)
    assert not stray, f"fixtures for unknown assignments: {stray}"


def test_the_stock_sample_covers_every_assignment_and_every_aimed_test_is_judged_in_process():
    """Each assignment has wrong versions aimed at different tests and a right version in stock
    nbgrader's sample, and every test some wrong version aims at is one the in-process suite judges
    (test_checks_in_process.py runs every fixture against the tests it names; exercise 05's against
    all of its tests, in test_checks_backward.py)."""
    import test_checks_in_process as in_process

    for a in ASSIGNMENTS:
        mine = [f for f in FIXTURES if f.assignment == a]
        assert len({f.loses[0] for f in mine}) == len(mine) == WRONG_PER_ASSIGNMENT, a
        assert any(f.message for f in mine), f"{a}: no wrong version in the sample checks its message"
    assert {f.assignment for f in RIGHT_FIXTURES} == {f.assignment for f in ALL_RIGHT}
    assert any(f.stock_stderr_costs for f in RIGHT_FIXTURES)
    import test_checks_backward as backward

    judged = {(f.assignment, f.name) for f in in_process.WRONG if f.assignment not in in_process.HELD_EXACTLY_ELSEWHERE}
    judged |= {(f.assignment, f.name) for f in backward.WRONG}
    assert {(f.assignment, f.name) for f in ALL_WRONG} <= judged
