"""Is it vectorized? Decided by what the code does as the input grows, never by a clock.

A benchmark test's points used to hang on one wall-clock ratio against torch: a busy machine could
push honest code over the limit, and a quiet one let a loop through. Here the verdict is a count.
Each benchmark calls the student's code on a small input and on one grown along a single dimension
(rows, tokens, batch, features, heads, ...), and counts, for one call:

* ``lines``: Python lines run (``sys.settrace``'s ``line`` events, in every frame: the student's,
  torch's Python, everything), and
* ``ops``: torch ops dispatched (a ``TorchDispatchMode`` that counts).

Vectorized code runs the same lines and dispatches the same ops whatever the number of rows: the
rows are a size inside the kernels. A Python loop over rows runs at least one more line per row,
and a loop in C (``map(torch.Tensor.mean, rows)``) at least one more op per row. So for a grown
dimension going from ``n0`` to ``n1`` items, the test fails when either count grows by
``(n1 - n0) / 2`` or more (:func:`judge`): a loop that visits every item adds ``n1 - n0``, and
splitting the work into a few large chunks stays well under it.

Every count is taken on the CPU in float32 on inputs of a few hundred numbers, wherever the grader
runs, and a fresh input for each call (a cache keyed by the input gains nothing): the same
submission gets the same counts, and so the same points, on any machine under any load. The
benchmark's times are still measured and printed, for information only.

The counted calls' inputs are drawn from a seed: the grader's, one per submission from its secret
(``count_seed`` in the test's step, :mod:`autograder.grade`), so no input is known before the call;
the notebook's own check uses :data:`DEFAULT_SEED`. The modules get known weights, and each counted
call's output goes into the record: the judge rebuilds torch's output from the same seed and
weights (:func:`expected`), so a count stands only for code that computed the right answer (a
constant-work shortcut that returns something else, or an answer looked up from a table made in
advance, fails here).

Small inputs can be recognised by their size: code vectorized up to a few thousand numbers and looping
above passes every count above. The course grader therefore also counts one of its own timed calls
at full size (:class:`Meter`, in the harness's ``_serve``, at a call the grader picks from its secret
draw) and :func:`judge_full` compares it with the small counts: at most :func:`full_allowed` of the
largest. The notebook's own check has no grader and no full-size count.

Every counted call is also held to a ceiling from the course's solution on the same call (grader
side only): its ops and lines (:func:`ceiling`), and ``hot``, the most times one line of Python outside
torch ran (:data:`HOT_FACTOR`): a loop's body runs once per item however cheap each pass is. A count
taken while the tracer or the op counter was switched off (``lost``: CPython drops a trace function
that raises), or during which a thread was started (its work is in another thread, which neither
counter sees), stands for nothing and fails.

What is not counted: work in processes the code starts (the grader's observers see those start),
and a loop run entirely inside C code (or inside torch's own Python code) with no Python line of its
own per item.
"""
from __future__ import annotations

import functools
import os
import sys
import types
from typing import NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._python_dispatch import _get_current_dispatch_mode as _current_mode

from coursekit.checks import CheckFailed
from coursekit.checks import threads as _threads

# taken when this module is imported, before any student code runs in the grader's sandbox: a
# notebook that rebinds sys.settrace afterwards does not change what counts the lines
_settrace, _gettrace = sys.settrace, sys.gettrace
#: torch's own Python code and this module's (the dispatch machinery and the op counter run some of
#: their lines once per op): not in ``hot``
_TORCH_DIR, _HERE = os.path.realpath(os.path.dirname(torch.__file__)) + os.sep, os.path.realpath(__file__)
_realpath = os.path.realpath
#: a code's file name -> whether the file it names is torch's own (or this module): judged by the
#: real path, since a name like <torch>/../../home/student/x.py (a sys.path entry the student made)
#: starts like torch's and is the student's file (the thirteenth red team's uncounted loop)
_TORCHS: dict = {}


def _is_torchs(file: str) -> bool:
    real = file if file.startswith("<") else _realpath(file)
    _TORCHS[file] = got = real.startswith(_TORCH_DIR) or real == _HERE
    return got


#: a counted call stops being counted past this many Python lines, and fails: ten times the largest
#: ceiling any course solution sets (exercise 06's, about 102,000 lines; :func:`ceiling`), so no call
#: that could pass is ever stopped. A loop over thousands of items under the line tracer otherwise runs
#: for minutes (exercise 06's Sinkhorn one matrix at a time on 8192 matrices: past the cell's 120 s)
LINE_CAP = 1_000_000


