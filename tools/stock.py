"""Grade a class with stock nbgrader, the way an instructor would without this course's grader.

Used by the test suite (fixtures of wrong implementations must lose the points meant for them,
through real ``nbgrader autograde``) and by ``make bench-grade`` (the baseline to beat).

    scores = autograde_stock(submitted_dir, workdir)
    scores[(student, assignment)][grade_id] == (score, max_score)

``submitted_dir`` is laid out ``<student>/<assignment>/<notebook>.ipynb``. Everything runs in
``workdir``, a scratch course directory (config, solutions, gradebook); the repository is untouched.
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path

from course.release import ROOT, assignments, nbgrader, scratch_course


def autograde_stock(submitted: Path, workdir: Path, only: list[str] | None = None,
                    root: Path = ROOT) -> dict:
    """Run ``nbgrader generate_assignment`` then ``nbgrader autograde`` on every assignment present."""
    from nbgrader.api import Gradebook

    submitted = Path(submitted)
    course = scratch_course(Path(workdir), root)
    shutil.copytree(submitted, course / "submitted")
    present = sorted({p.parent.name for p in submitted.glob("*/*/*.ipynb")})
    todo = [a for a in assignments(root) if a in present and (only is None or a in only)]
    timings = {}
    for a in todo:
        nbgrader("generate_assignment", a, "--force", cwd=course)
        t0 = time.perf_counter()
        nbgrader("autograde", a, "--force", cwd=course)
        timings[a] = time.perf_counter() - t0

    scores: dict = {}
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        for a in todo:
            for sub in gb.assignment_submissions(a):
                row = scores.setdefault((sub.student_id, a), {})
                for nb in sub.notebooks:
                    for g in nb.grades:
                        row[g.name] = (float(g.score), float(g.max_score))
    scores["_timings"] = timings
    return scores


def feedback_text(workdir: Path, student: str, assignment: str) -> str:
    """The executed (autograded) notebooks of one student, as text: where test messages appear."""
    out = []
    for nb in sorted((Path(workdir) / "course" / "autograded" / student / assignment).glob("*.ipynb")):
        out.append(nb.read_text())
    return "\n".join(out)
