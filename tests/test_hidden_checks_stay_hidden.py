"""The instructor's hidden checks (``course/hidden/*.py``) stay hidden from the code they grade.

A submission (``LEAKER``) tries every way to read them from inside the sandbox: ``open()`` on the
files (their path from ``PYTHONPATH`` and from ``course.__file__``), ``glob`` under that folder,
``inspect.getsource`` of a hidden probe (from :data:`coursekit.checks.REGISTRY`),
``linecache.getlines`` of its file, the module's loader's ``get_source``, the traceback of a
hidden probe that fails, ``sys.modules`` and the registry, and every function and module the
garbage collector knows; whatever it gets it prints and raises as the cell's error. The hidden
checks' probes run in the grader (``autograder/referee/calls.py``), so nothing of them is there to find:
no module, no registered check, no code object. Graded both ways
a submission runs (a one-off sandbox per submission, and a grading slot's zygote forking a child
per submission, into an nbgrader course with nbgrader's own feedback afterwards), each attempt
must come back empty, and no non-trivial line of ``course/hidden/*.py`` may appear in any output:
grades.csv, results.json, report.html, feedback/, the autograded notebooks, the gradebook,
nbgrader's feedback.
"""
from __future__ import annotations

import csv
import html
import json
import os
import sqlite3
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest

from course.release import ROOT, scratch_course, venv_env
from tools.fixture_class import release_dict, solved_dict, with_code

pytestmark = [pytest.mark.autograder, pytest.mark.slow]
A, NB = "01_layernorm", "layernorm"
ATTEMPTS = ("open", "glob", "getsource", "linecache", "loader", "traceback", "modules", "gc")

LEAKER = r'''
import glob, inspect, linecache, os, sys, traceback
import course
from coursekit.checks import REGISTRY, load_all
load_all()
DIRS = [os.path.join(p, "course", "hidden") for p in os.environ.get("PYTHONPATH", "").split(":") if p]
DIRS.append(os.path.join(os.path.dirname(course.__file__), "hidden"))
NAMES = ("layernorm", "rmsnorm", "residual", "transformer", "backward", "__init__")
HIDDEN_PROBES = [c.probe for c in REGISTRY.values()
                 if "coursekit" not in getattr(getattr(c.probe, "__code__", None), "co_filename", "coursekit")]

def leak(how, text):
    """Print what came back, and raise its longer lines as this cell's error."""
    print(f"{how} GOT: {text}")
    lines = [l.strip() for l in str(text).splitlines() if len(l.strip()) >= 25]
    if lines:
        raise RuntimeError(f"LEAK {how}: " + " | ".join(lines[:4]))
    raise RuntimeError(f"NOTHING {how} ({len(HIDDEN_PROBES)} hidden probes)")


class LayerNorm:  # each attempt below writes into it, so each is in the graded slice and runs
    pass
# %% added cell
got = ""
for d in DIRS:
    for n in NAMES:
        try:
            got += open(os.path.join(d, n + ".py")).read()
        except OSError:
            pass
LayerNorm.attempt = leak("open", got)
# %% added cell
got = ""
for d in DIRS:
    for f in glob.glob(os.path.join(d, "**"), recursive=True):
        try:
            got += open(f, errors="replace").read()
        except OSError:
            pass
LayerNorm.attempt = leak("glob", got)
# %% added cell
got = ""
for p in HIDDEN_PROBES:
    try:
        got += inspect.getsource(p)
    except Exception:
        pass
    try:
        got += inspect.getsource(sys.modules[p.__module__])
    except Exception:
        pass
LayerNorm.attempt = leak("getsource", got)
# %% added cell
got = ""
for p in HIDDEN_PROBES:
    got += "".join(linecache.getlines(p.__code__.co_filename, p.__globals__))
    got += "".join(linecache.getlines(p.__code__.co_filename))
for f in list(linecache.cache):
    if "hidden" in f:
        got += "".join(linecache.getlines(f))
LayerNorm.attempt = leak("linecache", got)
# %% added cell
got = ""
for name, m in list(sys.modules.items()):
    if name.startswith("course.hidden"):
        for loader in (getattr(m, "__loader__", None), getattr(getattr(m, "__spec__", None), "loader", None)):
            try:
                got += loader.get_source(name) or ""
            except Exception:
                pass
LayerNorm.attempt = leak("loader", got)
# %% added cell
got = ""
FILES = {p.__code__.co_filename for p in HIDDEN_PROBES}
for p in HIDDEN_PROBES:
    for ns in ({}, {"LayerNorm": 1, "RMSNorm": 1, "Residual": 1}):
        try:
            p(ns)
        except BaseException as e:  # the lines a traceback shows of the hidden checks' own frames
            got += "".join((f.line or "") + "\n" for f in traceback.extract_tb(e.__traceback__) if f.filename in FILES)
LayerNorm.attempt = leak("traceback", got)
# %% added cell
import gc, types
got = ""
for name in list(sys.modules):
    if name.startswith("course.hidden"):
        got += f"found the hidden module {name} in sys.modules\n"
for gid in ("layernorm_hard_rows", "layernorm_shift_scale_invariance", "layernorm_tuple_shape", "layernorm_gradients"):
    if gid in REGISTRY:
        got += f"found the hidden check {gid} in the registry\n"
LayerNorm.attempt = leak("modules", got)
# %% added cell
got = ""
for o in gc.get_objects():
    if isinstance(o, types.FunctionType) and ("hidden" in o.__code__.co_filename
                                               or str(getattr(o, "__module__", "")).startswith("course.hidden")):
        got += f"found a function of the hidden checks: {o.__qualname__} in {o.__code__.co_filename}\n"
    elif isinstance(o, types.ModuleType) and o.__name__.startswith("course.hidden"):
        got += f"found the hidden module {o.__name__} by the garbage collector\n"
LayerNorm.attempt = leak("gc", got)
'''


