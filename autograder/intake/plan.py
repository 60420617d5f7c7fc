"""What to run for one submission: the released notebook is the skeleton, the student's file only
supplies answers.

* instructor cells (locked, not graded): the released source, whatever the student's copy says;
* answer cells (nbgrader ``solution: true``): the student's code cell with the same grade id,
  else the same cell id; the first one if there are several; missing -> nothing runs there;
* test cells (``grade: true``): never the student's copy. The release says which tests exist and
  what each is worth; the harness probes the check of that grade id at that point;
* cells the student added (matching no released cell) come after the matched cell before them, and
  only their graded slice runs (:mod:`autograder.intake.slicing`): the statements that graded code needs;
* markdown and raw cells are ignored; outputs in the student's file are never read.

The student's file is read as plain JSON, defensively (:func:`read_student_notebook`): nbformat
v3 (worksheets) and v4, sources as strings or lists, any junk in metadata.

Planning (the plan, its graded slice and the review of it) is bounded (:func:`bounded_plan`):
:data:`PLAN_BUDGET_S` seconds, and code nested too deep to read gives the student a message, never
a grader error.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from autograder.intake.slicing import Cell, GradedSlice, PlanningTimeout, slice_cells
from course import cells as cells_

MAX_NOTEBOOK_BYTES = 100 << 20  # bigger files are refused (huge outputs are fine below this)
MAX_CODE_CHARS = 2_000_000  # all code cells together
MAX_CELLS = 20_000
#: seconds of processor time (the planning thread's own clock, which the machine's load does not
#: advance) the grader spends working out what of one submission runs (its plan, graded slice and
#: review) before it gives up on that submission; a few seconds at most for any honest notebook
PLAN_BUDGET_S = 60.0
#: the wall-clock backstop, in budgets: a planning thread starved this long is given up on too
PLAN_WALL_FACTOR = 6


class BadNotebook(ValueError):
    """The student's file cannot be read as a notebook; the message is for the student."""


@dataclass
class Test:
    grade_id: str
    points: float
    index: int  # position among the release's graded cells


@dataclass
class Plan:
    steps: list[dict]  # for the harness: cells and tests, in order
    tests: list[Test]
    notes: list[str] = field(default_factory=list)  # things the feedback should say (missing answers...)
    slice: GradedSlice | None = None  # which of the student's code runs, and which is graded code


def read_student_notebook(path: Path, notes: list | None = None) -> list[dict]:
    """The student's code cells as ``{"source", "grade_id", "id"}``; raises :class:`BadNotebook`.

    Oddities that do not stop grading (old format, another kernel) are appended to ``notes``.
    """
    notes = [] if notes is None else notes
    path = Path(path)
    size = path.stat().st_size
    if size == 0:
        raise BadNotebook("the notebook file is empty (0 bytes)")
    if size > MAX_NOTEBOOK_BYTES:
        raise BadNotebook(f"the notebook file is {size >> 20} MB, more than the {MAX_NOTEBOOK_BYTES >> 20} MB "
                          "allowed (clear the outputs and submit again)")
    raw = path.read_bytes()
    try:
        nb = json.loads(raw.decode("utf-8-sig"))
    except RecursionError:
        raise BadNotebook("the notebook file's JSON nests too deep to be read (brackets hundreds of levels "
                          "inside each other): it is not a notebook as Jupyter writes it") from None
    except UnicodeDecodeError:
        raise BadNotebook("the notebook file is not text (UTF-8): it is not a Jupyter notebook") from None
    except json.JSONDecodeError as e:
        cut = e.pos >= len(raw.rstrip()) - 2 or not raw.rstrip().endswith(b"}")
        hint = " (the file looks cut off: was the upload complete?)" if cut else ""
        raise BadNotebook(f"the notebook file is not valid JSON: {e.msg} at line {e.lineno}, "
                          f"column {e.colno}{hint}") from None
    if not isinstance(nb, dict):
        raise BadNotebook("the notebook file is JSON but not a notebook (no top-level object)")
    if isinstance(nb.get("cells"), list):
        cells = nb["cells"]
    elif isinstance(nb.get("worksheets"), list):  # nbformat 3
        notes.append(f"the notebook is in the old format v{nb.get('nbformat', 3)}; it was read and graded anyway")
        cells = [c for ws in nb["worksheets"] if isinstance(ws, dict) and isinstance(ws.get("cells"), list)
                 for c in ws["cells"]]
    else:
        raise BadNotebook("the file is JSON but has no cells: it is not a Jupyter notebook")
    meta = nb.get("metadata") if isinstance(nb.get("metadata"), dict) else {}
    ks = meta.get("kernelspec") if isinstance(meta.get("kernelspec"), dict) else {}
    lang = str(ks.get("language") or (meta.get("language_info") or {}).get("name", "python")
               if isinstance(meta.get("language_info", {}), dict) else "python")
    if ks and (ks.get("name") not in (None, "python3", "python") or lang.lower() != "python"):
        notes.append(f"the notebook names the kernel {str(ks.get('name'))[:40]!r} ({lang[:20]}); "
                     "it was graded with Python 3 like every submission")
    if len(cells) > MAX_CELLS:
        raise BadNotebook(f"the notebook has {len(cells)} cells, more than the {MAX_CELLS} allowed")
    out, total = [], 0
    for c in cells:
        if not isinstance(c, dict) or c.get("cell_type") != "code":
            continue
        src = cells_.source(c)
        total += len(src)
        if total > MAX_CODE_CHARS:
            raise BadNotebook(f"the notebook's code is longer than {MAX_CODE_CHARS} characters")
        cid = c.get("id")
        out.append({"source": src, "grade_id": cells_.grade_id(c), "id": cid if isinstance(cid, str) else None})
    return out


