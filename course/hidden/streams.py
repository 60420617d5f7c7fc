"""The hidden checks of exercise 06 (instructor side): ``sinkhorn_knopp``, ``MHCResidual`` and
``depth_attention`` against the references below, on inputs drawn per grading run (every seed goes
through :func:`coursekit.checks.seeded.generator`, which the referee moves by the run's draw).
Registered into coursekit's registry when this package is importable; students only run their
visible smoke calls. The references live here, not in the student's runtime: ``coursekit`` ships
no implementation of the exercise.
"""
from __future__ import annotations

import functools

import torch

from coursekit.checks import CheckFailed, register
from coursekit.checks.compare import ANY, TOLERANCES, expect_close, expect_structure, expect_tensor, paired
from coursekit.checks.residual import D
from coursekit.checks.seeded import call_keeping_inputs, expect_inputs_kept, randn
from coursekit.checks.streams import (DA, EQUAL_STREAMS_MISTAKES, F32, F64, MHC, SK, build_mhc, expect_dtype_shape, judge_parts,
                                      logits_of, mhc_formula, mhc_grads, mhc_params, mix_suspects, sinkhorn_each,
                                      sinkhorn_vjp, streams_of)

HALF = (torch.float16, torch.bfloat16)
#: a mismatch names where the expected value came from
close = functools.partial(expect_close, against="the reference")


# --------------------------------------------------------------------------------------------
# The references (float64), with switches that reproduce known mistakes
# --------------------------------------------------------------------------------------------

#: the dims each iteration normalizes over, in order (rows are dim -1, columns dim -2)
ORDERS = {"rows then columns": (-1, -2), "columns then rows": (-2, -1), "rows only": (-1,), "columns only": (-2,),
          "dims 1 then 0": (1, 0)}


def ref_sinkhorn(logits, n_iters: int, order: str = "rows then columns") -> torch.Tensor:
    """Sinkhorn-Knopp in float64: exp(logits - max over the last two dims), then ``n_iters`` times the rows
    and then the columns divided by their sums."""
    z = logits.double()
    p = torch.exp(z - z.amax(dim=(-2, -1), keepdim=True))
    for _ in range(n_iters):
        for dim in ORDERS[order]:
            p = p / p.sum(dim, keepdim=True)
    return p


def ref_depth_attention(sources, query, eps: float = 1e-6, mistake=None) -> torch.Tensor:
    """The attention-residual aggregator in float64: softmax over the sources of (RMS-normalized key) . query,
    the sources weighed by it; or a known mistake."""
    v, q = sources.double(), query.double()
    if mistake == "float16":  # the formula in float16 arithmetic: squares past 65504 are inf
        v16, q16 = sources.half(), query.half()
        k16 = v16 * torch.rsqrt(v16.pow(2).mean(-1, keepdim=True) + eps)
        alpha16 = torch.softmax(k16 @ q16, dim=0)
        return (alpha16.unsqueeze(-1) * v16).sum(0).double()
    if mistake == "no key norm":
        k = v
    elif mistake == "layernorm keys":
        c = v - v.mean(-1, keepdim=True)
        k = c * torch.rsqrt(c.pow(2).mean(-1, keepdim=True) + eps)
    elif mistake == "eps outside":
        k = v / (v.pow(2).mean(-1, keepdim=True).sqrt() + eps)
    else:
        k = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)
    if mistake == "features":
        w = torch.softmax(k * q, dim=-1)  # one weight per feature, not per source
        return (w * v).sum(0)
    scores = torch.einsum("s...d,d->s...", k, q)
    alpha = torch.softmax(scores, dim=-1 if mistake == "last axis" else 0)
    return torch.einsum("s...,s...d->...d", alpha, k if mistake == "keys summed" else v)


DA_MISTAKES = {
    "no key norm": "the keys are not RMS-normalized: k_s = sources[s] * rsqrt(mean(sources[s]**2, -1) + eps)",
    "layernorm keys": "the keys subtract their mean (LayerNorm): they are RMS-normalized, sources[s] * "
                      "rsqrt(mean(sources[s]**2, -1) + eps), nothing subtracted",
    "eps outside": "eps is outside the square root: k_s = sources[s] * rsqrt(mean(sources[s]**2, -1) + eps)",
    "features": "the softmax runs over the feature axis: each source gets one weight, softmax over the sources "
                "(dim 0) of the scores k_s . query",
    "last axis": "the softmax runs over the last axis of the scores (a batch or token axis): it goes over the "
                 "sources, dim 0 of scores of shape (S, ...)",
    "keys summed": "it sums the normalized keys: the weights apply to the sources themselves, sum_s alpha_s * "
                   "sources[s]",
}


