"""Checks for exercise 03: ``apply_residual_connection`` and ``ResidualBlock``.

Every probe builds a small ``ResidualBlock`` around a sublayer it makes itself (a seeded
``Linear`` then ``Tanh``), turns it to float64, copies seeded weights into the block's norm
(``block.norm``, the name the notebook asks for) and returns what the block computes. Every
judge rebuilds the sublayer and the norm weights from the same seeds, computes the formula
with torch's own ``nn.LayerNorm`` / ``nn.RMSNorm``, and, on a mismatch, tries the outputs of
known wrong blocks to say which mistake it is.
"""
from __future__ import annotations

import torch
from torch import nn

from coursekit.checks import CheckFailed, register
from coursekit.checks.remote import remotable
from coursekit.checks.compare import ANY, expect_close, expect_structure, expect_tensor, paired
from coursekit.checks.seeded import (DTYPE, as_module, call_keeping_inputs, dropped_pattern, expect_inputs_kept,
                                     load_into, make_norm, norm_spec, randn, values)

D = 8
SHAPE = (4, 8, D)  # 256 elements: enough to see a dropout rate

NORM_HINT = {
    "layer": "with norm='layer' the block keeps nn.LayerNorm(dim) as self.norm (weight and bias)",
    "rms": "with norm='rms' the block keeps nn.RMSNorm(dim, eps=1e-6) as self.norm (weight only)",
}

POST_INSTEAD_OF_PRE = "this is post-norm, norm(x + F(x)), but norm_first=True asks for pre-norm: x + F(norm(x))"
NORMED_RESIDUAL = "the residual is added to the normed input: add x, not norm(x)"
NO_RESIDUAL = "the residual connection is missing: the block returns the branch without adding x"
NO_NORM = "the sublayer sees x itself: normalize its input first, x + F(norm(x))"
NORM_ON_OUTPUT = "the norm is applied to the sublayer's output; in pre-norm it goes on the sublayer's input"
DROPOUT_ON_STREAM = "dropout is applied to the residual stream (x + branch); it belongs on the branch only"


# --------------------------------------------------------------------------------------------
# Shared by probes and judges: the same sublayer, norm weights and inputs from the same seeds
# --------------------------------------------------------------------------------------------

def sublayer(seed: int, zero: bool = False, dead: int = 0) -> nn.Module:
    """F: a seeded Linear(D, D) then Tanh (zero weights: F(x) = 0; ``dead``: its first ``dead``
    output features are 0 whatever x is)."""
    lin = nn.Linear(D, D, dtype=DTYPE)
    w = values([("weight", (D, D), "linear"), ("bias", (D,), "bias")], seed + 1000)
    with torch.no_grad():
        lin.weight.copy_(0 * w["weight"] if zero else w["weight"])
        lin.bias.copy_(0 * w["bias"] if zero else 3 * w["bias"])
        lin.weight[:dead] = 0
        lin.bias[:dead] = 0
    return nn.Sequential(lin, nn.Tanh())


def norm_values(seed: int, kind: str) -> dict:
    return values(norm_spec(kind, D, "norm."), seed + 2000)


def inputs(seed: int, scale: float = 1.5, offset: float = 0.7) -> torch.Tensor:
    return randn(seed, *SHAPE, scale=scale, offset=offset)


@remotable
def build(ns: dict, seed: int, *, norm="layer", norm_first=True, dropout=0.0, residual_scale=1.0,
          zero=False, dead=0, defaults=False, positional=False) -> nn.Module:
    """The student's ResidualBlock around our sublayer, float64, with our norm weights (probe side);
    ``defaults``: built as ``ResidualBlock(D, sublayer)``, every other argument left to its default;
    ``positional``: every argument passed by position, in the contract's order."""
    F_ = sublayer(seed, zero, dead)
    if defaults:
        block = ns["ResidualBlock"](D, F_)
    elif positional:
        block = ns["ResidualBlock"](D, F_, norm, norm_first, dropout, residual_scale)
    else:
        block = ns["ResidualBlock"](D, F_, norm=norm, norm_first=norm_first, dropout=dropout,
                                    residual_scale=residual_scale)
    block = as_module(block, "ResidualBlock(...)")
    block.double()
    if not isinstance(getattr(block, "norm", None), nn.Module):
        raise CheckFailed("ResidualBlock should keep its norm as self.norm (the tests copy weights into it): "
                          + NORM_HINT[norm])
    load_into(block, norm_values(seed, norm), "ResidualBlock", NORM_HINT[norm])
    return block


