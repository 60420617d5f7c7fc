"""Backward passes of RMSNorm and LayerNorm written by hand, and a fused residual add + RMSNorm
(chapter 10).

Notation, for one row ``x`` of width ``D`` (every function works on ``(..., D)``, rows in the
leading dims), ``g`` the gradient arriving at the output, ``w`` the weight:

    RMSNorm    r = (mean(x^2) + eps)^(-1/2),   y = w * x * r
               dx = r * (g*w - x * r^2 * mean(g*w*x))          dw = sum over rows of g * x * r
    LayerNorm  mu = mean(x),  r = (mean((x - mu)^2) + eps)^(-1/2),  xh = (x - mu) * r,
               y = w * xh + b,  gh = g * w
               dx = r * (gh - mean(gh) - xh * mean(gh * xh))    dw = sum g * xh,  db = sum g

The statistics (``mean``, ``rstd``) are kept in float32, or in float64 for float64 inputs
(:func:`stat_dtype`), with shape ``(..., 1)``: a 16-bit input gets 32-bit statistics and 32-bit
arithmetic in the backward, and the results are cast back to the inputs' dtypes.

:class:`FusedAddRMSNorm` is the residual add and the RMSNorm in one ``torch.autograd.Function``:
``h = x + residual`` (the new residual stream) and ``y = RMSNorm(h) * w``, returned stream first,
``(h, y)``. Its backward receives the gradients of both outputs and saves only ``h``, ``w`` and
the per-row ``rstd``.

The backward functions take their arguments in the order a Function's backward has them: what
the forward saved (``x``, ``weight``, the statistics), then the gradient arriving at the output.
(Exercise 05 asks for the same functions with the gradient first; the book's are not its answer.)
:func:`saved_bytes` measures what an autograd graph keeps for its backward, through
``torch.autograd.graph.saved_tensors_hooks``. On the CPU the Function runs ordinary tensor
operations (no custom kernel): what it changes is what is saved and how the backward is computed.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F


def stat_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for 16- and 32-bit inputs, float64 for float64: never less than float32."""
    return torch.promote_types(dtype, torch.float32)


# --- RMSNorm ------------------------------------------------------------------------------------

def rmsnorm_forward(x, weight, eps: float = 1e-6):
    """``(y, rstd)``: ``y = w * x * rstd`` in x's dtype, ``rstd`` ``(..., 1)``."""
    xf = x.to(stat_dtype(x.dtype))
    # r = (mean(x^2) + eps)^(-1/2), one per row
    rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    y = xf * rstd * weight.to(xf.dtype)
    return y.to(x.dtype), rstd


def rmsnorm_backward(x, weight, rstd, grad_out):
    """``(grad_x, grad_weight)`` of ``y = w * x * rstd``, by hand (no autograd): the saved
    tensors first, then the gradient arriving at ``y``."""
    acc = rstd.dtype
    g, xf, w = grad_out.to(acc), x.to(acc), weight.to(acc)
    gw = g * w                                       # dL/d(x r), per feature
    # dx = r * (g w - x r^2 mean(g w x)); the second term is the projection term
    proj = xf * rstd.pow(2) * (gw * xf).mean(-1, keepdim=True)
    grad_x = rstd * (gw - proj)
    # dw = sum over every leading dim of g * x * r
    grad_w = (g * xf * rstd).reshape(-1, x.shape[-1]).sum(0)
    return grad_x.to(x.dtype), grad_w.to(weight.dtype)


# --- LayerNorm ----------------------------------------------------------------------------------

def layernorm_forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                      eps: float = 1e-5):
    """``(y, mean, rstd)``: population variance, eps inside the root; statistics ``(..., 1)``."""
    xf = x.to(stat_dtype(x.dtype))
    mean = xf.mean(-1, keepdim=True)
    rstd = torch.rsqrt((xf - mean).pow(2).mean(-1, keepdim=True) + eps)
    y = (xf - mean) * rstd * weight.to(xf.dtype) + bias.to(xf.dtype)
    return y.to(x.dtype), mean, rstd


def layernorm_backward(x, weight, mean, rstd, grad_out):
    """``(grad_x, grad_weight, grad_bias)`` of ``y = w * (x - mean) * rstd + b``: the saved
    tensors first, then the gradient arriving at ``y``."""
    acc = rstd.dtype
    g, xf, w = grad_out.to(acc), x.to(acc), weight.to(acc)
    xhat = (xf - mean) * rstd
    gh = g * w
    # dx = r * (gh - mean(gh) - xh * mean(gh xh)): mean term, projection term
    mean_term = gh.mean(-1, keepdim=True)
    proj = xhat * (gh * xhat).mean(-1, keepdim=True)
    grad_x = rstd * (gh - mean_term - proj)
    D = x.shape[-1]
    grad_w = (g * xhat).reshape(-1, D).sum(0)
    grad_b = g.reshape(-1, D).sum(0)
    return grad_x.to(x.dtype), grad_w.to(weight.dtype), grad_b.to(weight.dtype)