def _da_suspects(sources, query, eps):
    return {msg: ref_depth_attention(sources, query, eps, key) for key, msg in DA_MISTAKES.items()}


# --------------------------------------------------------------------------------------------
# sinkhorn_knopp
# --------------------------------------------------------------------------------------------

SK_MISTAKES = {  # (a softmax over the last dim is "rows only": n row normalizations of exp(logits) are one)
    "columns then rows": "the columns are normalized before the rows: each iteration divides by the row sums "
                         "first, then by the column sums",
    "rows only": "only the rows are normalized (as a softmax over the last dim does): each iteration divides by the "
                 "row sums, then by the column sums",
    "columns only": "only the columns are normalized: each iteration divides by the row sums, then by the column sums",
}


def _sk_suspects(L, n_iters, dtype, grad_of=None):
    """message -> the wrong result (or, with ``grad_of=W``, the gradient of sum(result * W) for logits ``L``)."""
    def f(fn):
        if grad_of is None:
            return fn(L).to(dtype)
        leaf = L.detach().double().requires_grad_(True)
        with torch.enable_grad():
            return torch.autograd.grad((fn(leaf) * grad_of).sum(), leaf)[0]

    out = {msg: f(lambda t, o=order: ref_sinkhorn(t, n_iters, o)) for order, msg in SK_MISTAKES.items()}
    if L.dim() > 2:
        out["it sums over dims 1 and 0, the rows and the columns of a single (n, n) matrix only: a batch of matrices "
            "(..., n, n) has its rows on dim -1 and its columns on dim -2"] = f(lambda t: ref_sinkhorn(t, n_iters, "dims 1 then 0"))
    out["it is transposed: rows are dim -1, columns dim -2"] = f(lambda t: ref_sinkhorn(t, n_iters).mT)
    if n_iters != 20:
        out[f"n_iters is not used: this is 20 iterations, not {n_iters}"] = f(lambda t: ref_sinkhorn(t, 20))
    out[f"this is {n_iters + 1} iterations, not {n_iters}"] = f(lambda t: ref_sinkhorn(t, n_iters + 1))
    if n_iters > 1:
        out[f"this is {n_iters - 1} iterations, not {n_iters}"] = f(lambda t: ref_sinkhorn(t, n_iters - 1))
    return out


#: float32 results against the float64 reference: 20 iterations of rounding, within 1e-5
SK_TOL = {F64: dict(atol=1e-10, rtol=1e-10), F32: dict(atol=1e-5, rtol=1e-5)}

REF_CASES = (  # seed, logits' shape, scale, n_iters, dtype
    (701, (4, 4), 1.0, 20, F32),
    (702, (3, 3), 2.5, 1, F64),
    (703, (2, 5, 5), 2.0, 3, F32),
    (704, (8, 8), 1.0, 20, F64),
    (705, (2, 3, 4, 4), 3.0, 7, F32),
    (706, (6, 6), 4.0, 2, F64),
    (707, (1, 1), 1.0, 5, F32),
)


@register("sinkhorn_matches_reference", needs=(SK,))
class SinkhornMatchesReference:
    """sinkhorn_knopp equals the reference loop (rows, then columns, n_iters times) on random logits: float32 within 1e-5, float64 within 1e-10; n = 1 to 8, 1 to 20 iterations, batched; n_iters defaults to 20"""

    @staticmethod
    def probe(ns):
        f = ns[SK]
        s, shape, scale, _, dt = SK_DEFAULT_CASE
        # n_iters by keyword in the first case (the contract names it), by position in the others
        return {"cases": [f(logits_of(s, shape, scale, dtype=dt), n_iters=it) if k == 0 else
                          f(logits_of(s, shape, scale, dtype=dt), it)
                          for k, (s, shape, scale, it, dt) in enumerate(REF_CASES)],
                "default": f(logits_of(s, shape, scale, dtype=dt))}

    @staticmethod
    def judge(out):
        expect_structure(out, {"cases": ANY, "default": ANY})
        for (s, shape, scale, it, dt), P in paired(REF_CASES, out["cases"]) + [(SK_DEFAULT_CASE, out["default"])]:
            L = logits_of(s, shape, scale, dtype=dt)
            what = f"sinkhorn_knopp(logits of shape {shape}, {str(dt)[6:]}, n_iters={it})"
            if (s, shape, scale, it, dt) == REF_CASES[0]:
                what += " (n_iters passed by keyword)"
            if (s, shape, scale, it, dt) == SK_DEFAULT_CASE:
                what = f"sinkhorn_knopp(logits of shape {shape}, {str(dt)[6:]}) (n_iters left to its default, 20)"
            expect_dtype_shape(P, dt, shape, what)
            close(P, ref_sinkhorn(L, it).to(dt), what=what, suspects=_sk_suspects(L, it, dt), **SK_TOL[dt])


