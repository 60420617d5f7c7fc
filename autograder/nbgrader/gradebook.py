"""Write the grades into an nbgrader gradebook, so the formgrader and ``nbgrader export`` keep working.

The assignments, notebooks and grade cells are created the way nbgrader creates them: by its
``generate_assignment`` (in a scratch copy of the course, pointed at this database).
Each graded submission then replaces any earlier one of the same student and assignment, and
every grade cell gets its ``auto_score``.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from course.release import ROOT, scratch_course, venv_env


def populate(db: Path, assignments: list[str], root: Path = ROOT) -> None:
    """Run ``nbgrader generate_assignment`` for each assignment, all against the sqlite file ``db``."""
    populate_url(f"sqlite:///{Path(db).resolve()}", assignments, root)


def populate_url(url: str, assignments: list[str], root: Path = ROOT, course_id: str | None = None) -> None:
    """Run nbgrader's ``generate_assignment`` for each assignment against the database at ``url``
    (any URL nbgrader takes), in a scratch copy of the course (``course_id``: the id to record,
    default the one in ``nbgrader_config.py``). One nbgrader process does them all, one after
    another, through nbgrader's own API (what its formgrader calls): the same converter, config and
    database writes as ``nbgrader generate_assignment A --force --db=URL`` once per assignment,
    without paying nbgrader's import (about 2.3 s here) for each one."""
    if not assignments:
        return
    with tempfile.TemporaryDirectory() as tmp:
        course = scratch_course(Path(tmp), root)
        # One process, one assignment at a time: sqlite and nbgrader's schema migration do not like
        # concurrent first writers.
        proc = subprocess.run([sys.executable, "-m", "autograder.nbgrader.gradebook", url,
                               *(["--course-id", course_id] if course_id else []), *assignments],
                              cwd=course, capture_output=True, text=True, env=venv_env())
        if proc.returncode != 0:
            raise RuntimeError(f"nbgrader generate_assignment {' '.join(assignments)} failed:\n"
                               f"{proc.stdout}\n{proc.stderr}")


def _generate(url: str, assignments: list[str], course_id: str | None) -> int:
    """In a course directory (the working directory): nbgrader's ``generate_assignment`` for each
    assignment through :class:`nbgrader.apps.api.NbGraderAPI`, the course's ``nbgrader_config.py``
    loaded as the ``nbgrader`` command loads it, the database at ``url``. 0, or 1 with nbgrader's log."""
    from nbgrader.apps.api import NbGraderAPI
    from nbgrader.apps.baseapp import NbGrader

    app = NbGrader()
    app.initialize([f"--CourseDirectory.db_url={url}",
                    *([f"--CourseDirectory.course_id={course_id}"] if course_id else [])])
    api = NbGraderAPI(app.coursedir, parent=app)
    for a in assignments:
        res = api.generate_assignment(a, force=True, create=True)
        if not res.get("success"):
            print(f"{a}:\n{res.get('log', '')}\n{res.get('error', '')}", file=sys.stderr)
            return 1
    return 0


def write(outcomes, db: Path, root: Path = ROOT) -> None:
    """Record every outcome of a known assignment in the gradebook at ``db`` (created if needed)."""
    import os

    from nbgrader.api import Gradebook, MissingEntry

    os.environ["PATH"] = venv_env()["PATH"]  # nbgrader's Gradebook shells out to alembic
    db = Path(db)
    db.parent.mkdir(parents=True, exist_ok=True)
    graded = [o for o in outcomes if o.notebook and o.status != "unknown-assignment"]
    assignments = sorted({o.assignment for o in graded})
    if not assignments:
        return
    url = f"sqlite:///{db.resolve()}"
    with Gradebook(url) as gb:
        known = {a.name for a in gb.assignments}
    missing = [a for a in assignments if a not in known]
    if missing:
        populate(db, missing, root)
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    import warnings
    with Gradebook(url) as gb, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SQLAlchemy's autoflush notes from inside nbgrader's add_submission
        for o in graded:
            first, _, last = (o.student_name or "").partition(" ")
            gb.update_or_create_student(o.student_id, first_name=first or None, last_name=last or None)
            try:
                gb.remove_submission(o.assignment, o.student_id)  # a resubmission replaces the earlier one
            except MissingEntry:
                pass
            sub = gb.add_submission(o.assignment, o.student_id, timestamp=now)
            scores = {t.grade_id: t.points for t in o.tests}
            for nb in sub.notebooks:
                nb.flagged = bool(o.review)  # a row that needs review: the formgrader's flag icon
                for g in nb.grades:
                    if g.name in scores:
                        g.auto_score = float(scores[g.name])
                        g.needs_manual_grade = False
            gb.db.commit()


if __name__ == "__main__":  # python -m autograder.nbgrader.gradebook URL [--course-id ID] ASSIGNMENT...
    import argparse

    ap = argparse.ArgumentParser(description="nbgrader generate_assignment for each ASSIGNMENT, into URL")
    ap.add_argument("url")
    ap.add_argument("--course-id")
    ap.add_argument("assignments", nargs="+")
    a = ap.parse_args()
    sys.exit(_generate(a.url, a.assignments, a.course_id))
