"""The hidden checks of residual (instructor side): registered into coursekit's registry when
this package is importable (the grader, stock nbgrader in the course directory, the tests).
Students never get this file: their notebooks only run these checks' visible smoke calls.
"""
from __future__ import annotations

import torch

from coursekit.checks import CheckFailed, register
from coursekit.checks.compare import ANY, expect_close, expect_structure, expect_tensor, paired
from coursekit.checks.remote import manual_seed
from coursekit.checks.seeded import DTYPE, call_keeping_inputs, dropped_pattern, expect_inputs_kept, make_norm
from coursekit.checks.residual import D, DROPOUT_ON_STREAM, NO_RESIDUAL, PRE_CASES, _post, _pre, build, inputs, norm_values, parts


PRE_INSTEAD_OF_POST = "this is pre-norm, x + F(norm(x)), but norm_first=False asks for post-norm: norm(x + F(x))"


DROPOUT_ON_X = "dropout is applied to x, the residual path; it belongs on the branch only"


NO_DROPOUT = "no dropout in train mode: the branch should go through dropout before the add"


DROPOUT_IN_EVAL = "dropout is still active in eval mode: use nn.Dropout (it is off after .eval())"


@register("residual_block_postnorm", needs=("ResidualBlock",))
class BlockPostNorm:
    """A post-norm ResidualBlock (norm_first=False) computes LayerNorm(x + F(x))"""

    @staticmethod
    def probe(ns):
        # the first case built with every argument by position; its call also shows whether x is changed in place
        first = call_keeping_inputs(build(ns, PRE_CASES[0][0], norm_first=False, positional=True), inputs(*PRE_CASES[0]))
        return {"first": first, "cases": [build(ns, seed, norm_first=False)(inputs(seed, scale, offset))
                                          for seed, scale, offset in PRE_CASES[1:]]}

    @staticmethod
    @torch.no_grad()
    def judge(out):
        expect_structure(out, {"first": ANY, "cases": ANY})
        first = expect_inputs_kept(out["first"], ("x",), "the post-norm block")
        rest = out["cases"]
        for (seed, scale, offset), y in paired(PRE_CASES, [first] + rest if isinstance(rest, list) else rest):
            x = inputs(seed, scale, offset)
            F_, ln = parts(seed)
            expect_close(y, _post(F_, ln, x), what="the post-norm block's output" + (
                " (ResidualBlock(dim, sublayer, norm, norm_first, dropout, residual_scale), every argument by "
                "position in that order)" if seed == PRE_CASES[0][0] else ""), suspects={
                PRE_INSTEAD_OF_POST: _pre(F_, ln, x),
                NO_RESIDUAL + " (post-norm: norm(x + F(x)))": ln(F_(x)),
                "the norm is missing: post-norm is norm(x + F(x))": x + F_(x),
                "the sublayer sees norm(x) and the sum is normed again: post-norm is norm(x + F(x))": ln(x + F_(ln(x))),
            })


RMS_CASES = ((30, True, 1.0, 0.5), (31, True, 1e-3, 5e-4), (32, False, 1e-3, 5e-4))  # tiny x: eps matters


@register("residual_block_rms", needs=("ResidualBlock",))
class BlockRMS:
    """norm='rms' uses RMSNorm with eps 1e-6 (pre-norm and post-norm)"""

    @staticmethod
    def probe(ns):
        return [build(ns, seed, norm="rms", norm_first=first)(inputs(seed, scale, offset))
                for seed, first, scale, offset in RMS_CASES]

    @staticmethod
    @torch.no_grad()
    def judge(out):
        for (seed, first, scale, offset), y in paired(RMS_CASES, out):
            x = inputs(seed, scale, offset)
            F_, rms = parts(seed, "rms")
            form = _pre if first else _post
            w = norm_values(seed, "rms")["norm.weight"]
            ln = make_norm("layer", D, {"norm.weight": w}, "norm.")  # LayerNorm with our weight, bias 0
            expect_close(y, form(F_, rms, x), what=f"ResidualBlock(norm='rms', norm_first={first})'s output", suspects={
                "norm='rms' is ignored: this is LayerNorm (it subtracts the mean); use nn.RMSNorm(dim, eps=1e-6)": form(F_, ln, x),
                "RMSNorm's eps should be 1e-6, not 1e-5": form(F_, parts(seed, "rms", eps=1e-5)[1], x),
                "RMSNorm's eps should be 1e-6: nn.RMSNorm(dim) without eps uses the dtype's machine epsilon":
                    form(F_, parts(seed, "rms", eps=torch.finfo(DTYPE).eps)[1], x),
                "RMSNorm's eps should be 1e-6, not 1e-8": form(F_, parts(seed, "rms", eps=1e-8)[1], x),
            })


