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

What is not counted: work in threads or processes the code starts (the grader's observers see
those start), and a loop run entirely inside C code that dispatches no torch op per item.
"""
from __future__ import annotations

import sys
import types

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from coursekit.checks import CheckFailed

# taken when this module is imported, before any student code runs in the grader's sandbox: a
# notebook that rebinds sys.settrace afterwards does not change what counts the lines
_settrace, _gettrace = sys.settrace, sys.gettrace


class _OpCount(TorchDispatchMode):
    """Counts the torch ops dispatched below autograd while it is on the mode stack."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


_OWN = frozenset({_OpCount.__torch_dispatch__.__code__})  # frames whose lines are the counter's, not the work's


def work(call, *inputs) -> dict:
    """``{"ops": n, "lines": n}`` for one ``call(inputs[1])``, after a warm-up ``call(inputs[0])``
    (a first call's lazy set-up is not per-row work). Two inputs of the same shape, different values."""
    with _OpCount():  # the warm-up under the counter too: torch imports some of its machinery lazily
        call(inputs[0])
    counter = _OpCount()
    lines = [0]

    def trace(frame, event, arg):
        if frame.f_code in _OWN:
            return None
        if event == "line":
            lines[0] += 1
        return trace

    before = _gettrace()
    with counter:
        _settrace(trace)
        try:
            call(inputs[1])
        finally:
            _settrace(before)
    return {"ops": counter.n, "lines": lines[0]}


def _x(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float32) * 1.5 + 0.5


def _calls(build, shape):
    """(call, input, input) for :func:`work`: the module from ``build()``, two inputs of ``shape``."""
    m = build()

    def call(x):
        with torch.no_grad():
            return m(x)
    return call, _x(shape, 11), _x(shape, 12)


# --- what each benchmark grows ------------------------------------------------------------------
# Each entry: (dimension, n0, n1, calls at n0, calls at n1); ``calls`` is a function of the
# notebook's namespace giving :func:`work`'s arguments.

def _norm(name, d, shape):
    return lambda ns: _calls(lambda: ns[name](d), shape)


def _norm_growth(name):
    return (("rows", 16, 128, _norm(name, 16, (2, 8, 16)), _norm(name, 16, (2, 64, 16))),
            ("features", 16, 128, _norm(name, 16, (2, 8, 16)), _norm(name, 128, (2, 8, 128))))


def _residual(d, shape):
    def calls(ns):
        from coursekit.checks.benchmark import _res_sublayer
        return _calls(lambda: ns["ResidualBlock"](d, _res_sublayer(d=d), norm="layer").eval(), shape)
    return calls


def _block(d, h, ff, shape):
    return lambda ns: _calls(lambda: ns["TransformerBlock"](d, h, ff).eval(), shape)


def _fused(shape):
    def calls(ns):
        from coursekit.checks.backward import fused_class, fused_step
        step = fused_step(fused_class(ns))
        d = shape[-1]
        g = torch.Generator().manual_seed(5)
        r, gy, gh = (torch.randn(*shape, generator=g, dtype=torch.float32) for _ in range(3))
        w = torch.rand(d, generator=g, dtype=torch.float32) + 0.5

        def call(x):
            leaves = [x.clone().requires_grad_(True), r.clone().requires_grad_(True), w.clone().requires_grad_(True)]
            return step(*leaves, gy, gh)
        return call, _x(shape, 11), _x(shape, 12)
    return calls


def _streams(shape):
    def calls(ns):
        from coursekit.checks.streams import counted_step
        return counted_step(ns, shape)
    return calls


def _sinkhorn(k):
    def calls(ns):
        from coursekit.checks.streams import counted_sinkhorn
        return counted_sinkhorn(ns, k)
    return calls


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
        ("matrices", 2, 16, _sinkhorn(2), _sinkhorn(16)),
    ),
})

#: what a loop over each dimension usually looks like, for the message
WHAT = {"rows": "rows", "tokens": "tokens", "batch": "sequences of the batch", "features": "features",
        "heads": "attention heads", "matrices": "matrices in a batch of logits"}


def measure(gid: str, ns: dict) -> list[dict]:
    """The counts of benchmark ``gid`` on the student's code in ``ns``: one entry per grown
    dimension, ``{"dim", "n0", "n1", "at_n0": {"ops", "lines"}, "at_n1": {...}}``. Runs the student's
    code; raises what it raises."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the counts do not depend on it; the time they take does
    try:
        out = []
        for dim, n0, n1, small, grown in GROWTH[gid]:
            out.append({"dim": dim, "n0": n0, "n1": n1,
                        "at_n0": work(*small(ns)), "at_n1": work(*grown(ns))})
        return out
    finally:
        torch.set_num_threads(threads)


def judge(rec, gid: str, what: str, hint: str) -> None:
    """Raise :class:`CheckFailed` when the work of one call grows with a dimension (see the module's
    docstring for the rule); ``rec`` is :func:`measure`'s result, from wherever it ran."""
    dims = [g[0] for g in GROWTH[gid]]
    if not (isinstance(rec, list) and [e.get("dim") if isinstance(e, dict) else None for e in rec] == dims):
        raise CheckFailed("the benchmark's count of your code's work is missing or malformed")
    for e, (dim, n0, n1, _, _) in zip(rec, GROWTH[gid]):
        counts = [e.get("at_n0"), e.get("at_n1")]
        if not all(isinstance(c, dict) and all(type(c.get(k)) is int and c[k] >= 0 for k in ("ops", "lines"))
                   for c in counts) or (e.get("n0"), e.get("n1")) != (n0, n1):
            raise CheckFailed("the benchmark's count of your code's work is missing or malformed")
        a, b = counts
        allowed = (n1 - n0) / 2
        if b["lines"] - a["lines"] >= allowed or b["ops"] - a["ops"] >= allowed:
            raise CheckFailed(
                f"your {what} does more work per call as the number of {WHAT[dim]} grows: with {n0} {dim} one "
                f"call ran {a['lines']} Python lines and {a['ops']} torch ops, with {n1} {dim} "
                f"{b['lines']} lines and {b['ops']} ops. Vectorized code runs the same lines and ops "
                f"whatever the size. {hint[:1].upper() + hint[1:]}. A Python loop pays the interpreter's overhead "
                "once per item.")


def describe(rec) -> str:
    """One line for the feedback: the counts per dimension."""
    try:
        return "work per call, counted (the verdict): " + "; ".join(
            f"{e['dim']} {e['n0']} -> {e['n1']}: {e['at_n0']['lines']} -> {e['at_n1']['lines']} Python lines, "
            f"{e['at_n0']['ops']} -> {e['at_n1']['ops']} torch ops" for e in rec)
    except (KeyError, TypeError):
        return "work per call: not counted"
