"""The served benchmark: the autograder's clock, outside the student's process.

In the course autograder the benchmark is not timed inside the sandbox. After the student's
cells ran, the harness (in the sandbox) builds the student's module once (``SERVED[gid].build``)
and answers requests from the grader over a pipe: for each fresh random seed it builds the input
(``SERVED[gid].x``, the same code the grader uses), calls the module K times, chained, and sends
the last output back. The grader holds the clock, checks every output against torch's module on
the same seed, and times torch's module in its own process (``autograder/referee/clock.py``);
:func:`served_report` prints those numbers for information, and judges the count of work the harness
took when it built the module (:mod:`coursekit.checks.scaling`), as the notebook's benchmark does
(:mod:`coursekit.checks.benchmark`), and the count of one of the timed calls at full size, picked by
the grader from its secret draw: it may not exceed the small calls' count by more than a little
(:func:`coursekit.checks.scaling.judge_full`), so code that loops only above the counted sizes fails. Nothing here is used by the in-notebook benchmark
(stock nbgrader, the self-check).

Device: the grader picks it (:func:`coursekit.bench.default_device`, the one place) and tells the
harness; both build everything through :func:`coursekit.bench.bench_config` of that device. On
the CPU: float32, the CPU sizes, and the reply is the whole output. On a CUDA GPU: bfloat16, the
GPU sizes, inputs drawn on the GPU from the seed, and the reply is :func:`reply` (one number per
row: the output projected on a random vector from the seed), since whole outputs of 64M numbers
would not fit the pipe's budget; the chained calls still make every row of every call count.
"""
from __future__ import annotations

import torch
from torch import nn

from coursekit import bench
from coursekit.checks import CheckFailed, scaling
from coursekit.checks.benchmark import (TYPICAL, LOOP_HINT,
                                        _bench_params, _input, _res_sublayer, _TorchResidual, robust_ratio)
from coursekit.checks.normcheck import set_params

_CPU = None


def _cfg(cfg):
    """``cfg``, or the CPU's settings (what every caller before the GPU path meant)."""
    global _CPU
    if cfg is not None:
        return cfg
    if _CPU is None:
        _CPU = bench.bench_config("cpu")
    return _CPU


class Served:
    """How to build one benchmark's workload on either side of the pipe. Each part takes the
    :class:`coursekit.bench.BenchConfig` both sides use (default: the CPU's)."""

    def __init__(self, name, assignment, build, torch_module, x, torch_name):
        self.name, self.assignment, self.torch_name = name, assignment, torch_name
        self.build = build  # (namespace, cfg) -> the module to time (student's code, or the course solution's)
        self.torch_module = torch_module  # (cfg) -> torch's own module, same weights (grader side)
        self.x = x  # (seed, cfg) -> the input


def _on(m, cfg):
    """``m`` moved to the benchmark's device and dtype; on the CPU left exactly as built (float32)."""
    return m if cfg.kind == "cpu" else m.to(cfg.device, cfg.dtype)


def _served_norm(name, torch_mod):
    def build(ns, cfg=None):
        cfg = _cfg(cfg)
        d = cfg.sizes("norm")["d"]
        m = ns[name](d)
        set_params(m, _bench_params(name, d), name)
        return _on(m, cfg)

    def torch_module(cfg=None):
        cfg = _cfg(cfg)
        d = cfg.sizes("norm")["d"]
        m = torch_mod(d)
        set_params(m, _bench_params(name, d), name)
        return _on(m, cfg)

    return build, torch_module


def _x(workload):
    def x(seed, cfg=None):
        cfg = _cfg(cfg)
        return _input(cfg.sizes(workload)["input"], seed, cfg.device, cfg.dtype)
    return x


def _served_res_build(ns, cfg=None):
    cfg = _cfg(cfg)
    d = cfg.sizes("residual")["d"]
    return _on(ns["ResidualBlock"](d, _res_sublayer(d=d), norm="layer"), cfg).eval()


def _served_res_torch(cfg=None):
    cfg = _cfg(cfg)
    return _on(_TorchResidual(_res_sublayer(d=cfg.sizes("residual")["d"])), cfg).eval()


def _tb_values(size):
    from coursekit.checks.seeded import block_spec, values
    return values(block_spec(size["d"], size["d_ff"]), 4242)


def _served_tb_build(ns, cfg=None):
    from coursekit.checks.seeded import load_into
    cfg = _cfg(cfg)
    size = cfg.sizes("transformer_block")
    m = ns["TransformerBlock"](size["d"], size["heads"], size["d_ff"]).eval()
    load_into(m, _tb_values(size), "TransformerBlock",
              "the benchmark loads known weights by the contract's names (norm1, attn, norm2, ffn)")
    return _on(m, cfg)


def _served_tb_torch(cfg=None):
    from coursekit.checks.seeded import torch_layer
    cfg = _cfg(cfg)
    size = cfg.sizes("transformer_block")
    return _on(torch_layer(_tb_values(size), size["d"], size["heads"], size["d_ff"], norm_first=True).float(), cfg)


SERVED = {
    "layernorm_benchmark": Served("LayerNorm", "01_layernorm",
                                  *_served_norm("LayerNorm", nn.LayerNorm),
                                  _x("norm"), "torch.nn.LayerNorm"),
    "rmsnorm_benchmark": Served("RMSNorm", "02_rmsnorm",
                                *_served_norm("RMSNorm", lambda d: nn.RMSNorm(d, eps=1e-6)),
                                _x("norm"), "torch.nn.RMSNorm"),
    "residual_benchmark": Served("ResidualBlock", "03_residual", _served_res_build, _served_res_torch,
                                 _x("residual"), "x + F(nn.LayerNorm(x))"),
    "transformer_block_benchmark": Served("TransformerBlock", "04_transformer_block",
                                          _served_tb_build, _served_tb_torch,
                                          _x("transformer_block"), "nn.TransformerEncoderLayer"),
}


