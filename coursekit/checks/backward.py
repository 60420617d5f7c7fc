"""Checks of exercise 05: backward passes by hand, and a fused residual-add + RMSNorm.

The student writes ``rmsnorm_backward(grad_out, x, weight, rstd)``,
``layernorm_backward(grad_out, x, weight, mean, rstd)`` and the ``torch.autograd.Function``
``FusedAddRMSNorm`` (shared/CONTRACT.md, "Backward pass"). Every judge computes what the answer
should be with autograd of the reference formula in float64, in its own process, from the same
seeds the probe used (:mod:`coursekit.checks.seeded`); a wrong answer is matched against known
mistakes, each recomputed here, so that a failure names the one that matches.

*No autograd inside the hand-written functions*: their probe calls them under
``torch.inference_mode()`` and :class:`ByHand`: a ``TorchFunctionMode`` (:class:`AutogradSpy`) that
stops the call at ``torch.autograd.grad``, ``.backward()``, forward-mode AD (``make_dual``) or while
a differentiating ``torch.func`` transform (grad, vjp, jacrev, jvp, jacfwd, hessian, under ``vmap``
or not) is on functorch's interpreter stack; a dispatch-level spy for forward-mode AD's ops (which
``DisableTorchFunction`` does not switch off); and a gate in place of autograd's engine
(``Variable._execution_engine``), which stops a backward pass in *any* thread while the function
runs. What they saw stays recorded even when the student's code catches the exception. autograd's
own record (the profiler) is read in every thread whenever another Python thread is alive, so a
thread that computes the gradient for the function is seen; starting a thread or a process during
the call raises. ``FusedAddRMSNorm.backward`` is held to the same while its probes run
(:class:`BackwardByHand`). The grader's static scan cannot do this job:
``FusedAddRMSNorm`` itself must name ``torch.autograd.Function``.

*Saved for backward*: measured, not looked for. The probe takes every tensor storage alive before
``FusedAddRMSNorm``'s forward (the garbage collector's tensors), runs forward under
``torch.autograd.graph.saved_tensors_hooks``, drops its own ``y`` and ``h``, and takes them again:
the new storages, wherever forward keeps them (ctx at any depth, a global, a closure, a class
attribute), plus every one given to ``ctx.save_for_backward`` (``weight`` among them) or hung on
ctx as an attribute (either is fine), each counted whole (a view keeps its whole buffer), are what
forward keeps. Copies outside torch count too, by their bytes: numpy arrays, ``bytes``,
``bytearray``, ``array.array`` and lists of floats reachable from ctx, or held by objects forward
made and kept. The judge bounds the bytes by ``h`` + ``weight`` + one float32 number per row.

The benchmark (``backward_benchmark``) times FusedAddRMSNorm forward + backward against eager
``x + residual`` then ``F.rms_norm``, forward + backward: bfloat16 ``16384 x 4096`` on CUDA (with
a ``torch.compile`` column), float32 ``1024 x 256`` on one CPU thread otherwise.
"""
from __future__ import annotations

import array as _array
import collections
import decimal
import gc
import hashlib
import io
import os
import sys
import threading
import time
import tracemalloc
import types
import warnings
import weakref

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from coursekit import bench
from coursekit.contract import BENCH_DTYPE, BENCH_SIZES, LAYERNORM_EPS, RMSNORM_EPS
from coursekit.checks import CheckFailed, files_written, frozen, malloc_totals, register, scaling
from coursekit.checks.benchmark import TYPICAL, LOOP_HINT, SHAPES, WORKLOAD, _plot_in_notebook, _reference
from coursekit.checks.compare import ANY, expect_close, expect_structure, expect_tensor, paired
from coursekit.checks.ops import NORM_OPS, OpRecorder
from coursekit.checks.remote import remotable
from coursekit.checks.ops import _short as _short_op
from coursekit.checks.seeded import randn

FUSED = "FusedAddRMSNorm"
#: taken when the module loads (before any student code runs in the grader's sandbox)
_blake2b = hashlib.blake2b
F64 = torch.float64


# --------------------------------------------------------------------------------------------
# No autograd inside the hand-written functions
# --------------------------------------------------------------------------------------------

#: what a hand-derived backward must not call (names as a TorchFunctionMode sees them): reverse
#: mode (``torch.autograd.grad``, ``.backward()``, ``torch.func.vjp``/``grad``/``jacrev``/``hessian``
#: end in ``grad``), forward mode (``torch.autograd.forward_ad``'s ``make_dual``, ``torch.func.jvp``
#: and ``jacfwd``, also under ``vmap``, end in ``_make_dual``)
AUTOGRAD_CALLS = frozenset({"grad", "backward", "vjp", "jvp", "jacobian", "hessian", "jacfwd", "jacrev",
                            "make_dual", "_make_dual", "unpack_dual", "_unpack_dual", "_enter_dual_level"})
#: the same, as the dispatcher sees them (below ``torch._C.DisableTorchFunction``): forward-mode AD
AUTOGRAD_OPS = frozenset({"_make_dual", "_unpack_dual"})
#: every observation of autograd inside hand-written code in this process, kept even when the
#: student's code catches the exception that stopped it: ``(owner, what)``
SEEN: list = []


def _transform_in_force() -> str | None:
    """The functorch transform that differentiates (grad or jvp: ``torch.func.grad``, ``vjp``,
    ``jacrev``, ``jvp``, ``jacfwd``, ``hessian``, under ``vmap`` or not) in force now, or None."""
    try:
        stack = torch._C._functorch.get_interpreter_stack() or ()
        kinds = {torch._C._functorch.TransformType.Grad: "torch.func (reverse mode)",
                 torch._C._functorch.TransformType.Jvp: "torch.func (forward mode)"}
        for i in stack:
            if i.key() in kinds:
                return kinds[i.key()]
    except Exception:  # noqa: BLE001 -- a torch without functorch's stack
        return None
    return None


def _refuse_autograd(owner: str, what: str):
    SEEN.append((owner, what))
    raise CheckFailed(f"{owner} calls torch.autograd ({what}): this exercise asks for the "
                      "gradient derived by hand, from the formula, so that call earns no points")


class AutogradSpy(TorchFunctionMode):
    """Stops the student's function at its first call into autograd (reverse or forward mode,
    torch.autograd or torch.func), naming the function."""

    def __init__(self, owner: str):
        super().__init__()
        self.owner = owner

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in AUTOGRAD_CALLS:
            _refuse_autograd(self.owner, name)
        t = _transform_in_force()
        if t:
            _refuse_autograd(self.owner, t)
        return func(*args, **(kwargs or {}))


class _AutogradOpSpy(TorchDispatchMode):
    """The dispatcher's view of :class:`AutogradSpy`: forward-mode AD's ops, with or without
    torch function modes switched off."""

    def __init__(self, owner: str):
        super().__init__()
        self.owner = owner

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = _short_op(func)
        if name in AUTOGRAD_OPS:
            _refuse_autograd(self.owner, name)
        return func(*args, **(kwargs or {}))


class _EngineGate:
    """Stands in for autograd's engine (``Variable._execution_engine``, which every route into a
    backward pass looks up when it runs: ``torch.autograd.grad``, ``.backward()``, ``torch.func``'s
    reverse mode), in every thread, while a hand-written function runs: a backward pass then stops
    with a message."""

    def __init__(self, engine, owner: str):
        self._engine, self._owner = engine, owner

    def run_backward(self, *args, **kwargs):
        _refuse_autograd(self._owner, "a backward pass of autograd's engine")

    def __getattr__(self, name):
        return getattr(self._engine, name)


def _legacy_config():
    """The legacy CPU profiler's settings: op names only (no shapes, memory, stacks or FLOPs)."""
    from torch._C._profiler import ProfilerState, _ExperimentalConfig
    from torch.autograd import ProfilerConfig
    return ProfilerConfig(ProfilerState.CPU, False, False, False, False, False, _ExperimentalConfig())


def _all_threads_config():
    """The Kineto CPU profiler's settings for every thread of the process (op names only)."""
    from torch._C._profiler import ProfilerState, _ExperimentalConfig
    from torch.autograd import ProfilerConfig
    return ProfilerConfig(ProfilerState.KINETO, False, False, False, False, False,
                          _ExperimentalConfig(profile_all_threads=True))


class ByHand:
    """``with ByHand(name):`` the code inside is held to "by hand": autograd (reverse and forward
    mode, torch.func's transforms) stops it, in this thread (:class:`AutogradSpy`, the dispatcher's
    view) and in any other (autograd's engine is gated). Everything it observed stays in :data:`SEEN`.

    autograd's own record is read in this thread only (the legacy profiler, about 0.1 ms a call)
    when no other Python thread is alive, and in every thread of the process otherwise (Kineto with
    ``profile_all_threads``, about 1.3 ms a call): a thread that computes the gradient while the
    function waits for it is seen, whoever started it."""

    def __init__(self, owner: str):
        self.owner = owner
        self.all_threads = False

    def __enter__(self):
        import secrets

        from torch.autograd.variable import Variable
        self._seen = len(SEEN)
        # autograd's own record, below Python: the legacy profiler notes every backward node autograd's
        # engine evaluates (whatever Python object started it: a fresh ImperativeEngine too) and every
        # forward-AD op, with torch function and dispatch modes switched off or not; a marker shows
        # that the session read at the end is this one. Its raw records (the profiler's FunctionEvents
        # would take ten times as long)
        import sys
        self.all_threads = len(sys._current_frames()) > 1
        if self.all_threads:
            import os
            from torch._C._profiler import ProfilerActivity
            os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # Kineto's start and stop lines stay off stderr
            cfg = _all_threads_config()
            torch.autograd._prepare_profiler(cfg, {ProfilerActivity.CPU})
            torch.autograd._enable_profiler(cfg, {ProfilerActivity.CPU})
        else:
            torch.autograd._enable_profiler_legacy(_legacy_config())
        self._marker = f"resnorm-by-hand-{secrets.token_hex(6)}"
        with torch.autograd.profiler.record_function(self._marker):
            pass
        self._engine = Variable.__dict__.get("_execution_engine")
        self._gate = _EngineGate(self._engine, self.owner)
        Variable._execution_engine = self._gate
        self._spies = [AutogradSpy(self.owner), _AutogradOpSpy(self.owner)]
        for m in self._spies:
            m.__enter__()
        return self

    def _profiled(self) -> None:
        """What the profiler saw (see ``__enter__``), into :data:`SEEN`."""
        try:
            with torch.autograd.profiler.record_function(self._marker + "-end"):
                pass
            if self.all_threads:
                names = {e.name() for e in torch.autograd._disable_profiler().events()}
            else:
                names = {r.name() for thread in torch.autograd._disable_profiler_legacy() for r in thread}
        except Exception:  # noqa: BLE001 -- the session was stopped by the code that ran
            SEEN.append((self.owner, "the profiler that records autograd was stopped"))
            return
        if self._marker not in names:
            SEEN.append((self.owner, "the profiler that records autograd was replaced"))
        elif self._marker + "-end" not in names:
            SEEN.append((self.owner, "the records the profiler reads were switched off"))
        engine = sorted(n for n in names if n.startswith("autograd::engine::evaluate_function"))
        dual = sorted(n for n in names if n.startswith("aten::") and n[6:] in AUTOGRAD_OPS)
        if engine:
            SEEN.append((self.owner, f"a backward pass of autograd's engine ({engine[0].split(': ')[-1]})"))
        elif dual:
            SEEN.append((self.owner, f"forward-mode AD ({dual[0][6:]})"))

    def __exit__(self, *exc):
        from torch.autograd.variable import Variable
        for m in reversed(self._spies):
            m.__exit__(*exc)
        self._profiled()
        gate = Variable.__dict__.get("_execution_engine")
        Variable._execution_engine = self._engine
        if gate is not self._gate and exc[0] is None:
            raise CheckFailed(f"while {self.owner} ran, autograd's engine was replaced: the grader's guard "
                              "against autograd was taken off, so this test gives no points")
        if len(SEEN) > self._seen and exc[0] is None:  # the student's code caught the exception
            owner, what = SEEN[self._seen]
            raise CheckFailed(f"{owner} calls torch.autograd ({what}): this exercise asks for the gradient "
                              "derived by hand, from the formula, so that call earns no points (catching the "
                              "exception does not hide it)")
        return False


class NoNewThreads:
    """While a hand-written function runs under the probe, starting a thread or a process raises:
    autograd's switches and :class:`AutogradSpy` hold in the probe's thread only, so work handed to
    a new thread or process could call autograd unseen. No derivation by hand needs either. Threads
    alive before the call may go on running (a logging ``QueueListener``): :class:`ByHand` then reads
    autograd's record in every thread, and the grader names them for review."""

    def __init__(self, owner: str):
        self.owner, self.saved = owner, []

    def _refuse(self, *args, **kwargs):
        raise CheckFailed(f"{self.owner} starts a thread or a process: while it is graded, a hand-written "
                          "backward runs in the probe's own thread (autograd's guard holds there only), so "
                          "compute it in place")

    def __enter__(self):
        import os
        import threading
        import _posixsubprocess
        import _thread
        targets = [(threading.Thread, "start"), (_thread, "start_new_thread"), (_thread, "start_new"),
                   (os, "fork"), (os, "forkpty"), (os, "posix_spawn"), (os, "posix_spawnp"),
                   (_posixsubprocess, "fork_exec")]
        for obj, attr in targets:
            if hasattr(obj, attr):
                self.saved.append((obj, attr, getattr(obj, attr)))
                setattr(obj, attr, self._refuse)
        return self

    def __exit__(self, *exc):
        for obj, attr, value in reversed(self.saved):
            setattr(obj, attr, value)
        self.saved = []
        return False


