"""The benchmarks' device choice (coursekit.bench.bench_config) and what depends on it, testable
without a GPU: sizes and dtype per device, the CPU report's text, the torch.compile row when it
cannot compile, the GPU replies' comparison, and the sandbox's NVIDIA binds (from fake device
files). What needs a real GPU (timings, bfloat16 drift over chained calls, the driver inside the
sandbox) is not tested here."""
from __future__ import annotations

import resource
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")

import pytest
import torch
from torch import nn

from coursekit import bench, contract
from coursekit.checks import CheckFailed
from coursekit.checks import benchmark as bm
from coursekit.checks import served as sv


# -- device, dtype and sizes ------------------------------------------------------------------

def test_cpu_config_is_float32_small_one_thread_no_compile():
    cfg = bench.bench_config("cpu")
    assert (cfg.kind, cfg.dtype, cfg.threads, cfg.compile) == ("cpu", torch.float32, 1, False)
    assert cfg.sizes("norm")["input"] == contract.NORM_SHAPE
    assert cfg.sizes("residual") == {"input": contract.RES_SHAPE, "d": contract.RES_D}
    assert cfg.sizes("transformer_block") == {"input": contract.TB_SHAPE, "d": contract.TB_SHAPE[-1],
                                              "heads": contract.TB_H, "d_ff": contract.TB_FF}
    assert cfg.no_compile == bench.NO_COMPILE_ON_CPU


def test_cuda_config_is_bfloat16_at_transformer_sizes_with_compile():
    cfg = bench.bench_config("cuda")  # the settings only: no GPU needed to ask
    assert (cfg.kind, cfg.dtype, cfg.threads, cfg.compile, cfg.no_compile) == ("cuda", torch.bfloat16, None, True, None)
    shape = cfg.sizes("norm")["input"]
    assert shape[-1] == 4096 and torch.Size(shape).numel() // shape[-1] == 16384  # 16384 rows x 4096
    res, tb = cfg.sizes("residual"), cfg.sizes("transformer_block")
    assert res["input"][-1] == res["d"] and tb["input"][-1] == tb["d"] and tb["d"] % tb["heads"] == 0
    assert "synchronized CUDA events" in cfg.clock and "GPU numbers" in cfg.header()


def test_every_benchmark_has_a_workload_per_device():
    for gid in bm.TYPICAL:
        assert bm.workload(gid, "cpu")["input"] == bm.SHAPES[gid]  # the CPU sizes are unchanged
        assert bm.workload(gid, "cuda") == contract.BENCH_SIZES["cuda"][bm.WORKLOAD[gid]]


