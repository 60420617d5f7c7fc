"""nbgrader's exchange on one machine, end to end, with the course autograder in the middle.

The instructor's path of docs/nbgrader_course.md ("From release to feedback"), in a scratch copy of the course
(nbgrader_config.py, solutions/, exercises/) and a temporary exchange directory:

    nbgrader generate_assignment 01_layernorm          # instructor, in the course
    nbgrader release_assignment 01_layernorm           #   (--Exchange.root=EXCHANGE)
    nbgrader fetch_assignment 01_layernorm --course=resnorm      # each student, in their own folder
    nbgrader submit 01_layernorm --course=resnorm --student=ID   #   (alice solves it, bob does not)
    nbgrader collect 01_layernorm                      # instructor
    python -m autograder grade submitted --out OUT     # the course grader, into the course
    nbgrader generate_feedback 01_layernorm; nbgrader release_feedback 01_layernorm
    nbgrader fetch_feedback 01_layernorm --course=resnorm --student=ID   # each student

On one machine every process runs as the same unix user, so each student's id is given with
``--student`` (``CourseDirectory.student_id``; the exchange otherwise takes the unix user name),
and ``collect`` is told not to compare it with the owner of the submitted folder
(``CollectApp.check_owner``: it would only warn), and each student has a submission cache of
their own (``Exchange.cache``). Nothing here reads or writes the real exchange
(``/usr/local/share/nbgrader/exchange``) or the user's Jupyter configuration and data folders.
"""
from __future__ import annotations

import csv
import html
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tools.fixture_class import release_dict, solved_dict
from course.release import ROOT, scratch_course, venv_env

pytestmark = pytest.mark.autograder
A, NB, COURSE_ID = "01_layernorm", "layernorm", "resnorm"
BW, BW_NB = "05_backward", "backward.ipynb"
HIDDEN = ("BEGIN HIDDEN TESTS", "END HIDDEN TESTS", 'run("layernorm_tuple_shape"', 'run("layernorm_hard_rows"',
          'run("layernorm_gradients"', 'run("layernorm_shift_scale_invariance"')


