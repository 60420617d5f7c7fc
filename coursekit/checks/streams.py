"""Checks of exercise 06: ``sinkhorn_knopp``, ``MHCResidual`` and ``depth_attention``.

The student writes the Sinkhorn-Knopp projection onto doubly stochastic matrices, a residual block
with n streams whose mixing is constrained as in mHC (manifold-constrained hyper-connections,
DeepSeek, arXiv 2512.24880), and the aggregator of attention residuals (Kimi, arXiv 2603.15031).
Names, signatures and formulas: the README's table and the exercise page.

This package is the student's runtime, so it holds no implementation of the three (no Sinkhorn
loop, no aggregator). The visible checks test properties that every right answer has and the known
wrong ones lack, with judges that need none of the three:

* ``sinkhorn_doubly_stochastic``: entries >= 0, columns that sum to 1 after any number of
  iterations (the last step of each), rows to about 1 after 20; a rank-one ``exp(logits)`` gives
  ``J/n`` after one iteration, and ``logits = log(DS) + c`` for a doubly stochastic ``DS`` gives
  ``DS`` back (a fixed point);
* ``sinkhorn_gradcheck``: ``torch.autograd.gradcheck`` of the student's own function (float64);
* ``mhc_parameters``; ``mhc_zero_init_is_prenorm_residual`` (n equal streams ``y`` give
  ``y + F(RMSNorm(n/2 * y))``, torch's own RMSNorm in the judge); ``mhc_known_mixing``
  (``res_logits`` set to the log of a known doubly stochastic matrix, which Sinkhorn leaves as it
  is: the judge knows ``H_res`` without running Sinkhorn, :func:`mhc_formula`);
* ``depth_attention_properties``: a zero query gives the mean of the sources, one source gives
  itself, parallel sources give their mean whatever the query, a query along one source's key
  picks that source.

The hidden checks (``course/hidden/streams.py``) compare with the instructor's references on inputs
drawn per grading run; the remotable helpers here are what their probes ask the sandbox to run.

The benchmark (``streams_benchmark``) times ``MHCResidual`` forward + backward beside a plain
pre-norm residual ``x + F(RMSNorm(x))`` of the same sublayer on one stream, and ``sinkhorn_knopp``
on one ``(n, n)`` matrix per token beside a softmax of the same logits (one normalization: the
unit that Sinkhorn repeats ``2 * n_iters`` times). Its points come from counting the work of one
call as tokens, sequences, features and matrices grow (:mod:`coursekit.checks.scaling`).
"""
from __future__ import annotations

import functools

import torch
from torch import nn

from coursekit import bench
from coursekit.contract import BENCH_DTYPE, BENCH_SIZES, RMSNORM_EPS
from coursekit.checks import CheckFailed, register, scaling
from coursekit.checks.benchmark import (LOOP_HINT, SHAPES, TYPICAL, WORKLOAD, _input, _plot_in_notebook,
                                        _reference, _res_sublayer)
from coursekit.checks.compare import ANY, expect_close, expect_structure, expect_tensor, paired
from coursekit.checks.remote import remotable
from coursekit.checks.residual import D, sublayer
from coursekit.checks.seeded import as_module, load_into, make_norm, randn

SK, MHC, DA = "sinkhorn_knopp", "MHCResidual", "depth_attention"
F32, F64 = torch.float32, torch.float64
#: how exactly the sums that the last step normalizes must be 1, per dtype
EXACT = {F64: 1e-12, F32: 1e-5}
#: after 20 iterations on logits of scale 1, every row sum is within this of 1 (measured: under 1e-6)
ROWS_AFTER_20 = 1e-3
#: the names MHCResidual's parameters have (the tests load values into them by these names)
MHC_PARAMS = ("pre_logits", "post_logits", "res_logits", "norm.weight")
MHC_HINT = ("keep pre_logits (n,), post_logits (n,) and res_logits (n, n) as nn.Parameter attributes and "
            "the norm as self.norm (nn.RMSNorm(dim, eps=1e-6) or your own RMSNorm with a weight)")


#: expect_close for this exercise's judges: there is no torch counterpart, so a mismatch names the
#: value the judge worked out (a formula, a property)
close = functools.partial(expect_close, against="what it should be")


def _name(dtype) -> str:
    return str(dtype)[6:]


def logits_of(seed: int, shape, scale: float = 1.0, offset: float = 0.0, dtype=F64) -> torch.Tensor:
    """Seeded normal logits, drawn in float64 then cast (the same on every machine)."""
    return randn(seed, *shape, scale=scale, offset=offset, dtype=dtype)


def known_mixing(n: int) -> torch.Tensor:
    """A doubly stochastic ``(n, n)`` matrix (float64): weights ``n, n-1, ..., 1`` (normalized) on the
    powers of the cyclic shift. Every entry is positive, and for n >= 3 it is not symmetric, so a
    mix applied transposed shows."""
    shift = torch.roll(torch.eye(n, dtype=F64), 1, dims=0)
    w = torch.arange(n, 0, -1, dtype=F64)
    w = w / w.sum()
    return sum(w[k] * torch.linalg.matrix_power(shift, k) for k in range(n))


def expect_dtype_shape(t, dtype, shape, what: str) -> torch.Tensor:
    t = expect_tensor(t, what)
    if tuple(t.shape) != tuple(shape):
        raise CheckFailed(f"{what} has shape {tuple(t.shape)}, expected {tuple(shape)}")
    if t.dtype != dtype:
        raise CheckFailed(f"{what} has dtype {t.dtype}, expected {dtype}: the result keeps its input's dtype")
    return t


# --------------------------------------------------------------------------------------------
# sinkhorn_knopp: doubly stochastic after the stated iterations
# --------------------------------------------------------------------------------------------

ENDS_WITH_ROWS = ("its rows sum to 1 but its columns do not: each iteration normalizes the rows, then the "
                  "columns (P / P.sum(-1, keepdim=True), then P / P.sum(-2, keepdim=True)), so the columns "
                  "come out exact. Yours ends with the rows: columns before rows, rows only, or a softmax over "
                  "the last dim (which normalizes rows once and never the columns)")
BATCH_HINT = (". With a batch of matrices (..., n, n) the rows are dim -1 and the columns dim -2: sum over "
              "those, never over dims 0 and 1, so that each matrix is normalized on its own")


