"""Grading on a Dask cluster (``python -m autograder grade ... --scheduler``, autograder/cluster.py).

A real ``dask scheduler`` and two ``dask worker`` processes (one thread each, with a nanny that
restarts a killed worker) on loopback grade a small class: the reference, the untouched release,
a cheat (tests/fixtures/hostile/patch_checks.py), a file that is not JSON, and a second assignment
handed in by one student. While it runs, the worker running ``ann``'s notebook is SIGKILLed once
(the notebook is graded again elsewhere) and every worker that runs ``zed``'s notebook is SIGKILLed
(the scheduler runs with allowed-failures 1, so zed's second death ends it: a ``crashed`` row).
Asserted: the rows equal a local run's, zed's row excepted, which says crashed and scores 0.

Also: a client whose course differs from the workers' is refused (before any task, and by each
task), a worker without bubblewrap refuses, sandbox uids never clash across processes, and a
malformed result from a worker becomes an error row, never a grade.
"""
from __future__ import annotations

import copy
import csv
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tools.fixture_class import FIXTURES, read_code_fixture, release_dict, solved_dict, with_code
from course.release import ROOT, venv_env

pytestmark = pytest.mark.autograder
A, B = "01_layernorm", "02_rmsnorm"
COLUMNS = ("student_id", "assignment", "score", "max_score", "status", "tests_passed", "tests_total", "review")


def _put(dest: Path, student: str, assignment: str, content) -> None:
    name, _ = release_dict(assignment)
    d = dest / student / assignment
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(content if isinstance(content, bytes) else json.dumps(content).encode())


def _lingering(nb: dict, seconds: int = 15) -> dict:
    """``nb`` with a last cell of the student's own that sleeps: a correct notebook that is still
    running when the killer looks (a graded notebook otherwise ends in about a second, before a
    kill could land)."""
    nb = copy.deepcopy(nb)
    nb["cells"].append({"cell_type": "code", "id": "linger", "metadata": {}, "execution_count": None,
                        "outputs": [], "source": f"import time\ntime.sleep({seconds})\n"})
    return nb


def _class(dest: Path, doomed: bool) -> Path:
    _, release = release_dict(A)
    cheat = read_code_fixture(FIXTURES / "hostile" / "patch_checks.py")
    _put(dest, "ann", A, _lingering(solved_dict(A)))
    _put(dest, "bob", A, release)
    _put(dest, "bob", B, release_dict(B)[1])
    _put(dest, "cat", A, with_code(copy.deepcopy(release), cheat["code"]))
    _put(dest, "dan", A, b'{"cells": [ this is not json')
    if doomed:
        _put(dest, "zed", A, _lingering(solved_dict(A)))
    return dest


def _dask(*args: str) -> list[str]:
    return [sys.executable, "-m", "dask", *args]


def _grade(src: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autograder", "grade", str(src), "--out", str(out),
                           "--no-progress", *extra], capture_output=True, text=True, cwd=ROOT,
                          env=dict(venv_env(), OMP_NUM_THREADS="1"), timeout=600)


