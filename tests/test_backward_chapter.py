"""The experiments of chapters 10 and 10b (book/experiments/backward.py): the hand-written
backward passes agree with autograd, the fused add + RMSNorm saves exactly what chapter 10b says,
and each check fails on a wrong version (a missing projection or mean term, an ignored grad_h, an
extra saved tensor).
"""
from __future__ import annotations

import pytest
import torch

from book.experiments import backward as bw

pytestmark = pytest.mark.book


def _no_projection(x, weight, rstd, grad_out):
    """RMSNorm's backward without its projection term: r * g * w."""
    acc = rstd.dtype
    g, xf, w = grad_out.to(acc), x.to(acc), weight.to(acc)
    return (rstd * g * w).to(x.dtype), (g * xf * rstd).reshape(-1, x.shape[-1]).sum(0).to(weight.dtype)


def _no_mean_term(x, weight, mean, rstd, grad_out):
    """LayerNorm's backward without its mean term."""
    xhat = (x - mean) * rstd
    gh = grad_out * weight
    grad_x = rstd * (gh - xhat * (gh * xhat).mean(-1, keepdim=True))
    D = x.shape[-1]
    return grad_x, (grad_out * xhat).reshape(-1, D).sum(0), grad_out.reshape(-1, D).sum(0)


# --- hand-written backward passes against autograd ----------------------------------------------

@pytest.mark.parametrize("shape", [(7, 16), (3, 5, 16), (2, 3, 4, 33)])
@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_hand_backward_matches_autograd_in_float64(norm, shape):
    """Every gradient of the hand-written backward equals autograd's to float64 rounding."""
    errs = bw.max_error_vs_autograd(norm, shape=shape)
    assert max(errs.values()) < 1e-12, errs


def test_missing_projection_term_is_caught():
    """The same comparison fails for an RMSNorm backward without the projection term."""
    errs = bw.max_error_vs_autograd("rms", backward=_no_projection)
    assert errs["x"] > 1e-2, errs
    assert errs["weight"] < 1e-12  # the weight's gradient has no such term


def test_missing_mean_term_is_caught():
    """The same comparison fails for a LayerNorm backward without the mean term."""
    errs = bw.max_error_vs_autograd("layer", backward=_no_mean_term)
    assert errs["x"] > 1e-2, errs


@pytest.mark.parametrize("fn, args", [
    (bw.HandRMSNorm.apply, "x w 1e-6"),
    (bw.HandLayerNorm.apply, "x w b 1e-5"),
    (bw.FusedAddRMSNorm.apply, "x r w 1e-6"),
])
def test_gradcheck_passes(fn, args):
    """torch.autograd.gradcheck (finite differences, float64) accepts each Function."""
    gen = torch.Generator().manual_seed(0)
    t = {"x": torch.randn(3, 4, 8, generator=gen, dtype=torch.float64, requires_grad=True),
         "r": torch.randn(3, 4, 8, generator=gen, dtype=torch.float64, requires_grad=True),
         "w": torch.randn(8, generator=gen, dtype=torch.float64, requires_grad=True),
         "b": torch.randn(8, generator=gen, dtype=torch.float64, requires_grad=True)}
    inputs = tuple(t[a] if a in t else float(a) for a in args.split())
    assert torch.autograd.gradcheck(fn, inputs)


def test_hand_backward_has_no_autograd_inside():
    """The backward functions compute on tensors that do not require grad, and return such."""
    x, w = torch.randn(4, 8), torch.ones(8)
    _, rstd = bw.rmsnorm_forward(x, w)
    with torch.no_grad():
        gx, gw = bw.rmsnorm_backward(x, w, rstd, torch.randn(4, 8))
    assert not gx.requires_grad and not gw.requires_grad


# --- dtypes and shapes of the statistics ---------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_statistics_are_float32_with_shape_rows_by_one(dtype):
    """rstd (and LayerNorm's mean) are float32, shape (..., 1); gradients keep the inputs' dtypes."""
    x = torch.randn(2, 3, 8).to(dtype)
    w, b = torch.ones(8, dtype=dtype), torch.zeros(8, dtype=dtype)
    y, rstd = bw.rmsnorm_forward(x, w)
    assert rstd.dtype == torch.float32 and rstd.shape == (2, 3, 1) and y.dtype == dtype
    gx, gw = bw.rmsnorm_backward(x, w, rstd, torch.randn_like(x))
    assert gx.dtype == dtype and gx.shape == x.shape and gw.dtype == dtype and gw.shape == (8,)
    _, mean, rstd = bw.layernorm_forward(x, w, b)
    assert mean.dtype == rstd.dtype == torch.float32 and mean.shape == (2, 3, 1)
    gx, gw, gb = bw.layernorm_backward(x, w, mean, rstd, torch.randn_like(x))
    assert (gx.dtype, gw.dtype, gb.dtype) == (dtype, dtype, dtype)


def test_bfloat16_backward_with_float32_statistics_is_at_the_rounding_floor():
    """As chapter 10 states: float32 statistics keep bf16's backward error at output rounding,
    bf16 statistics do not when the gradient lies mostly along x."""
    gen = torch.Generator().manual_seed(1)
    x = (3 * torch.randn(64, 1024, generator=gen)).bfloat16()
    w = torch.ones(1024, dtype=torch.bfloat16)
    g = (x.float() + 0.05 * torch.randn(64, 1024, generator=gen)).bfloat16()
    _, r64 = bw.rmsnorm_forward(x.double(), w.double())
    ref = bw.rmsnorm_backward(x.double(), w.double(), r64, g.double())[0]
    _, r32 = bw.rmsnorm_forward(x, w)

    def rel(t):
        return ((t.double() - ref).norm() / ref.norm()).item()

    floor = rel(ref.bfloat16())
    assert rel(bw.rmsnorm_backward(x, w, r32, g)[0]) < 1.5 * floor
    assert rel(bw.rmsnorm_backward(x, w, r32.bfloat16(), g)[0]) > 5 * floor