def expect_doubly_stochastic(P, dtype, shape, n_iters: int, what: str, rows_tol: float | None) -> None:
    """Entries finite and >= 0, columns summing to 1 to ``EXACT[dtype]`` (the last step), rows
    within ``rows_tol`` of 1 (None: not checked, e.g. after one iteration)."""
    P = expect_dtype_shape(P, dtype, shape, what).double()
    batched = len(shape) > 2
    if not torch.isfinite(P).all():
        raise CheckFailed(f"{what} holds inf or NaN")
    if (P < 0).any():
        raise CheckFailed(f"{what} has negative entries: exp(logits - max) is positive, and dividing by "
                          "positive sums keeps it so")
    cols = float((P.sum(-2) - 1).abs().max())
    rows = float((P.sum(-1) - 1).abs().max())
    if cols > EXACT[dtype]:
        if rows <= EXACT[dtype]:
            raise CheckFailed(f"{what}: {ENDS_WITH_ROWS}" + (BATCH_HINT if batched else ""))
        raise CheckFailed(f"{what}: its columns do not sum to 1 (off by up to {cols:.2g}): the last step of "
                          "each iteration divides every column by its sum, P / P.sum(-2, keepdim=True)"
                          + (BATCH_HINT if batched else ""))
    if rows_tol is not None and rows > rows_tol:
        raise CheckFailed(f"{what}: its columns sum to 1 but its rows are off by up to {rows:.2g} after "
                          f"{n_iters} iterations: each iteration divides every row by its sum "
                          "(P / P.sum(-1, keepdim=True)) before it normalizes the columns")


DS_CASES = (  # seed, logits' shape, scale, n_iters, dtype
    (601, (4, 4), 1.0, 20, F32),
    (602, (3, 5, 5), 1.0, 20, F64),
    (603, (2, 2, 8, 8), 1.0, 20, F32),
    (604, (6, 6), 2.0, 1, F64),  # one iteration: the columns are exact, the rows not yet
    (605, (2, 3, 3), 2.0, 3, F32),
)
RANK_ONE = (606, 5, 2)  # seed, n, n_iters: exp(a_i + b_j) = u v^T, which one iteration takes to J/n
FIXED = (607, 4, 5)  # seed, n, n_iters: exp(logits) already doubly stochastic, up to a factor


def rank_one_logits(seed: int, n: int) -> torch.Tensor:
    return logits_of(seed, (n, 1), 2.0) + logits_of(seed + 1, (1, n), 2.0)


def fixed_point_logits(seed: int, n: int) -> torch.Tensor:
    return torch.log(known_mixing(n)) + logits_of(seed, (1, 1), 3.0)


@register("sinkhorn_doubly_stochastic", needs=(SK,))
class SinkhornDoublyStochastic:
    """sinkhorn_knopp(logits, n_iters) keeps logits' shape and dtype and returns entries >= 0 whose columns sum to 1 (the last step) and rows to 1 within 1e-3 after 20 iterations; exp(logits) of rank one gives J/n, a doubly stochastic one stays as it is"""

    @staticmethod
    def probe(ns):
        f = ns[SK]
        seed, n, k = RANK_ONE
        fseed, fn, fk = FIXED
        return {"cases": [f(logits_of(s, shape, scale, dtype=dt), it) for s, shape, scale, it, dt in DS_CASES],
                "rank_one": f(rank_one_logits(seed, n), k), "fixed": f(fixed_point_logits(fseed, fn), fk)}

    @staticmethod
    def judge(out):
        expect_structure(out, {"cases": ANY, "rank_one": ANY, "fixed": ANY})
        for (seed, shape, scale, it, dt), P in paired(DS_CASES, out["cases"]):
            what = f"sinkhorn_knopp(logits of shape {shape}, {_name(dt)}, n_iters={it})"
            expect_doubly_stochastic(P, dt, shape, it, what, ROWS_AFTER_20 if it >= 20 else None)
        seed, n, k = RANK_ONE
        L = rank_one_logits(seed, n)
        close(out["rank_one"], torch.full((n, n), 1.0 / n, dtype=F64), atol=1e-12, rtol=1e-12,
              what=f"sinkhorn_knopp(logits, {k}) for logits[i, j] = a[i] + b[j] (exp(logits) of rank one, "
                   "which the first iteration takes to the matrix of 1/n)", suspects={
                  "each row is normalized (a softmax over the last dim) and the columns never are":
                      torch.softmax(L, -1)})
        seed, n, k = FIXED
        close(out["fixed"], known_mixing(n), atol=1e-12, rtol=1e-12,
              what=f"sinkhorn_knopp(log(DS) + c, {k}) for a doubly stochastic DS (a fixed point: "
                   "the result is DS)")


GRADCHECK_CASES = ((611, (3, 3), 1.0, 4), (612, (2, 4, 4), 1.5, 2))  # seed, shape, scale, n_iters


@register("sinkhorn_gradcheck", needs=(SK,))
class SinkhornGradcheck:
    """gradients flow through every iteration: torch.autograd.gradcheck passes on sinkhorn_knopp (float64, batched and not)"""

    @staticmethod
    def probe(ns):
        f = ns[SK]
        out = []
        for seed, shape, scale, it in GRADCHECK_CASES:
            L = logits_of(seed, shape, scale).requires_grad_(True)
            with torch.enable_grad():
                P = f(L, it)
                connected = isinstance(P, torch.Tensor) and P.requires_grad
                ok = False
                if connected:
                    # one backward first: an error in it (an in-place op on a tensor autograd saved)
                    # reaches the student as torch's own message, not as gradcheck's False
                    torch.autograd.grad(P, L, torch.ones_like(P))
                    # gradcheck's fast mode compares one random projection of the Jacobian (its u and
                    # v from torch's generator, seeded here and put back after): the same verdict always
                    with torch.random.fork_rng(devices=[]):
                        torch.manual_seed(seed)
                        ok = bool(torch.autograd.gradcheck(lambda t: f(t, it), (L,), raise_exception=False,
                                                           fast_mode=True))
            out.append({"connected": bool(connected), "gradcheck": ok})
        return out

    @staticmethod
    def judge(out):
        for (seed, shape, scale, it), r in paired(GRADCHECK_CASES, out, {"connected": ANY, "gradcheck": ANY}):
            if r["connected"] is not True:
                raise CheckFailed(
                    f"no gradient reaches logits (shape {shape}, n_iters={it}): sinkhorn_knopp's result is cut off "
                    "from autograd's graph (torch.no_grad(), .detach() or .data inside?). The iterations must stay "
                    "differentiable: mHC learns res_logits through them")
            if r["gradcheck"] is not True:
                raise CheckFailed(
                    f"torch.autograd.gradcheck fails on sinkhorn_knopp (logits of shape {shape}, float64, "
                    f"n_iters={it}): the gradient autograd computes through your iterations disagrees with finite "
                    "differences of your own output. Is part of it computed without autograd (a factor taken under "
                    "torch.no_grad(), from .detach() or .data)?")


