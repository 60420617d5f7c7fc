"""nbgrader cell roles, read in one place (course/cells.py) through nbgrader.utils."""
from __future__ import annotations

import nbformat
import pytest

from course import cells
from course.release import ROOT

pytestmark = pytest.mark.autograder


def test_roles_of_the_released_notebook_match_nbgrader_metadata():
    nb = nbformat.read(str(ROOT / "exercises" / "01_layernorm" / "layernorm.ipynb"), as_version=4)
    roles = [cells.role(c) for c in nb.cells]
    assert roles.count("test") == 11 and roles.count("answer") >= 1 and "instructor" in roles  # 4 visible, 7 hidden
    for c, r in zip(nb.cells, roles):
        m = c.metadata.get("nbgrader", {})
        if r == "test":
            assert m["grade"] and not m.get("solution") and cells.points(c) > 0 and cells.grade_id(c)


@pytest.mark.parametrize("cell", [
    {"cell_type": "code", "metadata": [], "source": "x"},
    {"cell_type": "code", "metadata": {"nbgrader": "yes"}, "source": ["a", 1, None]},
    {"cell_type": "code", "metadata": {"nbgrader": {"grade": "true", "points": "lots", "grade_id": 7}}},
    {"cell_type": "code"},
    {"input": "print(1)", "cell_type": "code", "metadata": {}},
    "not a cell",
])
def test_junk_from_a_students_file_reads_as_no_role(cell):
    assert cells.role(cell) in ("instructor", "markdown")
    assert cells.grade_id(cell) is None and cells.points(cell) in (0.0,)
    assert isinstance(cells.source(cell), str)
