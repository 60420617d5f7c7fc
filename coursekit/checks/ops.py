"""Which torch ops a piece of code calls, seen at two levels, and switching torch's own
normalizations off.

* ``TorchFunctionMode`` sees Python-level calls such as ``torch.nn.functional.layer_norm`` or
  ``torch.rms_norm`` (composite ops that never reach the dispatcher under their own name).
* ``TorchDispatchMode`` sees the aten kernels below autograd, such as ``aten.native_layer_norm``,
  whichever Python route led there.

Names are recorded without namespaces or overloads: ``layer_norm``, ``native_layer_norm``.

:data:`NORM_OPS` is the whole family of torch's built-in normalizations, written out by hand and
checked against the installed torch by ``tests/test_blocked_ops.py`` (every dispatcher op whose
name contains ``norm`` is either in it or in :data:`NOT_NORMALIZATIONS`, so a normalization op
added by a future torch fails that test until someone classifies it). Three places use it: the
op recorder below (through each check's ``forbidden_ops``), the autograder's static scan of the
student's source (``autograder.intake.plan.scan_forbidden``) and :func:`block_kernels`, which makes the
kernels raise inside the grading sandbox.
"""
from __future__ import annotations

import re
import warnings

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

#: the built-in normalizations a student must not call in the norm exercises (short names: no
#: namespace, no overload). Every one of these computes a normalization layer, or its statistics,
#: or its backward.
NORM_OPS = frozenset({
    # aten: layer norm, RMS norm, group and instance norm
    "layer_norm", "native_layer_norm", "native_layer_norm_backward",
    "rms_norm", "_fused_rms_norm", "_fused_rms_norm_backward",
    "group_norm", "native_group_norm", "native_group_norm_backward",
    "instance_norm",
    # aten: batch norm and everything it is built from (per-channel statistics, the elementwise
    # apply, the sync-BN gather, backends' own kernels)
    "batch_norm", "native_batch_norm", "native_batch_norm_backward",
    "_batch_norm_impl_index", "_batch_norm_impl_index_backward",
    "_batch_norm_no_update", "_batch_norm_with_update", "_batch_norm_with_update_functional",
    "_native_batch_norm_legit", "_native_batch_norm_legit_functional", "_native_batch_norm_legit_no_training",
    "batch_norm_backward", "batch_norm_backward_elemt", "batch_norm_backward_reduce", "batch_norm_elemt",
    "batch_norm_gather_stats", "batch_norm_gather_stats_with_counts", "batch_norm_stats",
    "batch_norm_update_stats",
    "cudnn_batch_norm", "cudnn_batch_norm_backward", "miopen_batch_norm", "miopen_batch_norm_backward",
    "quantized_batch_norm",
    # quantized::, onednn::, static_runtime:: (their layer_norm, group_norm, instance_norm and
    # batch_norm share the aten names above)
    "batch_norm1d", "batch_norm1d_relu", "batch_norm2d", "batch_norm2d_relu", "batch_norm3d",
    "batch_norm3d_relu", "batch_norm_relu", "qbatch_norm2d",
    # Python-only (torch.nn.functional): no kernel of its own, built from avg_pool; with a window
    # spanning every channel it is RMSNorm
    "local_response_norm",
    # no "norm" in its name, but a whole encoder layer with two LayerNorms in one kernel
    "_transformer_encoder_layer_fwd",
})

#: dispatcher ops (and torch.nn.functional members) whose names contain "norm" but that are not
#: normalization layers: vector and matrix norms (a student's LayerNorm may well use
#: ``torch.linalg.vector_norm`` or ``x.norm()``), weight norm, renorm, random normals
NOT_NORMALIZATIONS = frozenset({
    "norm", "native_norm", "norm_except_dim", "_foreach_norm",
    "linalg_norm", "linalg_vector_norm", "linalg_matrix_norm", "frobenius_norm", "nuclear_norm",
    "renorm", "renorm_", "embedding_renorm", "embedding_renorm_", "_no_grad_embedding_renorm_",
    "_weight_norm", "_weight_norm_interface", "_weight_norm_interface_backward",
    "_weight_norm_differentiable_backward",
    "normal", "normal_", "normal_functional", "_philox_normal", "_philox_normal_", "log_normal", "log_normal_",
    "normalize",  # F.normalize: x / max(||x||_p, eps), a vector norm
})

#: ops of NORM_OPS with no kernel of their own (Python functions in torch.nn.functional):
#: :func:`block_kernels` replaces them there for as long as the block holds
PYTHON_NORM_FUNCTIONS = ("local_response_norm",)

#: namespaces whose ops :func:`block_kernels` looks in
NAMESPACES = ("aten", "quantized", "onednn", "static_runtime")


