"""What grading one submission gives: a row of the class (:class:`Outcome`) and one result per test
(:class:`TestResult`), as written to ``results.json``, the CSV, the feedback and the gradebook."""
from __future__ import annotations

from dataclasses import dataclass, field


def check_for(grade_id):
    """The registered check of ``grade_id``, or None (not registered, or the checks fail to import)."""
    from coursekit.checks import get
    try:
        return get(grade_id)
    except Exception:  # noqa: BLE001 -- not registered, or the course's check modules fail to import
        return None


@dataclass
class TestResult:
    grade_id: str
    doc: str
    points: float
    max_points: float
    passed: bool
    message: str = ""
    detail: dict = field(default_factory=dict)  # e.g. the benchmark's timings
    kind: str | None = None  # the check's kind (coursekit.checks.KINDS); None: the registered check's

    def __post_init__(self):
        if self.kind is None:  # rows made without a check at hand (not submitted, an earlier results.json)
            check = check_for(self.grade_id)
            self.kind = check.kind if check else "correctness"


@dataclass
class Outcome:
    student_id: str
    assignment: str
    student_name: str = ""
    notebook: str = ""
    score: float = 0.0
    max_score: float = 0.0
    status: str = "graded"  # graded | timeout | crashed | unreadable | missing | unknown-assignment
    message: str = ""
    tests: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    cell_errors: list = field(default_factory=list)
    wall_s: float = 0.0
    timings: dict = field(default_factory=dict)  # seconds by phase (autograder.referee.protocol.Transcript)
    output_tail: str = ""
    #: reasons for a person to look at this submission (autograder.intake.scan.review), each with its cell
    #: and line; a flag costs no point
    review: list = field(default_factory=list)
    handed_in: str = ""  # the file the student handed in that was graded (the notebook column)
    other_assignment: str = ""  # the assignment whose notebook was handed in, when not this one's
    #: manual scores in the course gradebook that this run's auto scores did not replace
    #: (autograder.nbgrader.course_dir.kept_manual): {"cell", "manual", "auto"} each
    manual_kept: list = field(default_factory=list)
    #: the draw of the hidden checks' inputs for this submission (autograder.referee.calls.draw_for): with
    #: it, an instructor reruns the very inputs the hidden probes passed
    hidden_draw: int = 0