@remotable
def call_by_hand(ns: dict, name: str, *args):
    """Probe side: ``ns[name](*args)`` with autograd off and watched (see the module docstring)."""
    fn = ns[name]
    if not callable(fn) or isinstance(fn, type):
        raise CheckFailed(f"{name} should be a function, but it is {type(fn).__name__}")
    with torch.inference_mode(), NoNewThreads(name), ByHand(name):
        out = fn(*args)
    if not isinstance(out, tuple):
        raise CheckFailed(f"{name} should return a tuple of tensors, but it returned {type(out).__name__}")
    return list(out)


class BackwardByHand:
    """``with BackwardByHand(cls):`` ``cls.backward`` (an ``autograd.Function``'s) runs under
    :class:`ByHand` and :class:`NoNewThreads` whenever autograd's engine calls it, held to "by hand"
    like the two functions; the class gets its own ``backward`` back afterwards."""

    def __init__(self, cls):
        self.cls = cls
        #: the shapes of what each call of backward returned, as it returned them: autograd's engine
        #: sums a gradient of shape (B, T, D) to a weight's (D,) by itself, which hides a backward
        #: that does not sum over every leading dim
        self.returned: list = []

    def __enter__(self):
        cls = self.cls
        self.had = "backward" in cls.__dict__
        self.own = cls.__dict__.get("backward")
        original = cls.backward  # what autograd would call (a plain function: staticmethod unwrapped)
        owner = f"{cls.__name__}.backward"
        returned = self.returned

        def backward(ctx, *grads):
            with NoNewThreads(owner), ByHand(owner):
                out = original(ctx, *grads)
            returned.append([tuple(g.shape) if isinstance(g, torch.Tensor) else None
                             for g in (out if isinstance(out, tuple) else (out,))])
            return out

        self.wrapper = backward
        cls.backward = staticmethod(backward)
        return self

    def __exit__(self, *exc):
        cls = self.cls
        swapped = cls.__dict__.get("backward")
        if self.had:
            cls.backward = self.own
        else:
            delattr(cls, "backward")
        if not (isinstance(swapped, staticmethod) and swapped.__func__ is self.wrapper) and exc[0] is None:
            raise CheckFailed(f"{cls.__name__}.backward was replaced while it was graded")
        return False


# --------------------------------------------------------------------------------------------
# Reference formulas (judge side), with switches that reproduce known mistakes
# --------------------------------------------------------------------------------------------

def rms_stats(x, eps=RMSNORM_EPS):
    """rstd = 1 / sqrt(mean(x**2) + eps) over the last dim, keepdim, in float32 at least."""
    stat_dtype = torch.promote_types(x.dtype, torch.float32)
    return torch.rsqrt(x.to(stat_dtype).pow(2).mean(-1, keepdim=True) + eps)


def ln_stats(x, eps=LAYERNORM_EPS):
    """(mean, rstd) over the last dim, population variance, eps inside the root; float32 at least."""
    xf = x.to(torch.promote_types(x.dtype, torch.float32))
    mean = xf.mean(-1, keepdim=True)
    return mean, torch.rsqrt((xf - mean).pow(2).mean(-1, keepdim=True) + eps)


def _grads(fn, inputs, grad_outs):
    """Autograd of ``fn(*inputs)`` in float64 (the judge's answer): one gradient per input."""
    leaves = [t.detach().to(F64).requires_grad_(True) for t in inputs]
    with torch.enable_grad():
        out = fn(*leaves)
        out = out if isinstance(out, tuple) else (out,)
        return list(torch.autograd.grad(out, leaves, [g.to(F64) for g in grad_outs], allow_unused=True))


def rms_backward_ref(g, x, w, eps):
    """float64 (grad_x, grad_weight) of y = x / sqrt(mean(x**2) + eps) * w, by autograd."""
    return _grads(lambda x, w: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w, (x, w), (g,))


def ln_backward_ref(g, x, w, eps):
    """float64 (grad_x, grad_weight, grad_bias) of LayerNorm over the last dim, by autograd."""

    def ln(x, w, b):
        mu = x.mean(-1, keepdim=True)
        return (x - mu) * torch.rsqrt((x - mu).pow(2).mean(-1, keepdim=True) + eps) * w + b

    return _grads(ln, (x, w, torch.zeros_like(w)), (g,))


def rms_backward_mistakes(g, x, w, rstd) -> dict:
    """float64 grad_x of known mistakes in rmsnorm_backward."""
    g, x, w, r = g.to(F64), x.to(F64), w.to(F64), rstd.to(F64)
    xh, gh = x * r, g * w
    proj = (gh * xh).mean(-1, keepdim=True)
    return {
        "the projection term is missing: d/dx of x * rstd also goes through rstd, which subtracts "
        "x_hat * mean(g * weight * x_hat)": r * gh,
        "the projection term sums over the row instead of averaging: rstd = 1/sqrt(mean(x**2) + eps), "
        "so divide that sum by D": r * (gh - xh * (gh * xh).sum(-1, keepdim=True)),
        "weight is not applied to grad_out: the gradient reaching x_hat is grad_out * weight": r * (g - xh * (g * xh).mean(-1, keepdim=True)),
        "rstd enters squared, not cubed, in the projection term (it is x * rstd**3 * mean(g * weight * x))":
            r * gh - x * r.pow(2) * (gh * x).mean(-1, keepdim=True),
        "the projection term has the wrong sign: subtract x_hat * mean(g * weight * x_hat)": r * (gh + xh * proj),
    }


def ln_backward_mistakes(g, x, w, rstd) -> dict:
    g, x, w, r = g.to(F64), x.to(F64), w.to(F64), rstd.to(F64)
    xh = (x - x.mean(-1, keepdim=True)) * r
    gh = g * w
    mean_g, proj = gh.mean(-1, keepdim=True), (gh * xh).mean(-1, keepdim=True)
    return {
        "the mean term is missing: the mean depends on x too, so subtract mean(g * weight) "
        "(LayerNorm's gradient is rstd * (g_hat - mean(g_hat) - x_hat * mean(g_hat * x_hat)))": r * (gh - xh * proj),
        "the projection term is missing: the variance depends on x too, so subtract "
        "x_hat * mean(g * weight * x_hat)": r * (gh - mean_g),
        "both the mean and the projection terms are missing": r * gh,
        "weight is not applied to grad_out: the gradient reaching x_hat is grad_out * weight":
            r * (g - g.mean(-1, keepdim=True) - xh * (g * xh).mean(-1, keepdim=True)),
    }


def expect_param_grad(actual, want: torch.Tensor, name: str, x_shape, *, label="grad_weight", suspects=None,
                      **tol) -> None:
    """A parameter's gradient (``label`` in messages): shape (D,), summed over every leading dim, then values."""
    actual = expect_tensor(actual, name)
    d = want.shape[-1]
    lead = tuple(x_shape[:-1])
    if tuple(actual.shape) != (d,):
        got = tuple(actual.shape)
        if got[-1:] == (d,) and len(got) > 1:
            raise CheckFailed(f"{name} has shape {got}, expected ({d},): {label} is not summed over the "
                              f"batch dims. The same weight scales every row, so its gradient adds up the "
                              f"rows' contributions over every leading dim of x {tuple(x_shape)} "
                              f"(e.g. .reshape(-1, {d}).sum(0))")
        if got == lead or (len(got) >= 1 and got == lead[-len(got):]):
            raise CheckFailed(f"{name} has shape {got}, expected ({d},): it is summed over the wrong dim "
                              "(the feature dim). Sum over the rows, every leading dim, and keep the last")
        raise CheckFailed(f"{name} has shape {got}, expected ({d},) (weight's shape)")
    expect_close(actual, want, what=name, suspects=suspects, **tol)


# --------------------------------------------------------------------------------------------
# rmsnorm_backward and layernorm_backward (float64, 2-D and 3-D)
# --------------------------------------------------------------------------------------------

#: seed, input shape, eps, input scale and per-row offset (the offset makes LayerNorm's mean term count)
FN_CASES = (
    (501, (6, 32), 1e-6, frozen(scale=1.0, offset=0.0)),
    (502, (2, 5, 24), 1e-5, frozen(scale=2.0, offset=0.0)),
    (503, (3, 4, 16), 0.1, frozen(scale=0.3, offset=0.0)),
    (504, (8, 48), 1e-6, frozen(scale=1.0, offset=0.0)),
)
FN_TOL = dict(atol=1e-5, rtol=1e-5)  # float32 statistics inside are fine; the mistakes are far off


def fn_inputs(seed, shape, kw, dtype=F64):
    """x (rows with different means), weight about 1, grad_out: seeded, float64 then cast."""
    d = shape[-1]
    x = randn(seed, *shape, scale=kw["scale"]) + randn(seed + 1, *shape[:-1], 1, scale=1.5)
    w = 1.0 + 0.5 * randn(seed + 2, d)
    g = randn(seed + 3, *shape)
    return x.to(dtype), w.to(dtype), g.to(dtype)


def rms_probe(ns, cases, dtype=F64) -> list:
    out = []
    for seed, shape, eps, kw in cases:
        x, w, g = fn_inputs(seed, shape, kw, dtype)
        out.append(call_by_hand(ns, "rmsnorm_backward", g, x, w, rms_stats(x, eps)))
    return out


def ln_probe(ns, cases, dtype=F64) -> list:
    out = []
    for seed, shape, eps, kw in cases:
        x, w, g = fn_inputs(seed, shape, kw, dtype)
        mean, rstd = ln_stats(x, eps)
        out.append(call_by_hand(ns, "layernorm_backward", g, x, w, mean, rstd))
    return out


def rms_judge(out, cases, dtype=F64, tol=FN_TOL) -> None:
    for (seed, shape, eps, kw), got in paired(cases, out, [ANY, ANY]):
        x, w, g = fn_inputs(seed, shape, kw, dtype)
        rstd = rms_stats(x, eps)
        gx, gw = rms_backward_ref(g, x, w, eps)
        where = f"rmsnorm_backward on x of shape {tuple(shape)} ({str(dtype)[6:]}, eps={eps:g})"
        expect_close(got[0], gx.to(dtype), what=f"grad_x of {where}", suspects=rms_backward_mistakes(g, x, w, rstd), **tol)
        expect_param_grad(got[1], gw.to(dtype), f"grad_weight of {where}", shape, **tol)


def ln_judge(out, cases, dtype=F64, tol=FN_TOL) -> None:
    for (seed, shape, eps, kw), got in paired(cases, out, [ANY, ANY, ANY]):
        x, w, g = fn_inputs(seed, shape, kw, dtype)
        mean, rstd = ln_stats(x, eps)
        gx, gw, gb = ln_backward_ref(g, x, w, eps)
        where = f"layernorm_backward on x of shape {tuple(shape)} ({str(dtype)[6:]}, eps={eps:g})"
        expect_close(got[0], gx.to(dtype), what=f"grad_x of {where}", suspects=ln_backward_mistakes(g, x, w, rstd), **tol)
        xh = (x.double() - mean.double()) * rstd.double()
        expect_param_grad(got[1], gw.to(dtype), f"grad_weight of {where}", shape, suspects={
            "it sums grad_out * x, not grad_out * x_hat (the normalized x)": (g.double() * x.double()).reshape(-1, shape[-1]).sum(0),
            "it is grad_bias's value, sum(grad_out): grad_weight is sum(grad_out * x_hat)": g.double().reshape(-1, shape[-1]).sum(0),
        }, **tol)
        expect_param_grad(got[2], gb.to(dtype), f"grad_bias of {where}", shape, label="grad_bias", suspects={
            "it sums grad_out * weight: the bias is added after the weight, so grad_bias is sum(grad_out) alone":
                (g.double() * w.double()).reshape(-1, shape[-1]).sum(0),
            "it sums grad_out * x_hat (that is grad_weight): grad_bias is sum(grad_out) alone":
                (g.double() * xh).reshape(-1, shape[-1]).sum(0),
        }, **tol)


@register("rmsnorm_backward_matches_autograd", needs=("rmsnorm_backward",), forbidden_ops=NORM_OPS)
class RMSNormBackward:
    """rmsnorm_backward's grad_x and grad_weight equal autograd's within 1e-5 (float64; 2-D and 3-D inputs, several eps)"""

    @staticmethod
    def probe(ns):
        return rms_probe(ns, FN_CASES)

    @staticmethod
    def judge(out):
        rms_judge(out, FN_CASES)