# --- the same backward passes wrapped as autograd Functions, for gradcheck -----------------------

class HandRMSNorm(torch.autograd.Function):
    """``rmsnorm_forward`` with ``rmsnorm_backward`` as its backward."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        y, rstd = rmsnorm_forward(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, weight, rstd = ctx.saved_tensors
        grad_x, grad_w = rmsnorm_backward(x, weight, rstd, grad_y)
        return grad_x, grad_w, None


class HandLayerNorm(torch.autograd.Function):
    """``layernorm_forward`` with ``layernorm_backward`` as its backward."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        y, mean, rstd = layernorm_forward(x, weight, bias, eps)
        ctx.save_for_backward(x, weight, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, weight, mean, rstd = ctx.saved_tensors
        return (*layernorm_backward(x, weight, mean, rstd, grad_y), None)


# --- fused residual add + RMSNorm ---------------------------------------------------------------

class FusedAddRMSNorm(torch.autograd.Function):
    """``(h, y) = FusedAddRMSNorm.apply(x, residual, weight, eps)``:
    ``h = x + residual``, ``y = RMSNorm(h) * weight`` (float32 statistics,
    ``y`` in h's dtype), the stream first. Saved for backward: ``h``, ``weight``
    and ``rstd`` (one float32 per row), nothing else.
    """

    @staticmethod
    def forward(ctx, x, residual, weight, eps):
        h = x + residual                         # the new residual stream
        y, rstd = rmsnorm_forward(h, weight, eps)
        ctx.save_for_backward(h, weight, rstd)
        return h, y

    @staticmethod
    def backward(ctx, grad_h, grad_y):
        h, weight, rstd = ctx.saved_tensors
        grad_norm, grad_w = rmsnorm_backward(h, weight, rstd, grad_y)
        # h has two consumers (the norm, the stream above): gradients add
        grad_stream = grad_h + grad_norm
        # h = x + residual passes its gradient unchanged to both inputs
        return grad_stream, grad_stream, grad_w, None


def eager_add_rmsnorm(x, residual, weight, eps=1e-6):
    """The unfused reference: an add, then PyTorch's ``F.rms_norm``. Returns ``(y, h)``."""
    h = x + residual
    return F.rms_norm(h, (h.shape[-1],), weight, eps), h


def textbook_add_rmsnorm(x, residual, weight, eps=1e-6):
    """An add, then RMSNorm written as tensor operations in h's dtype. Returns ``(y, h)``."""
    h = x + residual
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * weight, h


def fused_add_rmsnorm(x, residual, weight, eps=1e-6):
    """:class:`FusedAddRMSNorm` with the same signature and outputs ``(y, h)`` as the two eager
    versions."""
    h, y = FusedAddRMSNorm.apply(x, residual, weight, eps)
    return y, h


IMPLEMENTATIONS: dict[str, Callable] = {
    "eager: add + F.rms_norm": eager_add_rmsnorm,
    "eager: add + textbook RMSNorm": textbook_add_rmsnorm,
    "FusedAddRMSNorm": fused_add_rmsnorm,
}


# --- checks and measurements --------------------------------------------------------------------

def max_error_vs_autograd(norm: str = "rms", backward: Callable | None = None, shape=(3, 5, 16),
                          eps: float = 1e-6, seed: int = 0) -> dict[str, float]:
    """Max |hand - autograd| of every gradient, float64, for a random input and output gradient.

    ``norm`` is ``"rms"`` or ``"layer"``; ``backward`` replaces the module's hand-written backward
    (to show that a wrong one is caught). Autograd differentiates the plain formula.
    """
    gen = torch.Generator().manual_seed(seed)
    D = shape[-1]
    x = torch.randn(*shape, generator=gen, dtype=torch.float64, requires_grad=True)
    w = (1 + 0.5 * torch.randn(D, generator=gen, dtype=torch.float64)).requires_grad_()
    b = torch.randn(D, generator=gen, dtype=torch.float64, requires_grad=True)
    g = torch.randn(*shape, generator=gen, dtype=torch.float64)
    if norm == "rms":
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
        ref = torch.autograd.grad(y, (x, w), g)
        _, rstd = rmsnorm_forward(x.detach(), w.detach(), eps)
        mine = (backward or rmsnorm_backward)(x.detach(), w.detach(), rstd, g)
        names = ("x", "weight")
    elif norm == "layer":
        mu = x.mean(-1, keepdim=True)
        y = (x - mu) * torch.rsqrt((x - mu).pow(2).mean(-1, keepdim=True) + eps) * w + b
        ref = torch.autograd.grad(y, (x, w, b), g)
        _, mean, rstd = layernorm_forward(x.detach(), w.detach(), b.detach(), eps)
        mine = (backward or layernorm_backward)(x.detach(), w.detach(), mean, rstd, g)
        names = ("x", "weight", "bias")
    else:
        raise ValueError("norm must be 'rms' or 'layer'")
    return {n: (m - r).abs().max().item() for n, m, r in zip(names, mine, ref)}


def fused_error_vs_autograd(shape=(3, 5, 16), eps: float = 1e-6, dtype=torch.float64,
                            seed: int = 0) -> dict[str, float]:
    """Max |FusedAddRMSNorm - autograd of the eager add + F.rms_norm| of every gradient, with
    gradients flowing into both outputs ``y`` and ``h``."""
    gen = torch.Generator().manual_seed(seed)
    D = shape[-1]
    leaves = [torch.randn(*shape, generator=gen, dtype=torch.float64) for _ in range(2)]
    leaves.append(1 + 0.5 * torch.randn(D, generator=gen, dtype=torch.float64))
    gy, gh = (torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype) for _ in range(2))
    grads = {}
    for name, fn in (("eager", eager_add_rmsnorm), ("fused", fused_add_rmsnorm)):
        x, r, w = (t.to(dtype).requires_grad_() for t in leaves)
        y, h = fn(x, r, w, eps)
        grads[name] = torch.autograd.grad((y, h), (x, r, w), (gy, gh))
    return {n: (a.double() - b.double()).abs().max().item()
            for n, a, b in zip(("x", "residual", "weight"), grads["fused"], grads["eager"])}


