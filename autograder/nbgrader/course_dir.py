"""Grading a course's own ``submitted/`` folder: leave behind what ``nbgrader autograde`` would.

When the grader grades ``<course>/submitted`` (``<course>`` holds an ``nbgrader_config.py``, or
``--course DIR`` names it), nbgrader's formgrader, ``nbgrader generate_feedback`` and
``nbgrader export`` must see the result, so for each student and assignment handed in there:

* the course's gradebook (``CourseDirectory.db_url``, by default ``<course>/gradebook.db``) gets
  the submission, as nbgrader's ``Autograde`` and ``SaveAutoGrades`` write it: the student (names
  an instructor entered stay), the submission with the timestamp of ``submitted/.../timestamp.txt``
  (the formgrader calls a submission autograded only when the two agree), each grade cell's
  ``auto_score`` from the course grader (``needs_manual_grade`` only where a grader already gave a
  manual score, which is kept), "No response." on an answer cell left as released, and the late
  penalty of the configured ``AssignLatePenalties.plugin_class``. The submission is updated, never
  removed: manual scores and comments survive a regrade. An assignment the gradebook does not know
  is first created by ``nbgrader generate_assignment`` (:func:`autograder.nbgrader.gradebook.populate_url`);
* ``autograded/<student>/<assignment>/<notebook>.ipynb`` gets the notebook the grader ran (below),
  with nbgrader's file permissions (444, or 664 with ``CourseDirectory.groupshared``), next to
  copies of the submission's other files (``timestamp.txt``, the exchange's
  ``submission_secret.txt``, which ``nbgrader release_feedback`` needs).

The autograded notebook is what was graded, in the order it ran (:mod:`autograder.intake.plan`): the
release is the skeleton, each answer cell holds the student's code (matched by grade id, else cell
id, first copy), the code cells the student added follow the cell they followed, and every test
cell is the *released* test cell (``### BEGIN HIDDEN TESTS`` regions are not in it) with one output:
``passed <grade id>: <what it checks>``, or an error output with the grader's message (nbgrader's
``determine_grade`` reads the same score from it). An error the student's code raised is shown
under the cell that raised it. A first markdown cell summarises the grader's verdict.

Two deliberate differences from ``nbgrader autograde``:

* nbgrader puts the *source* version of each locked cell back, hidden tests included, and
  ``nbgrader generate_feedback`` renders autograded notebooks as they are, so stock feedback shows
  hidden tests to students (jupyter/nbgrader#917, #1363). Here test cells are the release's, so
  feedback never holds hidden test code;
* markdown comes from the release, and the student's own markdown and raw cells are left out: the
  grader never reads them, and nbconvert renders the HTML inside markdown as it is in the
  formgrader's page, which runs with the instructor's Jupyter session.
"""
from __future__ import annotations

import copy
import json
import os
import re
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from autograder.intake import plan as planmod

CONFIG = "nbgrader_config.py"
DEFAULT_STRUCTURE = "{nbgrader_step}/{student_id}/{assignment_id}"
CELL_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class CourseError(Exception):
    """The course directory cannot be used (exit code 2)."""


@dataclass
class NbCourse:
    """An nbgrader course directory, as nbgrader's configuration describes it."""

    root: Path
    course_id: str
    db_url: str
    submitted: Path  # the folder of <student>/<assignment>/ submissions
    autograded: Path
    groupshared: bool
    ignore: list  # CourseDirectory.ignore: names nbgrader never copies
    config: object  # the traitlets Config loaded from the course's nbgrader_config.py

    def submission_dir(self, student: str, assignment: str) -> Path:
        return self.submitted / student / assignment

    def autograded_dir(self, student: str, assignment: str) -> Path:
        return self.autograded / student / assignment