def parts(seed: int, kind: str = "layer", eps=None, dead: int = 0):
    """Judge side: (F, norm) as torch modules with the probe's weights."""
    return sublayer(seed, dead=dead), make_norm(kind, D, norm_values(seed, kind), "norm.", eps)


# --------------------------------------------------------------------------------------------
# apply_residual_connection
# --------------------------------------------------------------------------------------------

@register("residual_function", needs=("apply_residual_connection",))
class ResidualFunction:
    """apply_residual_connection(x, sublayer_output) returns x + sublayer_output, lets gradients reach both, leaves x alone"""

    @staticmethod
    def probe(ns):
        f = ns["apply_residual_connection"]
        x, y = randn(1, 2, 3, 4), randn(2, 2, 3, 4)
        x0 = x.clone()
        out = f(x, y)
        if not torch.equal(x, x0):
            return {"x_changed": True}
        xg, yg = randn(1, 2, 3, 4).requires_grad_(), randn(2, 2, 3, 4).requires_grad_()
        out_g = f(xg, yg)
        out_g = expect_tensor(out_g, "apply_residual_connection(x, sublayer_output)")
        (out_g * randn(3, 2, 3, 4)).sum().backward()
        return {"out": out, "x_changed": False, "grad_x": xg.grad, "grad_y": yg.grad}

    @staticmethod
    def judge(out):
        x, y, w = randn(1, 2, 3, 4), randn(2, 2, 3, 4), randn(3, 2, 3, 4)
        if isinstance(out, dict) and out.get("x_changed") is True:
            expect_structure(out, {"x_changed": ANY})
        else:
            expect_structure(out, {"out": ANY, "x_changed": ANY, "grad_x": ANY, "grad_y": ANY})
        if out["x_changed"]:
            raise CheckFailed("apply_residual_connection changed x in place (x += ...): "
                              "return x + sublayer_output as a new tensor")
        expect_close(out["out"], x + y, what="apply_residual_connection(x, sublayer_output)", suspects={
            "it returns sublayer_output alone: add x to it": y,
            "it returns x alone: add sublayer_output to it": x,
            "it subtracts: the residual connection is x + sublayer_output": x - y,
            "it multiplies: the residual connection is x + sublayer_output": x * y,
        })
        for name in ("grad_x", "grad_y"):
            if out[name] is None:
                raise CheckFailed(f"no gradient reached {name[-1]}: the sum must stay in the autograd graph "
                                  "(no .detach(), no torch.no_grad())")
            expect_close(out[name], w, what=f"the gradient with respect to {name[-1]}")


# --------------------------------------------------------------------------------------------
# ResidualBlock
# --------------------------------------------------------------------------------------------