#: sinkhorn_knopp(logits) with n_iters left to its default (20): logits spread enough that 20 iterations
#: are not yet converged in float64 (a wrong default shows; the seventeenth red team's default of 2 did not)
SK_DEFAULT_CASE = (708, (5, 5), 3.0, 20, F64)


def _leveled(seed, offsets, shape, spread, dtype):
    """Logits whose matrices sit at the levels ``offsets`` (one per matrix of a batch, or one for all)."""
    lv = torch.tensor(offsets, dtype=F64).reshape(-1, *([1] * 2)) if len(offsets) > 1 else torch.tensor(offsets[0], dtype=F64)
    return (logits_of(seed, shape, spread) + lv).to(dtype)


LARGE_CASES = (  # seed, shape, levels, spread, n_iters, dtype
    (711, (4, 4), (1e4,), 3.0, 20, F32),  # exp(1e4) is inf in float32 (and exp(89) already)
    (712, (3, 3), (800.0,), 3.0, 10, F64),  # exp(800) is inf in float64 (past 709)
    (713, (3, 4, 4), (0.0, 300.0, -300.0), 2.0, 20, F32),  # levels 300 apart: a max over the whole batch underflows
    (714, (5, 5), (-1e4,), 2.0, 20, F32),  # exp(-1e4) is 0: without the max, 0 / 0
)


@register("sinkhorn_large_logits", needs=(SK,))
class SinkhornLargeLogits:
    """logits of size 1e4 (float32), 800 (float64), -1e4, and matrices of a batch 300 apart: finite, and equal to the reference (the max over the last two dims is subtracted before exp)"""

    @staticmethod
    def probe(ns):
        f = ns[SK]
        return [f(_leveled(s, lv, shape, sp, dt), it) for s, shape, lv, sp, it, dt in LARGE_CASES]

    @staticmethod
    def judge(out):
        for (s, shape, lv, sp, it, dt), P in paired(LARGE_CASES, out):
            L = _leveled(s, lv, shape, sp, dt)
            what = (f"sinkhorn_knopp(logits of shape {shape} at level{'s' if len(lv) > 1 else ''} "
                    f"{', '.join(f'{v:g}' for v in lv)}, {str(dt)[6:]})")
            P = expect_dtype_shape(P, dt, shape, what)
            bad = ~torch.isfinite(P.double())
            if bad.any():
                top = max(range(len(lv)), key=lambda i: lv[i])
                if len(lv) > 1 and not bad[top].any():
                    raise CheckFailed(f"{what} holds NaN or inf in the matrices below the highest: the max is taken "
                                      "over the whole tensor, so exp underflows to 0 in the others and 0 / 0 follows. "
                                      "Take it over the last two dims, each matrix its own: "
                                      "logits.amax(dim=(-2, -1), keepdim=True)")
                raise CheckFailed(f"{what} holds NaN or inf: exp of logits this large overflows (exp(89) is inf in "
                                  "float32, exp(710) in float64) or, this small, underflows to 0 / 0. Subtract the "
                                  "max over the last two dims first: exp(logits - m) is at most 1, and m cancels in "
                                  "the first row step")
            close(P, ref_sinkhorn(L, it).to(dt), what=what, suspects=_sk_suspects(L, it, dt), **SK_TOL[dt])


GRAD_CASES = (  # seed, shape, scale, n_iters (float64)
    (721, (3, 3), 1.5, 20),
    (722, (2, 4, 4), 2.0, 3),
)


