"""The course autograder against a class of hostile and broken submissions, graded in ONE run of
``python -m autograder grade`` (tests/fixtures/hostile/, tests/fixtures/broken/).

Asserted: no undeserved points; a row for every submission; correct-but-odd files earn what the
reference earns; nothing written outside the sandbox; no process left behind; no network
connection reached the grader's machine; the gradebook says what grades.csv says.
"""
from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

from tools.fixture_class import build
from course.release import ROOT, venv_env

pytestmark = pytest.mark.autograder
ASSIGNMENT = "01_layernorm"


class Listener:
    """A TCP server on 127.0.0.1 that records every connection it accepts."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = []
        self.stop = False
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self):
        while not self.stop:
            try:
                conn, addr = self.sock.accept()
                self.connections.append(addr)
                conn.close()
            except OSError:
                continue

    def close(self):
        self.stop = True
        self.thread.join(2)
        self.sock.close()


def _processes_with(marker: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if marker in cmd and "pytest" not in cmd:
                found.append(f"{pid}: {cmd}")
    return found


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hostile_class")
    marker = f"AGMARK{uuid.uuid4().hex[:10]}"
    out = tmp / "out"
    listener = Listener()
    try:
        cases = build(tmp / "submitted", assignment=ASSIGNMENT,
                      placeholders={"__MARKER__": marker, "__PORT__": str(listener.port), "__OUTDIR__": str(out)})
        env = dict(venv_env(), OMP_NUM_THREADS="1")
        proc = subprocess.run([sys.executable, "-m", "autograder", "grade", str(tmp / "submitted"), "--out", str(out),
                               "--jobs", "2", "--timeout", "60", "--cell-timeout", "30", "--no-progress"],
                              capture_output=True, text=True, env=env, cwd=tmp)
        time.sleep(0.5)
    finally:
        listener.close()
    rows = {r["student_id"]: r for r in csv.DictReader(open(out / "grades.csv"))} if (out / "grades.csv").exists() else {}
    results = {r["student_id"]: r for r in json.loads((out / "results.json").read_text())} if rows else {}
    return {"proc": proc, "cases": cases, "rows": rows, "results": results, "out": out, "marker": marker,
            "listener": listener, "tmp": tmp}


def test_run_finishes_with_exit_0(graded):
    assert graded["proc"].returncode == 0, graded["proc"].stderr[-3000:]


def test_every_submission_has_a_row(graded):
    missing = [c.student for c in graded["cases"] if c.student not in graded["rows"]]
    assert not missing, missing
    for r in graded["rows"].values():
        assert r["max_score"] == graded["rows"]["solution"]["max_score"], r  # points come from the release


def test_no_undeserved_points(graded):
    """Every attack loses what it must, or (where it reaches around the course, so that its probes
    cannot be trusted to see what it did) its row is flagged for review naming what it did."""
    rows, res = graded["rows"], graded["results"]
    for c in graded["cases"]:
        tests = {t["grade_id"]: t for t in res[c.student]["tests"]}
        if c.review:
            assert c.review in rows[c.student]["review"], f"{c.student} ({c.summary}) not flagged: {rows[c.student]}"
        elif c.loses == "all":
            assert float(rows[c.student]["score"]) == 0, f"{c.student} ({c.summary}) scored {rows[c.student]['score']}"
        elif c.loses != "none":
            for gid in c.loses:
                assert tests[gid]["points"] == 0, f"{c.student} ({c.summary}) earned {gid}"


def test_odd_but_correct_files_earn_what_the_reference_earns(graded):
    rows = graded["rows"]
    ref = float(rows["solution"]["score"])
    assert ref > 0
    for c in graded["cases"]:
        if c.loses == "none":
            assert float(rows[c.student]["score"]) == ref, (c.student, rows[c.student])


def test_broken_files_say_what_was_wrong(graded):
    rows = graded["rows"]
    for c in graded["cases"]:
        if c.kind == "broken":
            assert rows[c.student]["message"], c.student
    assert "valid JSON" in rows["broken-invalid_json"]["message"]
    assert "empty" in rows["broken-empty_file"]["message"]
    assert "cut off" in rows["broken-truncated"]["message"]
    assert "missing" in rows["broken-missing_notebook"]["message"]
    assert "v3" in rows["broken-v3_format"]["message"]
    assert "kernel" in rows["broken-wrong_kernelspec"]["message"]
    assert "my_homework" in rows["broken-renamed_notebook"]["message"]
    assert rows["broken-deep_json"]["status"] == "unreadable" and "nests too deep" in rows["broken-deep_json"]["message"]
    assert "cell you added 1 did not run: its code nests more than 150 levels deep" in \
        rows["broken-deep_expression"]["message"]
    assert rows["hostile-crash_interpreter"]["status"] == "crashed"


def test_honest_work_is_not_flagged_and_writefile_modules_and_star_imports_run(graded):
    """Every right fixture keeps full marks with an empty review column; the %%writefile module the
    answer imports ran (no note says it did not), and so did the star import the answer needs."""
    rows = graded["rows"]
    right = [c.student for c in graded["cases"] if c.kind == "right"]
    assert {"right-writefile_helper_module", "right-star_import_math"} <= set(right)
    for sid in right:
        assert float(rows[sid]["score"]) == float(rows[sid]["max_score"]) > 0, (sid, rows[sid]["message"])
        assert rows[sid]["review"] == "", (sid, rows[sid]["review"])
        assert "did not run" not in rows[sid]["message"], (sid, rows[sid]["message"])


def test_builtin_norm_is_named_in_the_feedback(graded):
    tests = {t["grade_id"]: t for t in graded["results"]["hostile-builtin_layernorm"]["tests"]}
    assert "layer_norm" in tests["layernorm_matches_torch"]["message"]
    tests = {t["grade_id"]: t for t in graded["results"]["hostile-builtin_obfuscated"]["tests"]}
    assert "layer_norm is switched off" in tests["layernorm_matches_torch"]["message"]  # the probe saw it
    assert "computed name" in graded["rows"]["hostile-builtin_obfuscated"]["review"]


def test_a_forged_finish_is_a_crash_and_no_grader_note_comes_from_the_submission(graded):
    """Frames written out of turn stop the conversation: the row says the notebook did not finish,
    and nothing the submission printed or wrote appears as the grader's own words."""
    row = graded["rows"]["hostile-forge_progress"]
    assert row["status"] == "crashed" and "out of turn" in row["message"], row
    assert "NOTE FROM THE GRADER" not in row["message"]
    page = (graded["out"] / "feedback" / "hostile-forge_progress" / ASSIGNMENT / "layernorm.html").read_text()
    assert "NOTE FROM THE GRADER" not in page