class CountCapped(BaseException):
    """Raised by :class:`Meter`'s tracer into the counted code once it has run :data:`LINE_CAP`
    lines (a BaseException: ``except Exception`` in the student's code does not swallow it); the
    count then stands over every allowance, which fails it (:func:`judge`, :func:`judge_full`)."""


#: the warm-up call before a count (:func:`work`) stops past this many torch ops: a loop over thousands
#: of items spends most of its time there otherwise (the warm-up is not counted, only run for its lazy
#: set-up); ten times the most ops any course solution's counted call may run (:func:`ceiling`)
WARM_OP_CAP = 50_000


class _OpCount(TorchDispatchMode):
    """Counts the torch ops dispatched below autograd while it is on the mode stack; with ``cap``,
    every op past ``cap`` raises :class:`CountCapped` instead of running."""

    def __init__(self, cap: int | None = None):
        super().__init__()
        self.n, self.cap = 0, cap

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1  # two lines a call, as before the cap (a count's lines include them)
        return func(*args, **(kwargs or {})) if self.cap is None or self.n <= self.cap else self._over()

    def _over(self):
        raise CountCapped(f"more than {self.cap} torch ops in the warm-up call")


class Meter:
    """Counts the work of what runs while it is entered: ``ops`` (torch ops dispatched) and ``lines``
    (Python lines run, in every frame opened meanwhile), with ``hot`` and ``lost`` (see
    :attr:`counts`), the same numbers for the counted calls
    of :func:`work` and for the grader-timed call at full size (``autograder/inside/harness.py``,
    ``_serve``). ``counts`` after it is left."""

    def __init__(self):
        self.counter, self.lines, self.hits, self.before, self.lost = _OpCount(), [0], {}, None, 0
        self.starts, self.capped = 0, False

    def _trace(self, frame, event, arg):
        if frame.f_code in _OWN:
            return None
        if event == "line":
            self.lines[0] += 1
            if self.lines[0] > LINE_CAP:  # far past any allowance: stop (Python drops this tracer)
                self.capped = True
                raise CountCapped(f"more than {LINE_CAP} Python lines in one counted call")
            file = frame.f_code.co_filename
            torchs = _TORCHS.get(file)
            if torchs is None:
                torchs = _is_torchs(file)
            if not torchs:  # torch's own lines run once per op, not per item
                where = (frame.f_code, frame.f_lineno)
                self.hits[where] = self.hits.get(where, 0) + 1
        return self._trace

    def __enter__(self):
        self.before = _gettrace()
        self.starts = _threads.STARTS[0]
        self.counter.__enter__()
        _settrace(self._trace)
        return self

    def __exit__(self, *exc):
        # Still counting? CPython drops a trace function that raises (a RecursionError provoked at
        # the right depth, the eighth red team's route), and a dispatch mode can be popped: either
        # leaves the rest of the call uncounted, so the count stands for nothing (``lost``).
        # A thread started during the call (and perhaps joined before it returns) does work that neither
        # the tracer nor the op counter, both per thread, sees (the ninth red team's QueueListener): the
        # grader's observers count every start (coursekit.checks.threads.STARTS).
        # Stopped at the cap: the tracer is gone by our doing, and the count (over the cap) fails
        # by itself; the CountCapped raised into the call is not passed on.
        self.lost = 0 if self.capped else int(_gettrace() != self._trace or _current_mode() is not self.counter
                                               or _threads.STARTS[0] != self.starts)
        _settrace(self.before)
        self.counter.__exit__(*exc)
        return self.capped and exc[0] is not None and issubclass(exc[0], CountCapped)

    @property
    def counts(self) -> dict:
        """``ops``, ``lines``, ``hot``: how many times the most-run line ran (a loop's body runs once
        per item; vectorized code runs each line a few times whatever the size), and ``lost``: 1 when
        the counters were off or a thread was started during the call (the count stands for nothing)."""
        return {"ops": self.counter.n, "lines": self.lines[0], "hot": max(self.hits.values(), default=0),
                "lost": self.lost}