@register("layernorm_backward_matches_autograd", needs=("layernorm_backward",), forbidden_ops=NORM_OPS)
class LayerNormBackward:
    """layernorm_backward's grad_x, grad_weight and grad_bias equal autograd's within 1e-5 (float64; 2-D and 3-D inputs)"""

    @staticmethod
    def probe(ns):
        return ln_probe(ns, FN_CASES)

    @staticmethod
    def judge(out):
        ln_judge(out, FN_CASES)


# --------------------------------------------------------------------------------------------
# FusedAddRMSNorm
# --------------------------------------------------------------------------------------------

@remotable
def fused_class(ns):
    cls = ns[FUSED]
    if not (isinstance(cls, type) and issubclass(cls, torch.autograd.Function)):
        raise CheckFailed(f"{FUSED} should be a class derived from torch.autograd.Function, "
                          f"but it is {cls!r:.80}")
    return cls


def fused_apply(cls, x, r, w, eps):
    out = cls.apply(x, r, w, eps)
    if not (isinstance(out, tuple) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out)):
        raise CheckFailed(f"{FUSED}.apply(x, residual, weight, eps) should return (y, h), two tensors; "
                          f"it returned {type(out).__name__}")
    return out


#: seed, shape, eps, {"scale": of x, "rscale": of the residual, "tiny": rows 0.. of tiny values}
def fused_inputs(seed, shape, kw, dtype=F64):
    """x, residual, weight, grad_y, grad_h: seeded, float64 then cast."""
    d = shape[-1]
    x = randn(seed, *shape, scale=kw.get("scale", 1.0))
    r = randn(seed + 1, *shape, scale=kw.get("rscale", 1.0)) + randn(seed + 2, *shape[:-1], 1, scale=0.5)
    if kw.get("tiny"):  # rows whose h is tiny (mean(h**2) ~ 1e-8, below eps) or zero
        x, r = x.reshape(-1, d).clone(), r.reshape(-1, d).clone()
        x[:2], r[:2] = 1e-4 * x[:2], 0.0
        x[2:4], r[2:4] = 0.0, 0.0
        x, r = x.reshape(shape), r.reshape(shape)
    w = 1.0 + 0.5 * randn(seed + 3, d)
    gy, gh = randn(seed + 4, *shape), randn(seed + 5, *shape)
    return x.to(dtype), r.to(dtype), w.to(dtype), gy.to(dtype), gh.to(dtype)


def fused_ref(x, r, w, eps, *, mistake=None):
    """float64 (y, h) of the contract's formula, or of a known mistake."""
    h = x + r
    src = x if mistake == "normalizes x" else h
    ms = src.pow(2).mean(-1, keepdim=True)
    denom = ms.sqrt() + eps if mistake == "eps outside" else (ms + eps).sqrt()
    y = src / denom * (1.0 if mistake == "no weight" else w)
    return y, h


def fused_grads_ref(x, r, w, eps, gy, gh, mistake=None):
    return _grads(lambda x, r, w: fused_ref(x, r, w, eps, mistake=mistake), (x, r, w), (gy, gh))


def fused_grad_mistakes(x, r, w, eps, gy, gh) -> dict:
    """float64 grad of x (and residual) of known mistakes in FusedAddRMSNorm's backward."""
    right = fused_grads_ref(x, r, w, eps, gy, gh)[0]
    h = (x + r).double()
    rstd = torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return {
        "the gradient flowing into h is ignored: h is an output too (the residual stream goes on), so "
        "grad_h adds to the gradient that reaches h through y": right - gh.double(),
        "the projection term is missing: d/dh of h * rstd also goes through rstd": rstd * w.double() * gy.double() + gh.double(),
        "eps is outside the square root: rstd = 1/sqrt(mean(h**2) + eps)": fused_grads_ref(x, r, w, eps, gy, gh, "eps outside")[0],
        "it normalizes x instead of h = x + residual": fused_grads_ref(x, r, w, eps, gy, gh, "normalizes x")[0],
    }


def fused_y_mistakes(x, r, w, eps) -> dict:
    return {
        "it normalizes x instead of h = x + residual": fused_ref(x, r, w, eps, mistake="normalizes x")[0],
        "eps is outside the square root: y = h / sqrt(mean(h**2) + eps) * weight": fused_ref(x, r, w, eps, mistake="eps outside")[0],
        "weight is not applied: y = h * rstd * weight": fused_ref(x, r, w, eps, mistake="no weight")[0],
    }


def fused_probe(ns, cases, dtype=F64) -> list:
    """(y, h, grad_x, grad_residual, grad_weight) per case, from random grad_y AND grad_h."""
    fused_class(ns)  # not an autograd.Function: say so before any case
    return [fused_case(ns, *fused_inputs(seed, shape, kw, dtype), eps) for seed, shape, eps, kw in cases]


@remotable
def fused_case(ns, x, r, w, gy, gh, eps) -> list:
    """One case of :func:`fused_probe`: ``[y, h, grad_x, grad_residual, grad_weight]``."""
    cls = fused_class(ns)
    leaves = [t.clone().requires_grad_(True) for t in (x, r, w)]
    with torch.enable_grad(), BackwardByHand(cls) as by_hand:
        y, h = fused_apply(cls, *leaves, eps)
        if y.grad_fn is None:
            raise CheckFailed(f"{FUSED}'s y does not require grad: is apply() called, and are the "
                              "inputs passed to it?")
        grads = torch.autograd.grad((y, h), leaves, (gy, gh), allow_unused=True)
    for shapes in by_hand.returned:
        for name, want, got in zip(("x", "residual", "weight"), (x.shape, r.shape, w.shape), shapes):
            if got is not None and got != tuple(want):
                hint = (f" ({FUSED}.backward must sum grad_weight over every leading dim of x, e.g. "
                        f".reshape(-1, {w.shape[-1]}).sum(0): autograd happened to sum the rest for you here, "
                        "but the contract asks backward for the gradient itself)") if name == "weight" else ""
                raise CheckFailed(f"{FUSED}.backward returns a gradient of {name} of shape {got} for {name} "
                                  f"of shape {tuple(want)}{hint}")
    return [y.detach(), h.detach(), *grads]


def fused_judge(out, cases, dtype=F64, tol=None) -> None:
    tol = tol or {}
    item = [ANY] * 5
    for (seed, shape, eps, kw), got in paired(cases, out, item):
        x, r, w, gy, gh = fused_inputs(seed, shape, kw, dtype)
        x64, r64, w64 = x.double(), r.double(), w.double()
        where = f"{FUSED} on x of shape {tuple(shape)} ({str(dtype)[6:]}, eps={eps:g})"
        y, h = fused_ref(x64, r64, w64, eps)
        expect_close(got[1], (x + r).to(dtype) if dtype != F64 else h, what=f"h of {where} (h = x + residual)", **tol)
        # y from the h the student's dtype holds (x + r rounded), in float64
        yr, _ = fused_ref((x + r).double(), torch.zeros_like(x64), w64, eps)
        expect_close(got[0], yr.to(dtype), what=f"y of {where}", suspects=fused_y_mistakes(x64, r64, w64, eps), **tol)
        gx, gr, gw = fused_grads_ref(x64, r64, w64, eps, gy.double(), gh.double())
        sus = fused_grad_mistakes(x64, r64, w64, eps, gy, gh)
        for name, g_got, g_want in (("x", got[2], gx), ("residual", got[3], gr)):
            if g_got is None:
                raise CheckFailed(f"{where}: no gradient reaches {name}: backward must return one for x, "
                                  "residual and weight (and None for eps)")
            expect_close(g_got, g_want.to(dtype), what=f"the gradient of {name} ({where}, random grad_y and grad_h)",
                         suspects=sus, **tol)
        if got[4] is None:
            raise CheckFailed(f"{where}: no gradient reaches weight: backward must return one for it")
        expect_param_grad(got[4], gw.to(dtype), f"the gradient of weight ({where})", shape, **tol)


FUSED_CASES = (
    (601, (6, 32), 1e-6, frozen()),
    (602, (2, 5, 24), 1e-5, frozen(scale=2.0)),
    (603, (3, 16), 0.1, frozen(scale=0.3)),
)
GRADCHECK_CASES = ((611, (3, 8), 1e-6), (612, (2, 2, 6), 1e-3))


@register("fused_add_rmsnorm_backward", needs=(FUSED,), forbidden_ops=NORM_OPS)
class FusedGradients:
    """FusedAddRMSNorm: y, h and the gradients of x, residual and weight from random grad_y and grad_h equal autograd's within 1e-5 (float64), and torch.autograd.gradcheck passes"""

    @staticmethod
    def probe(ns):
        cls = fused_class(ns)
        checks = []
        for seed, shape, eps in GRADCHECK_CASES:
            x, r, w, _, _ = fused_inputs(seed, shape, {})
            # gradcheck's fast mode compares one random projection of the Jacobian, v^T J u, from
            # backward and from finite differences of forward: a wrong backward moves it (almost
            # surely), and it takes 8 backward calls instead of one per output element. Its u and v
            # come from torch's global generator, seeded here (and put back after) so that the same
            # code always gets the same verdict
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                with BackwardByHand(cls):
                    ok = torch.autograd.gradcheck(lambda a, b, c: fused_apply(cls, a, b, c, eps),
                                                  tuple(t.requires_grad_(True) for t in (x, r, w)),
                                                  raise_exception=False, fast_mode=True)
            checks.append(bool(ok))
        return {"cases": fused_probe(ns, FUSED_CASES), "gradcheck": checks}

    @staticmethod
    def judge(out):
        expect_structure(out, {"cases": ANY, "gradcheck": [ANY] * len(GRADCHECK_CASES)})
        fused_judge(out["cases"], FUSED_CASES, F64, dict(atol=1e-5, rtol=1e-5))
        for (seed, shape, eps), ok in zip(GRADCHECK_CASES, out["gradcheck"]):
            if ok is not True:
                raise CheckFailed(f"torch.autograd.gradcheck fails on {FUSED} (x of shape {shape}, float64): "
                                  "its backward disagrees with finite differences of its forward")


FORWARD_CASES = (
    (621, (4, 64), 1e-6, frozen()),
    (622, (2, 3, 40), 1e-6, frozen(scale=3.0)),
)
FORWARD_TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.bfloat16: dict(atol=5e-2, rtol=5e-2)}


@register("fused_add_rmsnorm_forward", needs=(FUSED,), forbidden_ops=NORM_OPS)
class FusedForward:
    """FusedAddRMSNorm.apply(x, residual, weight, eps) returns y and h = x + residual, in h's dtype (float32 within 1e-4, bfloat16 within 5e-2)"""

    @staticmethod
    def probe(ns):
        cls = fused_class(ns)
        out = {}
        for dtype in FORWARD_TOL:
            res = []
            for seed, shape, eps, kw in FORWARD_CASES:
                x, r, w, _, _ = fused_inputs(seed, shape, kw, dtype)
                with torch.no_grad():
                    res.append(list(fused_apply(cls, x, r, w, eps)))
            out[str(dtype)[6:]] = res
        return out

    @staticmethod
    def judge(out):
        expect_structure(out, {str(d)[6:]: ANY for d in FORWARD_TOL})
        for dtype, tol in FORWARD_TOL.items():
            for (seed, shape, eps, kw), (y, h) in paired(FORWARD_CASES, out[str(dtype)[6:]], [ANY, ANY]):
                x, r, w, _, _ = fused_inputs(seed, shape, kw, dtype)
                where = f"{FUSED} on x of shape {tuple(shape)} ({str(dtype)[6:]})"
                expect_close(h, x + r, what=f"h of {where} (h = x + residual, in the inputs' dtype)", **tol)
                yr, _ = fused_ref((x + r).double(), 0.0, w.double(), eps)
                expect_close(y, yr.to(dtype), what=f"y of {where}",
                             suspects=fused_y_mistakes(x.double(), r.double(), w.double(), eps), **tol)


SAVED_CASES = (  # seed, shape, dtype: each x_hat is 6 KB or more in x's dtype, well above the Python
    (631, (32, 128), torch.bfloat16),  # heap's noise (HEAP_SLACK), so a copy in any form shows there
    (632, (4, 12, 64), torch.float32),
    (633, (16, 192), torch.float16),
)
#: the Python heap (tracemalloc's domain 0) forward may keep beyond what the least forward keeps
#: (:class:`_Least`, measured the same way beside it): the honest answers measured here keep 0 to
#: 700 bytes more (a dict on ctx, a tuple of shapes, a decorator's wrapper)
HEAP_SLACK = 3072
#: the smallest Python allocation the heap measure counts (see :func:`_traced_forward`)
HEAP_BLOCK = 128
#: tracemalloc's domains the heap measure counts: Python's allocator (0) and numpy's data (389047,
#: numpy's own domain): a numpy copy put into a list made before forward is new memory wherever it is
#: held (the twenty-fifth red team kept one so while shrinking an old list to offset the C totals)
HEAP_DOMAINS = frozenset({0, 389047})
#: the C allocator's growth forward may keep beyond what the least forward's keeps (see
#: :func:`_native_forward`): under the op recorder, the honest answers (tests/fixtures/right/05_backward)
#: grow 0 to 2.4 KB more, the per-row loop (wrong for its benchmark only) 2.8 KB; an x_hat copy takes
#: 8 KB or more in the first two cases above
NATIVE_SLACK = 4096


