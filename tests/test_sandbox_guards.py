"""Guards the harness sets up in the grading sandbox before any student code, each run in a fresh
interpreter (they last for the rest of the process):

* the kernel block, sealed (``coursekit.checks.ops.Blocked.seal``): no Python route lifts it,
  neither ``release()``, nor ``Library._destroy``, nor dropping every handle;
* torch's compilers refuse torch's transformer layers
  (``coursekit.checks.transformer.block_layer_compilers``) and compile anything else;
* the norm exercises' recorder sees the Python code of torch's own normalizations however it is
  reached (``coursekit.checks.ops._NormCodeWatch``), and a student's LayerNorm built from ordinary
  ops is not mistaken for it.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap

from course.release import ROOT, venv_env


def _run(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          cwd=ROOT, env=dict(venv_env(), OMP_NUM_THREADS="1"), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_a_sealed_kernel_block_outlives_release_destroy_and_dropped_handles():
    out = _run("""
        import gc, torch
        import torch.nn.functional as F
        from coursekit.checks import ops
        def runs():
            try:
                F.layer_norm(torch.randn(2, 4), (4,))
                return "runs"
            except RuntimeError as e:
                return "blocked" if "switched off" in str(e) else "other"
        h = ops.block_kernels(ops.NORM_OPS)
        print("before seal", runs())
        h.seal()
        h.release()
        print("after release", runs())
        for lib in h.libraries.values():
            lib._destroy()
        print("after destroy", runs())
        ops._ACTIVE.clear(); del h, lib; gc.collect()
        print("after drop", runs())
        h2 = ops.block_kernels(["layer_norm"]); h2.release()
        print("unsealed release", runs())
    """)
    assert out.split("\n")[:5] == ["before seal blocked", "after release blocked", "after destroy blocked",
                                   "after drop blocked", "unsealed release blocked"], out


def test_an_unsealed_block_still_lifts():
    out = _run("""
        import torch
        import torch.nn.functional as F
        from coursekit.checks import ops
        h = ops.block_kernels(["layer_norm", "native_layer_norm"])
        h.release()
        print(F.layer_norm(torch.ones(1, 2), (2,)).shape)
    """)
    assert "torch.Size([1, 2])" in out


def test_torchs_compilers_refuse_torchs_layers_and_compile_the_rest():
    out = _run("""
        import torch, torch._dynamo, torch.export, torch.fx
        from torch import nn
        from coursekit.checks.transformer import block_layer_compilers
        patched = block_layer_compilers()
        print("patched", len(patched))
        layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
        x = torch.randn(2, 3, 16)
        class Mine(nn.Module):
            def __init__(self):
                super().__init__()
                self.inner = layer
            def forward(self, x):
                return self.inner(x)
        tries = {"script": lambda: torch.jit.script(layer), "script of a holder": lambda: torch.jit.script(Mine()),
                 "script of forward": lambda: torch.jit.script(nn.TransformerEncoderLayer.forward),
                 "trace": lambda: torch.jit.trace(layer, x), "compile": lambda: torch.compile(layer),
                 "Module.compile": lambda: layer.compile(), "dynamo": lambda: torch._dynamo.optimize("eager")(layer),
                 "export": lambda: torch.export.export(layer, (x,)), "fx": lambda: torch.fx.symbolic_trace(layer),
                 "fx tracer": lambda: torch.fx.Tracer().trace(layer)}
        for name, f in tries.items():
            try:
                f()
                print(name, "ALLOWED")
            except RuntimeError as e:
                print(name, "refused" if "switched off while grading" in str(e) else "other " + str(e)[:80])
        lin = nn.Linear(4, 4)
        torch.jit.script(lin); torch.jit.trace(lin, torch.randn(2, 4)); torch.fx.symbolic_trace(lin)
        print("others compile")
    """)
    lines = dict(line.rsplit(" ", 1) for line in out.strip().splitlines() if line.endswith(("refused", "ALLOWED")))
    assert lines and all(v == "refused" for v in lines.values()), out
    assert "others compile" in out


def test_compiled_archives_do_not_load_whatever_they_hold():
    """The twelfth red team scripted torch's TransformerEncoderLayer elsewhere, embedded the saved
    archive in the notebook and loaded it with torch.jit.load: a module of no torch class whose
    forward runs in TorchScript's interpreter, unseen (13/18 unflagged). Every loader of a compiled
    archive is refused, whatever it holds (an nn.Linear here)."""
    out = _run("""
        import io, torch, torch.export
        from torch import nn
        buf = io.BytesIO()
        torch.jit.save(torch.jit.script(nn.Linear(4, 4)), buf)
        data = buf.getvalue()
        from coursekit.checks.transformer import block_layer_compilers
        block_layer_compilers()
        tries = {"jit.load": lambda: torch.jit.load(io.BytesIO(data)),
                 "torch.load": lambda: torch.load(io.BytesIO(data), weights_only=False),
                 "import_ir_module_from_buffer": lambda: torch._C.import_ir_module_from_buffer(
                     torch._C.CompilationUnit(), data, "cpu", {}, False),
                 "export.load": lambda: torch.export.load(io.BytesIO(data))}
        for name, f in tries.items():
            try:
                f()
                print(name, "ALLOWED")
            except Exception as e:
                print(name, "refused" if "switched off while grading" in str(e) else "other " + str(e)[:80])
        print("state_dict", torch.load(io.BytesIO(_b := (lambda b: (torch.save(nn.Linear(2, 2).state_dict(), b), b.getvalue())[1])(io.BytesIO()))).keys())
    """)
    lines = dict(line.rsplit(" ", 1) for line in out.strip().splitlines() if line.endswith(("refused", "ALLOWED")))
    assert len(lines) == 4 and all(v == "refused" for v in lines.values()), out
    assert "state_dict odict_keys(['weight', 'bias'])" in out, out  # a checkpoint of weights still loads


def test_the_recorder_sees_torchs_own_normalizations_however_reached_and_not_a_students():
    out = _run("""
        import pydoc, torch
        import torch._decomp
        from coursekit.checks.ops import OpRecorder
        x = torch.randn(2, 4)
        table = torch._decomp.decomposition_table
        key = next(k for k in table if str(k).startswith("aten.native_layer_norm.default"))
        routes = {"pydoc": lambda: pydoc.locate("torch._refs.native_layer_norm")(x, [4], None, None, 1e-5),
                  "table": lambda: table[key](x, [4], None, None, 1e-5),
                  "mine": lambda: (x - x.mean(-1, keepdim=True)) * torch.rsqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)}
        for name, f in routes.items():
            with OpRecorder() as rec:
                f()
            print(name, sorted(rec.seen & {"native_layer_norm", "layer_norm"}))
    """)
    assert "pydoc ['native_layer_norm']" in out and "table ['native_layer_norm']" in out, out
    assert "mine []" in out, out