def test_default_device_decides_for_everyone(monkeypatch):
    from autograder.referee.clock import served_device
    assert bench.default_device().type == served_device() == ("cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert bench.default_device().type == served_device() == "cuda"


def test_other_devices_are_refused():
    with pytest.raises(ValueError):
        bench.bench_config("meta")


def test_cpu_inputs_are_the_ones_before_the_gpu_path():
    g = torch.Generator().manual_seed(3)
    before = torch.randn(*contract.NORM_SHAPE, generator=g).mul_(1.5).add_(0.5)
    assert torch.equal(bm._input(contract.NORM_SHAPE, 3), before)
    assert torch.equal(sv.SERVED["layernorm_benchmark"].x(3), before)
    assert torch.equal(sv.SERVED["layernorm_benchmark"].x(3, bench.bench_config("cpu")), before)


from test_bench import work  # noqa: E402 -- the count records, one place

# -- the report ---------------------------------------------------------------------------------

def _record(gid="layernorm_benchmark", kind="cpu", ratio=2.0, extra=None, unavailable=None, per_item=0):
    shape = list(bm.workload(gid, kind)["input"])
    times = {"yours": [ratio * 1e-4] * bm.REPEAT, "torch": [1e-4] * bm.REPEAT, **(extra or {})}
    return {"grade_id": gid, "device": "cpu" if kind == "cpu" else "NVIDIA Test GPU", "device_type": kind,
            "shape": shape, "dtype": "float32" if kind == "cpu" else "bfloat16",
            "bytes": 4 * torch.Size(shape).numel(), "times": times, "copy": 5e-5, "ops": [],
            "threads": 1 if kind == "cpu" else None, "unavailable": unavailable or {}, "notes": [],
            "y": torch.zeros(shape) if kind == "cpu" else torch.zeros(torch.Size(shape)[:-1].numel()),
            "y_shape": shape, "work": work(gid, per_item)}


def test_cpu_report_says_these_are_cpu_numbers(capsys):
    out = _record("transformer_block_benchmark")
    bm._judge(out, None, "TransformerBlock", "nn.TransformerEncoderLayer", "transformer_block_benchmark")
    text = capsys.readouterr().out
    assert "CPU numbers (float32, 1 thread" in text and "GPU figures" in text and "need a machine with a CUDA GPU" in text
    assert bench.COLUMNS in text and bench.NO_COMPILE_ON_CPU in text
    assert not any(line.startswith("torch.compile  ") for line in text.splitlines())  # no compile row on the CPU


def test_gpu_report_shows_compile_row_and_judges_against_eager(capsys):
    gid = "transformer_block_benchmark"
    fast = {"torch.compile": [1e-6] * bm.REPEAT}  # compiled torch 100x faster: no matter
    bm._judge(_record(gid, "cuda", 2.0, fast), None, "TransformerBlock", "nn.TransformerEncoderLayer", gid)
    text = capsys.readouterr().out
    assert "GPU numbers (NVIDIA Test GPU, bfloat16" in text and "CPU numbers" not in text
    assert "torch.compile" in text and "yours / nn.TransformerEncoderLayer: 2.00x" in text
    bm._judge(_record(gid, "cuda", bm.TYPICAL[gid] * 2, fast), None, "TransformerBlock",
              "nn.TransformerEncoderLayer", gid)  # slow on the clock, vectorized by the count: passes
    with pytest.raises(CheckFailed, match="Python loop"):
        bm._judge(_record(gid, "cuda", 1.0, fast, per_item=1), None, "TransformerBlock",
                  "nn.TransformerEncoderLayer", gid)


def test_a_gpu_record_with_the_cpu_shape_is_refused():
    out = _record("transformer_block_benchmark", "cuda")
    out["shape"] = list(contract.TB_SHAPE)
    with pytest.raises(CheckFailed, match="expected"):
        bm._judge(out, None, "TransformerBlock", "nn.TransformerEncoderLayer", "transformer_block_benchmark")


def test_a_gpu_benchmark_record_fits_the_wire_and_its_output_is_judged_row_by_row():
    """At the GPU sizes a norm's whole output (16384 x 4096) is over the wire's limit on one record,
    which failed the course's own solution on an H100: the record carries one number per row
    (served.reply's projection, drawn on the CPU so any device gives the same), and the judge
    projects torch's output the same way."""
    from coursekit.checks import wire
    gid = "layernorm_benchmark"
    cfg = bench.bench_config("cuda")
    shape = list(bm.workload(gid, "cuda")["input"])
    want = torch.randn(shape)
    with pytest.raises(wire.WireError, match="too large"):
        wire.pack_value({"y": want})  # the record's old layout
    out = _record(gid, "cuda")
    out["y"] = bm._reply(want.to(torch.bfloat16), cfg)
    assert out["y"].shape == (torch.Size(shape)[:-1].numel(),)
    wire.pack_value(out)
    bm._judge(out, want, "LayerNorm", "torch.nn.LayerNorm", gid)  # bfloat16 rounding passes
    out["y"] = bm._reply((want * 1.5).to(torch.bfloat16), cfg)
    with pytest.raises(CheckFailed, match="differs from torch"):
        bm._judge(out, want, "LayerNorm", "torch.nn.LayerNorm", gid)
    out["y_shape"] = shape[:-1]
    with pytest.raises(CheckFailed, match="has shape"):
        bm._judge(out, want, "LayerNorm", "torch.nn.LayerNorm", gid)
    tb = _record("transformer_block_benchmark", "cuda")  # no output to compare: one number per row still
    tb["y"] = torch.zeros(3)
    with pytest.raises(CheckFailed, match="one number per row"):
        bm._judge(tb, None, "TransformerBlock", "nn.TransformerEncoderLayer", "transformer_block_benchmark")


def test_format_table_marks_unavailable_rows():
    rows = bench.summarize({"yours": [2e-4], "torch": [1e-4]}, 1 << 20, 5e-5, "cpu")
    table = bench.format_table(rows, unavailable={"torch.compile": "no compiler"}, legend=True)
    assert "torch.compile" in table and "unavailable" in table and "no compiler" in table
    assert table.endswith(bench.COLUMNS)


# -- torch.compile unavailable ------------------------------------------------------------------

def _no_compiler(*args, **kwargs):
    raise RuntimeError("InvalidCxxCompiler: no working C++ compiler found")


def test_compiled_reports_why_when_torch_compile_raises(monkeypatch):
    monkeypatch.setattr(torch, "compile", _no_compiler)
    fast, why = bench.compiled(nn.LayerNorm(8), torch.randn(4, 8))
    assert fast is None and "RuntimeError" in why and "no working C++ compiler" in why


def test_compiled_reports_why_when_the_first_call_fails(monkeypatch):
    def lazy(m):  # torch.compile itself returns; the compiler fails on the first call
        def call(x):
            raise RuntimeError("BackendCompilerFailed")
        return call
    monkeypatch.setattr(torch, "compile", lazy)
    fast, why = bench.compiled(nn.LayerNorm(8), torch.randn(4, 8))
    assert fast is None and "BackendCompilerFailed" in why


def _compile_cfg():
    """The CPU's settings with the compile row switched on: the GPU's code path, run on the CPU."""
    cpu = bench.bench_config("cpu")
    return bench.BenchConfig(cpu.device, cpu.dtype, True, 1, cpu.clock, "cpu")


def test_unavailable_compile_costs_the_student_nothing(monkeypatch, capsys):
    monkeypatch.setattr(torch, "compile", _no_compiler)
    monkeypatch.setattr(bm, "REPEAT", 3)
    monkeypatch.setattr(bm, "ROUNDS", (3,))
    d = contract.NORM_SHAPE[-1]
    x = bm._input(contract.NORM_SHAPE, 0)
    mods = {"yours": nn.LayerNorm(d), "torch": nn.LayerNorm(d)}
    for m in mods.values():
        bm.set_params(m, bm._bench_params("LayerNorm", d), "LayerNorm")
    out = bm._run("layernorm_benchmark", mods, x, "LayerNorm", {"LayerNorm": nn.LayerNorm}, cfg=_compile_cfg())
    assert set(out["times"]) == {"yours", "torch"} and "no working C++ compiler" in out["unavailable"]["torch.compile"]
    bm.LayerNormBenchmark.judge(out)  # passes: same module on both sides
    text = capsys.readouterr().out
    assert "unavailable" in text and "no working C++ compiler" in text


def test_a_compiled_row_is_timed_beside_eager(monkeypatch):
    monkeypatch.setattr(torch, "compile", lambda m: m)  # "compiles" to itself
    monkeypatch.setattr(bm, "REPEAT", 3)
    monkeypatch.setattr(bm, "ROUNDS", (3,))
    x = torch.randn(16, 8)
    out = bm._run("layernorm_benchmark", {"yours": nn.LayerNorm(8), "torch": nn.LayerNorm(8)}, x, "LayerNorm",
                  {"LayerNorm": nn.LayerNorm}, cfg=_compile_cfg())
    assert set(out["times"]) == {"yours", "torch", "torch.compile"} and out["unavailable"] == {}


# -- the served benchmark on a GPU: the replies and their comparison ---------------------------

def test_cpu_reply_is_the_whole_output():
    y = torch.randn(3, 5)
    assert sv.reply(y, 7) is y and sv.reply(y, 7, bench.bench_config("cpu")) is y


def test_gpu_reply_is_one_number_per_row_from_the_seed():
    cfg = bench.bench_config("cuda")  # reply() runs on y's device: a CPU tensor works here
    y = torch.randn(2, 6, 16)
    r = sv.reply(y, 7, cfg)
    assert r.shape == (12,) and r.dtype == torch.float32 and torch.equal(r, sv.reply(y, 7, cfg))
    assert not torch.allclose(r, sv.reply(y, 8, cfg))  # another seed, another projection
    z = y.clone()
    z[1, 3, 0] += 1.0
    diff = (sv.reply(z, 7, cfg) - r).abs() > 1e-6
    assert diff.sum() == 1 and diff[9]  # every row counts, and only that row moved


def test_gpu_reply_comparison_tolerates_bfloat16_drift_and_nothing_more():
    want = torch.randn(16384)
    sv.expect_reply_close(want + 4e-3 * want.abs().mean() * torch.randn(16384), want, "LayerNorm", "cuda")
    for bad, msg in ((want.roll(1), "differs"), (torch.zeros(16384), "differs"), (want[:-1], "shape"),
                     (torch.full((16384,), float("nan")), "nan")):
        with pytest.raises(CheckFailed, match=msg):
            sv.expect_reply_close(bad, want, "LayerNorm", "cuda")
    with pytest.raises(CheckFailed):  # the CPU's stays elementwise and tight
        sv.expect_reply_close(want + 1e-2, want, "LayerNorm", "cpu")


def _served_out(kind, ratio, unavailable=None, compile_s=None):
    times = {"yours": [ratio * 1e-4] * 9, "torch": [1e-4] * 9}
    if compile_s:
        times["torch.compile"] = [compile_s] * 9
    out = {"grade_id": "rmsnorm_benchmark", "times": times, "bytes": 1 << 20, "copy": 5e-5, "rounds": 9,
           "allowance": 1e-4, "ping_s": 1e-4, "k": 10, "k_torch": 10,
           "full": {"ops": 7, "lines": 200, "hot": 1, "lost": 0, "shape": [4, 256, 128], "k": 10, "call": 3}}  # one timed call, counted
    if kind == "cuda":
        out.update(device_type="cuda", device="NVIDIA Test GPU", dtype="bfloat16", unavailable=unavailable or {})
    return out


def test_served_report_cpu_unchanged_in_verdict(capsys):
    flat = work("rmsnorm_benchmark")
    sv.served_report(_served_out("cpu", 3.0), flat)  # an old record, without the device keys
    text = capsys.readouterr().out
    assert "1 thread" in text and "CPU numbers" in text and "yours / torch.nn.RMSNorm: 3.00x" in text
    sv.served_report(_served_out("cpu", bm.TYPICAL["rmsnorm_benchmark"] * 10), flat)  # the clock never decides
    with pytest.raises(CheckFailed, match="Python loop"):
        sv.served_report(_served_out("cpu", 1.0), work("rmsnorm_benchmark", 1))
    with pytest.raises(CheckFailed, match="missing or malformed"):
        sv.served_report(_served_out("cpu", 1.0), None)


def test_served_report_on_gpu(capsys):
    flat = work("rmsnorm_benchmark")
    sv.served_report(_served_out("cuda", 3.0, {"torch.compile": "torch.compile failed here (no Triton)"}), flat)
    text = capsys.readouterr().out
    assert "GPU numbers (NVIDIA Test GPU, bfloat16" in text and "no Triton" in text and "unavailable" in text
    sv.served_report(_served_out("cuda", 3.0, compile_s=1e-6), flat)  # a fast compiled torch: shown, never judged
    with pytest.raises(CheckFailed):
        sv.served_report(_served_out("cuda", 1.0), work("rmsnorm_benchmark", 1))


def test_rounds_are_longer_on_a_gpu():
    from autograder.referee import clock as outside
    assert outside._next_k(10, 0.05, 1e-5, "cpu") == outside.MAX_K["cpu"]
    assert outside._next_k(10, 0.3, 1e-3, "cuda") == int(outside.TARGET_S["cuda"] / 1e-3)
    assert outside._next_k(10, 0.3, 1e-7, "cuda") == outside.MAX_K["cuda"]


# -- the sandbox: NVIDIA device files only when the benchmarks run on a GPU ---------------------

def _fake_dev(tmp_path, names=("nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset", "null")):
    dev = tmp_path / "dev"
    dev.mkdir()
    for n in names:
        (dev / n).touch()
    (dev / "dri").mkdir()
    return dev


def _dev_binds(argv):
    return [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == "--dev-bind"]


def test_bwrap_binds_the_nvidia_devices_that_exist(tmp_path):
    from autograder.sandbox.bwrap import Limits, bwrap_argv
    dev = _fake_dev(tmp_path)
    argv = bwrap_argv(Limits(), gpu=True, dev_root=dev)
    want = {f"/dev/{n}" for n in ("nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset", "dri")}
    binds = _dev_binds(argv)
    assert {dst for _, dst in binds} == want and all(src == str(dev / dst[5:]) for src, dst in binds)
    assert argv.index("--dev-bind") > argv.index("--dev")  # after the fresh /dev, before it turns read-only
    assert argv.index("--dev-bind") < argv.index("--remount-ro")


def test_bwrap_binds_only_what_exists(tmp_path):
    from autograder.sandbox.bwrap import Limits, bwrap_argv
    dev = _fake_dev(tmp_path, names=("nvidia0", "nvidiactl"))
    assert {dst for _, dst in _dev_binds(bwrap_argv(Limits(), gpu=True, dev_root=dev))} == {
        "/dev/nvidia0", "/dev/nvidiactl", "/dev/dri"}
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _dev_binds(bwrap_argv(Limits(), gpu=True, dev_root=empty)) == []


def test_no_gpu_no_nvidia_binds(tmp_path):
    from autograder.sandbox.bwrap import Limits, bwrap_argv
    dev = _fake_dev(tmp_path)
    for argv in (bwrap_argv(Limits(), dev_root=dev), bwrap_argv(Limits(), gpu=False, dev_root=dev), bwrap_argv(Limits())):
        assert "--dev-bind" not in argv and "LD_LIBRARY_PATH" not in argv


def test_driver_libraries_outside_usr_are_bound(tmp_path, monkeypatch):
    from autograder.sandbox.bwrap import Limits, bwrap_argv, gpu_library_dirs
    lib = tmp_path / "nvidia" / "lib64"
    lib.mkdir(parents=True)
    (lib / "libcuda.so.1").touch()
    other = tmp_path / "other"
    other.mkdir()
    assert gpu_library_dirs(f"{lib}:{other}:/usr/lib/x86_64-linux-gnu") == [str(lib.resolve())]
    monkeypatch.setenv("LD_LIBRARY_PATH", f"{lib}:{other}")
    argv = bwrap_argv(Limits(), gpu=True, dev_root=tmp_path)
    i = argv.index("LD_LIBRARY_PATH")
    assert argv[i - 1] == "--setenv" and argv[i + 1] == str(lib.resolve())
    assert any(argv[j] == "--ro-bind" and argv[j + 2] == str(lib.resolve()) for j in range(len(argv) - 2))
    assert "LD_LIBRARY_PATH" not in bwrap_argv(Limits(), gpu=False)


@pytest.mark.parametrize("gpu", [False, True])
def test_memory_limit_is_on_data_with_a_gpu(gpu):
    """cuInit fails under an address-space limit: with a GPU the limit is on data instead."""
    from autograder.sandbox.bwrap import Limits, _preexec
    lim = Limits(memory_mb=3000)
    code = ("import resource as r; print(r.getrlimit(r.RLIMIT_AS)[0], r.getrlimit(r.RLIMIT_DATA)[0])")
    before = resource.getrlimit(resource.RLIMIT_AS)[0], resource.getrlimit(resource.RLIMIT_DATA)[0]
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         preexec_fn=_preexec(lim, 10_000, None, [], gpu))
    as_, data = map(int, res.stdout.split())
    if gpu:
        assert (as_, data) == (before[0], 3000 << 20)
    else:
        assert (as_, data) == (3000 << 20, before[1])