SCALE_CASES = ((40, True, 0.3), (41, False, 0.3), (42, True, 2.5))


@register("residual_block_residual_scale", needs=("ResidualBlock",))
class BlockScale:
    """residual_scale multiplies the branch only: x + s*F(norm(x)) (pre-norm), norm(x + s*F(x)) (post-norm)"""

    @staticmethod
    def probe(ns):
        return [build(ns, seed, norm_first=first, residual_scale=s)(inputs(seed))
                for seed, first, s in SCALE_CASES]

    @staticmethod
    @torch.no_grad()
    def judge(out):
        for (seed, first, s), y in paired(SCALE_CASES, out):
            x = inputs(seed)
            F_, ln = parts(seed)
            if first:
                expected, suspects = _pre(F_, ln, x, s), {
                    "residual_scale is ignored: the branch should be multiplied by it": _pre(F_, ln, x),
                    "residual_scale multiplies x: it should scale the branch only": s * x + F_(ln(x)),
                    "residual_scale multiplies the whole output: it should scale the branch only": s * _pre(F_, ln, x),
                    "residual_scale multiplies the sublayer's input: it should scale its output": x + F_(s * ln(x)),
                }
            else:
                expected, suspects = _post(F_, ln, x, s), {
                    "residual_scale is ignored: the branch should be multiplied by it": _post(F_, ln, x),
                    "residual_scale multiplies x: it should scale the branch only": ln(s * x + F_(x)),
                    "residual_scale multiplies the normed output: it should scale the branch, inside the norm":
                        s * _post(F_, ln, x),
                }
            expect_close(y, expected, what=f"ResidualBlock(norm_first={first}, residual_scale={s})'s output",
                         suspects=suspects)