def load(course: Path) -> NbCourse:
    """Read ``<course>/nbgrader_config.py`` the way nbgrader's apps read it (run as Python)."""
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config.loader import ConfigFileNotFound, PyFileConfigLoader

    course = Path(course).resolve()
    if not (course / CONFIG).is_file():
        raise CourseError(f"{course} is not an nbgrader course directory (no {CONFIG} in it)")
    try:
        cfg = PyFileConfigLoader(CONFIG, path=str(course)).load_config()
    except ConfigFileNotFound:
        raise CourseError(f"{course / CONFIG} cannot be read") from None
    except Exception as e:  # noqa: BLE001 -- the instructor's Python file raised
        raise CourseError(f"{course / CONFIG} failed: {type(e).__name__}: {e}") from None
    cd = CourseDirectory(config=cfg)
    if "root" not in cfg.CourseDirectory:
        cd.root = str(course)  # nbgrader's default is the working directory: the course's, here
    if cd.directory_structure != DEFAULT_STRUCTURE:
        raise CourseError(f"{course / CONFIG} sets CourseDirectory.directory_structure to "
                          f"{cd.directory_structure!r}; the grader knows only nbgrader's default "
                          f"{DEFAULT_STRUCTURE!r}")
    root = Path(cd.root)
    return NbCourse(root=root, course_id=cd.course_id, db_url=cd.db_url,
                    submitted=root / cd.submitted_directory, autograded=root / cd.autograded_directory,
                    groupshared=bool(cd.groupshared), ignore=list(cd.ignore), config=cfg)


def detect(submissions: Path) -> NbCourse | None:
    """The course whose ``submitted/`` folder ``submissions`` is, or None (any other input)."""
    p = Path(submissions)
    if not p.is_dir() or not (p.resolve().parent / CONFIG).is_file():
        return None
    try:
        course = load(p.resolve().parent)
    except CourseError:
        return None
    return course if course.submitted.resolve() == p.resolve() else None


# ------------------------------------------------------------------------------------------------
# The autograded notebook
# ------------------------------------------------------------------------------------------------

def _fence(text: str) -> str:
    """``text`` as a fenced block: shown literally (no HTML, no markdown), whatever it holds."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


def _error_output(name: str, text: str) -> dict:
    """An error output; its traceback (what nbconvert shows, in a <pre>) wrapped at 100 columns."""
    import textwrap

    import nbformat
    lines = [w for line in f"{name}: {text}".splitlines()
             for w in (textwrap.wrap(line, 100, break_long_words=False, break_on_hyphens=False) or [""])]
    return nbformat.v4.new_output("error", ename=name, evalue=text, traceback=lines)


def _stream(text: str) -> dict:
    import nbformat
    return nbformat.v4.new_output("stream", name="stdout", text=text)


def _split_error(err: str) -> tuple[str, str]:
    head, sep, rest = err.partition(":")
    if sep and re.fullmatch(r"[A-Za-z_][\w.]{0,79}", head.strip()):
        return head.strip().rsplit(".", 1)[-1], rest.strip()
    return "Error", err


def _test_output(t, missing: bool) -> list[dict]:
    """The output nbgrader's determine_grade scores as the grader did: an error output = 0."""
    lines = []
    if missing:
        lines.append("(this test cell was missing from the submission; the grader ran the release's)")
    d = getattr(t, "detail", None) or {}
    facts = [f"{k}: {v}" for k, v in d.items() if k != "report"]
    if t.passed:
        text = f"passed {t.grade_id}: {t.doc}\n"
        if t.message:
            text += t.message + "\n"
        text += "".join(f"  {f}\n" for f in facts)
        if d.get("report"):
            text += str(d["report"]).rstrip() + "\n"
        return [_stream("".join(f"{x}\n" for x in lines) + text)]
    out = [_stream("".join(f"{x}\n" for x in lines))] if lines else []
    msg = t.message or "failed"
    if facts:
        msg += "\n" + "\n".join(facts)
    return out + [_error_output("CheckFailed", f"{t.grade_id} ({t.doc}): {msg}")]


def _student_cells(path: Path | None, outcome) -> list[dict] | None:
    """The student's code cells as the grader read them, or None when it could not."""
    if path is None or outcome.status == "unreadable":
        return None
    try:
        return planmod.read_student_notebook(path)
    except (planmod.BadNotebook, OSError):
        return None