@register("residual_block_parameters", needs=("ResidualBlock",))
class BlockParameters:
    """ResidualBlock registers its norm as `norm` (LayerNorm: weight and bias; RMSNorm: weight) and keeps the sublayer it is given as `sublayer` (that module, not a copy)"""

    #: before each of CHANGES calls after a first one, the sublayer's parameters are scaled by CHANGE
    CHANGED_SEED, CHANGE, CHANGES = 14, -0.5, 4

    @staticmethod
    def probe(ns):
        out = {}
        for kind in ("layer", "rms"):
            sub = sublayer(0)
            blk = as_module(ns["ResidualBlock"](D, sub, norm=kind), "ResidualBlock(...)")
            out[kind] = sorted(blk.state_dict().keys())
            out[f"{kind}_sublayer_is_given"] = getattr(blk, "sublayer", None) is sub
        # what the caller does to the sublayer it passed (trains it, ties or loads its weights) must
        # reach the block, on every call: changed in place after a first call, it is used changed
        seed = BlockParameters.CHANGED_SEED
        try:
            blk = build(ns, seed)
        except CheckFailed as e:  # no self.norm to load: the names above fail first, with their own message
            out["after_change"] = str(e)
            return out
        x = inputs(seed)
        out["after_change"] = []
        with torch.no_grad():
            blk(x)
        for _ in range(BlockParameters.CHANGES):  # a copy frozen on any of these calls shows
            with torch.no_grad():
                for q in blk.sublayer.parameters() if isinstance(getattr(blk, "sublayer", None), nn.Module) else ():
                    q.mul_(BlockParameters.CHANGE)
            out["after_change"].append(blk(x))
        return out

    @staticmethod
    def judge(out):
        expect_structure(out, {"layer": ANY, "rms": ANY, "layer_sublayer_is_given": ANY, "rms_sublayer_is_given": ANY,
                               "after_change": ANY})
        sub = ["sublayer.0.bias", "sublayer.0.weight"]
        for kind, norm_keys in (("layer", ["norm.bias", "norm.weight"]), ("rms", ["norm.weight"])):
            keys = out[kind]
            if not isinstance(keys, list):
                raise CheckFailed("state_dict keys should be strings")
            want = sorted(norm_keys + sub)
            if keys == want:
                continue
            if kind == "rms" and "norm.bias" in keys:
                raise CheckFailed("with norm='rms' the block's norm has a bias: norm='rms' is ignored, "
                                  "it should be nn.RMSNorm(dim, eps=1e-6), which has a weight only")
            if kind == "layer" and keys == sorted(["norm.weight"] + sub):
                raise CheckFailed("with norm='layer' the block's norm has no bias: it should be nn.LayerNorm(dim)")
            missing, extra = sorted(set(want) - set(keys)), sorted(set(keys) - set(want))
            raise CheckFailed(f"ResidualBlock(dim, sublayer, norm={kind!r}) has the wrong parameters: missing "
                              f"{missing or 'none'}, unexpected {extra or 'none'}. Keep the sublayer as "
                              "self.sublayer and the norm as self.norm.")
        for kind in ("layer", "rms"):
            if out[f"{kind}_sublayer_is_given"] is not True:
                raise CheckFailed(f"ResidualBlock(dim, sublayer, norm={kind!r}) should keep the sublayer it is given "
                                  "as self.sublayer: that module itself, not a copy (a copy is not the module the "
                                  "caller trains, ties or inspects)")
        if isinstance(out["after_change"], str):
            raise CheckFailed(out["after_change"][:500])
        seed = BlockParameters.CHANGED_SEED
        x = inputs(seed)
        F_, ln = parts(seed)
        got = out["after_change"]
        if not (isinstance(got, list) and len(got) == BlockParameters.CHANGES):
            raise CheckFailed("the probe's record of the block's calls is malformed")
        with torch.no_grad():
            before = [_pre(parts(seed)[0], ln, x)]
            for k, y in enumerate(got, start=1):
                F_.apply(lambda m: [q.mul_(BlockParameters.CHANGE) for q in m.parameters(recurse=False)])
                want = _pre(F_, ln, x)
                expect_close(y, want, what=f"a pre-norm ResidualBlock's output after the sublayer it was given was "
                             f"changed in place (its parameters scaled before call {k + 1})", suspects={
                                 f"the block keeps using a copy of the sublayer as it was at call {j + 1}, before the "
                                 "change: compute the branch with self.sublayer, the module it was given, on every "
                                 "call": b for j, b in enumerate(before)})
                before.append(want)


def _pre(F_, norm, x, s=1.0):
    return x + s * F_(norm(x))


def _post(F_, norm, x, s=1.0):
    return norm(x + s * F_(x))


PRE_CASES = ((10, 1.5, 0.7), (11, 4.0, -2.0), (12, 1e-3, 5e-4))  # (seed, scale, offset); the last one needs eps=1e-5
DEFAULTS_SEED = 13  # ResidualBlock(D, F) with nothing else given