def _short(func) -> str:
    name = getattr(func, "__name__", None) or str(func)
    # aten.native_layer_norm.default -> native_layer_norm
    name = str(getattr(func, "_opname", name))
    return name.split(".")[-1] if "::" not in name else name.split("::")[-1].split(".")[0]


class _FunctionSpy(TorchFunctionMode):
    def __init__(self, seen):
        super().__init__()
        self.seen = seen

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.seen.add(_short(func))
        return func(*args, **(kwargs or {}))


class _DispatchSpy(TorchDispatchMode):
    def __init__(self, seen):
        super().__init__()
        self.seen = seen

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.seen.add(_short(func))
        return func(*args, **(kwargs or {}))


def _norm_codes() -> dict:
    """The code objects of torch's own normalizations written in Python: the decompositions and
    references (``torch._decomp``, ``torch._refs``) of every op of :data:`NORM_OPS`, however reached
    (``torch._decomp.decomposition_table``, ``torch.export.default_decompositions()``, another
    module's copy of the table, or by name), and their helpers; code object -> op name. They compute
    a normalization from ordinary ops, which the modes above see only as those ops."""
    import inspect

    codes = {}

    def add(fn, name):
        try:
            fn = inspect.unwrap(fn)
        except ValueError:
            return
        code = getattr(fn, "__code__", None)
        if isinstance(code, type(add.__code__)):
            codes.setdefault(code, name)

    try:
        import torch._decomp
        import torch._decomp.decompositions as decompositions
        import torch._refs
        import torch._refs.nn.functional as refs_f
    except ImportError:  # a torch without them: nothing to watch
        return codes
    for op, fn in list(torch._decomp.decomposition_table.items()):
        if _short(op) in NORM_OPS:
            add(fn, _short(op))
    for mod in (torch._refs, refs_f, decompositions):
        for attr, v in list(vars(mod).items()):
            if not callable(v) or isinstance(v, type):
                continue
            name = attr.rstrip("_").removesuffix("_out")
            if name in NORM_OPS or name.lstrip("_") in NORM_OPS:
                add(v, name if name in NORM_OPS else name.lstrip("_"))
    if callable(getattr(torch._refs, "_normalize", None)):  # native_layer_norm's core: (x - mean) * rstd
        add(torch._refs._normalize, "native_layer_norm")
    return codes


_NORM_CODES = _norm_codes()
#: their bytecode and names, for copies of the code objects (``code.replace``, ``FunctionType(code, ...)``)
_NORM_BYTECODE = {(c.co_code, c.co_names): n for c, n in _NORM_CODES.items()}