def test_an_oversized_message_is_refused_from_its_header(graded):
    row = graded["rows"]["hostile-oversized_record"]
    assert row["status"] == "crashed" and "oversized" in row["message"], row


def test_filling_the_sandbox_disk_is_reported_on_the_row(graded):
    row = graded["rows"]["hostile-fill_disk"]
    assert "filled the sandbox's writable space" in row["message"], row


def test_the_benchmark_times_the_class_the_tests_checked(graded):
    tests = {t["grade_id"]: t for t in graded["results"]["tamper-redefined_before_benchmark"]["tests"]}
    assert all(t["passed"] for gid, t in tests.items() if gid != "layernorm_benchmark"), tests
    assert not tests["layernorm_benchmark"]["passed"]
    assert tests["layernorm_benchmark"]["detail"]["ratio"] > tests["layernorm_benchmark"]["detail"]["typical"]


def test_nothing_planted_in_the_graders_python_or_course(graded):
    import site
    marker = graded["marker"]
    assert not Path(site.getsitepackages()[0], f"{marker}.pth").exists()
    assert not (ROOT / "course" / f"{marker}.py").exists()
    assert not Path("/tmp", marker).exists()


def test_nothing_written_outside_the_sandbox(graded):
    marker = graded["marker"]
    places = [ROOT, ROOT / "course", ROOT / "coursekit", ROOT / "coursekit" / "checks", Path("/tmp"), Path.home(), graded["out"],
              graded["tmp"]]
    leaked = [str(p / marker) for p in places if (p / marker).exists()]
    assert not leaked, leaked
    assert "pwned" not in (ROOT / "coursekit" / "checks" / "__init__.py").read_text()
    assert "pwned" not in (graded["out"] / "grades.csv").read_text()
    assert not (ROOT / "gradebook.db").exists() or b"pwned" not in (ROOT / "gradebook.db").read_bytes()[-64:]


def test_no_process_left_behind(graded):
    assert not _processes_with(graded["marker"])


def test_no_network_connection_reached_the_host(graded):
    assert graded["listener"].connections == []


def test_feedback_and_report_are_self_contained(graded):
    out = graded["out"]
    report = (out / "report.html").read_text()
    assert "data:image/png;base64," in report
    assert "http://" not in report and "https://" not in report and "<script" not in report
    page = (out / "feedback" / "stub" / ASSIGNMENT / "layernorm.html").read_text()
    assert "NotImplementedError" in page
    assert "### BEGIN HIDDEN TESTS" not in page and 'run("' not in page


def test_gradebook_export_matches_grades_csv(graded, tmp_path):
    """`nbgrader export` against the written gradebook gives the scores of grades.csv."""
    course = tmp_path / "course"
    course.mkdir()
    (course / "nbgrader_config.py").write_text((ROOT / "nbgrader_config.py").read_text())
    db = graded["out"] / "gradebook.db"
    proc = subprocess.run([sys.executable, "-m", "nbgrader", "export", f"--db=sqlite:///{db}", "--to", "export.csv"],
                          cwd=course, capture_output=True, text=True, env=venv_env())
    assert proc.returncode == 0, proc.stderr
    exported = {(r["student_id"], r["assignment"]): float(r["raw_score"])
                for r in csv.DictReader(open(course / "export.csv"))}
    for sid, r in graded["rows"].items():
        if r["assignment"] == ASSIGNMENT:
            assert exported[(sid, ASSIGNMENT)] == float(r["score"]), sid


CLOCK_CHEATS = ("patch_clock", "cache_outputs")