# --------------------------------------------------------------------------------------------
# MHCResidual: what the block computes, given H_res
# --------------------------------------------------------------------------------------------

#: known wrong blocks (:func:`mhc_formula`'s ``mistake``) and what to tell the student
MIX_MISTAKES = {
    "post without 2": "H_post is sigmoid(post_logits); it is 2 * sigmoid(post_logits), which is 1 at zero init "
                      "so that the branch enters at full weight",
    "transposed": "H_res is applied transposed: output stream i is sum_j H_res[i, j] x_j (row i of H_res mixes "
                  "into stream i), which is H_res @ x over the stream dim",
    "no mix": "the streams are carried over without H_res: output stream i is sum_j H_res[i, j] x_j + "
              "H_post[i] F(norm(h)), not x_i + H_post[i] F(norm(h))",
    "softmax pre": "H_pre is a softmax of pre_logits; it is sigmoid(pre_logits), each weight on its own",
    "mean h": "h is the mean of the streams; it is sum_i sigmoid(pre_logits[i]) x_i",
    "norm per stream": "each stream is normalized before the H_pre mix; the norm goes on h, after "
                       "h = sum_i H_pre[i] x_i: F(norm(h))",
    "per stream": "the sublayer runs on every stream separately; it runs once per token, on norm(h) with "
                  "h = sum_i H_pre[i] x_i, and H_post[i] spreads its one output over the streams",
    "no norm": "the sublayer sees h without the norm: it is F(norm(h)) (pre-norm)",
    "norm after": "the norm is applied to the sublayer's output; it goes on its input: F(norm(h))",
    "post-norm": "the norm is applied after the mix, to the output streams (post-norm), and the sublayer sees h "
                 "itself; in mHC the norm goes on the sublayer's input only, F(norm(h)), and the streams are never "
                 "normalized",
    "no residual": "the residual mix is missing: the output is sum_j H_res[i, j] x_j + H_post[i] F(norm(h))",
}


def mhc_formula(x, h_res, pre_logits, post_logits, sub, norm, mistake=None) -> torch.Tensor:
    """What MHCResidual returns for streams ``x`` ``(..., n, dim)`` with ``H_res`` given, or what a known
    wrong block returns (``mistake``, a key of :data:`MIX_MISTAKES`). The mixing is done in float32 at
    least (float64 stays float64); the norm and ``sub`` see ``h`` in ``x``'s dtype; the result is in
    ``x``'s dtype."""
    f = torch.promote_types(x.dtype, F32)
    xs, lo = x.to(f), x.dtype
    gate_pre = (torch.softmax(pre_logits.to(f), 0) if mistake == "softmax pre"
                else torch.sigmoid(pre_logits.to(f)))
    gate_post = torch.sigmoid(post_logits.to(f)) * (1.0 if mistake == "post without 2" else 2.0)
    mix = h_res.to(f).mT if mistake == "transposed" else h_res.to(f)
    carried = xs if mistake == "no mix" else torch.einsum("ij,...jd->...id", mix, xs)
    if mistake == "mean h":
        h = xs.mean(-2)
    elif mistake == "norm per stream":
        h = torch.einsum("i,...id->...d", gate_pre, norm(x).to(f))
    else:
        h = torch.einsum("i,...id->...d", gate_pre, xs)
    if mistake == "per stream":
        branch = sub(norm(x)).to(f)
    elif mistake in ("no norm", "norm per stream", "post-norm"):
        branch = sub(h.to(lo)).to(f).unsqueeze(-2)
    elif mistake == "norm after":
        branch = norm(sub(h.to(lo))).to(f).unsqueeze(-2)
    else:
        branch = sub(norm(h.to(lo))).to(f).unsqueeze(-2)
    added = gate_post.unsqueeze(-1) * branch
    if mistake == "no residual":
        return (added + 0 * carried).to(lo)
    out = carried + added
    if mistake == "post-norm":
        out = norm(out.to(lo)).to(f)
    return out.to(lo)


NORM_EPS = ("the norm's eps should be 1e-6: nn.RMSNorm(dim) without eps uses the dtype's machine epsilon "
            "(pass eps=1e-6)")


def mix_suspects(x, h_res, pre, post, sub, norm, mistakes=MIX_MISTAKES) -> dict:
    """message -> what the wrong block returns, for :func:`coursekit.checks.compare.expect_close` (each
    of ``mistakes``, and the norm with torch's default eps)."""
    with torch.no_grad():
        out = {msg: mhc_formula(x, h_res, pre, post, sub, norm, key) for key, msg in mistakes.items()}
        w = norm.weight.detach()
        loose = make_norm("rms", w.shape[0], {"norm.weight": w}, "norm.", eps=torch.finfo(x.dtype).eps)
        out[NORM_EPS] = mhc_formula(x, h_res, pre, post, sub, loose)
    return out


def mhc_params(seed: int, n: int, res_logits: torch.Tensor | None = None) -> dict:
    """Seeded values for MHCResidual's parameters (float64): the gates' logits, ``res_logits`` (the log of
    :func:`known_mixing` plus a constant, unless given) and a norm weight about 1."""
    return {"pre_logits": logits_of(seed + 1, (n,), 1.5), "post_logits": logits_of(seed + 2, (n,), 1.5),
            "res_logits": (torch.log(known_mixing(n)) + logits_of(seed + 3, (1, 1), 2.0)
                           if res_logits is None else res_logits),
            "norm.weight": 1.0 + 0.3 * logits_of(seed + 4, (D,))}


def streams_of(seed: int, shape, scale: float = 1.0) -> torch.Tensor:
    """Streams ``(..., n, D)``, each stream at its own scale (so that weighting them matters)."""
    n = shape[-2]
    return logits_of(seed, shape, scale) * torch.exp(logits_of(seed + 5, (n, 1), 0.7))


