"""The course's reference LayerNorm and RMSNorm (course.solutions.load_reference, read from
solutions/) on the sample inputs PyTorch's own test suite uses for these ops, from the installed
torch: the OpInfo entries ``nn.functional.layer_norm`` and ``nn.functional.rms_norm``
(``torch.testing._internal.common_methods_invocations.op_db``, their ``sample_inputs_func``) and the
module entries ``nn.LayerNorm`` and ``nn.RMSNorm`` (``torch.testing._internal.common_modules.module_db``,
their ``module_inputs_func``). Every sample runs forward, and backward where its input requires
grad, against torch's own op on the same tensors.

A functional sample ``(x, normalized_shape, weight, bias, eps)`` becomes the module
``LayerNorm(normalized_shape, eps, elementwise_affine=weight is not None, bias=bias is not None)``
with those weights. ``F.rms_norm``'s ``eps=None`` means the machine epsilon of the dtype it
computes in (float32 for float16/bfloat16 inputs); the course's ``RMSNorm`` takes a number, so such
a sample runs with that number. A module sample's constructor arguments are passed as torch's
test passes them (positional eps and elementwise_affine, ``bias=False``), and the parameters are
moved by ``load_state_dict`` from torch's module, randomized first.

Outside the contract, skipped with the reason: complex inputs (``nn.functional.rms_norm`` lists
complex64/complex128; the contract's norms are for real floating dtypes).

Importing ``torch.testing._internal.common_methods_invocations`` needs the ``expecttest`` package
(in requirements.txt) and imports ``torch._dynamo``/``torch._inductor``, numpy, sympy, hypothesis
and pytest: seconds of CPU and some 200,000 objects, which every process that holds them carries
(the probes that walk the heap, exercise 05's, then walk them too). So the databases are imported
when this file's first test runs, not when the suite is collected: the tests are parametrized by
the tables :data:`OP_DTYPES` and :data:`MODULE_DTYPES`, and
``test_the_tables_are_what_torchs_databases_list`` holds them to the databases of the installed
torch.
"""
from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from course.solutions import load_reference
from coursekit.checks.normcheck import HALF_GRAD_TOL


@functools.cache
def _databases():
    """torch's ``op_db`` and ``module_db``, imported on first use (see the module's docstring)."""
    from torch.testing._internal.common_methods_invocations import op_db
    from torch.testing._internal.common_modules import module_db

    # torch.testing._internal's common_utils calls torch.backends.disable_global_flags() when it is
    # imported: every later test of this process that sets torch.backends.cudnn.deterministic (an
    # honest notebook's seeding, graded in-process) would then raise. This file sets no backend flag
    # itself, so the switch is put back as it was.
    torch.backends.flags_frozen.__globals__["__allow_nonbracketed_mutation_flag"] = True  # the module's own globals
    return op_db, module_db

HALF = (torch.float16, torch.bfloat16)
REAL = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
OPS = {"nn.functional.layer_norm": ("01_layernorm", "LayerNorm", pytest.mark.layernorm),
       "nn.functional.rms_norm": ("02_rmsnorm", "RMSNorm", pytest.mark.rmsnorm)}
MODULES = {torch.nn.LayerNorm: ("01_layernorm", "LayerNorm", pytest.mark.layernorm),
           torch.nn.RMSNorm: ("02_rmsnorm", "RMSNorm", pytest.mark.rmsnorm)}


#: the dtypes torch's op_db lists for the two ops on CPU, and module_db for the two modules (with
#: float16 and bfloat16 added: the course's norms take them), sorted by name; held to the databases
#: by test_the_tables_are_what_torchs_databases_list
OP_DTYPES = {
    "nn.functional.layer_norm": (torch.bfloat16, torch.float16, torch.float32, torch.float64),
    "nn.functional.rms_norm": (torch.bfloat16, torch.complex128, torch.complex64, torch.float16, torch.float32,
                               torch.float64),
}
MODULE_DTYPES = {name: (torch.bfloat16, torch.float16, torch.float32, torch.float64)
                 for name in ("nn.LayerNorm", "nn.RMSNorm")}


