"""The autograder's pieces without running any submission: reading input layouts (nbgrader,
zip, Canvas, Moodle), the release-skeleton plan, the static scan, refusing to run unsandboxed."""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from autograder.intake import plan as planmod
from autograder.sandbox import bwrap as sandbox
from tools.fixture_class import release_dict, solved_dict
from autograder.intake.ingest import Catalog, discover
from course.release import ROOT

pytestmark = pytest.mark.autograder
CAT = Catalog(ROOT / "exercises")


def _nb(assignment="01_layernorm"):
    return json.dumps(solved_dict(assignment)).encode()


def test_canvas_zip_maps_names_and_keeps_the_latest_resubmission(tmp_path):
    z = tmp_path / "canvas.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr("doejane_1234_5678_layernorm.ipynb", b"{}")
        zf.writestr("doejane_1234_5699_layernorm-1.ipynb", _nb())
        zf.writestr("smithbob_LATE_42_77_rmsnorm.ipynb", _nb("02_rmsnorm"))
        zf.writestr("smithbob_42_78_whatever.ipynb", _nb("01_layernorm"))  # recognised by its cells
        zf.writestr("../evil.ipynb", b"{}")  # path traversal: skipped
    entries = {(e.student_id, e.assignment): e for e in discover(z, CAT, tmp_path / "scratch")}
    assert entries[("1234", "01_layernorm")].path.name == "doejane_1234_5699_layernorm-1.ipynb"
    assert entries[("42", "02_rmsnorm")].student_name == "smithbob"
    assert any("recognised" in n for n in entries[("42", "01_layernorm")].notes)
    assert not (tmp_path / "evil.ipynb").exists()


def test_moodle_folders(tmp_path):
    d = tmp_path / "moodle" / "Jane Doe_991_assignsubmission_file_"
    d.mkdir(parents=True)
    (d / "layernorm.ipynb").write_bytes(_nb())
    (tmp_path / "moodle" / "Jane Doe_991_assignsubmission_onlinetext_").mkdir()
    entries = discover(tmp_path / "moodle", CAT, tmp_path / "scratch")
    assert [(e.student_id, e.assignment, e.student_name) for e in entries] == [("991", "01_layernorm", "Jane Doe")]


def test_submitted_layout_and_unknown_assignment(tmp_path):
    (tmp_path / "submitted" / "ann" / "01_layernorm").mkdir(parents=True)
    (tmp_path / "submitted" / "ann" / "01_layernorm" / "layernorm.ipynb").write_bytes(_nb())
    (tmp_path / "submitted" / "ann" / "99_nope").mkdir()
    entries = {(e.student_id, e.assignment): e for e in discover(tmp_path, CAT, tmp_path / "s")}
    assert entries[("ann", "01_layernorm")].path is not None
    assert entries[("ann", "99_nope")].path is None


def test_plan_uses_release_for_tests_and_setup_and_keeps_added_cells_in_place():
    name, rel = release_dict("01_layernorm")
    release = planmod.release_cells(ROOT / "exercises" / "01_layernorm" / name)
    student = [{"source": "evil_setup()", "grade_id": "layernorm_setup", "id": None},
               {"source": "x = 1", "grade_id": None, "id": None},
               {"source": "class LayerNorm:\n    k = x + y", "grade_id": "layernorm_impl", "id": None},
               {"source": "y = 2", "grade_id": None, "id": None},
               {"source": "print('passed')", "grade_id": "layernorm_matches_torch", "id": None}]
    p = planmod.make_plan(release, student)
    sources = [s.get("source") for s in p.steps if s["kind"] == "cell"]
    assert "evil_setup()" not in sources and "print('passed')" not in sources
    assert sources.index("x = 1") < sources.index("class LayerNorm:\n    k = x + y") < sources.index("y = 2")
    assert [t.grade_id for t in p.tests] == [c["grade_id"] for c in release if c["role"] == "test"]
    assert p.steps[-1]["kind"] == "test"


