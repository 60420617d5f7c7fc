"""Reading what the instructor hands the grader, when it is odd: LMS zips with entries that cannot
be files here, student ids that are not ASCII, empty input, a single notebook; and grades.csv
never holding a cell a spreadsheet would run as a formula.

The runs through ``python -m autograder grade`` grade copies of the released notebook (every test
fails: fast) and, where two students must be told apart by their scores, the reference answers.
"""
from __future__ import annotations

import csv
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tools.fixture_class import release_dict, solved_dict
from autograder.intake.ingest import Catalog, discover
from course.release import ROOT, venv_env

pytestmark = pytest.mark.autograder
A = "01_layernorm"
CAT = Catalog(ROOT / "exercises")
NAME, RELEASE = release_dict(A)
STUB = json.dumps(RELEASE).encode()  # the untouched release: graded, every test fails
SOLVED = json.dumps(solved_dict(A)).encode()  # full marks
FORMULA = ("=", "+", "-", "@", "\t", "\r")
TEXT_COLUMNS = ("student_id", "assignment", "status", "message", "student_name", "notebook")


def _grade(src: Path, out: Path) -> tuple[subprocess.CompletedProcess, list[dict]]:
    env = dict(venv_env(), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-m", "autograder", "grade", str(src), "--out", str(out),
                           "--jobs", "2", "--no-progress"], capture_output=True, text=True, env=env, cwd=ROOT)
    rows = list(csv.DictReader(open(out / "grades.csv", newline=""))) if (out / "grades.csv").exists() else []
    return proc, rows


def _zip(path: Path, files: dict) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def _by(entries):
    return {(e.student_id, e.assignment): e for e in entries}


# --- 1. zip entries that cannot be files here --------------------------------------------------

def test_zip_entry_that_is_a_file_and_a_folder_is_skipped_with_a_note_on_its_students_row(tmp_path):
    z = _zip(tmp_path / "class.zip", {
        f"ann/{A}/{NAME}": STUB,
        f"ann/{A}/{NAME}/x": b"a file inside the notebook 'folder'",
        f"bob/{A}/{NAME}": STUB,
        "cat": b"a file ...",
        f"cat/{A}/{NAME}": STUB,  # ... and a folder of the same name
        f"dan/{A}/{NAME}": STUB,
        "dan": b"a file named like the folder that came first",
    })
    e = _by(discover(z, CAT, tmp_path / "scratch"))
    assert e[("ann", A)].path is not None and e[("bob", A)].path is not None and e[("dan", A)].path is not None
    assert any(f"ann/{A}/{NAME}/x: skipped" in n for n in e[("ann", A)].notes), e[("ann", A)].notes
    assert any(n.startswith(f"cat/{A}/{NAME}: skipped") for n in e[("cat", A)].notes)
    assert e[("cat", A)].path is None  # its notebook could not be extracted: a row that says why
    assert any(n.startswith("dan: skipped") for n in e[("dan", A)].notes)
    assert not e[("bob", A)].notes


def test_zip_entry_with_a_name_over_255_bytes_is_skipped_with_a_note(tmp_path):
    long = "x" * 250
    z = _zip(tmp_path / "canvas.zip", {
        f"ann_11_1_{long}_layernorm.ipynb": STUB,  # Canvas prefixed its parts to a long original name
        f"ann_11_2_{NAME}": STUB,
        f"bob_22_3_{NAME}": STUB,
        f"{'é' * 130}.ipynb": STUB,  # 260 bytes, whose is it? nobody can tell
    })
    e = _by(discover(z, CAT, tmp_path / "scratch"))
    assert e[("11", A)].path.name == f"ann_11_2_{NAME}"
    assert any("skipped" in n and "255 bytes" in n for n in e[("11", A)].notes), e[("11", A)].notes
    assert not e[("22", A)].notes
    unknown = [x for x in e.values() if x.student_id == "unknown"]
    assert len(unknown) == 1 and "255 bytes" in unknown[0].notes[0]


def test_zip_with_unextractable_entries_still_grades_the_class_and_writes_grades_csv(tmp_path):
    """The broken entries only cost their own files: the class is graded, grades.csv written."""
    z = _zip(tmp_path / "canvas.zip", {
        f"ann_33_1_{NAME}": STUB,
        f"ann_33_1_{NAME}/x": STUB,  # a file/folder clash
        f"bob_22_3_{'y' * 250}.ipynb": STUB,  # over 255 bytes
        f"bob_22_4_{NAME}": STUB,
        f"cat_44_5_{NAME}": STUB,
    })
    proc, rows = _grade(z, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-3000:]
    by = {r["student_id"]: r for r in rows}
    assert sorted(by) == ["22", "33", "44"], rows
    assert by["33"]["status"] == "graded" and "skipped" in by["33"]["message"], by["33"]
    assert by["22"]["status"] == "graded" and "255 bytes" in by["22"]["message"], by["22"]
    assert by["44"]["status"] == "graded" and "skipped" not in by["44"]["message"]


