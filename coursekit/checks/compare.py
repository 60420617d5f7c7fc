"""Comparisons for judges, with messages that name the mistake.

``expect_close(actual, expected, what=..., suspects={...})``: when ``actual`` is not close to
``expected``, each suspect (a message mapped to what a known wrong implementation would have
returned on the same input) is tried in turn; the first one that ``actual`` matches becomes the
message. So a student whose variance is unbiased reads "divide by D, not D-1", not a bare diff.

``paired(cases, out)`` / ``expect_structure(out, template)``: before a judge looks at a single
value, what came back from the probe must have the structure the judge's OWN cases call for (as
many results as it has cases, every key it reads, lists where it expects lists). The judge runs on
the trusted side with its own case tables, so a probe that was made to skip cases (a case list
emptied or shortened in the student's process, a forged record) fails here instead of passing
an empty loop.
"""
from __future__ import annotations

import torch

from coursekit.checks import CheckFailed
from coursekit.checks.wire import BadValue

#: default tolerances by dtype, compared in float64
TOLERANCES = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-4),
    torch.float16: (1e-2, 1e-2),
    torch.bfloat16: (5e-2, 5e-2),
}


def expect_tensor(value, what: str) -> torch.Tensor:
    if isinstance(value, BadValue):
        raise CheckFailed(f"{what} should be a torch.Tensor, but it is {value.what}")
    if not isinstance(value, torch.Tensor):
        raise CheckFailed(f"{what} should be a torch.Tensor, but it is {type(value).__name__}")
    return value


def is_close(actual: torch.Tensor, expected: torch.Tensor, atol=None, rtol=None) -> bool:
    if actual.shape != expected.shape:
        return False
    a_tol, r_tol = TOLERANCES.get(expected.dtype, (1e-4, 1e-4))
    atol = a_tol if atol is None else atol
    rtol = r_tol if rtol is None else rtol
    a, e = actual.double(), expected.double()
    if not torch.equal(torch.isnan(a), torch.isnan(e)):
        return False
    a, e = torch.nan_to_num(a, nan=0.0), torch.nan_to_num(e, nan=0.0)
    return bool(torch.allclose(a, e, atol=atol, rtol=rtol))


def expect_close(actual, expected: torch.Tensor, *, what: str, atol=None, rtol=None,
                 suspects: dict | None = None, check_dtype: bool = True, against: str = "torch") -> None:
    """Raise :class:`CheckFailed` unless ``actual`` matches ``expected`` (shape, dtype, values).
    ``against``: what ``expected`` came from, as the message names it (torch's own module by default;
    an exercise with no torch counterpart says "the reference")."""
    actual = expect_tensor(actual, what)
    if actual.shape != expected.shape:
        raise CheckFailed(f"{what} has shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
    if check_dtype and actual.dtype != expected.dtype:
        raise CheckFailed(f"{what} has dtype {actual.dtype}, expected {expected.dtype} "
                          "(the output should keep the input's dtype)")
    if is_close(actual, expected, atol, rtol):
        return
    for message, wrong in (suspects or {}).items():
        if wrong is not None and wrong.shape == actual.shape and is_close(actual, wrong.to(actual.dtype), atol, rtol):
            raise CheckFailed(f"{what} is wrong: {message}")
    a, e = actual.double(), expected.double()
    if torch.isnan(a).any() and not torch.isnan(e).any():
        raise CheckFailed(f"{what} contains NaN where {against}'s result has none")
    if torch.isinf(a).any() and not torch.isinf(e).any():
        raise CheckFailed(f"{what} contains inf where {against}'s result has none (overflow?)")
    diff = (torch.nan_to_num(a) - torch.nan_to_num(e)).abs()
    i = int(diff.argmax())
    raise CheckFailed(
        f"{what} does not match {against}: largest difference {diff.max().item():.3g} at flat index {i} "
        f"(yours {a.flatten()[i].item():.6g}, expected {e.flatten()[i].item():.6g})"
    )


# --------------------------------------------------------------------------------------------
# The structure of a probe's result, checked against the judge's own cases
# --------------------------------------------------------------------------------------------

class _Any:
    def __repr__(self):
        return "ANY"


#: in a template: one value whose content is the judge's business (a tensor, a number, a string...)
ANY = _Any()


def _where(path: str) -> str:
    return f" (at {path})" if path else ""


def expect_structure(value, template, what: str = "the probe", _path: str = "") -> None:
    """Raise :class:`CheckFailed` unless ``value`` has the structure of ``template``.

    ``template``: a list (``value`` must be a list of exactly that length, item by item), a dict
    (``value`` must be a dict with exactly those keys, key by key) or :data:`ANY` (anything).
    """
    if template is ANY:
        return
    if isinstance(template, (list, tuple)):
        if not isinstance(value, list):
            raise CheckFailed(f"expected a list of {len(template)} results from {what}{_where(_path)}, "
                              f"got {_kind(value)}")
        if len(value) != len(template):
            raise CheckFailed(f"expected {len(template)} results from {what}{_where(_path)}, got {len(value)}")
        for i, (v, t) in enumerate(zip(value, template)):
            expect_structure(v, t, what, f"{_path}[{i}]")
        return
    if isinstance(template, dict):
        if not isinstance(value, dict):
            raise CheckFailed(f"expected a dict with keys {sorted(template)} from {what}{_where(_path)}, "
                              f"got {_kind(value)}")
        missing, extra = sorted(set(template) - set(value)), sorted(set(value) - set(template))
        if missing or extra:
            raise CheckFailed(f"expected the keys {sorted(template)} from {what}{_where(_path)}, got "
                              f"{sorted(value)}" + (f" (missing {missing})" if missing else "")
                              + (f" (unexpected {extra})" if extra else ""))
        for k, t in template.items():
            expect_structure(value[k], t, what, f"{_path}[{k!r}]")
        return
    raise TypeError(f"not a structure template: {template!r}")


def _kind(value) -> str:
    if isinstance(value, BadValue):
        return value.what
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return type(value).__name__


def paired(cases, out, item=ANY, what: str = "the probe") -> list:
    """``zip(cases, out)``, strictly: ``out`` must be a list with one result per case, each of the
    structure ``item`` (a template, see :func:`expect_structure`, or a function of the case that
    returns one). ``cases`` are the judge's own: how many results there must be is decided here,
    on the trusted side, never by what came back."""
    cases = list(cases)
    expect_structure(out, [item(c) if callable(item) else item for c in cases], what)
    return list(zip(cases, out))