@register("residual_block_prenorm", needs=("ResidualBlock",))
class BlockPreNorm:
    """A pre-norm ResidualBlock (norm_first=True, norm='layer') computes x + F(LayerNorm(x)); ResidualBlock(dim, sublayer), with the defaults, is that block"""

    @staticmethod
    def probe(ns):
        out = []
        for seed, scale, offset in PRE_CASES:
            blk = build(ns, seed)
            out.append(blk(inputs(seed, scale, offset)))
        # ResidualBlock(D, F) as built, in train mode: the defaults are pre-norm, LayerNorm, no dropout, scale 1
        return {"cases": out, "defaults": build(ns, DEFAULTS_SEED, defaults=True)(inputs(DEFAULTS_SEED)),
                "inplace": call_keeping_inputs(build(ns, PRE_CASES[0][0]), inputs(*PRE_CASES[0]))}

    @staticmethod
    @torch.no_grad()
    def judge(out):
        expect_structure(out, {"cases": ANY, "defaults": ANY, "inplace": ANY})
        for (seed, scale, offset), y in paired(PRE_CASES, out["cases"]):
            x = inputs(seed, scale, offset)
            F_, ln = parts(seed)
            expect_close(y, _pre(F_, ln, x), what="the pre-norm block's output", suspects={
                POST_INSTEAD_OF_PRE: _post(F_, ln, x),
                NORMED_RESIDUAL: ln(x) + F_(ln(x)),
                NO_RESIDUAL: F_(ln(x)),
                NO_NORM: x + F_(x),
                NORM_ON_OUTPUT: x + ln(F_(x)),
                "LayerNorm's eps should be 1e-5 (nn.LayerNorm's default)": _pre(F_, parts(seed, eps=1e-6)[1], x),
            })
        x = inputs(DEFAULTS_SEED)
        F_, ln = parts(DEFAULTS_SEED)
        expect_close(out["defaults"], _pre(F_, ln, x), what="ResidualBlock(dim, sublayer)'s output, in train mode "
                     "(the defaults are norm='layer', norm_first=True, dropout=0.0, residual_scale=1.0)", suspects={
                         "norm_first's default should be True (pre-norm)": _post(F_, ln, x),
                     })
        expect_inputs_kept(out["inplace"], ("x",), "the pre-norm block")


@register("residual_block_zero_sublayer_is_identity", needs=("ResidualBlock",))
class BlockZeroIsIdentity:
    """With a sublayer that outputs zeros, a pre-norm ResidualBlock returns its input exactly (any norm, scale, dropout)"""

    CASES = ((20, "layer", 1.0, 0.0, 1.0), (21, "rms", 0.5, 0.0, 1e3), (22, "layer", 2.0, 0.5, 1e-3))

    @staticmethod
    def probe(ns):
        out = []
        for seed, kind, s, p, scale in BlockZeroIsIdentity.CASES:
            blk = build(ns, seed, norm=kind, residual_scale=s, dropout=p, zero=True).train()
            torch.manual_seed(seed)
            out.append(blk(inputs(seed, scale)))
        return out

    @staticmethod
    @torch.no_grad()
    def judge(out):
        for (seed, kind, s, p, scale), y in paired(BlockZeroIsIdentity.CASES, out):
            x = inputs(seed, scale)
            what = f"ResidualBlock(norm={kind!r}, residual_scale={s}, dropout={p}) with F(x) = 0"
            y = expect_tensor(y, what)
            if y.shape == x.shape and y.dtype == x.dtype and torch.equal(y, x):
                continue
            _, n = parts(seed, kind)
            if p and y.shape == x.shape and dropped_pattern(y, x, p):
                raise CheckFailed(f"{what} is wrong: {DROPOUT_ON_STREAM}")
            expect_close(y, x, what=what, suspects={  # with F = 0 both mistakes give norm(x)
                "it returns norm(x): either " + POST_INSTEAD_OF_PRE + ", or " + NORMED_RESIDUAL: n(x),
                "residual_scale multiplies x: it should scale the branch only": s * x,
                NO_RESIDUAL: 0 * x,
            })
            raise CheckFailed(f"{what} should return x exactly (x + 0 = x), but it differs from x by up to "
                              f"{(y.double() - x).abs().max().item():.3g}")


