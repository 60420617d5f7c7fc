"""Build student notebooks from code, for fixture classes and the bundled sample class.

A *code fixture* is a ``.py`` file whose docstring says what it is and what it must lose::

    \"\"\"Unbiased variance: divides by D - 1 instead of D.

    loses: layernorm_matches_torch layernorm_low_variance_rows
    message: divide by D, not D-1
    \"\"\"
    import torch
    class LayerNorm(torch.nn.Module):
        ...

``loses`` lists grade ids that must score zero; ``message`` (optional) is a phrase the failing
test's output must contain. :func:`submission_from_code` puts the file into the first solution
cell of the released notebook, as a student hands it in (no docstring, none of the imports the
locked setup cell makes: ``import torch``, ``from torch import nn``, ``import torch.nn.functional
as F``), and empties the other solution cells, which is what a student who wrote everything in one
cell would hand in.

A line ``# %% added cell`` starts a cell the student added (a scratch cell, no nbgrader
metadata): what follows it, up to the next such line, becomes a new code cell right after the
first solution cell (:func:`split_cells`). Run as one file (the in-process tests), the markers
are comments and the code runs in the same order.
"""
from __future__ import annotations

import ast
import copy
import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

from course import cells
from course.release import ROOT


@dataclass
class CodeFixture:
    path: Path
    assignment: str
    name: str
    summary: str
    loses: list[str]
    message: str | None
    code: str
    #: the fixture is plain Python, which tests may also run in-process (``in process: no`` in its
    #: docstring: it holds notebook syntax, such as a ``%%writefile`` cell, that only a kernel runs)
    in_process: bool = True
    #: stock ``nbgrader autograde`` gives 0 to any test cell that writes to stderr (nbgrader's
    #: ``determine_grade``), so honest code that logs there loses those cells under stock nbgrader
    #: only (``stock nbgrader: stderr costs`` in its docstring); the course grader judges by probe
    stock_stderr_costs: bool = False


def _fixture_docstring(code: str) -> str:
    """The fixture's docstring, also when its cells hold IPython syntax (``%%writefile``)."""
    try:
        return ast.get_docstring(ast.parse(code)) or ""
    except SyntaxError:
        m = re.match(r'\s*(?:"""(.*?)"""|\'\'\'(.*?)\'\'\')', code, re.S)
        return ((m.group(1) or m.group(2)) if m else "").strip()


def read_fixture(path: Path) -> CodeFixture:
    code = Path(path).read_text()
    doc = _fixture_docstring(code)
    loses = re.search(r"^loses:\s*(.+)$", doc, re.M)
    message = re.search(r"^message:\s*(.+)$", doc, re.M)
    return CodeFixture(
        path=Path(path),
        assignment=Path(path).parent.name,
        name=Path(path).stem,
        summary=doc.strip().splitlines()[0] if doc.strip() else Path(path).stem,
        loses=loses.group(1).split() if loses else [],
        message=message.group(1).strip() if message else None,
        code=code,
        in_process=not re.search(r"^in process:\s*no\b", doc, re.M),
        stock_stderr_costs=bool(re.search(r"^stock nbgrader:\s*stderr costs\b", doc, re.M)),
    )


def fixtures(folder: Path) -> list[CodeFixture]:
    """Every ``<assignment>/<name>.py`` under ``folder``."""
    return [read_fixture(p) for p in sorted(Path(folder).glob("*/*.py"))]


#: a line that starts a cell added by the student, in a code fixture
ADDED_CELL = re.compile(r"^# %% added cell.*$", re.M)


#: what the released setup cell of every exercise imports: a student's answer cell does not repeat it
SETUP_IMPORTS = frozenset({"import torch", "from torch import nn", "import torch.nn as nn",
                           "import torch.nn.functional as F", "from torch.nn import functional as F"})
_DOCSTRING = re.compile(r'\A\s*(?:"""(?:.|\n)*?"""|\'\'\'(?:.|\n)*?\'\'\')[ \t]*\n')


def as_answer_cell(code: str) -> str:
    """A fixture's first part as a student hands it in: without the fixture's docstring (what it is,
    what it loses) and without the imports the locked setup cell already makes."""
    code = _DOCSTRING.sub("", code, count=1)
    lines = [line for line in code.splitlines() if line.rstrip() not in SETUP_IMPORTS]
    return "\n".join(lines).strip("\n") + "\n"


def split_cells(code: str) -> tuple[str, list[str]]:
    """(the answer cell's code, the added cells' code) of a fixture (see ``# %% added cell``), in
    the layout students hand in: the answer cell holds only the answer (:func:`as_answer_cell`)."""
    parts = ADDED_CELL.split(code)
    return as_answer_cell(parts[0]), [p.strip("\n") + "\n" for p in parts[1:]]


def add_cells(cells: list, after: int, sources: list[str], new_cell) -> None:
    """Insert ``new_cell(source)`` for each of ``sources`` after position ``after`` of ``cells``."""
    for k, src in enumerate(sources, 1):
        cells.insert(after + k, new_cell(src))


def release_notebook(assignment: str, root: Path = ROOT) -> tuple[str, nbformat.NotebookNode]:
    """(notebook file name, notebook) of the released (student) version of an assignment."""
    paths = sorted((root / "exercises" / assignment).glob("*.ipynb"))
    if len(paths) != 1:
        raise FileNotFoundError(f"expected one notebook in exercises/{assignment}, found {len(paths)}")
    return paths[0].name, nbformat.read(paths[0], as_version=4)


def is_solution_cell(cell) -> bool:
    return cells.role(cell) == "answer"


def submission_from_code(assignment: str, code: str, root: Path = ROOT) -> tuple[str, nbformat.NotebookNode]:
    """The released notebook with ``code`` as the student's answer (first solution cell)."""
    name, nb = release_notebook(assignment, root)
    nb = copy.deepcopy(nb)
    code, added = split_cells(code)
    first = None
    for i, cell in enumerate(nb.cells):
        if is_solution_cell(cell):
            cell.source = code if first is None else "# (everything is defined in the first answer cell)"
            first = i if first is None else first
    if first is None:
        raise ValueError(f"exercises/{assignment} has no solution cell")
    add_cells(nb.cells, first, added, nbformat.v4.new_code_cell)
    return name, nb


def write_submission(submitted: Path, student: str, assignment: str, name: str, nb) -> Path:
    """Write ``nb`` as ``submitted/<student>/<assignment>/<name>`` (nbgrader's submitted layout)."""
    path = Path(submitted) / student / assignment / name
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path