class Idle:
    """What the harness enters around a timed call that is not counted (the counted one: :class:`Meter`):
    the same op counter on torch's dispatch stack, its count thrown away.

    A dispatch mode changes what some of torch's own composite ops do (ATen's ``isTensorSubclassLike``
    is true whenever one is on the stack: ``reshape`` of a viewable strided tensor then records
    ``ViewBackward0``, not ``ReshapeAliasBackward0``), so code could tell the counted call from the
    others by what torch handed back and loop in every other call (the twelfth red team: 18/18
    unflagged, the timed calls 233 times torch). With the mode on every timed call the counted one
    differs only by its tracer, which Python code sees only through what the review flags
    (``sys.gettrace``, a frame's ``f_trace``, ``sys.getallocatedblocks``: the tracer allocates a key
    per new line, and every attribute of ``sys`` but its plain data is flagged), a clock, or where a
    fresh object lands (``id``). The mode costs each op a few microseconds
    on every timed call; the referee times torch's module and the course solution under it too
    (:mod:`autograder.referee.clock`)."""

    def __enter__(self):
        self.counter = _OpCount()
        self.counter.__enter__()
        return self

    def __exit__(self, *exc):
        self.counter.__exit__(*exc)
        return False


_OWN = frozenset({_OpCount.__torch_dispatch__.__code__, Meter._trace.__code__, Meter.__exit__.__code__,
                  Idle.__enter__.__code__, Idle.__exit__.__code__})  # frames whose lines are the counter's, not the work's


def work(call, warm: tuple, counted: tuple) -> tuple[dict, object]:
    """(``{"ops": n, "lines": n}``, the output) of one ``call(*counted)``, after a warm-up
    ``call(*warm)`` (a first call's lazy set-up is not per-row work): inputs of the same shapes,
    different values."""
    try:  # the warm-up under the counter too: torch imports some of its machinery lazily
        with _OpCount(cap=WARM_OP_CAP):
            call(*warm)
    except CountCapped:  # a loop far past any allowance: the counted call shows it
        pass
    out = None  # stays None when the count stopped at LINE_CAP (the judge fails that count first)
    with Meter() as meter:
        out = call(*counted)
    return meter.counts, out


def _x(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float32) * 1.5 + 0.5


class Case(NamedTuple):
    """One counted workload: the student's code and torch's, built with the same known weights, and
    the inputs both are called on, drawn from a seed."""
    student: object  # (namespace) -> f, f(*inputs) -> the output (a tensor, or a tuple of them)
    torch: object  # () -> f, torch's own computation of the same output
    inputs: object  # (seed) -> the tuple of inputs


def _no_grad(m):
    def f(x):
        with torch.no_grad():
            return m(x)
    return f


# --- what each benchmark grows ------------------------------------------------------------------
# Each entry: (dimension, n0, n1, case at n0, case at n1).

def _norm(name, d, shape):
    def known(m):  # the benchmark's weights, on either side
        from coursekit.checks.benchmark import _bench_params
        from coursekit.checks.normcheck import set_params
        set_params(m, _bench_params(name, d), name)
        return _no_grad(m)

    def reference():
        from torch import nn
        return known(nn.LayerNorm(d) if name == "LayerNorm" else nn.RMSNorm(d, eps=1e-6))
    return Case(lambda ns: known(ns[name](d)), reference, lambda seed: (_x(shape, seed),))


def _norm_growth(name):
    return (("rows", 16, 128, _norm(name, 16, (2, 8, 16)), _norm(name, 16, (2, 64, 16))),
            ("features", 16, 128, _norm(name, 16, (2, 8, 16)), _norm(name, 128, (2, 8, 128))))


def _residual(d, shape):
    def student(ns):
        from coursekit.checks.benchmark import _res_sublayer
        return _no_grad(ns["ResidualBlock"](d, _res_sublayer(d=d), norm="layer").eval())

    def reference():
        from coursekit.checks.benchmark import _TorchResidual, _res_sublayer
        return _no_grad(_TorchResidual(_res_sublayer(d=d)).eval())
    return Case(student, reference, lambda seed: (_x(shape, seed),))


def _block(d, h, ff, shape):
    def weights():
        from coursekit.checks.seeded import block_spec, values
        return values(block_spec(d, ff), 4242)

    def student(ns):
        from coursekit.checks.seeded import load_into
        m = ns["TransformerBlock"](d, h, ff).eval()
        load_into(m, weights(), "TransformerBlock",
                  "the benchmark loads known weights by the contract's names (norm1, attn, norm2, ffn)")
        return _no_grad(m)

    def reference():
        from coursekit.checks.seeded import torch_layer
        return _no_grad(torch_layer(weights(), d, h, ff, norm_first=True).float())
    return Case(student, reference, lambda seed: (_x(shape, seed),))


