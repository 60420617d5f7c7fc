"""Exercise 06 (sinkhorn_knopp, MHCResidual, depth_attention): what tests/test_checks_in_process.py does
not already prove for every exercise.

* every wrong version in tests/fixtures/wrong/06_streams loses *exactly* the tests its ``loses:`` line
  lists (the benchmark included), the first with its ``message:``;
* properties of the reference solution the checks rely on: a constant added to a row of the logits
  changes nothing, a doubly stochastic ``exp(logits)`` is a fixed point (the premise of
  ``mhc_known_mixing`` and of the benchmark's output check), zero-init equal streams give the pre-norm
  residual;
* the benchmark: its CPU report says its numbers are CPU numbers, its judge checks the output on a GPU
  record too, and the served workload (the grader's clock) agrees with the block's formula over a chain
  of calls as long as the grader's.

The course grader grades the solution and the right versions in tests/test_grading_verdicts.py.
"""
from __future__ import annotations

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from coursekit.checks import CheckFailed, get
from coursekit.checks import streams as sm
from course.release import ROOT
from notebook_ns import code_ns, grade_ids, outcome, solution_ns
from tools.make_submission import fixtures

pytestmark = pytest.mark.streams

A = "06_streams"
WRONG = [f for f in fixtures(ROOT / "tests" / "fixtures" / "wrong") if f.assignment == A]
CHECKS = grade_ids(A)
_solution = functools.cache(lambda: solution_ns(A))


@pytest.mark.parametrize("fx", WRONG, ids=[f.name for f in WRONG])
def test_wrong_version_loses_exactly_its_tests(fx):
    ns = code_ns(A, fx.code, str(fx.path))
    failed = {g: m for g in CHECKS if (m := outcome(g, ns))}
    assert set(failed) == set(fx.loses), (f"{fx.name} ({fx.summary}) should lose {sorted(fx.loses)}, "
                                          f"loses {sorted(failed)}: {failed}")
    if fx.message:
        assert fx.message in failed[fx.loses[0]], failed[fx.loses[0]]


# -- properties of the reference the checks stand on -------------------------------------------

@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 6), iters=st.integers(1, 30),
       scale=st.floats(0.1, 3.0), shift=st.floats(-50.0, 50.0))
def test_property_a_constant_added_to_each_row_changes_nothing(seed, n, iters, scale, shift):
    """Row constants scale the rows of exp(logits), which the first row step divides out; the max over the
    last two dims moves with them, so nothing overflows either."""
    f = _solution()["sinkhorn_knopp"]
    g = torch.Generator().manual_seed(seed)
    L = torch.randn(2, n, n, generator=g, dtype=torch.float64) * scale
    rows = shift * torch.randn(2, n, 1, generator=g, dtype=torch.float64)
    P = f(L, iters)
    assert torch.allclose(f(L + rows, iters), P, atol=1e-12, rtol=1e-10)
    assert torch.allclose(P.sum(-2), torch.ones(2, n, dtype=torch.float64), atol=1e-12)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_a_doubly_stochastic_exp_logits_is_a_fixed_point(n):
    """What mhc_known_mixing and the benchmark's output check assume: the reference returns known_mixing(n)
    for res_logits = log(known_mixing(n)) + c, after any number of iterations, and the matrix is doubly
    stochastic, positive, and not symmetric from n = 3 on (so a transposed mix shows)."""
    H = sm.known_mixing(n)
    assert (H > 0).all() and torch.allclose(H.sum(0), torch.ones(n, dtype=H.dtype))
    assert torch.allclose(H.sum(1), torch.ones(n, dtype=H.dtype))
    assert (n < 3) == torch.allclose(H, H.T)
    f = _solution()["sinkhorn_knopp"]
    for k in (1, 3, 20):
        assert torch.allclose(f(torch.log(H) + 7.5, k), H, atol=1e-14, rtol=1e-12)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 6), lead=st.lists(st.integers(1, 3), max_size=2),
       scale=st.floats(0.01, 100.0))