def saved_bytes(fn: Callable, *args):
    """Bytes that autograd keeps alive for the backward of ``fn(*args)``.

    Every tensor the forward saves passes through a pack hook; tensors that
    share a storage (one tensor saved twice, or views of one tensor) count
    once, by their storage's address. Returns the total and one
    ``(shape, dtype, bytes)`` per distinct storage, in saving order.
    """
    storages = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        storages.setdefault(s.data_ptr(), (tuple(t.shape), t.dtype, s.nbytes()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    entries = list(storages.values())
    return sum(n for _, _, n in entries), entries


def describe(entries, rows: int, D: int) -> str:
    """``2 x (N, D) float32 + (N, 1) float32 + (D,) float32``: what a saved list holds."""
    def kind(shape):
        if math.prod(shape) == rows * D and shape[-1] == D:
            return "(N, D)"
        if shape == (D,):
            return "(D,)"
        return "(N, 1)" if math.prod(shape) == rows else str(shape)

    counts: dict[str, int] = {}
    for shape, dtype, _ in entries:
        key = f"{kind(shape)} {str(dtype).replace('torch.', '')}"
        counts[key] = counts.get(key, 0) + 1
    return " + ".join(f"{n} x {k}" if n > 1 else k for k, n in counts.items())


def make_inputs(rows: int, D: int, dtype=torch.float32, seed: int = 0):
    """``x``, ``residual``, ``weight`` (leaves that require grad) and the two output gradients."""
    gen = torch.Generator().manual_seed(seed)
    x, r = (torch.randn(rows, D, generator=gen).to(dtype).requires_grad_() for _ in range(2))
    w = (1 + 0.1 * torch.randn(D, generator=gen)).to(dtype).requires_grad_()
    gy, gh = (torch.randn(rows, D, generator=gen).to(dtype) for _ in range(2))
    return x, r, w, gy, gh


def fwd_bwd(fn: Callable, x, r, w, gy, gh, eps: float = 1e-6) -> None:
    """One forward and backward of ``fn`` with gradients into both outputs (grad enabled even
    when called under ``torch.no_grad()``, as :func:`coursekit.bench.time_interleaved` does)."""
    with torch.enable_grad():
        y, h = fn(x, r, w, eps)
        torch.autograd.backward((y, h), (gy, gh))
    x.grad = r.grad = w.grad = None


def aten_ops(fn: Callable, *args, grads=None) -> list[str]:
    """The ATen operations that ``fn(*args)`` runs (and, given ``grads`` for its outputs, its
    backward), views and bookkeeping left out: on a GPU each one is a kernel launch."""
    from torch.utils._python_dispatch import TorchDispatchMode

    skip = {"aten.detach", "aten.promote_types"}

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = str(func.overloadpacket)
            if not func.is_view and name not in skip:
                self.ops.append(name.removeprefix("aten."))
            return func(*args, **(kwargs or {}))

    with torch.enable_grad(), Record() as rec:
        out = fn(*args)
        if grads is not None:
            torch.autograd.backward(out, grads)
    return rec.ops
