"""Namespaces like a notebook kernel's, for running course.checks in-process (the fast loop).

``setup_ns``: the notebook's locked setup cell run; ``solution_ns``: setup then the solution
cells of solutions/; ``stub_ns``: the released (stub) notebook's code cells; ``code_ns``: setup
then a fixture's code, which is what nbgrader runs when the code is put in the first answer
cell. :func:`outcome` runs one check the way a test cell does (probe, wire, judge).
"""
from __future__ import annotations

import nbformat

from course.checks import CheckFailed, collect, get, verdict
from course.release import ROOT


def _notebook(folder: str, assignment: str):
    return nbformat.read(next((ROOT / folder / assignment).glob("*.ipynb")), as_version=4)


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def grade_ids(assignment: str) -> list[str]:
    """The graded test cells' ids, in notebook order."""
    return [_meta(c)["grade_id"] for c in _notebook("solutions", assignment).cells if _meta(c).get("grade")]


def _exec_cells(nb, ns: dict, keep) -> dict:
    for cell in nb.cells:
        if cell.cell_type == "code" and not _meta(cell).get("grade") and keep(cell):
            exec(compile(cell.source, f"<{_meta(cell).get('grade_id', 'cell')}>", "exec"), ns)
    return ns


def setup_ns(assignment: str) -> dict:
    return _exec_cells(_notebook("solutions", assignment), {"__name__": "__main__"},
                       lambda c: not _meta(c).get("solution"))


def solution_ns(assignment: str) -> dict:
    return _exec_cells(_notebook("solutions", assignment), {"__name__": "__main__"}, lambda c: True)


def stub_ns(assignment: str) -> dict:
    return _exec_cells(_notebook("exercises", assignment), {"__name__": "__main__"}, lambda c: True)


def code_ns(assignment: str, code: str, name: str = "<fixture>") -> dict:
    ns = setup_ns(assignment)
    exec(compile(code, name, "exec"), ns)
    return ns


def outcome(grade_id: str, ns: dict) -> str | None:
    """None when the check passes, else its failure message."""
    check = get(grade_id)
    try:
        verdict(check, collect(check, ns))
    except CheckFailed as e:
        return str(e)
    return None


def assert_loses(fx, checks: list[str]) -> None:
    """A wrong version fails every check of ``checks`` it names, with its message on the first.

    One that names none of them (correct but slow: it loses only the benchmark) must pass them all.
    """
    ns = code_ns(fx.assignment, fx.code, str(fx.path))
    mine = [g for g in fx.loses if g in checks]
    for gid in mine:
        msg = outcome(gid, ns)
        assert msg is not None, f"{fx.name} ({fx.summary}) passes {gid}"
        if fx.message and gid == fx.loses[0]:
            assert fx.message in msg, f"{fx.name}: {gid} should say {fx.message!r}; it said {msg!r}"
    if not mine:
        failed = {g: m for g in checks if (m := outcome(g, ns))}
        assert not failed, f"{fx.name} should lose only {fx.loses}, but also fails {failed}"


def assert_passes_all(fx, checks: list[str]) -> None:
    ns = code_ns(fx.assignment, fx.code, str(fx.path))
    failed = {g: m for g in checks if (m := outcome(g, ns))}
    assert not failed, f"{fx.name} ({fx.summary}) should earn full marks, but fails {failed}"
