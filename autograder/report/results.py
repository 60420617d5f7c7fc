"""The grader's result files, and what a run keeps of earlier runs into the same output folder.

* ``grades.csv``: one row per student and assignment. A text cell that a spreadsheet would read
  as a formula (it starts with ``=``, ``+``, ``-``, ``@``, a tab or a carriage return, or their
  full-width forms) gets a leading ``'``, as OWASP advises against CSV injection: student names
  and file names come from students. The grader's numbers (scores, test counts) stay numbers.
* ``results.json``: every outcome in full (``asdict`` of :class:`autograder.grade.Outcome`). It is
  the store of earlier runs: grading into a folder that has one merges with it (:func:`merge`),
  when this run regrades the same class (:func:`other_class`); ``--fresh`` discards them
  (:func:`clear`).
* ``grades.csv`` is the course grader's: the autograded tests' points. After grading by hand in
  the formgrader, ``nbgrader export`` (the gradebook) has the final grades.
"""
from __future__ import annotations

import csv
import dataclasses
import json
import os
from dataclasses import asdict
from pathlib import Path

CSV_COLUMNS = ["student_id", "assignment", "score", "max_score", "status", "message", "student_name",
               "notebook", "tests_passed", "tests_total", "review", "late"]
FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\uff1d", "\uff0b", "\uff0d", "\uff20")
NOT_SUBMITTED = "not submitted"  # the message of the rows autograder.grade._fill_class adds


class EarlierResultsError(Exception):
    """The output folder holds earlier results that cannot be read (exit code 2)."""


def printable(value):
    """``value`` with every string in it (dict keys, list items, dataclass fields, at any depth)
    encodable as UTF-8: a lone surrogate becomes its escape (``\\udcff``). Text a submission
    controls (an exception's message, a file name given to ``compile``, a file name that is not
    UTF-8) reaches the rows as is, and one such character made every writer raise, so that one
    student stopped the whole class's CSV, feedback, report and gradebook (the fifteenth red team)."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {printable(k): printable(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(printable(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            setattr(value, f.name, printable(getattr(value, f.name)))
        return value
    return value


def text_cell(value) -> str:
    """A text cell safe to open in a spreadsheet: never read as a formula."""
    s = "" if value is None else str(value)
    return "'" + s if s.startswith(FORMULA_START) else s


def _write_atomic(path: Path, text: str) -> None:
    """Write ``path`` whole or not at all (a crash never leaves half a results file)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w", newline="", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def write_csv(outcomes, path: Path) -> None:
    import io

    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(CSV_COLUMNS)
    for o in outcomes:
        w.writerow([text_cell(o.student_id), text_cell(o.assignment), f"{o.score:g}", f"{o.max_score:g}",
                    text_cell(o.status), text_cell(o.message), text_cell(o.student_name), text_cell(o.handed_in or o.notebook),
                    sum(bool(t.passed) for t in o.tests), len(o.tests), text_cell("; ".join(review_column(o))),
                    "yes" if is_late(o) else ""])
    _write_atomic(path, buf.getvalue())


def kept_manual_text(o) -> list[str]:
    """Each manual score the course gradebook kept over this run's automatic one, as a sentence."""
    return [f"manual grade kept: {m['cell']} {m['manual']:g} in the gradebook (the grader now gives "
            f"{m['auto']:g}; nbgrader export and the feedback use the manual one)"
            for m in getattr(o, "manual_kept", None) or []]


def print_kept_manual(outcomes, db_url: str, file=None) -> None:
    """Tell the instructor, on stderr, each manual score the course gradebook keeps over a new
    automatic one, and how to let the automatic score count."""
    import sys

    kept = [(o, m) for o in outcomes for m in getattr(o, "manual_kept", None) or []]
    if not kept:
        return
    file = file or sys.stderr
    print(f"note: the course gradebook ({db_url}) keeps {len(kept)} manual grade{'s' if len(kept) != 1 else ''} "
          "entered in the formgrader; nbgrader export and the feedback use them, grades.csv has the automatic "
          "scores:", file=file)
    for o, m in kept:
        print(f"  {o.student_id} / {o.assignment} / {m['cell']}: manual {m['manual']:g}, automatic now "
              f"{m['auto']:g}", file=file)
    print("  to let the automatic score count, clear the manual score in the formgrader (Manual Grading: empty "
          "the cell's score box; edit its comment too), or in the gradebook: UPDATE grade SET manual_score = NULL "
          "WHERE id = '<id>' (the ids are in results.json, manual_kept); see report.html, Manual grades kept",
          file=file)


def review_column(o) -> list[str]:
    """The ``review`` column: the grader's flags, then the manual grades kept over its scores."""
    return list(o.review or []) + kept_manual_text(o)


def is_late(o) -> bool:
    """Was the submission handed in late (an LMS file marked so: ``autograder.grade.LATE_NOTE``)?"""
    from autograder.grade import LATE_NOTE

    return LATE_NOTE in (o.notes or [])


def write_json(outcomes, path: Path) -> None:
    _write_atomic(path, json.dumps([asdict(o) for o in outcomes], indent=1))