def _opinfo(name):
    found = [o for o in _databases()[0] if o.name == name and not o.variant_test_name]
    assert len(found) == 1, f"torch's op_db has {len(found)} entries named {name!r}"
    return found[0]


def _moduleinfo(name):
    found = [i for i in _databases()[1] if i.name == name and i.module_cls in MODULES]
    assert len(found) == 1, f"torch's module_db has {len(found)} entries named {name!r}"
    return found[0]


def _op_params():
    out = []
    for name, (assignment, cls, mark) in OPS.items():
        for dtype in OP_DTYPES[name]:
            marks = [mark]
            if dtype.is_complex:
                marks.append(pytest.mark.skip(reason="complex inputs: the contract's norms are for real floating dtypes"))
            out.append(pytest.param(name, dtype, marks=marks, id=f"{name}-{str(dtype)[6:]}"))
    return out


def test_the_tables_are_what_torchs_databases_list():
    for name in OPS:
        dtypes = _opinfo(name).supported_dtypes("cpu")
        assert set(REAL) <= set(dtypes), (name, dtypes)
        assert OP_DTYPES[name] == tuple(sorted(dtypes, key=str)), (name, dtypes)
    listed = {i.name: i for i in _databases()[1] if i.module_cls in MODULES}
    assert {i.module_cls for i in listed.values()} == set(MODULES), "module_db lacks nn.LayerNorm or nn.RMSNorm"
    assert set(listed) == set(MODULE_DTYPES), sorted(listed)
    for name, info in listed.items():
        assert MODULE_DTYPES[name] == tuple(sorted(set(info.dtypes) | set(HALF), key=str)), (name, info.dtypes)


def _close(actual, expected, what, dtype):
    """torch.testing's tolerance for the dtype; in half precision the gradients' tolerance of the
    course's checks (torch's own half-precision backward on the CPU sums less exactly)."""
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype}, torch's {expected.dtype}"
    if dtype in HALF and "gradient" in what:
        tol = HALF_GRAD_TOL[dtype]
        atol = tol["scale"] * float(expected.abs().max()) if expected.numel() else 0.0
        torch.testing.assert_close(actual, expected, atol=atol, rtol=tol["rtol"], equal_nan=True, msg=lambda m: f"{what}: {m}")
    else:
        torch.testing.assert_close(actual, expected, equal_nan=True, msg=lambda m: f"{what}: {m}")


def _grads(y, inputs, g):
    leaves = [t for t in inputs if t is not None and t.requires_grad]
    return torch.autograd.grad(y, leaves, g, allow_unused=True) if leaves else ()


def _float64_grads(name, leaves, nshape, eps, g):
    """The gradients of torch's op in float64 on the same (rounded) inputs."""
    xs = [None if t is None else t.detach().double().requires_grad_(True) for t in leaves]
    fn = F.layer_norm if name.endswith("layer_norm") else F.rms_norm
    y = fn(xs[0], nshape, *xs[1:], eps=eps)
    return [t for t in torch.autograd.grad(y, [t for t in xs if t is not None], g.double())]


