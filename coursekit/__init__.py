"""The course's student runtime: what an exercise notebook imports for its tests.

    from coursekit import run, smoke

``run(grade_id, globals())`` runs one visible check on the notebook's code and prints its verdict;
``smoke(call)`` is the visible half of a hidden test (the student's code must at least run).
``python -m coursekit.selfcheck NOTEBOOK`` runs a whole notebook the way the grader does and
prints every visible test's result. The instructor's hidden checks and reference solutions are
not part of this package (``course.hidden``, ``solutions/``); the grader loads them when present.
"""
from coursekit.checks import CheckFailed, run, smoke

__all__ = ["CheckFailed", "run", "smoke"]
__version__ = "0.1.0"