#: the bytes forward may write into files (a tmpfs counts in 4 KB pages; honest forwards write none)
FILES_SLACK = 4096

#: how many objects the walk of ctx's attributes visits at most (containers nested in ctx)
CTX_WALK_LIMIT = 100_000


def _live_storages(objects=None) -> dict:
    """Every tensor storage the interpreter can reach now: ``data_ptr -> (nbytes, tensor)``.

    Scans the objects the garbage collector tracks (tensors, and storages held on their own), so
    it finds a tensor wherever it is referenced from: a module's globals, a closure, a class
    attribute, a default argument, ctx at any depth, or only from C++ (a tensor whose Python
    object torch preserves). A view counts as its whole base storage. The dict holds the
    tensors, so no storage in it can be freed and its address reused while the caller keeps it.
    """
    # The loop over the heap calls no built-in function per object (type() and set membership are
    # not calls a profile function sees): the probe's watch on torch's norm code (a profile
    # function, coursekit.checks.ops) would otherwise be called twice per object, which made this
    # walk ten times slower. issubclass runs once per type.
    found = {}
    with warnings.catch_warnings(), torch._C.DisableTorchFunctionSubclass():
        warnings.simplefilter("ignore")  # isinstance on torch's deprecated module proxies warns
        for o in _tensor_objects(objects):
            kind = type(o)
            try:
                sts = [o if issubclass(kind, torch.UntypedStorage) else torch.Tensor.untyped_storage(o)]
            except Exception:  # noqa: BLE001 -- sparse, nested: no storage of their own, but their parts have
                sts = _part_storages(o)
                if not sts:  # an opaque tensor (MKLDNN): no storage to read, but its elements take their bytes
                    nbytes = _opaque_bytes(o)
                    if nbytes:
                        found.setdefault(("opaque", id(o)), (nbytes, o))
                    continue
            for st in sts:
                if st.device.type == "meta":
                    continue
                ptr, nbytes = st.data_ptr(), st.nbytes()
                if ptr == 0 or nbytes == 0:
                    continue
                old = found.get(ptr)
                if old is None or (isinstance(o, torch.Tensor) and
                                   (not isinstance(old[1], torch.Tensor) or o.numel() > old[1].numel())):
                    found[ptr] = (nbytes, o)
    return found


def _tensor_objects(objects=None) -> list:
    """The tensors and storages among ``objects`` (default: every object the collector tracks), in
    one pass that calls no built-in function per object: ``issubclass`` runs once per type (a
    profile function, the probe's watch on torch's norm code, would otherwise be called for each
    of some hundred thousand objects)."""
    out, tensors, others = [], set(), set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # issubclass on torch's deprecated module proxies warns
        for o in (gc.get_objects() if objects is None else objects):
            kind = type(o)
            if kind in others:
                continue
            if kind not in tensors:
                if issubclass(kind, torch.Tensor) or issubclass(kind, torch.UntypedStorage):
                    tensors.add(kind)
                else:
                    others.add(kind)
                    continue
            out.append(o)
    return out


#: the dense tensors that make up a tensor of another layout (sparse COO, compressed, nested)
_PARTS = ("_values", "_indices", "crow_indices", "col_indices", "ccol_indices", "row_indices", "values", "offsets")


def _opaque_bytes(t) -> int:
    """The bytes of a tensor with no storage Python can read (an MKLDNN tensor, the eighteenth red
    team's hiding place): its elements times their size."""
    try:
        with torch._C.DisableTorchFunctionSubclass():
            return int(torch.Tensor.numel(t)) * int(torch.Tensor.element_size(t))
    except Exception:  # noqa: BLE001
        return 0


def _part_storages(t) -> list:
    """The storages of a tensor's dense parts, when it has no storage of its own (a sparse or nested
    tensor keeps its numbers in them): a copy kept in one counts by the bytes of its parts."""
    out = []
    if not isinstance(t, torch.Tensor):
        return out
    for name in _PARTS:
        try:
            part = getattr(torch.Tensor, name)(t)
            out.append(torch.Tensor.untyped_storage(part))
        except Exception:  # noqa: BLE001 -- not a part of this layout
            continue
    return out


def _ctx_tensors(ctx) -> list:
    """The tensors hung on ctx as attributes, inside containers at any depth (lists, tuples, sets,
    dicts, objects' ``__dict__``), ``ctx.save_for_backward`` aside. Types, modules and functions
    are not entered: they lead out of ctx to the whole program."""
    return _ctx_walk(ctx)[0]


#: a list or tuple of at least this many numbers counts as a kept copy (a row's worth of floats)
BLOB_MIN_ITEMS = 16
#: an int or a str holding more than this many bytes counts as a kept copy (a name or a flag does not)
BLOB_MIN_BYTES = 64


def _is(o, kinds) -> bool:
    """``isinstance`` read from the object's type alone. The heap walks meet every object alive, and
    ``isinstance`` falls back on ``o.__class__``, which is code: a dead ``weakref.proxy`` raises
    ``ReferenceError`` there (CI saw one, left on the heap by an earlier test, fail an honest
    submission as "your code raised"), and a student's ``__class__`` property would run inside the
    measurement."""
    return issubclass(type(o), kinds)


#: the built-in containers a copy may be made of; a subclass is read through its base type's own methods
_SEQUENCES = (list, tuple, set, frozenset, collections.deque)
#: how many objects the count of one container's contents visits at most
CONTENT_LIMIT = 200_000


def _base(kind, bases):
    for b in bases:
        if issubclass(kind, b):
            return b
    return None


def _content(o, covered: set):
    """``(items, nbytes)``: the numbers, strings and bytes ``o`` holds, through nested containers at any
    depth (a list of 15-float lists is 15 floats per row: the eighteenth red team), read through the
    built-in types' own methods (a subclass cannot hide its items behind ``__iter__`` or ``__len__``).
    The ids of the nested containers counted go into ``covered``, so that none is counted again."""
    import numbers
    items, nbytes, todo, seen = 0, sys.getsizeof(o), [o], set()
    while todo and len(seen) < CONTENT_LIMIT:
        c = todo.pop()
        if id(c) in seen:
            continue
        seen.add(id(c))
        kind = type(c)
        base = _base(kind, (dict,) + _SEQUENCES)
        if base is None:
            continue
        if c is not o:
            covered.add(id(c))
            nbytes += sys.getsizeof(c)
        for v in (dict.values(c) if base is dict else base.__iter__(c)):
            vk = type(v)
            if _base(vk, (dict,) + _SEQUENCES) is not None:
                todo.append(v)
            elif issubclass(vk, (str, bytes, bytearray)) or (issubclass(vk, numbers.Number) and not issubclass(vk, bool)):
                items += 1
                nbytes += sys.getsizeof(v)
    return items, nbytes