@pytest.mark.parametrize("name,dtype", _op_params())
def test_reference_matches_torch_on_its_opinfo_samples(name, dtype):
    assignment, cls_name, _ = OPS[name]
    cls = load_reference(assignment)[cls_name]
    op = _opinfo(name)
    samples = list(op.sample_inputs("cpu", dtype, requires_grad=True))
    assert samples, f"no samples of {name} in {dtype}"
    for i, s in enumerate(samples):
        x, nshape = s.input, s.args[0]
        weight = s.args[1] if len(s.args) > 1 else s.kwargs.get("weight")
        bias = (s.args[2] if len(s.args) > 2 else s.kwargs.get("bias")) if cls_name == "LayerNorm" else None
        eps = s.kwargs.get("eps")
        if cls_name == "LayerNorm":
            eps = 1e-5 if eps is None else eps
            m = cls(nshape, eps, elementwise_affine=weight is not None, bias=bias is not None)
            want = F.layer_norm(x, nshape, weight, bias, eps)
        else:
            want = F.rms_norm(x, nshape, weight, eps)
            eps = torch.finfo(torch.promote_types(dtype, torch.float32)).eps if eps is None else eps
            m = cls(nshape, eps, elementwise_affine=weight is not None)
        m = m.to(dtype)
        with torch.no_grad():
            for p, v in (("weight", weight), ("bias", bias)):
                if v is not None:
                    getattr(m, p).copy_(v)
        y = m(x)
        what = f"{name} sample {i} (input {tuple(x.shape)}, normalized_shape {nshape}, eps {eps}, {str(dtype)[6:]})"
        _close(y, want, f"{what}: output", dtype)
        if not x.requires_grad:
            continue
        g = torch.randn(y.shape, generator=torch.Generator().manual_seed(i), dtype=torch.float64).to(dtype)
        params = [m.weight if weight is not None else None, m.bias if bias is not None else None][: 2 if bias is not None else 1]
        mine = _grads(y, [x, *params], g)
        leaves = [x, weight, bias][: len(params) + 1]
        theirs = _grads(want, leaves, g)
        assert len(mine) == len(theirs), what
        exact = None
        for k, (label, a, b) in enumerate(zip(("input", "weight", "bias"), mine, theirs)):
            try:
                _close(a, b, f"{what}: gradient with respect to the {label}", dtype)
            except AssertionError:
                # torch's kernel rounds where the formula cancels exactly (D = 1: x - mean is 0, so the
                # gradient is 0; torch's CPU kernel returns rounding noise times rstd = 1/sqrt(eps)):
                # then the reference must be at least as close to float64 autograd as torch is
                exact = exact or _float64_grads(name, leaves, nshape, eps, g)
                e = exact[k]
                assert (a.double() - e).abs().max() <= (b.double() - e).abs().max(), (
                    f"{what}: gradient with respect to the {label}: yours {a}, torch's {b}, float64 {e}")


def _module_params():
    marks = {f"nn.{cls.__name__}": mark for cls, (_, _, mark) in MODULES.items()}
    return [pytest.param(name, dtype, marks=marks[name], id=f"{name}-{str(dtype)[6:]}")
            for name, dtypes in MODULE_DTYPES.items() for dtype in dtypes]


@pytest.mark.parametrize("name,dtype", _module_params())
def test_reference_matches_torch_on_its_module_inputs(name, dtype):
    info = _moduleinfo(name)
    assignment, cls_name, _ = MODULES[info.module_cls]
    cls = load_reference(assignment)[cls_name]
    inputs = info.module_inputs_func(info, device="cpu", dtype=dtype, requires_grad=True, training=True)
    assert inputs
    for i, mi in enumerate(inputs):
        args, kwargs = mi.constructor_input.args, mi.constructor_input.kwargs
        ref = info.module_cls(*args, **kwargs).to(dtype)
        mine = cls(*args, **kwargs).to(dtype)
        what = f"{info.name} input {mi.desc!r}: {cls_name}({', '.join([repr(a) for a in args] + [f'{k}={v!r}' for k, v in kwargs.items()])}), {str(dtype)[6:]}"
        for p in ("weight", "bias"):  # None where torch's is None, a parameter where torch's is one
            theirs, ours = getattr(ref, p, None), getattr(mine, p, None)
            assert (theirs is None) == (ours is None), f"{what}: {p} is {ours!r}, torch's {theirs!r}"
        gen = torch.Generator().manual_seed(100 + i)
        with torch.no_grad():
            for t in ref.parameters():
                t.copy_(1 + 0.5 * torch.randn(t.shape, generator=gen, dtype=torch.float64))
        mine.load_state_dict(ref.state_dict())  # same keys as torch's
        x = mi.forward_input.args[0]
        y, want = mine(x), ref(x)
        _close(y, want, f"{what}: output", dtype)
        g = torch.randn(y.shape, generator=gen, dtype=torch.float64).to(dtype)
        names = [n for n, _ in ref.named_parameters()]
        ours = _grads(y, [x, *(getattr(mine, n) for n in names)], g)
        theirs = _grads(want, [x, *(getattr(ref, n) for n in names)], g)
        for label, a, b in zip(["input", *names], ours, theirs):
            _close(a, b, f"{what}: gradient with respect to the {label}", dtype)