def reply(y: torch.Tensor, seed: int, cfg=None) -> torch.Tensor:
    """What goes back over the pipe for output ``y`` of the chain started from ``seed``.

    CPU: ``y`` itself. CUDA: ``y``'s rows (last dim) projected on a random unit-scale vector drawn
    from ``seed``, in float32: one number per row, each depending on the whole row, so the grader
    still checks every row of the chain's last output (and the chain makes every call count)."""
    cfg = _cfg(cfg)
    if cfg.kind != "cuda":
        return y
    d = y.shape[-1]
    g = torch.Generator().manual_seed(int(seed) ^ 0x5EED)  # drawn on the CPU: the same vector on any device
    v = (torch.randn(d, 1, generator=g, dtype=torch.float32) / d ** 0.5).to(y.device)
    return (y.reshape(-1, d).float() @ v).reshape(-1).cpu()


#: how close the student's reply must be to torch's on the same seed, per device type: float32
#: on the CPU (elementwise); bfloat16 on CUDA (relative to the reply's norm: chained bfloat16 calls
#: drift by a few units in the last place, which an elementwise test would punish near zero)
TOL = {"cpu": 5e-3, "cuda": 2e-2}


def expect_reply_close(got, want, what: str, device_type: str) -> None:
    """Raise :class:`CheckFailed` unless ``got`` matches ``want`` (both from :func:`reply`)."""
    from coursekit.checks.compare import expect_close, expect_tensor
    got = expect_tensor(got, what)
    tol = TOL[device_type]
    if device_type != "cuda":
        expect_close(got, want, what=what, atol=tol, rtol=tol, check_dtype=False)
        return
    want = want.float().cpu()
    if tuple(got.shape) != tuple(want.shape):
        raise CheckFailed(f"{what}: the reply has shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    got = got.float()
    if not torch.isfinite(got).all():
        raise CheckFailed(f"{what}: the output holds inf or nan")
    rel = float((got - want).norm() / want.norm().clamp_min(1e-12))
    if rel > tol:
        raise CheckFailed(f"{what}: differs from torch's by {rel:.3g} (relative to its size; "
                          f"at most {tol:g} expected in bfloat16)")


def served_report(out: dict, work) -> None:
    """Judge the count of work and print the grader-measured table (for information).

    ``out``: grade_id, times ({"yours": [...], "torch": [...], maybe "course solution" and
    "torch.compile"}, seconds per call per round, measured by the grader), bytes, copy, rounds,
    allowance; full (the work of one of the timed calls at full size, ``{"ops", "lines", "hot", "shape"}``,
    counted by the harness around the call the grader picked: :func:`coursekit.checks.scaling.judge_full`);
    and where it ran: device_type ("cpu" when absent), device, dtype, unavailable (column -> why it
    could not be timed). ``work``: :func:`coursekit.checks.scaling.measure`'s counts, taken by the
    harness when it built the module; with ``full`` they alone decide the points.
    """
    gid = out["grade_id"]
    spec = SERVED[gid]
    scaling.judge(work, gid, spec.name, LOOP_HINT[gid])
    scaling.judge_full(out.get("full"), work, gid, spec.name, LOOP_HINT[gid])
    print(scaling.describe(work, out["full"]))
    kind = out.get("device_type", "cpu")
    label = out.get("device", "cpu")
    rows = bench.summarize(out["times"], out["bytes"], out["copy"], label)
    ratio = robust_ratio(out["times"])
    rs = bench.ratios(out["times"], "yours", "torch")
    where = "1 thread" if kind == "cpu" else f"on {label}, {out.get('dtype', 'bfloat16')}"
    print(f"{gid}: timed by the grader from outside your notebook's process: {len(rs)} rounds, each on a "
          f"fresh random input, your output checked every round; {where}; "
          f"{out['allowance'] * 1e6:.0f} µs per round allowed for the pipe")
    print(bench.describe(kind, label, out.get("dtype", "float32" if kind == "cpu" else "bfloat16"),
                         "the grader's clock" + (", the GPU synchronized around each round" if kind == "cuda" else "")))
    print(bench.format_table(rows, unavailable=dict(out.get("unavailable") or {}), legend=True))
    if kind == "cpu":
        print(bench.NO_COMPILE_ON_CPU)
    print(bench.verdict_line(spec.torch_name, ratio, rs, TYPICAL[gid], unit="round"))


# Exercise 05's benchmark times a forward + backward (coursekit.checks.backward.served_entry): a
# callable x -> grad_x built around the student's FusedAddRMSNorm, timed like the others.
from coursekit.checks.backward import served_entry  # noqa: E402 -- after SERVED and Served exist

SERVED["backward_benchmark"] = Served(*served_entry())

# Exercise 06's too (coursekit.checks.streams.served_entry): x -> y of the student's MHCResidual, each call
# a forward and the backward pass for a fixed upstream gradient, against the block's formula with H_res given.
from coursekit.checks.streams import served_entry as _streams_entry  # noqa: E402

SERVED["streams_benchmark"] = Served(*_streams_entry())
