"""The course's dispatch modes (the op recorder, the op counter, the autograd spy) start without
importing ``torch._dynamo`` (coursekit/checks/ops.py ``TorchDispatchMode``): a kernel's first check
no longer pays 3 to 4 s of CPU for it. Once dynamo is loaded they are what torch makes of a dispatch
mode: each one's ``__torch_dispatch__`` is then dynamo's disabled version of it (what torch's own
wrapper makes), and code compiled by a student still runs under them, every op seen."""
from __future__ import annotations

import json
import subprocess
import sys

from course.release import ROOT, venv_env

SCRIPT = r"""
import json, sys, time
import torch
from coursekit.checks.ops import OpRecorder
from coursekit.checks.scaling import _OpCount
from coursekit.checks.backward import _AutogradOpSpy
out = {}
t = time.process_time()
with OpRecorder() as rec:
    torch.nn.functional.layer_norm(torch.randn(2, 3), (3,))
with _OpCount() as count:
    torch.randn(4) * 2
with _AutogradOpSpy("f"):
    torch.randn(4) + 1
out["first_ops_cpu_s"] = time.process_time() - t
out["dynamo_loaded"] = "torch._dynamo" in sys.modules
import torch._dynamo
from coursekit.checks.ops import _DispatchSpy
out["disabled_once_loaded"] = {}
for cls in (_DispatchSpy, _OpCount, _AutogradOpSpy):
    held = cls.__dict__["__torch_dispatch__"].__wrapped__  # torch's wrapper -> the course's
    off = getattr(held, "__dynamo_disable")
    out["disabled_once_loaded"][cls.__name__] = bool(getattr(off, "_torchdynamo_disable", False)) and \
        off is getattr(held, "__dynamo_disable")  # made once
graphs = []
def backend(gm, example):
    graphs.append(gm)
    return gm.forward
f = torch.compile(lambda x: torch.nn.functional.layer_norm(x, (3,)) * 2 + 1, backend=backend)
with OpRecorder() as rec:
    f(torch.randn(2, 3))
out["graphs_under_the_recorder"] = len(graphs)
out["seen_under_the_recorder"] = sorted(rec.seen)
print(json.dumps(out))
"""


def _run(script: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT,
                          env=dict(venv_env(), OMP_NUM_THREADS="1"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_course_modes_import_no_dynamo_and_compiled_code_runs_eagerly_under_them():
    out = _run(SCRIPT)
    assert out["dynamo_loaded"] is False, out
    print(f"the first ops under the three modes: {out['first_ops_cpu_s']:.2f} s of CPU")  # information
    # once dynamo is loaded, each mode's dispatch is dynamo's disabled version, made once
    assert out["disabled_once_loaded"] == {"_DispatchSpy": True, "_OpCount": True, "_AutogradOpSpy": True}, out
    # and a student's compiled function runs under the recorder (dynamo compiles nothing while a
    # dispatch mode is on torch's stack), every op seen
    assert out["graphs_under_the_recorder"] == 0, out
    assert "native_layer_norm" in out["seen_under_the_recorder"], out