def _rows(out: Path) -> dict:
    return {(r["student_id"], r["assignment"]): {k: r[k] for k in COLUMNS}
            for r in csv.DictReader(open(out / "grades.csv", encoding="utf-8"))}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A scheduler and two workers on 127.0.0.1 (random ports); every process is gone afterwards."""
    from distributed import Client

    tmp = tmp_path_factory.mktemp("cluster")
    env = dict(venv_env(), OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT),
               DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES="1",
               DASK_DISTRIBUTED__SCHEDULER__WORKER_SATURATION="1.0")
    procs = []

    def start(cmd, log):
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=open(tmp / log, "wb"),
                                      stderr=subprocess.STDOUT, start_new_session=True))

    try:
        info = tmp / "scheduler.json"
        start(_dask("scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                    "--scheduler-file", str(info)), "scheduler.log")
        deadline = time.monotonic() + 60
        while not (info.exists() and info.stat().st_size):
            assert time.monotonic() < deadline and procs[0].poll() is None, (tmp / "scheduler.log").read_text()
            time.sleep(0.2)
        address = json.loads(info.read_text())["address"]
        for i in (1, 2):
            start(_dask("worker", address, "--nthreads", "1", "--host", "127.0.0.1", "--no-dashboard",
                        "--memory-limit", "0", "--name", f"w{i}"), f"worker{i}.log")
        with Client(address, set_as_default=False, timeout=30) as c:
            c.wait_for_workers(2, timeout=90)
        yield {"address": address, "tmp": tmp}
    finally:
        for p in reversed(procs):
            with __import__("contextlib").suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


class Killer(threading.Thread):
    """SIGKILLs the worker process that is executing a notebook of ``kills``' students, as many
    times as ``kills`` says (each time on a worker not killed before: the nanny restarts it under a
    new address)."""

    def __init__(self, address: str, kills: dict):
        super().__init__(daemon=True)
        self.address, self.left, self.done, self.stop = address, dict(kills), [], False
        self.errors, self.killed = [], set()

    def run(self):
        from distributed import Client
        try:
            with Client(self.address, set_as_default=False, timeout=30) as c:
                dead = set()
                while not self.stop and any(self.left.values()):
                    for w, keys in c.processing().items():
                        for k in map(str, keys):
                            who = k.rsplit("-", 1)[-1]
                            if w in dead or not k.startswith("autograde-") or self.left.get(who, 0) <= 0:
                                continue
                            try:
                                self._kill_if_running(c, w, k, who)
                            except Exception:  # noqa: BLE001 -- that worker went away meanwhile: look again
                                continue
                            if w in self.killed:
                                dead.add(w)
                    time.sleep(0.1)
        except Exception as e:  # noqa: BLE001 -- reported by the test
            self.errors.append(repr(e))

    def _kill_if_running(self, c, w: str, k: str, who: str) -> None:
        # running there, not just assigned: the worker's own executing set
        running = c.run(lambda dask_worker: [str(t.key) for t in dask_worker.state.executing], workers=[w])
        if k not in running.get(w, []):
            return
        time.sleep(1.0)  # the sandbox is up and the notebook runs
        pid = c.run(os.getpid, workers=[w])[w]
        # only this notebook on it: the kill makes no other task suspicious
        self.done.append((who, w, sorted(map(str, c.processing()[w]))))
        os.kill(pid, signal.SIGKILL)
        self.killed.add(w)
        self.left[who] -= 1


@pytest.fixture(scope="module")
def graded(cluster, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("graded")
    local_src, cluster_src = _class(tmp / "local", doomed=False), _class(tmp / "cluster", doomed=True)
    t0 = time.monotonic()
    local = _grade(local_src, tmp / "out-local", "--jobs", "2")
    t_local = time.monotonic() - t0
    killer = Killer(cluster["address"], {"ann": 1, "zed": 2})
    killer.start()
    t0 = time.monotonic()
    remote = _grade(cluster_src, tmp / "out-cluster", "--scheduler", cluster["address"])
    t_cluster = time.monotonic() - t0
    killer.stop = True
    killer.join(30)
    print(f"local {t_local:.1f} s, cluster {t_cluster:.1f} s, kills {killer.done}")
    return {"local": local, "remote": remote, "killer": killer, "tmp": tmp}


@pytest.mark.slow
def test_cluster_grades_equal_a_local_run_despite_killed_workers(graded):
    assert graded["local"].returncode == 0, graded["local"].stderr[-3000:]
    assert graded["remote"].returncode == 0, graded["remote"].stderr[-3000:]
    k = graded["killer"]
    assert not k.errors, k.errors
    assert sorted(who for who, _, _ in k.done) == ["ann", "zed", "zed"], k.done
    for who, w, keys in k.done:
        assert len(keys) == 1 and keys[0].endswith(f"-{who}"), (w, keys)
    local, remote = _rows(graded["tmp"] / "out-local"), _rows(graded["tmp"] / "out-cluster")
    zed = remote.pop(("zed", A))
    assert remote == local
    # the hidden checks' draws are the client's, made from the run's seed and the submission
    draws = [_draws(graded["tmp"] / d) for d in ("out-local", "out-cluster")]
    draws[1].pop(("zed", A), None)
    assert draws[0] == draws[1] and len(set(draws[0].values())) == len(draws[0]) >= 3, draws
    # the rows say what they should: the reference earns all, the cheat and the broken file nothing
    assert float(local[("ann", A)]["score"]) == float(local[("ann", A)]["max_score"]) > 0
    assert float(local[("cat", A)]["score"]) == 0 and float(local[("bob", A)]["score"]) == 0
    assert "imports coursekit.checks" in remote[("cat", A)]["review"] and local[("ann", A)]["review"] == ""
    assert local[("dan", A)]["status"] == "unreadable"
    # only bob handed in 02: his row, no "not submitted" 02 rows for the others (ingest.class_assignments)
    assert local[("bob", B)]["status"] == "graded" and ("ann", B) not in local and ("zed", B) not in remote
    assert zed["status"] == "crashed" and float(zed["score"]) == 0, zed


@pytest.mark.slow
def test_a_crashed_row_says_the_worker_died(graded):
    rows = {(r["student_id"], r["assignment"]): r for r in
            csv.DictReader(open(graded["tmp"] / "out-cluster" / "grades.csv", encoding="utf-8"))}
    assert "worker died 2 times" in rows[("zed", A)]["message"], rows[("zed", A)]["message"]
    assert (graded["tmp"] / "out-cluster" / "feedback" / "zed").is_dir()
    assert (graded["tmp"] / "out-cluster" / "report.html").is_file()


def _other_course(tmp: Path) -> Path:
    """A copy of the course whose layernorm checks differ by one comment line."""
    root = tmp / "other-course"
    for d in ("coursekit", "course", "exercises"):
        shutil.copytree(ROOT / d, root / d, ignore=shutil.ignore_patterns("__pycache__"))
    with open(root / "coursekit" / "checks" / "layernorm.py", "a") as f:
        f.write("# another version of the checks\n")
    return root


@pytest.mark.slow
def test_workers_with_another_course_refuse_and_nothing_is_written(cluster, tmp_path):
    src = _class(tmp_path / "class", doomed=False)
    proc = _grade(src, tmp_path / "out", "--scheduler", cluster["address"],
                  "--course-root", str(_other_course(tmp_path)))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "has another course installed" in proc.stderr and "course hash" in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "out" / "grades.csv").exists()


@pytest.mark.slow
def test_each_task_carries_the_hash_and_a_worker_refuses_it(cluster, tmp_path, monkeypatch):
    """Workers that join after the client's first check still refuse: skip that check, and the
    tasks themselves come back refused."""
    from autograder import cluster as cl

    monkeypatch.setattr(cl, "_ask_workers", lambda client, want, sandbox, **_: [None])
    src = _class(tmp_path / "class", doomed=False)
    with pytest.raises(cl.ClusterError, match="has another course installed"):
        cl.grade_on_cluster(src, scheduler=cluster["address"], root=_other_course(tmp_path), progress=False)


def test_a_worker_without_bubblewrap_refuses(monkeypatch):
    from autograder import cluster as cl
    from autograder.sandbox import bwrap as sandbox

    monkeypatch.setattr(sandbox, "_checked", {})
    monkeypatch.setattr(sandbox.shutil, "which", lambda name, *a, **k: None)
    want = cl.course_hash()
    why = cl.worker_check(want, sandbox=True)
    assert why and "bubblewrap (bwrap) is not installed" in why, why
    res = cl.grade_task({"course_hash": want, "sandbox": True})
    assert set(res) == {"refused"} and "cannot sandbox submissions" in res["refused"]
    assert cl.worker_check(want, sandbox=False) is None  # --no-sandbox: the instructor's explicit choice


def test_a_wrong_hash_is_refused_by_the_task():
    from autograder import cluster as cl

    res = cl.grade_task({"course_hash": "0" * 64, "sandbox": False})
    assert set(res) == {"refused"} and "has another course installed" in res["refused"]


def test_the_course_hash_covers_checks_notebooks_and_grader(tmp_path):
    from autograder import cluster as cl

    labels = [label for label, _ in cl._course_files(ROOT)]
    assert "coursekit/checks/layernorm.py" in labels and "course/hidden/layernorm.py" in labels
    assert f"exercises/{A}/{release_dict(A)[0]}" in labels and "autograder/cluster.py" in labels
    assert not any("__pycache__" in label or label.startswith("solutions/") for label in labels)
    other = _other_course(tmp_path)
    assert cl.course_hash(other) != cl.course_hash(ROOT)
    (other / "coursekit" / "checks" / "layernorm.py").write_bytes(
        (ROOT / "coursekit" / "checks" / "layernorm.py").read_bytes())
    assert cl.course_hash(other) == cl.course_hash(ROOT)


def test_a_malformed_result_is_never_a_grade():
    from autograder import cluster as cl
    from autograder.grade import Course
    from autograder.intake.ingest import Entry

    course = Course(ROOT)
    e = Entry("ann", A, None)
    good = {"outcome": dataclasses.asdict(cl._zero(e, course, "graded", "0 of 8 tests passed")), "worker": "w"}
    assert cl.outcome_from(copy.deepcopy(good), e, course).score == 0

    def broken(change):
        res = copy.deepcopy(good)
        change(res["outcome"])
        with pytest.raises(cl.BadResult):
            cl.outcome_from(res, e, course)

    broken(lambda o: o["tests"][0].update(points=o["tests"][0]["max_points"]))  # points without a pass
    broken(lambda o: o["tests"][0].update(passed=True))  # a pass without its points
    broken(lambda o: o["tests"].pop())  # a test missing
    broken(lambda o: o.update(score=1.0))  # a score that is not the tests' sum
    broken(lambda o: o.update(student_id="bob"))  # another student's row
    broken(lambda o: o.update(status="excellent"))
    broken(lambda o: o.update(extra=1))
    broken(lambda o: o["tests"][0].update(grade_id="something_else"))
    broken(lambda o: o.update(timings={"run": "slow"}))
    broken(lambda o: o.update(other_assignment="<b>99_nope</b>"))  # not an assignment of the course
    broken(lambda o: o.update(other_assignment=A))  # its own assignment is not another's
    e2 = Entry("ann", A, ROOT / "exercises" / A / "layernorm.ipynb")
    res = copy.deepcopy(good)
    res["outcome"].update(handed_in="submission.ipynb", manual_kept=[{"cell": "x", "manual": 9, "auto": 0}])
    o = cl.outcome_from(res, e2, course)  # the file's name is the client's; kept manual grades are read here
    assert (o.handed_in, o.manual_kept) == ("layernorm.ipynb", [])
    with pytest.raises(cl.BadResult):
        cl.outcome_from({"outcome": good["outcome"]}, e, course)


@pytest.mark.skipif(os.geteuid() != 0, reason="sandbox uids are only used when the grader is root")
def test_sandbox_uids_never_clash_across_processes():
    from autograder.sandbox.bwrap import sandbox_uid

    code = "from autograder.sandbox.bwrap import sandbox_uid\nwith sandbox_uid() as u: print(u)"
    with sandbox_uid() as mine:
        theirs = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                                check=True).stdout.strip()
        assert int(theirs) != mine


#: the fourth trust review's fixtures (issue 24): reaching around the course by aliases, the observers'
#: routes, exercise 05's autograd by other routes and kept copies, exercise 04's layer called unbound,
#: and the honest patterns that must keep full marks unflagged
ROUND4 = {  # one of each route (the whole set is graded locally by tests/test_autograder_hostile.py)
    "01_layernorm": (["alias_sys_releases_guards", "alias_exec_base64", "guards_off_through_aliases"],
                     ["writefile_helper_module", "seeding_and_dtype_by_name"]),
    "04_transformer_block": (["encoder_forward_unbound"], ["modules_by_config_name"]),
    "05_backward": (["forward_ad_by_hand", "autograd_in_a_queue_listener", "numpy_copy_on_ctx"],
                    ["ctx_attribute_rstd"]),
}

def _round4_class(dest: Path) -> Path:
    for a, (hostile, right) in ROUND4.items():
        _, release = release_dict(a)
        _put(dest, "ref", a, solved_dict(a))
        for name in hostile:
            fx = read_code_fixture(FIXTURES / "hostile" / f"{name}.py")
            _put(dest, f"h-{name}", a, with_code(copy.deepcopy(release), fx["code"]))
        for name in right:
            fx = read_code_fixture(FIXTURES / "right" / a / f"{name}.py")
            _put(dest, f"r-{name}", a, with_code(copy.deepcopy(release), fx["code"]))
    return dest


@pytest.mark.slow
def test_the_fourth_reviews_fixtures_keep_their_verdicts_on_the_cluster(cluster, tmp_path):
    """Every fixture of the fourth trust review, graded on the cluster: each attack loses points or
    is flagged, each honest pattern keeps the reference's full marks with nothing flagged, and every
    submission gets a draw of its own for the hidden checks. (That a cluster's rows equal a local
    run's, draws included, is shown on two other classes here; tests/test_autograder_hostile.py
    grades these fixtures locally.)"""
    src = _round4_class(tmp_path / "class")
    remote = _grade(src, tmp_path / "out-cluster", "--scheduler", cluster["address"])
    assert remote.returncode == 0, remote.stderr[-3000:]
    rows = _rows(tmp_path / "out-cluster")
    mine = {k: v for k, v in rows.items() if float(v["max_score"]) > 0 and v["status"] != "missing"}
    assert len(mine) == sum(1 + len(h) + len(r) for h, r in ROUND4.values())
    draws = _draws(tmp_path / "out-cluster")
    assert len(set(draws.values())) == len(draws) == len(mine)  # one draw per submission
    for (student, a), row in mine.items():
        full = float(row["score"]) == float(row["max_score"])
        if student.startswith("h-"):
            assert not full or row["review"], (student, a, row)
        else:
            assert full and row["review"] == "", (student, a, row)


def _draws(out: Path) -> dict:
    """(student, assignment) -> the hidden checks' draw of each graded submission (results.json)."""
    return {(r["student_id"], r["assignment"]): r["hidden_draw"]
            for r in json.loads((out / "results.json").read_text()) if r.get("hidden_draw")}


