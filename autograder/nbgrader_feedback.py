"""nbgrader's ``release_feedback``, so that feedback reaches a student whatever the notebook was named.

nbgrader matches feedback to a submission by notebook name: ``release_feedback`` files each page
``feedback/<student>/<assignment>/<name>.html`` under a hash of the submission's secret and
``<name>``, and the student's ``fetch_feedback`` looks for the hash of each notebook *it handed in*.
The course grader grades a notebook handed in under another name (``backward.ipynb`` in
``01_layernorm/``, ``layernorm-Copy1.ipynb``) against the assignment's release, and the autograded
notebook, hence ``generate_feedback``'s page, keeps the release's name (``layernorm.html``: the
gradebook knows the assignment's notebooks by that name only). Stock nbgrader then releases
feedback the student never finds ("Could not find feedback for 'resnorm/01_layernorm/backward'").

:class:`ReleaseFeedback` (``c.ExchangeFactory.release_feedback`` in the course's
``nbgrader_config.py``) releases every page as nbgrader does and, when none of a submission's
notebooks has a page of its own name and the assignment has one page (one notebook), releases that
page under the name of each notebook in ``submitted/<student>/<assignment>/`` too.
"""
from __future__ import annotations

import glob
import os
import shutil

from nbgrader.exchange.default.release_feedback import ExchangeReleaseFeedback
from nbgrader.utils import notebook_hash


class ReleaseFeedback(ExchangeReleaseFeedback):
    """nbgrader's default ``release_feedback``, plus each page under the names the student handed in."""

    def copy_files(self):
        super().copy_files()
        exclude = set(filter(None, (self.coursedir.student_id_exclude or "").split(",")))
        student = self.coursedir.student_id or "*"
        for feedback_dir in sorted(glob.glob(self.coursedir.format_path(
                self.coursedir.feedback_directory, student, self.coursedir.assignment_id))):
            student_id = os.path.basename(os.path.dirname(feedback_dir))
            pages = glob.glob(os.path.join(feedback_dir, "*.html"))
            if student_id in exclude or len(pages) != 1:
                continue
            submitted = self.coursedir.format_path(self.coursedir.submitted_directory, student_id,
                                                   self.coursedir.assignment_id)
            handed_in = {os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(submitted, "*.ipynb"))}
            page_name = os.path.splitext(os.path.basename(pages[0]))[0]
            if not handed_in or page_name in handed_in:
                continue  # nbgrader's own release reaches the student
            with open(os.path.join(feedback_dir, "submission_secret.txt")) as fh:
                secret = fh.read()
            for name in sorted(handed_in):
                checksum = notebook_hash(secret=secret, notebook_id=name)
                tmp = os.path.join(self.dest_path, f"{checksum}-tmp.html")
                shutil.copy(pages[0], tmp)
                shutil.move(tmp, os.path.join(self.dest_path, f"{checksum}.html"))
                self.log.info("Releasing feedback for student '%s' on assignment '%s/%s/%s' (the page of %s, "
                              "graded from the notebook handed in as %s.ipynb)", student_id,
                              self.coursedir.course_id, self.coursedir.assignment_id, name, page_name, name)