@register("sinkhorn_gradients_match_reference", needs=(SK,))
class SinkhornGradients:
    """the gradient of sum(sinkhorn_knopp(logits) * W) with respect to logits equals the reference's autograd through every iteration (float64, within 1e-8)"""

    @staticmethod
    def probe(ns):
        return [sinkhorn_vjp(ns, logits_of(s, shape, scale), it, randn(s + 50, *shape))
                for s, shape, scale, it in GRAD_CASES]

    @staticmethod
    def judge(out):
        for (s, shape, scale, it), got in paired(GRAD_CASES, out, [ANY, ANY]):
            L, W = logits_of(s, shape, scale).requires_grad_(True), randn(s + 50, *shape)
            what = f"the gradient of sum(sinkhorn_knopp(logits, {it}) * W) (logits of shape {shape}, float64)"
            if got[1] is None:
                raise CheckFailed(f"{what}: no gradient reaches logits; the iterations must stay in autograd's "
                                  "graph (no torch.no_grad(), .detach() or .data inside)")
            (want,) = torch.autograd.grad((ref_sinkhorn(L, it) * W).sum(), L)
            close(got[1], want, what=what, atol=1e-8, rtol=1e-8, suspects=_sk_suspects(L, it, F64, grad_of=W))


HALF_CASES = (  # dtype, seed, shape, level, spread, kind, n_iters
    # level 1e4 (float16 holds it: its largest number is 65504), exp(logits) of rank one on float16's grid (steps
    # of 8 there) with one column 40 below the rest: the first iteration gives J/n exactly, while exp of that
    # column underflows in float16 (its smallest number is 6e-8) and 0 / 0 follows
    (torch.float16, 731, (4, 4), 1e4, 8.0, "rank one", 20),
    (torch.float16, 732, (2, 5, 5), 0.0, 3.0, "random", 1),  # few iterations: far from the limit, where the
    (torch.bfloat16, 734, (3, 6, 6), 0.0, 3.0, "random", 2),  # order of the two steps shows
    (torch.bfloat16, 733, (4, 4), 200.0, 1.5, "random", 20),  # exp(200) is inf in float32 as well
)


def _half_logits(seed, shape, level, spread, kind, dtype):
    if kind == "random":
        return logits_of(seed, shape, spread, level).to(dtype)
    n = shape[-1]
    # -spread, 0 or spread (on float16's grid): the low column then sits 40 to 72 below the max, where exp
    # underflows in float16 and not in float32
    a = torch.round(logits_of(seed, (n, 1))).clamp(-1, 1) * spread
    b = torch.round(logits_of(seed + 1, (1, n))).clamp(-1, 1) * spread
    b[0, 1] -= 40.0
    return (level + a + b).to(dtype)


@register("sinkhorn_half_precision", needs=(SK,))
class SinkhornHalf:
    """float16 and bfloat16 logits (float16 up to 1e4 with one column 40 below the rest): the result in logits' dtype, no NaN, within tol * (1 + |reference|) of the float64 reference, tol 1e-2 (float16) and 5e-2 (bfloat16) (arithmetic in float32)"""

    @staticmethod
    def probe(ns):
        f = ns[SK]
        return [f(_half_logits(s, shape, lv, sp, kind, dt), it) for dt, s, shape, lv, sp, kind, it in HALF_CASES]

    @staticmethod
    def judge(out):
        for (dt, s, shape, lv, sp, kind, it), P in paired(HALF_CASES, out):
            L = _half_logits(s, shape, lv, sp, kind, dt)
            what = (f"sinkhorn_knopp on {str(dt)[6:]} logits of shape {shape} (level {lv:g}, n_iters={it}; "
                    "arithmetic in float32, the result in the logits' dtype)")
            P = expect_dtype_shape(P, dt, shape, what)
            if not torch.isfinite(P.double()).all():
                raise CheckFailed(f"{what} holds NaN or inf: in {str(dt)[6:]} arithmetic exp of logits 40 below the "
                                  "max underflows to 0 (float16's smallest number is 6e-8), a column of zeros divides "
                                  "0 / 0, and sums of 16-bit numbers lose digits. Compute in float32 (logits.float(), "
                                  "or promote_types with float32) and return .to(logits.dtype)")
            atol, rtol = TOLERANCES[dt]
            close(P, ref_sinkhorn(L, it).to(dt), what=what, atol=atol, rtol=rtol, suspects=_sk_suspects(L, it, dt))


