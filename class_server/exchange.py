"""nbgrader's submit, with each submission readable by the instructors only.

Stock ``nbgrader submit`` leaves the submission folder in the exchange's ``inbound/`` world-writable
(0777) and its files world-readable (0644): other students cannot *list* ``inbound/`` (0733), so
only the folder's name (``<student>+<assignment>+<timestamp>+<random>``) hides it. Here the folder
becomes 0770: it has the group of ``inbound/`` (the class server makes the course's exchange folder
the instructors', setgid, so ``inbound/`` and every folder made in it take that group), so the
student who submitted and the instructors can enter it, nobody else. The files inside keep
nbgrader's modes (the student cannot give them the instructors' group, not being in it).

The class server installs this module into the class's Python as ``class_server_exchange`` and
names it in the students' ``nbgrader_config.py`` (``c.ExchangeFactory.submit``).
"""
from __future__ import annotations

import os

from nbgrader.exchange.default.submit import ExchangeSubmit


class PrivateSubmit(ExchangeSubmit):
    def copy_files(self):
        super().copy_files()
        dest = os.path.join(self.inbound_path, self.assignment_filename)  # what super() wrote
        group = os.stat(self.inbound_path).st_gid
        if os.stat(dest).st_uid != os.getuid() or os.stat(dest).st_gid != group or group == os.getgid():
            return  # not in the instructors' group: 0770 would not hide it, or would lock them out
        os.chmod(dest, 0o770)  # the instructors may still remove it, as stock nbgrader allows