# --- 2. CSV cells -------------------------------------------------------------------------------

def test_grades_csv_never_holds_a_formula_from_a_student_name_or_file_name(tmp_path):
    """Canvas and Moodle names and an unrecognised upload's file name reach grades.csv: a text cell
    that starts like a formula gets a leading quote; scores stay numbers."""
    z = _zip(tmp_path / "canvas.zip", {
        f"=cmd|' -C calc'!A0_33_1_{NAME}": STUB,  # Canvas: the name part is a formula
        "@SUM(1+1)*cmd.ipynb": STUB,  # nobody can be told from it: its name lands in a message
        f"-2+3_44_assignsubmission_file_/{NAME}": STUB,  # Moodle, a name starting with '-'
    })
    proc, rows = _grade(z, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-3000:]
    by = {r["student_id"]: r for r in rows}
    assert by["33"]["student_name"] == "'=cmd|' -C calc'!A0" and by["33"]["status"] == "graded"
    assert by["44"]["student_name"] == "'-2+3"
    unknown = next(r for r in rows if r["assignment"] == "(unknown)")
    assert unknown["message"].startswith("'@SUM(1+1)*cmd.ipynb"), unknown
    for r in rows:
        for c in TEXT_COLUMNS:
            assert not r[c].startswith(FORMULA), (c, r[c])
        float(r["score"]), float(r["max_score"]), int(r["tests_total"])  # numbers stay numbers
    assert float(by["33"]["max_score"]) > 0


def test_csv_text_cells_never_start_like_a_formula_and_scores_stay_numbers(tmp_path):
    from autograder.grade import Outcome, TestResult
    from autograder.report.results import write_csv

    evil = ["=1+1", "+1", "-1", "@A1", "\t=1", "\r=1", "=cmd|' -C calc'!A0"]
    outs = [Outcome(s, "01_layernorm", student_name=s, message=s, notebook="x.ipynb", score=3.0, max_score=15.0,
                    tests=[TestResult("t", "d", 3.0, 3.0, True)]) for s in evil]
    write_csv(outs, tmp_path / "g.csv")
    rows = list(csv.DictReader(open(tmp_path / "g.csv", newline="")))
    assert [r["student_id"] for r in rows] == ["'" + s for s in evil]
    assert all(r["student_name"] == r["message"] == r["student_id"] for r in rows)
    assert all(r["score"] == "3" and r["max_score"] == "15" and r["tests_passed"] == "1" for r in rows)


# --- 3. student ids -----------------------------------------------------------------------------

def test_unicode_student_folders_keep_their_ids_and_never_share_a_row(tmp_path):
    """zoë/zoé and 王芳/李娜 used to become 'zo' and 'unnamed' twice, one row replacing the other."""
    cls = tmp_path / "submitted"
    for student, nb in [("zoë", SOLVED), ("zoé", STUB), ("王芳", SOLVED), ("李娜", STUB)]:
        (cls / student / A).mkdir(parents=True)
        (cls / student / A / NAME).write_bytes(nb)
    proc, rows = _grade(cls, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-3000:]
    by = {r["student_id"]: r for r in rows}
    assert sorted(by) == sorted(["zoë", "zoé", "王芳", "李娜"]), rows
    assert float(by["zoë"]["score"]) == float(by["zoë"]["max_score"]) > 0, by["zoë"]
    assert float(by["王芳"]["score"]) == float(by["王芳"]["max_score"]) > 0, by["王芳"]
    assert float(by["zoé"]["score"]) == 0 and float(by["李娜"]["score"]) == 0
    for s in by:  # each student's own feedback page
        assert (tmp_path / "out" / "feedback" / s / A / (Path(NAME).stem + ".html")).is_file()


