"""The student pack (``make student-pack``): what it holds, that it leaks nothing of the
instructor's, and that a fresh Python set up from it alone runs a notebook's visible tests."""
from __future__ import annotations

import io
import json
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from course import pack
from course.release import ROOT

pytestmark = pytest.mark.autograder


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return pack.build(tmp_path_factory.mktemp("pack") / "student-pack.zip")


def test_pack_holds_every_notebook_the_runtime_wheel_and_a_readme(built):
    names = zipfile.ZipFile(built).namelist()
    want = {f"student-pack/{p.parent.name}/{p.name}" for p in (ROOT / "exercises").glob("*/*.ipynb")}
    assert want <= set(names) and f"student-pack/{pack.WHEEL}" in names and "student-pack/README.md" in names
    readme = zipfile.ZipFile(built).read("student-pack/README.md").decode()
    first_pip = next(line.strip() for line in readme.splitlines() if "pip install" in line)
    assert first_pip == pack.PIP_LINE and pack.WHEEL in first_pip and "jupyterlab" in first_pip


def test_the_wheel_is_the_runtime_alone(built):
    wheel = zipfile.ZipFile(io.BytesIO(zipfile.ZipFile(built).read(f"student-pack/{pack.WHEEL}")))
    files = wheel.namelist()
    assert any(f == "coursekit/checks/__init__.py" for f in files)
    assert all(f.startswith(("coursekit/", "coursekit-")) for f in files), files


def test_pack_leaks_nothing(built):
    assert pack.leaks(built) == []


def _with(built: Path, tmp: Path, name: str, data: bytes, inside_wheel: bool = False) -> Path:
    """A copy of the pack with one more file (in the wheel when ``inside_wheel``)."""
    out = tmp / f"planted-{abs(hash((name, inside_wheel)))}.zip"
    src = zipfile.ZipFile(built)
    with zipfile.ZipFile(out, "w") as z:
        for info in src.infolist():
            blob = src.read(info)
            if inside_wheel and info.filename.endswith(".whl"):
                buf = io.BytesIO()
                with zipfile.ZipFile(io.BytesIO(blob)) as w, zipfile.ZipFile(buf, "w") as w2:
                    for wi in w.infolist():
                        w2.writestr(wi, w.read(wi))
                    w2.writestr(name, data)
                blob = buf.getvalue()
            z.writestr(info, blob)
        if not inside_wheel:
            z.writestr(name, data)
    return out


def test_the_leak_check_catches_what_it_guards_against(built, tmp_path):
    """Each kind of leak, planted in a copy of the pack, is reported."""
    secret = sorted(pack.instructor_material()["solution lines"])[0]
    hidden = sorted(pack.instructor_material()["hidden checks"])[0]
    assert pack.leaks(_with(built, tmp_path, "student-pack/notes.py", secret.encode()))
    nb = json.dumps({"cells": [{"source": [f'run("{hidden}", globals())']}]}).encode()
    assert pack.leaks(_with(built, tmp_path, "student-pack/extra.ipynb", nb))
    assert pack.leaks(_with(built, tmp_path, "coursekit/extra.py", f'register("{hidden}")'.encode(), True))
    assert pack.leaks(_with(built, tmp_path, "course/hidden/layernorm.py", b"# instructor", True))


