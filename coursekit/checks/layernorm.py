"""Checks of exercise 01: ``LayerNorm(normalized_shape, eps=1e-5, elementwise_affine=True, bias=True)``.

The visible checks, each worth its own points: parameters, agreement with ``torch.nn.LayerNorm``,
half precision (the hidden ones live with the instructor's code, in ``course.hidden``). The
implementation checks forbid torch's own normalization ops (``NORM_OPS``). When an output is
wrong, the judge recomputes what known mistakes would have returned (:func:`formula` with a
switch flipped) and names the one that matches.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from coursekit.contract import LAYERNORM_EPS
from coursekit.checks import frozen
from coursekit.checks.normcheck import (NormSpec, affine_values, register_forward_check,
                                        register_half_precision_check, register_parameters_check,
                                        trailing_dims)

NAME = "LayerNorm"


def formula(x, w=None, b=None, eps=LAYERNORM_EPS, dims=(-1,), *, ddof=0, eps_outside=False, center=True,
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
        "the eps argument is not used (is it hard-coded?): use the eps given to the constructor": f(eps=LAYERNORM_EPS) if eps != LAYERNORM_EPS else None,
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


LN = NormSpec(NAME, nn.LayerNorm, eps=LAYERNORM_EPS, spread=2.0, values=affine_values, suspects=suspects)


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


