"""What an error raised by a student's cell can show: at most ``CELL_ERROR_CHARS`` per cell and
``CELL_ERRORS_CHARS`` per notebook (the rest summarized as "N more cells raised errors"), wherever it
is shown: results.json (the outcome's ``cell_errors``), the feedback page, the autograded notebook.
The submission's stdout tail is kept for the instructor only (never in the feedback or the notebook).
"""
from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from autograder.referee.protocol import CELL_ERROR_CHARS, CELL_ERRORS_CHARS, OUTPUT_TAIL_CHARS, bound_cell_errors
from course.release import ROOT
from tools.fixture_class import release_dict, with_code

A = "01_layernorm"
N_CELLS = 12
# every added cell writes into LayerNorm, so it is in the graded slice and runs (autograder.intake.slicing)
SHOUTER = ("print('STDOUT-' * 2000)\nclass LayerNorm:\n    pass\n\n\ndef _boom(i):\n"
           "    raise RuntimeError(f'cell{i}-' + 'x' * 5000 + 'END')\n") + "".join(
    f"# %% added cell\nLayerNorm.tag = _boom({i})\n" for i in range(N_CELLS))


def _check_bounded(errors: list[dict]):
    assert all(len(e["error"]) <= CELL_ERROR_CHARS for e in errors), [len(e["error"]) for e in errors]
    shown = [e for e in errors if "more" not in e]
    assert sum(len(e["error"]) for e in shown) <= CELL_ERRORS_CHARS
    assert errors[-1]["more"] == N_CELLS - len(shown) > 0
    assert f"{N_CELLS - len(shown)} more cells raised errors" in errors[-1]["error"]


def test_bound_cell_errors_cuts_each_counts_the_rest_and_is_idempotent():
    raw = [{"label": "L" * 500, "error": f"E{i}" + "y" * 9000} for i in range(N_CELLS)] + ["junk", {"error": 3}]
    out = bound_cell_errors(raw)
    assert all(len(e["label"]) <= 80 for e in out)
    assert bound_cell_errors(out) == out
    assert bound_cell_errors("not a list") == [] and bound_cell_errors(None) == []
    small = [{"label": "a", "error": "NameError: x"}] * 3
    assert bound_cell_errors(small) == small  # short errors pass untouched
    raw = [{"label": "c", "error": "y" * 9000} for _ in range(N_CELLS)]
    _check_bounded(bound_cell_errors(raw))
    assert bound_cell_errors(raw + [{"label": "more errors", "error": "forged", "more": 10 ** 9}])[-1]["more"] > 0


@pytest.mark.autograder
def test_a_notebook_of_long_errors_is_shown_bounded(tmp_path):
    """A submission whose cells raise 5000-character errors, graded in a real sandbox: each error is
    cut, the notebook's total is bounded, the rest counted; the feedback page and the autograded
    notebook show only that; what it printed reaches neither."""
    from autograder.report.feedback import feedback_html
    from autograder.grade import grade_class
    from autograder.nbgrader.course_dir import build_notebook
    from autograder.sandbox.bwrap import Limits

    name, release = release_dict(A)
    d = tmp_path / "submitted" / "shouter" / A
    d.mkdir(parents=True)
    (d / name).write_text(json.dumps(with_code(release, SHOUTER)))
    [o] = grade_class(tmp_path / "submitted", tmp_path / "out", jobs=1, zygote=False, progress=False,
                      limits=Limits(wall_s=240, cell_s=60))
    assert o.status == "graded", o.message
    _check_bounded(o.cell_errors)
    assert "cell0-" in o.cell_errors[0]["error"] and "END" not in json.dumps(o.cell_errors)
    # the tail of what it printed (IPython's tracebacks, whole messages) is kept for the instructor
    assert "xEND" in o.output_tail and len(o.output_tail) <= OUTPUT_TAIL_CHARS

    page = html.unescape(re.sub(r"<[^>]+>", "", feedback_html(o)))
    assert "more cells raised errors" in page and "STDOUT-STDOUT-" not in page and "xEND" not in page
    assert max(len(m) for m in re.findall(r"x+", page)) < CELL_ERROR_CHARS
    assert sum(len(m) for m in re.findall(r"x{10,}", page)) <= CELL_ERRORS_CHARS

    nb = build_notebook(ROOT / "exercises" / A / name, d / name, o)
    text = json.dumps([c.get("outputs", []) for c in nb.cells] + [c.source for c in nb.cells])
    assert "more cells raised errors" in text and "STDOUT-STDOUT-" not in text and "xEND" not in text
    assert max(len(m) for m in re.findall(r"x+", text)) < CELL_ERROR_CHARS
