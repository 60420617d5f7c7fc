"""Namespaces like a notebook kernel's, for running coursekit.checks in-process (the fast loop).

``setup_ns``: the notebook's locked setup cell run; ``solution_ns``: setup then the solution
cells of solutions/; ``stub_ns``: the released (stub) notebook's code cells; ``code_ns``: setup
then a fixture's code, which is what nbgrader runs when the code is put in the first answer
cell. :func:`outcome` runs one check the way a test cell does (probe, wire, judge). Prints and
warnings of the code run here stay out of the test output.
"""
from __future__ import annotations

import contextlib
import io
import warnings

import nbformat

from coursekit.checks import HIDDEN_IDS, CheckFailed, collect, get, load_all, verdict
from coursekit.checks.remote import Loopback
from autograder.referee.calls import refereed_check
from coursekit.checks.seeded import salted
from course import cells
from course.release import ROOT


@contextlib.contextmanager
def _quiet():
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


load_all()


def _notebook(folder: str, assignment: str):
    return nbformat.read(next((ROOT / folder / assignment).glob("*.ipynb")), as_version=4)


def grade_ids(assignment: str) -> list[str]:
    """The graded test cells' ids, in notebook order."""
    return [cells.grade_id(c) for c in _notebook("solutions", assignment).cells if cells.role(c) == "test"]


def is_benchmark(grade_id: str) -> bool:
    from coursekit.checks import get
    return get(grade_id).kind == "benchmark"


def _exec_cells(nb, ns: dict, keep) -> dict:
    with _quiet():
        for cell in nb.cells:
            if cells.role(cell) in ("answer", "instructor") and keep(cell):
                exec(compile(cell.source, f"<{cells.grade_id(cell) or 'cell'}>", "exec"), ns)
    return ns


def setup_ns(assignment: str) -> dict:
    return _exec_cells(_notebook("solutions", assignment), {"__name__": "__main__"},
                       lambda c: cells.role(c) != "answer")


def solution_ns(assignment: str) -> dict:
    return _exec_cells(_notebook("solutions", assignment), {"__name__": "__main__"}, lambda c: True)


def stub_ns(assignment: str) -> dict:
    return _exec_cells(_notebook("exercises", assignment), {"__name__": "__main__"}, lambda c: True)


def code_ns(assignment: str, code: str, name: str = "<fixture>") -> dict:
    ns = setup_ns(assignment)
    with _quiet():
        exec(compile(code, name, "exec"), ns)
    return ns


#: the draw the hidden checks run with here (the course grader draws one per submission)
DRAW = 424242


def outcome(grade_id: str, ns: dict, draw: int = DRAW) -> str | None:
    """None when the check passes, else its failure message (what the student would read).

    A check runs as the course grader's referee runs it (:class:`coursekit.checks.remote.Loopback`,
    the pipe's encoding): a hidden check's probe here, the student's code answering its calls, on
    inputs of ``draw``; a visible check's probe whole on the notebook's side. Benchmarks run here."""
    check = get(grade_id)
    hidden = grade_id in HIDDEN_IDS
    with _quiet(), salted(draw if hidden else 0):
        try:
            if check.kind == "benchmark":
                record = collect(check, ns)
            else:
                record = collect(refereed_check(grade_id), Loopback(ns, draw if hidden else 0,
                                                                    check.forbidden_ops).namespace())
            verdict(check, record)
        except CheckFailed as e:
            return str(e)
    return None


def assert_loses(fx, checks: list[str]) -> None:
    """A wrong version fails every check of ``checks`` it names, with its message on the first.

    One that loses only benchmarks among them (correct but slow) must pass all the others.
    """
    assert fx.loses, f"{fx.path.name} names no check it must lose"
    ns = code_ns(fx.assignment, fx.code, str(fx.path))
    mine = [g for g in fx.loses if g in checks]
    for gid in mine:
        msg = outcome(gid, ns)
        assert msg is not None, f"{fx.name} ({fx.summary}) passes {gid}"
        if fx.message and gid == fx.loses[0]:
            assert fx.message in msg, f"{fx.name}: {gid} should say {fx.message!r}; it said {msg!r}"
    if all(is_benchmark(g) for g in mine):
        failed = {g: m for g in checks if g not in mine and (m := outcome(g, ns))}
        assert not failed, f"{fx.name} should lose only {fx.loses}, but also fails {failed}"


def assert_passes_all(fx, checks: list[str]) -> None:
    ns = code_ns(fx.assignment, fx.code, str(fx.path))
    failed = {g: m for g in checks if (m := outcome(g, ns))}
    assert not failed, f"{fx.name} ({fx.summary}) should earn full marks, but fails {failed}"
