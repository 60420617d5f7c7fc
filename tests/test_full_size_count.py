"""The served benchmark counts one of its own timed calls at full size (coursekit.checks.scaling.judge_full).

The small counted calls hold at most 2048 numbers; code that is vectorized there and loops above
kept the benchmark's points. The grader now has the harness count the work of one call of its
timed chain at full size, from the same line as every other call, at a round and call picked from
its secret draw (autograder.referee.clock.count_position), and judges it against the small counts:
at most :func:`scaling.full_allowed` of the largest. Honest code (the course's solutions, the right
fixtures) passes on any seed; the size-switching loop fails, naming the sizes and counts. Asking
whether a dispatch or function mode is active is flagged by the review (autograder.intake.scan).
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch

from autograder.intake import scan
from autograder.referee import clock
from coursekit import bench
from coursekit.checks import CheckFailed, scaling
from coursekit.checks.benchmark import LOOP_HINT
from coursekit.checks.served import SERVED
from course.release import ROOT
from notebook_ns import code_ns
from tools.fixture_class import read_code_fixture
from test_graded_slice import review

FIXTURES = ROOT / "tests" / "fixtures"
CPU = bench.bench_config("cpu")


def full_count(gid: str, ns: dict, seed: int) -> dict:
    """What the harness's ``_serve`` counts: one chained call of the built module on the full input,
    under :class:`scaling.Meter`, after the calls before it (not counted)."""
    spec = SERVED[gid]
    m = spec.build(ns, CPU)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            y = m(spec.x(seed, CPU))
            y = m(y)
            with scaling.Meter() as meter:
                m(y)
    finally:
        torch.set_num_threads(threads)
    return dict(meter.counts, shape=list(spec.x(seed, CPU).shape))


def verdict(gid: str, ns: dict, seed: int) -> None:
    """The served benchmark's verdict on the counts alone (raises CheckFailed)."""
    rec = scaling.measure(gid, ns, seed)
    scaling.judge(rec, gid, SERVED[gid].name, LOOP_HINT[gid])
    scaling.judge_full(full_count(gid, ns, seed), rec, gid, SERVED[gid].name, LOOP_HINT[gid])


def fixture_ns(path: Path) -> dict:
    fx = read_code_fixture(path)
    return code_ns(fx["assignment"], fx["code"], path.name)


BENCHMARKED = {"01_layernorm": "layernorm_benchmark", "02_rmsnorm": "rmsnorm_benchmark",
               "03_residual": "residual_benchmark", "04_transformer_block": "transformer_block_benchmark",
               "05_backward": "backward_benchmark", "06_streams": "streams_benchmark"}


@pytest.mark.parametrize("assignment", sorted(BENCHMARKED))
def test_the_course_solution_passes_the_full_size_count_on_any_seed(assignment):
    from course.solutions import load_reference
    ns = load_reference(assignment)
    for seed in (scaling.DEFAULT_SEED, 424242, 98765):
        verdict(BENCHMARKED[assignment], ns, seed)


def _plain_python(p: Path) -> bool:
    try:
        ast.parse(p.read_text())
        return True
    except SyntaxError:  # IPython magics: graded through the real grader (test_grading_verdicts)
        return False


RIGHT_NORMS = [p for a in ("01_layernorm", "02_rmsnorm") for p in sorted((FIXTURES / "right" / a).glob("*.py"))
               if _plain_python(p)]


