"""The contract's constants (coursekit/contract.py) against torch and the reference solutions."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from coursekit import contract
from coursekit.checks import benchmark

pytestmark = pytest.mark.autograder


def test_layernorm_eps_is_torchs_default():
    assert nn.LayerNorm(4).eps == contract.LAYERNORM_EPS


def test_rmsnorm_eps_must_be_passed_to_torch():
    """torch's RMSNorm has no 1e-6 default (eps=None: the dtype's machine epsilon)."""
    assert nn.RMSNorm(4).eps is None and contract.RMSNORM_EPS == 1e-6


def test_reference_solutions_use_the_contracts_eps():
    from course.solutions import load_reference
    ln = load_reference("01_layernorm")["LayerNorm"](8)
    rms = load_reference("02_rmsnorm")["RMSNorm"](8)
    assert ln.eps == contract.LAYERNORM_EPS and rms.eps == contract.RMSNORM_EPS


def test_benchmarks_time_the_contracts_sizes():
    assert benchmark.NORM_SHAPE is contract.NORM_SHAPE and benchmark.TB_SHAPE is contract.TB_SHAPE
    assert contract.STATS_DTYPE == torch.float32
