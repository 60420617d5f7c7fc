"""What only a GPU can check, in one run: ``python -m tools.gpu_check --out DIR``.

The suite runs on CPU machines; this is the device check to run wherever a CUDA GPU is lent
(``torch.cuda.is_available()``). It needs torch, numpy, matplotlib and (for the kernels) Triton,
nothing of nbgrader's, so it runs on a bare GPU image with the repository on ``PYTHONPATH``.

1. **Every exercise, reference solution, on CUDA.** Each solution notebook's code cells (setup,
   answers, every test cell with its hidden tests) run in order in one namespace, as in the
   instructor's kernel. The benchmark cells then time on the GPU (bfloat16 at the GPU sizes, CUDA
   events, the ``torch.compile`` column). Every test must pass.
2. **The Triton fused add + RMSNorm** (``book/experiments/triton_add_rmsnorm.py``) compiled for the
   GPU, not interpreted: outputs and gradients against float64 autograd on the same cases as
   ``tests/test_triton_add_rmsnorm.py``, then its benchmark (eager ``x + r`` + ``F.rms_norm``
   against the fused kernels, and torch.compile of the eager pair).
3. **LayerNorm against RMSNorm, eager, on the GPU**: torch's own ops at the benchmark's size, for
   the chapter on RMSNorm's cost.

Writes ``gpu_check.json`` (every figure, the device, torch's and Triton's versions) and
``gpu_check.txt`` (the notebooks' printed output) to ``--out``; exits 1 if a test failed.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import platform
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def notebook_cells(path: Path) -> list[tuple[str | None, str]]:
    """(grade id or None, source) of each code cell, read as plain JSON (no nbformat needed)."""
    nb = json.loads(path.read_text())
    out = []
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        meta = cell.get("metadata", {}).get("nbgrader", {})
        out.append((meta.get("grade_id") if meta.get("grade") else None, src))
    return out


def run_solution(path: Path) -> dict:
    """Run one solution notebook top to bottom; each test cell's outcome and printed output."""
    import matplotlib
    matplotlib.use("Agg")
    ns: dict = {"__name__": "__main__"}
    tests, printed = {}, []
    for gid, src in notebook_cells(path):
        if src.lstrip().startswith("%"):
            continue  # a magic line: nothing a test needs
        buf = io.StringIO()
        t0 = time.perf_counter()
        try:
            with contextlib.redirect_stdout(buf):
                exec(compile(src, f"<{path.name}:{gid or 'cell'}>", "exec"), ns)
            ok, err = True, None
        except BaseException as e:  # noqa: BLE001 -- report every failure, go on
            ok, err = False, "".join(traceback.format_exception_only(type(e), e)).strip()
        seconds = time.perf_counter() - t0
        if gid:
            tests[gid] = {"passed": ok, "error": err, "seconds": round(seconds, 2)}
        elif not ok:
            tests[f"(cell) {src.splitlines()[0][:60]}"] = {"passed": False, "error": err}
        printed.append(f"--- {path.name} {gid or ''} ({'ok' if ok else 'FAILED'}, {seconds:.1f} s)\n"
                       f"{buf.getvalue()}{err or ''}")
    return {"tests": tests, "printed": "\n".join(printed)}


