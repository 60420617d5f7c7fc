"""Which torch ops a piece of code calls, seen at two levels.

* ``TorchFunctionMode`` sees Python-level calls such as ``torch.nn.functional.layer_norm`` or
  ``torch.rms_norm`` (composite ops that never reach the dispatcher under their own name).
* ``TorchDispatchMode`` sees the aten kernels below autograd, such as ``aten.native_layer_norm``,
  whichever Python route led there.

Names are recorded without namespaces or overloads: ``layer_norm``, ``native_layer_norm``.
"""
from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

#: the built-in normalizations a student must not call in the norm exercises
NORM_OPS = frozenset({
    "layer_norm", "native_layer_norm", "native_layer_norm_backward",
    "rms_norm", "_fused_rms_norm", "_fused_rms_norm_backward",
    "batch_norm", "group_norm", "instance_norm", "native_batch_norm",
})


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


class OpRecorder:
    """``with OpRecorder() as rec: ...`` then ``rec.seen`` is the set of op names called."""

    def __init__(self, active: bool = True):
        self.active = active
        self.seen: set[str] = set()
        self._modes = []

    def __enter__(self):
        if self.active:
            self._modes = [_FunctionSpy(self.seen), _DispatchSpy(self.seen)]
            for m in self._modes:
                m.__enter__()
        return self

    def __exit__(self, *exc):
        for m in reversed(self._modes):
            m.__exit__(*exc)
        self._modes = []
        return False
