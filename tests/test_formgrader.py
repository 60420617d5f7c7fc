"""Grading a course's own submitted/ folder: what nbgrader's formgrader, generate_feedback and
export see afterwards (autograder/nbgrader/course_dir.py).

A scratch copy of the course (nbgrader_config.py, solutions/, exercises/) with two students who
handed in 01_layernorm: ``alice`` the reference answers, ``bob`` the untouched release. The course
gradebook does not know the assignment yet (the grader creates it with generate_assignment).
``python -m autograder grade <course>/submitted --out OUT`` grades them; then nbgrader's own API,
``nbgrader generate_feedback`` and ``nbgrader export`` run on the course, and a formgrader (Jupyter
server with nbgrader's server extension, on 127.0.0.1 with a token) is driven in headless
Chromium: the manage-submissions page lists both scores, and a comment and a manual score typed
into bob's notebook are saved in the gradebook. Regrading afterwards keeps the manual grades.
Screenshots land in _build/artifacts/.
"""
from __future__ import annotations

import csv
import html
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from browser import chrome

from tools.fixture_class import release_dict, solved_dict
from course.release import ROOT, scratch_course, venv_env

pytestmark = pytest.mark.autograder
A, NB = "01_layernorm", "layernorm"
STAMPS = {"alice": "2025-03-01 09:00:00.000000 UTC", "bob": "2025-03-01 10:30:00.000000 UTC"}
ARTIFACTS = ROOT / "_build" / "artifacts"
HIDDEN = ("BEGIN HIDDEN TESTS", "END HIDDEN TESTS", 'run("layernorm_tuple_shape"', 'run("layernorm_hard_rows"',
          'run("layernorm_gradients"', 'run("layernorm_shift_scale_invariance"')


def make_course(tmp: Path) -> Path:
    """A scratch nbgrader course: config, source (solutions/) and release (exercises/)."""
    course = scratch_course(tmp)
    shutil.copytree(ROOT / "exercises", course / "exercises")
    return course


