"""tools/gpu_check.py, the device check for a CUDA GPU, as far as a CPU machine can run it: it reads
the solution notebooks as plain JSON and runs one top to bottom (here on the CPU) with every test
passing, runs a wrong fixture's benchmark in its child mode (which must fail), and without CUDA it
refuses with exit 2 instead of reporting nothing."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from course.release import ROOT, venv_env
from tools import gpu_check


def test_a_solution_runs_top_to_bottom_with_every_test_passing():
    res = gpu_check.run_solution(ROOT / "solutions" / "02_rmsnorm" / "rmsnorm.ipynb")
    assert res["tests"] and all(t["passed"] for t in res["tests"].values()), res["tests"]
    assert "rmsnorm_benchmark" in res["tests"] and "passed rmsnorm_benchmark" in res["printed"]


def test_a_wrong_fixture_fails_its_benchmark_in_the_child_mode():
    fx = ROOT / "tests" / "fixtures" / "wrong" / "02_rmsnorm" / "calls_F_rms_norm.py"
    proc = subprocess.run([sys.executable, "-m", "tools.gpu_check", "--out", "unused", "--one", str(fx)],
                          capture_output=True, text=True, cwd=ROOT, env=venv_env(), timeout=300)
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    assert res["rmsnorm_benchmark"]["failed"] and "torch's own" in res["rmsnorm_benchmark"]["message"], res


def test_without_cuda_it_refuses(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("on a GPU machine, `python -m tools.gpu_check` is the real run")
    proc = subprocess.run([sys.executable, "-m", "tools.gpu_check", "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=ROOT, env=venv_env(), timeout=120)
    assert proc.returncode == 2 and "no CUDA GPU" in proc.stderr and not any(tmp_path.iterdir())