def _visible(page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page))


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("exchange")
    course = scratch_course(tmp)
    shutil.copytree(ROOT / "exercises", course / "exercises")
    exchange = tmp / "exchange"
    exchange.mkdir()
    env = dict(venv_env(), JUPYTER_CONFIG_DIR=str(tmp / "jupyter-config"), JUPYTER_DATA_DIR=str(tmp / "jupyter-data"),
               OMP_NUM_THREADS="1")
    log: list[str] = []

    def nbgrader(*args: str, cwd: Path) -> subprocess.CompletedProcess:
        cmd = ["nbgrader", *args, f"--Exchange.root={exchange}"]
        proc = subprocess.run([sys.executable, "-m", *cmd], cwd=cwd, capture_output=True, text=True, env=env,
                              timeout=300)
        log.append(f"$ (cd {cwd.name}) {' '.join(cmd)}\n{proc.stderr[-2000:]}")
        assert proc.returncode == 0, "\n".join(log[-3:])
        return proc

    students = {"alice": tmp / "home-alice", "bob": tmp / "home-bob", "carol": tmp / "home-carol"}
    # Each student's own submission cache (Exchange.cache, by default in the user's Jupyter data
    # folder): fetch_feedback finds the feedback of the submissions listed there.
    own = {s: f"--Exchange.cache={home / '.nbgrader-cache'}" for s, home in students.items()}
    # Instructor: record the assignment in the gradebook and release it.
    nbgrader("generate_assignment", A, cwd=course)
    nbgrader("release_assignment", A, cwd=course)
    # Students, each in a folder of their own (no course config there): fetch, work, submit.
    for s, home in students.items():
        home.mkdir()
        nbgrader("fetch_assignment", A, f"--course={COURSE_ID}", cwd=home)
        fetched = home / A / f"{NB}.ipynb"
        assert fetched.read_bytes() == (course / "exercises" / A / f"{NB}.ipynb").read_bytes()
        if s == "alice":
            fetched.write_text(json.dumps(solved_dict(A)))
        if s == "carol":  # exercise 05's notebook handed in for 01_layernorm, under its own name
            fetched.unlink()
            (home / A / BW_NB).write_text(json.dumps(release_dict(BW)[1]))
        nbgrader("submit", A, f"--course={COURSE_ID}", f"--student={s}", own[s], cwd=home)
    # Instructor: collect, then grade the course's submitted/ folder with the course grader.
    nbgrader("collect", A, "--CollectApp.check_owner=False", cwd=course)
    grade = subprocess.run([sys.executable, "-m", "autograder", "grade", str(course / "submitted"),
                            "--out", str(tmp / "grades"), "--jobs", "2", "--no-progress"],
                           capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert grade.returncode == 0, grade.stderr[-3000:]
    # Feedback: generated from the autograded notebooks, released, fetched by each student.
    nbgrader("generate_feedback", A, cwd=course)
    nbgrader("release_feedback", A, cwd=course)
    fetched = {s: nbgrader("fetch_feedback", A, f"--course={COURSE_ID}", f"--student={s}", own[s], cwd=home)
               for s, home in students.items()}
    nbgrader("export", "--to=export.csv", cwd=course)
    return {"course": course, "exchange": exchange, "students": students, "grade": grade, "log": log,
            "tmp": tmp, "fetched": fetched}


def max_score() -> float:
    from autograder.grade import Course
    return sum(t.points for t in Course(ROOT).tests(A))


def test_exchange_moves_each_submission_into_submitted(path):
    course, exchange = path["course"], path["exchange"]
    assert (exchange / COURSE_ID / "outbound" / A / f"{NB}.ipynb").is_file()
    inbound = sorted(p.name.split("+")[0] for p in (exchange / COURSE_ID / "inbound").iterdir())
    assert inbound == ["alice", "bob", "carol"]
    for s in ("alice", "bob"):
        d = course / "submitted" / s / A
        assert (d / f"{NB}.ipynb").is_file() and (d / "timestamp.txt").is_file()
        assert (d / "submission_secret.txt").is_file()
    assert "nbgrader course" in path["grade"].stderr


def test_formgrader_data_after_the_exchange(path):
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from nbgrader.utils import parse_utc
    from traitlets.config.loader import PyFileConfigLoader

    import os
    os.environ["PATH"] = venv_env()["PATH"]
    course = path["course"]
    cfg = PyFileConfigLoader("nbgrader_config.py", path=str(course)).load_config()
    api = NbGraderAPI(CourseDirectory(config=cfg), config=cfg)
    full = max_score()
    subs = {s["student"]: s for s in api.get_submissions(A)}
    assert sorted(subs) == ["alice", "bob", "carol"]
    for s, score in (("alice", full), ("bob", 0.0)):
        sub = subs[s]
        assert sub["autograded"] and sub["submitted"] and not sub["needs_manual_grade"], sub
        assert (sub["score"], sub["max_score"]) == (score, full), sub
        stamp = parse_utc((course / "submitted" / s / A / "timestamp.txt").read_text().strip())
        assert sub["timestamp"] == stamp.isoformat()  # the time `nbgrader submit` recorded
    assert {n["student"] for n in api.get_notebook_submissions(A, NB)} == {"alice", "bob", "carol"}
    assignment = api.get_assignment(A)
    assert assignment["num_submissions"] == 3 and assignment["releaseable"] is not None
    rows = {r["student_id"]: r for r in csv.DictReader(open(course / "export.csv"))}
    assert float(rows["alice"]["score"]) == full and float(rows["bob"]["score"]) == 0.0


def test_students_fetch_feedback_with_their_scores_and_no_hidden_tests(path):
    full = max_score()
    for s, score in (("alice", full), ("bob", 0.0)):
        pages = list((path["students"][s] / A / "feedback").rglob(f"{NB}.html"))
        assert len(pages) == 1, pages
        page = pages[0].read_text()
        shown = _visible(page)
        assert f"(Score: {score:.1f} / {full:.1f})" in shown
        for h in HIDDEN:
            assert h not in page and h not in shown, (s, h)
        # each student gets their own: the feedback is keyed by the submission's secret
        assert ("passed layernorm_matches_torch" in shown) == (s == "alice")


def test_feedback_reaches_a_student_who_handed_in_a_notebook_under_another_name(path):
    """carol handed in backward.ipynb for 01_layernorm: the grader grades it (and says whose notebook it
    is), nbgrader's pages keep the release's name, and release_feedback also files the page under the
    name she handed in, which is the name her fetch_feedback looks for."""
    fetched = path["fetched"]["carol"]
    assert "Could not find feedback" not in fetched.stderr, fetched.stderr
    pages = list((path["students"]["carol"] / A / "feedback").rglob("*.html"))
    assert [p.name for p in pages] == ["backward.html"], pages
    shown = _visible(pages[0].read_text())
    assert f"(Score: 0.0 / {max_score():.1f})" in shown
    assert f"this is {BW}'s notebook" in shown, shown[:3000]
    for h in HIDDEN:
        assert h not in shown
    for s in ("alice", "bob"):  # the others get their own page, once, under the release's name
        assert "Could not find feedback" not in path["fetched"][s].stderr
        assert [p.name for p in (path["students"][s] / A / "feedback").rglob("*.html")] == [f"{NB}.html"]
