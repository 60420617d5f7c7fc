"""What a notebook cell is to nbgrader, read in one place through ``nbgrader.utils``.

Roles, as the course uses them:

* ``"test"``: a grade cell that is not a solution (nbgrader's autograder test cell);
* ``"answer"``: a solution cell (where the student writes code);
* ``"instructor"``: any other code cell (locked setup, helpers, demos);
* ``"markdown"``: every other cell.

Cells may come from a student's file, so anything odd in their metadata (a list where a dict
belongs, a string for ``grade``) reads as "no nbgrader role" instead of raising.
"""
from __future__ import annotations

from nbformat import NotebookNode, from_dict
from nbgrader import utils


def _node(cell) -> NotebookNode | None:
    if isinstance(cell, NotebookNode):
        return cell
    # outputs are never read here: a student's 40 MB of outputs is not copied cell by cell
    return from_dict({k: v for k, v in cell.items() if k != "outputs"}) if isinstance(cell, dict) else None


def meta(cell) -> dict:
    """The cell's ``nbgrader`` metadata, or ``{}`` when there is none (or it is not a dict)."""
    node = _node(cell)
    m = node.get("metadata") if node is not None else None
    m = m.get("nbgrader") if isinstance(m, dict) else None
    return m if isinstance(m, dict) else {}


def _flag(test, cell) -> bool:
    node = _node(cell)
    if node is None or not isinstance(node.get("metadata"), dict) or not meta(node):
        return False
    try:
        return test(node) is True
    except Exception:  # noqa: BLE001 -- junk metadata in a student's file
        return False


def role(cell) -> str:
    """``"test"``, ``"answer"``, ``"instructor"`` or ``"markdown"`` (see the module docstring)."""
    node = _node(cell)
    if node is None or node.get("cell_type") != "code":
        return "markdown"
    if _flag(utils.is_solution, node):
        return "answer"
    if _flag(utils.is_grade, node):
        return "test"
    return "instructor"


def grade_id(cell) -> str | None:
    gid = meta(cell).get("grade_id")
    return gid if isinstance(gid, str) else None


def points(cell) -> float:
    try:
        return float(meta(cell).get("points", 0) or 0)
    except (TypeError, ValueError):
        return 0.0


def source(cell) -> str:
    """The cell's source as one string (nbformat allows a list of lines), ``""`` if it has none."""
    node = _node(cell)
    src = node.get("source", node.get("input", "")) if node is not None else ""
    if isinstance(src, list):
        src = "".join(x for x in src if isinstance(x, str))
    return src if isinstance(src, str) else ""
