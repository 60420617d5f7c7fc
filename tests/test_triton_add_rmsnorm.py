"""The Triton fused add + RMSNorm (book/experiments/triton_add_rmsnorm.py) against float64 autograd.

The kernels run under Triton's interpreter (numpy on CPU tensors). ``TRITON_INTERPRET=1`` must be
set before ``triton.jit`` decorates them, so the checks run in a fresh process: this file run as
a script (``python tests/test_triton_add_rmsnorm.py``) with that variable set, which prints one
JSON report for the real module and for each mutant below. The mutants are the real module's
source with one line changed; each must fail the same comparison the real module passes.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

MODULE = Path(__file__).resolve().parents[1] / "book" / "experiments" / "triton_add_rmsnorm.py"

# Largest |out - ref| over the tensor, divided by its largest |ref|, must stay under these.
# float32: rounding of a few dozen float32 operations per element. bfloat16: one rounding of
# the output to 8 bits of mantissa (2**-8 ~ 0.004) after inputs rounded the same way.
TOL = {"float32": 1e-5, "bfloat16": 1e-2}

# (name, shape, dtype, scale of x and residual, eps, which outputs get a gradient)
CASES = [
    ("2d_f32", (6, 37), "float32", 1.0, 1e-6, "y,h"),
    ("3d_f32", (2, 5, 48), "float32", 1.0, 1e-5, "y,h"),
    ("3d_bf16", (2, 3, 40), "bfloat16", 1.0, 1e-6, "y,h"),
    # mean(h**2) ~ eps, first row exactly zero (x = -residual): eps decides rstd there
    ("tiny_rows_f32", (4, 24), "float32", 7e-4, 1e-6, "y,h"),
    ("y_only_f32", (5, 32), "float32", 1.0, 1e-6, "y"),       # h's gradient is None
]

# (name, exact line fragment in the module, its replacement, a check it must fail)
MUTANTS = [
    ("ignores_grad_h", "if HAS_GH:", "if False:", "2d_f32.dx"),
    ("no_projection", "dh = rstd * g - hf * (rstd * rstd * rstd * tl.sum(g * hf, axis=0) / D)",
     "dh = rstd * g", "2d_f32.dx"),
    ("mean_over_block", "tl.sum(hf * hf, axis=0) / D + eps", "tl.sum(hf * hf, axis=0) / BLOCK + eps",
     "2d_f32.y"),
    ("eps_outside_sqrt", "1.0 / tl.sqrt(tl.sum(hf * hf, axis=0) / D + eps)",
     "1.0 / (tl.sqrt(tl.sum(hf * hf, axis=0) / D) + eps)", "tiny_rows_f32.y"),
    ("dw_of_first_program", "dw_part.sum(0)", "dw_part[0]", "2d_f32.dw"),
]


# ---------------------------------------------------------------- the worker (fresh process)

def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _errors(mod, torch) -> dict:
    """``{case.check: error / tolerance}`` for every case: under 1 passes."""
    out = {}
    for name, shape, dtype, scale, eps, used in CASES:
        dt = getattr(torch, dtype)
        g = torch.Generator().manual_seed(len(out))
        x = (torch.randn(shape, generator=g) * scale).to(dt)
        r = (torch.randn(shape, generator=g) * scale).to(dt)
        if name.startswith("tiny"):
            r[0] = -x[0]
        w = (1 + 0.5 * torch.randn(shape[-1], generator=g)).to(dt)
        gy = torch.randn(shape, generator=g).to(dt)
        gh = torch.randn(shape, generator=g).to(dt)
        leaves = [t.clone().requires_grad_() for t in (x, r, w)]
        ref = [t.double().requires_grad_() for t in (x, r, w)]

        y, h = mod.fused_add_rmsnorm(*leaves, eps)
        h64 = ref[0] + ref[1]
        # y = h / sqrt(mean(h^2) + eps) * w, all in float64
        y64 = h64 / torch.sqrt(h64.pow(2).mean(-1, keepdim=True) + eps) * ref[2]
        if used == "y,h":
            torch.autograd.backward((y, h), (gy, gh))
            torch.autograd.backward((y64, h64), (gy.double(), gh.double()))
        else:
            torch.autograd.backward(y, gy)
            torch.autograd.backward(y64, gy.double())

        tol = TOL[dtype]
        pairs = {"y": (y, y64), "h": (h, h64), "dx": (leaves[0].grad, ref[0].grad),
                 "dresidual": (leaves[1].grad, ref[1].grad), "dw": (leaves[2].grad, ref[2].grad)}
        for check, (got, want) in pairs.items():
            if got is None or got.dtype != dt or got.shape != want.shape:
                out[f"{name}.{check}"] = float("inf")
                continue
            got, want = got.detach().double(), want.detach()
            out[f"{name}.{check}"] = float((got - want).abs().max() / want.abs().max()) / tol
        # h is the stream the next block adds to: in float32, the same bits as torch's x + residual.
        # Not in bfloat16 here: the interpreter's float32 -> bfloat16 cast truncates (cast_impl in
        # triton/runtime/interpreter.py passes no rounding mode), where torch and compiled Triton
        # round to nearest even: h was one unit in the last place off in 61 of 240 elements of a sample.
        if dtype == "float32":
            out[f"{name}.h_bits"] = 0.0 if torch.equal(h.detach(), x + r) else float("inf")
    return out


def _saved(mod, torch) -> list:
    """What the autograd graph keeps between forward and backward: (shape, dtype) per tensor."""
    kept = []

    def pack(t):
        kept.append((list(t.shape), str(t.dtype).removeprefix("torch.")))
        return t

    x = torch.randn(2, 3, 20, requires_grad=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        mod.fused_add_rmsnorm(x, torch.randn(2, 3, 20), torch.ones(20, requires_grad=True), 1e-6)
    return kept


def _worker() -> None:
    assert os.environ.get("TRITON_INTERPRET") == "1", "run with TRITON_INTERPRET=1"
    import torch

    report = {"reference": {"errors": _errors(_load(MODULE, "tar_reference"), torch),
                            "saved": _saved(_load(MODULE, "tar_saved"), torch)}}
    source = MODULE.read_text()
    with tempfile.TemporaryDirectory() as tmp:
        for name, old, new, _ in MUTANTS:
            if source.count(old) != 1:
                report[name] = {"error": f"{old!r} occurs {source.count(old)} times in the module"}
                continue
            path = Path(tmp) / f"tar_{name}.py"       # triton.jit reads the kernel's source file
            path.write_text(source.replace(old, new))
            try:
                report[name] = {"errors": _errors(_load(path, f"tar_{name}"), torch)}
            except Exception as exc:                  # reported: a mutant must run, not crash
                report[name] = {"error": repr(exc)}
    print(json.dumps(report))


# ---------------------------------------------------------------- the tests (pytest process)

@pytest.fixture(scope="module")
def report() -> dict:
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True,
                          timeout=300, cwd=MODULE.parents[2])
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_interpreted_kernels_match_float64_autograd(report):
    """y, h and the gradients of x, residual and weight are within TOL of float64 autograd."""
    errors = report["reference"]["errors"]
    assert len(errors) == 5 * len(CASES) + sum(c[2] == "float32" for c in CASES)
    failed = {k: v for k, v in errors.items() if not v <= 1.0}
    assert not failed, f"error / tolerance above 1: {failed}"


def test_only_h_weight_and_float32_rstd_are_saved(report):
    """The graph keeps h (2, 3, 20), weight (20,) and a float32 rstd per row (6,): nothing else."""
    assert report["reference"]["saved"] == [[[2, 3, 20], "float32"], [[20], "float32"], [[6], "float32"]]


@pytest.mark.parametrize("name,check", [(m[0], m[3]) for m in MUTANTS], ids=[m[0] for m in MUTANTS])
def test_a_wrong_kernel_fails_the_same_comparison(report, name, check):
    """A one-line mutant of the module fails the comparison the real module passes (the test can fail)."""
    result = report[name]
    assert "error" not in result, result.get("error")   # it must run, and get numbers wrong
    assert result["errors"][check] > 1.0, f"{name} passed {check}: {result['errors'][check]:.3g}"


if __name__ == "__main__":
    _worker()