def _fused(shape):
    d = shape[-1]

    def inputs(seed):
        g = torch.Generator().manual_seed(seed)
        x, r, gy, gh = (torch.randn(*shape, generator=g, dtype=torch.float32) for _ in range(4))
        return x * 1.5 + 0.5, r, torch.rand(d, generator=g, dtype=torch.float32) + 0.5, gy, gh

    def on_leaves(step):
        def f(x, r, w, gy, gh):
            leaves = [x.clone().requires_grad_(True), r.clone().requires_grad_(True), w.clone().requires_grad_(True)]
            return step(*leaves, gy, gh)
        return f

    def student(ns):
        from coursekit.checks.backward import fused_class, fused_step
        return on_leaves(fused_step(fused_class(ns)))

    def reference():
        from coursekit.checks.backward import eager_step
        return on_leaves(eager_step)
    return Case(student, reference, inputs)


def _streams(shape):
    """Exercise 06's block, forward + backward: (y, grad_x) of the student's MHCResidual with known
    parameters (res_logits the log of a known doubly stochastic matrix) against the block's formula
    with that H_res given (coursekit.checks.streams)."""
    def student(ns):
        from coursekit.checks.streams import counted_step
        return counted_step(ns["MHCResidual"], shape)

    def reference():
        from coursekit.checks.streams import counted_step
        return counted_step(None, shape)

    def inputs(seed):
        from coursekit.checks.streams import counted_streams
        return counted_streams(shape, seed)
    return Case(student, reference, inputs)


def _sinkhorn(k):
    """Exercise 06's sinkhorn_knopp on k logits whose exp is a doubly stochastic matrix up to row factors:
    the first row step reaches the result, so a softmax over the rows is torch's side."""
    def student(ns):
        f = ns["sinkhorn_knopp"]
        return lambda logits: f(logits, 20)

    def reference():
        return lambda logits: torch.softmax(logits, dim=-1)

    def inputs(seed):
        from coursekit.checks.streams import counted_logits
        return (counted_logits(k, seed),)
    return Case(student, reference, inputs)


GROWTH = types.MappingProxyType({  # read-only, and its entries tuples: a notebook cannot swap one
    "layernorm_benchmark": _norm_growth("LayerNorm"),
    "rmsnorm_benchmark": _norm_growth("RMSNorm"),
    "residual_benchmark": (
        ("tokens", 8, 64, _residual(16, (2, 8, 16)), _residual(16, (2, 64, 16))),
        ("batch", 2, 16, _residual(16, (2, 8, 16)), _residual(16, (16, 8, 16))),
        ("features", 16, 128, _residual(16, (2, 8, 16)), _residual(128, (2, 8, 128))),
    ),
    "transformer_block_benchmark": (
        ("tokens", 8, 64, _block(16, 2, 32, (2, 8, 16)), _block(16, 2, 32, (2, 64, 16))),
        ("batch", 2, 16, _block(16, 2, 32, (2, 8, 16)), _block(16, 2, 32, (16, 8, 16))),
        ("heads", 2, 8, _block(16, 2, 32, (2, 8, 16)), _block(16, 8, 32, (2, 8, 16))),
        ("features", 16, 128, _block(16, 2, 32, (2, 8, 16)), _block(128, 2, 32, (2, 8, 128))),
    ),
    "backward_benchmark": (
        ("rows", 16, 128, _fused((16, 16)), _fused((128, 16))),
        ("features", 16, 128, _fused((16, 16)), _fused((16, 128))),
    ),
    "streams_benchmark": (  # (batch, tokens, 4 streams, features); the n streams are not grown (n is fixed)
        ("tokens", 8, 64, _streams((2, 8, 4, 16)), _streams((2, 64, 4, 16))),
        ("batch", 2, 16, _streams((2, 8, 4, 16)), _streams((16, 8, 4, 16))),
        ("features", 16, 128, _streams((2, 8, 4, 16)), _streams((2, 8, 4, 128))),
        # up to the largest batch of logits any benchmark times (8192 tokens on a GPU): no loop above it
        ("matrices", 2, 8192, _sinkhorn(2), _sinkhorn(8192)),
    ),
})