def build_notebook(release_path: Path, student_path: Path | None, outcome, gb_info: dict | None = None):
    """The autograded notebook (an ``nbformat`` node) for one graded outcome.

    ``gb_info``: what the course gradebook says of the notebook (``grade``: grade id -> points,
    ``cells``: every cell name it knows, ``kernelspec``); cells it does not know lose their
    nbgrader metadata, as nbgrader's OverwriteCells does, so generate_feedback finds each cell.
    """
    import nbformat

    release = nbformat.read(str(release_path), as_version=4)
    roles = planmod.release_cells(release_path)
    student = _student_cells(student_path, outcome)
    by_gid, by_id = {}, {}
    for j, c in enumerate(roles):
        if c["role"] == "markdown":
            continue
        if c["grade_id"]:
            by_gid.setdefault(c["grade_id"], j)
        if c["id"]:
            by_id.setdefault(c["id"], j)
    # The same matching as autograder.intake.plan.make_plan: answers by grade id, else cell id, first copy;
    # unmatched code cells run after the matched cell before them; test cells are never the student's.
    answers: dict[int, str] = {}
    added: dict[int, list[str]] = {}
    present: set[int] = set()
    anchor = -1
    for s in student or []:
        j = by_gid.get(s["grade_id"]) if s["grade_id"] else None
        if j is None and s["id"]:
            j = by_id.get(s["id"])
        if j is None:
            added.setdefault(anchor, []).append(s["source"])
            continue
        anchor = j
        present.add(j)
        if roles[j]["role"] == "answer" and j not in answers:
            answers[j] = s["source"]

    results = {t.grade_id: t for t in outcome.tests}
    cells: list = []
    labels: list = []  # the grader's label of each code cell that ran (autograder.intake.plan's), or None
    used_ids: set = set()

    def keep_id(cell, want=None):
        cid = want if isinstance(want, str) and CELL_ID.match(want) and want not in used_ids else None
        if cid is None:
            cid = nbformat.v4.new_code_cell().id
        cell.id = cid
        used_ids.add(cid)
        return cell

    first_answer = next((j for j, c in enumerate(roles) if c["role"] == "answer"), len(roles))

    def add_extra(j):
        for src in added.get(j, []):
            cells.append(keep_id(nbformat.v4.new_code_cell(src)))
            labels.append("a cell you added")

    for j, (cell, role) in enumerate(zip(release.cells, roles)):
        if j == first_answer:
            add_extra(-1)
        c = copy.deepcopy(cell)
        if c.cell_type == "code":
            c.outputs, c.execution_count = [], None
        gid = role["grade_id"]
        if role["role"] == "markdown":
            cells.append(keep_id(c, cell.get("id")))
            labels.append(None)
            continue
        if role["role"] == "instructor":
            labels.append(gid or "setup")
        elif role["role"] == "answer":
            if j in answers:
                c.source = answers[j]
                labels.append(gid or "answer")
            else:  # the released stub, as nbgrader would add it back: "No response."
                c.outputs = [_stream("(no submitted notebook could be read: nothing ran here)\n" if student is None
                                     else "(this answer cell was missing from the submission, deleted or its "
                                     "metadata changed: nothing ran here)\n")]
                labels.append(None)
        elif role["role"] == "test":
            t = results.get(gid)
            if t is not None:
                c.outputs = _test_output(t, missing=student is not None and j not in present)
            labels.append(None)
        cells.append(keep_id(c, cell.get("id")))
        add_extra(j)
    if first_answer == len(roles):
        add_extra(-1)

    # The errors the student's code raised, under the cell that raised them (when it can be told).
    unplaced = []
    counts: dict = {}
    for lab in labels:
        if lab is not None:
            counts[lab[:80]] = counts.get(lab[:80], 0) + 1
    from autograder.referee.protocol import bound_cell_errors
    for err in bound_cell_errors(outcome.cell_errors):
        lab = err.get("label", "")
        if counts.get(lab) == 1:
            i = next(i for i, x in enumerate(labels) if x is not None and x[:80] == lab)
            cells[i].outputs.append(_error_output(*_split_error(str(err.get("error", "")))))
        else:
            unplaced.append(f"{lab}: {err.get('error', '')}")

    # nbgrader's view of each cell: what the gradebook knows, with its points.
    if gb_info is not None:
        for c in cells:
            m = c.get("metadata", {}).get("nbgrader")
            if not m:
                continue
            if m.get("grade_id") not in gb_info["cells"]:
                del c.metadata["nbgrader"]
            elif m.get("grade") and m["grade_id"] in gb_info["grade"]:
                m["points"] = gb_info["grade"][m["grade_id"]]

    from autograder.report.feedback import STATUS_TEXT
    # No total here: nbgrader's own header (the feedback page's "Score") adds the manual grades and
    # any late penalty, and a total written into this cell would go stale after grading by hand.
    summary = [f"status: {STATUS_TEXT.get(outcome.status, outcome.status)}",
               "autograded tests (the total, with any manual grades and late penalty, is nbgrader's score):",
               "  (the grader's points when it ran; where an instructor changed a test's points by hand, the",
               "  score nbgrader shows beside that test is the one that counts)"]
    summary += [f"  {t.points:g} / {t.max_points:g}  {t.grade_id}" for t in outcome.tests]
    if outcome.message:
        summary.append(outcome.message)
    if unplaced:
        summary.append("errors while the notebook ran:")
        summary.extend(f"  {u}" for u in unplaced)
    head = nbformat.v4.new_markdown_cell(
        "**Autograded by the course grader** (`python -m autograder`): each test cell below shows "
        "the grader's verdict.\n\n" + _fence("\n".join(summary)))
    cells.insert(0, keep_id(head, "autograder-summary"))

    nb = nbformat.v4.new_notebook(cells=cells, metadata=copy.deepcopy(release.metadata))
    nb.nbformat_minor = max(5, release.get("nbformat_minor", 5))
    if gb_info is not None and gb_info.get("kernelspec"):
        nb.metadata["kernelspec"] = gb_info["kernelspec"]
    nbformat.validate(nb)
    return nb