@register("residual_block_dropout", needs=("ResidualBlock",))
class BlockDropout:
    """Dropout acts on the branch only, in train mode, pre-norm and post-norm; in eval mode the block is deterministic and has no dropout"""

    SEED, P, S = 50, 0.5, 0.7

    @staticmethod
    def probe(ns):
        c = BlockDropout
        out = {}
        x = inputs(c.SEED)
        blk = build(ns, c.SEED, dropout=c.P, residual_scale=c.S).train()
        manual_seed(ns, c.SEED)
        out["train"] = blk(x)
        blk.eval()
        out["eval"] = [blk(x), blk(x)]
        post = build(ns, c.SEED, dropout=c.P, norm_first=False).eval()
        out["post_eval"] = post(x)
        post = build(ns, c.SEED + 1, dropout=c.P, norm_first=False, residual_scale=c.S, dead=POST_DEAD).train()
        manual_seed(ns, c.SEED + 1)
        out["post_train"] = post(x)
        return out

    @staticmethod
    @torch.no_grad()
    def judge(out):
        c = BlockDropout
        expect_structure(out, {"train": ANY, "eval": [ANY, ANY], "post_eval": ANY, "post_train": ANY})
        x = inputs(c.SEED)
        F_, ln = parts(c.SEED)
        branch = c.S * F_(ln(x))
        what = f"the pre-norm block's output in train mode (dropout={c.P})"
        y = expect_tensor(out["train"], what)
        if y.shape != x.shape:
            raise CheckFailed(f"{what} has shape {tuple(y.shape)}, expected {tuple(x.shape)}")
        if not dropped_pattern(y - x, branch, c.P):
            if dropped_pattern(y, x + branch, c.P):
                raise CheckFailed(f"{what} is wrong: {DROPOUT_ON_STREAM}")
            if dropped_pattern(y - branch, x, c.P):
                raise CheckFailed(f"{what} is wrong: {DROPOUT_ON_X}")
            if torch.allclose(y, x + branch, rtol=1e-7, atol=1e-7):
                raise CheckFailed(f"{what} is wrong: {NO_DROPOUT}")
            if dropped_pattern(y - x, F_(ln(x)), c.P):
                raise CheckFailed(f"{what} is wrong: residual_scale is not applied to the dropped branch")
            raise CheckFailed(f"{what} is wrong: output - x should be the branch residual_scale * F(norm(x)) with "
                              f"dropout applied (each element 0 or divided by 1 - p), and it is not")
        for i, y_eval in enumerate(out["eval"]):
            what = "the pre-norm block's output in eval mode" + (" (called twice)" if i else "")
            y_eval = expect_tensor(y_eval, what)
            if y_eval.shape == x.shape and not torch.allclose(y_eval, x + branch, rtol=1e-7, atol=1e-7) \
                    and dropped_pattern(y_eval - x, branch, c.P):
                raise CheckFailed(f"{what} is wrong: {DROPOUT_IN_EVAL}")
            expect_close(y_eval, x + branch, what=what)
        expect_close(out["post_eval"], _post(F_, ln, x), what="the post-norm block's output in eval mode")
        _judge_post_train(out["post_train"], x)


#: output features of the post-norm train case's sublayer that are 0 whatever x is (see _post_sum)
POST_DEAD = 2


def _post_sum(y, x, ln) -> torch.Tensor:
    """The sum z = x + s * Dropout(F(x)) that a post-norm block normed into ``y``, read back through the
    norm. LayerNorm gives y = w * (z - mean) / std + b per row, so u = (y - b) / w is z up to one scale and
    one shift per row; where F is dead (the first :data:`POST_DEAD` features) z is x itself, which pins both."""
    u = (y - ln.bias) / ln.weight
    u0, u1, x0, x1 = u[..., :1], u[..., 1:2], x[..., :1], x[..., 1:2]
    std = (x0 - x1) / (u0 - u1)
    return u * std + (x0 - u0 * std)


def _judge_post_train(got, x) -> None:
    """Post-norm in train mode: norm(x + s * Dropout(F(x))), dropout on the branch only. The norm hides
    where the dropout went, so the sum it normed is read back (:func:`_post_sum`) and judged as in
    pre-norm: sum - x must be the dropped branch. (A post-norm block whose dropout hit the stream,
    norm(Dropout(x + s * F(x))), kept full marks while only its eval mode was probed: the seventeenth
    red team.)"""
    c = BlockDropout
    F_, ln = parts(c.SEED + 1, dead=POST_DEAD)
    what = f"the post-norm block's output in train mode (dropout={c.P}, residual_scale={c.S})"
    y = expect_tensor(got, what)
    if y.shape != x.shape:
        raise CheckFailed(f"{what} has shape {tuple(y.shape)}, expected {tuple(x.shape)}")
    branch = c.S * F_(x)
    if torch.allclose(y, ln(x + branch), rtol=1e-7, atol=1e-7):
        raise CheckFailed(f"{what} is wrong: {NO_DROPOUT}")
    z = _post_sum(y, x, ln)
    live = (..., slice(POST_DEAD, None))
    if bool(torch.isfinite(z).all()) and dropped_pattern((z - x)[live], branch[live], c.P) \
            and torch.allclose(ln(z), y, rtol=1e-7, atol=1e-7):
        return
    raise CheckFailed(f"{what} is wrong: post-norm is norm(x + residual_scale * dropout(F(x))): dropout acts on "
                      "the branch only, before the add and the norm (not on x, not on x + branch, not after the norm)")
