"""How many bytes the C allocator (glibc's ``malloc``) has handed out and not had back, in all its
arenas: ``mallinfo2().uordblks + mallinfo2().hblkhd``.

Exercise 05's probe reads it before and after forward (:func:`coursekit.checks.backward._traced_forward`):
memory a C library keeps with its own calls to ``malloc`` (an in-memory database's pages, a
compressor's buffers, an extension's cache) is invisible to tracemalloc and to a walk of Python
objects, but not to these totals.

Read through ctypes from the C library the interpreter already runs on. ``None`` where there is no
``mallinfo2`` (glibc before 2.33, musl, macOS, Windows): a student's own machine may check without
it; the grader's sandbox (Debian's glibc) has it, and its tests require it there.
"""
from __future__ import annotations

import ctypes

#: the largest request Python's own small-object allocator (pymalloc) serves from its arenas (mapped
#: with mmap, not malloc); bigger Python allocations are malloc's, and show in these totals
PYMALLOC_MAX = 512


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _load():
    try:
        fn = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    fn.argtypes = []
    return fn


_MALLINFO2 = _load()  # loaded when the checks are imported, before any student code runs


def readable() -> bool:
    """Whether this machine's C library has ``mallinfo2`` (no call made)."""
    return _MALLINFO2 is not None


def in_use() -> int | None:
    """Bytes malloc has handed out and not had back: small chunks in its arenas (``uordblks``) plus
    the big ones it mapped on their own (``hblkhd``); None without ``mallinfo2``."""
    if _MALLINFO2 is None:
        return None
    info = _MALLINFO2()
    return int(info.uordblks) + int(info.hblkhd)