# ------------------------------------------------------------------------------------------------
# Writing into the course
# ------------------------------------------------------------------------------------------------

def review_comment(o) -> str | None:
    """The grader's review flags as a gradebook comment (the formgrader shows it on the first answer
    cell), or None when nothing was flagged."""
    reasons = list(getattr(o, "review", None) or [])
    if not reasons:
        return None
    return ("Flagged by the course grader for a person to review (no point was taken for it): "
            + "; ".join(reasons))


def _sqlite_missing(url: str) -> bool:
    """A sqlite gradebook URL whose file does not exist yet (reading it would create it)."""
    return url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).exists()


def annotate(outcomes, course: NbCourse, regraded=None) -> None:
    """What the course's gradebook knows that the grader's own files should show, read before
    anything is written there:

    * ``student_name``, where the row has none: the gradebook's (``nbgrader db student import``);
    * ``manual_kept`` of the rows this run regraded (``regraded``: their (student, assignment); all
      when None): each test cell whose manual score (entered in the formgrader) the gradebook keeps
      over the automatic score of this run (:func:`write` never overwrites it), as
      ``{"cell", "manual", "auto", "id"}`` (``id``: the gradebook's grade row).
    """
    from course.release import venv_env

    if _sqlite_missing(course.db_url):
        return
    os.environ["PATH"] = venv_env()["PATH"]  # nbgrader's Gradebook shells out to alembic
    try:
        _annotate(outcomes, course, regraded)
    except Exception as e:  # noqa: BLE001 -- the grades are still written; write() reports the gradebook
        import sys
        print(f"warning: could not read names and manual grades from {course.db_url}: {type(e).__name__}: {e}",
              file=sys.stderr)


def _annotate(outcomes, course: NbCourse, regraded) -> None:
    import warnings as pywarnings

    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(course.db_url, course.course_id) as gb, pywarnings.catch_warnings():
        pywarnings.simplefilter("ignore")
        names = {st.id: " ".join(n for n in (st.first_name, st.last_name) if n) for st in gb.students}
        for o in outcomes:
            if not o.student_name and names.get(o.student_id):
                o.student_name = names[o.student_id]
            if regraded is not None and (o.student_id, o.assignment) not in regraded:
                continue
            if not o.notebook or not course.submission_dir(o.student_id, o.assignment).is_dir():
                continue
            auto = {t.grade_id: float(t.points) for t in o.tests}
            try:
                snb = gb.find_submission_notebook(Path(o.notebook).stem, o.assignment, o.student_id)
            except MissingEntry:
                continue
            o.manual_kept = [{"cell": g.name, "manual": float(g.manual_score), "auto": auto[g.name], "id": g.id}
                             for g in snb.grades if g.manual_score is not None and g.name in auto]


def _timestamp(folder: Path, warn: list):
    """The submission's timestamp (naive UTC, as nbgrader stores it), or None."""
    from nbgrader.utils import parse_utc

    f = folder / "timestamp.txt"
    if not f.is_file() or f.is_symlink():
        return None
    try:
        text = f.read_text(encoding="utf-8", errors="replace").strip()[:200]
        return parse_utc(text) if text else None
    except (ValueError, OverflowError, OSError) as e:
        warn.append(f"{f}: not a timestamp ({e}); recorded without one")
        return None


