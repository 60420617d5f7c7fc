"""The hidden checks of exercise 05 (instructor side): half-precision inputs of the hand-written
backward functions, rows where eps decides the result, and FusedAddRMSNorm in bfloat16 and
float16. Registered into coursekit's registry when this package is importable; students only
run their visible smoke calls.
"""
from __future__ import annotations

import torch

from coursekit.checks import frozen, register
from coursekit.checks.backward import (FUSED, fused_judge, fused_probe, ln_judge, ln_probe, rms_judge,
                                       rms_probe)
from coursekit.checks.compare import ANY, expect_structure
from coursekit.checks.ops import NORM_OPS

HALF = (torch.bfloat16, torch.float16)
HALF_FN_CASES = (  # seed, shape, eps, input scale: values ~300 square past float16's 65504
    (541, (8, 128), 1e-6, frozen(scale=1.0)),
    (542, (2, 4, 64), 1e-5, frozen(scale=300.0)),
)


@register("backward_half_precision", needs=("rmsnorm_backward", "layernorm_backward"), forbidden_ops=NORM_OPS)
class HalfPrecision:
    """bfloat16 and float16 inputs: both backward functions return gradients in the input's and weight's dtype, within 5e-2 (bfloat16) and 1e-2 (float16) of float64 autograd"""

    @staticmethod
    def probe(ns):
        return {str(d)[6:]: {"rms": rms_probe(ns, HALF_FN_CASES, d), "ln": ln_probe(ns, HALF_FN_CASES, d)}
                for d in HALF}

    @staticmethod
    def judge(out):
        expect_structure(out, {str(d)[6:]: {"rms": ANY, "ln": ANY} for d in HALF})
        for d in HALF:
            rms_judge(out[str(d)[6:]]["rms"], HALF_FN_CASES, d, {})
            ln_judge(out[str(d)[6:]]["ln"], HALF_FN_CASES, d, {})


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
