"""Exercises 01 (LayerNorm) and 02 (RMSNorm), in-process and fast: the solution passes every
check, the released stub fails every check, each wrong fixture fails the checks it names (with
its message), each right fixture passes everything, and torch's own norms earn nothing however
they are reached."""
from __future__ import annotations

import contextlib
import io
import warnings

import nbformat
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from autograder.make_submission import fixtures
from course.checks import CheckFailed, collect, get, verdict
from course.release import ROOT
from course.solutions import load_reference

NORM_ASSIGNMENTS = {"01_layernorm": pytest.mark.layernorm, "02_rmsnorm": pytest.mark.rmsnorm}


def grade_ids(assignment: str) -> list[str]:
    nb = nbformat.read(next((ROOT / "solutions" / assignment).glob("*.ipynb")), as_version=4)
    return [c.metadata["nbgrader"]["grade_id"] for c in nb.cells
            if c.get("metadata", {}).get("nbgrader", {}).get("grade")]


def outcome(grade_id: str, ns: dict) -> str | None:
    """None on a pass, else the failure message (what the student would read)."""
    check = get(grade_id)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            verdict(check, collect(check, ns))
        except CheckFailed as e:
            return str(e)
    return None


def student_ns(code: str) -> dict:
    ns = {"__name__": "__student__"}
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(code, "<student>", "exec"), ns)
    return ns


def _params(folder):
    out = []
    for fx in fixtures(ROOT / "tests" / "fixtures" / folder):
        if fx.assignment in NORM_ASSIGNMENTS:
            out.append(pytest.param(fx, id=f"{fx.assignment}/{fx.name}",
                                    marks=NORM_ASSIGNMENTS[fx.assignment]))
    return out


def _assignments():
    return [pytest.param(a, marks=m, id=a) for a, m in NORM_ASSIGNMENTS.items()]


@pytest.mark.parametrize("assignment", _assignments())
def test_solution_passes_every_check(assignment):
    ns = load_reference(assignment)
    failed = {g: m for g in grade_ids(assignment) if (m := outcome(g, ns))}
    assert not failed


@pytest.mark.parametrize("assignment", _assignments())
def test_released_stub_fails_every_check(assignment):
    nb = nbformat.read(next((ROOT / "exercises" / assignment).glob("*.ipynb")), as_version=4)
    ns = {"__name__": "__student__"}
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type == "code" and not meta.get("grade"):
            exec(compile(cell.source, "<cell>", "exec"), ns)
    passed = [g for g in grade_ids(assignment) if outcome(g, ns) is None]
    assert not passed
    assert "not implemented yet" in outcome(grade_ids(assignment)[0], ns)


@pytest.mark.parametrize("fx", _params("wrong"))
def test_wrong_fixture_fails_its_checks(fx):
    ns = student_ns(fx.code)
    assert fx.loses, f"{fx.path.name} names no check it must lose"
    messages = {g: outcome(g, ns) for g in fx.loses}
    passed = [g for g, m in messages.items() if m is None]
    assert not passed, f"{fx.name} ({fx.summary}) passes {passed}"
    if fx.message:
        assert fx.message in messages[fx.loses[0]], messages[fx.loses[0]]


@pytest.mark.parametrize("fx", _params("right"))
def test_right_fixture_passes_every_check(fx):
    ns = student_ns(fx.code)
    failed = {g: m for g in grade_ids(fx.assignment) if (m := outcome(g, ns))}
    assert not failed


def test_fixtures_cover_each_norm_exercise():
    for a in NORM_ASSIGNMENTS:
        assert len([f for f in fixtures(ROOT / "tests/fixtures/wrong") if f.assignment == a]) >= 8


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
