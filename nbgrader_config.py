"""nbgrader's course configuration: this repository *is* the course directory.

nbgrader's own names map onto the course layout, so every nbgrader command (generate_assignment,
validate, autograde, formgrader, export) works here as it stands:
  source  -> solutions/   (instructor notebooks with solutions and hidden tests)
  release -> exercises/   (what students get; regenerate with `make exercises`)
  submitted/, autograded/, feedback/, gradebook.db stay nbgrader's defaults (git-ignored).
"""
import atexit
import os
import shutil
import sys
import tempfile

c = get_config()  # noqa: F821 -- injected by nbgrader

c.CourseDirectory.root = os.path.dirname(os.path.abspath(__file__))
# The exchange classes named below are the course's own (autograder/): importable by whatever
# nbgrader runs this file, the course's .venv or another one, without installing the course.
if c.CourseDirectory.root not in sys.path:
    sys.path.insert(0, c.CourseDirectory.root)
c.CourseDirectory.course_id = "resnorm"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "exercises"

# The exchange: the folder shared by instructor and students (release, submit, collect, feedback).
# Set here, once, so that every nbgrader command run in this folder and the formgrader (`jupyter lab`
# started here) use the same one; never pass --Exchange.root to only some commands. This is
# nbgrader's default; on a shared machine change it here, and give the students the same
# `c.Exchange.root` in their own nbgrader_config.py (docs/nbgrader_course.md, "From release to feedback with nbgrader").
c.Exchange.root = "/usr/local/share/nbgrader/exchange"
# Feedback for a notebook handed in under another name (backward.ipynb in 01_layernorm/) is also
# released under that name: the student's fetch_feedback looks for the names it handed in
# (autograder/nbgrader/release_feedback.py).
c.ExchangeFactory.release_feedback = "autograder.nbgrader.release_feedback.ReleaseFeedback"
# collect takes only what is the student's own: regular files owned by the user whose name the
# submission carries, no links, times that are not forged; the rest is listed, never copied
# (autograder/nbgrader/collect.py).
c.ExchangeFactory.collect = "autograder.nbgrader.collect.CheckedCollect"

# exercises/ is committed, so without this `nbgrader generate_assignment A` would skip A ("Skipping
# existing assignment") and never record it in gradebook.db, and `nbgrader autograde A` would then
# fail for every student ("No assignment with ID 'A' exists in the database"). Always regenerate:
# the release is rebuilt from solutions/ (the same bytes when exercises/ is in sync, which a test
# checks) and the assignment, its notebooks and grade cells are written to the gradebook.
c.GenerateAssignment.force = True

# The stub nbgrader leaves where a solution was; the hint above each solution says how much to write.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# Grade with the kernel of the environment nbgrader runs in, whatever kernelspec a submission names.
c.Execute.kernel_name = "python3"
c.Execute.timeout = 300

# Kernels (autograde, validate) talk to nbgrader over Unix sockets in a private folder (0700) made for
# this command and removed when it ends, not over TCP ports: over TCP without CurveZMQ keys every
# kernel start prints ipykernel's "Kernel is running over TCP without encryption" warning.
_kernel_sockets = tempfile.mkdtemp(prefix="nbgrader-kernels-")
atexit.register(shutil.rmtree, _kernel_sockets, True)
c.KernelManager.transport = "ipc"
c.KernelManager.ip = os.path.join(_kernel_sockets, "kernel")