@remotable
def build_mhc(ns, seed: int, n: int | None, n_iters: int | None, params=None, dtype=None, positional=False):
    """The student's ``MHCResidual(8, F, n_streams=n, n_iters=n_iters)`` around our seeded sublayer ``F``
    (a Linear then Tanh), in float64 with ``params`` loaded by name (none: as constructed), then cast
    to ``dtype`` when given. ``n`` and ``n_iters`` None: ``MHCResidual(8, F)``, both left to their defaults;
    ``positional``: ``MHCResidual(8, F, n, n_iters)``, the contract's order."""
    if n is None and n_iters is None:
        blk = as_module(ns[MHC](D, sublayer(seed)), "MHCResidual(8, sublayer)")
    elif positional:
        blk = as_module(ns[MHC](D, sublayer(seed), n, n_iters), f"MHCResidual(8, sublayer, {n}, {n_iters})")
    else:
        blk = as_module(ns[MHC](D, sublayer(seed), n_streams=n, n_iters=n_iters),
                        f"MHCResidual(8, sublayer, n_streams={n}, n_iters={n_iters})")
    if not isinstance(getattr(blk, "norm", None), nn.Module):
        raise CheckFailed("MHCResidual should keep its norm as self.norm (the tests load weights into it): "
                          + MHC_HINT)
    blk.double()
    if params:
        load_into(blk, params, MHC, MHC_HINT)
    return blk.to(dtype) if dtype is not None else blk


def judge_parts(seed: int, params: dict):
    """Judge side: torch's own modules with the probe's weights: the sublayer and RMSNorm(8, eps=1e-6)."""
    return sublayer(seed), make_norm("rms", D, {"norm.weight": params["norm.weight"]}, "norm.")


@register("mhc_parameters", needs=(MHC,))
class MHCParameters:
    """MHCResidual keeps the sublayer it is given as `sublayer`, RMSNorm(dim, eps=1e-6) as `norm` (weight ones), and parameters pre_logits (n,), post_logits (n,), res_logits (n, n), all zeros; n_streams defaults to 4"""

    TINY = 622  # rows of size 1e-3: mean(x**2) ~ 1e-6, where the norm's eps decides

    @staticmethod
    def probe(ns):
        sub = sublayer(620)
        blk = as_module(ns[MHC](D, sub, n_streams=3, n_iters=5), "MHCResidual(8, sublayer, n_streams=3, n_iters=5)")
        default = as_module(ns[MHC](D, sublayer(621)), "MHCResidual(8, sublayer)")
        params = dict(blk.named_parameters())
        norm = getattr(blk, "norm", None)
        blk.double()
        return {"names": sorted(params), "default": {k: list(p.shape) for k, p in default.named_parameters()
                                                      if k in MHC_PARAMS[:3]},
                "values": {k: (blk.get_parameter(k).detach() if k in params else None) for k in MHC_PARAMS},
                "sublayer_is_given": getattr(blk, "sublayer", None) is sub,
                "norm_out": norm(randn(MHCParameters.TINY, 4, D, scale=1e-3)) if isinstance(norm, nn.Module) else None}

    @staticmethod
    def judge(out):
        expect_structure(out, {"names": ANY, "default": ANY, "values": {k: ANY for k in MHC_PARAMS},
                               "sublayer_is_given": ANY, "norm_out": ANY})
        want = sorted(("sublayer.0.weight", "sublayer.0.bias") + MHC_PARAMS)
        names = out["names"]
        if not (isinstance(names, list) and all(isinstance(k, str) for k in names)):
            raise CheckFailed("MHCResidual's parameter names should be strings")
        if names != want:
            missing, extra = sorted(set(want) - set(names)), sorted(set(names) - set(want))
            raise CheckFailed(f"MHCResidual(8, sublayer, n_streams=3) has the wrong parameters: missing "
                              f"{missing or 'none'}, unexpected {extra or 'none'}. {MHC_HINT[:1].upper()}{MHC_HINT[1:]} "
                              "(a tensor kept without nn.Parameter is not learned)")
        if out["sublayer_is_given"] is not True:
            raise CheckFailed("MHCResidual should keep the sublayer it is given as self.sublayer (that module "
                              "itself, not a copy)")
        shapes = {"pre_logits": (3,), "post_logits": (3,), "res_logits": (3, 3), "norm.weight": (D,)}
        for k in MHC_PARAMS:
            init = torch.ones if k == "norm.weight" else torch.zeros
            close(out["values"][k], init(shapes[k], dtype=F64), atol=0, rtol=0,
                  what=f"MHCResidual(8, sublayer, n_streams=3).{k} as constructed (all "
                       f"{'ones' if k == 'norm.weight' else 'zeros'})")
        default = out["default"]
        want_default = {"pre_logits": [4], "post_logits": [4], "res_logits": [4, 4]}
        if default != want_default:
            raise CheckFailed(f"MHCResidual(8, sublayer) (n_streams left at its default) should have 4 streams: "
                              f"parameter shapes {want_default}, got {default}")
        x = randn(MHCParameters.TINY, 4, D, scale=1e-3)
        if out["norm_out"] is None:
            raise CheckFailed("MHCResidual's self.norm should be a module (nn.RMSNorm(dim, eps=1e-6))")
        ln = nn.LayerNorm(D, eps=1e-6, elementwise_affine=False, dtype=F64)
        with torch.no_grad():
            close(out["norm_out"], make_norm("rms", D)(x), what="MHCResidual's norm on rows of size 1e-3 "
                  "(mean(x**2) about 1e-6, where eps matters)", suspects={
                      "the norm's eps should be 1e-6: nn.RMSNorm(dim) without eps uses the dtype's machine "
                      "epsilon": make_norm("rms", D, eps=torch.finfo(F64).eps)(x),
                      "the norm's eps should be 1e-6, not 1e-5": make_norm("rms", D, eps=1e-5)(x),
                      "the norm's eps should be 1e-6, not 1e-8": make_norm("rms", D, eps=1e-8)(x),
                      "the norm subtracts the mean (LayerNorm): mHC's norm is an RMSNorm": ln(x)})


#: the known mistakes that equal streams at zero init show (H_res = J/n, H_pre = 1/2: the others do not)
EQUAL_STREAMS_MISTAKES = {k: MIX_MISTAKES[k] for k in ("post without 2", "per stream", "norm per stream", "no norm",
                                                      "norm after", "post-norm", "no residual")}

ZERO_CASES = (  # seed, n, the shape of one stream y (x is y repeated n times at dim -2), scale of y
    (631, 1, (D,), 1.0),
    (632, 2, (3, D), 2.0),
    (633, 4, (2, 5, D), 0.5),
    (634, 4, (D,), 3e-3),  # (n/2) y of size 6e-3: mean(h**2) near eps
)


