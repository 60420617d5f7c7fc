"""coursekit.bench (the timing the benchmark cells and the autograder share) and the benchmark
checks' verdicts, from hand-made timings: no flaky wall-clock assertions here."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest
import torch
from torch import nn

from coursekit import bench
from coursekit.checks import CheckFailed
from coursekit.checks import scaling
from coursekit.checks.benchmark import NORM_SHAPE, REPEAT, TYPICAL, _input, _judge, robust_ratio


def test_time_interleaved_gives_one_sample_per_round_and_positive_times():
    x = torch.randn(64, 32)
    calls = {"a": 0, "b": 0}

    def a():
        calls["a"] += 1
        return x * 2

    def b():
        calls["b"] += 1
        return x + 1

    times = bench.time_interleaved({"a": a, "b": b}, repeat=5, target=1e-4, device="cpu")
    assert set(times) == {"a", "b"} and all(len(v) == 5 for v in times.values())
    assert all(t > 0 for v in times.values() for t in v)
    assert calls["a"] >= 5 and calls["b"] >= 5
    assert bench.time_fn(a, repeat=3, target=1e-4) > 0
    assert len(bench.ratios(times, "a", "b")) == 5


def test_summary_table_and_plot():
    times = {"yours": [2e-4, 3e-4, 2.5e-4], "torch": [1e-4, 1e-4, 1.2e-4]}
    rows = bench.summarize(times, nbytes=1 << 20, copy_seconds=5e-5, device="cpu")
    yours = rows[0]
    assert yours["seconds"] == 2.5e-4
    assert yours["gbps"] == pytest.approx(2 * (1 << 20) / 2.5e-4 / 1e9)
    assert yours["pct_copy"] == pytest.approx(100 * 5e-5 / 2.5e-4)
    table = bench.format_table(rows)
    assert "2.00x" in table and "% of copy" in table  # fastest against fastest, as the verdict
    fig = bench.plot(rows)
    assert len(fig.axes) == 2


def test_sweep_norm_draws_a_plot():
    res = bench.sweep_norm(nn.LayerNorm, nn.LayerNorm, dims=(8, 16), rows=16, repeat=2, show=False)
    assert len(res["yours"]) == 2 and res["figure"] is not None


def test_copy_time_is_positive():
    assert bench.copy_time(torch.randn(1000), repeat=3) > 0


def test_robust_ratio_is_not_fooled_by_one_slow_round():
    times = {"yours": [2.0, 2.0, 50.0], "torch": [1.0, 1.0, 1.0]}
    assert robust_ratio(times) == 2.0
    times = {"yours": [2.0, 30.0, 30.0], "torch": [9.0, 1.0, 1.0]}
    assert robust_ratio(times) == 2.0  # the fastest runs agree even when most rounds were disturbed


def work(gid, per_item=0, seed=3):
    """A count record (coursekit.checks.scaling.measure's shape): ``per_item`` more lines and ops per
    item of each grown dimension (0: vectorized), with torch's outputs for the counted calls."""
    return [{"dim": dim, "n0": n0, "n1": n1, "seed": seed,
             "at_n0": {"ops": 7 + per_item * n0, "lines": 200 + per_item * n0, "hot": 1 + per_item * n0, "lost": 0},
             "at_n1": {"ops": 7 + per_item * n1, "lines": 200 + per_item * n1, "hot": 1 + per_item * n1, "lost": 0},
             "out": [scaling._kept(scaling.expected(gid, i, side, seed)) for side in (0, 1)]}
            for i, (dim, n0, n1, _, _) in enumerate(scaling.GROWTH[gid])]


def _out(ratio, ops=(), per_item=0):
    x = _input(NORM_SHAPE)
    return {"grade_id": "layernorm_benchmark", "device": "cpu", "device_type": "cpu", "shape": list(x.shape),
            "dtype": "float32", "bytes": x.numel() * 4,
            "times": {"yours": [ratio * 1e-4] * REPEAT, "torch": [1e-4] * REPEAT},
            "copy": 5e-5, "ops": list(ops), "threads": 1, "unavailable": {}, "notes": [],
            "y": x * 0.5, "y_shape": list(x.shape), "work": work("layernorm_benchmark", per_item)}


@pytest.mark.layernorm
def test_benchmark_verdicts(capsys):
    want = _input(NORM_SHAPE) * 0.5
    _judge(_out(3.0), want, "LayerNorm", "torch.nn.LayerNorm", "layernorm_benchmark")
    assert "for your information" in capsys.readouterr().out
    # the time never decides: vectorized code timed slow (a busy machine) passes, a loop timed fast fails
    _judge(_out(TYPICAL["layernorm_benchmark"] * 10), want, "LayerNorm", "torch.nn.LayerNorm", "layernorm_benchmark")
    with pytest.raises(CheckFailed, match="Python loop"):
        _judge(_out(1.0, per_item=1), want, "LayerNorm", "torch.nn.LayerNorm", "layernorm_benchmark")
    with pytest.raises(CheckFailed, match="torch's own"):
        _judge(_out(1.0, ["layer_norm"]), want, "LayerNorm", "torch.nn.LayerNorm", "layernorm_benchmark")
    bad = _out(1.0)
    bad["y"] = bad["y"] * 2
    with pytest.raises(CheckFailed, match="benchmark input"):
        _judge(bad, want, "LayerNorm", "torch.nn.LayerNorm", "layernorm_benchmark")


# -- the counted calls: fresh inputs from the grader's seed, outputs checked -------------------

def _rowwise_layernorm_with_a_table(table_seed):
    """A LayerNorm that loops over rows, except on the counted inputs drawn from ``table_seed``,
    whose outputs it looks up in a table made in advance (one op per call, whatever the size)."""
    from torch import nn
    from torch.nn import functional as F

    keys = {}
    for i, (_, _, _, small, grown) in enumerate(scaling.GROWTH["layernorm_benchmark"]):
        for side, case in enumerate((small, grown)):
            x = case.inputs(scaling._seed(table_seed, i, side, 1))[0]
            keys[round(float(x.reshape(-1)[0]), 6)] = scaling.expected("layernorm_benchmark", i, side, table_seed)

    class LayerNorm(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.weight, self.bias = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))

        def forward(self, x):
            hit = keys.get(round(float(x.reshape(-1)[0]), 6))
            if hit is not None and hit.shape == x.shape:
                return hit
            rows = [F.layer_norm(r, r.shape[-1:], self.weight, self.bias) for r in x.reshape(-1, x.shape[-1])]
            return torch.stack(rows).reshape(x.shape)
    return {"LayerNorm": LayerNorm}


