"""torch's built-in normalizations, as the norm exercises forbid them (coursekit.checks.ops).

* NORM_OPS is checked against the installed torch: every dispatcher op (and every member of
  torch.nn.functional) whose name contains "norm" is either a normalization in NORM_OPS or
  listed in NOT_NORMALIZATIONS, so a normalization added by a future torch fails here.
* block_kernels makes every op of the family raise by every route (torch.X, torch.ops.<ns>.X,
  torch._C._nn / torch._C._VariableFunctions, torch.nn.functional, nn modules, inference mode,
  torch.compile), while a LayerNorm written from the formula still runs; release() gives the
  built-ins back. Blocking changes global torch state, so those run in a subprocess.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from coursekit.checks.ops import NORM_OPS, NOT_NORMALIZATIONS, OpRecorder, op_overloads
from course.release import ROOT, venv_env


def _dispatcher_norm_names() -> set[str]:
    return {n.split("::")[1].split(".")[0] for n in torch._C._dispatch_get_all_op_names() if "norm" in n.split("::")[1]}


def test_every_norm_op_of_this_torch_is_classified():
    names = _dispatcher_norm_names() | {n for n in dir(F) if "norm" in n}
    unclassified = sorted(names - NORM_OPS - NOT_NORMALIZATIONS)
    assert not unclassified, (f"torch {torch.__version__} has ops named like norms that coursekit.checks.ops does not "
                              f"classify: {unclassified}. Add each to NORM_OPS (a normalization a student must not "
                              "call) or to NOT_NORMALIZATIONS (a vector norm, weight norm, random normal...)")


def test_the_two_lists_do_not_overlap_and_name_real_ops():
    assert not NORM_OPS & NOT_NORMALIZATIONS
    known = _dispatcher_norm_names() | set(dir(F)) | {n.split("::")[1].split(".")[0] for n in torch._C._dispatch_get_all_op_names()}
    # names of ops this torch does not have are fine (other builds: CUDA, ROCm), but most must be real
    assert len(NORM_OPS & known) >= len(NORM_OPS) - 4, sorted(NORM_OPS - known)


@pytest.mark.parametrize("name", ["native_group_norm", "native_batch_norm", "_native_batch_norm_legit",
                                  "batch_norm_stats", "batch_norm_elemt", "_batch_norm_with_update",
                                  "instance_norm", "group_norm", "layer_norm", "rms_norm", "_fused_rms_norm"])
def test_the_whole_family_is_forbidden(name):
    assert name in NORM_OPS


@pytest.mark.parametrize("name", ["norm", "linalg_vector_norm", "frobenius_norm", "renorm", "nuclear_norm",
                                  "_weight_norm", "normalize"])
def test_vector_norms_are_not_forbidden(name):
    assert name not in NORM_OPS


def test_op_recorder_sees_native_group_norm():
    x = torch.randn(6, 8)
    with OpRecorder() as rec:
        torch.native_group_norm(x.reshape(-1, 1, 8), None, None, 6, 1, 8, 1, 1e-5)
    assert "native_group_norm" in rec.seen & NORM_OPS


def test_op_overloads_finds_every_namespace():
    assert "aten::native_layer_norm.out" in op_overloads("native_layer_norm")
    assert "aten::native_layer_norm" in op_overloads("native_layer_norm")
    assert any(q.startswith("quantized::") for q in op_overloads("layer_norm"))
    assert op_overloads("no_such_op_anywhere") == []


# --------------------------------------------------------------------------------------------
# block_kernels, in a subprocess
# --------------------------------------------------------------------------------------------

ROUTES = r'''
import json, sys
import torch
import torch.nn.functional as F
from torch import nn
from coursekit.checks.ops import NORM_OPS, block_kernels

x = torch.randn(2, 3, 8)
D = 8
g = x.reshape(-1, 1, D)
ROUTES = {
    "F.layer_norm": lambda: F.layer_norm(x, (D,)),
    "torch.layer_norm": lambda: torch.layer_norm(x, (D,)),
    "torch.native_layer_norm": lambda: torch.native_layer_norm(x, (D,), None, None, 1e-5),
    "torch.ops.aten.native_layer_norm": lambda: torch.ops.aten.native_layer_norm(x, [D], None, None, 1e-5),
    "torch.ops.aten.native_layer_norm.default": lambda: torch.ops.aten.native_layer_norm.default(x, [D], None, None, 1e-5),
    "torch.ops.aten.layer_norm": lambda: torch.ops.aten.layer_norm(x, [D]),
    "torch._C._VariableFunctions.native_layer_norm": lambda: torch._C._VariableFunctions.native_layer_norm(x, [D], None, None, 1e-5),
    "torch.native_group_norm": lambda: torch.native_group_norm(g, None, None, 6, 1, D, 1, 1e-5),
    "torch.ops.aten.native_group_norm": lambda: torch.ops.aten.native_group_norm(g, None, None, 6, 1, D, 1, 1e-5),
    "torch._C._VariableFunctions.native_group_norm": lambda: torch._C._VariableFunctions.native_group_norm(g, None, None, 6, 1, D, 1, 1e-5),
    "F.group_norm": lambda: F.group_norm(g, 1),
    "torch.group_norm": lambda: torch.group_norm(g, 1),
    "F.instance_norm": lambda: F.instance_norm(x),
    "torch.instance_norm": lambda: torch.instance_norm(x, None, None, None, None, True, 0.1, 1e-5, False),
    "F.batch_norm": lambda: F.batch_norm(x, None, None, training=True),
    "torch.batch_norm": lambda: torch.batch_norm(x, None, None, None, None, True, 0.1, 1e-5, False),
    "torch.native_batch_norm": lambda: torch.native_batch_norm(x, None, None, None, None, True, 0.1, 1e-5),
    "torch.ops.aten.native_batch_norm.out": lambda: torch.ops.aten.native_batch_norm.out(
        x, None, None, None, None, True, 0.1, 1e-5, out=torch.empty(0), save_mean=torch.empty(0), save_invstd=torch.empty(0)),
    "torch._native_batch_norm_legit": lambda: torch._native_batch_norm_legit(x, None, None, torch.zeros(3), torch.ones(3), True, 0.1, 1e-5),
    "torch.ops.aten._native_batch_norm_legit.no_stats": lambda: torch.ops.aten._native_batch_norm_legit.no_stats(x, None, None, True, 0.1, 1e-5),
    "torch._native_batch_norm_legit_no_training": lambda: torch._native_batch_norm_legit_no_training(x, None, None, torch.zeros(3), torch.ones(3), 0.1, 1e-5),
    "torch.ops.aten._batch_norm_with_update": lambda: torch.ops.aten._batch_norm_with_update(x, None, None, torch.zeros(3), torch.ones(3), 0.1, 1e-5),
    "torch.ops.aten._batch_norm_no_update": lambda: torch.ops.aten._batch_norm_no_update(x, None, None, torch.zeros(3), torch.ones(3), 0.1, 1e-5),
    "torch._batch_norm_impl_index": lambda: torch._batch_norm_impl_index(x, None, None, None, None, True, 0.1, 1e-5, False),
    "F.rms_norm": lambda: F.rms_norm(x, (D,)),
    "torch.rms_norm": lambda: torch.rms_norm(x, (D,)),
    "torch._fused_rms_norm": lambda: torch._fused_rms_norm(x, [D], None, 1e-6),
    "F.local_response_norm": lambda: F.local_response_norm(x.transpose(1, 2), 2 * D - 1),
    "nn.LayerNorm": lambda: nn.LayerNorm(D)(x),
    "nn.RMSNorm": lambda: nn.RMSNorm(D)(x),
    "nn.GroupNorm": lambda: nn.GroupNorm(1, 1)(g),
    "nn.BatchNorm1d": lambda: nn.BatchNorm1d(3)(x),
    "nn.InstanceNorm1d": lambda: nn.InstanceNorm1d(3)(x),
    "nn.LocalResponseNorm": lambda: nn.LocalResponseNorm(2 * D - 1)(x.transpose(1, 2)),
    "requires_grad": lambda: F.layer_norm(x.clone().requires_grad_(), (D,)),
    "no_grad": lambda: torch.no_grad()(lambda: F.layer_norm(x, (D,)))(),
    "inference_mode": lambda: torch.inference_mode()(lambda: torch.native_group_norm(g, None, None, 6, 1, D, 1, 1e-5))(),
    "bfloat16": lambda: F.layer_norm(x.bfloat16(), (D,)),
    "float64": lambda: torch.native_group_norm(g.double(), None, None, 6, 1, D, 1, 1e-5),
    "backward kernel": lambda: torch.ops.aten.native_layer_norm_backward(
        x, x, [D], torch.zeros(2, 3, 1), torch.ones(2, 3, 1), None, None, [True, False, False]),
    "_transformer_encoder_layer_fwd": lambda: torch._transformer_encoder_layer_fwd(
        x, D, 2, torch.zeros(3 * D, D), torch.zeros(3 * D), torch.zeros(D, D), torch.zeros(D), False, False, 1e-5,
        torch.ones(D), torch.zeros(D), torch.ones(D), torch.zeros(D), torch.zeros(4, D), torch.zeros(4),
        torch.zeros(D, 4), torch.zeros(D)),
}
for name in dir(torch._C._nn):  # torch._C._nn holds none of them in torch 2.x; should one appear
    if name in NORM_OPS:
        ROUTES["torch._C._nn." + name] = None


def formula(t, eps=1e-5):
    mu = t.mean(-1, keepdim=True)
    var = (t - mu).pow(2).mean(-1, keepdim=True)
    return (t - mu) * torch.rsqrt(var + eps)


def run():
    res = {}
    for name, f in ROUTES.items():
        if f is None:
            res[name] = "unknown"
            continue
        try:
            f()
            res[name] = "ok"
        except Exception as e:
            res[name] = "blocked" if "switched off while grading" in str(e) else f"error: {type(e).__name__}: {str(e)[:200]}"
    return res


out = {"before": run()}
handle = block_kernels(NORM_OPS)
out["blocked"] = run()
y = formula(x)
out["formula_blocked"] = bool(torch.allclose(y.mean(-1), torch.zeros(2, 3), atol=1e-5))
xg = x.clone().requires_grad_()
formula(xg).pow(2).sum().backward()
out["formula_grad_blocked"] = xg.grad is not None
out["compile"] = {}
if "--compile" in sys.argv:
    try:
        torch.compile(lambda t: torch.native_group_norm(t, None, None, 6, 1, D, 1, 1e-5)[0])(g)
        out["compile"]["native_group_norm"] = "ok"
    except Exception as e:
        out["compile"]["native_group_norm"] = "blocked" if "switched off while grading" in str(e) else f"error: {e}"[:300]
    out["compile"]["formula"] = bool(torch.allclose(torch.compile(formula)(x), y, atol=1e-5))
handle.release()
out["released"] = run()
out["registered_keys"] = sorted({k for _, k in handle.registered})
print("RESULT" + json.dumps(out))
'''


def _run_routes(*args) -> dict:
    proc = subprocess.run([sys.executable, "-c", ROUTES, *args], capture_output=True, text=True, cwd=ROOT,
                          env=dict(venv_env(), OMP_NUM_THREADS="1"), timeout=600)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT")), None)
    assert line, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(line[len("RESULT"):])


@pytest.fixture(scope="module")
def routes():
    return _run_routes()


def test_every_route_works_before_blocking(routes):
    broken = {k: v for k, v in routes["before"].items() if v != "ok"}
    assert not broken, broken


def test_every_route_raises_while_blocked(routes):
    through = {k: v for k, v in routes["blocked"].items() if v != "blocked"}
    assert not through, through


def test_a_layernorm_from_the_formula_still_runs_while_blocked(routes):
    assert routes["formula_blocked"] and routes["formula_grad_blocked"]


def test_release_gives_the_builtins_back(routes):
    assert routes["released"] == routes["before"]


def test_blocking_covers_autograd_and_backend_keys(routes):
    assert {"CPU", "Autograd", "CompositeImplicitAutograd", "CompositeExplicitAutograd", "Meta"} <= set(routes["registered_keys"])


@pytest.mark.slow
def test_torch_compile_cannot_reach_a_blocked_kernel():
    """Compiled code traces the op with fake tensors: the blocked Meta kernel raises there too,
    while a compiled formula still runs."""
    res = _run_routes("--compile")
    assert res["compile"] == {"native_group_norm": "blocked", "formula": True}, res["compile"]


BLOCKED_FIXTURE = r'''
import sys
sys.path.insert(0, "tests")
from pathlib import Path
from coursekit.checks.ops import NORM_OPS, block_kernels
from notebook_ns import code_ns, outcome
block_kernels(NORM_OPS)  # as the harness does before any student code runs
ns = code_ns("01_layernorm", Path(sys.argv[1]).read_text())
for gid in sys.argv[2:]:
    msg = outcome(gid, ns)
    print("RESULT", gid, "passed" if msg is None else ("blocked" if "switched off" in msg else "failed"))
'''


@pytest.mark.layernorm
@pytest.mark.parametrize("name", ["native_group_norm", "aten_group_norm_unrecorded"])
def test_group_norm_cheats_lose_with_the_kernels_blocked(name):
    """The B fixtures, run in-process with the kernels blocked as in the sandbox: even with the op
    recorder switched off, the implementation checks fail because the kernel raises."""
    from tools.fixture_class import read_code_fixture
    fx = read_code_fixture(ROOT / "tests" / "fixtures" / "hostile" / f"{name}.py")
    proc = subprocess.run([sys.executable, "-c", BLOCKED_FIXTURE, str(ROOT / "tests" / "fixtures" / "hostile" / f"{name}.py"),
                           *fx["loses"]], capture_output=True, text=True, cwd=ROOT,
                          env=dict(venv_env(), OMP_NUM_THREADS="1"), timeout=600)
    results = dict(line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("RESULT"))
    assert set(results) == set(fx["loses"]), proc.stdout[-2000:] + proc.stderr[-2000:]
    assert set(results.values()) == {"blocked"}, results