def release_cells(path: Path) -> list[dict]:
    """The released notebook's cells (trusted): role, grade id, cell id, source, points."""
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    return [{"role": cells_.role(c), "grade_id": cells_.grade_id(c), "id": c.get("id"),
             "source": c.source, "points": cells_.points(c)} for c in nb.cells]


def make_plan(release: list[dict], student: list[dict], deadline: float | None = None) -> Plan:
    """The plan for ``student``'s cells on ``release``; ``deadline`` (``time.monotonic()``): past
    it, slicing raises :class:`autograder.intake.slicing.PlanningTimeout`."""
    by_gid, by_id = {}, {}
    for j, c in enumerate(release):
        if c["role"] == "markdown":
            continue
        if c["grade_id"]:
            by_gid.setdefault(c["grade_id"], j)
        if c["id"]:
            by_id.setdefault(c["id"], j)

    answers: dict[int, str] = {}  # release index -> student's source
    added: dict[int, list[str]] = {}  # release index of the matched cell before -> added cells
    anchor = -1
    notes = []
    dupes = set()
    for s in student:
        j = by_gid.get(s["grade_id"]) if s["grade_id"] else None
        if j is None and s["id"]:
            j = by_id.get(s["id"])
        if j is None:
            added.setdefault(anchor, []).append(s["source"])
            continue
        anchor = j
        if release[j]["role"] == "answer":
            if j in answers:
                dupes.add(release[j]["grade_id"] or release[j]["id"])
            else:
                answers[j] = s["source"]
    for d in sorted(dupes):
        notes.append(f"the answer cell {d} appears more than once; the first copy was graded")

    steps, tests, cells = [], [], []  # cells: what the student's code runs beside, in order (the slice's input)
    first_answer = next((j for j, c in enumerate(release) if c["role"] == "answer"), len(release))

    def add_cell(kind, label, source, step_label):
        steps.append({"kind": "cell", "label": step_label, "source": source, "cell": len(cells)})
        cells.append(Cell(kind, label, source))

    def add_extra(j):
        for src in added.get(j, []):
            add_cell("added", f"cell you added {sum(c.kind == 'added' for c in cells) + 1}", src, "a cell you added")

    n_test = 0
    for j, c in enumerate(release):
        if j == first_answer:
            add_extra(-1)  # added before any matched cell: after the setup, before the first answer
        if c["role"] == "instructor":
            add_cell("locked", c["grade_id"] or "setup", c["source"], c["grade_id"] or "setup")
        elif c["role"] == "answer":
            if j in answers:
                gid = c["grade_id"] or "answer"
                add_cell("answer", f"answer cell {gid}", answers[j], gid)
            else:
                notes.append(f"your notebook has no answer cell {c['grade_id'] or c['id']} "
                             "(deleted, or its metadata changed); nothing ran in its place")
        elif c["role"] == "test":
            t = Test(c["grade_id"], c["points"], n_test)
            n_test += 1
            tests.append(t)
            steps.append({"kind": "test", "grade_id": t.grade_id, "index": t.index})
        if c["role"] != "markdown":
            add_extra(j)
    if first_answer == len(release):
        add_extra(-1)
    # Only the graded slice runs: an added cell runs the statements graded code needs, or nothing.
    sl = slice_cells(cells, deadline=deadline)
    notes.extend(sl.notes)
    for st in steps:
        if st["kind"] == "cell":
            st["source"] = sl.runs[st.pop("cell")]
    steps = [st for st in steps if st["kind"] != "cell" or st["source"].strip()]
    return Plan(steps=steps, tests=tests, notes=notes, slice=sl)


def bounded_plan(release: list[dict], student: list[dict], budget: float | None = None) -> tuple[Plan, list[str]]:
    """(the plan, the review of its slice: :func:`autograder.intake.scan.review`), worked out within
    ``budget`` seconds (:data:`PLAN_BUDGET_S`) in a thread of its own; raises :class:`BadNotebook`,
    with a message for the student, when it takes longer or the code nests too deep to read. Past
    the budget the thread is left to stop at slicing's next look at the deadline."""
    from autograder.intake import scan

    budget = PLAN_BUDGET_S if budget is None else budget
    box: dict = {}
    from autograder.intake.slicing import contract_names
    contract_names()  # its first call imports torch: not the submission's time

    def work():
        try:
            deadline = time.thread_time() + budget  # this thread's processor time (slicing.in_time)
            plan = make_plan(release, student, deadline=deadline)
            box["done"] = (plan, scan.review(plan.slice, deadline=deadline))
        except BaseException as e:  # noqa: BLE001 -- handed to the caller's thread
            box["error"] = e

    worker = threading.Thread(target=work, name="plan", daemon=True)
    worker.start()
    worker.join(PLAN_WALL_FACTOR * budget + 0.5)  # a backstop only: the budget is processor time
    err = box.get("error")
    if "done" in box:
        return box["done"]
    if err is None or isinstance(err, PlanningTimeout):
        lines = sum(len(c["source"].splitlines()) for c in student)
        raise BadNotebook(f"the grader could not work out which of your code to run within the {budget:g} s of "
                          f"processor time it allows a notebook ({lines} lines of code in {len(student)} code cells), so none of "
                          "it ran and every test scored 0; remove the scratch code your answers do not need "
                          "(long generated cells) and submit again")
    if isinstance(err, RecursionError):
        raise BadNotebook("the grader could not read your code: it nests too deep (an expression or statement "
                          "hundreds of levels inside another), so none of it ran and every test scored 0; "
                          "split it into shorter steps and submit again")
    raise err
