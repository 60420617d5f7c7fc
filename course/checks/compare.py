"""Comparisons for judges, with messages that name the mistake.

``expect_close(actual, expected, what=..., suspects={...})``: when ``actual`` is not close to
``expected``, each suspect (a message mapped to what a known wrong implementation would have
returned on the same input) is tried in turn; the first one that ``actual`` matches becomes the
message. So a student whose variance is unbiased reads "divide by D, not D-1", not a bare diff.
"""
from __future__ import annotations

import torch

from course.checks import CheckFailed
from course.checks.wire import BadValue

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
                 suspects: dict | None = None, check_dtype: bool = True) -> None:
    """Raise :class:`CheckFailed` unless ``actual`` matches ``expected`` (shape, dtype, values)."""
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
        raise CheckFailed(f"{what} contains NaN where torch's result has none")
    if torch.isinf(a).any() and not torch.isinf(e).any():
        raise CheckFailed(f"{what} contains inf where torch's result has none (overflow?)")
    diff = (torch.nan_to_num(a) - torch.nan_to_num(e)).abs()
    i = int(diff.argmax())
    raise CheckFailed(
        f"{what} does not match torch: largest difference {diff.max().item():.3g} at flat index {i} "
        f"(yours {a.flatten()[i].item():.6g}, expected {e.flatten()[i].item():.6g})"
    )
