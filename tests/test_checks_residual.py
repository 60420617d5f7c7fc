"""Exercise 03 through course.checks, in-process and fast: the solution passes every check, the
stub fails every check, each wrong version in tests/fixtures/wrong/03_residual fails the checks
it names with the message it names, each right version passes them all. The slow, real-nbgrader
run of the same fixtures is tests/test_exercises_nbgrader.py."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from autograder.make_submission import fixtures
from course.release import ROOT
from notebook_ns import assert_loses, assert_passes_all, grade_ids, outcome, solution_ns, stub_ns

pytestmark = pytest.mark.residual

A = "03_residual"
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


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), scale=st.floats(1e-4, 1e4), kind=st.sampled_from(["layer", "rms"]),
       s=st.floats(-3, 3), shape=st.lists(st.integers(1, 5), min_size=1, max_size=3))
def test_property_zero_sublayer_prenorm_block_is_identity(solution, seed, scale, kind, s, shape):
    """The solution's pre-norm block with F = 0 returns x bit for bit, whatever the input."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, 6, generator=g) * scale
    zero = nn.Linear(6, 6)
    nn.init.zeros_(zero.weight)
    nn.init.zeros_(zero.bias)
    block = solution["ResidualBlock"](6, zero, norm=kind, residual_scale=s, dropout=0.3)
    assert torch.equal(block(x), x)