# -- a grade is a function of the submission: quiet, busy, or on the cluster ----------------------

#: (student, assignment, fixture or None for the reference): honest code that runs near the old
#: time limits (a float64 LayerNorm, noisy ones, a ResidualBlock of separate classes), loops the
#: old limits let through on a quiet machine, and the references
SPEED_CLASS = (
    ("ref1", A, None), ("ref3", "03_residual", None),
    ("f64", A, "right/01_layernorm/float64_inside"), ("noisy1", A, "right/01_layernorm/var_rsqrt_noisy"),
    ("parts", "03_residual", "right/03_residual/separate_classes"),
    ("loop1", A, "wrong/01_layernorm/per_row_loop"), ("loop3", "03_residual", "wrong/03_residual/per_token_python_loop"),
)


def _speed_class(dest: Path) -> Path:
    for student, assignment, fixture in SPEED_CLASS:
        nb = solved_dict(assignment) if fixture is None else \
            with_code(release_dict(assignment)[1], read_code_fixture(FIXTURES / f"{fixture}.py")["code"])
        _put(dest, student, assignment, nb)
    return dest


def _busy(n: int = 2) -> list[subprocess.Popen]:
    """``n`` processes that keep a core each busy (the machine's load, not the submission's)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in range(n)]


def _benchmark_ratios(out: Path) -> dict:
    res = json.loads((out / "results.json").read_text())
    ratios = {}
    for row in res if isinstance(res, list) else res.get("rows", res.get("submissions", [])):
        for t in row.get("tests", []):
            if t.get("grade_id", "").endswith("benchmark") and "ratio" in (t.get("detail") or {}):
                ratios[row.get("student_id")] = t["detail"]["ratio"]
    return ratios


@pytest.mark.slow
def test_the_same_class_gets_the_same_grades_busy_and_quiet_on_the_cluster(cluster, tmp_path):
    """Issue 26: load never flips a point. The same class is graded here with both cores kept busy
    by other processes, and on the Dask cluster with nothing else running: every row is the same,
    the benchmarks included (they are decided by counting work, coursekit.checks.scaling); the
    loops lose their benchmark and the honest code keeps it. The measured ratios, which do move
    with the load, are printed: they are information, not the verdict. (A local run's rows equal a
    cluster's on a quiet machine too: test_cluster_grades_equal_a_local_run_despite_killed_workers.)"""
    src = _speed_class(tmp_path / "class")
    runs = {}
    hogs = _busy(2)
    try:
        busy = _grade(src, tmp_path / "busy", "--jobs", "2")
    finally:
        for p in hogs:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    assert busy.returncode == 0, busy.stderr[-3000:]
    runs["busy"] = _rows(tmp_path / "busy")
    remote = _grade(src, tmp_path / "cluster", "--scheduler", cluster["address"])
    assert remote.returncode == 0, remote.stderr[-3000:]
    runs["cluster"] = _rows(tmp_path / "cluster")
    for name in ("busy", "cluster"):
        print(name, {s: r for s, r in sorted(_benchmark_ratios(tmp_path / name).items())})
    assert runs["cluster"] == runs["busy"]
    rows = runs["cluster"]
    for student, assignment, fixture in SPEED_CLASS:
        r = rows[(student, assignment)]
        full = float(r["score"]) == float(r["max_score"]) > 0
        assert full is not student.startswith("loop"), (student, r)
        assert r["review"] == "", (student, r["review"])