def _copy_files(src: Path, dest: Path, perm: int, ignore: list[str]) -> None:
    """The submission's other files (``timestamp.txt``, the exchange's ``submission_secret.txt``
    that ``nbgrader release_feedback`` needs, anything else handed in), as nbgrader's converters
    copy them: every file but notebooks and the ignored names; links are not followed."""
    import fnmatch

    for dirpath, dirnames, filenames in os.walk(src):
        dirnames[:] = [d for d in dirnames if not any(fnmatch.fnmatch(d, pat) for pat in ignore)
                       and not (Path(dirpath) / d).is_symlink()]
        for name in filenames:
            f = Path(dirpath) / name
            if name.endswith(".ipynb") or any(fnmatch.fnmatch(name, pat) for pat in ignore):
                continue
            if f.is_symlink() or not f.is_file():
                continue
            target = dest / f.relative_to(src)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(f, target)
            target.chmod(perm)


def _gb_notebook(gb, assignment: str, notebook: str):
    from nbgrader.api import MissingEntry
    try:
        return gb.find_notebook(notebook, assignment)
    except MissingEntry:
        return None


def _replace_dir(dest: Path, inside: Path) -> None:
    """Empty ``dest`` (a folder under ``inside``) for a fresh autograded copy; refuses links."""
    inside = inside.resolve()
    for p in [dest, *dest.parents]:
        if p == inside.parent or p.resolve() == inside:
            break
        if p.is_symlink():
            raise CourseError(f"{p} is a symbolic link; not writing through it")
    if dest.exists():
        for sub in dest.rglob("*"):  # nbgrader leaves its files read-only (444)
            if not sub.is_symlink():
                sub.chmod(sub.stat().st_mode | stat.S_IWUSR | (stat.S_IXUSR if sub.is_dir() else 0))
        shutil.rmtree(dest)
    dest.mkdir(parents=True)


