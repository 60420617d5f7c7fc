"""The hidden checks of layernorm (instructor side): registered into coursekit's registry when
this package is importable (the grader, stock nbgrader in the course directory, the tests).
Students never get this file: their notebooks only run these checks' visible smoke calls.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from coursekit.contract import LAYERNORM_EPS, RMSNORM_EPS
from coursekit.checks import CheckFailed, frozen, register
from coursekit.checks.compare import ANY, expect_close, paired
from coursekit.checks.seeded import generator
from coursekit.checks.normcheck import (FormCase, build_norm, forward_case, affine_values, call, detached_grad,
                                        expect_shape_dtype, randn, register_forms_check, register_forward_check,
                                        register_gradients_check, register_half_gradients_check, set_params,
                                        student_class, trailing_dims, with_hint)
from coursekit.checks.ops import NORM_OPS
from coursekit.checks.layernorm import LN, NAME, formula, suspects


TUPLE_CASES = (
    (21, (3, 5, 4, 8), (4, 8), None, frozen()),
    (22, (2, 6, 3, 4), (6, 3, 4), 1e-5, frozen()),
    (23, (7, 2, 9), (2, 9), None, frozen(scale=0.3)),
)


register_forward_check(
    "layernorm_tuple_shape",
    "a tuple normalized_shape normalizes over that many trailing dimensions together",
    LN, TUPLE_CASES)


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
    g = generator(31)
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
        return forward_case(ns, NAME, (HARD_D,), {}, None, affine_values(32, HARD_D), _hard_input())

    @staticmethod
    def judge(y):
        x = _hard_input()
        vals = affine_values(32, HARD_D)
        want32 = LN.torch_module(HARD_D, LAYERNORM_EPS, vals)(x).detach()
        want64 = LN.torch_module(HARD_D, LAYERNORM_EPS, vals, torch.float64)(x.double()).detach().float()
        sus_all = suspects(x.double(), vals, LAYERNORM_EPS, HARD_D)
        sus_all["the default eps is not 1e-5"] = formula(x.double(), vals["weight"], vals["bias"], RMSNORM_EPS)
        expect_shape_dtype(y, want32, "LayerNorm(64)'s output")
        for key, rows, what, (atol, rtol), hint in HARD_GROUPS:
            want = (want64 if key == "far" else want32)[rows]
            sus = {m: s[rows] for m, s in sus_all.items() if s is not None and s.dim() == 2}
            if y[rows].isnan().any():
                raise CheckFailed(f"the output for {what} contains NaN.{hint}")
            with_hint(lambda: expect_close(y[rows], want, what=f"the output for {what}",
                                           atol=atol, rtol=rtol, suspects=sus), hint)


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


N_SEEDS = 40


def _invariance_case(seed):
    g = generator(7000 + seed)
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
        student_class(ns, NAME)  # not a class: say so before any case
        out = []
        for seed in range(N_SEEDS):
            d, x, a, b = _invariance_case(seed)
            m = build_norm(ns, NAME, (d,), {}, None, {"weight": torch.ones(d), "bias": torch.zeros(d)})
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


FORM = ("normalized_shape may be an int, a tuple, a list or a torch.Size, as in torch.nn.LayerNorm: "
        "keep it as tuple(normalized_shape) (an int n as (n,)).")
POSITIONAL = ("The arguments may come by position, as torch.nn.LayerNorm's do: (normalized_shape, eps, "
              "elementwise_affine, bias), in that order.")
NO_AFFINE = ("With elementwise_affine=False there is no weight and no bias (both None): forward only "
             "normalizes, and must not touch them.")
NO_BIAS = ("With bias=False there is a weight but no bias (None), as in torch.nn.LayerNorm(..., bias=False): "
           "forward scales and does not shift.")

ARG_CASES = (  # the first case a wrong version fails names its mistake: list forms first
    FormCase(61, (2, 5, 3, 4), (3, 4), "list", mistake=FORM),
    FormCase(62, (2, 5, 3, 4), (3, 4), "size", mistake=FORM),
    FormCase(63, (4, 6, 10), (10,), "list", mistake=FORM),
    FormCase(64, (4, 10), 10, "int", args=(0.1,), xkw=frozen(scale=0.3, spread=0.5), mistake=POSITIONAL),
    FormCase(65, (3, 6, 16), 16, "int", kw=frozen(elementwise_affine=False), mistake=NO_AFFINE),
    FormCase(66, (2, 4, 3, 5), (3, 5), "tuple", kw=frozen(elementwise_affine=False), mistake=NO_AFFINE),
    FormCase(67, (3, 12), 12, "size", args=(0.1, False), xkw=frozen(scale=0.3, spread=0.5),
             mistake=POSITIONAL + " " + NO_AFFINE),
    FormCase(68, (3, 6, 16), 16, "int", kw=frozen(bias=False), mistake=NO_BIAS),
    FormCase(69, (2, 7, 8), (8,), "list", args=(1e-3, True, False), mistake=POSITIONAL + " " + NO_BIAS),
)


register_forms_check(
    "layernorm_argument_forms", "normalized_shape as an int, a list or a torch.Size; eps and elementwise_affine by position; no weight and bias (elementwise_affine=False); no bias (bias=False)",
    LN, ARG_CASES)


D_ONE = ("With D = 1 a row is one number, x - mean is 0, and the output is exactly bias: nothing may "
         "divide by D - 1 or squeeze the normalized dim away.")
EMPTY = ("An empty batch (0 rows) gives an empty output of the same shape, as torch's does: no "
         "reshape with -1 next to a 0, no per-row loop that stacks nothing, no torch.vmap over 0 rows.")
WHOLE = ("normalized_shape may cover the whole input (no leading dims at all): the statistics then "
         "go over all of it.")
NON_CONTIGUOUS = ("The input may be a non-contiguous view (a transpose, a slice): .view() refuses those, "
                  "so use .reshape() or reduce over the trailing dims directly.")

EDGE_CASES = (
    FormCase(71, (5, 1), 1, mistake=D_ONE),
    FormCase(72, (2, 3, 1), (1,), "tuple", mistake=D_ONE),
    FormCase(73, (0, 8), 8, mistake=EMPTY),
    FormCase(74, (2, 0, 8), 8, mistake=EMPTY),
    FormCase(75, (3, 4, 5), (3, 4, 5), "tuple", mistake=WHOLE),
    FormCase(76, (12,), 12, mistake=WHOLE),
    FormCase(77, (3, 16, 5), 16, view=("t", -1, -2), mistake=NON_CONTIGUOUS),
    FormCase(78, (6, 4, 16), 16, view=("t", 0, 1), mistake=NON_CONTIGUOUS),
    FormCase(79, (4, 6, 32), 16, view=("s", -1, 2), mistake=NON_CONTIGUOUS),
)


register_forms_check(
    "layernorm_edge_shapes", "D = 1, an empty batch (0 rows), normalized_shape covering the whole input, and non-contiguous inputs (transposed or sliced views)",
    LN, EDGE_CASES)


HALF_GRAD_SPECS = (  # seed, input shape, normalized_shape, input kwargs; values ~300 square past 65504
    (81, (4, 8, 64), 64, frozen(scale=1.0)),
    (82, (8, 128), 128, frozen(scale=300.0, spread=0.0)),
    (83, (2, 3, 4, 6), (4, 6), frozen()),
)


register_half_gradients_check(
    "layernorm_half_gradients", "float16 and bfloat16 gradients with respect to the input, weight and bias: in their tensors' dtype, close to torch.nn.LayerNorm's in the same dtype",
    LN, HALF_GRAD_SPECS,
    " The backward pass must not overflow either: compute it from float32 statistics (autograd does, "
    "through h = x.float(); a hand-written backward must upcast too), then cast the gradient back.")