# -- the notebooks say it ---------------------------------------------------------------------

def test_every_benchmark_markdown_says_where_it_runs_and_what_the_columns_mean():
    """One text (coursekit.bench.NOTEBOOK_MARKDOWN) ends the benchmark markdown of every notebook."""
    import glob
    import json
    from pathlib import Path
    root = Path(__file__).resolve().parent.parent
    notebooks = sorted(glob.glob(str(root / "solutions" / "0*" / "*.ipynb")) +
                       glob.glob(str(root / "exercises" / "0*" / "*.ipynb")))
    assert notebooks
    for path in notebooks:
        cells = json.loads(Path(path).read_text())["cells"]
        md = [("".join(c["source"])) for c in cells
              if c["cell_type"] == "markdown" and "".join(c["source"]).startswith("## Benchmark")]
        benches = [c for c in cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id", "") in bm.TYPICAL]
        if not benches:
            continue
        assert len(md) == 1, path
        if benches[0]["metadata"]["nbgrader"]["grade_id"] in ("backward_benchmark", "streams_benchmark"):
            # exercises 05 and 06 time a forward + backward (05's bandwidth counts 9 passes, 06 times two
            # workloads beside a pre-norm residual and a softmax): their own text
            text = " ".join(md[0].split())
            assert all(w in text for w in ("runs on CUDA when a GPU is", "CUDA events", "torch.compile",
                                           "on the CPU otherwise", "CPU numbers")), path
        else:
            assert md[0].endswith(bench.NOTEBOOK_MARKDOWN), path


def test_feedback_detail_names_the_device():
    from autograder.referee.judge import _served_detail
    assert _served_detail(_served_out("cpu", 2.0))["device"] == "cpu, 1 thread, timed by the grader"
    assert _served_detail(_served_out("cuda", 2.0))["device"] == "NVIDIA Test GPU (bfloat16), timed by the grader"