def test_a_table_of_answers_made_in_advance_passes_only_on_the_inputs_it_was_made_for():
    """The count's inputs come from a seed; with a fixed one (the notebook's own check) a table
    of precomputed outputs made the looping code look vectorized. The grader draws the seed per
    submission, so the table misses and the loop is counted."""
    ns = _rowwise_layernorm_with_a_table(scaling.DEFAULT_SEED)
    rec = scaling.measure("layernorm_benchmark", ns)
    scaling.judge(rec, "layernorm_benchmark", "LayerNorm", "hint")  # the table's inputs: it passes
    with pytest.raises(CheckFailed, match="more work per call as the number of rows grows"):
        scaling.judge(scaling.measure("layernorm_benchmark", ns, 987654321), "layernorm_benchmark", "LayerNorm", "hint")


def test_a_counted_call_that_returns_something_else_fails_whatever_its_count():
    """A shortcut of constant work that does not compute the output (returns its input, or a
    tensor subclass) fails on the output, which the judge rebuilds from the same seed and weights."""
    from torch import nn

    class Lazy(nn.Module):
        def __init__(self, d):
            super().__init__()
            self.weight, self.bias = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d))

        def forward(self, x):
            return x
    rec = scaling.measure("layernorm_benchmark", {"LayerNorm": Lazy}, 5)
    with pytest.raises(CheckFailed, match="output on the benchmark's counted call"):
        scaling.judge(rec, "layernorm_benchmark", "LayerNorm", "hint")
    good = work("layernorm_benchmark")
    scaling.judge(good, "layernorm_benchmark", "LayerNorm", "hint")
    good[1]["out"][0] = "a Sneaky"
    with pytest.raises(CheckFailed, match="is a Sneaky, not a torch.Tensor"):
        scaling.judge(good, "layernorm_benchmark", "LayerNorm", "hint")
    bad = work("layernorm_benchmark")
    del bad[0]["seed"]
    with pytest.raises(CheckFailed, match="missing or malformed"):
        scaling.judge(bad, "layernorm_benchmark", "LayerNorm", "hint")


@pytest.mark.parametrize("assignment,gid", [("01_layernorm", "layernorm_benchmark"), ("02_rmsnorm", "rmsnorm_benchmark"),
                                            ("03_residual", "residual_benchmark"),
                                            ("04_transformer_block", "transformer_block_benchmark"),
                                            ("05_backward", "backward_benchmark")])
def test_the_course_solution_passes_the_count_on_any_seed(assignment, gid):
    from course.solutions import load_reference
    ns = load_reference(assignment)
    for seed in (None, 424242):
        scaling.judge(scaling.measure(gid, ns, seed), gid, "solution", "hint")
