"""Everything in this package runs INSIDE the sandbox, next to student code, and trusts nothing it
gets back: a submission shares the process (the harness) or was forked from it (the zygote), so it
can patch, read or replace anything here once its first cell runs.

* ``harness.py``: runs one submission's cells and probes its tests, one step at a time, as the
  grader asks (:mod:`autograder.referee.protocol` is the grader's side);
* ``zygote.py``: one per grading slot; imports torch, IPython and the checks once, then forks a
  fresh sandbox per submission that runs the harness (:mod:`autograder.sandbox.slots` is the grader's side).

The sandbox sees this folder, read-only, as ``/grader`` (:data:`autograder.sandbox.bwrap.HARNESS_IN`,
:data:`autograder.sandbox.bwrap.ZYGOTE_IN`); the two files import only the standard library, the
course's runtime (``coursekit``) and each other. Nothing outside this package runs in the sandbox.
"""