def test_ids_that_still_clash_get_a_suffix_and_a_note(tmp_path):
    """A folder called 'unknown' next to a notebook nobody can be told from; two student folders
    in a zip whose names agree on their first 255 bytes (an id is cut there): never one row for two."""
    for s in ("unknown", "ann"):
        (tmp_path / "c" / s / A).mkdir(parents=True)
        (tmp_path / "c" / s / A / NAME).write_bytes(STUB)
    (tmp_path / "c" / "stray.ipynb").write_bytes(STUB)
    entries = discover(tmp_path / "c", CAT, tmp_path / "scratch")
    assert sorted(e.student_id for e in entries) == ["ann", "unknown", "unknown-2"]
    assert next(e for e in entries if e.student_id == "unknown").path is not None

    a, b = "é" * 140 + "a", "é" * 140 + "b"  # 281 bytes: both cut to the same 254
    z = _zip(tmp_path / "class.zip", {f"{a}/{A}/{NAME}": STUB, f"{b}/{A}/{NAME}": STUB, f"ann/{A}/{NAME}": STUB})
    entries = discover(z, CAT, tmp_path / "scratch2")
    ids = [e.student_id for e in entries if e.student_id != "ann"]
    assert sorted(ids) == ["é" * 126 + "-2", "é" * 127], ids
    assert all(any("skipped" in n for n in e.notes) for e in entries if e.student_id != "ann")
    assert any("graded as student" in n for e in entries for n in e.notes)


# --- 5. empty input, a single notebook ---------------------------------------------------------

def test_empty_folder_is_refused_naming_it_and_the_layouts(tmp_path, capsys):
    from autograder.__main__ import main
    (tmp_path / "empty").mkdir()
    assert main(["grade", str(tmp_path / "empty"), "--out", str(tmp_path / "o"), "--no-sandbox"]) == 2
    err = capsys.readouterr().err
    assert f"no submissions found in {tmp_path / 'empty'}" in err
    assert "<student_id>/<assignment>/<notebook>.ipynb" in err and "Canvas" in err and "Moodle" in err
    assert not (tmp_path / "o" / "grades.csv").exists()


def test_empty_zip_is_refused_as_empty(tmp_path, capsys):
    from autograder.__main__ import main
    z = _zip(tmp_path / "class.zip", {})
    assert main(["grade", str(z), "--out", str(tmp_path / "o"), "--no-sandbox"]) == 2
    err = capsys.readouterr().err
    assert f"{z} is empty" in err and "autograde-" not in err, err


