"""The hidden checks of exercise 05 (instructor side): half-precision inputs of the hand-written
backward functions, rows where eps decides the result, and FusedAddRMSNorm in bfloat16 and
float16. Registered into coursekit's registry when this package is importable; students only
run their visible smoke calls.
"""
from __future__ import annotations

import torch

from coursekit.checks import CheckFailed, frozen, register
from coursekit.checks.backward import (FUSED, call_by_hand, expect_param_grad, fn_inputs, fused_judge, fused_probe,
                                       ln_backward_ref, ln_judge, ln_probe, ln_stats, rms_backward_ref, rms_judge,
                                       rms_probe, rms_stats)
from coursekit.checks.compare import ANY, TOLERANCES, expect_close, expect_structure, expect_tensor, paired
from coursekit.checks.ops import NORM_OPS

HALF = (torch.bfloat16, torch.float16)
HALF_FN_CASES = (  # seed, shape, eps, input scale: values ~300 square past float16's 65504
    (541, (8, 128), 1e-6, frozen(scale=1.0)),
    (542, (2, 4, 64), 1e-5, frozen(scale=300.0)),
)


#: a float32 weight with a half-precision x and grad_out (a float32 master weight in mixed-precision
#: training): grad_x comes back in x's dtype, grad_weight (and grad_bias) in the weight's, float32
MIXED_CASES = ((543, (4, 8, 32), 1e-6, frozen(scale=1.0)),)


def _mixed_inputs(seed, shape, kw, dtype):
    x, _, g = fn_inputs(seed, shape, kw, dtype)
    return x, fn_inputs(seed, shape, kw, torch.float32)[1], g


def _mixed_probe(ns, dtype) -> dict:
    out = {"rms": [], "ln": []}
    for seed, shape, eps, kw in MIXED_CASES:
        x, w, g = _mixed_inputs(seed, shape, kw, dtype)
        out["rms"].append(call_by_hand(ns, "rmsnorm_backward", g, x, w, rms_stats(x, eps)))
        out["ln"].append(call_by_hand(ns, "layernorm_backward", g, x, w, *ln_stats(x, eps)))
    return out


def _expect_dtype(t, dtype, what: str, why: str) -> None:
    t = expect_tensor(t, what)
    if t.dtype != dtype:
        raise CheckFailed(f"{what} has dtype {t.dtype}, expected {dtype}: {why}")


def _mixed_judge(out, dtype) -> None:
    expect_structure(out, {"rms": ANY, "ln": ANY})
    atol, rtol = TOLERANCES[dtype]
    w_why = ("grad_weight has the weight's dtype, not x's (here a float32 weight with a "
             f"{str(dtype)[6:]} input, as a float32 master weight in mixed-precision training): return "
             "grad_weight.to(weight.dtype)")
    for fn, n in (("rmsnorm_backward", 2), ("layernorm_backward", 3)):
        key = "rms" if fn.startswith("rms") else "ln"
        for (seed, shape, eps, kw), got in paired(MIXED_CASES, out[key], [ANY] * n):
            x, w, g = _mixed_inputs(seed, shape, kw, dtype)
            want = (rms_backward_ref if key == "rms" else ln_backward_ref)(g, x, w, eps)
            where = f"{fn} on x of shape {tuple(shape)} ({str(dtype)[6:]}) with a float32 weight"
            _expect_dtype(got[0], dtype, f"grad_x of {where}", "grad_x has x's dtype")
            for i, label in list(enumerate(("grad_weight", "grad_bias"), 1))[:n - 1]:
                _expect_dtype(got[i], torch.float32, f"{label} of {where}",
                              w_why if label == "grad_weight" else w_why.replace("grad_weight", "grad_bias"))
            expect_close(got[0], want[0].to(dtype), what=f"grad_x of {where}", atol=atol, rtol=rtol)
            for i, label in list(enumerate(("grad_weight", "grad_bias"), 1))[:n - 1]:
                expect_param_grad(got[i], want[i].float(), f"{label} of {where}", shape, label=label,
                                  atol=atol, rtol=rtol)


@register("backward_half_precision", needs=("rmsnorm_backward", "layernorm_backward"), forbidden_ops=NORM_OPS)
class HalfPrecision:
    """bfloat16 and float16 inputs: both backward functions return gradients in the input's and weight's dtype, within 5e-2 (bfloat16) and 1e-2 (float16) of float64 autograd"""

    @staticmethod
    def probe(ns):
        return {str(d)[6:]: {"rms": rms_probe(ns, HALF_FN_CASES, d), "ln": ln_probe(ns, HALF_FN_CASES, d),
                             "mixed": _mixed_probe(ns, d)}
                for d in HALF}

    @staticmethod
    def judge(out):
        expect_structure(out, {str(d)[6:]: {"rms": ANY, "ln": ANY, "mixed": ANY} for d in HALF})
        for d in HALF:
            rms_judge(out[str(d)[6:]]["rms"], HALF_FN_CASES, d, {})
            ln_judge(out[str(d)[6:]]["ln"], HALF_FN_CASES, d, {})
            _mixed_judge(out[str(d)[6:]]["mixed"], d)


TINY_CASES = (  # rows 0-1: h of size 1e-4 (mean(h**2) = 1e-8, below eps); rows 2-3: h = 0
    (651, (8, 32), 1e-6, frozen(tiny=True)),
    (652, (2, 4, 16), 1e-6, frozen(tiny=True, scale=2.0)),
)


@register("fused_add_rmsnorm_tiny_rows", needs=(FUSED,), forbidden_ops=NORM_OPS)
class TinyRows:
    """FusedAddRMSNorm on rows of tiny values and all-zero rows, where eps decides rstd (float32, within 1e-4)"""

    @staticmethod
    def probe(ns):
        return fused_probe(ns, TINY_CASES, torch.float32)

    @staticmethod
    def judge(out):
        fused_judge(out, TINY_CASES, torch.float32, dict(atol=1e-4, rtol=1e-4))


FUSED_HALF_CASES = (
    (661, (8, 64), 1e-6, frozen()),
    (662, (2, 3, 32), 1e-6, frozen(rscale=250.0)),  # |h| ~ 250: h**2 overflows float16
)


@register("fused_add_rmsnorm_half_precision", needs=(FUSED,), forbidden_ops=NORM_OPS)
class FusedHalf:
    """FusedAddRMSNorm in bfloat16 and float16: y, h and every gradient in the inputs' dtype, within 5e-2 (bfloat16) and 1e-2 (float16) of float64 autograd"""

    @staticmethod
    def probe(ns):
        return {str(d)[6:]: fused_probe(ns, FUSED_HALF_CASES, d) for d in HALF}

    @staticmethod
    def judge(out):
        expect_structure(out, {str(d)[6:]: ANY for d in HALF})
        for d in HALF:
            fused_judge(out[str(d)[6:]], FUSED_HALF_CASES, d)