def test_property_zero_init_equal_streams_give_the_prenorm_residual(seed, n, lead, scale):
    """The solution's fresh block on n equal streams y returns y + F(RMSNorm(n/2 * y)) in every stream."""
    from torch import nn
    g = torch.Generator().manual_seed(seed)
    sub = nn.Linear(6, 6, dtype=torch.float64)
    blk = _solution()["MHCResidual"](6, sub, n_streams=n).double()
    y = torch.randn(*lead, 6, generator=g, dtype=torch.float64) * scale
    x = y.unsqueeze(-2).expand(*lead, n, 6)
    want = y + sub(nn.RMSNorm(6, eps=1e-6, dtype=torch.float64)(n / 2 * y))
    assert torch.allclose(blk(x), want.unsqueeze(-2).expand_as(x), atol=1e-12, rtol=1e-12)


# -- the benchmark -------------------------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU report")
def test_the_cpu_benchmark_says_its_numbers_are_cpu_numbers(capsys):
    from coursekit.checks import run
    run(sm.GID, _solution())
    out = capsys.readouterr().out
    assert "these are CPU numbers" in out and "(2, 128, 4, 64)" in out and f"passed {sm.GID}" in out
    assert "sinkhorn_knopp(logits, 20) on logits (2, 128, 4, 4)" in out


from test_bench import work  # noqa: E402 -- the count records, one place


def test_the_gpu_benchmark_judges_the_output_on_the_first_tokens(monkeypatch, capsys):
    """A record from a CUDA run is judged on its first tokens against the formula, drawn again on the
    device in bfloat16 (stood in for here by the CPU in bfloat16), and its count of work decides."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def want_on_the_cpu(kind):
        cfg = sm.bench.bench_config("cpu")
        size = cfg.sizes("streams")
        x = sm._input(size["input"], sm.SEED_X)[:1, :4].to(torch.bfloat16)
        blk = sm.GivenMixing(size["d"], size["n"], sm._res_sublayer(d=size["d"])).to(torch.bfloat16)
        with torch.no_grad():
            return sm._first_rows(blk(x))

    monkeypatch.setattr(sm, "bench_want", want_on_the_cpu)
    rounds = [1e-3] * sm.REPEAT
    shape = sm.BENCH_SIZES["cuda"]["streams"]["input"]
    record = {"device": "NVIDIA Test GPU", "cuda": True, "shape": list(shape), "dtype": "bfloat16",
              "times": {"yours": rounds, "pre-norm residual": rounds}, "sinkhorn": {"yours": rounds, "softmax": rounds},
              "copy": 1e-4, "work": work(sm.GID), "y": want_on_the_cpu("cuda"), "notes": []}
    get(sm.GID).judge(record)
    assert "CUDA, bfloat16" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="benchmark's first tokens"):
        get(sm.GID).judge(dict(record, y=record["y"].flip(-2)))  # the streams in another order
    with pytest.raises(CheckFailed, match="matrices in a batch of logits"):
        get(sm.GID).judge(dict(record, work=work(sm.GID)[:3] + [dict(work(sm.GID, 1)[3])]))


def test_the_benchmark_is_served_by_the_grader_and_a_chain_of_calls_agrees():
    """The autograder times the benchmark from outside the sandbox (coursekit.checks.served): a step of
    forward + backward of the student's block against the same step of the formula with H_res given,
    chained as far as the grader chains them, within a tenth of the grader's tolerance."""
    from autograder.referee.clock import MAX_K, _local
    from coursekit.checks.served import SERVED, TOL

    spec = SERVED[sm.GID]
    assert spec.assignment == A and get(sm.GID).kind == "benchmark"
    mine, torch_side = spec.build(_solution()), spec.torch_module()
    with torch.no_grad():
        x = spec.x(7)
        a, b = _local(mine, x, MAX_K["cpu"])[1], _local(torch_side, x, MAX_K["cpu"])[1]
    assert a.shape == x.shape and torch.isfinite(a).all()
    assert torch.allclose(a, b, atol=TOL["cpu"] / 10, rtol=TOL["cpu"] / 10)
