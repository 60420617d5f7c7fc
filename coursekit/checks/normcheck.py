"""What the LayerNorm (01) and RMSNorm (02) checks share: seeded inputs, putting weights into a
student's module, the forward, parameter and gradient probes and judges, and the templates that
register a check of each kind (``register_*_check``).

Probe and judge run in different processes, so both rebuild every input from its seed with
:func:`randn`; the probe copies the same seeded weights into the student's module by the
contract's names (``weight``, ``bias``), the judge into torch's own module.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from coursekit.checks import CheckFailed, frozen, register_check, seeded
from coursekit.checks.compare import ANY, expect_close, expect_structure, expect_tensor, paired
from coursekit.checks.ops import NORM_OPS
from coursekit.checks.remote import remotable


#: seeded.randn with the norm exercises' default dtype (their inputs are float32 unless asked)
randn = functools.partial(seeded.randn, dtype=torch.float32)


def trailing_dims(nshape) -> tuple:
    """The dimensions a normalized_shape (int or tuple) normalizes over: the last ones."""
    n = 1 if isinstance(nshape, int) else len(nshape)
    return tuple(range(-n, 0))


def row_offsets(seed: int, shape, spread: float = 2.0) -> torch.Tensor:
    """One offset per row (broadcast over the last dim): rows with different means."""
    return randn(seed, *shape[:-1], 1, scale=spread)


def affine_values(seed: int, shape, names=("weight", "bias")) -> dict[str, torch.Tensor]:
    """Seeded, non-trivial weight (about 1) and bias (about 0) of shape ``shape``."""
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    out = {"weight": 1.0 + 0.5 * randn(seed, *shape)}
    if "bias" in names:
        out["bias"] = 0.5 * randn(seed + 1, *shape)
    return out


@remotable
def student_class(ns: dict, name: str):
    cls = ns[name]
    if not isinstance(cls, type) or not issubclass(cls, nn.Module):
        raise CheckFailed(f"{name} should be a class derived from torch.nn.Module, "
                          f"but it is {type(cls).__name__}")
    return cls


@remotable
def set_params(module, vals: dict, owner: str) -> None:
    """Probe side: copy ``vals`` into ``module.weight`` / ``module.bias`` (in the module's dtype)."""
    for name, v in vals.items():
        p = getattr(module, name, None)
        if not isinstance(p, torch.Tensor):
            raise CheckFailed(f"{owner} has no tensor attribute {name!r}: the contract names the "
                              f"learned parameters weight{' and bias' if 'bias' in vals else ''}, "
                              "like torch's own module")
        if tuple(p.shape) != tuple(v.shape):
            raise CheckFailed(f"{owner}.{name} has shape {tuple(p.shape)}, expected {tuple(v.shape)}")
        with torch.no_grad():
            p.copy_(v.to(p.dtype))


def with_hint(check, hint: str) -> None:
    """Run ``check()``; when it fails without naming a known mistake, add ``hint`` to its message."""
    try:
        check()
    except CheckFailed as e:
        if " is wrong: " in str(e) or not hint:
            raise
        raise CheckFailed(f"{e}{hint}") from None


def expect_shape_dtype(actual, expected: torch.Tensor, what: str) -> None:
    actual = expect_tensor(actual, what)
    if actual.shape != expected.shape:
        raise CheckFailed(f"{what} has shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
    if actual.dtype != expected.dtype:
        raise CheckFailed(f"{what} has dtype {actual.dtype}, expected {expected.dtype} "
                          "(the output should keep the input's dtype)")


@remotable
def call(module, x, owner: str):
    """Probe side: ``module(x)``, insisting on a plain tensor back."""
    y = module(x)
    if not isinstance(y, torch.Tensor):
        raise CheckFailed(f"{owner} returned {type(y).__name__}, not a torch.Tensor")
    return y


# --------------------------------------------------------------------------------------------
# Forward: the student's module against torch's on seeded cases
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NormSpec:
    """One exercise's norm, as the forward checks see it.

    A forward case is ``(seed, input shape, normalized_shape, eps (None: the default), input
    kwargs {"scale", "spread"})``: both sides build ``name(normalized_shape[, eps=eps])`` with
    the weights ``values(seed + 1, normalized_shape)``, the probe from the student's class, the
    judge from ``torch_cls``.
    """
    name: str
    torch_cls: type
    eps: float  # the constructor's default
    spread: float  # default spread of an input's per-row offsets
    values: Callable  # (seed, normalized_shape) -> {"weight": ..., maybe "bias": ...}
    suspects: Callable  # (x in float64, values, eps, normalized_shape) -> {mistake: its output}

    def torch_module(self, nshape, eps, vals, dtype=torch.float32):
        m = self.torch_cls(nshape, eps=eps).to(dtype)
        with torch.no_grad():
            for k, v in vals.items():
                getattr(m, k).copy_(v.to(dtype))
        return m

    def input(self, seed, shape, xkw, dtype=torch.float32):
        x = randn(seed, *shape, scale=xkw.get("scale", 1.5)) + row_offsets(seed + 100, shape, xkw.get("spread", self.spread))
        return x.to(dtype)

    def forward_probe(self, ns, cases, dtype=torch.float32) -> list:
        student_class(ns, self.name)  # not a class: say so before any case
        outs = []
        for seed, shape, nshape, eps, xkw in cases:
            kw = {} if eps is None else {"eps": eps}
            outs.append(forward_case(ns, self.name, (nshape,), kw, dtype, self.values(seed + 1, nshape),
                                     self.input(seed, shape, xkw, dtype)))
        return outs

    def forward_judge(self, out, cases, dtype=torch.float32, hint="") -> None:
        for (seed, shape, nshape, eps, xkw), y in paired(cases, out):
            eps_ = self.eps if eps is None else eps
            vals = self.values(seed + 1, nshape)
            x = self.input(seed, shape, xkw, dtype)
            want = self.torch_module(nshape, eps_, vals, dtype)(x).detach()
            args = f"{nshape!r}" + ("" if eps is None else f", eps={eps}")
            what = f"{self.name}({args}) on an input of shape {tuple(shape)} ({str(dtype)[6:]})"
            with_hint(lambda: expect_close(y, want, what=what,
                                           suspects=self.suspects(x.double(), vals, eps_, nshape)), hint)

    def grad_cases(self, specs) -> tuple:
        """(seed, input shape, normalized_shape) -> the cases of :func:`grads_probe` (float64)."""
        cases = []
        for seed, shape, nshape in specs:
            x = randn(seed, *shape, dtype=torch.float64) + row_offsets(seed + 100, shape).double()
            g = randn(seed + 2, *shape, dtype=torch.float64)
            cases.append(((nshape,), frozen(), x, self.values(seed + 1, nshape), g))
        return tuple(cases)


@remotable
def build_norm(ns, name: str, args, kwargs, dtype=None, vals=None):
    """The student's ``name(*args, **kwargs)``, moved to ``dtype``, with the weights ``vals``."""
    m = student_class(ns, name)(*args, **kwargs)
    if dtype is not None:
        m = m.to(dtype)
    if vals:
        set_params(m, vals, name)
    return m


@remotable
def forward_case(ns, name: str, args, kwargs, dtype, vals, x):
    """One forward case: the student's module built as :func:`build_norm` builds it, applied to ``x``."""
    return call(build_norm(ns, name, args, kwargs, dtype, vals), x, name)


def register_forward_check(grade_id: str, doc: str, norm: NormSpec, cases) -> None:
    """A check that the student's module matches torch's on ``cases`` (float32)."""
    register_check(grade_id, doc, lambda ns: norm.forward_probe(ns, cases),
                   lambda out: norm.forward_judge(out, cases), needs=(norm.name,), forbidden_ops=NORM_OPS)


def register_half_precision_check(grade_id: str, doc: str, norm: NormSpec, half_cases, bf16_cases,
                                  hint: str) -> None:
    """A check that the student's module matches torch's in float16 and in bfloat16."""

    def probe(ns):
        return {"float16": norm.forward_probe(ns, half_cases, torch.float16),
                "bfloat16": norm.forward_probe(ns, bf16_cases, torch.bfloat16)}

    def judge(out):
        expect_structure(out, {"float16": ANY, "bfloat16": ANY})
        norm.forward_judge(out["float16"], half_cases, torch.float16, hint)
        norm.forward_judge(out["bfloat16"], bf16_cases, torch.bfloat16, hint)

    register_check(grade_id, doc, probe, judge, needs=(norm.name,), forbidden_ops=NORM_OPS)


# --------------------------------------------------------------------------------------------
# Parameters: names, shapes, initial values, registration, state_dict keys
# --------------------------------------------------------------------------------------------

def _describe(m: nn.Module) -> dict:
    attrs = {}
    for name in ("weight", "bias"):
        has = hasattr(m, name)
        v = getattr(m, name, None)
        attrs[name] = {
            "kind": "absent" if not has else "Parameter" if isinstance(v, nn.Parameter) else
                    ("tensor" if isinstance(v, torch.Tensor) else type(v).__name__),
            "value": torch.Tensor.detach(v).clone() if isinstance(v, torch.Tensor) else None,
            "requires_grad": bool(v.requires_grad) if isinstance(v, torch.Tensor) else False,
        }
    return {
        "params": sorted(n for n, _ in m.named_parameters()),
        "state_keys": sorted(m.state_dict().keys()),
        "attrs": attrs,
        "mro": [f"{c.__module__}.{c.__qualname__}" for c in type(m).__mro__],
    }


def params_probe(ns: dict, name: str, cases) -> dict:
    student_class(ns, name)  # not a class: say so before any case
    return {key: describe_built(ns, name, args, kw) for key, args, kw in cases}


@remotable
def describe_built(ns, name: str, args, kw) -> dict:
    """What :func:`params_judge` needs of the student's ``name(*args, **kw)``."""
    return _describe(student_class(ns, name)(*args, **kw))


#: what :func:`_describe` returns, as a structure template (:func:`expect_structure`)
_ATTR = {"kind": ANY, "value": ANY, "requires_grad": ANY}
DESCRIBED = {"params": ANY, "state_keys": ANY, "attrs": {"weight": _ATTR, "bias": _ATTR}, "mro": ANY}
_MODULE, _OBJECT = "torch.nn.modules.module.Module", "builtins.object"


def params_judge(out: dict, name: str, cases, torch_cls, torch_kw: dict) -> None:
    forbidden = f"torch.nn.modules.normalization.{name}"
    expect_structure(out, {key: DESCRIBED for key, _, _ in cases})
    for key, args, kw in cases:
        got = out[key]
        call_str = f"{name}({', '.join([repr(a) for a in args] + [f'{k}={v!r}' for k, v in kw.items()])})"
        mro = got["mro"]
        if not (isinstance(mro, list) and len(mro) >= 3 and _MODULE in mro and mro[-1] == _OBJECT):
            raise CheckFailed(f"{call_str} is not an nn.Module (its class hierarchy came back as {mro!r:.200})")
        if forbidden in mro:
            raise CheckFailed(f"{name} is derived from torch.nn.{name}: write it from nn.Module, "
                              "with your own parameters and forward")
        ref = torch_cls(*args, **{**torch_kw, **kw})
        want = _describe(ref)
        if got["params"] != want["params"]:
            extra = sorted(set(got["params"]) - set(want["params"]))
            missing = sorted(set(want["params"]) - set(got["params"]))
            msg = f"{call_str} has parameters {got['params']}, expected {want['params']}"
            for m in missing:
                kind = got["attrs"].get(m, {}).get("kind")
                if kind == "tensor":
                    msg += (f". {m} is a plain tensor: wrap it in nn.Parameter so that it is "
                            "registered, trained, moved by .to() and saved in the state_dict")
            if extra and not missing:
                msg += f" ({', '.join(extra)} should not be there)"
            raise CheckFailed(msg)
        for p in ("weight", "bias"):
            kind = got["attrs"][p]["kind"]
            if want["attrs"][p]["kind"] == "NoneType" and kind != "NoneType":
                raise CheckFailed(
                    f"{call_str}.{p} should be None, like torch.nn.{name}'s"
                    + (f", but {p} is not an attribute at all: set self.{p} = None when the layer "
                       "has none, so that code reading norm." + p + " (an init loop, an optimizer's "
                       "param groups) works" if kind == "absent" else
                       f", but it is a {kind}: with no {p} asked for, store None, not a stand-in "
                       "of ones or zeros (code tests `norm." + p + " is not None` to find the "
                       "learned parameters)"))
        if got["state_keys"] != want["state_keys"]:
            raise CheckFailed(f"{call_str}.state_dict() has keys {got['state_keys']}, "
                              f"expected {want['state_keys']} (like torch.nn.{name})")
        for p in want["params"]:
            exp = want["attrs"][p]["value"]
            val = got["attrs"][p]["value"]
            expect_tensor(val, f"{call_str}.{p}")
            if tuple(val.shape) != tuple(exp.shape):
                raise CheckFailed(f"{call_str}.{p} has shape {tuple(val.shape)}, expected "
                                  f"{tuple(exp.shape)} (the normalized_shape)")
            if not torch.equal(val.double(), exp.double()):
                init = "ones" if p == "weight" else "zeros"
                raise CheckFailed(f"{call_str}.{p} should start as {init} (so that a fresh layer "
                                  "only normalizes)")
            if not got["attrs"][p]["requires_grad"]:
                raise CheckFailed(f"{call_str}.{p} does not require grad: it is a learned parameter")


def register_parameters_check(grade_id: str, doc: str, name: str, cases, torch_cls, torch_kw: dict) -> None:
    """A check that ``name(*args, **kw)`` has torch_cls's parameters, for each of ``cases``."""
    register_check(grade_id, doc, lambda ns: params_probe(ns, name, cases),
                   lambda out: params_judge(out, name, cases, torch_cls, torch_kw), needs=(name,))


# --------------------------------------------------------------------------------------------
# Gradients (float64)
# --------------------------------------------------------------------------------------------

def grads_probe(ns: dict, name: str, cases) -> list:
    """``cases``: (ctor args, ctor kwargs, x, weights, upstream grad) -> outputs and gradients."""
    student_class(ns, name)  # not a class: say so before any case
    return [grads_case(ns, name, args, kw, x, vals, g) for args, kw, x, vals, g in cases]


@remotable
def grads_case(ns, name: str, args, kw, x, vals, g, dtype=torch.float64) -> dict:
    """One case of :func:`grads_probe`: the output, and the gradients of ``sum(y * g)`` (the
    module moved to ``dtype``, the input's)."""
    m = student_class(ns, name)(*args, **kw).to(dtype)
    set_params(m, vals, name)
    x = x.clone().requires_grad_(True)
    y = call(m, x, name)
    if not y.requires_grad:
        raise CheckFailed(f"{name}'s output does not depend on its input through autograd "
                          "(.detach(), .data, numpy or torch.no_grad() in forward?)")
    (y * g).sum().backward()
    grads, kinds = {"x": x.grad}, {}
    for p in vals:
        t = getattr(m, p, None)
        grads[p] = t.grad if isinstance(t, torch.Tensor) else None
        kinds[p] = "Parameter" if isinstance(t, nn.Parameter) else type(t).__name__
    return {"y": y.detach(), "grads": grads, "kinds": kinds}


@remotable
def grads_cases(ns, name: str, cases, dtype) -> list:
    """:func:`grads_case` on each case ``(args, kw, x, vals, g)`` in ``dtype``, in one call from the referee."""
    return [grads_case(ns, name, *case, dtype=dtype) for case in cases]


def grads_judge(out: list, name: str, cases, torch_module, suspects_fn=None) -> None:
    """Compare with torch's gradients; ``suspects_fn(x, vals, g, i)`` -> {message: wrong dx}."""
    tol = dict(atol=1e-5, rtol=1e-5)  # float32-precision statistics inside are fine
    pairs = paired(cases, out, lambda case: {"y": ANY, "grads": {"x": ANY, **{p: ANY for p in case[3]}},
                                             "kinds": {p: ANY for p in case[3]}})
    for i, ((args, kw, x, vals, g), got) in enumerate(pairs):
        ref = torch_module(i).double()
        with torch.no_grad():
            for p, v in vals.items():
                getattr(ref, p).copy_(v)
        xr = x.clone().requires_grad_(True)
        y = ref(xr)
        (y * g).sum().backward()
        expect_close(got["y"], y.detach(), what=f"{name}'s output (float64 input)", **tol)
        sus = suspects_fn(x, vals, g, i) if suspects_fn else {}
        expect_close(got["grads"]["x"], xr.grad, what="the gradient with respect to the input",
                     suspects=sus, **tol)
        for p in vals:
            gp = got["grads"][p]
            if got["kinds"][p] != "Parameter":
                raise CheckFailed(f"{name}.{p} is a {got['kinds'][p]}, not an nn.Parameter: "
                                  "module.double() and .to() do not convert it, and an optimizer "
                                  "given module.parameters() never trains it")
            if gp is None:
                raise CheckFailed(f"{name}.{p}.grad is None after backward: make {p} an "
                                  "nn.Parameter and use it in forward")
            expect_close(gp, getattr(ref, p).grad, what=f"the gradient with respect to {p}", **tol)


def register_gradients_check(grade_id: str, doc: str, norm: NormSpec, specs, suspects_fn) -> None:
    """A check of the float64 gradients on ``norm.grad_cases(specs)`` against torch's module's.

    ``suspects_fn(x, vals, g, i)`` -> {mistake: the input gradient it gives} for case ``i``.
    """
    register_check(grade_id, doc, lambda ns: grads_probe(ns, norm.name, norm.grad_cases(specs)),
                   lambda out: grads_judge(out, norm.name, norm.grad_cases(specs),
                                           lambda i: norm.torch_cls(specs[i][2], eps=norm.eps), suspects_fn),
                   needs=(norm.name,), forbidden_ops=NORM_OPS)


def detached_grad(fn, x, vals, g, detach) -> torch.Tensor:
    """dx of ``sum(fn(x, detach) * g)``: what a forward with detached statistics gives."""
    x = x.clone().requires_grad_(True)
    (fn(x, vals, detach) * g).sum().backward()
    return x.grad


# --------------------------------------------------------------------------------------------
# Argument forms and edge shapes: how the constructor is called, what the input looks like
# --------------------------------------------------------------------------------------------

def as_form(nshape, form: str):
    """``normalized_shape`` as the contract lets a caller give it: ``int``, ``tuple``, ``list`` or
    ``size`` (a ``torch.Size``; it is made where the student's code runs: on the wire it is a tuple)."""
    n = (nshape,) if isinstance(nshape, int) else tuple(nshape)
    if form == "int":
        return n[0]
    return {"tuple": n, "list": list(n), "size": torch.Size(n)}[form]


def make_view(x: torch.Tensor, view):
    """``x`` itself (``view`` None), or a view of it that is not contiguous: ``("t", a, b)``
    transposes dims ``a`` and ``b``; ``("s", dim, step)`` takes every ``step``-th entry of ``dim``.
    Views are made where the student's code runs: tensors cross the wire contiguous."""
    if view is None:
        return x
    kind, a, b = view
    if kind == "t":
        return x.transpose(a, b)
    index = [slice(None)] * x.dim()
    index[a] = slice(None, None, b)
    return x[tuple(index)]


def forward_form(ns, name: str, nshape, form: str, args, kwargs, vals, x, view=None):
    """The student's ``name(as_form(nshape, form), *args, **kwargs)`` with the weights ``vals``,
    applied to ``make_view(x, view)``."""
    m = student_class(ns, name)(as_form(nshape, form), *args, **kwargs)
    if vals:
        set_params(m, vals, name)
    return call(m, make_view(x, view), name)


@dataclass(frozen=True)
class FormCase:
    """One constructor call and one input: ``name(normalized_shape as form, *args, **kw)`` applied
    to ``view`` of a seeded input of ``shape``; ``mistake``: what it means when this case fails."""
    seed: int
    shape: tuple
    nshape: object
    form: str = "int"
    args: tuple = ()
    kw: object = field(default_factory=frozen)
    view: object = None
    xkw: object = field(default_factory=frozen)
    mistake: str = ""

    def affine(self) -> tuple:
        """(weight, bias) present, from elementwise_affine and bias given by position or keyword."""
        a = dict(zip(("eps", "elementwise_affine", "bias"), self.args), **self.kw)
        w = bool(a.get("elementwise_affine", True))
        return w, w and bool(a.get("bias", True))

    def values(self, norm: "NormSpec") -> dict:
        """The seeded weights of the parameters this call has."""
        present = dict(zip(("weight", "bias"), self.affine()))
        return {k: v for k, v in norm.values(self.seed + 1, self.nshape).items() if present[k]}

    def call_str(self, name: str) -> str:
        parts = [repr(as_form(self.nshape, self.form))] + [repr(a) for a in self.args]
        parts += [f"{k}={v!r}" for k, v in self.kw.items()]
        return f"{name}({', '.join(parts)})"

    def input_str(self) -> str:
        shape = tuple(make_view(torch.empty(self.shape), self.view).shape)
        if self.view is None:
            return f"an input of shape {shape}"
        kind, a, b = self.view
        how = f"x.transpose({a}, {b})" if kind == "t" else f"every {b}th entry of dim {a}"
        return f"an input of shape {shape} that is a non-contiguous view ({how})"


def _student_error(e: BaseException) -> str:
    """What the student's code raised, as a failed test says it (:func:`coursekit.checks.explain_error`)."""
    from coursekit.checks import _student_frame, explain_error
    return explain_error({"error": type(e).__name__, "message": str(e)[:300], "where": _student_frame(e.__traceback__)})


@remotable
def forward_forms(ns, name: str, cases) -> list:
    """:func:`forward_form` on each case ``(nshape, form, args, kwargs, vals, x, view)``, in one call
    from the referee: ``{"y": output}`` per case, up to the first one the student's code raises on,
    which gives ``{"raised": what it raised}`` and ends the list."""
    out = []
    for case in cases:
        try:
            out.append({"y": forward_form(ns, name, *case)})
        except Exception as e:  # noqa: BLE001 -- the student's code may raise anything: the probe names the case
            out.append({"raised": _student_error(e)})
            break
    return out


def forms_probe(ns, norm: "NormSpec", cases) -> list:
    """Each case's output; a case the student's code raises on fails the check at once, saying which."""
    student_class(ns, norm.name)  # not a class: say so before any case
    calls = []
    for c in cases:
        calls.append((c.nshape, c.form, c.args, c.kw, c.values(norm), norm.input(c.seed, c.shape, c.xkw), c.view))
    got = forward_forms(ns, norm.name, calls)
    if not isinstance(got, list) or not 0 < len(got) <= len(cases) or not all(isinstance(r, dict) for r in got):
        raise CheckFailed("no result came back from your code")
    for c, r in zip(cases, got):
        if "raised" in r:
            raise CheckFailed(f"{c.call_str(norm.name)} on {c.input_str()}: "
                              f"{str(r['raised'])[:600].rstrip('.')}. {c.mistake}")
    return [r.get("y") for r in got]


def forms_judge(out, norm: "NormSpec", cases) -> None:
    for c, y in paired(cases, out):
        args, kw = c.args, dict(c.kw)
        if not args and "eps" not in kw:
            kw["eps"] = norm.eps  # torch.nn.RMSNorm's own default is not the contract's
        ref = norm.torch_cls(as_form(c.nshape, c.form), *args, **kw)
        with torch.no_grad():
            for k, v in c.values(norm).items():
                getattr(ref, k).copy_(v)
        x = make_view(norm.input(c.seed, c.shape, c.xkw), c.view)
        want = ref(x).detach()
        what = f"{c.call_str(norm.name)} on {c.input_str()}"
        with_hint(lambda: expect_close(y, want, what=what), " " + c.mistake)


def register_forms_check(grade_id: str, doc: str, norm: "NormSpec", cases) -> None:
    """A check that the student's module matches torch's on each :class:`FormCase` (float32)."""
    register_check(grade_id, doc, lambda ns: forms_probe(ns, norm, cases),
                   lambda out: forms_judge(out, norm, cases), needs=(norm.name,), forbidden_ops=NORM_OPS)


# --------------------------------------------------------------------------------------------
# Gradients in float16 and bfloat16, against torch's module in the same dtype
# --------------------------------------------------------------------------------------------

def half_grad_cases(norm: "NormSpec", specs, dtype) -> tuple:
    """(seed, input shape, normalized_shape, input kwargs) -> :func:`grads_case`'s inputs in ``dtype``."""
    cases = []
    for seed, shape, nshape, xkw in specs:
        x = norm.input(seed, shape, xkw, dtype)
        g = randn(seed + 2, *shape).to(dtype)
        vals = {k: v.to(dtype) for k, v in norm.values(seed + 1, nshape).items()}
        cases.append(((nshape,), frozen(), x, vals, g))
    return tuple(cases)


#: how far a half-precision gradient may be from float64 autograd of torch's module on the same
#: (rounded) inputs: ``scale`` times the gradient's largest entry plus ``rtol`` of each entry. torch's
#: own float16/bfloat16 modules on the CPU are within a third of this (they sum the parameters'
#: gradients less exactly than a float32 autograd graph does), so both pass.
HALF_GRAD_TOL = {torch.float16: dict(scale=2e-3, rtol=1e-2), torch.bfloat16: dict(scale=1.6e-2, rtol=2e-2)}


def half_grads_want(norm: "NormSpec", nshape, x, vals, g) -> dict:
    """float64 autograd of torch's module on the half-precision inputs: {"x", "weight", ...}."""
    ref = norm.torch_cls(nshape, eps=norm.eps).double()
    with torch.no_grad():
        for p, v in vals.items():
            getattr(ref, p).copy_(v.double())
    xr = x.double().requires_grad_(True)
    (ref(xr) * g.double()).sum().backward()
    return {"x": xr.grad, **{p: getattr(ref, p).grad for p in vals}}


def half_grads_judge(out, norm: "NormSpec", specs, dtypes, hint: str) -> None:
    expect_structure(out, {str(d)[6:]: ANY for d in dtypes})
    for dtype in dtypes:
        cases = half_grad_cases(norm, specs, dtype)
        tol = HALF_GRAD_TOL[dtype]
        pairs = paired(cases, out[str(dtype)[6:]], lambda case: {"y": ANY, "grads": {"x": ANY, **{p: ANY for p in case[3]}},
                                                                 "kinds": {p: ANY for p in case[3]}})
        for ((args, kw, x, vals, g), got), (seed, shape, nshape, _) in zip(pairs, specs):
            where = f"{norm.name}({nshape!r}) on an input of shape {tuple(shape)} ({str(dtype)[6:]})"
            for key, want in half_grads_want(norm, nshape, x, vals, g).items():
                label = "the input" if key == "x" else key
                what = f"the gradient with respect to {label} ({where})"
                gp = got["grads"][key]
                if gp is None:
                    raise CheckFailed(f"{norm.name}.{key}.grad is None after backward ({where}): make {key} an "
                                      "nn.Parameter and use it in forward")
                gp = expect_tensor(gp, what)
                if gp.dtype != dtype:
                    raise CheckFailed(f"{what} has dtype {gp.dtype}, expected {dtype}: a gradient has its "
                                      "tensor's dtype")
                atol = tol["scale"] * float(want.abs().max()) if want.numel() else 0.0
                with_hint(lambda: expect_close(gp, want.to(dtype), what=what, atol=atol, rtol=tol["rtol"]), hint)


def register_half_gradients_check(grade_id: str, doc: str, norm: "NormSpec", specs, hint: str) -> None:
    """A check of the float16 and bfloat16 gradients (input and parameters) against torch's module's."""
    dtypes = (torch.float16, torch.bfloat16)

    def probe(ns):
        student_class(ns, norm.name)
        return {str(d)[6:]: grads_cases(ns, norm.name, half_grad_cases(norm, specs, d), d) for d in dtypes}

    register_check(grade_id, doc, probe, lambda out: half_grads_judge(out, norm, specs, dtypes, hint),
                   needs=(norm.name,), forbidden_ops=NORM_OPS)
