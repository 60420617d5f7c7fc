"""Generate the bundled sample class (tools/sample_class/, nbgrader's submitted layout).

    python -m tools.sample_class           # regenerate
    python -m tools.sample_class --check   # exit 1 if the committed copy is out of date

Eight students, built from solutions/, exercises/ and tests/fixtures/, so `make grade` shows the
whole flow on a fresh clone: complete, partial, buggy (wrong fixtures), correct-but-unusual
(right fixtures), cheating (hostile fixtures), broken files and missing work.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from pathlib import Path

from tools.fixture_class import FIXTURES, _write, read_code_fixture, release_dict, solved_dict, with_code
from tools.make_submission import read_fixture
from course.release import ROOT, assignments, sync_tree

DEST = Path(__file__).resolve().parent / "sample_class"


#: which fixture each student hands in, by file name (tests/fixtures/<kind>/<assignment>/<name>.py):
#: adding or renaming other fixtures never changes the sample class
PICKS = {
    "cho_buggy": ("wrong", {"01_layernorm": "unbiased_variance", "02_rmsnorm": "mean_subtracted",
                            "03_residual": "post_norm_when_pre_asked", "04_transformer_block": "masks_ignored",
                            "05_backward": "grad_h_ignored", "06_streams": "h_post_without_factor_two"}),
    "dan_buggy": ("wrong", {"01_layernorm": "per_row_loop", "02_rmsnorm": "eps_hard_coded",
                            "03_residual": "per_token_python_loop",
                            "04_transformer_block": "dropout_active_in_eval", "05_backward": "per_row_loop",
                            "06_streams": "per_token_python_loop"}),
    "ben_partial": ("wrong", {"02_rmsnorm": "computes_in_fp16"}),
    "eve_cheats": ("wrong", {"02_rmsnorm": "calls_F_rms_norm"}),  # calls torch's built-in RMSNorm
    "hal_unusual": ("right", {"01_layernorm": "var_rsqrt_noisy", "02_rmsnorm": "norm_based_noisy",
                              "03_residual": "separate_classes", "04_transformer_block": "residual_block_reuse",
                              "05_backward": "other_algebra", "06_streams": "log_domain_sinkhorn"}),
}


class MissingFixture(LookupError):
    """A fixture the sample class names is not there."""


def pick(student: str, a: str) -> str:
    """The code of the fixture ``student`` hands in for assignment ``a`` (see :data:`PICKS`)."""
    kind, names = PICKS[student]
    if a not in names:
        raise MissingFixture(f"tools/sample_class.py: PICKS[{student!r}] names no fixture for {a}")
    path = FIXTURES / kind / a / f"{names[a]}.py"
    if not path.is_file():
        have = ", ".join(sorted(p.stem for p in path.parent.glob("*.py"))) or "none"
        raise MissingFixture(f"tools/sample_class.py: {student} hands in {path.relative_to(FIXTURES.parent.parent)}, "
                             f"which does not exist (fixtures there: {have}); restore it or change PICKS")
    return read_fixture(path).code


def build(dest: Path, root: Path = ROOT) -> None:
    A = assignments(root)
    names = {a: release_dict(a, root)[0] for a in A}
    rel = {a: release_dict(a, root)[1] for a in A}
    sol = {a: solved_dict(a, root) for a in A}

    def put(student, a, content):
        _write(dest, student, a, names[a], content)

    def code(a, c):
        return with_code(copy.deepcopy(rel[a]), c) if c else copy.deepcopy(rel[a])

    for a in A:
        put("ada_complete", a, sol[a])  # everything right
        put("cho_buggy", a, code(a, pick("cho_buggy", a)))  # one classic mistake per assignment
        put("dan_buggy", a, code(a, pick("dan_buggy", a)))  # another (slow but correct in two of them)
        put("hal_unusual", a, code(a, pick("hal_unusual", a)))  # correct but unusual: full marks
    put("ben_partial", A[0], sol[A[0]])  # first two done, third untouched, fourth missing
    put("ben_partial", A[1], code(A[1], pick("ben_partial", A[1])))
    put("ben_partial", A[2], copy.deepcopy(rel[A[2]]))
    cheat = read_code_fixture(FIXTURES / "hostile" / "patch_checks.py")["code"]
    put("eve_cheats", A[0], code(A[0], cheat))  # patches the checks: scores 0
    put("eve_cheats", A[1], code(A[1], pick("eve_cheats", A[1])))  # calls torch's built-in RMSNorm
    put("fay_broken", A[0], json.dumps(sol[A[0]]).encode()[:5000])  # truncated upload
    put("fay_broken", A[1], b"")  # empty file
    old = copy.deepcopy(sol[A[2]])  # old nbformat 3, graded normally
    put("fay_broken", A[2], {"nbformat": 3, "nbformat_minor": 0, "metadata": {},
                             "worksheets": [{"cells": [
                                 dict(c, input=c["source"]) if c["cell_type"] == "code" else c
                                 for c in old["cells"]]}]})
    gus = copy.deepcopy(sol[A[0]])  # a renamed notebook with a stray kernelspec
    gus["metadata"]["kernelspec"] = {"name": "conda-env-ml-py", "display_name": "ML", "language": "python"}
    _write(dest, "gus_renamed", A[0], "Copy of " + names[A[0]], gus)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        fresh = Path(tmp) / "sample_class"
        build(fresh)
        return sync_tree(fresh, DEST, check=args.check,
                         stale="tools/sample_class is out of date; run `python -m tools.sample_class`",
                         done=f"wrote {DEST}")


if __name__ == "__main__":
    sys.exit(main())