GAIN_CASES = ((741, 4, 1.0), (742, 8, 1.0))  # seed, n, scale of the logits; 64 layers each
LAYERS, GAIN_TOL = 64, 1e-3


@register("sinkhorn_composite_gain_bounded", needs=(SK,))
class SinkhornCompositeGain:
    """over 64 layers the product of H_res = sinkhorn_knopp(logits, 20) from random logits keeps every row and column sum and its spectral norm within 1e-3 of 1 (doubly stochastic matrices compose without gain)"""

    @staticmethod
    def probe(ns):
        return [sinkhorn_each(ns, logits_of(s, (LAYERS, n, n), scale), 20) for s, n, scale in GAIN_CASES]

    @staticmethod
    def judge(out):
        for (s, n, scale), Ps in paired(GAIN_CASES, out):
            what = f"sinkhorn_knopp(logits, 20) on {LAYERS} random ({n}, {n}) logits"
            Ps = expect_dtype_shape(Ps, F64, (LAYERS, n, n), what)
            prod = torch.eye(n, dtype=F64)
            for P in Ps.double():
                prod = P @ prod
            if not torch.isfinite(prod).all():
                raise CheckFailed(f"{what}: their product holds NaN or inf")
            rows, cols = float(prod.sum(-1).max()), float(prod.sum(-2).max())
            gain = float(torch.linalg.matrix_norm(prod, 2))
            if max(rows, cols, gain) > 1 + GAIN_TOL:
                raise CheckFailed(
                    f"the product of the {LAYERS} matrices of {what} has a row sum up to {rows:.4g}, a column sum up to "
                    f"{cols:.4g} and spectral norm {gain:.4g}: a stack of {LAYERS} mixes amplifies the streams. A doubly "
                    "stochastic H_res (rows and columns summing to 1) has spectral norm 1, and so has any product of "
                    "them; one whose columns are not normalized (a softmax over rows, rows only) does not")


# --------------------------------------------------------------------------------------------
# MHCResidual
# --------------------------------------------------------------------------------------------

MHC_CASES = (  # seed, n, streams' shape, n_iters, scale of res_logits
    (751, 4, (2, 3, 4, D), 3, 1.0),
    (752, 3, (5, 3, D), 20, 1.5),
    (753, 2, (2, D), 7, 2.0),
    (754, 4, (1, 1, 4, D), 20, 0.5),
)


def _mhc_case(seed, n, shape, it, scale):
    p = mhc_params(seed, n, logits_of(seed + 9, (n, n), scale))
    return p, streams_of(seed, shape)


def _res_suspects(x, p, it, sub, norm):
    """Wrong H_res (a softmax, n_iters ignored) and wrong blocks around the right H_res."""
    h_res = ref_sinkhorn(p["res_logits"], it)
    out = mix_suspects(x, h_res, p["pre_logits"], p["post_logits"], sub, norm)
    wrong = {"H_res is a softmax of res_logits (its columns never normalized): it is sinkhorn_knopp(res_logits, "
             "n_iters), doubly stochastic": torch.softmax(p["res_logits"], -1)}
    if it != 20:
        wrong[f"n_iters is not passed on to sinkhorn_knopp (this is its default 20, not {it}): "
              "H_res = sinkhorn_knopp(res_logits, self.n_iters)"] = ref_sinkhorn(p["res_logits"], 20)
    with torch.no_grad():
        out.update({msg: mhc_formula(x, m, p["pre_logits"], p["post_logits"], sub, norm) for msg, m in wrong.items()})
    return out