def equal_streams(seed, n, shape, scale):
    y = randn(seed, *shape, scale=scale)
    return y, y.unsqueeze(-2).repeat(*([1] * (len(shape) - 1)), n, 1)


@register("mhc_zero_init_is_prenorm_residual", needs=(MHC,))
class MHCZeroInit:
    """at zero init, n equal streams y give y + F(RMSNorm(n/2 * y)) in every stream, the pre-norm residual up to the norm's eps (n = 1, 2, 4; x of shape (n, dim), (B, n, dim), (B, T, n, dim))"""

    @staticmethod
    def probe(ns):
        return [build_mhc(ns, seed, n, 20)(equal_streams(seed, n, shape, scale)[1]) for seed, n, shape, scale in ZERO_CASES]

    @staticmethod
    @torch.no_grad()
    def judge(out):
        for (seed, n, shape, scale), got in paired(ZERO_CASES, out):
            y, x = equal_streams(seed, n, shape, scale)
            sub, norm = sublayer(seed), make_norm("rms", D)
            zero = torch.zeros(n, dtype=F64)
            h_res = torch.full((n, n), 1.0 / n, dtype=F64)
            what = (f"a fresh MHCResidual(8, F, n_streams={n}) on n = {n} equal streams y (x of shape "
                    f"{tuple(x.shape)}), which should give y + F(RMSNorm({n / 2:g} * y)) in every stream")
            close(got, mhc_formula(x, h_res, zero, zero, sub, norm), what=what,
                  suspects=mix_suspects(x, h_res, zero, zero, sub, norm, EQUAL_STREAMS_MISTAKES))


MIX_CASES = (  # seed, n, streams' shape (..., n, D), n_iters
    (641, 4, (2, 3, 4, D), 20),
    (642, 3, (5, 3, D), 7),
    (643, 2, (2, D), 20),
)


@register("mhc_known_mixing", needs=(MHC,))
class MHCKnownMixing:
    """MHCResidual returns sum_j H_res[i,j] x_j + H_post[i] F(RMSNorm(h)), h = sum_i H_pre[i] x_i, H_pre = sigmoid(pre_logits), H_post = 2 sigmoid(post_logits), with res_logits the log of a doubly stochastic matrix that Sinkhorn leaves as it is (float64)"""

    @staticmethod
    def probe(ns):
        return [build_mhc(ns, seed, n, it, mhc_params(seed, n))(streams_of(seed, shape))
                for seed, n, shape, it in MIX_CASES]

    @staticmethod
    @torch.no_grad()
    def judge(out):
        for (seed, n, shape, it), got in paired(MIX_CASES, out):
            x, p = streams_of(seed, shape), mhc_params(seed, n)
            sub, norm = judge_parts(seed, p)
            h_res = known_mixing(n)
            close(got, mhc_formula(x, h_res, p["pre_logits"], p["post_logits"], sub, norm),
                  what=f"MHCResidual(8, F, n_streams={n}, n_iters={it}) on x of shape {shape} with seeded parameters",
                  suspects=mix_suspects(x, h_res, p["pre_logits"], p["post_logits"], sub, norm))


# --------------------------------------------------------------------------------------------
# depth_attention: properties any right aggregator has
# --------------------------------------------------------------------------------------------

DA_DIM = 16
PARALLEL_SCALES = (0.5, 1.0, 2.0, 4.0)
PICKED = 2  # the source a query along its key picks


def _da_inputs():
    """Each property's (sources, query), seeded."""
    v = randn(654, 2, 3, DA_DIM, scale=10.0)  # rows of RMS about 10: eps moves the keys by 1e-8 at most
    scales = torch.tensor(PARALLEL_SCALES, dtype=F64).reshape(-1, 1, 1, 1)
    pick = randn(656, 5, DA_DIM) * torch.exp(randn(657, 5, 1))
    key = pick[PICKED] / pick[PICKED].pow(2).mean().sqrt()
    return {"zero": (randn(651, 3, 2, 5, DA_DIM) * torch.exp(randn(658, 3, 1, 1, 1)), torch.zeros(DA_DIM, dtype=F64)),
            "one": (randn(652, 1, 4, DA_DIM), randn(653, DA_DIM)),
            "parallel": (scales * v, 3.0 * randn(655, DA_DIM)),
            "pick": (pick, 30.0 * key),
            "float32": (randn(659, 3, 4, DA_DIM, dtype=F32), torch.zeros(DA_DIM, dtype=F32))}


@register("depth_attention_properties", needs=(DA,))
class DepthAttentionProperties:
    """depth_attention(sources, query): a zero query gives the mean of the sources, one source gives itself, parallel sources c_s*v give mean(c)*v whatever the query (RMS-normalized keys), a query along one source's key picks that source (softmax over the sources); shape (..., dim), sources' dtype"""

    @staticmethod
    def probe(ns):
        f = ns[DA]
        return {k: f(s, q) for k, (s, q) in _da_inputs().items()}

    @staticmethod
    @torch.no_grad()
    def judge(out):
        cases = _da_inputs()
        expect_structure(out, {k: ANY for k in cases})
        s, q = cases["zero"]
        close(out["zero"], s.mean(0), what=f"depth_attention(sources of shape {tuple(s.shape)}, query=0), which "
              "should be the mean of the sources (every score is 0, so the softmax weighs them alike)", suspects={
                  "the softmax runs over the feature axis: the weights are one per source (a softmax over the "
                  "source axis of the scores k_s . query), each scaling a whole source": s.sum(0) / s.shape[-1],
                  f"the softmax runs over the last axis of the scores (S, ...), here one of {s.shape[-2]} tokens: it "
                  "goes over the sources, dim 0": s.sum(0) / s.shape[-2],
                  "the scores are not put through a softmax over the sources (the weights must sum to 1)": s.sum(0)})
        s, q = cases["one"]
        close(out["one"], s[0], what="depth_attention on one source (S = 1), which should be that source "
              "(its weight is softmax of one score, 1)")
        s, q = cases["parallel"]
        c = torch.tensor(PARALLEL_SCALES, dtype=F64)
        raw = torch.softmax(c.reshape(-1, 1, 1) * torch.einsum("...d,d->...", s[1] / c[1], q), 0)
        close(out["parallel"], c.mean() * (s[1] / c[1]), atol=1e-5, rtol=1e-5,
              what="depth_attention on parallel sources c_s * v (c = 0.5, 1, 2, 4) with a random query, which "
                   "should be mean(c) * v: RMS-normalized keys of parallel sources are equal, so the weights are too",
              suspects={"the keys are not RMS-normalized: k_s = sources[s] * rsqrt(mean(sources[s]**2, -1) "
                        "+ eps), so that a source's size does not change its score":
                        (raw.unsqueeze(-1) * s).sum(0)})
        s, q = cases["pick"]
        close(out["pick"], s[PICKED], what=f"depth_attention with a query 30 times source {PICKED}'s key "
              f"(its score dominates: the softmax over the sources gives it weight 1), which should be "
              f"source {PICKED}")
        s, q = cases["float32"]
        close(out["float32"], s.double().mean(0).float(), what="depth_attention on float32 sources with a "
              "zero query, which should be their mean in float32")


