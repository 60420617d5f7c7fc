"""The sandbox against a submission that tries to leave it (as the grader runs on these machines:
root, where bwrap would otherwise hand every capability to the code inside).

Each attempt runs in a real sandbox (:func:`autograder.sandbox.bwrap.run_sandboxed`) and reports what
happened as JSON; the test asserts that it failed and that the host is unchanged.
"""
from __future__ import annotations

import json
import os
import site
import sys
from pathlib import Path

import pytest

from autograder.sandbox.bwrap import SANDBOX_UIDS, Limits, run_sandboxed
from course.release import ROOT

pytestmark = pytest.mark.autograder

ATTEMPTS = r'''
import json, os, subprocess, site, sys
import course
r = {"uid": os.getuid(),
     "capeff": open("/proc/self/status").read().split("CapEff:")[1].split()[0]}
def sh(cmd):
    return subprocess.run(cmd, shell=True, capture_output=True, text=True).returncode
course_dir = os.path.dirname(course.__file__)
r["remount_venv_rw"] = sh(f"mount -o remount,rw,bind {sys.prefix}")
r["remount_course_rw"] = sh(f"mount -o remount,rw,bind {course_dir}")
r["umount_tmp"] = sh("umount /tmp")
r["book_visible"] = os.path.exists(os.path.join(os.path.dirname(course_dir), "book", "experiments", "blocks.py"))
def write(path):
    try:
        with open(path, "w") as f:
            f.write("import os\n")
        return "written"
    except OSError as e:
        return e.errno
r["pth"] = write(os.path.join(site.getsitepackages()[0], "zz_pwned.pth"))
r["course_file"] = write(os.path.join(course_dir, "pwned.py"))
print("RESULT " + json.dumps(r))
'''


@pytest.fixture(scope="module")
def attempts():
    res = run_sandboxed(["python", "-c", ATTEMPTS], limits=Limits(wall_s=120))
    line = next((l for l in res.output.splitlines() if l.startswith("RESULT ")), None)
    assert line, res.output
    return json.loads(line[len("RESULT "):])


def test_code_inside_has_no_capabilities(attempts):
    assert attempts["capeff"] == "0" * 16


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid switch happens when the grader runs as root")
def test_code_inside_runs_as_an_unprivileged_uid_when_the_grader_is_root(attempts):
    assert attempts["uid"] in SANDBOX_UIDS


def test_read_only_binds_cannot_be_remounted_writable(attempts):
    assert attempts["remount_venv_rw"] != 0 and attempts["remount_course_rw"] != 0


def test_mounts_cannot_be_undone_and_the_books_code_is_not_there(attempts):
    """book/experiments (whose transformer block is close to exercise 04's answer) is never bound."""
    assert attempts["umount_tmp"] != 0 and attempts["book_visible"] is False


def test_the_graders_python_and_course_cannot_be_written(attempts):
    assert attempts["pth"] != "written" and attempts["course_file"] != "written"
    assert not Path(site.getsitepackages()[0], "zz_pwned.pth").exists()
    assert not (ROOT / "course" / "pwned.py").exists()


def test_writable_space_is_bounded_and_the_host_disk_untouched():
    """Writing many files (each under the per-file limit) fills the sandbox's tmpfs, not the host."""
    code = ("import os\nn = 0\n"
            "try:\n"
            "    while n < 100:\n"
            "        open(f'f{n}', 'wb').write(b'x' * (8 << 20)); n += 1\n"
            "except OSError as e:\n    print('STOPPED', n, e.errno)\n")
    res = run_sandboxed(["python", "-c", code], limits=Limits(wall_s=120, tmp_mb=64))
    assert "STOPPED" in res.output, res.output
    written = int(res.output.split("STOPPED")[1].split()[0])
    assert written * 8 <= 64, res.output