class _NormCodeWatch:
    """A profile function (this thread, and threads started while it holds) that notes, as the op
    it computes, when the Python code of one of torch's own normalizations runs, however it was
    reached. ``sys.setprofile`` is audited: the grader's observers see the student's code switch it
    off (autograder/inside/observers.py), and the recorder's exit sees that it is gone."""

    def __init__(self, seen: set):
        self.seen, self.memo = seen, {}

    def __call__(self, frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        hit = self.memo.get(code)
        if hit is None:
            hit = self.memo[code] = _NORM_CODES.get(code) or _NORM_BYTECODE.get((code.co_code, code.co_names)) or ""
        if hit:
            self.seen.add(hit)

    def __enter__(self):
        import sys
        import threading
        self._old, self._old_threads = sys.getprofile(), threading.getprofile()
        sys.setprofile(self)
        threading.setprofile(self)
        return self

    def __exit__(self, *exc):
        import sys
        import threading
        self.switched_off = sys.getprofile() is not self
        sys.setprofile(self._old)
        threading.setprofile(self._old_threads)
        return False


class OpRecorder:
    """``with OpRecorder() as rec: ...`` then ``rec.seen`` is the set of op names called: at the
    torch-function level, at the dispatcher, and as the Python code of torch's own normalizations
    (:class:`_NormCodeWatch`). ``rec.watch_off`` says whether that code watch was switched off while
    the code ran (then ``rec.seen`` may miss what ran)."""

    def __init__(self, active: bool = True):
        self.active = active
        self.seen: set[str] = set()
        self._modes = []
        self._code = None
        self.watch_off = False

    def __enter__(self):
        if self.active:
            self._modes = [_FunctionSpy(self.seen), _DispatchSpy(self.seen)]
            for m in self._modes:
                m.__enter__()
            self._code = _NormCodeWatch(self.seen)
            self._code.__enter__()
        return self

    def __exit__(self, *exc):
        if self._code is not None:
            self._code.__exit__(*exc)
            self.watch_off = self._code.switched_off
            self._code = None
        for m in reversed(self._modes):
            m.__exit__(*exc)
        self._modes = []
        return False


# --------------------------------------------------------------------------------------------
# Switching the built-in kernels off (inside the grading sandbox)
# --------------------------------------------------------------------------------------------

_KEY_LINE = re.compile(r"^(\w+)(?:\[alias\])?: registered at ", re.M)


def _registered_keys(qualname: str) -> list[str]:
    """Every dispatch key (alias keys included) that has a kernel for ``ns::op[.overload]``."""
    try:
        dump = torch._C._dispatch_dump(qualname)
    except RuntimeError:
        return []
    return sorted(set(_KEY_LINE.findall(dump)))


def op_overloads(name: str) -> list[str]:
    """``ns::name[.overload]`` of every overload of ``name`` in :data:`NAMESPACES` (this torch)."""
    found = []
    for ns in NAMESPACES:
        try:
            packet = getattr(getattr(torch.ops, ns), name)
            overloads = packet.overloads()
        except (AttributeError, RuntimeError):
            continue
        for ov in overloads:
            found.append(f"{ns}::{name}" + ("" if ov == "default" else f".{ov}"))
    return found


def _refuse(name: str):
    def kernel(*args, **kwargs):
        raise RuntimeError(f"torch's built-in {name} is switched off while grading this exercise: "
                           "compute it from the formula")
    return kernel


class Blocked:
    """What :func:`block_kernels` returns: ``release()`` gives torch its own kernels back."""

    def __init__(self):
        self.libraries: dict[str, torch.library.Library] = {}
        self.registered: list[tuple[str, str]] = []  # (ns::op[.overload], dispatch key)
        self.patched: list[tuple[object, str, object]] = []  # (module, attribute, original)

    sealed = False

    def seal(self) -> None:
        """Make the block last for the rest of the process, whatever Python code does next (the
        grading sandbox, before any student code): each library's C++ registration is kept alive by
        a reference no Python object holds (pybind objects are not tracked by ``gc`` either), its
        finalizer is detached, and the Library objects are left empty, so ``release()``,
        ``Library._destroy`` or dropping them change nothing. The Python functions replaced stay
        replaced, and the originals are no longer referenced here."""
        import ctypes
        import weakref

        for lib in self.libraries.values():
            for f in list(getattr(weakref.finalize, "_registry", {})):
                try:
                    if f.peek() is not None and f.peek()[0] is lib:
                        f.detach()
                except Exception:  # noqa: BLE001 -- a finalizer being run meanwhile
                    continue
            if lib.m is not None:
                ctypes.pythonapi.Py_IncRef(ctypes.py_object(lib.m))  # never released: the kernels stay
            lib.m = None
            lib._registration_handles = []
        self.patched = []
        self.sealed = True

    def release(self) -> None:
        if self.sealed:  # the block outlives any caller (see seal)
            return
        for lib in self.libraries.values():
            lib._destroy()
        self.libraries = {}
        for mod, attr, original in reversed(self.patched):
            setattr(mod, attr, original)
        self.patched = []
        _ACTIVE.discard(self)


#: blocks in force: a torch.library.Library unregisters its kernels when it is garbage collected,
#: so the handles are held here until released (dropping the handle does not lift the block)
_ACTIVE: set = set()


def block_kernels(names) -> Blocked:
    """Make torch's own implementations of ``names`` (short op names) raise, by every route.

    Each overload of each op, in every namespace of :data:`NAMESPACES`, gets a kernel that raises
    on every dispatch key that has a kernel for it (CPU, CUDA, Meta, nested and quantized
    backends, autograd, autocast, the composite keys...): ``torch.X``, ``torch.ops.<ns>.X``,
    ``torch._C._nn.X`` / ``torch._C._VariableFunctions.X`` and ``torch.nn.functional`` all end in
    one of those. Ops that exist only in Python (:data:`PYTHON_NORM_FUNCTIONS`) are replaced in
    ``torch.nn.functional``. Names this torch does not have are skipped.

    The block lasts until ``release()`` on the returned handle (or the end of the process),
    whether or not the caller keeps the handle. A second line of defence: the verdict does not
    depend on it.
    """
    handle = Blocked()
    _ACTIVE.add(handle)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Overriding a previously registered kernel", once per op
        for name in sorted(set(names)):
            for qualname in op_overloads(name):
                ns, op = qualname.split("::")
                keys = _registered_keys(qualname)
                composite = "CompositeImplicitAutograd" in keys
                lib = handle.libraries.get(ns)
                if lib is None:
                    lib = handle.libraries[ns] = torch.library.Library(ns, "IMPL")
                for key in keys:
                    if key == "Meta" and composite:
                        continue  # torch refuses a Meta kernel beside a composite one
                    try:
                        lib.impl(op, _refuse(name), key)
                    except Exception:  # noqa: BLE001 -- a key this build cannot take a Python kernel on
                        continue
                    handle.registered.append((qualname, key))
            if name in PYTHON_NORM_FUNCTIONS:
                import torch.nn.functional as F

                original = getattr(F, name, None)
                if original is not None:
                    handle.patched.append((F, name, original))
                    setattr(F, name, _refuse(name))
    return handle