# --------------------------------------------------------------------------------------------
# Remotable helpers of the hidden checks (their probes run in the grader; these run where the
# student's code is)
# --------------------------------------------------------------------------------------------

@remotable
def sinkhorn_vjp(ns, logits, n_iters, weight):
    """``(P, d<P, weight>/d logits)`` of the student's sinkhorn_knopp; the gradient is None when the result is
    cut off from autograd."""
    leaf = logits.clone().requires_grad_(True)
    with torch.enable_grad():
        P = ns[SK](leaf, n_iters)
        if not isinstance(P, torch.Tensor) or not P.requires_grad:
            return [P, None]
        (grad,) = torch.autograd.grad((P * weight).sum(), leaf, allow_unused=True)
    return [P.detach(), grad]


@remotable
def sinkhorn_each(ns, logits, n_iters):
    """The student's sinkhorn_knopp on each matrix of ``logits`` ``(k, n, n)`` on its own, stacked."""
    out = [ns[SK](m, n_iters) for m in logits]
    for P in out:
        if not isinstance(P, torch.Tensor):
            raise CheckFailed(f"sinkhorn_knopp returned {type(P).__name__}, not a torch.Tensor")
    return torch.stack(out)


@remotable
def mhc_grads(blk, x, grad_out, names):
    """The block's output on ``x`` and the gradients of ``x`` and of its parameters ``names`` for the upstream
    gradient ``grad_out`` (None for one that no gradient reaches)."""
    params = []
    for name in names:
        try:
            params.append(blk.get_parameter(name))
        except AttributeError:
            raise CheckFailed(f"MHCResidual has no parameter {name!r}: {MHC_HINT}") from None
    leaf = x.clone().requires_grad_(True)
    with torch.enable_grad():
        y = blk(leaf)
        if not isinstance(y, torch.Tensor):
            raise CheckFailed(f"MHCResidual returned {type(y).__name__}, not a torch.Tensor")
        if not y.requires_grad:
            return {"out": y, "grads": [None] * (1 + len(params))}
        grads = torch.autograd.grad(y, [leaf, *params], grad_out, allow_unused=True)
    return {"out": y.detach(), "grads": list(grads)}


# --------------------------------------------------------------------------------------------
# The benchmark: MHCResidual forward + backward beside a pre-norm residual, sinkhorn_knopp beside a softmax
# --------------------------------------------------------------------------------------------

GID = "streams_benchmark"
TYPICAL[GID] = 12.0  # yours / the pre-norm residual, fastest round against fastest: for information
WORKLOAD[GID] = "streams"  # its sizes per device: coursekit.contract.BENCH_SIZES
SHAPES[GID] = BENCH_SIZES["cpu"]["streams"]["input"]
LOOP_HINT[GID] = ("is there a Python loop over tokens, sequences or the matrices of a batch? Mix the streams of "
                  "every token at once (H_res @ x, or an einsum over the stream dim), call the sublayer once on h of "
                  "shape (..., dim), and normalize every matrix of a batch of logits at once with sums over dims "
                  "-1 and -2 (a loop over the n streams is fine: n is fixed)")
REPEAT = 15
BENCH_ROUNDS = (REPEAT,)
SEED_X, SEED_LOGITS, SEED_G = 3, 5, 7


def bench_params(n: int) -> dict:
    """The benchmark's fixed gates and ``res_logits = log(known_mixing(n))``: the output is known without Sinkhorn."""
    g = torch.Generator().manual_seed(4646)
    return {"pre_logits": torch.randn(n, generator=g, dtype=F64), "post_logits": torch.randn(n, generator=g, dtype=F64),
            "res_logits": torch.log(known_mixing(n))}


def _place(m: nn.Module, cfg) -> nn.Module:
    return m.to(cfg.device) if cfg.kind == "cpu" else m.to(cfg.device, cfg.dtype)


def bench_block(cls, cfg, d=None, n=None) -> nn.Module:
    """``cls(d, Linear(d, d), n_streams=n)`` with the benchmark's parameters, on the benchmark's device and dtype
    (float32 on the CPU, as built, whatever the notebook's default dtype)."""
    size = cfg.sizes("streams")
    d, n = d or size["d"], n or size["n"]
    m = cls(d, _res_sublayer(d=d), n_streams=n, n_iters=20)
    if not isinstance(m, nn.Module):
        raise CheckFailed(f"MHCResidual(...) should be an nn.Module, but it is {type(m).__name__}")
    load_into(m, bench_params(n), MHC, "the benchmark loads its parameters by the contract's names (" + MHC_HINT + ")")
    return _place(m.float(), cfg)


class GivenMixing(nn.Module):
    """The block by its formula (:func:`mhc_formula`) with ``H_res`` given (the benchmark's known doubly
    stochastic matrix) and torch's ``nn.RMSNorm``: what a right MHCResidual computes on the benchmark."""

    def __init__(self, d: int, n: int, sub: nn.Module):
        super().__init__()
        self.sublayer, self.norm = sub, nn.RMSNorm(d, eps=RMSNORM_EPS)
        p = bench_params(n)
        self.pre_logits, self.post_logits = nn.Parameter(p["pre_logits"].float()), nn.Parameter(p["post_logits"].float())
        self.register_buffer("h_res", known_mixing(n).float())

    def forward(self, x):
        return mhc_formula(x, self.h_res, self.pre_logits, self.post_logits, self.sublayer, self.norm)


class PreNormResidual(nn.Module):
    """One stream: ``x + F(RMSNorm(x))``, torch's modules (the baseline the benchmark times beside)."""

    def __init__(self, d: int, sub: nn.Module):
        super().__init__()
        self.sublayer, self.norm = sub, nn.RMSNorm(d, eps=RMSNORM_EPS)

    def forward(self, x):
        return x + self.sublayer(self.norm(x))


