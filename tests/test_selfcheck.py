"""`python -m coursekit.selfcheck NOTEBOOK` (`make check NB=...` in a clone): a solution notebook
passes, a stub fails, hidden tests are announced, and the exit status says which; the kernel it
starts talks over IPC sockets, so ipykernel's "running over TCP without encryption" warning is gone."""
from __future__ import annotations

import subprocess
import sys

import pytest

from course.release import ROOT, venv_env
from coursekit.selfcheck import Result, _only_smoke, _runs_something, report, results

pytestmark = [pytest.mark.layernorm]


def _selfcheck(path):
    return subprocess.run([sys.executable, "-m", "coursekit.selfcheck", str(path)], capture_output=True,
                          text=True, env=venv_env(), cwd=ROOT, timeout=600)


@pytest.mark.slow
def test_solution_notebook_passes():
    proc = _selfcheck(ROOT / "solutions" / "01_layernorm" / "layernorm.ipynb")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS  layernorm_matches_torch" in proc.stdout
    assert "PASS  layernorm_hard_rows" in proc.stdout  # hidden tests are present in the source
    assert "visible tests pass" in proc.stdout


@pytest.mark.slow
def test_released_stub_fails_and_mentions_hidden_tests():
    proc = _selfcheck(ROOT / "exercises" / "01_layernorm" / "layernorm.ipynb")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL  layernorm_matches_torch" in proc.stdout
    assert "not implemented yet" in proc.stdout
    assert "(hidden test) your code must at least run" in proc.stdout
    assert "without encryption" not in proc.stdout + proc.stderr  # an IPC kernel: no TCP warning


@pytest.mark.slow
def test_selfcheck_runs_from_the_notebooks_own_folder(tmp_path):
    """What every notebook says: `python -m coursekit.selfcheck <this notebook>` in its folder
    (the pack's layout, no course around it). Nothing is left beside the notebook."""
    import shutil

    nb = tmp_path / "rmsnorm.ipynb"
    shutil.copy(ROOT / "exercises" / "02_rmsnorm" / "rmsnorm.ipynb", nb)
    proc = subprocess.run([sys.executable, "-m", "coursekit.selfcheck", nb.name], capture_output=True, text=True,
                          env=venv_env(), cwd=tmp_path, timeout=600)
    assert proc.returncode == 1 and "FAIL  rmsnorm_matches_torch" in proc.stdout, proc.stdout + proc.stderr
    assert "without encryption" not in proc.stdout + proc.stderr, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rmsnorm.ipynb"]


def test_the_selfcheck_kernel_uses_ipc_sockets(tmp_path):
    """The cause of ipykernel's warning (IPKernelApp.init_sockets: transport "tcp") is not there."""
    from jupyter_client import KernelManager

    from coursekit.selfcheck import ipc_config

    km = KernelManager(kernel_name="python3", config=ipc_config(str(tmp_path)))
    assert km.transport == "ipc" and km.ip.startswith(str(tmp_path))


def test_bad_arguments_exit_2():
    assert _selfcheck(ROOT / "no_such.ipynb").returncode == 2


def test_report_counts_and_exit_status(capsys):
    res = [Result("a", "checks a", 2, "PASS"), Result("b", "checks b", 1, "FAIL", "b is wrong"),
           Result("c", "checks c", 1, "HIDDEN")]
    assert report(res) == 1
    out = capsys.readouterr().out
    assert "1/2 visible tests pass (2 of 3 visible points)" in out and "b is wrong" in out
    assert "1 hidden tests" in out
    assert report([Result("a", "checks a", 2, "PASS")]) == 0


def test_hidden_cell_detection():
    assert not _runs_something('"""checks a thing"""\n')
    assert _runs_something('"""checks a thing"""\nrun("x", globals())')
    assert _only_smoke('"""checks a thing"""\nsmoke(lambda: f(1))  # must run')
    assert not _only_smoke('"""checks a thing"""\nsmoke(lambda: f(1))\nrun("x", globals())')


def _graded_cell(gid, source, outputs):
    import nbformat
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade": True, "grade_id": gid, "points": 1}
    cell.outputs, cell.execution_count = outputs, 1
    return cell


def test_a_hidden_test_that_runs_is_announced_not_scored():
    import nbformat
    nb = nbformat.v4.new_notebook()
    ok = _graded_cell("h", '"""hidden thing"""\nsmoke(lambda: f(1))  # must run', [])
    bad = _graded_cell("g", '"""other thing"""\nsmoke(lambda: f(1))', [
        nbformat.v4.new_output("error", ename="CheckFailed", evalue="not implemented yet", traceback=[])])
    nb.cells = [ok, bad]
    res = {r.grade_id: r for r in results(nb)}
    assert res["h"].status == "HIDDEN"
    assert res["g"].status == "FAIL" and "must at least run" in res["g"].message
