"""Exercise 03, beyond the shared in-process checks of tests/test_checks_in_process.py: a
Hypothesis property of the solution's pre-norm block."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from notebook_ns import solution_ns

pytestmark = pytest.mark.residual


@pytest.fixture(scope="module")
def solution():
    return solution_ns("03_residual")


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
