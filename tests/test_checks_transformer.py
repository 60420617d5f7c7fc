"""Exercise 04 through course.checks, in-process and fast: the solution passes every check, the
stub fails every check, each wrong version in tests/fixtures/wrong/04_transformer_block fails
the checks it names with the message it names, each right version passes them all. The slow,
real-nbgrader run of the same fixtures is tests/test_exercises_nbgrader.py."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from autograder.make_submission import fixtures
from course.release import ROOT
from notebook_ns import assert_loses, assert_passes_all, grade_ids, outcome, solution_ns, stub_ns

pytestmark = pytest.mark.transformer

A = "04_transformer_block"
CHECKS = [g for g in grade_ids(A) if not g.endswith("_benchmark")]
WRONG = [f for f in fixtures(ROOT / "tests" / "fixtures" / "wrong") if f.assignment == A]
RIGHT = [f for f in fixtures(ROOT / "tests" / "fixtures" / "right") if f.assignment == A]


@pytest.fixture(scope="module")
def solution():
    return solution_ns(A)


@pytest.mark.parametrize("gid", CHECKS)
def test_solution_passes(solution, gid):
    assert outcome(gid, solution) is None


@pytest.mark.parametrize("gid", CHECKS)
def test_stub_fails_saying_not_implemented(gid):
    msg = outcome(gid, stub_ns(A))
    assert msg is not None and "not implemented yet" in msg, msg


@pytest.mark.parametrize("fx", WRONG, ids=[f.name for f in WRONG])
def test_wrong_version_fails_its_checks(fx):
    assert_loses(fx, CHECKS)


@pytest.mark.parametrize("fx", RIGHT, ids=[f.name for f in RIGHT])
def test_right_version_passes_everything(fx):
    assert_passes_all(fx, CHECKS)


def test_every_check_is_lost_by_some_wrong_version():
    lost = {g for f in WRONG for g in f.loses}
    assert set(CHECKS) <= lost, f"no wrong version loses {sorted(set(CHECKS) - lost)}"


@pytest.mark.parametrize("norm_first", [True, False])
def test_solution_matches_torch_in_float32_eval_and_train(solution, norm_first):
    """Beyond the float64 checks: float32, torch's fused eval path on its side and maybe on ours."""
    torch.manual_seed(0)
    mine = solution["TransformerBlock"](32, 4, 64, norm_first=norm_first)
    ref = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, activation="gelu", batch_first=True,
                                     norm_first=norm_first)
    rename = {"attn.": "self_attn.", "ffn.0.": "linear1.", "ffn.3.": "linear2."}
    state = {}
    for k, v in mine.state_dict().items():
        for a, b in rename.items():
            k = k.replace(a, b) if k.startswith(a) else k
        state[k] = v
    ref.load_state_dict(state)
    x = torch.randn(3, 7, 32)
    kpm = torch.zeros(3, 7, dtype=torch.bool)
    kpm[1, -3:] = True
    for mode in ("train", "eval"):
        mine.train(mode == "train"), ref.train(mode == "train")
        with torch.no_grad():
            a, b = mine(x, key_padding_mask=kpm), ref(x, src_key_padding_mask=kpm)
        keep = ~kpm
        assert torch.allclose(a[keep], b[keep], atol=1e-5, rtol=1e-5), mode
