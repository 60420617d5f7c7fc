"""Exercises 01 (LayerNorm) and 02 (RMSNorm), beyond the shared in-process checks of
tests/test_checks_in_process.py: torch's own norms earn nothing however they are reached, and
failure messages name the input."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from notebook_ns import outcome


# --------------------------------------------------------------------------------------------
# torch's own norm, by every route, earns no implementation points

class _Affine(nn.Module):
    def __init__(self, shape, eps, bias=True):
        super().__init__()
        self.shape, self.eps = (shape,) if isinstance(shape, int) else tuple(shape), eps
        self.weight = nn.Parameter(torch.ones(self.shape))
        self.bias = nn.Parameter(torch.zeros(self.shape)) if bias else None


class ViaFunctional(_Affine):
    def __init__(self, shape, eps=1e-5):
        super().__init__(shape, eps)

    def forward(self, x):
        return F.layer_norm(x, self.shape, self.weight, self.bias, self.eps)


class ViaTorch(_Affine):
    def __init__(self, shape, eps=1e-5):
        super().__init__(shape, eps)

    def forward(self, x):
        return torch.layer_norm(x, self.shape, self.weight, self.bias, self.eps)


class ViaModule(nn.Module):
    """An nn.LayerNorm inside, its parameters exposed under the contract's names."""

    def __init__(self, shape, eps=1e-5):
        super().__init__()
        self.inner = nn.LayerNorm(shape, eps=eps)

    weight = property(lambda self: self.inner.weight)
    bias = property(lambda self: self.inner.bias)

    def forward(self, x):
        return self.inner(x)


class ViaRmsFunctional(_Affine):
    def __init__(self, shape, eps=1e-6):
        super().__init__(shape, eps, bias=False)

    def forward(self, x):
        return F.rms_norm(x, self.shape, self.weight, self.eps)


@pytest.mark.parametrize("cls,grade_id", [
    pytest.param(ViaFunctional, "layernorm_matches_torch", marks=pytest.mark.layernorm, id="F.layer_norm"),
    pytest.param(ViaTorch, "layernorm_matches_torch", marks=pytest.mark.layernorm, id="torch.layer_norm"),
    pytest.param(ViaModule, "layernorm_matches_torch", marks=pytest.mark.layernorm, id="nn.LayerNorm inside"),
    pytest.param(ViaFunctional, "layernorm_benchmark", marks=pytest.mark.layernorm, id="benchmark F.layer_norm"),
    pytest.param(ViaRmsFunctional, "rmsnorm_matches_torch", marks=pytest.mark.rmsnorm, id="F.rms_norm"),
    pytest.param(ViaRmsFunctional, "rmsnorm_gradients", marks=pytest.mark.rmsnorm, id="F.rms_norm grads"),
])
def test_torch_own_norm_earns_no_implementation_points(cls, grade_id):
    name = "RMSNorm" if grade_id.startswith("rms") else "LayerNorm"
    msg = outcome(grade_id, {name: cls})
    assert msg is not None and "calls torch's own" in msg, msg


@pytest.mark.layernorm
def test_failure_messages_name_the_input():
    class Lazy(nn.Module):
        def __init__(self, shape, eps=1e-5, elementwise_affine=True):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(shape))
            self.bias = nn.Parameter(torch.zeros(shape))

        def forward(self, x):
            return x.float()  # the identity, in float32

    msg = outcome("layernorm_matches_torch", {"LayerNorm": Lazy})
    assert "LayerNorm(32) on an input of shape (4, 16, 32)" in msg
    assert "float16" in outcome("layernorm_half_precision", {"LayerNorm": Lazy})


# --------------------------------------------------------------------------------------------
# The half-precision gradient judges admit torch's own modules (their tolerance is not the
# reference solution's accident)

@pytest.mark.parametrize("exercise", [pytest.param("layernorm", marks=pytest.mark.layernorm),
                                      pytest.param("rmsnorm", marks=pytest.mark.rmsnorm)])
def test_torchs_own_half_precision_gradients_pass_the_judge(exercise):
    import importlib
    from coursekit.checks.normcheck import half_grad_cases, half_grads_judge
    hidden = importlib.import_module(f"course.hidden.{exercise}")
    norm = importlib.import_module(f"coursekit.checks.{exercise}")
    spec = norm.LN if exercise == "layernorm" else norm.RMS
    dtypes = (torch.float16, torch.bfloat16)
    out = {}
    for dtype in dtypes:
        rows = []
        for (args, kw, x, vals, g) in half_grad_cases(spec, hidden.HALF_GRAD_SPECS, dtype):
            m = spec.torch_module(args[0], spec.eps, vals, dtype)
            xr = x.clone().requires_grad_(True)
            y = m(xr)
            (y * g).sum().backward()
            rows.append({"y": y.detach(), "grads": {"x": xr.grad, **{p: getattr(m, p).grad for p in vals}},
                         "kinds": {p: "Parameter" for p in vals}})
        out[str(dtype)[6:]] = rows
    half_grads_judge(out, spec, hidden.HALF_GRAD_SPECS, dtypes, "")
