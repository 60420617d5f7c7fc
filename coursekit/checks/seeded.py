"""Seeded inputs and weights for the block exercises (03 residual, 04 transformer block).

A probe and its judge run in different processes, so neither may hand the other a tensor it
made: both rebuild the same inputs and weights from the same seeds with the functions here.
The probe copies the weights into the student's module by the contract's parameter names
(:func:`load_into`); the judge loads them into torch's own modules (:func:`torch_layer`,
:func:`block_formula`) and computes what the student's module should have returned.

Everything is float64: the comparisons are then tight (1e-7) and untouched by which attention
kernel torch picks (``nn.MultiheadAttention``'s fused path in eval mode gives the same values).
"""
from __future__ import annotations

import contextlib
import contextvars
import math

import torch
import torch.nn.functional as F
from torch import nn

from coursekit.contract import LAYERNORM_EPS, RMSNORM_EPS
from coursekit.checks import CheckFailed
from coursekit.checks.remote import remotable

DTYPE = torch.float64

#: the draw of this grading run (0: the fixed seeds, as in the notebook). The course grader's
#: referee sets it for the hidden checks, from the run and the submission
#: (:func:`autograder.referee.calls.draw`), for the probe and the judge alike: a seed table the
#: student's code saw in one run helps no later submission.
_SALT: contextvars.ContextVar = contextvars.ContextVar("hidden_draw", default=0)


@contextlib.contextmanager
def salted(salt: int):
    """Within: every seed of :func:`generator` (so :func:`randn` and :func:`values`) is moved by ``salt``."""
    token = _SALT.set(int(salt))
    try:
        yield
    finally:
        _SALT.reset(token)


def current_salt() -> int:
    return _SALT.get()


def generator(seed: int) -> torch.Generator:
    """A CPU generator for ``seed``, moved by this run's draw (:func:`salted`; none by default)."""
    salt = _SALT.get()
    if salt:
        seed = (int(seed) * 1_000_003 + salt) % (1 << 62)
    return torch.Generator().manual_seed(int(seed))


def randn(seed: int, *shape: int, scale: float = 1.0, offset: float = 0.0, dtype=DTYPE) -> torch.Tensor:
    """A seeded normal tensor, drawn in float64 then cast: the same on every machine."""
    g = generator(seed)
    return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale + offset).to(dtype)


def values(spec, seed: int) -> dict[str, torch.Tensor]:
    """``spec``: ``[(name, shape, kind)]``, kind ``gain`` (about 1), ``bias`` (about 0) or ``linear``."""
    g = generator(seed)
    out = {}
    for name, shape, kind in spec:
        t = torch.randn(*shape, generator=g, dtype=DTYPE)
        if kind == "gain":
            t = 1.0 + 0.3 * t
        elif kind == "bias":
            t = 0.3 * t
        else:
            t = t / math.sqrt(shape[-1])
        out[name] = t
    return out


def load_into(module: nn.Module, vals: dict, owner: str, hint: str) -> None:
    """Copy ``vals`` into the parameters of ``module`` with the same names (probe side)."""
    for name, v in vals.items():
        try:
            p = module.get_parameter(name)
        except AttributeError:
            raise CheckFailed(f"{owner} has no parameter {name!r}: {hint}") from None
        if tuple(p.shape) != tuple(v.shape):
            raise CheckFailed(f"{owner}'s parameter {name!r} has shape {tuple(p.shape)}, "
                              f"expected {tuple(v.shape)}")
        with torch.no_grad():
            p.copy_(v.to(p.dtype))