def _known(cls, d: dict) -> dict:
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in d.items() if k in names}


def read_json(path: Path) -> list:
    """The outcomes a run wrote to ``path`` (:func:`write_json`), as Outcome objects."""
    from autograder.report.outcome import Outcome, TestResult

    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise EarlierResultsError(f"{path} cannot be read ({e})") from None
    if not isinstance(data, list):
        raise EarlierResultsError(f"{path} is not a list of results")
    outcomes = []
    for i, d in enumerate(data):
        try:
            if not (isinstance(d, dict) and isinstance(d.get("student_id"), str)
                    and isinstance(d.get("assignment"), str) and isinstance(d.get("tests", []), list)):
                raise TypeError("no student_id, assignment or tests")
            o = Outcome(**_known(Outcome, d))
            o.tests = [TestResult(**_known(TestResult, t)) for t in o.tests]
            o.score, o.max_score = float(o.score), float(o.max_score)
        except (TypeError, ValueError) as e:
            raise EarlierResultsError(f"{path}: entry {i} is not a result ({e})") from None
        outcomes.append(o)
    return outcomes


def earlier(out: Path) -> list | None:
    """The rows earlier runs left in ``out`` (None: there are none). Refuses rather than losing them."""
    out = Path(out)
    store = out / "results.json"
    if store.exists():
        return read_json(store)
    if (out / "grades.csv").exists():
        raise EarlierResultsError(f"{out / 'grades.csv'} is there but {store.name}, which keeps the earlier "
                                  "runs' rows, is not")
    return None


#: what a run writes into --out (besides the gradebook): what ``--fresh`` removes
OUTPUTS = ("results.json", "grades.csv", "report.html", "feedback")


def other_class(before: list, students) -> str | None:
    """Why this run's students are not a regrade of the class graded into the folder before
    (None: they are, and the runs merge).

    The same class: the two runs have at least one student in common (a regrade, a later
    assignment, a late student graded alone, a download without some students). A run that shares
    no student with the earlier rows is another class: merging would add a "not submitted" row for
    every student of one class and every assignment of the other."""
    old = {o.student_id for o in before}
    new = set(students)
    if not old or not new or old & new:
        return None
    ex = lambda ids: ", ".join(sorted(ids)[:3]) + (", ..." if len(ids) > 3 else "")  # noqa: E731
    return (f"this run's {len(new)} students ({ex(new)}) share none with the {len(old)} students graded into "
            f"this folder before ({ex(old)}): another class")


def clear(out: Path, gradebook: Path | None = None) -> list[str]:
    """Remove what earlier runs wrote into ``out`` (and their ``gradebook`` file); return what went."""
    import shutil

    out = Path(out)
    gone = []
    for p in [out / n for n in OUTPUTS] + ([Path(gradebook)] if gradebook else []):
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()
        else:
            continue
        gone.append(p.name)
    return gone


def _not_submitted(o) -> bool:
    """A row the grader added because the student handed in nothing for that assignment."""
    return o.status == "missing" and o.message == NOT_SUBMITTED and not o.notes


def fill(outcomes) -> list:
    """A 'not submitted' row for every student and every assignment anyone handed in, as
    ``autograder.grade._fill_class`` does, with the tests of that assignment's other rows."""
    from autograder.report.outcome import Outcome, TestResult

    names: dict = {}
    for o in outcomes:
        if o.student_name or o.student_id not in names:
            names[o.student_id] = names.get(o.student_id) or o.student_name
    like: dict = {}  # assignment -> a row to copy the notebook and tests from
    for o in outcomes:
        if o.notebook and len(o.tests) >= len(getattr(like.get(o.assignment), "tests", [])):
            like[o.assignment] = o
    seen = {(o.student_id, o.assignment) for o in outcomes}
    added = []
    for s, name in names.items():
        for a, m in sorted(like.items()):
            if (s, a) not in seen:
                added.append(Outcome(s, a, name, notebook=m.notebook, max_score=m.max_score, status="missing",
                                     message=NOT_SUBMITTED,
                                     tests=[TestResult(t.grade_id, t.doc, 0.0, t.max_points, False, NOT_SUBMITTED)
                                            for t in m.tests]))
    return list(outcomes) + added


def merge(before: list, now: list) -> tuple[list, list, int]:
    """This run's rows over the earlier ones: (every row, the rows that are new or changed, how
    many earlier rows were kept).

    A row of this run replaces the earlier rows of the same student and assignment; a 'not
    submitted' row of this run never replaces an earlier one (that student was simply not in
    this download). Other students' and assignments' rows stay.
    """
    key = lambda o: (o.student_id, o.assignment)  # noqa: E731
    handed_in = {key(o) for o in now if not _not_submitted(o)}
    kept = [o for o in before if key(o) not in handed_in]
    kept_keys = {key(o) for o in kept}
    rows = kept + [o for o in now if key(o) not in kept_keys or not _not_submitted(o)]
    rows = sorted(fill(rows), key=key)
    old = {id(o) for o in kept}
    return rows, [o for o in rows if id(o) not in old], len(kept)
