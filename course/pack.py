"""The student pack: ``python -m course.pack`` (what ``make student-pack`` runs).

Writes ``_build/student-pack.zip``: every released notebook (``exercises/``), the student runtime
``coursekit`` as a wheel, and a README whose first ``pip install`` line sets a fresh Python up.
The wheel is also left beside the zip (``_build/pack/``), where the book publishes it.

Nothing from the instructor's side goes in: the wheel is built from ``coursekit/`` alone (the
check framework and the visible checks), and :func:`leaks` refuses a pack in which any file holds
a line of a solution, a hidden check's grade id, or the instructor's packages.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import coursekit
from course import cells
from course.release import ROOT, assignments

OUT = ROOT / "_build"
PACK_DIR = OUT / "pack"
ZIP = OUT / "student-pack.zip"
WHEEL = f"coursekit-{coursekit.__version__}-py3-none-any.whl"
#: what the runtime needs in a student's Python (the wheel's dependencies)
REQUIRES = ["torch>=2.5", "numpy", "matplotlib", "nbformat", "nbclient", "ipykernel"]
TORCH = "torch==2.13.0"  # the version the course is tested with
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PIP_LINE = f"pip install --extra-index-url {CPU_INDEX} {TORCH} jupyterlab ./{WHEEL}"
#: the same, giving up on an unreachable index after one retry per package (pip then takes PyPI's torch)
PIP_LINE_QUICK = f"pip install --timeout 15 --retries 1 --extra-index-url {CPU_INDEX} {TORCH} jupyterlab ./{WHEEL}"
#: without the extra index: PyPI's default torch build (on Linux, with CUDA's libraries)
PIP_LINE_PYPI = f"pip install {TORCH} jupyterlab ./{WHEEL}"
#: a fresh venv after PIP_LINE (measured: python -m venv, then that line with the CPU wheel; Linux x86_64)
INSTALLED_SIZE = "1.3 GB"

PYPROJECT = """[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "coursekit"
version = "{version}"
description = "Test runtime for the exercise notebooks of the course on residual connections and normalization layers"
requires-python = ">=3.10"
dependencies = {deps}

[tool.setuptools.packages.find]
include = ["coursekit*"]

[tool.setuptools.package-data]
coursekit = ["released.json"]
"""

README = """# Residual connections and normalization layers: the exercises

In this folder, make a fresh virtual environment with Python 3.10 or newer and activate it:

    python3 -m venv .venv
    source .venv/bin/activate        (on Windows: .venv\\Scripts\\activate)

then install everything with one line:

    {pip}

The extra index gives PyTorch's CPU build; with JupyterLab the environment takes about
{size} on disk. Leave the index out on a machine with an NVIDIA GPU, to get the CUDA build from PyPI.

**If that line seems stuck** (minutes of `WARNING: Retrying ...` lines, or no output at all):
where download.pytorch.org cannot be reached, pip does not fail, it retries every package for ten
minutes and more. Stop it (Ctrl-C) and run

    {pip_quick}

which gives up on the unreachable index after a few minutes of 'WARNING: Retrying' lines (one or two
per package) and takes PyTorch from PyPI, or leave the
index out yourself:

    {pip_pypi}

PyPI's default build of PyTorch for Linux brings CUDA's libraries: several GB instead of {size}.
The notebooks run the same with either.

Then open the notebooks:

    jupyter lab

| notebook | you implement |
|---|---|
{rows}

Replace each `raise NotImplementedError()` with your code. The cells after it test what you wrote
and say what is wrong when something is. To check a whole notebook the way the grader runs it,
top to bottom in a fresh kernel, printing every visible test as PASS or FAIL:

    python -m coursekit.selfcheck {first}

(from this folder; from the notebook's own folder, give just its name).

The grader also runs hidden tests (their descriptions are in the notebook), so passing every
visible test is necessary, not sufficient. Hand in the notebook file the way your instructor asks,
under its own name.

The book, with a page for each exercise: {book}

In Colab, run the `%pip install` line from the exercise's page in the book in the notebook's first
cell, then restart the runtime.
"""


#: the time every file of the pack and of its wheel carries (2026-01-01 UTC): a build is a function
#: of the sources, so two builds of one commit give the same bytes
EPOCH = 1767225600


def build_wheel(dest: Path) -> Path:
    """``coursekit`` alone as a wheel in ``dest`` (pip, offline: no build isolation)."""
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(ROOT / "coursekit", src / "coursekit",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        deps = "[" + ", ".join(f'"{d}"' for d in REQUIRES) + "]"
        (src / "pyproject.toml").write_text(PYPROJECT.format(version=coursekit.__version__, deps=deps))
        env = dict(os.environ, SOURCE_DATE_EPOCH=str(EPOCH))  # the wheel's timestamps: the same bytes every build
        proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                               "--quiet", "-w", str(dest), str(src)], capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            raise RuntimeError(f"building the coursekit wheel failed:\n{proc.stdout}\n{proc.stderr}")
    return dest / WHEEL


def _notebooks() -> list[Path]:
    return [nb for a in assignments() for nb in sorted((ROOT / "exercises" / a).glob("*.ipynb"))]


def instructor_material() -> dict[str, set]:
    """What no file of the pack may hold: a line of a solution, a hidden check's grade id."""
    import nbformat

    lines, hidden = set(), set()
    for a in assignments():
        for path in sorted((ROOT / "solutions" / a).glob("*.ipynb")):
            for c in nbformat.read(str(path), as_version=4).cells:
                src = cells.source(c)
                if cells.role(c) == "answer" and "### BEGIN SOLUTION" in src:
                    body = src.split("### BEGIN SOLUTION", 1)[1].split("### END SOLUTION", 1)[0]
                    # a line long enough to be the solution's own, not a stub's `return x`
                    lines |= {ln.strip() for ln in body.splitlines() if len(ln.strip()) >= 24}
                if cells.role(c) == "test" and "### BEGIN HIDDEN TESTS" in src:
                    hidden.add(cells.grade_id(c))
    return {"solution lines": lines, "hidden checks": hidden}


def leaks(zip_path: Path) -> list[str]:
    """Every file in the pack (the wheel's files included) that holds something of :func:`instructor_material`,
    and every file of the wheel that is not the runtime's own (``coursekit/``, its metadata)."""
    sec = instructor_material()
    found = []

    def scan(name: str, text: str):
        for kind, items in sec.items():
            for s in items:
                if kind == "hidden checks":
                    # in a notebook, a hidden test's grade id is nbgrader metadata (it must be there),
                    # and so in the self-check's copy of the release's cells; what must not be
                    # there is code that runs it
                    hit = (re.search(rf'run\(\s*\\?["\']{re.escape(s)}\\?["\']', text)
                           if name.endswith((".ipynb", "coursekit/released.json"))
                           else s in text)  # in JSON, quotes are escaped
                else:
                    hit = s in text
                if hit:
                    found.append(f"{name}: {kind}: {s[:60]}")

    with zipfile.ZipFile(zip_path) as z:
        for info in z.infolist():
            data = z.read(info)
            if info.filename.endswith(".whl"):
                import io
                with zipfile.ZipFile(io.BytesIO(data)) as w:
                    for wi in w.infolist():
                        if not wi.filename.startswith(("coursekit/", "coursekit-")):
                            found.append(f"{info.filename}!{wi.filename}: not the runtime's file")
                        scan(f"{info.filename}!{wi.filename}", w.read(wi).decode("utf-8", "replace"))
            else:
                scan(info.filename, data.decode("utf-8", "replace"))
    return found


def readme(nbs: list[Path], book_url: str) -> str:
    """The pack's README for these notebooks; ``book_url``: where the book is published
    (``html.baseurl``, :mod:`course.site`)."""
    rows = "\n".join(f"| `{nb.parent.name}/{nb.name}` | {_implements(nb)} |" for nb in nbs)
    return README.format(pip=PIP_LINE, pip_quick=PIP_LINE_QUICK, pip_pypi=PIP_LINE_PYPI, size=INSTALLED_SIZE,
                         rows=rows, first=f"{nbs[0].parent.name}/{nbs[0].name}", book=book_url)


def build(zip_path: Path = ZIP) -> Path:
    from course import site

    wheel = build_wheel(PACK_DIR)
    nbs = _notebooks()
    readme_text = readme(nbs, site.load(ROOT).base_url)
    zip_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = zip_path.with_suffix(".tmp")
    members = [("student-pack/README.md", readme_text.encode()), (f"student-pack/{WHEEL}", wheel.read_bytes())]
    members += [(f"student-pack/{nb.parent.name}/{nb.name}", nb.read_bytes()) for nb in nbs]
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members:  # fixed order, time and mode: the same bytes from the same sources
            info = zipfile.ZipInfo(name, date_time=time.gmtime(EPOCH)[:6])
            info.external_attr = 0o100644 << 16  # a regular file, rw-r--r--
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    found = leaks(tmp)
    if found:
        tmp.unlink()
        raise RuntimeError("the student pack would leak instructor material:\n  " + "\n  ".join(found[:20]))
    tmp.replace(zip_path)
    shutil.copy(zip_path, PACK_DIR / zip_path.name)  # published with the book, beside the wheel
    return zip_path


def _implements(nb: Path) -> str:
    """The names a notebook's answer cells define (classes and functions), for the README's table."""
    import nbformat

    names = []
    for c in nbformat.read(str(nb), as_version=4).cells:
        if cells.role(c) == "answer":
            names += re.findall(r"^(?:class|def) (\w+)", cells.source(c), re.M)
    return ", ".join(f"`{n}`" for n in names)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m course.pack", description=__doc__.splitlines()[0])
    ap.parse_args(argv)
    path = build()
    print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size >> 10} KB) and {PACK_DIR.relative_to(ROOT)}/{WHEEL}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
