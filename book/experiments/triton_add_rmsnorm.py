"""Fused residual add + RMSNorm in Triton, forward and backward (reference material, not graded).

The same operation as the contract's ``FusedAddRMSNorm`` (issue 11), written as two GPU kernels:

    h = x + residual                                   (the new residual stream, x's dtype)
    rstd = 1 / sqrt(mean(h**2, -1) + eps)              (float32, one number per row)
    y = h * rstd * weight                              (computed in float32, stored in h's dtype)

and, given the gradients ``gy`` of ``y`` and ``gh`` of ``h`` (h is used twice downstream: by the
norm and by the next residual add), with ``g = gy * weight``:

    dx = dresidual = rstd * g - h * rstd**3 * mean(g * h, -1) + gh
    dweight        = sum over rows of gy * h * rstd

Forward: one program per row; the row (D numbers, padded to BLOCK = next power of 2 of D) is read
once, so x, residual and weight are read and y, h written exactly once. Backward: a fixed number
of programs, each walking a contiguous block of rows; every program adds its rows' ``gy * h * rstd``
into one float32 vector, stores it as one row of a ``(programs, D)`` buffer, and the host sums
that buffer's rows. This is the way Liger-Kernel's ``rms_norm`` reduces dweight (one partial row
per streaming multiprocessor): no atomics, and a second pass over only ``programs x D`` numbers.

Only ``h``, ``weight`` and the float32 ``rstd`` are saved for backward, as the contract asks.

What was run, and where: the tests (``tests/test_triton_add_rmsnorm.py``) run these kernels under
Triton's interpreter (``TRITON_INTERPRET=1``: numpy on CPU tensors) against a float64 autograd
reference, in float32 and bfloat16. In bfloat16 the interpreter truncates every float32 ->
bfloat16 cast where compiled Triton rounds to nearest even, so those runs check the math, not
the last bit of a bfloat16 output. Nothing here has been compiled for or timed on a GPU: :func:`benchmark` (this kernel
against eager ``x + r`` then ``F.rms_norm``, timed with ``torch.cuda.Event``) is written for CUDA
but unmeasured. Without CUDA and without ``TRITON_INTERPRET=1`` set before this module is
imported, :func:`fused_add_rmsnorm` refuses to run.

References: Zhang & Sennrich (2019), *Root Mean Square Layer Normalization*; Liger-Kernel
(linkedin/Liger-Kernel, ``ops/rms_norm.py`` and ``ops/fused_add_rms_norm.py``) for the dweight
reduction.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"  # read by triton.jit at decoration time


@triton.jit
def _add_rmsnorm_fwd(X, R, W, Y, H, RSTD, D, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < D                      # D need not be a power of 2: padded lanes read 0
    x = tl.load(X + row * D + cols, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(R + row * D + cols, mask=mask, other=0.0).to(tl.float32)
    # h = x + residual, added in float32 and rounded once to the stream's dtype, as torch does
    # (the interpreter, which holds bfloat16 as raw uint16, can only add in float32)
    h = (x + r).to(H.dtype.element_ty)
    tl.store(H + row * D + cols, h, mask=mask)
    hf = h.to(tl.float32)               # the norm sees the rounded h, as the next block will
    # rstd = 1 / sqrt(sum_i h_i^2 / D + eps), float32 (padded lanes add 0; divide by D, not BLOCK)
    rstd = 1.0 / tl.sqrt(tl.sum(hf * hf, axis=0) / D + eps)
    tl.store(RSTD + row, rstd)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    # y = h * rstd * w, cast once at the end
    y = hf * rstd * w
    tl.store(Y + row * D + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _add_rmsnorm_bwd(GY, GH, H, W, RSTD, DX, DW_PART, n_rows, D, rows_per_program,
                     HAS_GH: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK,), dtype=tl.float32)        # this program's share of dweight
    first = pid.to(tl.int64) * rows_per_program       # int64 bounds: row * D may pass 2**31
    last = tl.minimum(first + rows_per_program, n_rows)
    for row in range(first, last):
        off = row * D + cols
        gy = tl.load(GY + off, mask=mask, other=0.0).to(tl.float32)
        hf = tl.load(H + off, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + row)
        # dweight += gy * h * rstd   (y = w * (h * rstd), so dy/dw = h * rstd)
        dw += gy * hf * rstd
        # g = gy * w: the gradient reaching the normalized row h * rstd
        g = gy * w
        # dh = rstd * g - h * rstd^3 * mean(g * h)   (the second term projects out the radial part)
        dh = rstd * g - hf * (rstd * rstd * rstd * tl.sum(g * hf, axis=0) / D)
        if HAS_GH:
            # h also flows on down the residual stream: its own gradient adds unchanged
            dh += tl.load(GH + off, mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + off, dh.to(DX.dtype.element_ty), mask=mask)
    tl.store(DW_PART + pid * D + cols, dw, mask=mask)


def _check_device(t: torch.Tensor) -> None:
    if not (t.is_cuda or INTERPRETED):
        raise RuntimeError("Triton kernels need a CUDA tensor, or TRITON_INTERPRET=1 set before "
                           "this module is imported (the interpreter runs them on CPU tensors)")


def _warps(block: int) -> int:
    """Warps per program: about 16 elements of a row per thread, 4 to 16 warps (untuned)."""
    return min(16, max(4, block // 512))


def _programs(n_rows: int, device: torch.device) -> int:
    """How many backward programs: one per SM on CUDA (as Liger-Kernel does), a few otherwise."""
    n = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    return max(1, min(n, n_rows))


def add_rmsnorm_forward(x, residual, weight, eps):
    """``(y, h, rstd)`` for ``x``, ``residual`` of shape ``(..., D)`` and ``weight`` of shape ``(D,)``."""
    _check_device(x)
    if x.shape != residual.shape or x.dtype != residual.dtype:
        raise ValueError("x and residual must share shape and dtype (h is stored in that dtype)")
    D = x.shape[-1]
    x2, r2 = x.reshape(-1, D).contiguous(), residual.reshape(-1, D).contiguous()   # (N, D)
    n_rows = x2.shape[0]
    h, y = torch.empty_like(x2), torch.empty_like(x2)
    rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)                # (N,)
    block = triton.next_power_of_2(D)
    _add_rmsnorm_fwd[(n_rows,)](x2, r2, weight.contiguous(), y, h, rstd, D, eps,
                                BLOCK=block, num_warps=_warps(block))
    return y.view(x.shape), h.view(x.shape), rstd


def add_rmsnorm_backward(grad_y, grad_h, h, weight, rstd):
    """``(dh, dweight)``: the gradient of ``x`` (equal to that of ``residual``) and of ``weight``.

    ``grad_h`` may be ``None`` (h not used downstream); ``grad_y`` may not.
    """
    D = h.shape[-1]
    h2, gy = h.reshape(-1, D), grad_y.reshape(-1, D).contiguous()                   # (N, D)
    gh = grad_h.reshape(-1, D).contiguous() if grad_h is not None else gy           # gy: unread
    n_rows = h2.shape[0]
    programs = _programs(n_rows, h.device)
    rows_per_program = triton.cdiv(n_rows, programs)
    dh = torch.empty_like(h2)
    dw_part = torch.empty(programs, D, dtype=torch.float32, device=h.device)       # (P, D)
    block = triton.next_power_of_2(D)
    _add_rmsnorm_bwd[(programs,)](gy, gh, h2, weight.contiguous(), rstd, dh, dw_part,
                                  n_rows, D, rows_per_program, HAS_GH=grad_h is not None,
                                  BLOCK=block, num_warps=_warps(block))
    # dweight = sum over programs of their partial sums (P x D numbers, not N x D)
    return dh.view(h.shape), dw_part.sum(0).to(weight.dtype)


class TritonFusedAddRMSNorm(torch.autograd.Function):
    """``apply(x, residual, weight, eps) -> (y, h)``; saves only h, weight and the float32 rstd."""

    @staticmethod
    def forward(ctx, x, residual, weight, eps):
        y, h, rstd = add_rmsnorm_forward(x, residual, weight, eps)
        ctx.save_for_backward(h, weight, rstd)
        ctx.set_materialize_grads(False)   # an unused h gets None, not a tensor of zeros to read
        return y, h

    @staticmethod
    def backward(ctx, grad_y, grad_h):
        h, weight, rstd = ctx.saved_tensors
        if grad_y is None:                 # y unused: only the stream's own gradient passes
            return grad_h, grad_h, None, None
        dh, dw = add_rmsnorm_backward(grad_y, grad_h, h, weight, rstd)
        # x and residual enter only through h = x + residual: both receive dh
        return dh, dh, dw, None


def fused_add_rmsnorm(x, residual, weight, eps=1e-6):
    """``(y, h)``: ``h = x + residual`` and ``y = RMSNorm(h) * weight``, in one read of each input."""
    return TritonFusedAddRMSNorm.apply(x, residual, weight, eps)


def benchmark(n_rows: int = 16384, dim: int = 4096, dtype: torch.dtype = torch.bfloat16,
              eps: float = 1e-6, warmup: int = 10, iters: int = 100) -> dict:
    """Milliseconds per call, CUDA only: this kernel against eager ``x + r`` then ``F.rms_norm``.

    Forward alone and forward + backward (both outputs given a gradient), each averaged over
    ``iters`` calls between two ``torch.cuda.Event`` s after ``warmup`` untimed calls. Also the
    forward's effective bandwidth (x, r read; y, h written) and the largest difference in ``y``.
    Unmeasured: written on a machine without a GPU.
    """
    if not torch.cuda.is_available():
        raise RuntimeError("benchmark() times CUDA kernels; no CUDA device here")
    torch.manual_seed(0)
    x = torch.randn(n_rows, dim, device="cuda", dtype=dtype, requires_grad=True)
    r = torch.randn(n_rows, dim, device="cuda", dtype=dtype, requires_grad=True)
    w = torch.randn(dim, device="cuda", dtype=dtype, requires_grad=True)
    gy, gh = torch.randn_like(x), torch.randn_like(x)

    def eager():
        h = x + r
        return F.rms_norm(h, (dim,), w, eps), h

    def triton_fused():
        return fused_add_rmsnorm(x, r, w, eps)

    def step(fn):
        y, h = fn()
        torch.autograd.backward((y, h), (gy, gh))

    def ms_per_call(fn):
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()              # elapsed_time needs both events completed
        return start.elapsed_time(end) / iters

    out = {"n_rows": n_rows, "dim": dim, "dtype": str(dtype), "device": torch.cuda.get_device_name()}
    with torch.no_grad():
        out["max_abs_diff_y"] = (eager()[0].float() - triton_fused()[0].float()).abs().max().item()
        for name, fn in (("eager", eager), ("triton", triton_fused)):
            out[f"{name}_fwd_ms"] = ms_per_call(fn)
    for name, fn in (("eager", eager), ("triton", triton_fused)):
        out[f"{name}_fwd_bwd_ms"] = ms_per_call(lambda fn=fn: step(fn))
        x.grad = r.grad = w.grad = None
    moved = 4 * n_rows * dim * x.element_size()   # bytes of x, r read and y, h written
    for name in ("eager", "triton"):
        out[f"{name}_fwd_GBps"] = moved / (out[f"{name}_fwd_ms"] * 1e-3) / 1e9
    return out