def write(outcomes, course: NbCourse, root: Path, submissions: Path | None = None) -> list[str]:
    """Record this run's outcomes in the course: gradebook and ``autograded/`` notebooks.

    ``root``: the grader's course tree (its ``exercises/`` is the release that was graded).
    Only outcomes with a folder ``submitted/<student>/<assignment>/`` are written (what nbgrader
    calls a submission). Returns what the instructor should know (warnings).
    """
    import nbformat
    import warnings as pywarnings
    from nbgrader.api import Gradebook, MissingEntry
    from nbgrader.preprocessors import AssignLatePenalties
    from nbgrader.utils import compute_checksum

    from autograder.nbgrader.gradebook import populate_url
    from autograder.intake.ingest import Catalog, discover
    from autograder.report.results import NOT_SUBMITTED
    from course.release import venv_env

    os.environ["PATH"] = venv_env()["PATH"]  # nbgrader's Gradebook shells out to alembic
    warn: list[str] = []
    root = Path(root)
    catalog = Catalog(root / "exercises")
    todo, elsewhere = [], []
    for o in outcomes:
        if not o.notebook or o.assignment not in catalog.notebooks:
            continue
        if course.submission_dir(o.student_id, o.assignment).is_dir():
            todo.append(o)
        elif not (o.status == "missing" and o.message == NOT_SUBMITTED):
            elsewhere.append(f"{o.student_id}/{o.assignment}")
    if elsewhere:
        warn.append(f"graded, but not in a folder {course.submitted.name}/<student>/<assignment>/ of the course, so "
                    f"not recorded in its gradebook: {', '.join(elsewhere[:20])}"
                    + (f" and {len(elsewhere) - 20} more" if len(elsewhere) > 20 else ""))
    if not todo:
        return warn
    with tempfile.TemporaryDirectory() as tmp:  # the files the grader graded, found the same way
        files = {(e.student_id, e.assignment): e.path
                 for e in discover(submissions or course.submitted, catalog, Path(tmp))}

    names = {o.assignment: Path(o.notebook).stem for o in todo}
    with Gradebook(course.db_url, course.course_id) as gb:
        stale = sorted(a for a, nb in names.items() if _gb_notebook(gb, a, nb) is None)
    if stale:
        populate_url(course.db_url, stale, root, course_id=course.course_id)

    late = AssignLatePenalties(config=course.config)
    late.init_plugin()
    info: dict = {}
    perm = 0o664 if course.groupshared else 0o444
    with Gradebook(course.db_url, course.course_id) as gb, pywarnings.catch_warnings():
        pywarnings.simplefilter("ignore")  # SQLAlchemy's autoflush notes from inside nbgrader's API
        for a, stem in names.items():
            nbm = gb.find_notebook(stem, a)
            grade = {g.name: float(g.max_score) for g in nbm.grade_cells}
            ours = {t.grade_id: t.max_points for o in todo if o.assignment == a for t in o.tests}
            off = sorted(g for g in ours if grade.get(g) != float(ours[g]))
            if off:
                warn.append(f"the gradebook's {a}/{stem} does not match the release for {', '.join(off)} "
                            f"(run `nbgrader generate_assignment {a}`); those scores may be missing there")
            ks = json.loads(nbm.kernelspec) if nbm.kernelspec else None
            info[a] = {"grade": grade, "kernelspec": ks,
                       "solution": {c.name for c in nbm.solution_cells},
                       "cells": {c.name for c in nbm.source_cells} | set(grade)
                       | {c.name for c in nbm.solution_cells}}

        for o in todo:
            a, stem = o.assignment, names[o.assignment]
            folder = course.submission_dir(o.student_id, a)
            ts = _timestamp(folder, warn)
            release_path = root / "exercises" / a / o.notebook
            path = files.get((o.student_id, a))
            nb = build_notebook(release_path, path, o, info[a])

            first, _, last = (o.student_name or "").partition(" ")
            names_known = {"first_name": first, "last_name": last or None} if first else {}
            try:  # names the gradebook has (a roster import, the formgrader) stay as they are
                known = gb.find_student(o.student_id)
                if known.first_name or known.last_name:
                    names_known = {}
            except MissingEntry:
                pass
            gb.update_or_create_student(o.student_id, **names_known)
            sub = gb.update_or_create_submission(a, o.student_id)
            sub.timestamp = ts
            scores = {t.grade_id: float(t.points) for t in o.tests}
            answers = {c.metadata.nbgrader["grade_id"]: c for c in nb.cells
                       if c.metadata.get("nbgrader", {}).get("solution")}
            order = {name: i for i, name in enumerate(answers)}
            for snb in sub.notebooks:
                handed_in = snb.name == stem and path is not None and o.status != "missing"
                for g in snb.grades:
                    if g.name in scores and snb.name == stem:
                        g.auto_score = scores[g.name]
                    elif g.name in info[a]["solution"] and g.name in answers and handed_in:
                        c = answers[g.name]  # a manually graded answer: 0 only when left as released
                        g.auto_score = 0.0 if compute_checksum(c) == c.metadata.nbgrader.get("checksum") else None
                    else:
                        g.auto_score = 0.0 if not handed_in else None
                    g.needs_manual_grade = g.manual_score is not None or g.auto_score is None
                flagged = review_comment(o) if snb.name == stem else None
                if flagged:  # the formgrader's flag icon; never cleared here (a person may have set it)
                    snb.flagged = True
                for cm in sorted(snb.comments, key=lambda cm: order.get(cm.name, len(order))):
                    c = answers.get(cm.name) if snb.name == stem else None
                    unchanged = (c is None or compute_checksum(c) == c.metadata.nbgrader.get("checksum"))
                    cm.auto_comment = "No response." if unchanged else None
                    if flagged and c is not None:  # the flag, on the first answer cell the formgrader shows
                        cm.auto_comment = flagged if cm.auto_comment is None else f"{cm.auto_comment} {flagged}"
                        flagged = None
                snb.late_submission_penalty = None
            gb.db.commit()
            if sub.total_seconds_late > 0:
                for snb in sub.notebooks:
                    p = late.plugin_inst.late_submission_penalty(o.student_id, snb.score, sub.total_seconds_late)
                    if p is not None:
                        snb.late_submission_penalty = min(max(0.0, float(p)), snb.score)
                gb.db.commit()

            dest = course.autograded_dir(o.student_id, a)
            _replace_dir(dest, course.autograded)
            target = dest / f"{stem}.ipynb"
            nbformat.write(nb, str(target))
            target.chmod(perm)
            _copy_files(folder, dest, perm, course.ignore)
    return warn