# --- the fused add + RMSNorm ----------------------------------------------------------------------

@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_fused_gradients_match_eager_with_gradients_into_both_outputs(dtype, tol):
    """FusedAddRMSNorm's gradients of x, residual and weight equal autograd's through
    x + residual followed by F.rms_norm, with gradients flowing into y and h."""
    errs = bw.fused_error_vs_autograd(dtype=dtype)
    assert max(errs.values()) < tol, errs


def test_fused_check_catches_a_backward_without_projection_term(monkeypatch):
    """The fused Function's backward goes through rmsnorm_backward: break it, the check fails."""
    monkeypatch.setattr(bw, "rmsnorm_backward", _no_projection)
    errs = bw.fused_error_vs_autograd()
    assert errs["x"] > 1e-2 and errs["residual"] > 1e-2, errs


class _DropsGradH(bw.FusedAddRMSNorm):
    """A wrong fused backward: it ignores the gradient arriving through the residual stream."""

    @staticmethod
    def backward(ctx, grad_h, grad_y):
        h, weight, rstd = ctx.saved_tensors
        grad_norm, grad_w = bw.rmsnorm_backward(h, weight, rstd, grad_y)
        return grad_norm, grad_norm, grad_w, None


def test_gradcheck_catches_an_ignored_grad_h():
    """gradcheck sends a gradient into h as well, so a backward that drops grad_h fails it."""
    x, r = (torch.randn(2, 8, dtype=torch.float64, requires_grad=True) for _ in range(2))
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    assert not torch.autograd.gradcheck(_DropsGradH.apply, (x, r, w, 1e-6), raise_exception=False)


def test_fused_returns_h_equal_to_the_sum_and_y_in_h_dtype():
    """h is x + residual exactly; y has h's dtype and equals F.rms_norm(h) up to rounding."""
    x, r, w, _, _ = bw.make_inputs(16, 32, torch.bfloat16)
    h, y = bw.FusedAddRMSNorm.apply(x, r, w, 1e-6)  # the book's order: stream first
    assert torch.equal(h, x + r) and y.dtype == torch.bfloat16
    ref = torch.nn.functional.rms_norm(h.double(), (32,), w.double(), 1e-6)
    assert (y.double() - ref).abs().max() < 0.05


# --- what is saved for backward ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_saves_exactly_h_weight_and_float32_rstd(dtype):
    """saved_bytes of FusedAddRMSNorm = bytes of h + bytes of w + 4 bytes per row."""
    N, D = 64, 48
    x, r, w, _, _ = bw.make_inputs(N, D, dtype)
    size = torch.finfo(dtype).bits // 8
    total, entries = bw.saved_bytes(bw.fused_add_rmsnorm, x, r, w, 1e-6)
    assert total == N * D * size + D * size + N * 4
    assert sorted((shape, dt) for shape, dt, _ in entries) == sorted(
        [((N, D), dtype), ((D,), dtype), ((N, 1), torch.float32)])


def test_eager_float32_saves_two_activation_sized_tensors():
    """The eager add + textbook RMSNorm keeps h and h * rstd: twice the fused bytes, up to w."""
    N, D = 64, 48
    x, r, w, _, _ = bw.make_inputs(N, D)
    total, entries = bw.saved_bytes(bw.textbook_add_rmsnorm, x, r, w, 1e-6)
    assert sum(1 for shape, _, _ in entries if shape == (N, D)) == 2
    assert total == 2 * N * D * 4 + D * 4 + N * 4


class _SavesX(bw.FusedAddRMSNorm):
    """A fused Function that also keeps x alive for the backward (it does not need to)."""

    @staticmethod
    def forward(ctx, x, residual, weight, eps):
        h = x + residual
        y, rstd = bw.rmsnorm_forward(h, weight, eps)
        ctx.save_for_backward(h, weight, rstd, x)
        return h, y

    @staticmethod
    def backward(ctx, grad_h, grad_y):
        h, weight, rstd, _ = ctx.saved_tensors
        grad_norm, grad_w = bw.rmsnorm_backward(h, weight, rstd, grad_y)
        return grad_h + grad_norm, grad_h + grad_norm, grad_w, None


class _SavesHTwice(_SavesX):
    """Saves h twice (once as a view): the same storage, which must count once."""

    @staticmethod
    def forward(ctx, x, residual, weight, eps):
        h = x + residual
        y, rstd = bw.rmsnorm_forward(h, weight, eps)
        ctx.save_for_backward(h, weight, rstd, h.view(-1))
        return h, y


def test_saved_bytes_counts_an_extra_tensor_and_dedups_a_shared_storage():
    """An extra saved x adds its bytes; saving h twice adds nothing."""
    N, D = 64, 48
    x, r, w, _, _ = bw.make_inputs(N, D)
    fused, _ = bw.saved_bytes(bw.fused_add_rmsnorm, x, r, w, 1e-6)
    extra, _ = bw.saved_bytes(_SavesX.apply, x, r, w, 1e-6)
    twice, entries = bw.saved_bytes(_SavesHTwice.apply, x, r, w, 1e-6)
    assert extra == fused + N * D * 4
    assert twice == fused and len(entries) == 3
