"""No kernel the course starts warns "Kernel is running over TCP without encryption" (issue 18, item 4).

ipykernel prints that warning when its transport is TCP without CurveZMQ keys. The book's build
(book/local_kernels.py) and nbgrader's commands (nbgrader_config.py) put kernels on Unix sockets
in a private folder instead; the self-check does the same (tests/test_selfcheck.py). Each test
runs a real kernel and reads what it printed; the first also runs the default once, to show the
warning is really there to be removed.
"""
import subprocess
import sys
import textwrap

import nbformat
import pytest

from course.release import ROOT, venv_env

WARNING = "without encryption"

EXECUTE_ONE_CELL = textwrap.dedent("""
    import sys, tempfile, nbformat
    from jupyter_cache.executors.utils import single_nb_execution  # what Jupyter Book's cache runs
    from book.local_kernels import use_local_sockets
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    with tempfile.TemporaryDirectory() as sockets:
        if sys.argv[1] == "local":
            use_local_sockets(sockets)
        result = single_nb_execution(nb, cwd=None, timeout=120, allow_errors=False)
    assert result.err is None and nb.cells[0].outputs[0]["text"] == "42\\n", result
""")


def _execute(mode: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", EXECUTE_ONE_CELL, mode], capture_output=True,
                          text=True, env=venv_env(), cwd=ROOT, timeout=300)


def test_book_kernels_run_on_local_sockets_without_the_tcp_warning():
    default = _execute("default")
    assert default.returncode == 0, default.stderr
    assert WARNING in default.stderr  # the warning the build used to print once per chapter
    local = _execute("local")
    assert local.returncode == 0, local.stderr
    assert WARNING not in local.stdout + local.stderr, local.stderr


def test_the_book_build_goes_through_the_local_socket_launcher():
    source = (ROOT / "book" / "build.py").read_text()
    assert '"-m", "book.local_kernels", "build"' in source


@pytest.mark.parametrize("args", [["--help"], ["no-such-command"]])
def test_the_launcher_passes_jupyter_books_exit_status_on(args):
    proc = subprocess.run([sys.executable, "-m", "book.local_kernels", *args], capture_output=True,
                          text=True, env=venv_env(), cwd=ROOT, timeout=120)
    assert proc.returncode == (0 if args == ["--help"] else 2), proc.stdout + proc.stderr
    if args == ["--help"]:
        assert "Build and manage books with Jupyter" in proc.stdout


def test_nbgrader_kernels_use_local_sockets_from_the_course_config(tmp_path):
    """`nbgrader validate` starts a kernel with the course's nbgrader_config.py: no TCP warning,
    and the private socket folder is gone when the command ends.

    The command gets a temporary folder of its own (TMPDIR), so folders other tests' nbgrader
    commands make in the shared /tmp at the same time (xdist) are not counted as left behind. It
    is a short path in /tmp, not under tmp_path: a Unix socket's path may not exceed 107 bytes,
    and pytest's folders under xdist are longer than that with the kernel's socket name."""
    import shutil
    import tempfile
    from pathlib import Path

    course = tmp_path / "course"
    course.mkdir()
    private_tmp = Path(tempfile.mkdtemp(prefix="nbk-", dir="/tmp"))
    try:
        _validate_with_private_tmp(course, private_tmp)
    finally:
        shutil.rmtree(private_tmp, ignore_errors=True)


def _validate_with_private_tmp(course, private_tmp):
    (course / "nbgrader_config.py").write_text((ROOT / "nbgrader_config.py").read_text())
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 6 * 7")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, course / "scratch.ipynb")
    env = {**venv_env(), "TMPDIR": str(private_tmp)}
    where = subprocess.run([sys.executable, "-c", "import tempfile; print(tempfile.gettempdir())"],
                           capture_output=True, text=True, env=env, check=True)
    assert where.stdout.strip() == str(private_tmp)  # the config's mkdtemp would make its folder here
    proc = subprocess.run([sys.executable, "-m", "nbgrader", "validate", "scratch.ipynb"], cwd=course,
                          capture_output=True, text=True, timeout=300, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "Success! Your notebook passes all the tests." in out, out
    assert WARNING not in out, out
    assert list(private_tmp.glob("nbgrader-kernels-*")) == []
