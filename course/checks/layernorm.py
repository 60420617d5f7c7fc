"""Checks of exercise 01: ``LayerNorm(normalized_shape, eps=1e-5, elementwise_affine=True)``.

Each check is independent (its own points): parameters, agreement with ``torch.nn.LayerNorm``,
tuple shapes, hard rows, half precision, gradients, shift/scale invariance. The
implementation checks forbid torch's own normalization ops (``NORM_OPS``). When an output is
wrong, the judge recomputes what known mistakes would have returned (:func:`formula` with a
switch flipped) and names the one that matches.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from course.checks import CheckFailed, frozen, register
from course.checks.compare import ANY, expect_close, paired
from course.checks.normcheck import (NormSpec, affine_values, call, detached_grad, expect_shape_dtype,
                                     randn, register_forward_check, register_gradients_check,
                                     register_half_precision_check, register_parameters_check,
                                     set_params, student_class, trailing_dims, with_hint)
from course.checks.ops import NORM_OPS

NAME = "LayerNorm"


def formula(x, w=None, b=None, eps=1e-5, dims=(-1,), *, ddof=0, eps_outside=False, center=True,
            sqrt=True, rms=False, bias_first=False, dtype=torch.float64, detach=()):
    """LayerNorm by its formula in ``dtype``, with switches that reproduce known mistakes."""
    h = x.to(dtype)
    mu = h.mean(dim=dims, keepdim=True)
    if rms:
        var = h.pow(2).mean(dim=dims, keepdim=True)
    else:
        n = math.prod(h.shape[d] for d in dims)
        var = (h - mu).pow(2).sum(dim=dims, keepdim=True) / (n - ddof)
    if "mean" in detach:
        mu = mu.detach()
    if "var" in detach:
        var = var.detach()
    denom = (var.sqrt() + eps) if eps_outside else ((var + eps).sqrt() if sqrt else var + eps)
    y = ((h - mu) if center and not rms else h) / denom
    if bias_first and b is not None:
        y = (y + b.to(dtype)) * (w.to(dtype) if w is not None else 1)
    else:
        if w is not None:
            y = y * w.to(dtype)
        if b is not None:
            y = y + b.to(dtype)
    return y


def suspects(x, vals, eps, nshape) -> dict:
    """What known wrong LayerNorms return on ``x`` (float64)."""
    w, b = vals.get("weight"), vals.get("bias")
    dims = trailing_dims(nshape)
    f = lambda **kw: formula(x, **{"w": w, "b": b, "eps": eps, "dims": dims, **kw})  # noqa: E731
    out = {
        "the variance is unbiased: divide by D, not D-1 (torch.var(..., unbiased=False), or mean((x - mean)**2))": f(ddof=1),
        "eps is outside the square root: divide by sqrt(var + eps), not sqrt(var) + eps": f(eps_outside=True),
        "the mean is not subtracted: normalize x - mean, not x": f(center=False),
        "this is RMSNorm (x / sqrt(mean(x**2) + eps)): LayerNorm subtracts the mean first": f(rms=True),
        "it divides by the variance, not by its square root (the standard deviation)": f(sqrt=False),
        "weight and bias are not applied: return weight * x_hat + bias": f(w=None, b=None),
        "bias is not added: return weight * x_hat + bias": f(b=None),
        "weight is not applied: return weight * x_hat + bias": f(w=None),
        "bias is added before scaling: return weight * x_hat + bias, not weight * (x_hat + bias)": f(bias_first=True),
        "the eps argument is not used (is it hard-coded?): use the eps given to the constructor": f(eps=1e-5) if eps != 1e-5 else None,
        "eps is missing: divide by sqrt(var + eps)": f(eps=0.0) if eps >= 1e-3 else None,
    }
    if len(dims) > 1:
        out[f"normalized over the last dimension only: normalized_shape={tuple(nshape)} means the "
            f"statistics go over the last {len(dims)} dimensions together"] = f(dims=(-1,))
    axis = "normalized over the wrong axis: the statistics go over the trailing normalized_shape dimension(s), one row (token) at a time"
    for i, d in enumerate([0, x.dim() - len(dims) - 1] if x.dim() > len(dims) else []):
        out[axis + " " * i] = f(dims=(d,))  # same message, distinct keys
    out[axis.replace("wrong axis", "whole tensor at once")] = f(dims=tuple(range(x.dim())))
    return out


LN = NormSpec(NAME, nn.LayerNorm, eps=1e-5, spread=2.0, values=affine_values, suspects=suspects)


# --------------------------------------------------------------------------------------------

PARAM_CASES = (
    ("int", (8,), frozen()),
    ("tuple", ((3, 4),), frozen()),
    ("eps", (6,), frozen(eps=1e-3)),
    ("no_affine", (8,), frozen(elementwise_affine=False)),
)


register_parameters_check(
    "layernorm_parameters",
    "weight (ones) and bias (zeros) of shape normalized_shape, registered like torch.nn.LayerNorm's",
    NAME, PARAM_CASES, nn.LayerNorm, {})


MATCH_CASES = (  # seed, input shape, normalized_shape, eps (None: the default), input scale
    (11, (4, 16, 32), 32, None, frozen()),
    (12, (1, 1, 8), 8, None, frozen()),
    (13, (6, 48), 48, 0.1, frozen(scale=0.5)),
    (14, (2, 3, 5, 20), 20, 1e-5, frozen()),
)


register_forward_check(
    "layernorm_matches_torch",
    "same output as torch.nn.LayerNorm on random inputs with random weight and bias",
    LN, MATCH_CASES)


TUPLE_CASES = (
    (21, (3, 5, 4, 8), (4, 8), None, frozen()),
    (22, (2, 6, 3, 4), (6, 3, 4), 1e-5, frozen()),
    (23, (7, 2, 9), (2, 9), None, frozen(scale=0.3)),
)


register_forward_check(
    "layernorm_tuple_shape",
    "a tuple normalized_shape normalizes over that many trailing dimensions together",
    LN, TUPLE_CASES)


# --------------------------------------------------------------------------------------------

HARD_D = 64
CONSTANTS = (3.0, -2.5, 0.0, 1.25)  # exact in float32: a constant row's mean is exact too
#: (name, rows, what it is, tolerance (atol, rtol), hint on failure)
HARD_GROUPS = (
    ("constant", slice(0, 4), "constant rows (variance 0: the output must equal bias)", (1e-4, 1e-4),
     " A constant row has variance 0: with eps inside the square root, (x - mean) / sqrt(0 + eps) = 0."),
    ("far", slice(8, 12), "rows far from zero (mean 1e4, std 1)", (2e-2, 2e-2),
     " With a large mean, E[x^2] - E[x]^2 cancels catastrophically in float32: compute the "
     "variance as mean((x - mean)**2)."),
    ("tiny", slice(4, 8), "rows with a tiny variance (1e-6, below eps = 1e-5)", (1e-4, 1e-4),
     " Here eps dominates the variance, so where eps goes (inside the square root) and its default "
     "(1e-5) decide the output."),
    ("plain", slice(12, 16), "ordinary rows", (1e-4, 1e-4), ""),
)


def _hard_input():
    g = torch.Generator().manual_seed(31)
    z = torch.randn(16, HARD_D, generator=g, dtype=torch.float64)
    x = torch.empty(16, HARD_D, dtype=torch.float64)
    x[0:4] = torch.tensor(CONSTANTS, dtype=torch.float64)[:, None]
    x[4:8] = 0.5 + 1e-3 * z[4:8]
    x[8:12] = 1e4 + z[8:12]
    x[12:16] = z[12:16]
    return x.float()


@register("layernorm_hard_rows", needs=(NAME,), forbidden_ops=NORM_OPS)
class HardRows:
    """constant rows (no NaN, output = bias), tiny-variance rows and rows with a large mean"""

    @staticmethod
    def probe(ns):
        m = student_class(ns, NAME)(HARD_D)
        set_params(m, affine_values(32, HARD_D), NAME)
        return call(m, _hard_input(), NAME)

    @staticmethod
    def judge(y):
        x = _hard_input()
        vals = affine_values(32, HARD_D)
        want32 = LN.torch_module(HARD_D, 1e-5, vals)(x).detach()
        want64 = LN.torch_module(HARD_D, 1e-5, vals, torch.float64)(x.double()).detach().float()
        sus_all = suspects(x.double(), vals, 1e-5, HARD_D)
        sus_all["the default eps is not 1e-5"] = formula(x.double(), vals["weight"], vals["bias"], 1e-6)
        expect_shape_dtype(y, want32, "LayerNorm(64)'s output")
        for key, rows, what, (atol, rtol), hint in HARD_GROUPS:
            want = (want64 if key == "far" else want32)[rows]
            sus = {m: s[rows] for m, s in sus_all.items() if s is not None and s.dim() == 2}
            if y[rows].isnan().any():
                raise CheckFailed(f"the output for {what} contains NaN.{hint}")
            with_hint(lambda: expect_close(y[rows], want, what=f"the output for {what}",
                                           atol=atol, rtol=rtol, suspects=sus), hint)


# --------------------------------------------------------------------------------------------

HALF_CASES = (  # seed, shape, normalized_shape, eps, input scale; values ~300 square past 65504
    (51, (8, 256), 256, None, frozen(scale=300.0, spread=0.0)),
    (52, (4, 8, 64), 64, None, frozen(scale=1.0)),
)
BF16_CASES = (
    (53, (8, 256), 256, None, frozen(scale=300.0, spread=100.0)),
    (54, (4, 8, 64), 64, None, frozen(scale=1.0)),
)
HALF_HINT = (" Compute the statistics in float32 (e.g. h = x.float()) and cast the result back "
             "with .to(x.dtype): float16 overflows past 65504, and (x - mean)**2 of values around "
             "300 is already 90000.")


register_half_precision_check(
    "layernorm_half_precision",
    "float16 and bfloat16 inputs: output keeps the dtype, no overflow where torch has none",
    LN, HALF_CASES, BF16_CASES, HALF_HINT)


# --------------------------------------------------------------------------------------------

GRAD_SPECS = ((41, (3, 5, 24), 24), (42, (2, 3, 4, 6), (4, 6)))  # seed, input shape, normalized_shape


def _detached(x, vals, g, i):
    dims = trailing_dims(GRAD_SPECS[i][2])
    fn = lambda x, v, d: formula(x, v["weight"], v["bias"], 1e-5, dims, detach=d)  # noqa: E731
    return {
        "the statistics are detached from the graph (.detach(), .item() or .data): the gradient must flow through the mean and the variance too":
            detached_grad(fn, x, vals, g, ("mean", "var")),
        "the variance is detached from the graph: the gradient must flow through it too":
            detached_grad(fn, x, vals, g, ("var",)),
        "the mean is detached from the graph: the gradient must flow through it too":
            detached_grad(fn, x, vals, g, ("mean",)),
    }


register_gradients_check(
    "layernorm_gradients",
    "gradients with respect to the input, weight and bias equal torch.nn.LayerNorm's (float64)",
    LN, GRAD_SPECS, _detached)


# --------------------------------------------------------------------------------------------

N_SEEDS = 40


def _invariance_case(seed):
    g = torch.Generator().manual_seed(7000 + seed)
    d = 8 + (13 * seed) % 90
    rows = 1 + seed % 4
    a = float(torch.empty(()).uniform_(math.log(0.5), math.log(50.0), generator=g).exp())
    b = float(torch.empty(()).uniform_(-50.0, 50.0, generator=g))
    x = randn(8000 + seed, rows, d)
    return d, x, a, b


@register("layernorm_shift_scale_invariance", needs=(NAME,), forbidden_ops=NORM_OPS)
class ShiftScaleInvariance:
    """LayerNorm(a*x + b) == LayerNorm(x) for a > 0, on 40 random rows, sizes and (a, b)"""

    @staticmethod
    def probe(ns):
        cls = student_class(ns, NAME)
        out = []
        for seed in range(N_SEEDS):
            d, x, a, b = _invariance_case(seed)
            m = cls(d)
            set_params(m, {"weight": torch.ones(d), "bias": torch.zeros(d)}, NAME)
            out.append([call(m, x, NAME), call(m, a * x + b, NAME)])
        return out

    @staticmethod
    def judge(out):
        for seed, (y, y_ab) in paired(range(N_SEEDS), out, [ANY, ANY]):
            d, x, a, b = _invariance_case(seed)
            ref = nn.LayerNorm(d)
            expect_close(y, ref(x).detach(), what=f"LayerNorm({d}) on random rows (seed {seed})",
                         atol=1e-3, rtol=1e-3, suspects=suspects(x.double(), {}, 1e-5, d))
            expect_close(y_ab, y.detach(), atol=1e-3, rtol=1e-3,
                         what=f"LayerNorm({d}) of {a:.3g} * x + {b:.3g} (seed {seed}): it should equal "
                              "LayerNorm(x), since subtracting the mean removes b and dividing by "
                              "the standard deviation removes a; yours")