@remotable
def call_keeping_inputs(fn, *args, **kwargs) -> dict:
    """``fn(*args, **kwargs)``, and which of the tensor arguments the call changed in place:
    ``{"out": ..., "changed": [position, ...]}`` (the caller's tensors must stay as they were)."""
    before = [(i, a.detach().clone()) for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    out = fn(*args, **kwargs)
    changed = [i for i, a in before if not (args[i].shape == a.shape and torch.equal(args[i].detach(), a))]
    return {"out": out, "changed": changed}


def expect_inputs_kept(record, names: tuple, what: str):
    """The output of a :func:`call_keeping_inputs` record, once no input was changed in place."""
    from coursekit.checks.compare import ANY, expect_structure
    expect_structure(record, {"out": ANY, "changed": ANY}, what)
    changed = [names[i] if isinstance(i, int) and 0 <= i < len(names) else "an input" for i in record["changed"]]
    if changed:
        raise CheckFailed(f"{what} changed {', '.join(changed)} in place (x += ..., x.mul_(...)): the caller's "
                          "tensors must stay as they were; compute the result into a new tensor")
    return record["out"]


def as_module(obj, what: str) -> nn.Module:
    if not isinstance(obj, nn.Module):
        raise CheckFailed(f"{what} should be an nn.Module, but it is {type(obj).__name__}")
    return obj


# --------------------------------------------------------------------------------------------
# Norms (judge side)
# --------------------------------------------------------------------------------------------

def make_norm(kind: str, dim: int, vals: dict | None = None, prefix: str = "", eps=None) -> nn.Module:
    """torch's own norm of the contract: LayerNorm eps 1e-5 or RMSNorm eps 1e-6, weights from ``vals``."""
    if kind == "layer":
        m = nn.LayerNorm(dim, eps=LAYERNORM_EPS if eps is None else eps, dtype=DTYPE)
    else:
        m = nn.RMSNorm(dim, eps=RMSNORM_EPS if eps is None else eps, dtype=DTYPE)
    if vals is not None:
        with torch.no_grad():
            m.weight.copy_(vals[prefix + "weight"])
            if kind == "layer" and prefix + "bias" in vals:
                m.bias.copy_(vals[prefix + "bias"])
    return m


def norm_spec(kind: str, dim: int, prefix: str) -> list:
    spec = [(prefix + "weight", (dim,), "gain")]
    if kind == "layer":
        spec.append((prefix + "bias", (dim,), "bias"))
    return spec


# --------------------------------------------------------------------------------------------
# Dropout patterns (judge side)
# --------------------------------------------------------------------------------------------

def dropped_pattern(diff: torch.Tensor, full: torch.Tensor, p: float, tol: float = 1e-6) -> bool:
    """Is ``diff`` what inverted dropout with rate ``p`` makes of ``full``?

    Every element is either 0 (dropped) or ``full / (1 - p)`` (kept and rescaled), and the
    dropped fraction is plausible for ``p`` (the inputs have a few hundred elements). The
    tolerance is loose for float64 and tight for the mistakes: a float32 constant is fine.
    """
    if diff.shape != full.shape:
        return False
    diff, full = diff.double(), full.double()
    kept = full / (1 - p)
    is_zero = diff.abs() <= tol * (1 + kept.abs())
    is_kept = (diff - kept).abs() <= tol * (1 + kept.abs())
    if not bool((is_zero | is_kept).all()):
        return False
    frac = float((is_zero & ~is_kept).double().mean())
    return abs(frac - p) < 0.2


# --------------------------------------------------------------------------------------------
# Transformer block weights and references (judge side)
# --------------------------------------------------------------------------------------------

def block_spec(d_model: int, d_ff: int, norm: str = "layer", prefix: str = "") -> list:
    """The contract's parameter names of a TransformerBlock, in a fixed order."""
    return [
        *norm_spec(norm, d_model, prefix + "norm1."),
        (prefix + "attn.in_proj_weight", (3 * d_model, d_model), "linear"),
        (prefix + "attn.in_proj_bias", (3 * d_model,), "bias"),
        (prefix + "attn.out_proj.weight", (d_model, d_model), "linear"),
        (prefix + "attn.out_proj.bias", (d_model,), "bias"),
        *norm_spec(norm, d_model, prefix + "norm2."),
        (prefix + "ffn.0.weight", (d_ff, d_model), "linear"),
        (prefix + "ffn.0.bias", (d_ff,), "bias"),
        (prefix + "ffn.3.weight", (d_model, d_ff), "linear"),
        (prefix + "ffn.3.bias", (d_model,), "bias"),
    ]


#: contract name -> nn.TransformerEncoderLayer name
TORCH_NAMES = (("attn.", "self_attn."), ("ffn.0.", "linear1."), ("ffn.3.", "linear2."))


def _torch_name(name: str) -> str:
    for ours, theirs in TORCH_NAMES:
        if name.startswith(ours):
            return theirs + name[len(ours):]
    return name


def torch_layer(vals: dict, d_model: int, n_heads: int, d_ff: int, *, norm_first: bool,
                norm: str = "layer", prefix: str = "", activation: str = "gelu") -> nn.Module:
    """``nn.TransformerEncoderLayer`` with the block's weights (norms swapped for RMSNorm if asked).

    Left in train mode with dropout 0: deterministic, and never on torch's fused fast path.
    """
    layer = nn.TransformerEncoderLayer(d_model, n_heads, d_ff, dropout=0.0, activation=activation,
                                       batch_first=True, norm_first=norm_first, dtype=DTYPE)
    if norm == "rms":
        layer.norm1, layer.norm2 = make_norm("rms", d_model), make_norm("rms", d_model)
    state = {_torch_name(k[len(prefix):]): v for k, v in vals.items() if k.startswith(prefix)}
    missing, unexpected = layer.load_state_dict(state, strict=False)
    assert not unexpected and all(k.endswith("bias") and k.startswith("norm") for k in missing), (missing, unexpected)
    return layer.train()


class Parts:
    """torch modules holding one block's weights, for formulas of right and wrong blocks."""

    def __init__(self, vals, d_model, n_heads, d_ff, norm="layer", prefix="", norm_eps=None):
        self.norm1 = make_norm(norm, d_model, vals, prefix + "norm1.", norm_eps)
        self.norm2 = make_norm(norm, d_model, vals, prefix + "norm2.", norm_eps)
        self.attn = nn.MultiheadAttention(d_model, n_heads, batch_first=True, dtype=DTYPE)
        self.lin1 = nn.Linear(d_model, d_ff, dtype=DTYPE)
        self.lin2 = nn.Linear(d_ff, d_model, dtype=DTYPE)
        with torch.no_grad():
            self.attn.in_proj_weight.copy_(vals[prefix + "attn.in_proj_weight"])
            self.attn.in_proj_bias.copy_(vals[prefix + "attn.in_proj_bias"])
            self.attn.out_proj.weight.copy_(vals[prefix + "attn.out_proj.weight"])
            self.attn.out_proj.bias.copy_(vals[prefix + "attn.out_proj.bias"])
            for lin, i in ((self.lin1, 0), (self.lin2, 3)):
                lin.weight.copy_(vals[f"{prefix}ffn.{i}.weight"])
                lin.bias.copy_(vals[f"{prefix}ffn.{i}.bias"])

    def sa(self, h, attn_mask=None, key_padding_mask=None):
        return self.attn(h, h, h, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                         need_weights=False)[0]

    def ff(self, h, act="gelu"):
        a = {"gelu": F.gelu, "relu": F.relu, "tanh": lambda t: F.gelu(t, approximate="tanh")}[act]
        return self.lin2(a(self.lin1(h)))


def block_formula(parts: Parts, x, *, norm_first=True, attn_mask=None, key_padding_mask=None,
                  act="gelu", attn_residual=True, ffn_residual=True, normed_residual=False):
    """A block's output by its formula, with switches that reproduce known mistakes."""
    m = dict(attn_mask=attn_mask, key_padding_mask=key_padding_mask)
    if norm_first:
        n = parts.norm1(x)
        h = (n if normed_residual else x) * attn_residual + parts.sa(n, **m)
        n = parts.norm2(h)
        return (n if normed_residual else h) * ffn_residual + parts.ff(n, act)
    h = parts.norm1(x * attn_residual + parts.sa(x, **m))
    return parts.norm2(h * ffn_residual + parts.ff(h, act))
