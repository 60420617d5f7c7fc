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
    assert "[hidden test]" in proc.stdout and "your code must at least run here" in proc.stdout
    # the hidden tests' points are not counted as visible ones, with or without code in the stub
    assert "0/4 visible tests pass (0 of 9 visible points). 7 hidden tests (9 points)" in proc.stdout
    assert "7 of them cannot run your code yet" in proc.stdout
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


def _tampered_solution(tmp_path, edit: bool, delete: bool):
    """Exercise 01 as a student hands it in (the reference answer in its answer cell), with the
    locked test layernorm_matches_torch's body replaced by print("skipped") and/or the test
    layernorm_half_precision deleted: easy in Colab or VS Code, which do not lock cells."""
    import json

    from tools.fixture_class import solved_dict

    nb = solved_dict("01_layernorm")
    cells = nb["cells"]
    gid = lambda c: c.get("metadata", {}).get("nbgrader", {}).get("grade_id")
    if edit:
        [c for c in cells if gid(c) == "layernorm_matches_torch"][0]["source"] = 'print("skipped")'
    if delete:
        nb["cells"] = [c for c in cells if gid(c) != "layernorm_half_precision"]
    path = tmp_path / "layernorm.ipynb"
    path.write_text(json.dumps(nb))
    return path


def test_edited_or_deleted_test_cells_are_put_back_from_the_release(tmp_path):
    """restore_released: an edited locked cell gets its released source, a deleted one comes back
    in its place (with its points), and each is named; an untouched notebook has no note."""
    import nbformat

    from coursekit.selfcheck import released, restore_released

    path = _tampered_solution(tmp_path, edit=True, delete=True)
    nb = nbformat.read(path, as_version=4)
    name, notes = restore_released(nb)
    assert name == "01_layernorm/layernorm.ipynb"
    assert any(n.startswith("layernorm_matches_torch: this cell was edited") for n in notes)
    assert any(n.startswith("layernorm_half_precision: this cell is missing") for n in notes)
    ids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells]
    want = [r["grade_id"] for r in released()[name]]
    assert [i for i in ids if i in want] == want  # every released cell, in the released order
    restored = nb.cells[ids.index("layernorm_half_precision")]
    assert restored.metadata.nbgrader["points"] > 0 and restored.metadata.nbgrader["grade"] is True
    clean = nbformat.read(_tampered_solution(tmp_path, edit=False, delete=False), as_version=4)
    assert restore_released(clean)[1] == []


@pytest.mark.slow
def test_selfcheck_of_a_tampered_notebook_runs_the_released_tests(tmp_path):
    """A student's edited test cannot make the self-check pass: the released test runs, fails on a
    wrong answer, and the report names the edited and the deleted cell."""
    import json

    path = _tampered_solution(tmp_path, edit=True, delete=True)
    nb = json.loads(path.read_text())
    for c in nb["cells"]:  # a wrong answer: the unbiased variance
        if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "layernorm_impl":
            c["source"] = c["source"].replace("var = xc.pow(2).mean(dim=dims, keepdim=True)",
                                              "var = h.var(dim=dims, keepdim=True)")
            assert "h.var(dim=dims" in c["source"]
    path.write_text(json.dumps(nb))
    proc = subprocess.run([sys.executable, "-m", "coursekit.selfcheck", path.name], capture_output=True,
                          text=True, env=venv_env(), cwd=tmp_path, timeout=600)
    out = proc.stdout
    assert proc.returncode == 1, out + proc.stderr
    assert "FAIL  layernorm_matches_torch" in out and "the variance is unbiased" in out
    assert "layernorm_half_precision" in out and "Put back as released" in out
    assert "this cell was edited" in out and "this cell is missing" in out
    assert json.loads(path.read_text()) == nb  # the student's file is not changed


def test_a_missing_notebook_says_where_to_run_from(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "coursekit.selfcheck", "layernorm.ipynb"], capture_output=True,
                          text=True, env=venv_env(), cwd=tmp_path, timeout=120)
    assert proc.returncode == 2
    assert "Run this from the folder that holds the notebook" in proc.stdout


def test_released_cells_hold_no_hidden_test_code():
    """coursekit/released.json (shipped in the pack's wheel) carries the release's locked cells
    only: no line between the hidden-test markers of solutions/ is in it."""
    import nbformat

    from course import cells

    text = (ROOT / "coursekit" / "released.json").read_text()
    hidden_lines = set()
    for path in sorted((ROOT / "solutions").glob("*/*.ipynb")):
        for c in nbformat.read(str(path), as_version=4).cells:
            src = cells.source(c)
            if "### BEGIN HIDDEN TESTS" in src:
                body = src.split("### BEGIN HIDDEN TESTS", 1)[1].split("### END HIDDEN TESTS", 1)[0]
                hidden_lines |= {ln.strip() for ln in body.splitlines() if len(ln.strip()) >= 12}
    assert hidden_lines
    import json
    sources = "\n".join(r.get("source", "") for rows in json.loads(text).values() for r in rows)
    assert not [ln for ln in hidden_lines if ln in sources]