#: the seed of the counted inputs when none is given (the notebook's own check); the grader gives
#: one per submission, drawn from its secret (autograder.grade), so no input is known in advance
DEFAULT_SEED = 11


def _seed(seed: int, entry: int, side: int, call: int) -> int:
    """The input seed of one call: ``side`` 0 (n0) or 1 (n1), ``call`` 0 (warm-up) or 1 (counted)."""
    return (int(seed) * 1_000_003 + entry * 4 + side * 2 + call) % (1 << 62)


#: what a loop over each dimension usually looks like, for the message
WHAT = {"rows": "rows", "tokens": "tokens", "batch": "sequences of the batch", "features": "features",
        "heads": "attention heads", "matrices": "matrices in a batch of logits"}


def _kept(out):
    """The counted call's output as the record keeps it: plain tensors (detached, on the CPU), a list
    of them for a tuple; a text naming anything else (the judge fails it)."""
    if type(out) is torch.Tensor:
        return out.detach().cpu()
    if type(out) is tuple and all(type(t) is torch.Tensor for t in out):
        return [t.detach().cpu() for t in out]
    return f"a {type(out).__name__}"


def measure(gid: str, ns: dict, seed: int | None = None) -> list[dict]:
    """The counts of benchmark ``gid`` on the student's code in ``ns``: one entry per grown
    dimension, ``{"dim", "n0", "n1", "seed", "at_n0": {"ops", "lines"}, "at_n1": {...}, "out": [y at
    n0, y at n1]}``, the inputs drawn from ``seed`` (:data:`DEFAULT_SEED` when None). Runs the
    student's code; raises what it raises."""
    seed = DEFAULT_SEED if seed is None else int(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the counts do not depend on it; the time they take does
    try:
        out = []
        for i, (dim, n0, n1, small, grown) in enumerate(GROWTH[gid]):
            e = {"dim": dim, "n0": n0, "n1": n1, "seed": seed, "out": []}
            for side, (key, case) in enumerate((("at_n0", small), ("at_n1", grown))):
                counts, y = work(case.student(ns), case.inputs(_seed(seed, i, side, 0)),
                                 case.inputs(_seed(seed, i, side, 1)))
                e[key] = counts
                e["out"].append(_kept(y))
            out.append(e)
        return out
    finally:
        torch.set_num_threads(threads)


@functools.lru_cache(maxsize=32)
def _torch_side(gid: str, entry: int, side: int):
    """torch's module for one counted call, built once per process (the judge's side only)."""
    return GROWTH[gid][entry][3 + side].torch()


def expected(gid: str, entry: int, side: int, seed: int):
    """torch's output for one counted call of :func:`measure` (the judge's side)."""
    return _torch_side(gid, entry, side)(*GROWTH[gid][entry][3 + side].inputs(_seed(seed, entry, side, 1)))


#: how close the counted call's output must be to torch's (float32, inputs of a few hundred numbers)
OUT_TOL = 5e-3

#: the assignment of each benchmark: its course solution's counts set the ceiling (:func:`ceiling`)
ASSIGNMENT = types.MappingProxyType({
    "layernorm_benchmark": "01_layernorm", "rmsnorm_benchmark": "02_rmsnorm", "residual_benchmark": "03_residual",
    "transformer_block_benchmark": "04_transformer_block", "backward_benchmark": "05_backward",
    "streams_benchmark": "06_streams"})
#: a counted call may do at most CEIL_FACTOR times the course solution's work plus CEIL_OPS ops (and
#: CEIL_OPS * LINES_PER_OP lines). Without a ceiling, a loop that runs the same number of times at
#: every counted size (padded with dummy items up to a constant) counts flat, and its counts are so
#: large that the full-size call's allowance covers a loop over the full input (the sixth red team's
#: route). Honest code stays below: separate tensor operations with a cast or a reshape the solution
#: does not need, and other algorithms (exercise 06's Sinkhorn by its scaling vectors: 431 ops where
#: the solution runs 84, ``right/06_streams/scaling_vectors_sinkhorn.py``). What still fits under it
#: is a loop over a few dozen chunks (for RMSNorm, whose solution runs 7 ops, about 150 ops at full
#: size), not one over the rows.
CEIL_FACTOR, CEIL_OPS = 8, 64


@functools.lru_cache(maxsize=8)
def _solution(assignment: str):
    try:
        from course.solutions import load_reference  # the grader's side; not in a student's pack
    except ImportError:
        return None
    try:
        return load_reference(assignment)
    except Exception:  # noqa: BLE001 -- a broken reference sets no ceiling (it costs no student a point)
        return None


@functools.lru_cache(maxsize=64)
def solution_counts(gid: str, entry: int, side: int) -> dict | None:
    """The course solution's counts on one counted call of :func:`measure` (None where the course's
    solutions are not installed: a student's own check)."""
    ns = _solution(ASSIGNMENT[gid])
    if not ns:
        return None
    case = GROWTH[gid][entry][3 + side]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        counts, _ = work(case.student(ns), case.inputs(_seed(DEFAULT_SEED, entry, side, 0)),
                         case.inputs(_seed(DEFAULT_SEED, entry, side, 1)))
    except Exception:  # noqa: BLE001
        return None
    finally:
        torch.set_num_threads(threads)
    return counts


def ceiling(sol: dict, what: str = "ops") -> int:
    """The most ``what`` (``"ops"`` or ``"lines"``) a counted call may count, for the solution's ``sol``."""
    return CEIL_FACTOR * sol[what] + CEIL_OPS * (LINES_PER_OP if what == "lines" else 1)


#: the most-run line of a counted call (``hot``: Python lines outside torch and this module, which run
#: once per op) may run at most HOT_FACTOR times as often as the course solution's busiest line, plus
#: HOT_SLACK. A loop runs its body once per item however little each iteration costs, so this holds a
#: loop to a few dozen iterations even where its body is one line of C calls (numpy on a row), which
#: ``lines`` and ``ops`` alone let through when padding fills the counted small calls (the seventh red
#: team's route). Measured: every solution and every right fixture's busiest line runs 1 to 6 times a
#: call (21 in exercise 06, Sinkhorn's 20 iterations); a loop over the benchmark's rows, 1024.
HOT_FACTOR, HOT_SLACK = 4, 64


def solution_hot(gid: str) -> int | None:
    """The course solution's busiest line over every counted call of ``gid`` (None without solutions)."""
    counts = [solution_counts(gid, i, side) for i in range(len(GROWTH[gid])) for side in (0, 1)]
    return None if any(c is None for c in counts) else max(c.get("hot", 0) for c in counts)


def hot_ceiling(sol_hot: int) -> int:
    return HOT_FACTOR * sol_hot + HOT_SLACK


def _too_hot(gid: str, counts: dict, where: str, what: str, hint: str) -> None:
    sol_hot = solution_hot(gid)
    if sol_hot is not None and counts["hot"] > hot_ceiling(sol_hot):
        raise CheckFailed(
            f"your {what} runs one line of Python {counts['hot']} times in a single call {where}; the course's "
            f"solution runs no line more than {sol_hot} times, and at most {hot_ceiling(sol_hot)} are allowed. "
            f"A line that runs once per row, token or matrix is a loop's body, however little each pass does "
            f"(a numpy call on one row is still one pass per row). {hint[:1].upper() + hint[1:]}.")


def _over_ceiling(gid: str, entry: int, side: int, counts: dict, what: str, hint: str) -> None:
    dim, n = GROWTH[gid][entry][0], GROWTH[gid][entry][1 + side]
    sol = solution_counts(gid, entry, side)
    if sol is None:
        return
    for k, unit in (("ops", "torch ops"), ("lines", "Python lines")):
        if counts[k] > ceiling(sol, k):
            raise CheckFailed(
                f"your {what} does far more work per call than vectorized code needs: with {n} {dim} one call ran "
                f"{counts['lines']} Python lines and {counts['ops']} torch ops, the course's solution "
                f"{sol['lines']} and {sol['ops']}, and at most {ceiling(sol, k)} {unit} are allowed. A loop runs its "
                f"body once per item, and one padded to the same length at every size is still a loop. "
                f"{hint[:1].upper() + hint[1:]}.")
    _too_hot(gid, counts, f"(the counted call with {n} {dim})", what, hint)


def judge(rec, gid: str, what: str, hint: str) -> None:
    """Raise :class:`CheckFailed` when the counted calls computed something else than torch on the
    same inputs and weights, or when the work of one call grows with a dimension (see the module's
    docstring for the rule); ``rec`` is :func:`measure`'s result, from wherever it ran."""
    from coursekit.checks.compare import expect_close
    dims = [g[0] for g in GROWTH[gid]]
    malformed = "the benchmark's count of your code's work is missing or malformed"
    if not (isinstance(rec, list) and [e.get("dim") if isinstance(e, dict) else None for e in rec] == dims):
        raise CheckFailed(malformed)
    for i, (e, (dim, n0, n1, _, _)) in enumerate(zip(rec, GROWTH[gid])):
        counts = [e.get("at_n0"), e.get("at_n1")]
        if not all(isinstance(c, dict) and all(type(c.get(k)) is int and c[k] >= 0 for k in ("ops", "lines", "hot", "lost"))
                   for c in counts) or (e.get("n0"), e.get("n1")) != (n0, n1) or type(e.get("seed")) is not int \
                or not (isinstance(e.get("out"), list) and len(e["out"]) == 2):
            raise CheckFailed(malformed)
        for c, n in zip(counts, (n0, n1)):
            if c["lines"] > LINE_CAP:
                a = counts[0]
                if n == n1 and a["lines"] <= LINE_CAP:  # stopped on the grown input only: it grows
                    raise CheckFailed(
                        f"your {what} does more work per call as the number of {WHAT[dim]} grows: with {n0} {dim} "
                        f"one call ran {a['lines']} Python lines and {a['ops']} torch ops, with {n1} {dim} more "
                        f"than {LINE_CAP:,} lines, where the count stopped. Vectorized code runs the same lines and "
                        f"ops whatever the size. {hint[:1].upper() + hint[1:]}. A Python loop pays the "
                        "interpreter's overhead once per item.")
                raise CheckFailed(capped(what, f"the counted call with {n} {dim}", hint))
            if c["lost"]:
                raise CheckFailed(_lost(what, f"the counted call with {n} {dim}"))
        for side, (got, n) in enumerate(zip(e["out"], (n0, n1))):
            where = f"your {what}'s output on the benchmark's counted call ({n} {dim}, a fresh random input)"
            if isinstance(got, str):
                raise CheckFailed(f"{where} is {got}, not a torch.Tensor")
            want = expected(gid, i, side, e["seed"])
            pairs = list(zip(got, want)) if isinstance(want, tuple) else [(got, want)]
            if isinstance(want, tuple) and not (isinstance(got, list) and len(got) == len(want)):
                raise CheckFailed(f"{where} should be {len(want)} tensors")
            for k, (g, w) in enumerate(pairs):
                expect_close(g, w.detach(), what=where + (f", gradient {k + 1}" if len(pairs) > 1 else ""),
                             atol=OUT_TOL, rtol=OUT_TOL, check_dtype=False)
        a, b = counts
        allowed = (n1 - n0) / 2
        if b["lines"] - a["lines"] >= allowed or b["ops"] - a["ops"] >= allowed:
            raise CheckFailed(
                f"your {what} does more work per call as the number of {WHAT[dim]} grows: with {n0} {dim} one "
                f"call ran {a['lines']} Python lines and {a['ops']} torch ops, with {n1} {dim} "
                f"{b['lines']} lines and {b['ops']} ops. Vectorized code runs the same lines and ops "
                f"whatever the size. {hint[:1].upper() + hint[1:]}. A Python loop pays the interpreter's overhead "
                "once per item.")
    for i, e in enumerate(rec):  # no growth, but work a vectorized call would not do (a padded loop)
        for side, key in enumerate(("at_n0", "at_n1")):
            _over_ceiling(gid, i, side, e[key], what, hint)


#: the full-size call may dispatch this many more torch ops than the largest counted small call, or a
#: quarter of that call's count if more (:func:`full_allowed`): the wrapping of the timed call (its input
#: chained, no ``torch.no_grad`` inside it) and a dtype or layout step taken only when needed (a cast of
#: bfloat16 on a GPU, a ``.contiguous()``) differ by a few ops; a loop over the full input's rows or
#: tokens (hundreds or thousands of them) adds far more
FULL_SLACK = 16
#: Python lines one more op may cost under the counter (torch's dispatch machinery runs about 20 per op
#: in Python while a dispatch mode is on): the lines' slack is ``FULL_SLACK`` ops' worth of them
LINES_PER_OP = 32


def full_allowed(small: int, what: str = "ops") -> int:
    """The most ``what`` (``"ops"`` or ``"lines"``) one full-size call may count, for a largest small
    count ``small``."""
    return small + max(FULL_SLACK * (LINES_PER_OP if what == "lines" else 1), small // 4)


def judge_full(full, rec, gid: str, what: str, hint: str) -> None:
    """Raise :class:`CheckFailed` when one grader-timed call at full size did more work than the
    counted small calls allow (:func:`full_allowed`). ``full``: ``{"ops", "lines", "shape"}``, counted
    by the harness around one call the grader picked among its timed calls
    (``autograder/referee/clock.py``); ``rec``: :func:`measure`'s record, already passed by
    :func:`judge`. Code that switches to a loop above the counted sizes is caught here: its small
    calls count flat, its full-size call does not."""
    if not (isinstance(full, dict) and all(type(full.get(k)) is int and full[k] >= 0 for k in ("ops", "lines", "hot", "lost"))
            and isinstance(full.get("shape"), list) and all(type(n) is int for n in full["shape"])):
        raise CheckFailed("the count of your code's work on one full-size call of the benchmark is missing or malformed")
    if full["lines"] > LINE_CAP:
        raise CheckFailed(capped(what, f"one grader-timed call on the full input ({'x'.join(map(str, full['shape']))})", hint))
    if full["lost"]:
        raise CheckFailed(_lost(what, f"one grader-timed call on the full input ({'x'.join(map(str, full['shape']))})"))
    sides = [(e[key], i, side) for i, e in enumerate(rec) for side, key in enumerate(("at_n0", "at_n1"))]
    for k, unit in (("ops", "torch ops"), ("lines", "Python lines")):
        c, i, side = max(sides, key=lambda t: t[0][k])
        if full[k] > full_allowed(c[k], k):
            dim, n = GROWTH[gid][i][0], GROWTH[gid][i][1 + side]
            raise CheckFailed(
                f"your {what} does more work per call on the benchmark's full-size input than on the counted "
                f"small ones: one grader-timed call on the full input ({'x'.join(map(str, full['shape']))}, "
                f"{prod(full['shape'])} numbers) ran {full['lines']} Python lines and {full['ops']} torch ops, the "
                f"counted call with {n} {dim} ({_numbers(gid, i, side)} numbers) {c['lines']} lines and {c['ops']} "
                f"ops, and at most {full_allowed(c[k], k)} {unit} are allowed: the work of a full-size call grew. "
                f"Vectorized code runs the same lines and ops whatever the size. {hint[:1].upper() + hint[1:]}.")
    _too_hot(gid, full, f"on the benchmark's full-size input ({'x'.join(map(str, full['shape']))})", what, hint)


def capped(what: str, where: str, hint: str) -> str:
    """The message of a count stopped at :data:`LINE_CAP`."""
    return (f"your {what} ran more than {LINE_CAP:,} Python lines in {where}, many times what any benchmark "
            f"allows one call, so the benchmark stopped counting it there; a loop over the items does that. "
            f"{hint[:1].upper() + hint[1:]}.")


def _lost(what: str, where: str) -> str:
    return (f"the benchmark's counter of your {what}'s work was switched off during {where}: its line tracer "
            "was gone, its op counter no longer on torch's dispatch stack, or a thread had been started, when "
            "the call returned (Python drops a trace function that raises, for example a RecursionError provoked "
            "deep in a call; the counter sees only the calling thread), so the work of that call could not be "
            "counted. Code that leaves sys.settrace and torch's dispatch modes alone and starts no thread in its "
            "forward is counted as usual.")


def _numbers(gid: str, entry: int, side: int) -> int:
    """How many numbers the first counted input of ``entry`` holds on ``side`` (0: n0, 1: n1)."""
    return GROWTH[gid][entry][3 + side].inputs(0)[0].numel()


def prod(shape) -> int:
    out = 1
    for n in shape:
        out *= n
    return out


def describe(rec, full=None) -> str:
    """One line for the feedback: the counts per dimension (and of the full-size call, when given)."""
    try:
        return "work per call, counted (the verdict; Python lines include torch's own Python code): " + "; ".join(
            f"{e['dim']} {e['n0']} -> {e['n1']}: {e['at_n0']['lines']} -> {e['at_n1']['lines']} Python lines, "
            f"{e['at_n0']['ops']} -> {e['at_n1']['ops']} torch ops" for e in rec) + (
            "" if full is None else f"; one grader-timed call on the full input ({'x'.join(map(str, full['shape']))}): "
            f"{full['lines']} Python lines, {full['ops']} torch ops")
    except (KeyError, TypeError):
        return "work per call: not counted"
