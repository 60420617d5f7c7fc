"""The observers inside the sandbox (autograder/inside/observers.py), in a plain process with
IPython's shell as the harness runs cells: what the audit hook attributes to the student's code and
what it leaves alone, the identity checks, the nonce, and thread starts."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from course.release import ROOT, venv_env

pytestmark = pytest.mark.autograder

SCRIPT = r"""
import json, sys
sys.path.insert(0, %(inside)r)
import torch
import coursekit.checks as checks
checks.load_all()
from coursekit.checks.ops import block_kernels
blocked = block_kernels(["layer_norm", "native_layer_norm"])
import observers
obs = observers.install(blocked)
class _Relay:  # as the harness does, its own stdout wrapper, a class of a script run as __main__
    def __init__(self, out): self.out = out
    def write(self, s): return self.out.write(s)
    def flush(self): self.out.flush()
    def __getattr__(self, name): return getattr(self.out, name)
sys.stdout, sys.stderr = _Relay(sys.stdout), _Relay(sys.stderr)  # a Thread keeps sys.stderr
from IPython.core.interactiveshell import InteractiveShell
shell = InteractiveShell.instance(colors="NoColor")
shell.user_ns["torch"] = torch
out = {}
import threading
from coursekit.checks import threads
out["history_thread"] = any(t.name == "IPythonHistorySavingThread" for t in threading.enumerate())
out["after_setup"] = threads.foreign_threads()

def cell(label, src):
    obs.cell(label)
    r = shell.run_cell(src, store_history=False)
    out[label] = {"events": obs.cell_report(), "error": repr(r.error_in_exec or r.error_before_exec or "")}

cell("honest", "import collections, dataclasses, logging\nP = collections.namedtuple('P', 'a b')\n"
     "@dataclasses.dataclass\nclass C:\n    x: int = 1\nlogging.getLogger('x').warning('hi')\n"
     "f = torch.compile(lambda t: t * 2 + 1)\ny = f(torch.randn(4))\nimport numpy as np")
cell("reflective", "import gc\n_ = len(gc.get_objects())\nfr = torch.sys._getframe(0)\n"
     "def g(): pass\nc = g.__code__\nexec('z = 1')")
cell("thread", "import logging.handlers, queue\nL = logging.handlers.QueueListener(queue.Queue())\nL.start()")
from coursekit.checks import threads
out["student_thread"] = [v for v in threads.STARTED.values()]
out["foreign"] = threads.foreign_threads()
shell.run_cell("L.stop()", store_history=False)
# torch's op records switched off in another thread, by a name the review cannot read; switched on
cell("records_on", "torch.autograd._enable_record_function(True)")
cell("records_off", "import threading\nf = getattr(torch._C._autograd, '_enable_' + 'record_function')\n"
     "t = threading.Thread(target=lambda: f(False))\nt.start()\nt.join()")
out["records_wrapped"] = torch.autograd._enable_record_function is torch._C._autograd._enable_record_function \
    and torch.autograd._enable_record_function.__module__ == "observers"
# a probe: nothing wrong, then an event during it, then a guard released in a cell
out["clean_start"] = obs.probe_start("t1")
out["clean_end"] = obs.probe_end(12345)
shell.run_cell("def fwd():\n    return torch.sys._getframe(1)", store_history=False)
obs.probe_start("t2")
shell.user_ns["fwd"]()
out["event_end"] = obs.probe_end(7)
cell("release", "import coursekit.checks.ops as _o\n[h.release() for h in list(_o._ACTIVE)]\n"
     "import coursekit.checks as _c\n_c.OpRecorder = object")
out["broken_start"] = obs.probe_start("t3")
print("RESULT" + json.dumps(out))
"""


@pytest.fixture(scope="module")
def seen():
    code = SCRIPT % {"inside": str(ROOT / "autograder" / "inside")}
    # the sandbox's environment: torch.compile runs eagerly there (autograder/sandbox/bwrap.py), so no
    # inductor module, written into /tmp, is loaded for the observers to name
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env=dict(venv_env(), OMP_NUM_THREADS="1", TORCH_COMPILE_DISABLE="1"))
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT")), None)
    assert line, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads(line[len("RESULT"):])


def test_honest_code_torch_compile_and_the_stdlib_raise_nothing(seen):
    assert seen["honest"]["events"] == [], seen["honest"]
    assert seen["honest"]["error"] == "''", seen["honest"]


def test_the_students_reflection_is_named_with_its_cell_and_line(seen):
    ev = " | ".join(seen["reflective"]["events"])
    for what in ("gc.get_objects", "sys._getframe", "object.__getattr__ function.__code__", "exec"):
        assert what in ev, ev
    assert "(reflective, line 2)" in ev, ev


def test_a_thread_the_harness_started_before_any_cell_is_not_the_students(tmp_path):
    """IPython's history thread starts with the shell, before any cell, whenever it has a home to write
    its history to (the grader with --no-sandbox): it is the harness's. It was named the student's on
    every row (the seventeenth red team), since the harness, run as a script, defines its classes in
    ``__main__``, where a notebook's live."""
    code = SCRIPT % {"inside": str(ROOT / "autograder" / "inside")}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env=dict(venv_env(), OMP_NUM_THREADS="1", TORCH_COMPILE_DISABLE="1", HOME=str(tmp_path)))
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT")), None)
    assert line, proc.stdout[-2000:] + proc.stderr[-3000:]
    out = json.loads(line[len("RESULT"):])
    assert out["history_thread"] is True
    assert out["after_setup"] == [], out["after_setup"]
    assert True in out["student_thread"] and out["foreign"], out


def test_a_thread_the_student_started_is_known_as_theirs(seen):
    assert True in seen["student_thread"] and seen["foreign"], seen


def test_switching_torchs_op_records_off_in_any_thread_is_the_students_event(seen):
    """torch.autograd._enable_record_function(False) is thread-local: a thread that calls it hides its
    own autograd from the profiler exercise 05 reads in every thread, so the call is an event (named
    with its cell and line); switching them on is not."""
    assert seen["records_wrapped"] is True
    assert seen["records_on"]["events"] == [], seen["records_on"]
    ev = " | ".join(seen["records_off"]["events"])
    assert "torch.autograd._enable_record_function (switches torch's op records off) (records_off, line 3)" in ev, ev


def test_a_probe_reports_events_guards_and_the_nonce(seen):
    assert seen["clean_start"] == [] and seen["clean_end"] == {"events": [], "problems": [], "nonce": 12345}
    assert seen["event_end"]["nonce"] == 7 and any("sys._getframe" in e for e in seen["event_end"]["events"])
    problems = " | ".join(seen["broken_start"])
    assert "OpRecorder was replaced" in problems and "was released" in problems, problems
