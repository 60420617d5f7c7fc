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

A feedback folder that cannot be released (no ``submission_secret.txt`` or ``timestamp.txt``, a
page that is not a regular file) does not stop the others: every other student's feedback is
released, then the command fails naming each folder it skipped and why (stock nbgrader stopped at
the first with ``FileNotFoundError``, before releasing the rest).
"""
from __future__ import annotations

import glob
import os
import re
import shutil
import stat

from nbgrader.exchange.default.release_feedback import ExchangeReleaseFeedback
from nbgrader.utils import notebook_hash


#: the most handed-in names one feedback page is also released under (a renamed notebook or two)
MAX_NAMES = 5


class ReleaseFeedback(ExchangeReleaseFeedback):
    """nbgrader's default ``release_feedback``, plus each page under the names the student handed in,
    and one malformed feedback folder never keeps the others' feedback back."""

    def _read(self, path: str) -> bytes:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise OSError(f"{path} is not a regular file")
            return fh.read()

    def _release(self, page: bytes, secret: str, notebook_id: str) -> str:
        checksum = notebook_hash(secret=secret, notebook_id=notebook_id)
        tmp = os.path.join(self.dest_path, f"{checksum}-tmp.html")  # copied, then moved: atomic
        with open(tmp, "wb") as out:
            out.write(page)
        os.chmod(tmp, 0o664 if self.coursedir.groupshared else 0o644)  # every student reads their page
        shutil.move(tmp, os.path.join(self.dest_path, f"{checksum}.html"))
        return tmp

    def copy_files(self):
        exclude = set(filter(None, (self.coursedir.student_id_exclude or "").split(",")))
        skipped = {}  # feedback folder -> why it was not released
        regexp = re.escape(os.path.sep).join([
            self.coursedir.format_path(self.coursedir.feedback_directory, "(?P<student_id>.*)",
                                       self.coursedir.assignment_id, escape=True),
            "(?P<notebook_id>.*).html"])
        for html_file in sorted(glob.glob(os.path.join(self.src_path, "*.html"))):
            m = re.match(regexp, html_file)
            if m is None:
                self.log.error("Could not match '%s' with regexp '%s'", html_file, regexp)
                continue
            student_id, notebook_id = m.group("student_id"), m.group("notebook_id")
            if student_id in exclude:
                self.log.debug("Skipping student '%s'", student_id)
                continue
            feedback_dir = os.path.dirname(html_file)
            if feedback_dir in skipped:
                continue
            try:
                timestamp = self._read(os.path.join(feedback_dir, "timestamp.txt")).decode()
                secret = self._read(os.path.join(feedback_dir, "submission_secret.txt")).decode()
                if not secret.strip():
                    raise ValueError("its submission_secret.txt is empty (nbgrader submit writes one)")
                page = self._read(html_file)
                self.log.info("Releasing feedback for student '%s' on assignment '%s/%s/%s' (%s)", student_id,
                              self.coursedir.course_id, self.coursedir.assignment_id, notebook_id, timestamp)
                self.log.info("Feedback released to: %s", self._release(page, secret, notebook_id))
                self._also_under_handed_in_names(feedback_dir, student_id, secret)
            except Exception as e:  # noqa: BLE001 -- one folder's fault stops that folder only
                skipped[feedback_dir] = getattr(e, "strerror", None) and f"{e.strerror}: {e.filename}" or \
                    (str(e) or type(e).__name__)
                self.log.error("Not releasing the feedback in %s: %s", feedback_dir, skipped[feedback_dir])
                continue
        if skipped:
            self.fail("Released the feedback of everyone else; not released, {} feedback folder{} "
                      "(look at each, then release again):\n{}".format(
                          len(skipped), "" if len(skipped) == 1 else "s",
                          "\n".join(f"  {d}: {why}" for d, why in sorted(skipped.items()))))

    def _also_under_handed_in_names(self, feedback_dir: str, student_id: str, secret: str) -> None:
        pages = glob.glob(os.path.join(feedback_dir, "*.html"))
        if len(pages) != 1:
            return
        submitted = self.coursedir.format_path(self.coursedir.submitted_directory, student_id,
                                               self.coursedir.assignment_id)
        handed_in = {os.path.splitext(os.path.basename(p))[0] for p in glob.glob(os.path.join(submitted, "*.ipynb"))}
        page_name = os.path.splitext(os.path.basename(pages[0]))[0]
        if not handed_in or page_name in handed_in:
            return  # nbgrader's own release reaches the student
        if len(handed_in) > MAX_NAMES:  # one page per name: a submission of thousands would fill the exchange
            raise ValueError(f"{len(handed_in)} notebooks were handed in under other names; the page is released "
                             f"under at most {MAX_NAMES} of them (look at the submission)")
        page = self._read(pages[0])
        for name in sorted(handed_in):
            self._release(page, secret, name)
            self.log.info("Releasing feedback for student '%s' on assignment '%s/%s/%s' (the page of %s, "
                          "graded from the notebook handed in as %s.ipynb)", student_id,
                          self.coursedir.course_id, self.coursedir.assignment_id, name, page_name, name)
