"""The student side of nbgrader's exchange on a shared machine without the class server.

``python -m class_server env --dir DIR --exchange ROOT`` (as root) builds the students' Python:
``DIR/venv``, runnable by every user, configured for the exchange. A real unix account (made here,
removed afterwards) fetches the assignment the instructor released and submits it with
``DIR/venv/bin/nbgrader``, given no option but the course id; the instructor's ``nbgrader collect``
then finds the submission under that account's name. The exchange is made as the class server makes
its own: the student cannot rename the course's folder in it (a student who could would receive the
others' submissions), and the submission is readable by the instructors only. The course's own ``.venv`` is what students
could not use: its interpreter may live where only its owner can read (a pyenv under /root), and
then every command in it fails with "Permission denied" for them (printed here, not asserted: on
a machine whose Python everyone can run it works).
"""
from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from course.release import ROOT, scratch_course, venv_env

pytestmark = [pytest.mark.hub, pytest.mark.autograder]
A, NB, USER = "01_layernorm", "layernorm", "rn-shared-stu"

needs_root = pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser"),
                                reason="makes a unix account: needs root, useradd and runuser")


def _as_student(argv, home: Path) -> subprocess.CompletedProcess:
    env = ["HOME=" + str(home), "USER=" + USER, "LOGNAME=" + USER, "LANG=C.UTF-8", "PATH=/usr/local/bin:/usr/bin:/bin"]
    return subprocess.run(["runuser", "-u", USER, "--", "env", "-i", *env, "sh", "-c", 'cd "$0" && exec "$@"',
                           str(home), *map(str, argv)], capture_output=True, text=True, timeout=600)


@pytest.fixture()
def account():
    subprocess.run(["userdel", "-r", USER], capture_output=True)
    subprocess.run(["useradd", "-m", "-s", "/bin/sh", USER], check=True, capture_output=True)
    try:
        yield Path(pwd.getpwnam(USER).pw_dir)
    finally:
        subprocess.run(["pkill", "-KILL", "-u", USER], capture_output=True)
        subprocess.run(["userdel", "-r", USER], capture_output=True)


@needs_root
def test_a_student_account_fetches_and_submits_with_the_students_python(account):
    base = Path(tempfile.mkdtemp(prefix="resnorm-shared-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        exchange = base / "exchange"
        exchange.mkdir()
        os.chmod(exchange, 0o777)  # as stock nbgrader's release_assignment leaves a new one: env mends it
        made = subprocess.run([sys.executable, "-m", "class_server", "env", "--dir", str(base / "env"),
                               "--exchange", str(exchange)], capture_output=True, text=True, cwd=ROOT,
                              env=venv_env(), timeout=600)
        assert made.returncode == 0, made.stderr[-3000:]
        nbgrader = base / "env" / "venv" / "bin" / "nbgrader"
        assert str(nbgrader) in made.stdout, made.stdout
        assert stat.S_IMODE(exchange.stat().st_mode) == 0o1777 and exchange.stat().st_uid == 0
        assert (exchange / "resnorm").stat().st_uid == 0

        course = scratch_course(base)
        shutil.copytree(ROOT / "exercises", course / "exercises")
        env = dict(venv_env(), JUPYTER_CONFIG_DIR=str(base / "jupyter-config"),
                   JUPYTER_DATA_DIR=str(base / "jupyter-data"))

        def instructor(*args):
            proc = subprocess.run([sys.executable, "-m", "nbgrader", *args, f"--Exchange.root={exchange}"],
                                  cwd=course, capture_output=True, text=True, env=env, timeout=300)
            assert proc.returncode == 0, proc.stderr[-3000:]
            return proc

        instructor("generate_assignment", A)
        instructor("release_assignment", A)

        old = _as_student([ROOT / ".venv" / "bin" / "nbgrader", "--version"], account)
        print("the course's .venv as a student:", old.returncode, (old.stderr or old.stdout).strip()[-300:])

        fetched = _as_student([nbgrader, "fetch_assignment", A, "--course=resnorm"], account)
        assert fetched.returncode == 0, fetched.stderr[-3000:]
        nb = account / A / f"{NB}.ipynb"
        assert nb.read_bytes() == (course / "exercises" / A / f"{NB}.ipynb").read_bytes()
        assert nb.stat().st_uid == pwd.getpwnam(USER).pw_uid
        listed = _as_student([nbgrader, "list", "--course=resnorm"], account)
        assert listed.returncode == 0 and A in listed.stdout + listed.stderr, listed.stderr[-2000:]
        submitted = _as_student([nbgrader, "submit", A, "--course=resnorm"], account)
        assert submitted.returncode == 0, submitted.stderr[-3000:]
        moved = _as_student(["mv", exchange / "resnorm", exchange / "mine"], account)
        assert moved.returncode != 0 and (exchange / "resnorm").is_dir(), moved.stderr
        [entry] = [p for p in (exchange / "resnorm" / "inbound").iterdir() if p.name.startswith(USER + "+")]
        assert stat.S_IMODE(entry.stat().st_mode) & 0o007 == 0, oct(entry.stat().st_mode)  # not the others'

        instructor("collect", A)
        got = course / "submitted" / USER / A / f"{NB}.ipynb"
        assert got.is_file() and got.read_bytes() == nb.read_bytes()
    finally:
        shutil.rmtree(base, ignore_errors=True)


@needs_root
def test_env_refuses_a_course_folder_a_student_made_in_the_exchange_first(account):
    """Stock nbgrader leaves the exchange 0777: a student who makes resnorm/inbound in it before
    `env` would own inbound/ (list, remove and, through its group, read every submission). `env`
    refuses, naming the folder and its owner, and changes nothing there."""
    base = Path(tempfile.mkdtemp(prefix="resnorm-squat-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        exchange = base / "exchange"
        exchange.mkdir()
        os.chmod(exchange, 0o777)
        squat = _as_student(["mkdir", "-p", exchange / "resnorm" / "inbound"], account)
        assert squat.returncode == 0, squat.stderr
        uid = pwd.getpwnam(USER).pw_uid
        made = subprocess.run([sys.executable, "-m", "class_server", "env", "--dir", str(base / "env"),
                               "--exchange", str(exchange)], capture_output=True, text=True, cwd=ROOT,
                              env=venv_env(), timeout=600)
        assert made.returncode != 0, made.stdout
        assert f"{exchange / 'resnorm'} belongs to {USER}" in made.stderr, made.stderr[-2000:]
        for p in (exchange / "resnorm", exchange / "resnorm" / "inbound"):
            assert p.stat().st_uid == uid and not p.stat().st_mode & stat.S_ISVTX, p
    finally:
        shutil.rmtree(base, ignore_errors=True)