def hidden_lines() -> set[str]:
    """Every line of course/hidden/*.py of 25 characters or more (stripped) that is not public anyway:
    in a released notebook or in the student runtime (coursekit/), or holding a check's one-line
    description (each test's doc is in the released notebook and in the feedback, by design)."""
    from coursekit.checks import load_all

    public = "\n".join(p.read_text() for p in (ROOT / "coursekit").rglob("*.py"))
    for nb in (ROOT / "exercises").glob("*/*.ipynb"):
        public += "\n".join("".join(c["source"]) for c in json.loads(nb.read_text())["cells"])
    docs = [c.doc for c in load_all().values() if len(c.doc) >= 25]
    lines = {l.strip() for p in (ROOT / "course" / "hidden").glob("*.py") for l in p.read_text().splitlines()}
    return {l for l in lines if len(l) >= 25 and l not in public and not any(d in l for d in docs)}


def _strings(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)


def readable(path: Path) -> str:
    """A file's text as a reader sees it: raw, HTML-unescaped, JSON strings decoded, database rows."""
    if path.suffix in (".db", ".sqlite"):
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            parts = []
            for (table,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'"):
                for row in con.execute(f'SELECT * FROM "{table}"'):
                    parts += [str(v) for v in row if v is not None]
        finally:
            con.close()
        text = "\n".join(parts)
    else:
        text = path.read_bytes().decode("utf-8", "replace")
    variants = [text, html.unescape(text)]
    if path.suffix in (".json", ".ipynb"):
        joined = "\n".join(_strings(json.loads(text)))
        variants += [joined, html.unescape(joined)]
    return "\n".join(variants)


def leaks_in(texts: dict[str, str]) -> list[tuple[str, str]]:
    found = []
    for line in sorted(hidden_lines()):
        for name, text in texts.items():
            if line in text:
                found.append((name, line))
    return found


def test_the_hidden_lines_are_many_and_the_search_finds_them(tmp_path):
    lines = hidden_lines()
    assert len(lines) > 50
    probe = tmp_path / "x.json"
    probe.write_text(json.dumps({"e": html.escape(sorted(lines)[0])}))
    assert leaks_in({"x": readable(probe)})


def _assert_each_attempt_got_nothing(cell_errors: list[dict]):
    said = " ".join(str(c.get("error", "")) for c in cell_errors)
    for how in ATTEMPTS:
        assert f"NOTHING {how}" in said, (how, said[:3000])
    assert "LEAK" not in said
    # nothing of the hidden checks is in the sandbox at all: the grader's referee runs them
    assert "(0 hidden probes)" in said


def test_a_one_off_sandbox_gives_no_hidden_source(tmp_path):
    """One sandbox and interpreter per submission (``grade_class(zygote=False)``)."""
    from autograder.grade import grade_class
    from autograder.sandbox.bwrap import Limits

    name, release = release_dict(A)
    d = tmp_path / "submitted" / "leaker" / A
    d.mkdir(parents=True)
    (d / name).write_text(json.dumps(with_code(release, LEAKER)))
    [o] = grade_class(tmp_path / "submitted", tmp_path / "out", jobs=1, zygote=False, progress=False,
                      limits=Limits(wall_s=240, cell_s=60))
    assert o.status == "graded", o.message
    _assert_each_attempt_got_nothing(o.cell_errors)
    assert not leaks_in({"outcome": json.dumps(asdict(o))})


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """solution, stub and the leaker, handed in to a scratch nbgrader course, graded there in grading
    slots, then nbgrader's own feedback generated."""
    tmp = tmp_path_factory.mktemp("hidden")
    course = scratch_course(tmp)
    import shutil
    shutil.copytree(ROOT / "exercises", course / "exercises")
    name, release = release_dict(A)
    for student, nb in (("solution", solved_dict(A)), ("stub", release), ("leaker", with_code(release, LEAKER))):
        d = course / "submitted" / student / A
        d.mkdir(parents=True)
        (d / name).write_text(json.dumps(nb))
        (d / "timestamp.txt").write_text("2025-03-01 09:00:00.000000 UTC")
    env = dict(venv_env(), OMP_NUM_THREADS="1")
    out = tmp / "out"
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", str(course / "submitted"), "--out", str(out),
                           "--jobs", "2", "--no-progress", "--timeout", "240", "--cell-timeout", "60"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    fb = subprocess.run([sys.executable, "-m", "nbgrader", "generate_feedback", A], cwd=course, capture_output=True,
                        text=True, env=venv_env(), timeout=600)
    assert fb.returncode == 0, fb.stderr[-3000:]
    return {"course": course, "out": out, "proc": proc}


def test_in_grading_slots_each_attempt_gets_nothing(graded):
    results = {r["student_id"]: r for r in json.loads((graded["out"] / "results.json").read_text())}
    rows = {r["student_id"]: r for r in csv.DictReader(open(graded["out"] / "grades.csv"))}
    assert float(rows["solution"]["score"]) > 0 and float(rows["stub"]["score"]) == 0  # the checks ran
    assert results["leaker"]["status"] == "graded", results["leaker"]["message"]
    _assert_each_attempt_got_nothing(results["leaker"]["cell_errors"])


def test_no_output_holds_a_line_of_the_hidden_checks(graded):
    course, out = graded["course"], graded["out"]
    files = [p for p in out.rglob("*") if p.is_file()]
    files += [p for sub in ("autograded", "feedback") for p in (course / sub).rglob("*") if p.is_file()]
    files.append(course / "gradebook.db")
    names = {p.name for p in files}
    for want in ("grades.csv", "results.json", "report.html", "gradebook.db"):
        assert want in names, (want, sorted(names))
    assert any("autograded/leaker" in p.as_posix() for p in files) and any(
        p.as_posix().endswith(f"feedback/leaker/{A}/{NB}.html") and course in p.parents for p in files)
    texts = {str(p): readable(p) for p in files}
    assert not leaks_in(texts)