def test_benchmark_is_decided_by_counting_work_and_timed_by_the_graders_clock(graded):
    """A per-row loop that patches the clocks, or caches outputs by input, loses the benchmark: the
    count of its work grows with the rows (no clock is read for the verdict); the reference keeps it.
    The times shown come from the grader's own clock, and show the loops as slow."""
    res = graded["results"]
    bench = lambda sid: next(t for t in res[sid]["tests"] if t["grade_id"] == "layernorm_benchmark")  # noqa: E731
    ok = bench("solution")
    assert ok["passed"] and "timed by the grader" in ok["detail"]["report"], ok
    assert "work per call, counted" in ok["detail"]["report"], ok
    for name in CLOCK_CHEATS:
        t = bench(f"hostile-{name}")
        assert not t["passed"] and t["points"] == 0, (name, t)
        if "grading machinery" in t["message"]:  # patch_clock patches coursekit.bench: nothing of it counts
            continue
        assert "more work per call as the number of rows grows" in t["message"], (name, t["message"])
    t = bench("hostile-cache_outputs")
    assert "Python loop" in t["message"], t["message"]  # fresh inputs: the cache never hits
    assert t["detail"]["ratio"] > t["detail"]["typical"], t["detail"]  # and the grader's clock shows it slow


def test_code_that_reaches_into_the_grading_machinery_is_flagged_with_its_lines(graded):
    """Swapping a probe for the judge's own answer, switching the recorder and the kernel block off
    through the checks' modules, swapping the served benchmark's builder: each row asks a person to
    look, naming the cell and line that reaches into the course's checks."""
    for name in ("swap_probe_for_judges_answer", "recorder_off_via_module", "served_build_swap"):
        row = graded["rows"][f"hostile-{name}"]
        assert "coursekit.checks" in row["review"] and "(answer cell layernorm_impl, line " in row["review"], row
    assert graded["rows"]["solution"]["review"] == ""


def test_rows_that_need_review_are_flagged_in_the_gradebook(graded):
    """The formgrader shows nbgrader's flag on every notebook whose row has a review reason, and
    on no other."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{graded['out'] / 'gradebook.db'}") as gb:
        for sid, row in graded["rows"].items():
            if row["assignment"] == ASSIGNMENT and row["status"] not in ("missing", "unknown-assignment"):
                nb = gb.find_submission_notebook("layernorm", ASSIGNMENT, sid)
                assert nb.flagged is bool(row["review"]), (sid, row["review"])
    assert graded["rows"]["hostile-swap_probe_for_judges_answer"]["review"]


def test_ipython_magics_at_the_top_of_an_answer_are_honest(graded):
    row = graded["rows"]["hostile-matplotlib_magic_honest"]
    assert float(row["score"]) == float(graded["rows"]["solution"]["score"]), row


@pytest.mark.parametrize("name", CLOCK_CHEATS)
def test_clock_cheats_fool_not_even_the_in_process_benchmark(name):
    """The fixtures are real attacks on a benchmark judged by time: they patch the clocks the
    notebook's own benchmark reads (in the student's process, as with stock nbgrader), or cache
    outputs. Judged by counting work instead, they lose it there too. Run in a subprocess: the
    fixture patches the clocks. Three timed rounds instead of 21: a per-row loop's rounds take
    seconds each, and the times no longer decide."""
    code = f"""
import sys
sys.path.insert(0, {str(ROOT / 'tests')!r})
from pathlib import Path
from coursekit.checks import benchmark as bm
bm.REPEAT, bm.ROUNDS = 3, (3,)
from notebook_ns import code_ns, outcome
ns = code_ns("01_layernorm", Path({str(ROOT / 'tests' / 'fixtures' / 'hostile' / (name + '.py'))!r}).read_text())
print("RESULT", outcome("layernorm_benchmark", ns) or "passed")
"""
    env = dict(venv_env(), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert "RESULT" in proc.stdout and "more work per call as the number of rows grows" in proc.stdout, \
        proc.stdout[-2000:] + proc.stderr[-2000:]


def test_the_observers_name_what_they_saw(graded):
    """The observers inside the sandbox (autograder/inside/observers.py): a spy swapped through
    aliases (and the sealed kernel block released, to no effect), found before the probe, and an audit event during the probe (the
    student's sys._getframe) cost the tests, each message naming what was seen; honest rows
    (torch.compile among them) carry no audit event."""
    res, rows = graded["results"], graded["rows"]
    msgs = [t["message"] for t in res["hostile-guards_off_through_aliases"]["tests"]]
    # the block on torch's kernels is sealed in the sandbox: releasing it changes nothing (the kernel
    # still raises, which the probe reports too); replacing the recorder is seen
    assert all("OpRecorder was replaced" in m for m in msgs), msgs
    tests = {t["grade_id"]: t for t in res["hostile-frames_during_probe"]["tests"]}
    assert "sys._getframe" in tests["layernorm_matches_torch"]["message"], tests["layernorm_matches_torch"]
    for sid, row in rows.items():
        if sid.startswith("right-") or sid == "solution":
            assert "audit event" not in row["review"], (sid, row["review"])