@pytest.mark.parametrize("code, hit", [
    ("import torch.nn.functional as F\nclass LayerNorm:\n    def forward(self, x):\n        return F.layer_norm(x, s)", True),
    ("from torch.nn import LayerNorm as L\nLayerNorm = L", True),
    ("LayerNorm = nn.LayerNorm", True),
    ("class LayerNorm(nn.Module):\n    '''my layer_norm'''\n    def forward(self, x):\n"
     "        mu = x.mean(-1, keepdim=True)\n        return (x - mu) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)", False),
    ("%timeit LayerNorm(4)(x)\nclass LayerNorm:\n    pass", False),
    ("class LayerNorm:\n    pass\nprint(torch.allclose(LayerNorm(4)(x), F.layer_norm(x, (4,))))", False),
])
def test_builtins_cost_only_in_graded_code(code, hit):
    from autograder.intake import scan
    from autograder.intake.slicing import Cell, slice_cells
    from coursekit.checks import get
    sl = slice_cells([Cell("answer", "answer cell layernorm_impl", code)])
    assert bool(scan.costs(sl, scan.forbidden_names(get("layernorm_matches_torch")))) == hit


def test_bad_notebooks_are_refused_with_a_reason(tmp_path):
    for content, phrase in [(b"", "empty"), (b"{", "cut off"), (b"[]", "not a notebook"), (b"\xff\xfe\x00", "UTF-8"),
                            (b'{"metadata": {}}', "no cells")]:
        p = tmp_path / "nb.ipynb"
        p.write_bytes(content)
        with pytest.raises(planmod.BadNotebook, match=phrase):
            planmod.read_student_notebook(p)


def test_refuses_to_run_without_a_sandbox(monkeypatch, capsys):
    from autograder.__main__ import main
    monkeypatch.setattr(sandbox, "_checked", {})
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    assert main(["grade", "--out", "/nonexistent/out"]) == 2
    err = capsys.readouterr().err
    assert "bwrap" in err and "--no-sandbox" in err


def test_unreadable_input_exits_2(tmp_path, capsys):
    from autograder.__main__ import main
    assert main(["grade", str(tmp_path / "nope"), "--out", str(tmp_path / "o"), "--no-sandbox"]) == 2


def test_sample_class_is_in_sync():
    """tools/sample_class/ is exactly what `python -m tools.sample_class` generates."""
    from tools.sample_class import main
    assert main(["--check"]) == 0


def test_sample_class_picks_fixtures_by_name(monkeypatch):
    """The sample class names its fixtures; a missing one is a clear error, not another fixture."""
    import tools.sample_class as sc
    assert "RMSNorm" in sc.pick("eve_cheats", "02_rmsnorm") and "rms_norm" in sc.pick("eve_cheats", "02_rmsnorm")
    monkeypatch.setitem(sc.PICKS, "cho_buggy", ("wrong", {"01_layernorm": "no_such_fixture"}))
    with pytest.raises(sc.MissingFixture, match="no_such_fixture.py, which does not exist"):
        sc.pick("cho_buggy", "01_layernorm")
    with pytest.raises(sc.MissingFixture, match="names no fixture for 02_rmsnorm"):
        sc.pick("cho_buggy", "02_rmsnorm")


def test_sandbox_shows_the_checks_but_not_the_books_experiment_code():
    """coursekit.checks is importable inside the sandbox; book.experiments (whose Block is close to
    exercise 04's answer) and solutions/ are not there."""
    from autograder.sandbox.bwrap import Limits, run_sandboxed

    code = ("import importlib, os\n"
            "import coursekit.checks\n"
            "try:\n    importlib.import_module('book.experiments.blocks'); print('experiments: visible')\n"
            "except ImportError:\n    print('experiments: hidden')\n"
            f"print('solutions:', os.path.exists({str(ROOT / 'solutions')!r}))\n")
    res = run_sandboxed(["python", "-c", code], limits=Limits(wall_s=120))
    assert res.returncode == 0, res.output
    assert "experiments: hidden" in res.output and "solutions: False" in res.output, res.output
