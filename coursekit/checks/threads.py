"""Threads beside a probe: which live threads may run the student's code while a test runs (the
grader names them in the review column).

Most of the probes' observers hold in the probe's thread only, so a thread started by the notebook
(a ``logging.handlers.QueueListener``, a ``ThreadPoolExecutor``, a bare ``_thread.start_new_thread``)
does work they do not watch; exercise 05's autograd record is the exception (it is read in every
thread, :class:`coursekit.checks.backward.ByHand`). :func:`foreign_threads` names the live threads,
other than the caller's, that the student's code started or that carry the student's code.

Where it is known who started a thread (the course grader's observers, ``autograder/inside/observers.py``,
record each ``threading.Thread.start`` before any student code runs and fill :data:`STARTED`),
a thread started by code that is not the student's (torch, tqdm, IPython's own) is left alone and
one started by the student's code, or of unknown origin, counts. Without that record (a notebook's
kernel, stock nbgrader), a thread counts when its target, its arguments or what it is running now
is the notebook's own code or object.
"""
from __future__ import annotations

import sys
import threading
import types

#: thread ident -> True (started by the student's code) / False (by library code): the grader's
#: observers fill it; ``None``: nobody records thread starts in this process
STARTED: dict | None = None
#: how many threads ``threading.Thread.start`` has started since the observers began watching (one
#: number, kept by the same wrapper; the benchmark's counter reads it before and after a counted call,
#: whose work in a thread started meanwhile it cannot count, :class:`coursekit.checks.scaling.Meter`)
STARTS: list = [0]
#: thread ident -> where in the notebook the student's code started it ("cell, line N"), filled by
#: the grader's observers; a thread's name in :func:`foreign_threads` carries it
WHERE: dict = {}
#: what marks code as the notebook's: IPython's cell file names
STUDENT_FILES = ("<ipython-input-", "/tmp/ipykernel_", "<cell ")


def is_student_file(filename) -> bool:
    return isinstance(filename, str) and filename.startswith(STUDENT_FILES)


def _carries_student_code(obj, depth: int = 5, seen=None) -> bool:
    seen = set() if seen is None else seen
    if depth < 0 or id(obj) in seen:
        return False
    seen.add(id(obj))
    if isinstance(obj, types.FunctionType):
        return is_student_file(obj.__code__.co_filename)
    if isinstance(obj, types.MethodType):
        return _carries_student_code(obj.__func__, depth, seen) or _carries_student_code(obj.__self__, depth - 1, seen)
    if isinstance(obj, type):
        return _notebook_class(obj)
    if _notebook_class(type(obj)):
        return True
    if isinstance(obj, (list, tuple, set, frozenset)):
        return any(_carries_student_code(o, depth - 1, seen) for o in list(obj)[:64])
    if isinstance(obj, dict):
        return any(_carries_student_code(o, depth - 1, seen) for o in list(obj.values())[:64])
    d = getattr(obj, "__dict__", None)
    if isinstance(d, dict) and not isinstance(obj, types.ModuleType):
        return any(_carries_student_code(o, depth - 1, seen) for o in list(d.values())[:64])
    return False


def _notebook_class(cls) -> bool:
    """A class the notebook defined: its module is ``__main__`` and none of its methods comes from a
    file that is not a cell (a script run as ``__main__``, the grader's harness among them, defines
    classes there too: with --no-sandbox, IPython's history thread held one and was named the
    student's, the seventeenth red team)."""
    if getattr(cls, "__module__", None) != "__main__":
        return False
    codes = [(v.__func__ if type(v) in (staticmethod, classmethod) else v).__code__ for v in vars(cls).values()
             if type(v) in (types.FunctionType, staticmethod, classmethod)
             and type(v.__func__ if type(v) in (staticmethod, classmethod) else v) is types.FunctionType]
    return not any(not is_student_file(c.co_filename) for c in codes)


def foreign_threads() -> list[str]:
    """Names of the live threads (other than the caller's) that the student's code started or that carry it."""
    me = threading.get_ident()
    frames = sys._current_frames()
    known = {t.ident: t for t in threading.enumerate()}
    found = []
    for ident, frame in frames.items():
        if ident == me:
            continue
        t = known.get(ident)
        name = t.name if t is not None else f"a thread started with _thread ({ident})"
        if STARTED is not None:
            if STARTED.get(ident, True):
                found.append(f"{name}, started at {WHERE[ident]}" if ident in WHERE else name)
            continue
        if t is None or isinstance(t, threading._DummyThread):
            found.append(name)
            continue
        f, hit = frame, False
        while f is not None and not hit:
            hit = is_student_file(f.f_code.co_filename)
            f = f.f_back
        if hit or _carries_student_code([getattr(t, "_target", None), getattr(t, "_args", ()),
                                         getattr(t, "_kwargs", {}), t]):
            found.append(name)
    del frames
    return found