def nbgrader(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=cwd, capture_output=True, text=True,
                          env=env or venv_env(), timeout=300)
    assert proc.returncode == 0, f"nbgrader {' '.join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def grade(submitted: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = dict(venv_env(), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", str(submitted), "--out", str(out),
                           "--jobs", "2", "--no-progress", *extra], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def api_for(course: Path):
    """nbgrader's own API (what the formgrader calls) on the course, configured as nbgrader is."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config.loader import PyFileConfigLoader

    os.environ["PATH"] = venv_env()["PATH"]  # the Gradebook shells out to alembic
    cfg = PyFileConfigLoader("nbgrader_config.py", path=str(course)).load_config()
    return NbGraderAPI(CourseDirectory(config=cfg), config=cfg)


def hand_in(course: Path, student: str, nb: dict, stamp: str) -> None:
    d = course / "submitted" / student / A
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{NB}.ipynb").write_text(json.dumps(nb))
    (d / "timestamp.txt").write_text(stamp)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("formgrader")
    course = make_course(tmp)
    hand_in(course, "alice", solved_dict(A), STAMPS["alice"])
    hand_in(course, "bob", release_dict(A)[1], STAMPS["bob"])
    proc = grade(course / "submitted", tmp / "out")
    return {"course": course, "out": tmp / "out", "tmp": tmp, "stderr": proc.stderr}


def max_score() -> float:
    from autograder.grade import Course
    return sum(t.points for t in Course(ROOT).tests(A))


def test_grading_the_courses_submitted_folder_writes_into_the_course(graded):
    course, out = graded["course"], graded["out"]
    assert f"grading the nbgrader course {course}" in graded["stderr"]
    rows = {r["student_id"]: r for r in csv.DictReader(open(out / "grades.csv"))}
    assert float(rows["alice"]["score"]) == max_score() > 0 and float(rows["bob"]["score"]) == 0
    assert (course / "gradebook.db").is_file()
    assert not (out / "gradebook.db").exists()  # one gradebook: the course's
    for s in ("alice", "bob"):
        d = course / "autograded" / s / A
        assert (d / f"{NB}.ipynb").is_file()
        assert (d / "timestamp.txt").read_text() == STAMPS[s]
        assert stat.S_IMODE((d / f"{NB}.ipynb").stat().st_mode) == 0o444  # as nbgrader leaves them


def test_formgrader_api_lists_each_submission_autograded_with_its_score(graded):
    api = api_for(graded["course"])
    subs = {s["student"]: s for s in api.get_submissions(A)}
    assert sorted(subs) == ["alice", "bob"]
    full = max_score()
    for s, score in (("alice", full), ("bob", 0.0)):
        assert subs[s]["autograded"] is True and subs[s]["submitted"] is True, subs[s]
        assert subs[s]["score"] == score and subs[s]["max_score"] == full, subs[s]
        assert subs[s]["needs_manual_grade"] is False
        assert subs[s]["timestamp"] == STAMPS[s].replace(" ", "T", 1).removesuffix(".000000 UTC")
    assert api.get_autograded_students(A) == {"alice", "bob"}
    nbs = {n["student"]: n for n in api.get_notebook_submissions(A, NB)}
    assert sorted(nbs) == ["alice", "bob"] and all(n["index"] is not None for n in nbs.values())
    assert len(api.get_notebook_submission_indices(A, NB)) == 2
    assert api.get_submission(A, "bob")["autograded"] is True
    assert {a["name"]: a["num_submissions"] for a in api.get_assignments()}[A] == 2


def test_gradebook_holds_what_nbgrader_autograde_would(graded):
    from nbgrader.api import Gradebook

    from autograder.grade import Course

    tests = {t.grade_id: t.points for t in Course(ROOT).tests(A)}
    api = api_for(graded["course"])
    with Gradebook(api.coursedir.db_url, "resnorm") as gb:
        for s in ("alice", "bob"):
            nb = gb.find_submission_notebook(NB, A, s)
            auto = {g.name: g.auto_score for g in nb.grades}
            assert auto == {g: (p if s == "alice" else 0.0) for g, p in tests.items()}
            assert not any(g.needs_manual_grade for g in nb.grades)
            comments = {c.name: c.auto_comment for c in nb.comments}
            # nbgrader's SaveAutoGrades: "No response." on an answer cell left as released
            assert comments == {"layernorm_impl": None if s == "alice" else "No response."}
        assert gb.find_assignment(A).course_id == "resnorm"


def test_autograded_notebook_is_what_ran_with_the_verdicts_and_no_hidden_tests(graded):
    import nbformat
    from nbgrader.api import Gradebook
    from nbgrader.utils import determine_grade, is_grade

    from autograder.intake import plan as planmod

    course = graded["course"]
    release = planmod.release_cells(ROOT / "exercises" / A / f"{NB}.ipynb")
    api = api_for(course)
    for s in ("alice", "bob"):
        path = course / "autograded" / s / A / f"{NB}.ipynb"
        nb = nbformat.read(str(path), as_version=4)
        nbformat.validate(nb)
        text = path.read_text()
        for h in HIDDEN:
            assert h not in text, (s, h)
        # the code cells are what the grader ran, in order: setup and answers from its plan, then tests
        student = planmod.read_student_notebook(course / "submitted" / s / A / f"{NB}.ipynb")
        plan = planmod.make_plan(release, student)
        tests = {c["grade_id"]: c["source"] for c in release if c["role"] == "test"}
        want = [st["source"] if st["kind"] == "cell" else tests[st["grade_id"]] for st in plan.steps]
        got = [c.source for c in nb.cells if c.cell_type == "code"]
        assert got == want
        with Gradebook(api.coursedir.db_url) as gb:
            auto = {g.name: g.auto_score for g in gb.find_submission_notebook(NB, A, s).grades}
        graded_cells = [c for c in nb.cells if is_grade(c)]
        assert {c.metadata.nbgrader.grade_id for c in graded_cells} == set(auto)
        for c in graded_cells:  # nbgrader reads the same score from each test cell's output
            assert determine_grade(c)[0] == auto[c.metadata.nbgrader.grade_id], c.metadata.nbgrader.grade_id
            out = "".join(o.get("text", "") + o.get("evalue", "") for o in c.outputs)
            assert c.metadata.nbgrader.grade_id in out
        assert ("passed layernorm_matches_torch" in text) == (s == "alice")
        assert nb.metadata.kernelspec.name == "python3"
        # the first cell lists the autograded tests' points, no total of its own (nbgrader's Score
        # header has the total, manual grades included: issue 18)
        assert nb.cells[0].cell_type == "markdown" and "autograded tests" in nb.cells[0].source
        assert "score:" not in nb.cells[0].source.lower()


def test_autograded_notebook_of_odd_submissions(tmp_path):
    """Without grading: a deleted test cell is put back (and says so), an added cell stays after the
    cell it followed, an error lands under the cell that raised it, an unreadable file gives the
    release with the verdict, and the student's text in the summary cannot become HTML."""
    import nbformat
    from nbconvert.filters.markdown import markdown2html
    from nbgrader.utils import determine_grade, is_grade

    from autograder.grade import Course, Outcome, TestResult
    from autograder.nbgrader.course_dir import build_notebook

    release = ROOT / "exercises" / A / f"{NB}.ipynb"
    tests = Course(ROOT).tests(A)
    nb = solved_dict(A)
    nb["cells"] = [c for c in nb["cells"]
                   if c["metadata"].get("nbgrader", {}).get("grade_id") != "layernorm_hard_rows"]
    impl = next(i for i, c in enumerate(nb["cells"]) if c["metadata"].get("nbgrader", {}).get("solution"))
    nb["cells"].insert(impl + 1, {"cell_type": "code", "metadata": {}, "source": "print('mine')", "outputs": [],
                                  "execution_count": None})
    nb["cells"].insert(0, {"cell_type": "markdown", "metadata": {}, "source": "<script>alert(1)</script>"})
    path = tmp_path / f"{NB}.ipynb"
    path.write_text(json.dumps(nb))
    o = Outcome("eve", A, notebook=f"{NB}.ipynb", score=13.0, max_score=15.0,
                message="```\n<img src=x onerror=alert(1)>\n```", status="graded",
                cell_errors=[{"label": "layernorm_impl", "error": "ValueError: bad shape"}],
                tests=[TestResult(t.grade_id, t.grade_id, 0.0 if t.grade_id == "layernorm_hard_rows" else t.points,
                                  t.points, t.grade_id != "layernorm_hard_rows", "") for t in tests])
    out = build_notebook(release, path, o)
    nbformat.validate(out)
    code = [c for c in out.cells if c.cell_type == "code"]
    gids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in code]
    assert gids[:3] == ["layernorm_setup", "layernorm_impl", None] and code[2].source == "print('mine')"
    assert code[1].outputs[0].output_type == "error" and code[1].outputs[0].ename == "ValueError"
    hard = code[gids.index("layernorm_hard_rows")]
    assert "missing from the submission" in hard.outputs[0].text and determine_grade(hard)[0] == 0
    assert all(determine_grade(c)[0] == c.metadata.nbgrader.points for c in code
               if is_grade(c) and c.metadata.nbgrader.grade_id != "layernorm_hard_rows")
    assert "<script>" not in json.dumps(out)  # the student's markdown is not carried over
    rendered = markdown2html(out.cells[0].source)
    assert "<img" not in rendered and "&lt;img" in rendered

    path.write_text('{"cells": [')  # cut off
    bad = Outcome("eve", A, notebook=f"{NB}.ipynb", max_score=15.0, status="unreadable",
                  message="the notebook file is not valid JSON",
                  tests=[TestResult(t.grade_id, t.grade_id, 0.0, t.points, False, "unreadable") for t in tests])
    out = build_notebook(release, path, bad)
    answer = next(c for c in out.cells if c.metadata.get("nbgrader", {}).get("solution"))
    assert "NotImplementedError" in answer.source and "could be read" in answer.outputs[0].text
    assert "not valid JSON" in out.cells[0].source


