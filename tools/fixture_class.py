"""Build classes of submissions from the fixtures in tests/fixtures/ (tests and the sample class).

* ``hostile/<name>.py``: code a cheating student puts in the first answer cell (docstring:
  first line = what it does; ``assignment:``; ``loses: all`` or grade ids). Placeholders
  ``__REPO__``, ``__MARKER__``, ``__PORT__``, ``__OUTDIR__`` are filled in when the class is built.
* ``hostile/notebooks.py``: cheating done by editing the notebook (test cells, metadata, outputs).
* ``right/<assignment>/<name>.py`` with a line ``hostile class: yes`` in its docstring: honest code
  that must earn what the reference earns here too (``loses: none``; e.g. code the static scan
  must not mistake for a cheat).
* ``broken/cases.py``: files that are not good notebooks, or missing, renamed, odd.
"""
from __future__ import annotations

import ast
import copy
import json
import re
import runpy
from dataclasses import dataclass
from pathlib import Path

import nbformat

from tools.make_submission import add_cells, split_cells
from course import cells
from course.release import ROOT

FIXTURES = ROOT / "tests" / "fixtures"
MARKERS = ("### BEGIN SOLUTION", "### END SOLUTION")


@dataclass
class Case:
    student: str
    assignment: str
    kind: str  # hostile | structural | broken | solution | stub
    summary: str
    loses: list | str  # "all", "none", or grade ids that must score 0
    expect: str = ""  # broken: "zero" or "full"
    #: hostile: a phrase the row's review column must hold (the attack reaches around the course, so a
    #: person is asked to look); such a case may keep points its probes could not see it take
    review: str = ""


def release_dict(assignment: str, root: Path = ROOT) -> tuple[str, dict]:
    path = sorted((root / "exercises" / assignment).glob("*.ipynb"))[0]
    return path.name, json.loads(path.read_text())


def solved_dict(assignment: str, root: Path = ROOT) -> dict:
    """The released notebook with each answer cell replaced by the reference answer (same grade id)."""
    name, nb = release_dict(assignment, root)
    sol = nbformat.read(str(root / "solutions" / assignment / name), as_version=4)
    answers = {}
    for c in sol.cells:
        if cells.role(c) == "answer":
            answers[cells.grade_id(c)] = "\n".join(l for l in c.source.splitlines() if l.strip() not in MARKERS)
    for c in nb["cells"]:
        if cells.role(c) == "answer" and cells.grade_id(c) in answers:
            c["source"] = answers[cells.grade_id(c)]
    return nb


def _docstring(code: str) -> str:
    """The fixture's docstring; a fixture with IPython syntax (``x = %pwd``) is not plain Python."""
    try:
        return ast.get_docstring(ast.parse(code)) or ""
    except SyntaxError:
        m = re.match(r'\s*(?:"""(.*?)"""|\'\'\'(.*?)\'\'\')', code, re.S)
        return ((m.group(1) or m.group(2)) if m else "").strip()


def read_code_fixture(path: Path) -> dict:
    code = Path(path).read_text()
    doc = _docstring(code)
    field = lambda k: (re.search(rf"^{k}:\s*(.+)$", doc, re.M) or [None, ""])[1].strip()  # noqa: E731
    loses = field("loses")
    return {"name": Path(path).stem, "summary": doc.strip().splitlines()[0], "assignment": field("assignment"),
            "loses": loses if loses in ("all", "none") else loses.split(), "code": code, "review": field("review")}


def _write(dest: Path, student: str, assignment: str, name: str, content) -> None:
    d = dest / student / assignment
    d.mkdir(parents=True, exist_ok=True)
    if content is None:
        return
    if isinstance(content, tuple) and content[0] == "rename":
        _, name, content = content
    data = content if isinstance(content, bytes) else json.dumps(content, indent=1).encode()
    (d / name).write_bytes(data)


def with_code(nb: dict, code: str) -> dict:
    """``code`` in the first answer cell, the other answer cells emptied (as make_submission does);
    the parts after ``# %% added cell`` lines become cells the student added after it."""
    code, added = split_cells(code)
    first = None
    for i, c in enumerate(nb["cells"]):
        if cells.role(c) == "answer":
            c["source"] = code if first is None else "# (everything is in the first answer cell)"
            first = i if first is None else first
    if first is not None:
        add_cells(nb["cells"], first, added, lambda src: json.loads(json.dumps(nbformat.v4.new_code_cell(src))))
    return nb


def build(dest: Path, *, assignment: str = "01_layernorm", placeholders: dict | None = None,
          kinds=("solution", "stub", "hostile", "right", "structural", "broken"), root: Path = ROOT) -> list[Case]:
    """Write a class (nbgrader submitted layout) into ``dest``; return what each student must get."""
    dest = Path(dest)
    ph = {"__REPO__": str(root), "__MARKER__": "AUTOGRADER_MARKER", "__PORT__": "9", "__OUTDIR__": "/nonexistent"}
    ph.update(placeholders or {})
    name, release = release_dict(assignment, root)
    solved = solved_dict(assignment, root)
    cases = []
    if "solution" in kinds:
        _write(dest, "solution", assignment, name, solved)
        cases.append(Case("solution", assignment, "solution", "the reference answers", "none"))
    if "stub" in kinds:
        _write(dest, "stub", assignment, name, release)
        cases.append(Case("stub", assignment, "stub", "the released notebook, untouched", "all"))
    if "hostile" in kinds:
        for p in sorted((FIXTURES / "hostile").glob("*.py")):
            if p.name == "notebooks.py":
                continue
            fx = read_code_fixture(p)
            if fx["assignment"] != assignment:
                continue
            code = fx["code"]
            for k, v in ph.items():
                code = code.replace(k, v)
            _write(dest, f"hostile-{fx['name']}", assignment, name, with_code(copy.deepcopy(release), code))
            cases.append(Case(f"hostile-{fx['name']}", assignment, "hostile", fx["summary"], fx["loses"],
                              review=fx["review"]))
    if "right" in kinds:
        for p in sorted((FIXTURES / "right" / assignment).glob("*.py")):
            fx = read_code_fixture(p)
            if not re.search(r"^hostile class:\s*yes\s*$", _docstring(fx["code"]), re.M):
                continue
            _write(dest, f"right-{fx['name']}", assignment, name, with_code(copy.deepcopy(release), fx["code"]))
            cases.append(Case(f"right-{fx['name']}", assignment, "right", fx["summary"], "none"))
    if "structural" in kinds:
        mod = runpy.run_path(str(FIXTURES / "hostile" / "notebooks.py"))
        for cname, fn, loses in mod["CASES"]:
            nb = fn(copy.deepcopy(release), copy.deepcopy(solved))
            _write(dest, f"tamper-{cname}", assignment, name, nb)
            cases.append(Case(f"tamper-{cname}", assignment, "structural", (fn.__doc__ or cname).strip(), loses))
    if "broken" in kinds:
        mod = runpy.run_path(str(FIXTURES / "broken" / "cases.py"))
        for cname, fn, expect in mod["CASES"]:
            content = fn(copy.deepcopy(release), copy.deepcopy(solved))
            _write(dest, f"broken-{cname}", assignment, name, content)
            cases.append(Case(f"broken-{cname}", assignment, "broken", (fn.__doc__ or cname).strip(),
                              "all" if expect == "zero" else "none", expect))
    return cases
