"""The hidden checks of rmsnorm (instructor side): registered into coursekit's registry when
this package is importable (the grader, stock nbgrader in the course directory, the tests).
Students never get this file: their notebooks only run these checks' visible smoke calls.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from coursekit.checks import CheckFailed, frozen, register
from coursekit.checks.compare import ANY, expect_close, paired
from coursekit.checks.seeded import generator
from coursekit.checks.normcheck import (FormCase, build_norm, forward_case, call, detached_grad, expect_shape_dtype,
                                        randn, register_forms_check, register_forward_check, register_gradients_check,
                                        register_half_gradients_check, row_offsets, set_params, student_class,
                                        trailing_dims, with_hint)
from coursekit.checks.ops import NORM_OPS
from coursekit.checks.rmsnorm import EPS, NAME, RMS, _weight, formula, suspects


TUPLE_CASES = (
    (21, (3, 5, 4, 8), (4, 8), None, frozen()),
    (22, (2, 6, 3, 4), (6, 3, 4), 1e-5, frozen()),
    (23, (7, 2, 9), (2, 9), None, frozen(scale=0.3)),
)


register_forward_check(
    "rmsnorm_tuple_shape",
    "a tuple normalized_shape normalizes over that many trailing dimensions together",
    RMS, TUPLE_CASES)


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
    g = generator(31)
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
        return forward_case(ns, NAME, (HARD_D,), {}, None, _weight(32, HARD_D), _hard_input())

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


N_SEEDS = 40


def _invariance_case(seed):
    g = generator(7000 + seed)
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
        student_class(ns, NAME)  # not a class: say so before any case
        out = []
        for seed in range(N_SEEDS):
            d, x, a = _invariance_case(seed)
            m = build_norm(ns, NAME, (d,), {}, None, {"weight": torch.ones(d)})
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


FORM = ("normalized_shape may be an int, a tuple, a list or a torch.Size, as in torch.nn.RMSNorm: "
        "keep it as tuple(normalized_shape) (an int n as (n,)).")
POSITIONAL = ("The arguments may come by position, as torch.nn.RMSNorm's do: (normalized_shape, eps, "
              "elementwise_affine), in that order.")
NO_AFFINE = ("With elementwise_affine=False there is no weight (None): forward only normalizes, and must "
             "not touch it (check `self.weight is not None` before scaling or reading its dtype).")

ARG_CASES = (  # the first case a wrong version fails names its mistake: list forms first
    FormCase(61, (2, 5, 3, 4), (3, 4), "list", mistake=FORM),
    FormCase(62, (2, 5, 3, 4), (3, 4), "size", mistake=FORM),
    FormCase(63, (4, 6, 10), (10,), "list", mistake=FORM),
    FormCase(64, (4, 10), 10, "int", args=(0.1,), xkw=frozen(scale=0.3, spread=0.1), mistake=POSITIONAL),
    FormCase(65, (3, 6, 16), 16, "int", kw=frozen(elementwise_affine=False), mistake=NO_AFFINE),
    FormCase(66, (2, 4, 3, 5), (3, 5), "tuple", kw=frozen(elementwise_affine=False), mistake=NO_AFFINE),
    FormCase(67, (3, 12), 12, "size", args=(0.1, False), xkw=frozen(scale=0.3, spread=0.1),
             mistake=POSITIONAL + " " + NO_AFFINE),
)


register_forms_check(
    "rmsnorm_argument_forms", "normalized_shape as an int, a list or a torch.Size; eps and elementwise_affine by position; no weight (elementwise_affine=False)",
    RMS, ARG_CASES)


D_ONE = ("With D = 1 a row is one number x, and the output is x / sqrt(x**2 + eps) * weight: nothing may "
         "squeeze the normalized dim away.")
EMPTY = ("An empty batch (0 rows) gives an empty output of the same shape, as torch's does: no "
         "reshape with -1 next to a 0, no per-row loop that stacks nothing, no torch.vmap over 0 rows.")
WHOLE = ("normalized_shape may cover the whole input (no leading dims at all): the mean of squares "
         "then goes over all of it.")
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
    "rmsnorm_edge_shapes", "D = 1, an empty batch (0 rows), normalized_shape covering the whole input, and non-contiguous inputs (transposed or sliced views)",
    RMS, EDGE_CASES)


HALF_GRAD_SPECS = (  # seed, input shape, normalized_shape, input kwargs; values ~300 square past 65504
    (81, (4, 8, 64), 64, frozen(scale=1.0)),
    (82, (8, 128), 128, frozen(scale=300.0, spread=0.0)),
    (83, (2, 3, 4, 6), (4, 6), frozen()),
)


register_half_gradients_check(
    "rmsnorm_half_gradients", "float16 and bfloat16 gradients with respect to the input and weight: in their tensors' dtype, close to torch.nn.RMSNorm's in the same dtype",
    RMS, HALF_GRAD_SPECS,
    " The backward pass must not overflow either: compute it from float32 statistics (autograd does, "
    "through h = x.float(); a hand-written backward must upcast too), then cast the gradient back.")