def _visible(page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page))


def test_nbgrader_generate_feedback_and_export_work_after_grading(graded):
    course = graded["course"]
    nbgrader("generate_feedback", A, cwd=course)
    full = max_score()
    for s, score in (("alice", full), ("bob", 0.0)):
        page = (course / "feedback" / s / A / f"{NB}.html").read_text()
        shown = _visible(page)
        assert f"(Score: {score:.1f} / {full:.1f})" in shown, s
        for h in HIDDEN:  # feedback goes to students: no hidden test code in it
            assert h not in page and h not in shown, (s, h)
        assert 'run("layernorm_parameters", globals())' in shown  # visible tests are shown
    assert "passed layernorm_gradients" in _visible((course / "feedback" / "alice" / A / f"{NB}.html").read_text())
    assert "not implemented yet" in _visible((course / "feedback" / "bob" / A / f"{NB}.html").read_text())
    nbgrader("export", "--to=export.csv", cwd=course)
    rows = {r["student_id"]: r for r in csv.DictReader(open(course / "export.csv"))}
    assert sorted(rows) == ["alice", "bob"]
    assert float(rows["alice"]["score"]) == full == float(rows["alice"]["max_score"])
    assert float(rows["bob"]["score"]) == 0.0
    assert rows["bob"]["timestamp"].startswith("2025-03-01 10:30:00")