@register("mhc_matches_reference", needs=(MHC,))
class MHCMatchesReference:
    """MHCResidual with random res_logits, gates and norm weight equals the reference, H_res = Sinkhorn of res_logits with the block's n_iters (float64, within 1e-7); streams (n, dim), (B, n, dim), (B, T, n, dim); MHCResidual(dim, sublayer) defaults to 4 streams and 20 iterations"""

    @staticmethod
    def probe(ns):
        out = []
        for k, (seed, n, shape, it, scale) in enumerate(MHC_CASES):  # the first built by position
            p, x = _mhc_case(seed, n, shape, it, scale)
            out.append(build_mhc(ns, seed, n, it, p, positional=k == 0)(x))
        seed, n, shape, it, scale = MHC_DEFAULT_CASE
        p, x = _mhc_case(seed, n, shape, it, scale)
        return {"cases": out, "default": build_mhc(ns, seed, None, None, p)(x)}

    @staticmethod
    @torch.no_grad()
    def judge(out):
        expect_structure(out, {"cases": ANY, "default": ANY})
        for case, got in paired(MHC_CASES, out["cases"]) + [(MHC_DEFAULT_CASE, out["default"])]:
            seed, n, shape, it, scale = case
            p, x = _mhc_case(seed, n, shape, it, scale)
            sub, norm = judge_parts(seed, p)
            want = mhc_formula(x, ref_sinkhorn(p["res_logits"], it), p["pre_logits"], p["post_logits"], sub, norm)
            call = f"MHCResidual(8, F, n_streams={n}, n_iters={it})"
            if case == MHC_CASES[0]:
                call = f"MHCResidual(8, F, {n}, {it}) (n_streams and n_iters by position)"
            if case == MHC_DEFAULT_CASE:
                call = "MHCResidual(8, F) (n_streams and n_iters left to their defaults, 4 and 20)"
            close(got, want, what=f"{call} on x of shape {shape} with random parameters",
                  suspects=_res_suspects(x, p, it, sub, norm))


#: MHCResidual(dim, sublayer) with the defaults (n_streams=4, n_iters=20), on 4 streams whose res_logits
#: are spread enough that 20 iterations are not yet converged (a wrong n_iters default shows)
MHC_DEFAULT_CASE = (755, 4, (2, 3, 4, D), 20, 3.0)


ONE_CASES = (  # seed, streams' shape (n = 1)
    (761, (1, D)),
    (762, (3, 1, D)),
    (763, (2, 4, 1, D)),
)


@register("mhc_one_stream_is_residual", needs=(MHC,))
class MHCOneStream:
    """with one stream (n_streams=1) MHCResidual is a pre-norm residual block x + s*F(RMSNorm(x)), s = 2*sigmoid(post_logits) (up to the norm's eps), for random gates; x of shape (1, dim), (B, 1, dim), (B, T, 1, dim)"""

    @staticmethod
    def probe(ns):
        return [build_mhc(ns, seed, 1, 20, mhc_params(seed, 1, logits_of(seed + 9, (1, 1), 3.0)))(streams_of(seed, shape))
                for seed, shape in ONE_CASES]

    @staticmethod
    @torch.no_grad()
    def judge(out):
        for (seed, shape), got in paired(ONE_CASES, out):
            p, x = mhc_params(seed, 1, logits_of(seed + 9, (1, 1), 3.0)), streams_of(seed, shape)
            sub, norm = judge_parts(seed, p)
            one = torch.ones(1, 1, dtype=F64)
            s = 2 * torch.sigmoid(p["post_logits"])
            close(got, mhc_formula(x, one, p["pre_logits"], p["post_logits"], sub, norm),
                  what=f"MHCResidual(8, F, n_streams=1) on x of shape {shape}, which should be the pre-norm residual "
                       f"x + {float(s):.3g} * F(RMSNorm(x))",
                  suspects=mix_suspects(x, one, p["pre_logits"], p["post_logits"], sub, norm, EQUAL_STREAMS_MISTAKES))


GRAD_NAMES = ("pre_logits", "post_logits", "res_logits", "norm.weight", "sublayer.0.weight")
MHC_GRAD_CASES = (  # seed, n, streams' shape, n_iters
    (771, 3, (2, 3, 3, D), 5),
    (772, 4, (4, 4, D), 20),
)


def _ref_grads(seed, n, shape, it):
    """The reference block's output and the gradients of x and GRAD_NAMES, by autograd (float64)."""
    p, x = mhc_params(seed, n, logits_of(seed + 9, (n, n), 1.5)), streams_of(seed, shape)
    sub, norm = judge_parts(seed, p)
    g = randn(seed + 60, *shape)
    leaves = {k: p[k].clone().requires_grad_(True) for k in ("pre_logits", "post_logits", "res_logits")}
    x = x.clone().requires_grad_(True)
    with torch.enable_grad():
        y = mhc_formula(x, ref_sinkhorn(leaves["res_logits"], it), leaves["pre_logits"], leaves["post_logits"], sub, norm)
        grads = torch.autograd.grad(y, [x, *leaves.values(), norm.weight, sub[0].weight], g)
    return y.detach(), grads, g