@pytest.fixture(scope="module")
def fresh_python(built, tmp_path_factory):
    """A new virtual environment with torch and the pack's wheel (and what the wheel requires) only:
    no course, no autograder, no nbgrader."""
    root = tmp_path_factory.mktemp("fresh")
    venv.EnvBuilder(with_pip=True).create(root / "venv")
    py = root / "venv" / "bin" / "python"
    with zipfile.ZipFile(built) as z:
        z.extractall(root)
    pack_dir = root / "student-pack"
    proc = subprocess.run([str(py), "-m", "pip", "install", "-q", pack.TORCH, f"./{pack.WHEEL}"],
                          cwd=pack_dir, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return py, pack_dir


@pytest.mark.slow
def test_a_fresh_python_with_the_pack_alone_passes_a_solved_notebook(fresh_python):
    from tools.fixture_class import solved_dict

    py, pack_dir = fresh_python
    check = subprocess.run([str(py), "-c", "import coursekit, importlib.util as u; "
                            "print(u.find_spec('course'), u.find_spec('autograder'), u.find_spec('nbgrader'))"],
                           capture_output=True, text=True, cwd=pack_dir)
    assert check.stdout.split() == ["None", "None", "None"], check.stdout + check.stderr
    solved = pack_dir / "01_layernorm" / "solved.ipynb"
    solved.write_text(json.dumps(solved_dict("01_layernorm")))
    proc = subprocess.run([str(py), "-m", "coursekit.selfcheck", str(solved)], capture_output=True, text=True,
                          timeout=900, cwd=pack_dir)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "4/4 visible tests pass" in proc.stdout and "FAIL " not in proc.stdout, proc.stdout
    assert "[hidden: graded when you submit]" in proc.stdout
    stub = subprocess.run([str(py), "-m", "coursekit.selfcheck", "01_layernorm/layernorm.ipynb"],
                          capture_output=True, text=True, timeout=900, cwd=pack_dir)
    assert stub.returncode == 1 and "not implemented yet" in stub.stdout, stub.stdout[-2000:]


def test_a_notebook_without_its_runtime_stops_with_one_sentence(tmp_path):
    """The first cell, in a Python that lacks the runtime: one clear sentence, no traceback."""
    import nbformat

    from course import cells
    nb = nbformat.read(str(ROOT / "exercises" / "02_rmsnorm" / "rmsnorm.ipynb"), as_version=4)
    setup = next(c.source for c in nb.cells if cells.role(c) == "instructor")
    # a Python without coursekit: this interpreter with the checkout and the venv's packages hidden
    code = ("import sys\n"
            "sys.modules['coursekit'] = None  # as if not installed\n"
            "from IPython.core.interactiveshell import InteractiveShell\n"
            "sh = InteractiveShell.instance()\n"
            f"sh.run_cell({setup!r})\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    out = proc.stdout + proc.stderr
    assert "coursekit is not installed in this Python" in out and "pip line" in out, out
    assert "Traceback" not in out and "ModuleNotFoundError" not in out, out


# -- issue 18: what students are told ----------------------------------------------------------

def test_pack_readme_says_what_to_do_when_pip_hangs_and_the_installed_size(built):
    readme = zipfile.ZipFile(built).read("student-pack/README.md").decode()
    assert pack.PIP_LINE_QUICK in readme and "--timeout 15 --retries 1" in pack.PIP_LINE_QUICK
    assert pack.PIP_LINE_PYPI in readme and "download.pytorch.org" not in pack.PIP_LINE_PYPI
    assert "seems stuck" in readme and "WARNING: Retrying" in readme and pack.INSTALLED_SIZE in readme
    assert "python3 -m venv .venv" in readme  # the environment is made before the pip line
    assert readme.index(pack.PIP_LINE) < readme.index(pack.PIP_LINE_QUICK)  # the one line stays first


def test_intro_gives_the_student_pack_first_and_the_clone_second():
    """chapters/intro.md, "Getting the exercises": the pack (its link, its one pip line) before any
    git clone or make, which are for contributors."""
    import re

    intro = (ROOT / "chapters" / "intro.md").read_text()
    section = intro[intro.index("## Getting the exercises"):]
    section = section[:section.index("\n## ", 1)] if "\n## " in section[1:] else section
    link = section.index("<../_build/student-pack.zip>")
    pip = section.index(pack.PIP_LINE)
    assert link < pip < section.index("git clone") < section.index("make book")
    assert section.index("Contributors") < section.index("git clone")
    assert re.search(r"python -m coursekit\.selfcheck \w+\.ipynb", section)
    assert "--timeout 15 --retries 1" in section and "1.3 GB" in section
    # the exercise pages link the same file, from one folder deeper
    page = (ROOT / "chapters" / "exercises" / "01_layernorm.md").read_text()
    assert "<../../_build/student-pack.zip>" in page


def test_notebooks_name_the_selfcheck_and_link_the_published_book():
    """Every notebook (source and release) says `python -m coursekit.selfcheck <its own file>` and
    links its chapter on the published book (html.baseurl in _config.yml), not a path of a clone:
    neither exists in the pack, in Colab or in a feedback page."""
    import re

    import yaml

    base = yaml.safe_load((ROOT / "_config.yml").read_text())["html"]["baseurl"].rstrip("/")
    assert base.startswith("https://")
    for folder in ("solutions", "exercises"):
        for nb in sorted((ROOT / folder).glob("*/*.ipynb")):
            md = "\n".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"]
                           if c["cell_type"] == "markdown")
            assert "make check" not in md and "../../chapters" not in md and "course folder" not in md, nb
            assert f"python -m coursekit.selfcheck {nb.name}" in md, nb
            links = re.findall(r"\]\((https?://[^)]+)\)", md)
            chapters = [u for u in links if "/chapters/" in u]
            assert chapters, nb
            for u in chapters:
                assert u.startswith(base + "/chapters/") and u.endswith(".html"), u
                page = u[len(base) + 1:-len(".html")] + ".md"
                assert (ROOT / page).is_file(), u


def test_two_builds_of_one_commit_give_the_same_bytes(built, tmp_path):
    """Fixed order, timestamps and modes in the pack and in its wheel: a rebuild changes nothing."""
    import time
    time.sleep(1.1)  # a zip's timestamps have 2-second steps: a rebuild in the same second proves less
    again = pack.build(tmp_path / "student-pack.zip")
    assert again.read_bytes() == built.read_bytes()
    with zipfile.ZipFile(built) as z:
        assert {i.date_time for i in z.infolist()} == {time.gmtime(pack.EPOCH)[:6]}
        wheel = next(n for n in z.namelist() if n.endswith(".whl"))
        with zipfile.ZipFile(io.BytesIO(z.read(wheel))) as w:
            assert len({i.date_time for i in w.infolist()}) == 1


def test_every_place_that_gives_the_install_line_gives_its_fallback_after_it():
    """The exercise pages (book.build.runtime_install), the intro and the pack's README: the line
    first, then the one that gives up on a blocked index within seconds."""
    from book.build import runtime_install
    page = runtime_install()
    assert page.index(pack.PIP_LINE) < page.index(pack.PIP_LINE_QUICK)
    intro = (ROOT / "chapters" / "intro.md").read_text()
    assert "--timeout 15 --retries 1" in intro