# ------------------------------------------------------------------------------------------------
# The formgrader in a browser
# ------------------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def formgrader(graded):
    """A Jupyter server with the formgrader on the course; stopped (process group killed) after."""
    course, tmp = graded["course"], graded["tmp"]
    port, token = _free_port(), os.urandom(16).hex()
    env = dict(venv_env(), JUPYTER_CONFIG_DIR=str(tmp / "jupyter-config"),
               JUPYTER_RUNTIME_DIR=str(tmp / "jupyter-runtime"), JUPYTER_DATA_DIR=str(tmp / "jupyter-data"))
    log = open(tmp / "jupyter-server.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "jupyter_server", "--no-browser", "--allow-root",
                             "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
                             f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={course}"],
                            cwd=course, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"jupyter server exited ({proc.returncode}):\n"
                            f"{(tmp / 'jupyter-server.log').read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"jupyter server not up after 90 s:\n{(tmp / 'jupyter-server.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield {"url": url, "token": token}
    finally:
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
            if proc.poll() is not None:
                break
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                pass
        log.close()


@pytest.fixture(scope="module")
def browser():
    driver = chrome(width=1280, height=900)
    try:
        yield driver
    finally:
        driver.quit()


def test_formgrader_in_a_browser_lists_scores_and_takes_manual_grades(graded, formgrader, browser):
    from nbgrader.api import Gradebook
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    url, d = formgrader["url"], browser
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    # Log in with the token (the formgrader's pages call its API with the session cookie).
    d.get(f"{url}/login?next=/formgrader/manage_submissions/{A}")
    d.find_element(By.CSS_SELECTOR, "input[type=password]").send_keys(formgrader["token"])
    d.find_element(By.CSS_SELECTOR, "form").submit()
    WebDriverWait(d, 60).until(lambda d: "bob" in d.find_element(By.ID, "main-table").text
                               and "Loading" not in d.find_element(By.ID, "main-table").text)
    rows = {}
    for tr in d.find_elements(By.CSS_SELECTOR, "#main-table tr"):
        cells = [td.text.strip() for td in tr.find_elements(By.TAG_NAME, "td")]
        rows[cells[1]] = cells
    d.save_screenshot(str(ARTIFACTS / "formgrader_manage_submissions.png"))
    full = f"{max_score():g}"
    assert sorted(rows) == ["alice", "bob"], rows
    assert rows["alice"][3] == "graded" and rows["alice"][4] == f"{full} / {full}", rows["alice"]
    assert rows["bob"][3] == "graded" and rows["bob"][4] == f"0 / {full}", rows["bob"]
    assert rows["bob"][2] == "2025-03-01 10:30:00 UTC"

    # Manual grading: bob's notebook opens; a comment and a manual score are saved.
    api = api_for(graded["course"])
    with Gradebook(api.coursedir.db_url) as gb:
        sub_id = gb.find_submission_notebook(NB, A, "bob").id
    d.get(f"{url}/formgrader/submissions/{sub_id}/?index=0")
    WebDriverWait(d, 60).until(lambda d: d.find_elements(By.ID, "layernorm_impl-comment"))
    page = d.page_source
    for h in HIDDEN:
        assert h not in page
    assert "not implemented yet" in _visible(page)
    comment = d.find_element(By.ID, "layernorm_impl-comment")
    comment.send_keys("Start from the mean over the last dimensions.")
    comment.send_keys(Keys.TAB)
    score = d.find_element(By.ID, "layernorm_parameters")
    score.clear()
    score.send_keys("1")
    score.send_keys(Keys.TAB)

    def saved(_):
        with Gradebook(api.coursedir.db_url) as gb:
            nb = gb.find_submission_notebook(NB, A, "bob")
            c = {x.name: x.manual_comment for x in nb.comments}["layernorm_impl"]
            g = {x.name: x.manual_score for x in nb.grades}["layernorm_parameters"]
        return c == "Start from the mean over the last dimensions." and g == 1.0

    WebDriverWait(d, 30).until(saved)
    d.save_screenshot(str(ARTIFACTS / "formgrader_manual_grading.png"))
    bob = {s["student"]: s for s in api.get_submissions(A)}["bob"]
    assert bob["score"] == 1.0


def test_regrading_keeps_manual_grades_and_takes_a_resubmission(graded):
    """nbgrader's autograde updates a submission: manual scores and comments stay (and the cell is
    marked for review); a newer submission's timestamp makes it autograded again."""
    from nbgrader.api import Gradebook

    course = graded["course"]
    api = api_for(course)
    with Gradebook(api.coursedir.db_url) as gb:
        nb = gb.find_submission_notebook(NB, A, "alice")
        next(g for g in nb.grades if g.name == "layernorm_benchmark").manual_score = 1.0
        next(c for c in nb.comments if c.name == "layernorm_impl").manual_comment = "Tidy."
        gb.db.commit()
    later = "2025-03-02 08:00:00.000000 UTC"
    hand_in(course, "bob", solved_dict(A), later)  # bob hands in again, solved
    assert api.get_autograded_students(A) == {"alice"}  # the formgrader sees bob's is not graded yet
    nbgrader("db", "student", "add", "alice", "--first-name=Alice", "--last-name=Liddell", cwd=course)
    proc = grade(course / "submitted", graded["tmp"] / "out2")
    full = max_score()
    subs = {s["student"]: s for s in api.get_submissions(A)}
    assert sorted(subs) == ["alice", "bob"] and all(s["autograded"] for s in subs.values())
    assert subs["alice"]["score"] == full - 2 + 1 and subs["alice"]["needs_manual_grade"] is True
    assert subs["bob"]["timestamp"] == "2025-03-02T08:00:00"
    with Gradebook(api.coursedir.db_url) as gb:
        nb = gb.find_submission_notebook(NB, A, "alice")
        g = next(g for g in nb.grades if g.name == "layernorm_benchmark")
        assert (g.auto_score, g.manual_score, g.needs_manual_grade) == (2.0, 1.0, True)
        assert next(c for c in nb.comments if c.name == "layernorm_impl").manual_comment == "Tidy."
        assert len(gb.assignment_submissions(A)) == 2
        bob = gb.find_submission_notebook(NB, A, "bob")
        assert {g.name: g.auto_score for g in bob.grades} == {g.name: g.max_score for g in bob.grades}
        assert {c.name: c.auto_comment for c in bob.comments} == {"layernorm_impl": None}
    assert (course / "autograded" / "bob" / A / "timestamp.txt").read_text() == later
    # The kept manual grade is told, not silent: console, grades.csv's review column, report.html.
    assert f"alice / {A} / layernorm_benchmark: manual 1, automatic now 2" in proc.stderr, proc.stderr[-3000:]
    assert "formgrader" in proc.stderr and "manual_score = NULL" in proc.stderr
    rows = {r["student_id"]: r for r in csv.DictReader(open(graded["tmp"] / "out2" / "grades.csv", newline=""))}
    assert "manual grade kept: layernorm_benchmark 1" in rows["alice"]["review"], rows["alice"]
    # bob has a manual grade only when the browser test gave him one (layernorm_parameters): it is listed too
    assert "layernorm_benchmark" not in rows["bob"]["review"], rows["bob"]
    report = (graded["tmp"] / "out2" / "report.html").read_text()
    kept = report[report.index("Manual grades kept"):report.index("At a glance")]
    assert "alice" in kept and "layernorm_benchmark" in kept, kept
    # Names come from the course's gradebook (nbgrader db student add / import), and stay there.
    assert rows["alice"]["student_name"] == "Alice Liddell" and rows["bob"]["student_name"] == ""
    with Gradebook(api.coursedir.db_url) as gb:
        st = gb.find_student("alice")
        assert (st.first_name, st.last_name) == ("Alice", "Liddell")


def test_plain_folders_keep_their_own_gradebook_and_no_course_opts_out(tmp_path, graded):
    """Only a course's own submitted/ folder is written into the course; --no-course grades it like
    any folder (OUT/gradebook.db, as before), and --course refuses another folder."""
    from autograder.nbgrader import course_dir as nbgrader_course

    course = graded["course"]
    plain = tmp_path / "submitted"
    shutil.copytree(course / "submitted" / "bob", plain / "bob")
    assert nbgrader_course.detect(plain) is None  # no nbgrader_config.py beside it
    assert nbgrader_course.detect(course / "submitted") is not None
    assert nbgrader_course.detect(course / "submitted" / "bob") is None
    assert nbgrader_course.detect(course) is None
    before = (course / "gradebook.db").stat().st_mtime_ns, (course / "autograded").stat().st_mtime_ns
    proc = grade(course / "submitted", tmp_path / "out", "--no-course")
    assert "nbgrader course" not in proc.stderr
    assert (tmp_path / "out" / "gradebook.db").is_file()
    bad = subprocess.run([sys.executable, "-m", "autograder", "grade", str(plain), "--out", str(tmp_path / "o2"),
                          "--course", str(course)], capture_output=True, text=True, env=venv_env(),
                         cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and "must be that course's submitted folder" in bad.stderr
    assert ((course / "gradebook.db").stat().st_mtime_ns, (course / "autograded").stat().st_mtime_ns) == before