@register("mhc_gradients", needs=(MHC,))
class MHCGradients:
    """the gradients of x, pre_logits, post_logits, res_logits (through Sinkhorn), norm.weight and the sublayer's weight equal the reference's autograd for a random upstream gradient (float64, within 1e-6)"""

    @staticmethod
    def probe(ns):
        out = []
        for seed, n, shape, it in MHC_GRAD_CASES:
            p, x = mhc_params(seed, n, logits_of(seed + 9, (n, n), 1.5)), streams_of(seed, shape)
            out.append(mhc_grads(build_mhc(ns, seed, n, it, p), x, randn(seed + 60, *shape), list(GRAD_NAMES)))
        return out

    @staticmethod
    def judge(out):
        item = {"out": ANY, "grads": [ANY] * (1 + len(GRAD_NAMES))}
        for (seed, n, shape, it), got in paired(MHC_GRAD_CASES, out, item):
            y, want, _ = _ref_grads(seed, n, shape, it)
            where = f"MHCResidual(8, F, n_streams={n}, n_iters={it}) on x of shape {shape}"
            p, x = mhc_params(seed, n, logits_of(seed + 9, (n, n), 1.5)), streams_of(seed, shape)
            sub, norm = judge_parts(seed, p)
            close(got["out"], y, what=f"the output of {where}", suspects=_res_suspects(x, p, it, sub, norm))
            for name, g_got, g_want in zip(("x",) + GRAD_NAMES, got["grads"], want):
                if g_got is None:
                    raise CheckFailed(f"{where}: no gradient reaches {name}; "
                                      + ("H_res = sinkhorn_knopp(res_logits, n_iters) must stay in autograd's graph "
                                         "(no torch.no_grad(), .detach() or .data on the way)" if name == "res_logits"
                                         else "the output must depend on it through autograd"))
                close(g_got, g_want, what=f"the gradient of {name} ({where})", atol=1e-6, rtol=1e-6)


MHC_HALF_CASES = ((781, 4, (2, 3, 4, D)), (782, 3, (4, 3, D)))  # seed, n, streams' shape


@register("mhc_half_precision", needs=(MHC,))
class MHCHalf:
    """MHCResidual in bfloat16 and float16 (the block and x cast): the output in x's dtype, within tol * (1 + |formula|) of the float64 formula, tol 5e-2 (bfloat16) and 1e-2 (float16)"""

    @staticmethod
    def probe(ns):
        out = {}
        for dt in HALF:
            out[str(dt)[6:]] = [build_mhc(ns, seed, n, 20, mhc_params(seed, n, logits_of(seed + 9, (n, n), 1.0)), dt)(
                streams_of(seed, shape).to(dt)) for seed, n, shape in MHC_HALF_CASES]
        return out

    @staticmethod
    @torch.no_grad()
    def judge(out):
        expect_structure(out, {str(dt)[6:]: ANY for dt in HALF})
        for dt in HALF:
            for (seed, n, shape), got in paired(MHC_HALF_CASES, out[str(dt)[6:]]):
                p = {k: v.to(dt).double() for k, v in mhc_params(seed, n, logits_of(seed + 9, (n, n), 1.0)).items()}
                x = streams_of(seed, shape).to(dt).double()
                sub, norm = judge_parts(seed, p)
                sub = sub.to(dt).double()
                atol, rtol = TOLERANCES[dt]
                want = mhc_formula(x, ref_sinkhorn(p["res_logits"], 20), p["pre_logits"], p["post_logits"], sub, norm)
                sus = {m: v.to(dt) for m, v in _res_suspects(x, p, 20, sub, norm).items()}
                got = expect_tensor(got, "the output")
                if got.dtype != dt:
                    raise CheckFailed(f"MHCResidual in {str(dt)[6:]} returns {got.dtype}: the output keeps x's dtype "
                                      "(mix in float32 if you like, then .to(x.dtype))")
                close(got, want.to(dt), atol=atol, rtol=rtol, suspects=sus,
                      what=f"MHCResidual(8, F, n_streams={n}) in {str(dt)[6:]} on x of shape {shape}")


# --------------------------------------------------------------------------------------------
# depth_attention
# --------------------------------------------------------------------------------------------

DA_CASES = (  # seed, S, leading dims, dim, eps (None: the default 1e-6), dtype
    (791, 4, (), 8, None, F64),
    (792, 3, (2, 5), 16, None, F32),
    (793, 5, (1, 3, 2), 8, 0.1, F64),
    (794, 2, (4,), 32, None, F32),
)