def test_single_canvas_notebook_is_graded_as_one_students_submission(tmp_path):
    f = tmp_path / f"doe_123_456_{NAME}"
    f.write_bytes(STUB)
    proc, rows = _grade(f, tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [(r["student_id"], r["assignment"], r["student_name"], r["status"]) for r in rows] == \
        [("123", A, "doe", "graded")]


def test_single_notebook_takes_its_stem_as_student_id_and_is_matched_by_name_or_cells(tmp_path):
    (tmp_path / NAME).write_bytes(STUB)
    (tmp_path / "my homework.ipynb").write_bytes(STUB)
    (tmp_path / "notes.ipynb").write_bytes(b'{"cells": [], "metadata": {}}')
    assert [(e.student_id, e.assignment) for e in discover(tmp_path / NAME, CAT, tmp_path / "s")] == \
        [(Path(NAME).stem, A)]
    [e] = discover(tmp_path / "my homework.ipynb", CAT, tmp_path / "s")
    assert (e.student_id, e.assignment) == ("my homework", A) and "recognised by its cells" in e.notes[0]
    [e] = discover(tmp_path / "notes.ipynb", CAT, tmp_path / "s")
    assert (e.student_id, e.assignment, e.path) == ("notes", "(unknown)", None)


# --- 3. several notebooks in one assignment folder ------------------------------------------------

def _folder_class(root: Path) -> Path:
    """ann: the solution as layernorm-Copy1.ipynb, a newer cell-less Untitled.ipynb and a newer
    0-byte empty.ipynb; bob: a 0-byte empty.ipynb next to an older copy of the release;
    cat: the release as layernorm.ipynb and her answers in a copy."""
    import os
    import time

    def put(rel: str, data: bytes, age: float) -> None:
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(data)
        t = time.time() - age
        os.utime(f, (t, t))

    put(f"ann/{A}/layernorm-Copy1.ipynb", SOLVED, 300)
    put(f"ann/{A}/Untitled.ipynb", b'{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}', 200)
    put(f"ann/{A}/empty.ipynb", b"", 100)
    put(f"bob/{A}/layernorm (1).ipynb", STUB, 300)
    put(f"bob/{A}/empty.ipynb", b"", 100)
    put(f"cat/{A}/{NAME}", STUB, 100)
    put(f"cat/{A}/layernorm-Copy1.ipynb", SOLVED, 300)
    return root


def test_a_folder_of_several_notebooks_grades_the_one_holding_this_assignments_answers(tmp_path):
    """Content first (the assignment's cells, with answers), then the name, then the time: a newer
    cell-less or empty file never beats the student's work, and the notes name what was ignored."""
    e = _by(discover(_folder_class(tmp_path / "class"), CAT, tmp_path / "s"))
    ann, bob, cat = e[("ann", A)], e[("bob", A)], e[("cat", A)]
    assert ann.path.name == "layernorm-Copy1.ipynb", ann.notes
    assert any("graded layernorm-Copy1.ipynb instead" in n for n in ann.notes), ann.notes
    assert any("not graded: Untitled.ipynb (no cells of 01_layernorm), empty.ipynb (not a readable notebook)"
               in n for n in ann.notes), ann.notes
    assert bob.path.name == "layernorm (1).ipynb", bob.notes
    assert any("empty.ipynb (not a readable notebook)" in n for n in bob.notes), bob.notes
    assert cat.path.name == "layernorm-Copy1.ipynb", cat.notes
    assert any(f"not graded: {NAME} (no answers written)" in n for n in cat.notes), cat.notes


def test_grades_csv_says_which_file_was_graded_and_which_were_not(tmp_path):
    proc, rows = _grade(_folder_class(tmp_path / "class"), tmp_path / "out")
    assert proc.returncode == 0, proc.stderr[-3000:]
    by = {r["student_id"]: r for r in rows}
    from autograder.grade import Course
    from course.release import ROOT
    full = f"{sum(t.points for t in Course(ROOT).tests('01_layernorm')):g}"  # the release's points, however many
    assert (by["ann"]["status"], by["ann"]["score"], by["ann"]["max_score"]) == ("graded", full, full), by["ann"]
    assert by["cat"]["score"] == full, by["cat"]
    for s in ("ann", "bob"):
        assert "empty.ipynb (not a readable notebook)" in by[s]["message"], by[s]
    assert "graded layernorm-Copy1.ipynb" in by["ann"]["message"] and "Untitled.ipynb" in by["ann"]["message"]
    assert by["bob"]["status"] == "graded" and "graded layernorm (1).ipynb" in by["bob"]["message"], by["bob"]


def test_an_empty_later_lms_resubmission_never_replaces_a_readable_one(tmp_path):
    """Canvas: -1 is the solution, -2 (later) a 0-byte upload: -1 is graded, and the row says why;
    a readable later resubmission still wins."""
    z = _zip(tmp_path / "canvas.zip", {
        "ann_11_1_layernorm-1.ipynb": SOLVED,
        "ann_11_2_layernorm-2.ipynb": b"",
        "bob_22_3_layernorm-1.ipynb": SOLVED,
        "bob_22_4_layernorm-2.ipynb": STUB,
    })
    e = _by(discover(z, CAT, tmp_path / "s"))
    assert e[("11", A)].path.name == "ann_11_1_layernorm-1.ipynb", e[("11", A)].notes
    assert any("the later ann_11_2_layernorm-2.ipynb is not a readable notebook" in n for n in e[("11", A)].notes)
    assert e[("22", A)].path.name == "bob_22_4_layernorm-2.ipynb"
    assert any(n.startswith("resubmitted: graded bob_22_4") for n in e[("22", A)].notes), e[("22", A)].notes


# --- 4. students whose download holds no notebook of the assignment --------------------------------

B = "02_rmsnorm"
NAME_B, RELEASE_B = release_dict(B)
STUB_B = json.dumps(RELEASE_B).encode()


class _NoUtf8Flag(zipfile.ZipInfo):
    """An entry whose name is stored as UTF-8 bytes without the UTF-8 flag (Windows' Send to
    compressed folder, some LMS exports): zipfile alone reads it as cp437."""

    def _encodeFilenameFlags(self):
        return self.filename.encode("utf-8"), self.flag_bits & ~0x800


def _canvas_class(path: Path) -> Path:
    """A Canvas download of 6 students: ann, bob, cat hand in 01; dan only notes.txt; eve only
    02's notebook (a stray); zoë 01, her name stored without the UTF-8 flag."""
    with zipfile.ZipFile(path, "w") as zf:
        for s, i in (("ann", 11), ("bob", 22), ("cat", 33)):
            zf.writestr(f"{s}_{i}_{i}0_{NAME}", STUB)
        zf.writestr("dan_44_440_notes.txt", b"I could not finish")
        zf.writestr(f"eve_55_550_{NAME_B}", STUB_B)
        zf.writestr(_NoUtf8Flag(f"zoë_66_660_{NAME}"), STUB)
    return path


@pytest.fixture(scope="module")
def canvas_graded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("nonb")
    proc, rows = _grade(_canvas_class(tmp / "canvas.zip"), tmp / "out")
    return {"proc": proc, "rows": {(r["student_id"], r["assignment"]): r for r in rows},
            "report": (tmp / "out" / "report.html").read_text() if (tmp / "out" / "report.html").exists() else ""}


def test_a_canvas_student_who_handed_in_only_a_text_file_gets_a_no_notebook_row_naming_it(canvas_graded):
    assert canvas_graded["proc"].returncode == 0, canvas_graded["proc"].stderr[-3000:]
    dan = canvas_graded["rows"].get(("44", A))
    assert dan is not None, sorted(canvas_graded["rows"])
    assert (dan["status"], dan["student_name"], dan["score"]) == ("no-notebook", "dan", "0"), dan
    assert "notes.txt" in dan["message"], dan
    assert "<td>4 / 6</td>" in canvas_graded["report"]  # every student counted, 4 notebooks of 01 graded


def test_one_stray_notebook_of_another_assignment_is_not_given_to_the_whole_class(canvas_graded):
    rows = canvas_graded["rows"]
    assert canvas_graded["proc"].returncode == 0, canvas_graded["proc"].stderr[-3000:]
    assert {a for s, a in rows if s != "55"} == {A}, sorted(rows)  # no "not submitted" 02 rows for others
    assert rows[("55", B)]["status"] == "graded"  # eve's own notebook is still graded, in its own row
    eve = rows[("55", A)]
    assert eve["status"] == "no-notebook" and eve["message"] != "not submitted", eve
    assert f"{NAME_B} ({B}'s notebook" in eve["message"], eve


def test_zip_names_without_the_utf8_flag_are_read_as_utf8(tmp_path):
    e = _by(discover(_canvas_class(tmp_path / "canvas.zip"), CAT, tmp_path / "s"))
    assert e[("66", A)].student_name == "zoë", e[("66", A)].student_name

    class Cp437(zipfile.ZipInfo):  # an old tool's name in cp437 (not UTF-8 bytes): read as cp437 still
        def _encodeFilenameFlags(self):
            return self.filename.encode("cp437"), self.flag_bits & ~0x800

    with zipfile.ZipFile(tmp_path / "old.zip", "w") as zf:
        zf.writestr(Cp437(f"José/{A}/{NAME}"), STUB)
        zf.writestr(f"ann/{A}/{NAME}", STUB)
    e = _by(discover(tmp_path / "old.zip", CAT, tmp_path / "s2"))
    assert ("José", A) in e, sorted(e)


def test_with_assignment_a_student_who_handed_in_another_exercises_notebook_gets_a_row_naming_it(tmp_path):
    from autograder.grade import select
    entries = select(discover(_canvas_class(tmp_path / "canvas.zip"), CAT, tmp_path / "s"), CAT, [A])
    e = _by(entries)
    assert sorted(s for s, _ in e) == ["11", "22", "33", "44", "55", "66"], sorted(e)
    assert {a for _, a in e} == {A}
    eve = e[("55", A)]
    assert eve.path is None and eve.handed is not None, eve
    assert any(f"{NAME_B} ({B}'s notebook, not graded" in n for n in eve.notes), eve.notes
    assert any("notes.txt" in n for n in e[("44", A)].notes), e[("44", A)].notes


def test_moodle_and_folder_students_without_a_notebook_get_a_row_naming_their_files(tmp_path):
    """Moodle: a folder holding only report.pdf; nbgrader's layout: an assignment folder holding
    only notes.txt, and a student folder holding only a file."""
    from autograder.grade import select
    z = _zip(tmp_path / "moodle.zip", {
        f"Ann Lee_1_assignsubmission_file_/{NAME}": STUB,
        f"Bob Ray_2_assignsubmission_file_/{NAME}": STUB,
        "Dan Roe_4_assignsubmission_file_/report.pdf": b"%PDF-1.4",
    })
    e = _by(select(discover(z, CAT, tmp_path / "s"), CAT))
    assert sorted(e) == [("1", A), ("2", A), ("4", A)], sorted(e)
    assert e[("4", A)].student_name == "Dan Roe" and e[("4", A)].handed == ["report.pdf"]
    root = tmp_path / "class"
    for rel, data in {f"ann/{A}/{NAME}": STUB, f"bob/{A}/{NAME}": STUB, f"cat/{A}/notes.txt": b"x",
                      "dan/answers.py": b"x = 1"}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    e = _by(select(discover(root, CAT, tmp_path / "s2"), CAT))
    assert sorted(e) == [("ann", A), ("bob", A), ("cat", A), ("dan", A)], sorted(e)
    assert e[("cat", A)].handed == [f"{A}/notes.txt"] and e[("dan", A)].handed == ["answers.py"]
