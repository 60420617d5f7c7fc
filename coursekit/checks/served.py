"""The served benchmark: the autograder's clock, outside the student's process.

In the course autograder the benchmark is not timed inside the sandbox. After the student's
cells ran, the harness (in the sandbox) builds the student's module once (``SERVED[gid].build``)
and answers requests from the grader over a pipe: for each fresh random seed it builds the input
(``SERVED[gid].x``, the same code the grader uses), calls the module K times, chained, and sends
the last output back. The grader holds the clock, checks every output against torch's module on
the same seed, and times torch's module in its own process (``autograder/outside.py``);
:func:`served_report` judges those numbers against the same :data:`LIMITS` as the notebook's
benchmark (:mod:`coursekit.checks.benchmark`). Nothing here is used by the in-notebook benchmark
(stock nbgrader, the self-check).
"""
from __future__ import annotations

from torch import nn

from coursekit import bench
from coursekit.checks import CheckFailed
from coursekit.checks.benchmark import (LIMITS, LOOP_HINT, NORM_SHAPE, RES_D, RES_SHAPE, TB_FF, TB_H, TB_SHAPE,
                                        _bench_params, _input, _res_sublayer, _TorchResidual, robust_ratio)
from coursekit.checks.normcheck import set_params


class Served:
    """How to build one benchmark's workload on either side of the pipe."""

    def __init__(self, name, assignment, build, torch_module, x, torch_name):
        self.name, self.assignment, self.torch_name = name, assignment, torch_name
        self.build = build  # namespace -> the module to time (student's code, or the course solution's)
        self.torch_module = torch_module  # () -> torch's own module, same weights (grader side)
        self.x = x  # seed -> the input


def _served_norm(name, torch_mod):
    d = NORM_SHAPE[-1]

    def build(ns):
        m = ns[name](d)
        set_params(m, _bench_params(name, d), name)
        return m

    def torch_module():
        m = torch_mod(d)
        set_params(m, _bench_params(name, d), name)
        return m

    return build, torch_module


def _tb_values():
    from coursekit.checks.seeded import block_spec, values
    return values(block_spec(TB_SHAPE[-1], TB_FF), 4242)


def _served_tb_build(ns):
    from coursekit.checks.seeded import load_into
    m = ns["TransformerBlock"](TB_SHAPE[-1], TB_H, TB_FF).eval()
    load_into(m, _tb_values(), "TransformerBlock",
              "the benchmark loads known weights by the contract's names (norm1, attn, norm2, ffn)")
    return m


def _served_tb_torch():
    from coursekit.checks.seeded import torch_layer
    return torch_layer(_tb_values(), TB_SHAPE[-1], TB_H, TB_FF, norm_first=True).float()


SERVED = {
    "layernorm_benchmark": Served("LayerNorm", "01_layernorm",
                                  *_served_norm("LayerNorm", nn.LayerNorm),
                                  lambda seed: _input(NORM_SHAPE, seed), "torch.nn.LayerNorm"),
    "rmsnorm_benchmark": Served("RMSNorm", "02_rmsnorm",
                                *_served_norm("RMSNorm", lambda d: nn.RMSNorm(d, eps=1e-6)),
                                lambda seed: _input(NORM_SHAPE, seed), "torch.nn.RMSNorm"),
    "residual_benchmark": Served("ResidualBlock", "03_residual",
                                 lambda ns: ns["ResidualBlock"](RES_D, _res_sublayer(), norm="layer").eval(),
                                 lambda: _TorchResidual(_res_sublayer()).eval(),
                                 lambda seed: _input(RES_SHAPE, seed), "x + F(nn.LayerNorm(x))"),
    "transformer_block_benchmark": Served("TransformerBlock", "04_transformer_block",
                                          _served_tb_build, _served_tb_torch,
                                          lambda seed: _input(TB_SHAPE, seed), "nn.TransformerEncoderLayer"),
}


def served_report(out: dict) -> None:
    """Print the grader-measured table and raise :class:`CheckFailed` above the limit.

    ``out``: grade_id, times ({"yours": [...], "torch": [...], maybe "course solution"}, seconds
    per call per round, measured by the grader), bytes, copy, rounds, allowance.
    """
    gid = out["grade_id"]
    spec = SERVED[gid]
    rows = bench.summarize(out["times"], out["bytes"], out["copy"], "cpu")
    ratio = robust_ratio(out["times"])
    rs = bench.ratios(out["times"], "yours", "torch")
    limit = LIMITS[gid]
    print(f"{gid}: timed by the grader from outside your notebook's process: {len(rs)} rounds, each on a "
          f"fresh random input, your output checked every round; 1 thread; "
          f"{out['allowance'] * 1e6:.0f} µs per round allowed for the pipe")
    print(bench.format_table(rows))
    print(f"yours / {spec.torch_name}: {ratio:.2f}x, fastest round against fastest round (round by round "
          f"from {min(rs):.2f}x to {max(rs):.2f}x); the limit is {limit:g}x")
    if ratio > limit:
        raise CheckFailed(f"your {spec.name} takes {ratio:.1f}x the time of {spec.torch_name} (the limit is "
                          f"{limit:g}x, generous for vectorized code): {LOOP_HINT[gid]}. "
                          "A Python loop pays the interpreter's overhead once per row.")


# Exercise 05's benchmark times a forward + backward (coursekit.checks.backward.served_entry): a
# callable x -> grad_x built around the student's FusedAddRMSNorm, timed like the others.
from coursekit.checks.backward import served_entry  # noqa: E402 -- after SERVED and Served exist

SERVED["backward_benchmark"] = Served(*served_entry())