def _da_inputs(seed, S, lead, dim, dtype):
    sources = randn(seed, S, *lead, dim) * torch.exp(randn(seed + 1, S, *lead, 1) * 0.8)
    return sources.to(dtype), (0.5 * randn(seed + 2, dim)).to(dtype)


@register("depth_attention_matches_reference", needs=(DA,))
class DepthAttentionReference:
    """depth_attention equals the reference on random sources (S, ..., dim) and queries: softmax over the sources of RMS-normalized keys . query, sources weighed by it (float32 within 1e-5, float64 within 1e-7; eps given and default)"""

    @staticmethod
    def probe(ns):
        f = ns[DA]
        out = []
        for seed, S, lead, dim, eps, dt in DA_CASES:
            s, q = _da_inputs(seed, S, lead, dim, dt)
            # eps by keyword (the contract names it); the call also shows whether sources or query change in place
            out.append(call_keeping_inputs(f, s, q) if eps is None else call_keeping_inputs(f, s, q, eps=eps))
        return out

    @staticmethod
    @torch.no_grad()
    def judge(out):
        for (seed, S, lead, dim, eps, dt), got in paired(DA_CASES, out):
            s, q = _da_inputs(seed, S, lead, dim, dt)
            e = 1e-6 if eps is None else eps
            what = f"depth_attention(sources of shape {tuple(s.shape)}, query, eps={e:g}) in {str(dt)[6:]}"
            got = expect_inputs_kept(got, ("sources", "query"), what)
            expect_dtype_shape(got, dt, s.shape[1:], what)
            sus = {m: v.to(dt) for m, v in _da_suspects(s, q, e).items() if v.shape == s.shape[1:]}
            if eps is not None:
                sus["the eps argument is not used (is it hard-coded?)"] = ref_depth_attention(s, q, 1e-6).to(dt)
            tol = 1e-5 if dt == F32 else 1e-7
            close(got, ref_depth_attention(s, q, e).to(dt), what=what, atol=tol, rtol=tol, suspects=sus)


DA_HALF_CASES = ((795, 3, (2, 4), 16, 300.0), (796, 4, (3,), 32, 1.0))  # seed, S, leading dims, dim, size


@register("depth_attention_half_precision", needs=(DA,))
class DepthAttentionHalf:
    """bfloat16 and float16 sources (values near 300, whose squares overflow float16) and query: the result in the sources' dtype, within tol * (1 + |reference|) of the float64 reference, tol 1e-2 (float16) and 5e-2 (bfloat16) (scores and softmax in float32)"""

    @staticmethod
    def probe(ns):
        f = ns[DA]
        return {str(dt)[6:]: [f(*(t.to(dt) for t in _da_half(seed, S, lead, dim, size))) for seed, S, lead, dim, size in
                              DA_HALF_CASES] for dt in HALF}

    @staticmethod
    @torch.no_grad()
    def judge(out):
        expect_structure(out, {str(dt)[6:]: ANY for dt in HALF})
        for dt in HALF:
            for (seed, S, lead, dim, size), got in paired(DA_HALF_CASES, out[str(dt)[6:]]):
                s, q = (t.to(dt) for t in _da_half(seed, S, lead, dim, size))
                what = (f"depth_attention on {str(dt)[6:]} sources of shape {tuple(s.shape)} (values near {size:g}; "
                        "keys, scores, softmax and sum in float32, the result in the sources' dtype)")
                got = expect_dtype_shape(got, dt, s.shape[1:], what)
                atol, rtol = TOLERANCES[dt]
                sus = {}
                if dt == torch.float16:
                    sus["it computes in float16: the squares of values near 300 overflow (90000 > 65504) and their "
                        "keys come out 0. Compute the keys, scores, softmax and sum in float32 and return the result "
                        ".to(sources.dtype)"] = ref_depth_attention(s, q, mistake="float16").to(dt)
                close(got, ref_depth_attention(s, q).to(dt), what=what, atol=atol, rtol=rtol, suspects=sus)


def _da_half(seed, S, lead, dim, size):
    s = randn(seed, S, *lead, dim, scale=size) + size * randn(seed + 1, S, *lead, 1)
    return s, 2.0 * randn(seed + 2, dim) / dim ** 0.5
