"""Checks of exercise 02: ``RMSNorm(normalized_shape, eps=1e-6, elementwise_affine=True)``.

Same layout as :mod:`course.checks.layernorm`: parameters, agreement with
``torch.nn.RMSNorm(normalized_shape, eps=1e-6)``, tuple shapes, hard rows (zero rows: eps
matters), float16 without overflow, gradients, scale invariance. Known mistakes are recomputed
by :func:`formula` so that a failure names the one that matches.
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
                                     row_offsets, set_params, student_class, trailing_dims, with_hint)
from course.checks.ops import NORM_OPS

NAME = "RMSNorm"
EPS = 1e-6


def formula(x, w=None, eps=EPS, dims=(-1,), *, center=False, eps_outside=False, total=False,
            sqrt=True, dtype=torch.float64, detach=False):
    """RMSNorm by its formula in ``dtype``, with switches that reproduce known mistakes."""
    h = x.to(dtype)
    if center:
        h = h - h.mean(dim=dims, keepdim=True)
    ms = h.pow(2).sum(dim=dims, keepdim=True) if total else h.pow(2).mean(dim=dims, keepdim=True)
    if detach:
        ms = ms.detach()
    denom = (ms.sqrt() + eps) if eps_outside else ((ms + eps).sqrt() if sqrt else ms + eps)
    y = h / denom
    return y * w.to(dtype) if w is not None else y


def _weight(seed, nshape):
    return affine_values(seed, nshape, names=("weight",))


def suspects(x, vals, eps, nshape) -> dict:
    w = vals.get("weight")
    dims = trailing_dims(nshape)
    f = lambda **kw: formula(x, **{"w": w, "eps": eps, "dims": dims, **kw})  # noqa: E731
    out = {
        "the mean is subtracted: that is LayerNorm. RMSNorm divides x itself by sqrt(mean(x**2) + eps)": f(center=True),
        "eps is outside the square root: divide by sqrt(mean(x**2) + eps), not sqrt(mean(x**2)) + eps": f(eps_outside=True),
        "it uses the sum of the squares, not their mean: divide by D inside the square root": f(total=True),
        "it divides by mean(x**2) + eps, not by its square root": f(sqrt=False),
        "weight is not applied: return x / RMS(x) * weight": f(w=None),
        "the eps argument is not used (is it hard-coded?): use the eps given to the constructor": f(eps=EPS) if eps != EPS else None,
        "eps is missing: divide by sqrt(mean(x**2) + eps)": f(eps=0.0) if eps >= 1e-3 else None,
    }
    if len(dims) > 1:
        out[f"normalized over the last dimension only: normalized_shape={tuple(nshape)} means the "
            f"mean of squares goes over the last {len(dims)} dimensions together"] = f(dims=(-1,))
    axis = "normalized over the wrong axis: the mean of squares goes over the trailing normalized_shape dimension(s), one row (token) at a time"
    for i, d in enumerate([0, x.dim() - len(dims) - 1] if x.dim() > len(dims) else []):
        out[axis + " " * i] = f(dims=(d,))
    out[axis.replace("wrong axis", "whole tensor at once")] = f(dims=tuple(range(x.dim())))
    return out


RMS = NormSpec(NAME, nn.RMSNorm, eps=EPS, spread=1.0, values=_weight, suspects=suspects)


# --------------------------------------------------------------------------------------------

PARAM_CASES = (
    ("int", (8,), frozen()),
    ("tuple", ((3, 4),), frozen()),
    ("eps", (6,), frozen(eps=1e-3)),
    ("no_affine", (8,), frozen(elementwise_affine=False)),
)


register_parameters_check(
    "rmsnorm_parameters",
    "a weight (ones) of shape normalized_shape and no bias, registered like torch.nn.RMSNorm's",
    NAME, PARAM_CASES, nn.RMSNorm, {"eps": EPS})


MATCH_CASES = (  # seed, input shape, normalized_shape, eps (None: the default), input scale
    (11, (4, 16, 32), 32, None, frozen()),
    (12, (1, 1, 8), 8, None, frozen()),
    (13, (6, 48), 48, 0.1, frozen(scale=0.3, spread=0.1)),
    (14, (2, 3, 5, 20), 20, 1e-5, frozen()),
)


register_forward_check(
    "rmsnorm_matches_torch",
    "same output as torch.nn.RMSNorm(normalized_shape, eps=1e-6) on random inputs and weights",
    RMS, MATCH_CASES)


TUPLE_CASES = (
    (21, (3, 5, 4, 8), (4, 8), None, frozen()),
    (22, (2, 6, 3, 4), (6, 3, 4), 1e-5, frozen()),
    (23, (7, 2, 9), (2, 9), None, frozen(scale=0.3)),
)


register_forward_check(
    "rmsnorm_tuple_shape",
    "a tuple normalized_shape normalizes over that many trailing dimensions together",
    RMS, TUPLE_CASES)


# --------------------------------------------------------------------------------------------

HARD_D = 64
HARD_GROUPS = (
    ("zero", slice(0, 4), "all-zero rows (the output must be 0)",
     " A zero row has mean(x**2) = 0: without eps inside the square root that is 0 / 0 = NaN."),
    ("tiny", slice(4, 8), "rows of tiny values (mean(x**2) = 1e-8, below eps = 1e-6)",
     " Here eps dominates mean(x**2), so where eps goes (inside the square root) and its default "
     "(1e-6) decide the output."),
    ("large", slice(8, 12), "rows of large values (around 5000)", ""),
    ("plain", slice(12, 16), "ordinary rows", ""),
)


def _hard_input():
    g = torch.Generator().manual_seed(31)
    z = torch.randn(16, HARD_D, generator=g, dtype=torch.float64)
    x = torch.zeros(16, HARD_D, dtype=torch.float64)
    x[4:8] = 1e-4 * z[4:8]
    x[8:12] = 5e3 + 1e3 * z[8:12]
    x[12:16] = z[12:16]
    return x.float()


@register("rmsnorm_hard_rows", needs=(NAME,), forbidden_ops=NORM_OPS)
class HardRows:
    """all-zero rows (eps keeps them finite), rows of tiny values and rows of large values"""

    @staticmethod
    def probe(ns):
        m = student_class(ns, NAME)(HARD_D)
        set_params(m, _weight(32, HARD_D), NAME)
        return call(m, _hard_input(), NAME)

    @staticmethod
    def judge(y):
        x = _hard_input()
        vals = _weight(32, HARD_D)
        want = RMS.torch_module(HARD_D, EPS, vals)(x).detach()
        sus_all = suspects(x.double(), vals, EPS, HARD_D)
        sus_all["the default eps is not 1e-6"] = formula(x.double(), vals["weight"], 1e-5)
        sus_all["eps is missing: divide by sqrt(mean(x**2) + eps)"] = formula(x.double(), vals["weight"], 0.0)
        expect_shape_dtype(y, want, "RMSNorm(64)'s output")
        for key, rows, what, hint in HARD_GROUPS:
            sus = {m: s[rows] for m, s in sus_all.items() if s is not None}
            if y[rows].isnan().any():
                raise CheckFailed(f"the output for {what} contains NaN.{hint}")
            with_hint(lambda: expect_close(y[rows], want[rows], what=f"the output for {what}",
                                           suspects=sus), hint)


# --------------------------------------------------------------------------------------------

HALF_CASES = (  # values ~300: their squares (90000) overflow float16 (max 65504)
    (51, (8, 256), 256, None, frozen(scale=300.0, spread=0.0)),
    (52, (4, 8, 64), 64, None, frozen(scale=1.0)),
)
BF16_CASES = (
    (53, (8, 256), 256, None, frozen(scale=300.0, spread=100.0)),
    (54, (4, 8, 64), 64, None, frozen(scale=1.0)),
)
HALF_HINT = (" Compute mean(x**2) in float32 (e.g. h = x.float()) and cast the result back with "
             ".to(x.dtype): x**2 of values around 300 is 90000, past float16's largest value 65504.")


register_half_precision_check(
    "rmsnorm_fp16_no_overflow",
    "float16 and bfloat16 inputs: output keeps the dtype, no overflow where torch has none",
    RMS, HALF_CASES, BF16_CASES, HALF_HINT)


# --------------------------------------------------------------------------------------------

GRAD_SPECS = ((41, (3, 5, 24), 24), (42, (2, 3, 4, 6), (4, 6)))  # seed, input shape, normalized_shape


def _detached(x, vals, g, i):
    dims = trailing_dims(GRAD_SPECS[i][2])
    fn = lambda x, v, d: formula(x, v["weight"], EPS, dims, detach=d)  # noqa: E731
    return {"the RMS is detached from the graph (.detach(), .item() or .data): the gradient must "
            "flow through mean(x**2) too": detached_grad(fn, x, vals, g, True)}


register_gradients_check(
    "rmsnorm_gradients",
    "gradients with respect to the input and weight equal torch.nn.RMSNorm's (float64)",
    RMS, GRAD_SPECS, _detached)


# --------------------------------------------------------------------------------------------

N_SEEDS = 40


def _invariance_case(seed):
    g = torch.Generator().manual_seed(7000 + seed)
    d = 8 + (13 * seed) % 90
    rows = 1 + seed % 4
    a = float(torch.empty(()).uniform_(math.log(0.5), math.log(50.0), generator=g).exp())
    x = randn(8000 + seed, rows, d) + row_offsets(9000 + seed, (rows, d), 1.0)
    return d, x, a


@register("rmsnorm_scale_invariance", needs=(NAME,), forbidden_ops=NORM_OPS)
class ScaleInvariance:
    """RMSNorm(a*x) == RMSNorm(x) for a > 0, on 40 random rows, sizes and scales a"""

    @staticmethod
    def probe(ns):
        cls = student_class(ns, NAME)
        out = []
        for seed in range(N_SEEDS):
            d, x, a = _invariance_case(seed)
            m = cls(d)
            set_params(m, {"weight": torch.ones(d)}, NAME)
            out.append([call(m, x, NAME), call(m, a * x, NAME)])
        return out

    @staticmethod
    def judge(out):
        for seed, (y, y_a) in paired(range(N_SEEDS), out, [ANY, ANY]):
            d, x, a = _invariance_case(seed)
            ref = nn.RMSNorm(d, eps=EPS)
            expect_close(y, ref(x).detach(), what=f"RMSNorm({d}) on random rows (seed {seed})",
                         atol=1e-3, rtol=1e-3, suspects=suspects(x.double(), {}, EPS, d))
            expect_close(y_a, y.detach(), atol=1e-3, rtol=1e-3,
                         what=f"RMSNorm({d}) of {a:.3g} * x (seed {seed}): it should equal "
                              "RMSNorm(x), since dividing by the root mean square removes a; yours")