def _blob(o, covered: set | None = None):
    """``(key, nbytes)`` when ``o`` holds a copy of data outside torch (a numpy array, bytes,
    bytearray, array.array, memoryview, a list, tuple, dict, set or deque holding at least
    :data:`BLOB_MIN_ITEMS` numbers, strings or bytes through nested containers, an int or a str of
    more than :data:`BLOB_MIN_BYTES` bytes), else None. Subclasses of these types count as the types
    (a ``bytes`` subclass hid a copy: the eighteenth red team), read through the base type's own
    methods. A numpy array counts as its whole base buffer, once; one that shares a tensor's memory is
    the tensor's (counted there). ``covered``: ids of containers already counted inside another."""
    kind = type(o)
    covered = set() if covered is None else covered
    if id(o) in covered:
        return None
    if issubclass(kind, (bytes, bytearray)):
        n = (bytes if issubclass(kind, bytes) else bytearray).__len__(o)
        return (id(o), n) if n else None
    if issubclass(kind, int) and not issubclass(kind, bool) and int.bit_length(o) > 8 * BLOB_MIN_BYTES:
        return (id(o), (int.bit_length(o) + 7) // 8)  # data packed into one big integer
    if issubclass(kind, str) and str.__len__(o) > BLOB_MIN_BYTES:  # data encoded as text (hex, base64, repr)
        return (id(o), len(str.encode(o, "utf-8", "surrogatepass")))
    if issubclass(kind, range):  # data packed into a range's bounds (the twenty-first red team)
        bits = max(int.bit_length(range.start.__get__(o)), int.bit_length(range.stop.__get__(o)),
                   int.bit_length(range.step.__get__(o)))
        return (id(o), (bits + 7) // 8) if bits > 8 * BLOB_MIN_BYTES else None
    if issubclass(kind, decimal.Decimal):  # data packed into a Decimal's digits (the twenty-first red team)
        digits = len(decimal.Decimal.as_tuple(o).digits)  # the base type's own method
        return (id(o), (digits * 10 + 23) // 24) if digits > 2 * BLOB_MIN_BYTES else None
    if kind.__module__ == "numpy" and kind.__name__ == "ndarray" and o.dtype.hasobject:
        return None  # pointers to Python objects: the walks enter it (:func:`_held`) and count what it holds
    if kind.__module__ == "numpy" and kind.__name__ == "ndarray":
        root = o
        while type(getattr(root, "base", None)).__name__ == "ndarray":
            root = root.base
        if root.base is not None and _is(root.base, torch.Tensor):
            return None
        return (id(root), int(root.nbytes)) if root.nbytes else None
    if kind.__module__ == "array" and kind.__name__ == "array":
        return (id(o), o.buffer_info()[1] * o.itemsize) if len(o) else None
    if kind is memoryview:
        try:
            return (id(o.obj), o.nbytes) if o.nbytes else None
        except ValueError:  # released
            return None
    if kind is io.BytesIO:
        try:
            with o.getbuffer() as view:
                return (id(o), view.nbytes) if view.nbytes else None
        except (ValueError, BufferError):  # closed
            return None
    if _base(kind, (dict,) + _SEQUENCES) is not None:
        inner = set()
        items, nbytes = _content(o, inner)
        if items >= BLOB_MIN_ITEMS:  # a row's worth of numbers, whatever else is among them
            covered |= inner
            return (id(o), nbytes)
    return None


def _ctx_walk(ctx):
    """``(tensors, blobs)`` hung on ctx as attributes at any depth (see :func:`_ctx_tensors`);
    ``blobs``: ``{key: nbytes}`` of the copies outside torch (:func:`_blob`)."""
    found, blobs, seen, covered, todo = [], {}, set(), set(), [vars(ctx)] if hasattr(ctx, "__dict__") else []
    while todo and len(seen) < CTX_WALK_LIMIT:
        o = todo.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if _is(o, torch.Tensor):
            found.append(o)
            todo += _tensor_attrs(o)  # a tensor's own Python attributes (rstd.x_hat = ...: round 20)
            continue
        b = _blob(o, covered)
        if b is not None:
            blobs.setdefault(*b)
            if not _is(o, _CONTAINERS):  # a container may hold tensors too
                continue
        todo += _held(o)
    return found, blobs


#: containers a copy may be made of (:func:`_blob`) that may hold tensors too
_CONTAINERS = (list, tuple, dict, set, frozenset, collections.deque)
#: what the walks do not enter: they lead out to the whole program (types, modules) or hold nothing
_OPAQUE = (type, types.ModuleType, types.CodeType, str, bytes, int, float, complex, bool, type(None),
           torch.dtype, torch.device)


def _tensor_attrs(t) -> list:
    """The values of a tensor's Python attributes (its ``__dict__``, read by the collector: no code
    of the student's runs): a copy hung on a kept tensor (``rstd.x_hat = ...``, the twentieth red
    team) is kept with it."""
    return [v for r in gc.get_referents(t) if type(r) is dict for v in dict.values(r)]


def _imported(o) -> bool:
    """Whether the module ``o`` is one the interpreter imported (``sys.modules`` holds it under its
    name): the walks do not enter those (they lead to the whole program), but a module object made
    as a box (``types.ModuleType("box")``, the twentieth red team) is entered like any object."""
    d = gc.get_referents(o)
    name = next((dict.get(r, "__name__") for r in d if type(r) is dict), None)
    return isinstance(name, str) and sys.modules.get(name) is o


def _held(o) -> list:
    """The objects ``o`` holds, for the walks from ctx and from what forward made, read by the
    collector (no code of the student's runs): a container's items, any object's ``__dict__`` and
    ``__slots__`` values, a ``functools.partial``'s arguments; a function's defaults, closure and
    attributes (not its globals: they lead to the whole program), a method's object. Types and
    modules are not entered. (A copy in an object with ``__slots__`` or in a lambda's default
    argument was not reached: the fourteenth red team.)"""
    if _is(o, torch.Tensor):
        return _tensor_attrs(o)
    if _is(o, types.ModuleType) and not _imported(o):
        return _tensor_attrs(o)  # a box's namespace: its __dict__'s values, as a tensor's attributes
    if _is(o, _OPAQUE):
        return []
    if type(o).__module__ == "numpy" and type(o).__name__ == "ndarray" and o.dtype.hasobject:
        # an array of Python objects holds them (its own bytes are pointers): round 20's object array
        return list(o.ravel(order="K"))[:CONTENT_LIMIT]
    if _is(o, types.FunctionType):
        out = list(o.__defaults__ or ()) + list((o.__kwdefaults__ or {}).values()) + list(vars(o).values())
        for cell in o.__closure__ or ():
            try:
                out.append(cell.cell_contents)
            except ValueError:  # an empty cell
                pass
        return out
    if _is(o, (types.MethodType, types.BuiltinFunctionType, types.BuiltinMethodType)):
        return [x for x in (getattr(o, "__self__", None), getattr(o, "__func__", None))
                if x is not None and not _is(x, type) and not (_is(x, types.ModuleType) and _imported(x))]
    try:
        return [r for r in gc.get_referents(o)
                if not _is(r, type) and not (_is(r, types.ModuleType) and _imported(r))]
    except Exception:  # noqa: BLE001
        return []


def _new_blobs(objects, skip) -> dict:
    """The copies outside torch (:func:`_blob`) among ``objects`` (what the collector tracks that
    forward made and kept) and the objects they hold, ``skip``'s keys aside: ``{key: nbytes}``."""
    blobs, seen, covered = {}, set(), set()
    for o in objects:
        if _is(o, type) or (_is(o, types.ModuleType) and _imported(o)):
            continue
        todo = [(o, 0)]
        while todo:
            c, depth = todo.pop()
            b = _blob(c, covered)
            if b is not None and b[0] not in skip:
                blobs.setdefault(*b)
            if depth == 0 or (not gc.is_tracked(c) and id(c) not in seen and depth < NEW_WALK_DEPTH):
                # what an object forward made holds, and on through what the collector does not track
                # (those are never among ``objects`` themselves): a tuple holding an array, an array's base
                seen.add(id(c))
                todo += [(h, depth + 1) for h in _held(c)]
    return blobs


#: how deep the walk from an object forward made goes through objects the collector does not track
NEW_WALK_DEPTH = 16


def _storage_of(t: torch.Tensor) -> tuple:
    with torch._C.DisableTorchFunctionSubclass():
        try:
            st = torch.Tensor.untyped_storage(t)
        except Exception:  # noqa: BLE001 -- opaque (MKLDNN) or sparse: counted by its elements
            return ("opaque", id(t)), _opaque_bytes(t)
        return st.data_ptr(), st.nbytes()


def _seen_as(t) -> dict:
    """The shape and dtype a kept storage was seen through, and ``span``: the bytes of the storage
    that view reaches (from the start to its last element), which a storage cannot be smaller than;
    an expanded view (stride 0) reaches fewer bytes than its elements take (the fourteenth red team:
    an honest ``rstd.expand_as(h)`` was taken for a forged record)."""
    if isinstance(t, torch.Tensor):
        with torch._C.DisableTorchFunctionSubclass():
            elem = t.element_size()
            try:
                span = 0 if t.numel() == 0 else \
                    (t.storage_offset() + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) + 1) * elem
            except Exception:  # noqa: BLE001 -- no strides (MKLDNN): its elements
                span = t.numel() * elem
        return {"shape": list(t.shape), "dtype": str(t.dtype)[6:], "span": span}
    return {"shape": [t.nbytes()], "dtype": "uint8", "span": t.nbytes()}  # a storage held on its own: its bytes


def saved_probe(ns, cases) -> list:
    """What FusedAddRMSNorm keeps alive between forward and backward, per case, *measured*.

    The probe takes the storages alive before forward, runs forward under
    ``saved_tensors_hooks``, drops its own y and h (it holds only the graph node), collects the
    garbage and takes the storages alive again: every storage that is new, plus every one given to
    ``ctx.save_for_backward`` (weight among them), is what forward keeps, wherever it keeps it.
    Each counts whole (a view of a bigger buffer keeps the buffer), once.

    Another thread's work can land in that window: a Jupyter kernel's IOPub thread sends the
    cell's ``execute_input`` message, and IPython's history thread writes the cell's source, just
    as a test cell starts, and the lists and bytes they make are new objects like forward's. So a
    case whose measurement is over the bound *only through what was found outside ctx* is measured
    again, up to :data:`SAVED_TRIES` times, and its leanest measurement is kept: a kernel's passing
    message does not come back (CI saw one, 560 bytes, once in some hundred runs of the solution),
    nor does a cache made once on a first call (torch's own or the student's). Each try draws new
    inputs of the same shape and dtype (the seed moved by :data:`SAVED_SEED_STEP`, recorded as
    ``try``): a cache keyed by the inputs misses and counts again (it hit on the same inputs, the
    eleventh red team's route), and memory an earlier try made and a later one writes into is
    fingerprinted, since everything alive before a try is taken anew.

    Memory that existed before forward counts too when forward writes into it: the CPU storages
    and the buffers outside torch (:func:`_live_buffers`: numpy, bytearray, array, mmap) alive
    before the probe are fingerprinted (blake2b) before and after forward, and one whose bytes
    changed is kept whole, like a view's buffer (an arena made in advance that forward fills: a
    torch tensor, the eleventh red team's route; a numpy array, the twelfth's). The inputs' own storages are not: writing h into x is
    h, and h is counted where it is saved.
    """
    cls = fused_class(ns)
    out = []
    _fingerprint(torch.zeros(1), -1)  # numpy's bridge loads now, not while a case is measured
    # the buffers outside torch, found once (a walk over every object's referents, the probe's
    # dearest step) and again before a retry, when an earlier try may have made one
    buffers, held = _live_buffers()
    for seed, shape, dtype in cases:
        got = None
        for k in range(SAVED_TRIES):
            if k:
                held = None  # not walked again: a list of every object would double the walk
                buffers, held = _live_buffers()
            one = _saved_once(cls, fused_inputs(seed + k * SAVED_SEED_STEP, shape, {}, dtype), buffers)
            one["try"] = k
            if got is None or _measured_total(one) < _measured_total(got):
                got = one
            if not _over_only_elsewhere(got, shape, dtype) or k == SAVED_TRIES - 1:
                break
            _settle(SAVED_SETTLE_S * 4 ** k)  # before the next try (none after the last)
        out.append(got)
    del held  # kept until every case was measured
    return out


#: how far each further try of a case moves its seed (see :func:`saved_probe`)
SAVED_SEED_STEP = 7919


def _tensor_places(heap=None) -> list:
    """``[(tensor or storage, data_ptr, nbytes)]`` for every one the collector tracks now, empty ones
    included: forward may point one made in advance at new memory (``t.set_(...)``, ``t.data = ...``,
    a storage's ``resize_``), which keeps that memory alive as a new storage would (the thirteenth red
    team's empty slots, refilled with ``set_`` and emptied again when the graph dies)."""
    out = []
    with torch._C.DisableTorchFunctionSubclass():
        for o in (_tensor_objects() if heap is None else heap):
            try:
                st = o if issubclass(type(o), torch.UntypedStorage) else torch.Tensor.untyped_storage(o)
                out.append((o, st.data_ptr(), st.nbytes()))
            except Exception:  # noqa: BLE001 -- sparse or nested: no storage of their own
                continue
    return out


def _repointed(places, skip) -> dict:
    """``{data_ptr: nbytes}`` of the memory the tensors and storages of ``places`` point at now, where
    that is not where they pointed when ``places`` was taken (and not in ``skip``)."""
    found = {}
    with torch._C.DisableTorchFunctionSubclass():
        for o, ptr, nbytes in places:
            try:
                st = o if isinstance(o, torch.UntypedStorage) else torch.Tensor.untyped_storage(o)
                now, size = st.data_ptr(), st.nbytes()
            except Exception:  # noqa: BLE001
                continue
            if (now, size) != (ptr, nbytes) and size and now not in skip:
                found[now] = size
    return found


def _live_buffers() -> tuple:
    """``({id: object}, held)``: the writable buffers outside torch alive now: numpy arrays that own
    their memory (or a view's owner, or the array itself over memory of another kind), ``bytearray``,
    ``array.array`` and ``mmap`` objects (subclasses included), among the collector's objects and the
    objects they hold (a numpy array is not tracked by the collector: it is found in the dict or list
    that holds it). Held, so no id is reused.

    ``held``: every object walked, and what the untracked dicts among them hold (a dict of bytes is
    not tracked by the collector). While the caller keeps it, forward cannot free an object made
    before it: freeing one would lower the C allocator's totals (:func:`_native_forward`) by as
    much as a copy kept elsewhere raises them."""
    objects = gc.get_objects()
    kinds = tuple({bytearray} | {getattr(sys.modules.get(m), n, bytearray) for m, n in (("array", "array"), ("mmap", "mmap"))})
    numpy = sys.modules.get("numpy")
    arrays = numpy.ndarray if numpy is not None else ()
    found = {}
    # the common types are passed over with one set look-up each (no call per object)
    common = {dict, list, tuple, str, int, float, set, frozenset, type, types.FunctionType, types.CellType,
              types.MethodType, types.BuiltinFunctionType, types.CodeType, types.ModuleType, bool, type(None)}
    what = {}  # type -> "buffer" or "array", looked up once per type
    held = objects + gc.get_referents(*objects)
    untracked = []
    for o in held:
        kind = type(o)
        if kind in common:
            if kind is dict and not gc.is_tracked(o):
                untracked.append(o)
            elif kind is list and len(o) >= BLOB_MIN_ITEMS:
                found[id(o)] = o  # an arena of items made in advance (see _fingerprint_buffer)
            continue
        got = what.get(kind)
        if got is None:
            got = what[kind] = ("buffer" if issubclass(kind, kinds) else
                                "array" if arrays and issubclass(kind, arrays) else
                                # a random generator's state takes bytes set_state puts there (the
                                # twenty-fifth red team kept x_hat in mt19937 states made in advance)
                                "generator" if issubclass(kind, torch.Generator) else
                                "list" if issubclass(kind, list) else "")
            if not got:
                common.add(kind)
                continue
        if got == "buffer" or got == "generator" or got == "list" and len(o) >= BLOB_MIN_ITEMS:
            found[id(o)] = o
            continue
        if got == "list":
            continue
        while type(getattr(o, "base", None)).__name__ == "ndarray":
            o = o.base
        base = o.base
        if base is None:
            found[id(o)] = o
        elif isinstance(base, kinds):
            found[id(base)] = base
        elif not (isinstance(base, (bytes, torch.Tensor)) or type(base).__name__ == "PyCapsule"):
            # memory of another kind (a memoryview of a C object's buffer): the array itself
            found[id(o)] = o
        # else: a torch tensor's memory (fingerprinted as a storage) or bytes (read-only)
    held.extend(v for d in untracked for v in d.values())
    return found, held


def _fingerprint_buffer(o):
    """A digest of a buffer's bytes (see :func:`_live_buffers`; a generator's: its state), as an int;
    None if it cannot be read."""
    if isinstance(o, torch.Generator):
        try:
            return int.from_bytes(_blake2b(o.get_state().numpy().tobytes(), digest_size=16).digest(), "little")
        except Exception:  # noqa: BLE001
            return None
    try:
        return int.from_bytes(_blake2b(memoryview(o).cast("B"), digest_size=16).digest(), "little")
    except Exception:  # noqa: BLE001 -- closed, released or not contiguous
        try:
            return int.from_bytes(_blake2b(o.tobytes(), digest_size=16).digest(), "little")
        except Exception:  # noqa: BLE001
            return None


#: how many times a case over the bound only through objects outside ctx is measured (see saved_probe)
SAVED_TRIES = 3
#: the pause before measuring such a case again (four times longer before each further try)
SAVED_SETTLE_S = 0.05


def _settle(seconds: float) -> None:
    """Let a Jupyter kernel's IOPub thread send what it holds (a function scheduled on it runs after
    everything queued before), then pause: its messages are gone before the next measurement."""
    try:
        ipython = sys.modules.get("IPython")
        shell = ipython.get_ipython() if ipython is not None else None
        iopub = getattr(getattr(shell, "kernel", None), "iopub_thread", None)
        if iopub is not None and hasattr(iopub, "schedule"):
            sent = threading.Event()
            iopub.schedule(sent.set)
            sent.wait(1.0)
    except Exception:  # noqa: BLE001 -- no kernel, or another one: the pause alone
        pass
    time.sleep(seconds)


def _kept_total(kept) -> int:
    return sum(k["nbytes"] for k in kept)


def kept_bound(shape, dtype, rstd_elem: int) -> int:
    """The bytes forward may keep: h + weight + one rstd number per row (``rstd_elem`` bytes)."""
    d, rows = shape[-1], scaling.prod(shape[:-1])
    elem = torch.empty((), dtype=dtype).element_size()
    return rows * d * elem + d * elem + rows * rstd_elem


def _rstd_elem(ts, shape) -> int:
    """8 when the per-row tensor kept is float64 (the contract allows rstd "in at least float32")."""
    d, rows = shape[-1], scaling.prod(shape[:-1])
    per_row = [t for t in ts if t.numel() == rows and t.numel() != d]
    return 8 if per_row and per_row[0].dtype == torch.float64 else 4


def python_excess(python) -> int:
    """The Python heap a measurement's forward kept beyond the least forward's and :data:`HEAP_SLACK`
    (0 when within them); a record without the numbers (tracing switched off) counts as none here:
    the judge fails it."""
    if not (isinstance(python, list) and len(python) == 2 and all(type(v) is int for v in python)):
        return 0
    return max(0, python[0] - python[1] - HEAP_SLACK)


def native_excess(native) -> int:
    """The C allocator's growth a measurement's forward kept beyond the least forward's and
    :data:`NATIVE_SLACK` (0 when within them, or when not read)."""
    if not (isinstance(native, list) and len(native) == 2 and all(type(v) is int for v in native)):
        return 0
    return max(0, native[0] - native[1] - NATIVE_SLACK)


def _measured_total(got) -> int:
    files = got.get("files") or [0]
    return _kept_total(got["kept"]) + python_excess(got.get("python")) + native_excess(got.get("native")) + \
        max(0, files[0] - FILES_SLACK)


def _over_only_elsewhere(got, shape, dtype) -> bool:
    """Whether a measurement is over the bound, and within it without what was found elsewhere (the
    objects outside ctx, the Python heap and the C allocator's totals, where another thread's work
    can land too)."""
    bound = kept_bound(shape, dtype, _rstd_elem(got["saved"] + got["attrs"], shape))
    total = _measured_total(got)
    rest = sum(k["nbytes"] for k in got["kept"] if k["where"] != "elsewhere")
    return total > bound >= rest


class _Least(torch.autograd.Function):
    """What any FusedAddRMSNorm's forward makes in Python at the least: a graph node, its ctx, three
    saved tensors (h, weight, one number per row) and two outputs. Not a normalization: only the
    baseline that :func:`_traced_forward` measures beside the student's forward."""

    @staticmethod
    def forward(ctx, x, residual, weight, eps):
        h = x + residual
        ctx.save_for_backward(h, weight, h[..., :1].float())
        return h * weight, h

    @staticmethod
    def backward(ctx, grad_y, grad_h):  # never called: the measurement drops the graph
        return grad_y, grad_y, None, None


def _traced_forward(cls, leaves, pack):
    """``(node, python_bytes)``: forward run under the saved-tensor hooks with ``y`` and ``h`` dropped
    and the garbage collected, and the bytes of the Python objects forward made that are still alive
    then (tracemalloc's traces in the Python allocator's domain, 0: lists, bytes, ints, Decimals,
    ranges and objects of any type, which the walk of known types may miss; torch's own memory is
    not traced, and numpy's data is in another domain, found by the walk). ``python_bytes`` is None
    when forward switched tracing off."""
    if tracemalloc.is_tracing():  # a notebook's own tracing (flagged by the review): ours replaces it
        tracemalloc.stop()
    tracemalloc.start(1)
    try:
        node = _forward_node(cls, leaves, pack)
        snap = tracemalloc.take_snapshot() if tracemalloc.is_tracing() else None
    finally:
        if tracemalloc.is_tracing():
            tracemalloc.stop()
    # what the course's own code made while forward ran is the course's, however much work forward
    # did: the probe's pack hook (a detached alias per saved tensor), the op recorder's record, the
    # observers' (an allocation is charged to the Python line that was running when it was made)
    # Blocks under HEAP_BLOCK bytes are not counted: torch leaks a few short strings per call while
    # a torch function mode is on (the op recorder's: "__torch_function__" and op names, 51 to 67
    # bytes each, charged to the line that called the op), so a loop of many ops would read as a copy.
    # A copy in Python takes blocks bigger than that wherever it is held in a container or in one
    # value (bytes, an int, a Decimal's digits, a list's or tuple's array, an array of objects).
    python = None if snap is None else sum(
        t.size for t in snap.traces if t.domain in HEAP_DOMAINS and t.size >= HEAP_BLOCK
        and not t.traceback[0].filename.startswith(_COURSE_DIRS))
    return node, python


def _forward_node(cls, leaves, pack):
    """Forward run under the saved-tensor hooks, its outputs dropped and the garbage collected: the
    graph node, which holds what forward keeps."""
    # anomaly mode off while forward runs (a notebook may have switched it on): it hangs a
    # traceback string on every node, which is not what forward keeps
    with torch.enable_grad(), torch.autograd.set_detect_anomaly(False), \
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y, h = fused_apply(cls, *leaves, RMSNORM_EPS)
    node = y.grad_fn
    del y, h  # the outputs are the caller's; what stays alive now is what forward keeps
    gc.collect()
    return node


def _native_forward(cls, leaves, pack) -> int | None:
    """The growth of the C allocator's totals (:mod:`coursekit.checks.malloc_totals`) across forward
    (run as :func:`_forward_node` runs it, with tracemalloc off: its own tables grow and shrink by
    kilobytes while torch's ops run under a function mode), while its node is alive: torch's storages,
    autograd's nodes, Python's blocks bigger than pymalloc's, and memory a C library keeps with its
    own ``malloc`` (an in-memory database, a compressor), which the walks and tracemalloc do not see.
    None where the totals cannot be read."""
    if tracemalloc.is_tracing():
        tracemalloc.stop()
    gc.collect()
    before = malloc_totals.in_use()
    if before is None:
        return None
    node = _forward_node(cls, leaves, pack)
    grown = malloc_totals.in_use() - before
    del node
    gc.collect()
    return grown


#: the folders of the course's code that runs beside the student's (see :func:`_traced_forward`):
#: coursekit, and the grader's inside (its harness and observers: ``autograder/inside``, bound
#: read-only at ``/grader`` in the sandbox, autograder.sandbox.bwrap.INSIDE_IN)
_KIT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_COURSE_DIRS = (_KIT + os.sep, os.path.join(os.path.dirname(_KIT), "autograder", "inside") + os.sep, "/grader/")


def _packer():
    """``(pack, packed)``: a saved-tensor pack hook that gives the node a detached alias of each saved
    tensor (same storage: an output saved as itself would hold its own grad_fn through the hook, a
    cycle the collector cannot see, and outlive the measurement), and the weak references to them."""
    packed = []

    def pack(t):
        held = t.detach()
        packed.append(weakref.ref(held))
        return held

    return pack, packed


def _least_kept(inputs) -> tuple:
    """``(python_bytes, native_bytes)`` that :class:`_Least`'s forward keeps on these inputs (see
    :func:`_traced_forward`, :func:`_native_forward`)."""
    pack, _ = _packer()
    leaves = [t.clone().requires_grad_(True) for t in inputs[:3]]
    native = _native_forward(_Least, leaves, pack)
    node, python = _traced_forward(_Least, leaves, pack)
    del node
    return python, native


def _saved_once(cls, inputs, old_buffers) -> dict:
    """One measurement of what forward keeps on one case (see :func:`saved_probe`; ``inputs``:
    :func:`fused_inputs`, made before anything is taken; ``old_buffers``: :func:`_live_buffers`)."""
    x, r, w, _, _ = inputs
    heap = _tensor_objects()  # one walk over the heap for both
    old = _live_storages(heap)  # every storage alive now (held, so no address is reused)
    old_tensors = _tensor_places(heap)  # where every tensor alive points, empty ones included
    del heap
    pack, packed = _packer()
    leaves = [t.clone().requires_grad_(True) for t in (x, r, w)]
    ours = _live_storages([x, r, w, *leaves])
    before = dict(old)
    before.update(ours)
    # what was in memory before forward: forward may write into it (an arena made in advance)
    prints = {ptr: (nbytes, o, fp) for ptr, (nbytes, o) in old.items()
              if ptr not in ours and (fp := _fingerprint(o, ptr)) is not None}
    # old lists by the objects they hold: small ints or one-character strings written over an old
    # list's items (CPython's cached objects: no new memory, so no measure grows; the twenty-fifth
    # red team's arena) count by the items forward changed
    list_ids = {key: _list_ids(o) for key, o in old_buffers.items() if isinstance(o, list)}
    buffer_prints = {key: fp for key, o in old_buffers.items()
                     if not isinstance(o, list) and (fp := _fingerprint_buffer(o)) is not None}
    # Everything alive now is frozen: the collector then scans, and get_objects returns, only the
    # objects made from here on (what forward made and kept), which is fast on a big heap.
    gc.freeze()
    try:
        least, least_native = _least_kept(inputs)  # the baseline, measured the same way just before
        # the C allocator's totals and the files first, on leaves of its own (forward may hang things
        # on its leaves)
        places = files_written.places()
        files_before = files_written.state(places)
        native = _native_forward(cls, [t.clone().requires_grad_(True) for t in (x, r, w)], _packer()[0])
        files_after = files_written.state(places, digest=False)
        files = [files_written.written(files_before, files_after),
                 bool(files_before["complete"] and files_after["complete"])]
        # gone before the objects forward made are taken: the folders' names and the files' are the
        # course's own strings, made after the freeze (a folder named with more than BLOB_MIN_BYTES
        # characters read as a copy kept: pytest's folders under xdist, a student's long cwd)
        del places, files_before, files_after
        node, python = _traced_forward(cls, leaves, pack)
        if node is None:
            raise CheckFailed(f"{FUSED}'s y does not require grad: is apply() called, and are the "
                              "inputs passed to it?")
        made = gc.get_objects()
        after = _live_storages(made)
    finally:
        gc.unfreeze()
    written = {ptr: nbytes for ptr, (nbytes, o, fp) in prints.items() if _fingerprint(o, ptr) != fp}
    changed = {key: n for key, ids in list_ids.items() if (n := _items_changed(old_buffers[key], ids))}
    if sum(changed.values()) > LIST_SLACK_ITEMS:
        written.update({("list", key): 8 * n for key, n in changed.items()})
    del list_ids
    written.update({("buffer", key): _buffer_bytes(old_buffers[key]) for key, fp in buffer_prints.items()
                    if _fingerprint_buffer(old_buffers[key]) != fp})
    repointed = _repointed(old_tensors, ours)
    saved = [t for ref in packed if (t := ref()) is not None]
    attrs, on_ctx = _ctx_walk(node)
    elsewhere = _new_blobs(made, on_ctx)
    # what forward hung on the tensors it was given (the probe's own leaves, made with no attributes:
    # weight.x_hat_bytes = ..., the twenty-first red team): an old object's new attributes
    for key, nbytes in _new_blobs([v for t in leaves for v in _tensor_attrs(t)], on_ctx).items():
        elsewhere.setdefault(key, nbytes)
    del made, prints
    kept = {}
    # copies outside torch (numpy, bytes, lists of numbers) count like tensors: bytes kept
    for label, blobs in (("ctx", on_ctx), ("elsewhere", elsewhere)):
        for key, nbytes in blobs.items():
            kept.setdefault(("blob", key), {"nbytes": nbytes, "shape": [nbytes, 1], "dtype": "uint8", "span": nbytes,
                                            "where": label})
    for label, ts in (("saved", saved), ("ctx", attrs)):  # new or not (weight existed before forward)
        for t in ts:
            ptr, nbytes = _storage_of(t)
            kept.setdefault(ptr, {"nbytes": nbytes, **_seen_as(t), "where": label})
    for ptr, (nbytes, o) in after.items():
        if ptr not in before:
            kept.setdefault(ptr, {"nbytes": nbytes, **_seen_as(o), "where": "elsewhere"})
    for ptr, nbytes in written.items():  # a buffer forward wrote into keeps what it wrote: counted whole
        kept.setdefault(ptr, {"nbytes": nbytes, "shape": [nbytes], "dtype": "uint8", "span": nbytes, "where": "written"})
    for ptr, nbytes in repointed.items():  # memory a tensor made before forward now points at
        kept.setdefault(ptr, {"nbytes": nbytes, "shape": [nbytes], "dtype": "uint8", "span": nbytes, "where": "repointed"})
    got = {"saved": [_plain(t) for t in saved],
           "attrs": [_plain(t) for t in attrs],
           "kept": sorted(kept.values(), key=lambda k: (-k["nbytes"], k["where"])),
           # the Python heap forward keeps, and the least forward's (see _traced_forward); None: off
           "python": None if python is None or least is None else [int(python), int(least)],
           # the C allocator's growth forward keeps, and the least forward's (see _native_forward);
           # None: not read (no mallinfo2 here)
           "native": None if native is None or least_native is None else [int(native), int(least_native)],
           # the bytes forward wrote into files (see coursekit.checks.files_written), and whether every
           # file of the writable folders was read
           "files": files}
    del node, saved, attrs, before, after, old, old_buffers, old_tensors
    return got


def _plain(t) -> torch.Tensor:
    """A strided copy of a kept tensor for the record (an MKLDNN or sparse one made dense)."""
    t = t.detach()
    try:
        return t.clone() if t.layout == torch.strided else t.to_dense()
    except Exception:  # noqa: BLE001
        return torch.zeros(0)


def _list_ids(o) -> _array.array:
    """Which objects an old list holds, in order (their ids)."""
    return _array.array("Q", map(id, list.copy(o)))


def _items_changed(o, ids) -> int:
    """How many of an old list's items forward replaced, added or removed (see :func:`_list_ids`)."""
    now = _list_ids(o)
    if now == ids:
        return 0
    return sum(a != b for a, b in zip(ids, now)) + abs(len(now) - len(ids))


#: items of old lists forward may replace or add, in all (torch appends an op's name to
#: ``torch.ops.aten._dir`` the first time the process uses the op); a copy of x_hat written over an
#: old list's items, one byte or one number per item, takes thousands
LIST_SLACK_ITEMS = 256


def _buffer_bytes(o) -> int:
    if isinstance(o, torch.Generator):
        try:
            return int(o.get_state().numel())
        except Exception:  # noqa: BLE001
            return 1
    try:
        return memoryview(o).nbytes
    except Exception:  # noqa: BLE001
        return max(1, len(o))


def _fingerprint(o, ptr):
    """A digest of the bytes of the CPU storage at ``ptr`` (held through ``o``, a tensor or a
    storage, or a sparse or nested tensor whose part it is), as an int; None for a storage elsewhere
    or one ``o`` no longer shows."""
    try:
        with torch._C.DisableTorchFunctionSubclass():
            if isinstance(o, torch.UntypedStorage):
                st = o
            else:
                # a sparse tensor's values are its parts' storages (an arena of sparse tensors made in
                # advance and filled in place: the twenty-fifth red team's route)
                st = next((p for p in _part_storages(o) if p.data_ptr() == ptr), None) or \
                    torch.Tensor.untyped_storage(o)
            if st.device.type != "cpu" or st.data_ptr() != ptr or st.nbytes() == 0:
                return None
            flat = torch.empty(0, dtype=torch.uint8).set_(st)
            return int.from_bytes(_blake2b(flat.numpy(), digest_size=16).digest(), "little")
    except Exception:  # noqa: BLE001 -- sparse or nested (no storage of its own), or gone
        return None


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _describe(ts) -> str:
    return ", ".join(f"{tuple(t.shape)} {str(t.dtype)[6:]}" for t in ts) or "nothing"


KEPT_ITEM = {"nbytes": ANY, "shape": ANY, "dtype": ANY, "span": ANY, "where": ANY}
WHERE_KEPT = ("saved", "ctx", "elsewhere", "written", "repointed")


def _numel(k) -> int:
    n = 1
    for s in k["shape"]:
        n *= s
    return n


def _seen_bytes(k) -> int:
    """The bytes of the tensor a kept storage was seen through (less than the storage: a view)."""
    return _numel(k) * torch.empty((), dtype=getattr(torch, k["dtype"])).element_size()


def _describe_kept(ks) -> str:
    return ", ".join(f"{tuple(k['shape'])} {k['dtype']}" + (f" (a view of a {k['nbytes']}-byte buffer)"
                                                            if k["nbytes"] > _seen_bytes(k) else "")
                     for k in ks) or "nothing"


def _describe_written(ks) -> str:
    return ", ".join(f"a buffer of {k['nbytes']} bytes" for k in ks)


def _expect_kept(kept) -> list:
    if not isinstance(kept, list):
        raise CheckFailed("the probe's record of saved tensors is malformed")
    for k in kept:
        expect_structure(k, KEPT_ITEM)
        if not (type(k["nbytes"]) is int and k["nbytes"] > 0 and type(k["span"]) is int and k["span"] >= 0
                and isinstance(k["shape"], list)
                and all(type(s) is int and s >= 0 for s in k["shape"]) and k["where"] in WHERE_KEPT
                and isinstance(k["dtype"], str) and isinstance(getattr(torch, k["dtype"], None), torch.dtype)):
            raise CheckFailed("the probe's record of saved tensors is malformed")
    return kept


def _expect_kept_matches_saved(kept, saved) -> None:
    """The record's two views of one measurement agree: each tensor given to save_for_backward is
    one kept storage labelled "saved" (its shape and dtype), and no kept storage is smaller than
    the tensor it was seen through. A record emptied or cut short on its way out fails here."""
    from collections import Counter

    want = Counter((tuple(t.shape), str(t.dtype)[6:]) for t in saved)
    got = Counter((tuple(k["shape"]), k["dtype"]) for k in kept if k["where"] == "saved")
    if got != want or any(k["nbytes"] < k["span"] for k in kept):
        raise CheckFailed("the probe's record of what forward keeps does not match the tensors it saved")


def saved_judge(out, cases) -> None:
    for (seed, shape, dtype), got in paired(cases, out, {"saved": ANY, "attrs": ANY, "kept": ANY, "try": ANY,
                                                         "python": ANY, "native": ANY, "files": ANY}):
        if not (isinstance(got["saved"], list) and isinstance(got["attrs"], list)
                and type(got["try"]) is int and 0 <= got["try"] < SAVED_TRIES):
            raise CheckFailed("the probe's record of saved tensors is malformed")
        seed += got["try"] * SAVED_SEED_STEP  # the inputs of the measurement kept
        ts = [expect_tensor(t, "a saved tensor") for t in got["saved"] + got["attrs"]]
        kept = _expect_kept(got["kept"])
        _expect_kept_matches_saved(kept, got["saved"])
        d, rows = shape[-1], scaling.prod(shape[:-1])
        per_row = [t for t in ts if t.numel() == rows and t.numel() != d]
        # the contract: rstd "in at least float32": a float64 one takes 8 bytes a row
        rstd_elem = _rstd_elem(ts, shape)
        bound = kept_bound(shape, dtype, rstd_elem)
        where = f"{FUSED} on x of shape {tuple(shape)} ({str(dtype)[6:]})"
        total = sum(k["nbytes"] for k in kept)
        # tensors kept as attributes of ctx count like saved ones (either is fine), by their bytes
        big = [k for k in kept if _numel(k) == rows * d and k["dtype"] != "uint8"]
        copies = [k for k in kept if k["dtype"] == "uint8" and k["shape"][1:] == [1]]  # copies outside torch
        elsewhere = [k for k in kept if k["where"] == "elsewhere"]
        views = [k for k in kept if k["nbytes"] > _seen_bytes(k)]
        written = [k for k in kept if k["where"] == "written"]
        repointed = [k for k in kept if k["where"] == "repointed"]
        if total > bound:
            if repointed:
                msg = (f"forward points a tensor that existed before it was called at new memory "
                       f"({_describe_written(repointed)}: with set_, .data = or a storage's resize_?), which keeps "
                       "it alive until backward like a saved tensor. Keep only h, weight and rstd")
            elif written:
                msg = (f"forward writes into memory that existed before it was called ({_describe_written(written)}: "
                       "an arena or a workspace made in advance?), and what it writes there stays until backward "
                       "like a saved tensor: the buffer counts whole. Keep only h, weight and rstd")
            elif copies and total - sum(k["nbytes"] for k in copies) <= bound:
                msg = (f"forward keeps a copy outside torch as well ({_describe_kept(copies)} bytes: a numpy "
                       "array, bytes or a list of numbers on ctx or elsewhere?). It stays alive until backward "
                       "like a saved tensor: keep only h, weight and rstd")
            elif [k for k in kept if k["where"] == "ctx" and k["dtype"] != "uint8"]:
                on_ctx = [k for k in kept if k["where"] == "ctx"]
                msg = (f"it keeps tensors as attributes of ctx ({_describe_kept(on_ctx)}) beside what it saves: "
                       "ctx attributes count like saved tensors. Keep only h, weight and rstd (on ctx or with "
                       "ctx.save_for_backward)")
            elif elsewhere:
                msg = (f"forward keeps tensors alive outside ctx ({_describe_kept(elsewhere)}: in a global, "
                       "a closure, a class attribute?). They stay alive until backward like saved ones: save "
                       "h, weight and rstd with ctx.save_for_backward, and nothing else")
            elif views:
                msg = (f"it saves a view of a bigger buffer ({_describe_kept(views)}): a view keeps its whole "
                       "buffer alive. Save h, weight and rstd themselves")
            elif len(big) > 1:
                msg = ("it saves more than h among the (rows, D) tensors (x and residual, the normalized "
                       "output, or a float32 copy of h?): save h = x + residual alone, and recompute the "
                       "rest from h and rstd in backward")
            elif big and big[0]["dtype"] != str(dtype)[6:]:
                msg = f"it saves h in {big[0]['dtype']}, not in h's own dtype: save h itself"
            else:
                msg = "save only h, weight and rstd (one float32 number per row)"
            raise CheckFailed(f"{where} keeps {total} bytes alive for backward ({_describe_kept(kept)}); h + weight "
                              f"+ a {'float64' if rstd_elem == 8 else 'float32'} rstd per row take {bound}: {msg}")
        python = got["python"]
        if python is None:
            raise CheckFailed(f"{where}: forward switched off Python's allocation tracing (tracemalloc) while "
                              "the probe measured what it keeps, so what it keeps could not be measured")
        if not (isinstance(python, list) and len(python) == 2 and all(type(v) is int and v >= 0 for v in python)):
            raise CheckFailed("the probe's record of saved tensors is malformed")
        excess = python_excess(python)
        if excess:
            raise CheckFailed(
                f"{where} keeps {python[0] - python[1]} bytes of Python objects alive for backward beyond what "
                f"a forward that saves only h, weight and rstd keeps (measured with tracemalloc; {HEAP_SLACK} "
                "are allowed for bookkeeping): a copy outside torch in a form the probe does not name (bytes, "
                "ints, a list, an object of your own?) stays alive until backward like a saved tensor. Keep only "
                "h, weight and rstd")
        native = got["native"]
        if native is None and malloc_totals.readable():  # the judge's machine reads them: so does the probe's
            raise CheckFailed(f"{where}: the C allocator's totals (mallinfo2) were not read while the probe measured "
                              "what forward keeps, so what it keeps outside Python and torch could not be measured")
        if native is not None and not (isinstance(native, list) and len(native) == 2
                                       and all(type(v) is int for v in native)):
            raise CheckFailed("the probe's record of saved tensors is malformed")
        files = got["files"]
        if not (isinstance(files, list) and len(files) == 2 and type(files[0]) is int and type(files[1]) is bool):
            raise CheckFailed("the probe's record of saved tensors is malformed")
        if not files[1]:
            raise CheckFailed(f"{where}: the writable folders hold more than {files_written.MAX_FILES} files, so "
                              "what forward writes into files could not be measured")
        if files[0] > FILES_SLACK:
            raise CheckFailed(f"{where} writes {files[0]} bytes into files while it runs (kept for backward "
                              "like a saved tensor: a file in the sandbox is memory too). Keep only h, weight "
                              "and rstd, in memory")
        excess = native_excess(native)
        if excess:
            raise CheckFailed(
                f"{where} keeps {native[0] - native[1]} bytes more of the C allocator's memory (malloc) alive for "
                f"backward than a forward that saves only h, weight and rstd ({NATIVE_SLACK} are allowed for "
                "bookkeeping): memory a C library holds for you (a database, a compressor, an extension's "
                "buffer) stays alive until backward like a saved tensor. Keep only h, weight and rstd")
        if not per_row:  # keeping less than the contract allows is fine: backward recomputes rstd from h
            continue
        rstd = per_row[0]
        if rstd.dtype not in (torch.float32, torch.float64):
            raise CheckFailed(f"{where} saves rstd in {str(rstd.dtype)[6:]}: rstd is saved in half precision. "
                              "Keep it in float32 (compute it from h.float()); it costs 4 bytes per row")
        x, r, _, _, _ = fused_inputs(seed, shape, {}, dtype)
        expect_saved_rstd(rstd.reshape(-1), x, r, where)


#: float32 rounding of a mean over D terms and an rsqrt: the rstd kept may differ this much, relatively
RSTD_RTOL = 2e-5


def expect_saved_rstd(rstd, x, r, where: str) -> None:
    """The rstd kept is 1/sqrt(mean(h**2) + eps) of h = x + residual, in float32: computed from h as
    rounded to its dtype (h.float(), as torch's F.rms_norm of h) or from the sum before rounding
    (x.float() + residual.float(), as flash-attention's and vllm's fused kernels). Both are right;
    they differ by one rounding of h (about 5e-4 relatively in bfloat16 here). Accepted: anything
    between the two float64 values, widened by float32's rounding (:data:`RSTD_RTOL`)."""
    after = rms_stats((x + r).double(), RMSNORM_EPS).reshape(-1)  # h rounded to its dtype first
    before = rms_stats(x.double() + r.double(), RMSNORM_EPS).reshape(-1)  # the exact sum
    lo = torch.minimum(after, before) * (1 - RSTD_RTOL)
    hi = torch.maximum(after, before) * (1 + RSTD_RTOL)
    got = expect_tensor(rstd, f"the rstd {where} saves").double()
    if got.shape != after.shape:
        raise CheckFailed(f"the rstd {where} saves has {got.numel()} numbers, expected one per row ({after.numel()})")
    bad = ~((got >= lo) & (got <= hi))
    if not bad.any():
        return
    half = torch.rsqrt((x + r).pow(2).mean(-1, keepdim=True) + RMSNORM_EPS).double().reshape(-1)
    if x.dtype in (torch.float16, torch.bfloat16) and torch.allclose(got, half, rtol=RSTD_RTOL, atol=0):
        raise CheckFailed(f"the rstd {where} saves is wrong: rstd is computed in half precision: compute "
                          "mean(h**2) from h.float()")
    i = int(((got - after).abs() / after).argmax())
    raise CheckFailed(
        f"the rstd {where} saves is not 1/sqrt(mean(h**2) + eps) of h = x + residual: at row {i} it is "
        f"{got[i].item():.7g}, expected between {min(after[i], before[i]).item():.7g} (computed in float64 "
        f"from h rounded to {str(x.dtype)[6:]}, or from the exact sum x + residual) and "
        f"{max(after[i], before[i]).item():.7g}, within {RSTD_RTOL:g} relatively (float32's rounding)")


@register("fused_add_rmsnorm_saves_little", needs=(FUSED,), forbidden_ops=NORM_OPS)
class FusedSaved:
    """FusedAddRMSNorm saves for backward only h, weight and a float32 (or float64) rstd per row, or less (bytes measured with saved_tensors_hooks)"""

    @staticmethod
    def probe(ns):
        return saved_probe(ns, SAVED_CASES)

    @staticmethod
    def judge(out):
        saved_judge(out, SAVED_CASES)


# --------------------------------------------------------------------------------------------
# The benchmark: forward + backward against eager x + residual then F.rms_norm
# --------------------------------------------------------------------------------------------

GID = "backward_benchmark"
CUDA_SHAPE, CUDA_DTYPE = BENCH_SIZES["cuda"]["backward"]["input"], BENCH_DTYPE["cuda"]
CPU_SHAPE, CPU_DTYPE = BENCH_SIZES["cpu"]["backward"]["input"], BENCH_DTYPE["cpu"]
#: full passes over a (rows, D) tensor that forward + backward cannot avoid: forward reads x and
#: residual and writes y and h; backward reads grad_y, grad_h and h and writes grad_x and
#: grad_residual (weight, rstd and grad_weight are small)
PASSES = 9
TYPICAL[GID] = 8.0  # yours / eager, fastest round against fastest round: for information (coursekit.checks.benchmark)
WORKLOAD[GID] = "backward"  # its sizes per device: coursekit.contract.BENCH_SIZES
SHAPES[GID] = CPU_SHAPE
LOOP_HINT[GID] = ("is there a Python loop over rows? Compute rstd, y and the backward's row means for "
                  "all rows at once with .mean(-1, keepdim=True)")
REPEAT = 15
BENCH_ROUNDS = (REPEAT,)


def bench_inputs(shape, dtype, device="cpu", seed=700):
    """The benchmark's x, residual, weight, grad_y, grad_h. On CUDA they are drawn on the GPU
    (five 16384 x 4096 tensors: too big to draw in float64 on the host); on the CPU from the
    seeds of :func:`fused_inputs`, so that the judge can check the first rows of grad_x."""
    if torch.device(device).type == "cuda":
        g = torch.Generator(device=device).manual_seed(seed)
        x, r, gy, gh = (torch.randn(*shape, generator=g, device=device, dtype=torch.float32) for _ in range(4))
        w = 1.0 + 0.5 * torch.randn(shape[-1], generator=g, device=device, dtype=torch.float32)
        return [t.to(dtype) for t in (x, r, w, gy, gh)]
    x, r, w, gy, gh = fused_inputs(seed, shape, {}, torch.float32)
    return [t.to(dtype) for t in (x, r, w, gy, gh)]


def eager_step(x, r, w, gy, gh):
    """torch's way: h = x + residual, y = F.rms_norm(h), forward + backward by autograd."""
    with torch.enable_grad():
        h = x + r
        y = F.rms_norm(h, (h.shape[-1],), w, RMSNORM_EPS)
        return torch.autograd.grad((y, h), (x, r, w), (gy, gh))


def fused_step(cls):
    def step(x, r, w, gy, gh):
        with torch.enable_grad():
            y, h = cls.apply(x, r, w, RMSNORM_EPS)
            return torch.autograd.grad((y, h), (x, r, w), (gy, gh))
    return step


@register(GID, needs=(FUSED,), kind="benchmark")
class BackwardBenchmark:
    """FusedAddRMSNorm forward + backward: the same work per call however many rows or features (times shown beside eager x + residual then F.rms_norm)"""

    @staticmethod
    def probe(ns, count_seed=None):
        cls = fused_class(ns)
        cuda = torch.cuda.is_available()
        device = torch.device("cuda" if cuda else "cpu")
        shape, dtype = (CUDA_SHAPE, CUDA_DTYPE) if cuda else (CPU_SHAPE, CPU_DTYPE)
        x, r, w, gy, gh = bench_inputs(shape, dtype, device)
        args = [t.requires_grad_(True) for t in (x, r, w)] + [gy, gh]
        steps = {"yours": fused_step(cls), "eager": eager_step}
        if cuda:
            steps["torch.compile(eager)"] = torch.compile(eager_step)
        ref = _reference("05_backward", FUSED)
        if ref is not None:
            steps["course solution"] = fused_step(ref)
        work = scaling.measure(GID, ns, count_seed)
        with OpRecorder(active=True) as rec:
            first = steps["yours"](*args)
        threads = torch.get_num_threads()
        if not cuda:
            torch.set_num_threads(1)  # one thread: a busy shared machine then slows every run alike
        try:
            fns = {k: (lambda s=s: s(*args)) for k, s in steps.items()}
            times = bench.time_interleaved(fns, repeat=REPEAT, device=device)
            copy = bench.copy_time(x.detach(), repeat=REPEAT)
        finally:
            torch.set_num_threads(threads)
        return {
            "device": torch.cuda.get_device_name(device) if cuda else "cpu",
            "cuda": cuda, "shape": list(shape), "dtype": str(dtype)[6:],
            "times": times, "copy": copy, "work": work,
            "ops": sorted(rec.seen & NORM_OPS),
            "grad_x": first[0].detach()[:4].float().cpu(),  # checked by the judge, on either device
            "notes": [],  # without the course's solution there is simply no such row: nothing to tell a student
        }

    @staticmethod
    def judge(out):
        expect_structure(out, {k: ANY for k in ("device", "cuda", "shape", "dtype", "times", "copy", "work", "ops",
                                                "grad_x", "notes")})
        cuda = out["cuda"] is True
        shape, dtype = (CUDA_SHAPE, CUDA_DTYPE) if cuda else (CPU_SHAPE, CPU_DTYPE)
        if out["shape"] != list(shape) or out["dtype"] != str(dtype)[6:]:
            raise CheckFailed(f"the benchmark ran on {out['shape']} {out['dtype']}, expected {list(shape)} "
                              f"{str(dtype)[6:]}")
        times = out["times"]
        need = {"yours", "eager"} | ({"torch.compile(eager)"} if cuda else set())
        if not isinstance(times, dict) or not need <= set(times) <= need | {"course solution"}:
            raise CheckFailed(f"the benchmark's times should hold {sorted(need)}, got "
                              f"{sorted(times) if isinstance(times, dict) else type(times).__name__}")
        for k, ts in times.items():
            if not (isinstance(ts, list) and len(ts) in BENCH_ROUNDS and all(type(t) is float and t > 0 for t in ts)):
                raise CheckFailed(f"expected {REPEAT} timed rounds for each implementation, got "
                                  f"{len(ts) if isinstance(ts, list) else type(ts).__name__} for {k}")
        if not isinstance(out["ops"], list) or not isinstance(out["notes"], list):
            raise CheckFailed("the benchmark's result is malformed (ops and notes should be lists)")
        if out["ops"]:
            raise CheckFailed(f"your code calls torch's own {', '.join(out['ops'])}: the benchmark times your "
                              "implementation, so it gives no points for torch's")
        # the first rows of grad_x against float64 autograd on the same inputs (on CUDA, drawn again
        # on the GPU from the same seed, in bfloat16: the half-precision gradient test's tolerance)
        if cuda and not torch.cuda.is_available():
            raise CheckFailed("the benchmark's result says it ran on CUDA, but there is no CUDA device here "
                              "to check its gradients")
        x, r, w, gy, gh = (t[:4] if t.dim() > 1 else t for t in bench_inputs(shape, dtype, "cuda" if cuda else "cpu"))
        gx = fused_grads_ref(x.double(), r.double(), w.double(), RMSNORM_EPS, gy.double(), gh.double())[0]
        tol = 5e-2 if cuda else 1e-3
        expect_close(expect_tensor(out["grad_x"], "grad_x"), gx.float().cpu(),
                     what="grad_x on the benchmark's first rows", atol=tol, rtol=tol)
        scaling.judge(out["work"], GID, f"{FUSED} forward + backward", LOOP_HINT[GID])
        print(scaling.describe(out["work"]))
        elem = torch.empty((), dtype=dtype).element_size()
        size = shape[0] * shape[1] * elem
        # bench.summarize counts 2 x bytes per call (a read and a write): hand it half the passes
        rows = bench.summarize(times, PASSES * size // 2, out["copy"], out["device"])
        rs = bench.ratios(times, "yours", "eager")
        ratio = min(times["yours"]) / min(times["eager"])
        where = ("CUDA, bfloat16, CUDA events" if cuda else
                 "CPU, float32, 1 thread: these are CPU numbers, small sizes; on a GPU this cell times "
                 f"bfloat16 {CUDA_SHAPE[0]} x {CUDA_SHAPE[1]}")
        print(f"{GID}: forward + backward of x, residual {tuple(shape)} on {out['device']} ({where}); "
              f"{len(rs)} interleaved rounds")
        print(bench.format_table(rows, baseline="eager"))
        print(f"GB/s counts {PASSES} passes over a {shape[0]} x {shape[1]} tensor (forward reads x, residual, "
              "writes y, h; backward reads grad_y, grad_h, h, writes grad_x, grad_residual); % of copy compares "
              "that with a plain copy of one such tensor")
        _plot_in_notebook(rows, f"{GID} on {out['device']}")
        for note in out["notes"]:
            print("note:", note)
        print(bench.verdict_line("eager", ratio, rs, TYPICAL[GID]))


# --------------------------------------------------------------------------------------------
# The served benchmark (the course grader's clock, coursekit.checks.served): one CPU workload
# --------------------------------------------------------------------------------------------

SERVED_RESIDUAL_SCALE = 4.0  # a residual stream larger than the branch: the chain below contracts


def _served_fixed(cfg=None):
    """The fixed residual, weight, grad_y and grad_h of the served workload, on the benchmark's
    device and in its dtype (on CUDA drawn on the GPU, as :func:`bench_inputs` does)."""
    if cfg is not None and cfg.kind == "cuda":
        _, r, w, gy, gh = bench_inputs(CUDA_SHAPE, cfg.dtype, cfg.device, seed=710)
    else:
        _, r, w, gy, gh = fused_inputs(710, CPU_SHAPE, {}, torch.float32)
    return SERVED_RESIDUAL_SCALE * r, w, gy, gh


def _served_call(step, cfg=None):
    """x -> grad_x of one forward + backward (fixed residual, weight, grad_y, grad_h): an input of
    the same shape, so the grader can chain calls (``y = m(y)``) and no call can be cached."""
    r, w, gy, gh = _served_fixed(cfg)

    def m(x):
        leaves = [x.detach().clone().requires_grad_(True), r.clone().requires_grad_(True),
                  w.clone().requires_grad_(True)]
        return step(*leaves, gy, gh)[0].detach()
    return m


def _served_x(seed, cfg=None):
    if cfg is not None and cfg.kind == "cuda":
        g = torch.Generator(device=cfg.device).manual_seed(seed)
        return torch.randn(*CUDA_SHAPE, generator=g, device=cfg.device).to(cfg.dtype)
    return randn(seed, *CPU_SHAPE, dtype=torch.float32)


def served_entry() -> tuple:
    """The arguments of :class:`coursekit.checks.served.Served` for this benchmark (each part takes
    the benchmark's :class:`coursekit.bench.BenchConfig`, default the CPU's). Its name is
    not a name in the notebook: the harness checks that what ``build`` returns is an instance of
    the student's class when that name is a class, and here the timed callable wraps the
    student's ``FusedAddRMSNorm.apply`` (course code builds it, from the student's class)."""
    return (f"{FUSED} (forward + backward)", "05_backward",
            lambda ns, cfg=None: _served_call(fused_step(fused_class(ns)), cfg),
            lambda cfg=None: _served_call(eager_step, cfg),
            _served_x,
            "eager x + residual then F.rms_norm")