@pytest.mark.parametrize("path", RIGHT_NORMS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_honest_but_unusual_norms_pass_the_full_size_count(path):
    ns = code_ns(path.parent.name, path.read_text(), path.name)
    verdict(BENCHMARKED[path.parent.name], ns, 31337)


def test_a_step_only_when_needed_stays_within_the_allowance():
    """A ``.contiguous()`` (and a cast) only for inputs that need it: at most a few ops and lines
    more at full size than on the small inputs, well inside :func:`scaling.full_allowed`."""
    from torch import nn

    class RMSNorm(nn.Module):
        def __init__(self, d, eps=1e-6):
            super().__init__()
            self.eps, self.weight = eps, nn.Parameter(torch.ones(d))

        def forward(self, x):
            if x.numel() > 2048:  # big inputs: make sure of the layout and the precision first
                x = x.contiguous()
                x = x.double().float()
                x = x.view(x.shape)
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight
    verdict("rmsnorm_benchmark", {"RMSNorm": RMSNorm}, 5)


def test_a_loop_above_the_counted_sizes_passes_the_small_counts_and_fails_at_full_size():
    ns = fixture_ns(FIXTURES / "hostile" / "loop_above_2048_numbers.py")
    gid = "rmsnorm_benchmark"
    for seed in (scaling.DEFAULT_SEED, 424242):
        rec = scaling.measure(gid, ns, seed)
        scaling.judge(rec, gid, "RMSNorm", LOOP_HINT[gid])  # every small call: vectorized, flat counts
        full = full_count(gid, ns, seed)
        with pytest.raises(CheckFailed) as e:
            scaling.judge_full(full, rec, gid, "RMSNorm", LOOP_HINT[gid])
        msg = str(e.value)
        assert "work of a full-size call grew" in msg and "4x256x128, 131072 numbers" in msg, msg
        assert f"{full['ops']} torch ops" in msg and " rows (" in msg and "7 ops" in msg, msg


def test_a_missing_or_malformed_full_size_count_fails():
    gid = "rmsnorm_benchmark"
    from course.solutions import load_reference
    rec = scaling.measure(gid, load_reference("02_rmsnorm"), 3)
    for bad in (None, {}, {"ops": 7, "lines": "many", "hot": 1, "lost": 0, "shape": [4]},
                {"ops": -1, "lines": 3, "hot": 1, "lost": 0, "shape": [4]}, {"ops": 7, "lines": 200, "hot": 1, "lost": 0},
                {"ops": 7, "lines": 200, "lost": 0, "shape": [4]}, {"ops": 7, "lines": 200, "hot": 1, "shape": [4]}):
        with pytest.raises(CheckFailed, match="full-size call of the benchmark is missing or malformed"):
            scaling.judge_full(bad, rec, gid, "RMSNorm", "hint")


def test_the_allowance():
    assert scaling.full_allowed(7) == 7 + scaling.FULL_SLACK
    assert scaling.full_allowed(800) == 1000  # a quarter of a large count
    assert scaling.full_allowed(200, "lines") == 200 + scaling.FULL_SLACK * scaling.LINES_PER_OP
    # a loop over the full input's rows (1024 on the CPU, two ops each at least) is far past it
    assert scaling.full_allowed(7) < 1024 and scaling.full_allowed(214, "lines") < 2 * 1024


def test_a_numpy_row_loop_hidden_by_padding_fails_on_its_busiest_line():
    """The seventh red team's route: the small calls padded with empty iterations (flat and under the
    ceiling), the full-size call a loop over the rows with one line of numpy per row (fewer lines than the
    padded small calls, no op per row). Its busiest line runs once per row: far more than any line of the
    course's solution or of the right fixtures."""
    ns = fixture_ns(FIXTURES / "hostile" / "numpy_row_loop_padded_small.py")
    gid = "rmsnorm_benchmark"
    for seed in (scaling.DEFAULT_SEED, 424242):
        rec = scaling.measure(gid, ns, seed)
        full = full_count(gid, ns, seed)
        small = max((e[k] for e in rec for k in ("at_n0", "at_n1")), key=lambda c: c["lines"])
        assert full["lines"] < small["lines"] and full["ops"] <= small["ops"]  # what the allowance read
        assert full["hot"] >= 1024 > scaling.hot_ceiling(scaling.solution_hot(gid))
        with pytest.raises(CheckFailed) as e:
            scaling.judge_full(full, rec, gid, "RMSNorm", LOOP_HINT[gid])
        msg = str(e.value)
        assert f"one line of Python {full['hot']} times" in msg and "4x256x128" in msg, msg


@pytest.mark.parametrize("gid", sorted(scaling.GROWTH))
def test_the_busiest_line_of_the_solution_and_of_the_right_fixtures_with_loops_is_far_under_its_ceiling(gid):
    """Every right fixture passes the ceiling through the real grader (test_grading_verdicts); here the
    margin, for the exercises whose honest code loops (Sinkhorn's iterations, vmap, decorators)."""
    assignment = scaling.ASSIGNMENT[gid]
    sol = scaling.solution_hot(gid)
    assert sol is not None and 1 <= sol <= 21  # 21: Sinkhorn's 20 iterations in exercise 06
    for path in sorted((FIXTURES / "right" / assignment).glob("*.py")) if assignment in ("05_backward", "06_streams") else ():
        code = read_code_fixture(path)["code"]
        if "%%" in code:
            continue  # a cell magic: not plain Python, graded through the real grader instead
        ns = code_ns(assignment, code, path.name)
        rec = scaling.measure(gid, ns, 5)
        hot = max([e[k]["hot"] for e in rec for k in ("at_n0", "at_n1")] + [full_count(gid, ns, 5)["hot"]])
        assert hot <= 2 * sol + 8 < scaling.hot_ceiling(sol), (path.name, hot)


@pytest.mark.parametrize("name,gid", [("tracer_dropped_by_recursion.py", "rmsnorm_benchmark"),
                                      ("tracer_dropped_by_recursion_in_sinkhorn.py", "streams_benchmark")])
def test_a_count_whose_tracer_was_dropped_mid_call_fails(name, gid):
    """The eighth red team's route: a RecursionError provoked where the call into the trace function
    fails makes CPython drop the tracer, and the rest of the call (a loop in numpy) counts nothing. The
    counter sees its tracer gone when the call returns, and the count stands for nothing."""
    ns = fixture_ns(FIXTURES / "hostile" / name)
    rec = scaling.measure(gid, ns, 5)
    assert any(e[k]["lost"] for e in rec for k in ("at_n0", "at_n1"))
    with pytest.raises(CheckFailed, match="was switched off during the counted call"):
        scaling.judge(rec, gid, "code", LOOP_HINT[gid])


def test_a_count_is_lost_when_its_tracer_or_its_op_counter_is_gone():
    from torch.utils._python_dispatch import _pop_mode_temporarily
    with scaling.Meter() as m:
        torch.ones(3).sum()
    assert m.counts["lost"] == 0 and m.counts["ops"] >= 1
    with scaling.Meter() as m:
        sys.settrace(None)
    assert m.counts["lost"] == 1
    with scaling.Meter() as m:
        with _pop_mode_temporarily():
            torch.ones(3).sum()
    # popped and pushed back within the call: the ops went uncounted and the counter cannot tell; the
    # review flags code that pops torch's modes (torch internals: test_graded_slice, no_dispatch_hides_a_c_loop)
    assert m.counts["lost"] == 0 and m.counts["ops"] == 0


def test_a_sinkhorn_that_loops_over_a_large_batch_fails_the_counted_matrices():
    """One matrix at a time on the largest counted batch runs past the line cap: the count stops
    there (it ran past the cell's 120 s before the cap) and fails, naming the cap."""
    ns = fixture_ns(FIXTURES / "hostile" / "sinkhorn_loop_above_16_matrices.py")
    gid = "streams_benchmark"
    rec = scaling.measure(gid, ns, 5)
    assert any(e[k]["lines"] > scaling.LINE_CAP for e in rec for k in ("at_n0", "at_n1"))
    with pytest.raises(CheckFailed, match="as the number of matrices in a batch of logits grows.*where the count stopped"):
        scaling.judge(rec, gid, "sinkhorn_knopp", LOOP_HINT[gid])
    largest = max(n1 for dim, _, n1, _, _ in scaling.GROWTH[gid] if dim == "matrices")
    from coursekit.contract import BENCH_SIZES
    assert largest >= max(scaling.prod(BENCH_SIZES[k]["streams"]["logits"][:-2]) for k in BENCH_SIZES)


def test_a_count_stops_at_the_line_cap_and_fails(monkeypatch):
    """Past LINE_CAP lines the tracer stops the counted call (CountCapped, raised into it and not
    passed on by work), the count is not 'lost' but over the cap, and the judge fails it by the cap
    whatever the growth or the ceiling would say (without the course's solutions too)."""
    monkeypatch.setattr(scaling, "LINE_CAP", 5000)
    ran = [0]

    def loop(*_):
        for _ in range(50_000):
            ran[0] += 1
        return torch.ones(1)

    counts, out = scaling.work(loop, (), ())
    assert out is None and counts["lines"] == 5001 and counts["lost"] == 0
    assert 50_000 < ran[0] < 50_000 + 5000  # the warm-up call ran whole, the counted one stopped
    path = FIXTURES / "wrong" / "02_rmsnorm" / "per_row_loop.py"
    rec = scaling.measure("rmsnorm_benchmark", code_ns("02_rmsnorm", read_code_fixture(path)["code"], path.name), 5)
    with pytest.raises(CheckFailed, match="more than 5,000 (Python )?lines"):
        scaling.judge(rec, "rmsnorm_benchmark", "RMSNorm", LOOP_HINT["rmsnorm_benchmark"])
    full = {**rec[0]["at_n1"], "shape": [4, 8]}
    with pytest.raises(CheckFailed, match="stopped counting it"):
        scaling.judge_full(full, rec, "rmsnorm_benchmark", "RMSNorm", LOOP_HINT["rmsnorm_benchmark"])


def test_code_that_swallows_the_cap_still_fails_and_cannot_raise_it_itself(monkeypatch):
    monkeypatch.setattr(scaling, "LINE_CAP", 2000)

    def stubborn(*_):
        done = 0
        while done < 20_000:
            try:
                for _ in range(20_000 - done):
                    done += 1
            except BaseException:  # noqa: BLE001 -- catches CountCapped; the rest runs untraced
                pass
        return torch.ones(1)

    counts, out = scaling.work(stubborn, (), ())
    assert counts["lines"] > 2000 and counts["lost"] == 0 and out is not None  # over the cap: fails
    with pytest.raises(scaling.CountCapped):  # not under the cap: raised by the code, passed on
        with scaling.Meter():
            raise scaling.CountCapped("forged")


def test_the_counted_call_is_picked_from_the_draw():
    picks = {clock.count_position(d, "rmsnorm_benchmark") for d in range(200)}
    assert all(0 <= r < clock.ROUNDS and 0 <= f < 1 for r, f in picks)
    assert len({r for r, _ in picks}) == clock.ROUNDS  # every round can be the one
    assert clock.count_position(5, "rmsnorm_benchmark") == clock.count_position(5, "rmsnorm_benchmark")
    assert clock.count_position(5, "rmsnorm_benchmark") != clock.count_position(5, "layernorm_benchmark")
    # the harness's step carries the count's seed, never which timed call is counted
    from autograder.grade import _test_step
    st = _test_step({"kind": "test", "grade_id": "rmsnorm_benchmark", "index": 7}, 5)
    assert st["served"] is True and not {"count", "count_round", "count_at"} & set(st), st


def test_the_harness_counts_the_picked_call_from_the_timing_line():
    """``_serve`` (autograder/inside/harness.py) with the grader's requests on a fake pipe: a ``run``
    with ``count`` sends the counts of that call, and the count equals :class:`scaling.Meter`'s on
    the same chain; a plain ``run`` sends none."""
    import importlib.util

    import coursekit.checks as checks
    from coursekit.checks import wire
    from coursekit.checks.served import Served, reply

    spec_ = importlib.util.spec_from_file_location("harness_under_test", ROOT / "autograder" / "inside" / "harness.py")
    harness = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(harness)
    checks.load_all()
    from course.solutions import load_reference
    ns = load_reference("02_rmsnorm")
    gid = "rmsnorm_benchmark"
    served = ({g: Served(s.name, s.assignment, s.build, s.torch_module, s.x, s.torch_name) for g, s in SERVED.items()},
              wire.pack_value, checks.Check, CheckFailed, reply, CPU, scaling.measure, scaling.Meter, scaling.Idle())

    class Pipe:
        def __init__(self, reqs):
            self.reqs = list(reqs)

        def next(self):
            return self.reqs.pop(0) if self.reqs else None

    frames = []
    reqs = [{"op": "run", "seed": 3, "k": 2}, {"op": "run", "seed": 4, "k": 3, "count": 1}, {"op": "end"}]
    threads = torch.get_num_threads()  # _serve times on one thread
    try:
        rec = harness._serve(gid, checks.REGISTRY[gid], ns, 0, Pipe(reqs), frames.append, checks.collect, served, 7)
    finally:
        torch.set_num_threads(threads)
    assert rec["ok"], rec

    def decode(f):
        nh, nb = wire.frame_sizes(f[:8])
        return wire.unpack_value(f[8:8 + nh], f[8 + nh:8 + nh + nb])
    plain, counted = decode(frames[1]), decode(frames[2])
    assert "work" not in plain and "y" in plain
    assert set(counted["work"]) == {"ops", "lines", "hot", "lost"} and counted["work"]["ops"] == 7, counted["work"]


def test_asking_whether_a_mode_is_active_is_flagged_by_value():
    """Like sys.gettrace: every spelling and alias of torch's mode-stack questions is named."""
    for code in ("n = torch._C._len_torch_dispatch_stack()\n",
                 "f = torch._C._len_torch_dispatch_stack\nif f(): pass\n",
                 "from torch.utils._python_dispatch import _get_current_dispatch_mode as m\nx = m()\n",
                 "import torch.utils._python_dispatch as pd\nx = pd._get_current_dispatch_mode_stack()\n",
                 "x = torch._C._is_torch_function_mode_enabled()\n",
                 "x = torch.overrides._get_current_function_mode_stack()\n",
                 "g = getattr(torch._C, '_len_torch_function_stack')\nx = g()\n",
                 "x = torch.utils._python_dispatch.is_in_torch_dispatch_mode()\n"):
        found = review([code])
        assert any(r.startswith(scan.MODE_ASK) for r in found), (code, found)
    assert review(["x = torch.zeros(3).contiguous()\n"]) == []


@pytest.mark.parametrize("name,gid", [("loop_padded_to_a_constant_length.py", "rmsnorm_benchmark"),
                                      ("loop_padded_on_small_inputs.py", "layernorm_benchmark")])
def test_a_loop_padded_to_one_length_passes_growth_and_fails_the_ceiling(name, gid):
    """The sixth red team's loop: padded with dummy items to 1100 at every counted size, its counts do
    not grow and the full-size call fits their allowance; the ceiling (eight times the course
    solution's count plus 64 ops) fails it on the small calls, naming both counts."""
    ns = fixture_ns(FIXTURES / "hostile" / name)
    rec = scaling.measure(gid, ns, 7)
    e0 = rec[0]
    assert e0["at_n0"]["ops"] >= 1000 and e0["at_n1"]["ops"] - e0["at_n0"]["ops"] < (e0["n1"] - e0["n0"]) / 2, e0
    full = full_count(gid, ns, 7)
    small = [e[k] for e in rec for k in ("at_n0", "at_n1")]
    for k in ("ops", "lines"):  # the allowance alone passes it; its busiest line (once per item) does not
        assert full[k] <= scaling.full_allowed(max(c[k] for c in small), k)
    with pytest.raises(CheckFailed, match=f"runs one line of Python {full['hot']} times"):
        scaling.judge_full(full, rec, gid, "norm", LOOP_HINT[gid])
    with pytest.raises(CheckFailed) as e:
        scaling.judge(rec, gid, "norm", LOOP_HINT[gid])
    assert "far more work per call than vectorized code needs" in str(e.value) and "the course's solution" in str(e.value)


@pytest.mark.parametrize("gid", sorted(scaling.GROWTH))
def test_the_ceiling_is_set_by_the_course_solution_on_every_counted_call(gid):
    """Every counted call has a solution count, and the solution sits far below its ceiling (the
    solution itself passing is test_the_course_solution_passes_the_full_size_count_on_any_seed)."""
    for i in range(len(scaling.GROWTH[gid])):
        for side in (0, 1):
            sol = scaling.solution_counts(gid, i, side)
            assert sol and scaling.ceiling(sol, "ops") == 8 * sol["ops"] + 64, (gid, i, side, sol)


def test_reading_a_traceback_or_logging_one_is_flagged_by_value():
    """An error raised in a torch kernel comes back through the op counter's frames: every way the
    red team read them, and their neighbours, is named; plain error handling is not."""
    cases = {
        "try:\n    x = 1\nexcept RuntimeError as e:\n    tb = e.__traceback__\n": "an exception's traceback",
        "def f(tb):\n    return tb.tb_next\n": "a traceback's frames",
        "import sys\ninfo = sys.exc_info()\n": "the current exception's traceback",
        "import sys\nfrom sys import exc_info as ei\ninfo = ei()\n": "the current exception's traceback",
        "import sys\ne = sys.exception()\n": "the current exception",
        "import logging\nt = logging.Formatter().formatException(None)\n": "an exception's traceback as text",
        "import logging\nlogging.getLogger('x').error('m', exc_info=True)\n": scan.STACK_AS_TEXT,
        "import logging\nlogging.getLogger('x').info('m', stack_info=True)\n": scan.STACK_AS_TEXT,
    }
    for code, reason in cases.items():
        found = review([code])
        assert any(reason in r for r in found), (code, found)
    for honest in ("try:\n    y = 1 / 0\nexcept ZeroDivisionError:\n    y = 0.0\n",
                   "import logging\nlogging.getLogger('x').info('m', exc_info=False)\n"):
        assert review([honest]) == [], (honest, review([honest]))


# -- through the real grader: the fixtures as students hand them in ------------------------------

GRADED = {"02_rmsnorm": ("solution", "hostile-loop_above_2048_numbers", "hostile-loop_unless_a_dispatch_mode",
                         "hostile-loop_unless_traced", "hostile-loop_padded_to_a_constant_length",
                         "hostile-loop_unless_a_traceback_is_deep", "hostile-loop_unless_logging_names_the_counter",
                         "hostile-loop_unless_a_log_record_names_the_counter",
                         "right-scratch_assert_nn_rmsnorm", "right-warns_on_integer_input"),
          "01_layernorm": ("solution", "hostile-table_of_counted_outputs", "hostile-loop_padded_on_small_inputs",
                           "right-compiled_forward")}


@pytest.mark.autograder
@pytest.mark.slow
@pytest.mark.parametrize("assignment", sorted(GRADED))
def test_the_fixtures_through_the_real_grader(tmp_path, assignment):
    """``python -m autograder grade`` on a class of the new fixtures and their neighbours: the loop
    above 2048 numbers loses exactly the benchmark, unflagged; the loop unless a dispatch mode is
    active is flagged naming the line; the loop unless traced is flagged as before; the table of
    counted outputs still loses the benchmark; honest work keeps full marks, unflagged."""
    import shutil

    from test_grading_verdicts import run_grader
    from tools.fixture_class import build

    cases = {c.student: c for c in build(tmp_path / "submitted", assignment=assignment,
                                         kinds=("solution", "hostile", "right"))}
    for d in (tmp_path / "submitted").iterdir():
        if d.name not in GRADED[assignment]:
            shutil.rmtree(d)
    rows, results = run_grader(tmp_path)
    full = float(rows["solution"]["max_score"])
    for sid in GRADED[assignment]:
        row, c = rows[sid], cases[sid]
        lost = sorted(t["grade_id"] for t in results[sid]["tests"] if not t["passed"])
        print(sid, row["score"], "/", row["max_score"], "lost:", lost, "review:", row["review"] or "(none)")
        if c.kind in ("solution", "right"):
            assert float(row["score"]) == full and row["review"] == "", (sid, row)
        elif c.review:
            assert c.review in row["review"] and ", line " in row["review"], (sid, row["review"])
        else:
            assert lost == sorted(c.loses) and row["review"] == "", (sid, lost, row["review"])
    if assignment == "02_rmsnorm":
        bench = next(t for t in results["hostile-loop_above_2048_numbers"]["tests"] if t["grade_id"] == "rmsnorm_benchmark")
        assert "the work of a full-size call grew" in bench["message"] and "4x256x128" in bench["message"], bench
        ok = next(t for t in results["solution"]["tests"] if t["grade_id"] == "rmsnorm_benchmark")
        assert "one grader-timed call on the full input (4x256x128)" in ok["detail"]["report"], ok["detail"]


def _reshape_says_a_mode_is_on() -> bool:
    """The twelfth red team's detector: under a dispatch mode ATen takes ``view`` for the reshape of
    a viewable strided tensor (autograd records ViewBackward0), without one ``_reshape_alias``."""
    with torch.enable_grad():
        b = torch.ones(4, 6, requires_grad=True)
        return b[:, :3].reshape(2, 2, 3).grad_fn.name() == "ViewBackward0"


def test_a_timed_call_not_counted_looks_like_the_counted_one_to_torch():
    """Every timed call runs under the op counter's dispatch mode (scaling.Idle, its count thrown
    away), so what torch hands back cannot tell the counted call (scaling.Meter) from the others:
    with nothing around the call (the old Idle), the detector told them apart, and a row loop ran
    in every call but the counted one (18/18, unflagged)."""
    assert not _reshape_says_a_mode_is_on()  # no mode: torch's plain path
    with scaling.Meter():
        counted = _reshape_says_a_mode_is_on()
    with scaling.Idle():
        timed = _reshape_says_a_mode_is_on()
    assert counted and timed


def test_the_referee_times_torch_under_the_same_mode_and_a_compiled_module_without():
    seen = []

    def fn(y):
        seen.append(_reshape_says_a_mode_is_on())
        return y

    clock._local(fn, torch.zeros(2), 2)
    clock._local(fn, torch.zeros(2), 1, moded=False)
    assert seen == [True, True, False]
