"""``nbgrader collect`` (autograder/nbgrader/collect.py's CheckedCollect) bounds what a student's
submission costs the instructor's ``course/submitted/``, whatever the student does while it runs.

A real student account (made here, removed afterwards) hands in its folder in an exchange's
``inbound/`` and changes it as itself (``runuser``); the real ``nbgrader collect`` copies it (as
root here: the course's Python lives where other accounts may not run it; the class server's own
tests run it as the instructor). Seconds, not the class server's minutes: no class is laid out.

- A file grown after collect checked its size (the red team's ``truncate -s 2G`` once collect starts
  reading it: sparse, free for the student) is not copied past the size checked, and the folder is
  refused and named; the other students' folders are collected.
- A folder of many empty folders (which cost no byte of ``max_dir_size``) is refused like one of
  many files.
"""
from __future__ import annotations

import datetime
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from course.release import ROOT

pytestmark = [pytest.mark.hub, pytest.mark.autograder]
A, COURSE_ID = "01_layernorm", "resnorm"
UTC_FMT = "%Y-%m-%d %H:%M:%S.%f UTC"  # nbgrader's Exchange.timestamp_format
GROWN = 64 << 20  # what the file is grown to once collect reads it (the red team: 2 GB)


@pytest.fixture(scope="module")
def place():
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser"):
        pytest.skip("makes unix accounts: needs root, useradd and runuser")
    users = [f"rncl{os.getpid() % 10000}{n}" for n in ("a", "b")]
    for u in users:
        subprocess.run(["userdel", "-r", u], capture_output=True)
        subprocess.run(["useradd", "-m", "-s", "/bin/sh", u], check=True, capture_output=True)
    base = Path(tempfile.mkdtemp(prefix="resnorm-collect-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        inbound = base / "exchange" / COURSE_ID / "inbound"
        inbound.mkdir(parents=True)
        os.chmod(base / "exchange", 0o1777)
        os.chmod(inbound, 0o3773)  # as the class server makes it: students write, do not list
        (base / "course").mkdir()
        (base / "jupyter").mkdir()
        yield {"base": base, "inbound": inbound, "course": base / "course", "users": users}
    finally:
        for u in users:
            subprocess.run(["pkill", "-KILL", "-u", u], capture_output=True)
            subprocess.run(["userdel", "-r", u], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def _as(user: str, script: str, *args: str) -> None:
    home = pwd.getpwnam(user).pw_dir
    proc = subprocess.run(["runuser", "-u", user, "--", "env", "-i", f"HOME={home}", "PATH=/usr/bin:/bin",
                           "sh", "-c", script, "-", *args], capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, f"{user}: {script}\n{proc.stderr[-2000:]}"


def _hand_in(p, user: str, tag: str, extra: str = "") -> str:
    """As ``user``: a folder in inbound/ as nbgrader submit makes one, plus what ``extra`` (sh, in it) adds."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime(UTC_FMT)
    folder = f"{user}+{A}+{now}+{tag}"
    _as(user, 'set -e; d="$1/$2"; mkdir "$d"; printf %s "$3" > "$d/timestamp.txt"; printf s3cret > '
        '"$d/submission_secret.txt"; printf "{}" > "$d/layernorm.ipynb"; cd "$d"; ' + extra,
        str(p["inbound"]), folder, now)
    return folder


def _collect(p, preamble: str = "") -> str:
    """The real ``nbgrader collect --update`` with the course's CheckedCollect; ``preamble``: Python
    run first in the same process (a hook that lets the student act while a file is copied)."""
    code = preamble + "\nimport sys\nfrom nbgrader.apps.nbgraderapp import main\nsys.argv = ['nbgrader'] + sys.argv[1:]\nmain()\n"
    env = {"PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]), "HOME": str(p["base"]), "PYTHONPATH": str(ROOT), "LANG": "C.UTF-8",
           "JUPYTER_CONFIG_DIR": str(p["base"] / "jupyter"), "JUPYTER_CONFIG_PATH": str(p["base"] / "jupyter"),
           "JUPYTER_DATA_DIR": str(p["base"] / "jupyter")}
    proc = subprocess.run([sys.executable, "-c", code, "collect", "--update", A,
                           f"--Exchange.root={p['base'] / 'exchange'}", f"--CourseDirectory.root={p['course']}",
                           f"--CourseDirectory.course_id={COURSE_ID}",
                           "--ExchangeFactory.collect=autograder.nbgrader.collect.CheckedCollect"],
                          cwd=p["course"], env=env, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)
    return proc.stdout + proc.stderr


# In collect's process: the first time it reads big.bin (after its size check), the student makes
# the file GROWN bytes (truncate: sparse, costs the student nothing), as the red team's grow.py did
# on inotify's IN_ACCESS; here at that very moment, every run.
GROW = """
import os, subprocess
_read, _done = os.read, []
def _hooked(fd, n):
    if not _done and os.readlink(f"/proc/self/fd/{fd}").endswith("/big.bin"):
        _done.append(1)
        data = _read(fd, n)
        subprocess.run(["runuser", "-u", %r, "--", "truncate", "-s", "%d", os.readlink(f"/proc/self/fd/{fd}")],
                       check=True)
        return data
    return _read(fd, n)
os.read = _hooked
"""


def test_a_file_grown_while_collect_copies_it_is_not_copied_and_the_folder_is_named(place):
    p = place
    mal, other = p["users"]
    grown = _hand_in(p, mal, "grow", "head -c 3000000 /dev/urandom > big.bin")
    fine = _hand_in(p, other, "fine")
    out = _collect(p, GROW % (mal, GROWN))
    copy = p["course"] / "submitted" / mal / A
    sizes = [f.stat().st_size for f in copy.rglob("*") if f.is_file()] if copy.exists() else []
    assert sum(sizes) < GROWN, f"collect copied {sum(sizes)} bytes of a file grown to {GROWN}\n{out[-3000:]}"
    assert not copy.exists(), sorted(copy.rglob("*"))  # nothing of the folder is kept
    assert grown in out and "big.bin changed while collect copied it" in out, out[-3000:]
    assert not list((p["course"] / "submitted").rglob("*.collecting")), "a half copy was left"
    assert (p["course"] / "submitted" / other / A / "layernorm.ipynb").is_file(), out[-3000:]
    assert fine.split("+")[2] == (p["course"] / "submitted" / other / A / "timestamp.txt").read_text()


def test_a_submission_of_many_empty_folders_is_refused(place):
    p = place
    mal = p["users"][0]
    many = _hand_in(p, mal, "dirs", 'i=0; while [ $i -lt 300 ]; do mkdir "d$i"; i=$((i+1)); done')
    out = _collect(p)
    assert many in out and "holds more than 100 files and folders" in out, out[-3000:]
    collected = p["course"] / "submitted" / mal / A
    assert not collected.exists() or sum(1 for _ in collected.rglob("*")) < 100