def given_block(cfg) -> nn.Module:
    size = cfg.sizes("streams")
    return _place(GivenMixing(size["d"], size["n"], _res_sublayer(d=size["d"])), cfg)


def upstream(shape, cfg, seed: int = SEED_G) -> torch.Tensor:
    """A fixed upstream gradient for the backward pass, drawn on the benchmark's device."""
    return _input(shape, seed, cfg.device, cfg.dtype)


def fwd_bwd(m: nn.Module, grad_out: torch.Tensor):
    """``x -> m(x)`` that also runs the backward pass for ``grad_out`` (the gradients of ``x`` and every
    parameter), as a training step does; the output comes back (the gradients are not kept)."""
    params = [p for p in m.parameters() if p.requires_grad]

    def step(x):
        with torch.enable_grad():
            leaf = x.detach().requires_grad_(True)
            y = m(leaf)
            torch.autograd.grad(y, [leaf, *params], grad_out, allow_unused=True)
        return y.detach()
    return step


def _first_rows(y: torch.Tensor) -> torch.Tensor:
    """The part of the output the judge checks: the first sequence's first 4 tokens, every stream."""
    return y[0, :4].float().cpu()


def bench_want(kind: str) -> torch.Tensor:
    """What a right block returns on the first tokens of the benchmark's input on ``kind`` (``"cpu"`` or
    ``"cuda"``: drawn there again from the same seed, in that device's dtype)."""
    cfg = bench.bench_config(kind)
    x = _input(cfg.sizes("streams")["input"], SEED_X, cfg.device, cfg.dtype)[:1, :4]
    with torch.no_grad():
        return _first_rows(given_block(cfg)(x))


@register(GID, needs=(MHC, SK), kind="benchmark")
class StreamsBenchmark:
    """vectorized: MHCResidual forward + backward and sinkhorn_knopp do the same work per call however many tokens, sequences, features or matrices (times shown beside a pre-norm residual x + F(RMSNorm(x)) and a softmax)"""

    @staticmethod
    def probe(ns, count_seed=None):
        cfg = bench.bench_config()
        size = cfg.sizes("streams")
        shape, d, n = size["input"], size["d"], size["n"]
        x = _input(shape, SEED_X, cfg.device, cfg.dtype)
        one = x[..., 0, :].contiguous()  # one stream of the same tokens, for the plain residual
        logits = _input(size["logits"], SEED_LOGITS, cfg.device, cfg.dtype)
        g, g1 = upstream(shape, cfg), upstream(one.shape, cfg)
        steps = {"yours": fwd_bwd(bench_block(ns[MHC], cfg), g),
                 "pre-norm residual": fwd_bwd(_place(PreNormResidual(d, _res_sublayer(d=d)), cfg), g1)}
        args = {"yours": x, "pre-norm residual": one}
        sk = {"yours": lambda: ns[SK](logits, 20), "softmax": lambda: torch.softmax(logits, -1)}
        ref = _reference("06_streams", MHC)
        if ref is not None:
            steps["course solution"] = fwd_bwd(bench_block(ref, cfg), g)
            args["course solution"] = x
            ref_sk = _reference("06_streams", SK)
            sk["course solution"] = lambda: ref_sk(logits, 20)
        work = scaling.measure(GID, ns, count_seed)
        y = steps["yours"](x)
        if not isinstance(y, torch.Tensor) or tuple(y.shape) != tuple(shape):
            raise CheckFailed(f"MHCResidual on streams of shape {tuple(shape)} returned "
                              f"{tuple(y.shape) if isinstance(y, torch.Tensor) else type(y).__name__}, expected "
                              f"a tensor of shape {tuple(shape)}")
        threads = torch.get_num_threads()
        if cfg.kind == "cpu":
            torch.set_num_threads(1)  # one thread: a busy shared machine then slows every run alike
        try:
            times = bench.time_interleaved({k: (lambda s=s, a=args[k]: s(a)) for k, s in steps.items()},
                                           repeat=REPEAT, device=cfg.device)
            sk_times = bench.time_interleaved(sk, repeat=REPEAT, device=cfg.device)
            copy = bench.copy_time(x, repeat=REPEAT)
        finally:
            torch.set_num_threads(threads)
        return {"device": cfg.label, "cuda": cfg.kind == "cuda", "shape": list(shape), "dtype": _name(cfg.dtype),
                "times": times, "sinkhorn": sk_times, "copy": copy, "work": work, "y": _first_rows(y),
                "notes": []}  # without the course's solution there is simply no such row

    @staticmethod
    def judge(out):
        expect_structure(out, {k: ANY for k in ("device", "cuda", "shape", "dtype", "times", "sinkhorn", "copy",
                                                "work", "y", "notes")})
        cuda = out["cuda"] is True
        kind = "cuda" if cuda else "cpu"
        shape, dtype = BENCH_SIZES[kind]["streams"]["input"], BENCH_DTYPE[kind]
        if out["shape"] != list(shape) or out["dtype"] != _name(dtype):
            raise CheckFailed(f"the benchmark ran on {out['shape']} {out['dtype']}, expected {list(shape)} {_name(dtype)}")
        for key, need in (("times", {"yours", "pre-norm residual"}), ("sinkhorn", {"yours", "softmax"})):
            times = out[key]
            if not isinstance(times, dict) or not need <= set(times) <= need | {"course solution"}:
                raise CheckFailed(f"the benchmark's {key} should hold {sorted(need)}, got "
                                  f"{sorted(times) if isinstance(times, dict) else type(times).__name__}")
            for k, ts in times.items():
                if not (isinstance(ts, list) and len(ts) in BENCH_ROUNDS and all(type(t) is float and t > 0 for t in ts)):
                    raise CheckFailed(f"expected {REPEAT} timed rounds for each implementation, got "
                                      f"{len(ts) if isinstance(ts, list) else type(ts).__name__} for {k}")
        if not (type(out["copy"]) is float and out["copy"] > 0) or not isinstance(out["notes"], list):
            raise CheckFailed("the benchmark's result is malformed (copy should be a time, notes a list)")
        if cuda and not torch.cuda.is_available():
            raise CheckFailed("the benchmark's result says it ran on CUDA, but there is no CUDA device here to check "
                              "its output")
        tol = 5e-2 if cuda else 1e-4
        close(expect_tensor(out["y"], "the output"), bench_want(kind), atol=tol, rtol=tol, check_dtype=False,
              what="MHCResidual's output on the benchmark's first tokens (its parameters loaded by name, "
                   "res_logits the log of a doubly stochastic matrix); start from the first failing test above: "
                   "mhc_known_mixing names the usual mistakes, one at a time")
        scaling.judge(out["work"], GID, "MHCResidual (forward + backward) or sinkhorn_knopp", LOOP_HINT[GID])
        print(scaling.describe(out["work"]))
        where = ("CUDA, bfloat16, CUDA events" if cuda else "CPU, float32, 1 thread: these are CPU numbers, small "
                 f"sizes; on a GPU this cell times bfloat16 {BENCH_SIZES['cuda']['streams']['input']}")
        elem = torch.empty((), dtype=dtype).element_size()
        streams_bytes = int(torch.Size(shape).numel()) * elem
        print(f"{GID}: MHCResidual forward + backward on streams {tuple(shape)} (batch, tokens, streams, features) "
              f"on {out['device']} ({where}), beside a pre-norm residual x + F(RMSNorm(x)) of the same sublayer on one "
              f"stream {tuple(shape[:2]) + tuple(shape[3:])}; {REPEAT} interleaved rounds")
        rows = bench.summarize(out["times"], streams_bytes, out["copy"], out["device"])
        print(bench.format_table(rows, baseline="pre-norm residual"))
        print("GB/s counts the streams tensor read once and written once per call, for every row (the pre-norm "
              "residual moves n times fewer bytes: compare its time); % of copy is that as a share of a plain copy "
              "of the streams tensor (100%: one call as fast as one copy)")
        logits = BENCH_SIZES[kind]["streams"]["logits"]
        print(f"sinkhorn_knopp(logits, 20) on logits {tuple(logits)}, one (n, n) matrix per token, beside one softmax "
              "of the same logits (a softmax is one row normalization with its exp; Sinkhorn does 20 iterations of "
              "two normalizations, each its own kernels in eager PyTorch, where mHC fuses them into one kernel). "
              "GB/s counts the logits read and written once; no copy is timed for these small logits, so % of copy "
              "is left blank")
        print(bench.format_table(bench.summarize(out["sinkhorn"], int(torch.Size(logits).numel()) * elem, None,
                                                 out["device"]), baseline="softmax"))
        _plot_in_notebook(rows, f"{GID} on {out['device']}")
        for note in out["notes"]:
            print("note:", note)
        rs = bench.ratios(out["times"], "yours", "pre-norm residual")
        ratio = min(out["times"]["yours"]) / min(out["times"]["pre-norm residual"])
        print(bench.verdict_line("pre-norm residual", ratio, rs, TYPICAL[GID]))


