"""Checks of exercise 02: ``RMSNorm(normalized_shape, eps=1e-6, elementwise_affine=True)``.

Same layout as :mod:`coursekit.checks.layernorm`: the visible checks (parameters, agreement with
``torch.nn.RMSNorm(normalized_shape, eps=1e-6)``, float16 without overflow); the hidden ones live
in ``course.hidden``. Known mistakes are recomputed by :func:`formula` so that a failure names the
one that matches.
"""
from __future__ import annotations

import torch
from torch import nn

from coursekit.contract import RMSNORM_EPS
from coursekit.checks import frozen
from coursekit.checks.normcheck import (NormSpec, affine_values, register_forward_check,
                                        register_half_precision_check, register_parameters_check,
                                        trailing_dims)

NAME = "RMSNorm"
EPS = RMSNORM_EPS


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


