"""Exercises 01-06 through coursekit.checks, in-process and fast: the solution passes every check,
the released stub fails every check saying it is not implemented yet, each wrong version in
tests/fixtures/wrong/<assignment> fails the checks it names (the first with the message it
names), each right version passes them all, and every check is lost by some wrong version.
Benchmarks included. The slow, real-nbgrader run of the same fixtures is
tests/test_exercises_nbgrader.py; exercise-specific tests are in tests/test_norm_checks.py,
tests/test_checks_residual.py, tests/test_checks_transformer.py, tests/test_checks_backward.py and
tests/test_checks_streams.py."""
from __future__ import annotations

import functools

import pytest

from tools.make_submission import fixtures
from course.release import ROOT
from notebook_ns import assert_loses, assert_passes_all, grade_ids, outcome, solution_ns, stub_ns

MARKS = {
    "01_layernorm": pytest.mark.layernorm,
    "02_rmsnorm": pytest.mark.rmsnorm,
    "03_residual": pytest.mark.residual,
    "04_transformer_block": pytest.mark.transformer,
    "05_backward": pytest.mark.backward,
    "06_streams": pytest.mark.streams,
}
CHECKS = {a: grade_ids(a) for a in MARKS}
WRONG = [f for f in fixtures(ROOT / "tests" / "fixtures" / "wrong") if f.assignment in MARKS]
# (a fixture with notebook syntax, such as a %%writefile cell, runs only in a kernel: the graders grade it)
RIGHT = [f for f in fixtures(ROOT / "tests" / "fixtures" / "right") if f.assignment in MARKS and f.in_process]

_solution = functools.cache(solution_ns)
_stub = functools.cache(stub_ns)


def _by_check():
    return [pytest.param(a, g, marks=m, id=f"{a}/{g}") for a, m in MARKS.items() for g in CHECKS[a]]


def _by_assignment():
    return [pytest.param(a, marks=m, id=a) for a, m in MARKS.items()]


def _by_fixture(fxs):
    return [pytest.param(f, marks=MARKS[f.assignment], id=f"{f.assignment}/{f.name}") for f in fxs]


@pytest.mark.parametrize("assignment,gid", _by_check())
def test_solution_passes(assignment, gid):
    assert outcome(gid, _solution(assignment)) is None


@pytest.mark.parametrize("assignment,gid", _by_check())
def test_stub_fails_saying_not_implemented(assignment, gid):
    msg = outcome(gid, _stub(assignment))
    assert msg is not None and "not implemented yet" in msg, msg


#: exercise 05's wrong versions are held to *exactly* the tests they name, every check run on each, in
#: tests/test_checks_backward.py (a superset of what this file's test asks of them)
HELD_EXACTLY_ELSEWHERE = {"05_backward"}


@pytest.mark.parametrize("fx", _by_fixture([f for f in WRONG if f.assignment not in HELD_EXACTLY_ELSEWHERE]))
def test_wrong_version_fails_its_checks(fx):
    unknown = set(fx.loses) - set(CHECKS[fx.assignment])
    assert not unknown, f"{fx.path.name} names checks the notebook does not have: {sorted(unknown)}"
    assert_loses(fx, CHECKS[fx.assignment])


@pytest.mark.parametrize("fx", _by_fixture(RIGHT))
def test_right_version_passes_everything(fx):
    assert_passes_all(fx, CHECKS[fx.assignment])


@pytest.mark.parametrize("assignment", _by_assignment())
def test_every_check_is_lost_by_some_wrong_version(assignment):
    lost = {g for f in WRONG if f.assignment == assignment for g in f.loses}
    assert set(CHECKS[assignment]) <= lost, f"no wrong version loses {sorted(set(CHECKS[assignment]) - lost)}"


@pytest.mark.parametrize("assignment", _by_assignment())
def test_fixtures_cover_each_exercise(assignment):
    assert len([f for f in WRONG if f.assignment == assignment]) >= 8