# --------------------------------------------------------------------------------------------
# What the work count calls (coursekit.checks.scaling.GROWTH) and the served benchmark
# --------------------------------------------------------------------------------------------

def counted_step(cls, shape):
    """What the work count calls (:mod:`coursekit.checks.scaling`): ``f(x, grad_out) -> (y, grad_x)``, one
    forward + backward of ``cls(d, Linear(d, d), n_streams=n)`` with the benchmark's parameters on streams
    of ``shape`` (float32, CPU), or of :class:`GivenMixing` (``cls`` None: torch's side, the same output)."""
    cpu = bench.bench_config("cpu")
    d, n = shape[-1], shape[-2]
    m = GivenMixing(d, n, _res_sublayer(d=d)) if cls is None else bench_block(cls, cpu, d=d, n=n)
    params = [p for p in m.parameters() if p.requires_grad]

    def f(x, grad_out):
        with torch.enable_grad():
            leaf = x.clone().requires_grad_(True)
            y = m(leaf)
            grads = torch.autograd.grad(y, [leaf, *params], grad_out, allow_unused=True)
        return y.detach(), grads[0]
    return f


def counted_streams(shape, seed: int) -> tuple:
    """The counted call's streams and upstream gradient, drawn from ``seed``."""
    g = torch.Generator().manual_seed(int(seed))
    x = torch.randn(*shape, generator=g, dtype=F32) * 1.5 + 0.5
    return x, torch.randn(*shape, generator=g, dtype=F32)


def counted_logits(k: int, seed: int, n: int = 4) -> torch.Tensor:
    """``k`` logits ``(n, n)`` drawn from ``seed``: log of a random doubly stochastic matrix (a mix of
    random permutations and J/n, every entry positive) plus a constant per row and one per matrix. The
    first row step of Sinkhorn reaches that matrix and the rest keeps it: its result is the softmax of
    each row, known without Sinkhorn."""
    g = torch.Generator().manual_seed(int(seed))
    w = torch.rand(k, 3, 1, 1, generator=g, dtype=F64) + 0.2
    w = 0.9 * w / w.sum(1, keepdim=True)
    perms = torch.eye(n, dtype=F64)[torch.rand(k, 3, n, generator=g).argsort(-1)]  # (k, 3, n, n), drawn at once
    mats = 0.1 / n + (w * perms).sum(1)  # thousands of them in milliseconds: the counted calls grow to 8192
    rows = 3.0 * torch.randn(k, n, 1, generator=g, dtype=F64) + 5.0 * torch.randn(k, 1, 1, generator=g, dtype=F64)
    return (torch.log(mats) + rows).to(F32)


def _served_x(seed, cfg=None):
    cfg = cfg or bench.bench_config("cpu")
    return _input(cfg.sizes("streams")["input"], seed, cfg.device, cfg.dtype)


def served_entry() -> tuple:
    """The arguments of :class:`coursekit.checks.served.Served` for this benchmark: ``x -> y`` of one forward +
    backward of the block (the backward pass for a fixed upstream gradient, every gradient computed), the
    student's against the same step around :class:`GivenMixing`. Each call's output is the next call's input.
    Its name is not a name in the notebook (the timed callable wraps the student's block: course code builds
    it from the student's class)."""
    def build(ns, cfg=None):
        cfg = cfg or bench.bench_config("cpu")
        return fwd_bwd(bench_block(ns[MHC], cfg), upstream(cfg.sizes("streams")["input"], cfg))

    def torch_side(cfg=None):
        cfg = cfg or bench.bench_config("cpu")
        return fwd_bwd(given_block(cfg), upstream(cfg.sizes("streams")["input"], cfg))

    return (f"{MHC} (forward + backward, with its {SK})", "06_streams", build, torch_side, _served_x,
            "the block's formula with H_res given, eager")
