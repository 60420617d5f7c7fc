"""exercises/ is exactly what nbgrader generates from solutions/, and nbgrader's own validation
agrees: every source notebook passes, every released notebook fails (its stubs are empty)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from course.release import ROOT, assignments, main as release_main, venv_env

ASSIGNMENTS = assignments()


def test_exercises_are_what_nbgrader_generates(capsys):
    assert release_main(["--check"]) == 0, capsys.readouterr().out


def _validate(path, *flags):
    return subprocess.run([sys.executable, "-m", "nbgrader", "validate", str(path), *flags],
                          capture_output=True, text=True, env=venv_env(), cwd=ROOT)


@pytest.mark.slow
@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_source_notebook_validates(assignment):
    nb = next((ROOT / "solutions" / assignment).glob("*.ipynb"))
    proc = _validate(nb)
    assert "Success! Your notebook passes all the tests." in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_released_notebook_fails_validation(assignment):
    nb = next((ROOT / "exercises" / assignment).glob("*.ipynb"))
    proc = _validate(nb, "--invert")
    assert "Success! The notebook does not pass any tests." in proc.stdout, proc.stdout + proc.stderr


def test_six_assignments_in_course_order():
    assert ASSIGNMENTS == ["01_layernorm", "02_rmsnorm", "03_residual", "04_transformer_block", "05_backward",
                           "06_streams"]


def test_each_test_cell_opens_with_its_checks_description():
    """One source per description: the check's doc is the test cell's first line."""
    from course.release import sync_test_docstrings
    assert sync_test_docstrings(check=True) == []


def test_a_test_cell_that_says_something_else_is_reported(tmp_path):
    import json
    import shutil

    from course.release import sync_test_docstrings
    shutil.copytree(ROOT / "solutions", tmp_path / "solutions")
    path = tmp_path / "solutions" / "01_layernorm" / "layernorm.ipynb"
    nb = json.loads(path.read_text())
    cell = next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == "layernorm_parameters")
    cell["source"][0] = '"""some other sentence"""\n'
    path.write_text(json.dumps(nb))
    assert sync_test_docstrings(tmp_path, check=True) == ["layernorm_parameters"]
    sync_test_docstrings(tmp_path)
    assert sync_test_docstrings(tmp_path, check=True) == []