def triton_checks() -> dict:
    """The Triton kernels on CUDA against float64 autograd, then their benchmark."""
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, str(ROOT / "tests"))
    from test_triton_add_rmsnorm import CASES, TOL
    from book.experiments import triton_add_rmsnorm as tk

    out = {"cases": {}}
    for k, (name, shape, dtype, scale, eps, grads) in enumerate(CASES):
        dt = getattr(torch, dtype)
        g = torch.Generator().manual_seed(k)
        x = (torch.randn(shape, generator=g) * scale).to(dt)
        r = (torch.randn(shape, generator=g) * scale).to(dt)
        if name.startswith("tiny"):
            r[0] = -x[0]  # mean(h**2) = 0 on that row: eps decides rstd
        w = (1 + 0.5 * torch.randn(shape[-1], generator=g)).to(dt)
        gy = torch.randn(shape, generator=g).to(dt)
        gh = torch.randn(shape, generator=g).to(dt) if grads == "y,h" else None
        x, r, w, gy = (t.cuda() for t in (x, r, w, gy))
        gh = gh.cuda() if gh is not None else None
        # float64 autograd on the same rounded inputs: y = h / sqrt(mean(h^2) + eps) * w
        xr, rr, wr = (t.double().requires_grad_() for t in (x, r, w))
        hr = xr + rr
        yr = F.rms_norm(hr, (shape[-1],), wr, eps)
        xt, rt, wt = (t.clone().requires_grad_() for t in (x, r, w))
        y, h = tk.fused_add_rmsnorm(xt, rt, wt, eps)
        if gh is not None:
            torch.autograd.backward((yr, hr), (gy.double(), gh.double()))
            torch.autograd.backward((y, h), (gy, gh))
        else:
            torch.autograd.backward(yr, gy.double())
            torch.autograd.backward(y, gy)
        errs = {}
        for key, got, ref in (("y", y, yr), ("h", h, hr), ("dx", xt.grad, xr.grad),
                              ("dresidual", rt.grad, rr.grad), ("dw", wt.grad, wr.grad)):
            ref = ref.detach()
            errs[key] = float((got.detach().double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
        tol = TOL[dtype]
        # compiled Triton rounds float32 -> bfloat16 to nearest even, as torch does: h has the
        # same bits as torch's x + r in every dtype here (the interpreter truncates; see the test)
        h_bits = bool(torch.equal(h.detach(), x + r))
        out["cases"][name] = {"rel_err": errs, "tol": tol, "h_bits_equal_torch": h_bits,
                              "passed": all(e < tol for e in errs.values()) and h_bits}
    out["benchmark"] = tk.benchmark()
    return out


def norm_cost() -> dict:
    """Eager F.layer_norm against F.rms_norm on the GPU, bfloat16 16384 x 4096, CUDA events."""
    import torch
    import torch.nn.functional as F
    x = torch.randn(16384, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(4096, device="cuda", dtype=torch.bfloat16)
    b = torch.zeros(4096, device="cuda", dtype=torch.bfloat16)
    fns = {"layer_norm": lambda: F.layer_norm(x, (4096,), w, b, 1e-5),
           "rms_norm": lambda: F.rms_norm(x, (4096,), w, 1e-6),
           "copy": lambda: x.clone()}
    res = {}
    for name, fn in fns.items():
        for _ in range(10):
            fn()
        times = []
        for _ in range(30):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            s.record()
            for _ in range(20):
                fn()
            e.record()
            torch.cuda.synchronize()
            times.append(s.elapsed_time(e) / 20)
        times.sort()
        res[name] = {"fastest_ms": round(times[0], 4), "median_ms": round(times[len(times) // 2], 4)}
    gb = 2 * x.numel() * x.element_size() / 1e9  # read x, write y
    for name in res:
        res[name]["GB/s"] = round(gb / (res[name]["fastest_ms"] / 1e3), 1)
    return res


def wrong_fixture_benchmark(path: Path) -> dict:
    """A wrong fixture (``tests/fixtures/wrong``) whose ``loses:`` names a benchmark, run on CUDA:
    its code, then that benchmark's test cell. It must fail there as on the CPU."""
    import re
    import matplotlib
    matplotlib.use("Agg")
    code = path.read_text()
    gids = [g for g in re.search(r"^loses:(.*)$", code, re.M).group(1).split() if g.endswith("_benchmark")]
    ns: dict = {"__name__": "__main__"}
    exec("import torch\nfrom torch import nn\nimport torch.nn.functional as F\nfrom coursekit import run", ns)
    exec(compile(code, str(path), "exec"), ns)
    out = {}
    for gid in gids:
        buf = io.StringIO()
        t0 = time.perf_counter()
        try:
            with contextlib.redirect_stdout(buf):
                ns["run"](gid, ns)
            out[gid] = {"failed": False}
        except BaseException as e:  # noqa: BLE001
            out[gid] = {"failed": True, "message": str(e)[:600]}
        out[gid].update(seconds=round(time.perf_counter() - t0, 1), printed=buf.getvalue()[-1500:])
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--wrong", action="store_true", help="also the wrong fixtures that must fail a benchmark")
    ap.add_argument("--only", help="one assignment (e.g. 05_backward): its solution and wrong fixtures, "
                    "nothing else")
    ap.add_argument("--one", type=Path, help=argparse.SUPPRESS)  # a fixture, in a child process
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(wrong_fixture_benchmark(args.one)))
        return 0
    import torch
    if not torch.cuda.is_available():
        print("no CUDA GPU here: this check is for a machine with one", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "python": platform.python_version(), "exercises": {}}
    try:
        import triton
        report["triton"] = triton.__version__
    except ImportError:
        report["triton"] = None
    text = []
    for sol in sorted((ROOT / "solutions").glob(f"{args.only or '[0-9]*'}/*.ipynb")):
        t0 = time.perf_counter()
        res = run_solution(sol)
        report["exercises"][sol.parent.name] = {"tests": res["tests"],
                                                "seconds": round(time.perf_counter() - t0, 1)}
        text.append(res["printed"])
        print(sol.parent.name, {g: t["passed"] for g, t in res["tests"].items()}, flush=True)
    for name, fn in () if args.only else (("triton", triton_checks), ("norm_cost", norm_cost)):
        try:
            report[name] = fn()
        except Exception:  # noqa: BLE001 -- one part failing keeps the others' figures
            report[name] = {"error": traceback.format_exc()}
        print(name, json.dumps(report[name])[:2000], flush=True)
    if args.wrong:
        import subprocess
        report["wrong"] = {}
        for fx in sorted((ROOT / "tests" / "fixtures" / "wrong").glob(f"{args.only or '*'}/*.py")):
            if "_benchmark" not in (fx.read_text().split("loses:", 1) + [""])[1].split("\n", 1)[0]:
                continue
            try:
                proc = subprocess.run([sys.executable, "-m", "tools.gpu_check", "--out", str(args.out),
                                       "--one", str(fx)], capture_output=True, text=True, timeout=150, cwd=ROOT)
                res = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {
                    "error": proc.stderr[-1500:]}
            except subprocess.TimeoutExpired:
                res = {"error": "over 150 s"}
            report["wrong"][f"{fx.parent.name}/{fx.stem}"] = res
            print("wrong", fx.parent.name, fx.stem, json.dumps(
                {g: (v.get("failed"), v.get("seconds")) for g, v in res.items() if isinstance(v, dict)}
                if "error" not in res else res)[:600], flush=True)
    (args.out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    (args.out / "gpu_check.txt").write_text("\n".join(text))
    failed = [f"{a}/{g}" for a, e in report["exercises"].items() for g, t in e["tests"].items()
              if not t["passed"]]
    failed += [f"triton/{c}" for c, v in report.get("triton", {}).get("cases", {}).items() if not v["passed"]]
    failed += [f"wrong/{k}/{g} passed" for k, r in report.get("wrong", {}).items() for g, v in r.items()
               if isinstance(v, dict) and v.get("failed") is False]
    print("FAILED:" if failed else "all passed", failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
