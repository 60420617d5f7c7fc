"""Graded checks for the exercise notebooks, in one importable place.

Every graded test cell of an exercise notebook names one check by its nbgrader grade id::

    from coursekit.checks import run
    run("layernorm_matches_torch", globals())

A check is split in two halves so that the same logic can run in two places:

* ``probe(ns) -> dict``: finds the student's code by name in ``ns`` (the notebook's globals),
  calls it on inputs the check builds itself, and returns what came out (tensors, numbers,
  strings, nested in dicts and lists).
* ``judge(out) -> None``: compares what came out with torch's own modules and raises
  :class:`CheckFailed` with a message in the student's terms. It never touches student code.

``run`` does both in the notebook's kernel: that is what the student's self-check and stock
``nbgrader autograde`` see. The course autograder judges in its own process, so nothing a
submission does can change a verdict. A visible check's probe runs inside the sandbox and ships
its result out as plain arrays (:mod:`coursekit.checks.wire`); a hidden check's probe runs in the
grader too (the referee), and only its calls of the student's code cross into the sandbox
(:mod:`coursekit.checks.remote`). Every path goes through :func:`collect` and :func:`verdict`, so
they agree on every honest submission.
"""
from __future__ import annotations

import contextlib
import importlib
import io
import traceback
import warnings
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable

from coursekit.checks.ops import OpRecorder

#: exercise modules that register checks, imported lazily by :func:`get`
EXERCISE_MODULES = (
    "coursekit.checks.layernorm",
    "coursekit.checks.rmsnorm",
    "coursekit.checks.residual",
    "coursekit.checks.transformer",
    "coursekit.checks.benchmark",
    "coursekit.checks.backward",
    "coursekit.checks.streams",
)
#: the instructor's hidden checks: imported when the ``course`` package is there (the grader, the
#: course directory), absent from the student pack
HIDDEN_MODULES = (
    "course.hidden.layernorm",
    "course.hidden.rmsnorm",
    "course.hidden.residual",
    "course.hidden.transformer",
    "course.hidden.backward",
    "course.hidden.streams",
)



class CheckFailed(AssertionError):
    """A check's verdict: the message says what is wrong, in the student's terms."""

    def _render_traceback_(self):
        """What IPython shows for it instead of a traceback (JupyterLab, Colab and VS Code through
        ipykernel, nbconvert and nbgrader too): the verdict alone. The frames would be the course's
        own (``run``, ``verdict``, the judge), none of them the student's; where the student's code
        raised is in the message already (``explain_error``)."""
        return [f"{type(self).__name__}: {self}"]


@dataclass
class Check:
    grade_id: str
    doc: str  # one line: what the check checks
    probe: Callable[[dict], Any]
    judge: Callable[[Any], None]
    #: torch ops whose use means "you called the built-in instead of implementing it"
    forbidden_ops: frozenset = field(default_factory=frozenset)
    #: names of the student's code the probe uses (for "X is not defined" messages)
    needs: tuple = ()
    #: what the check judges: "correctness" (values against torch), or "benchmark" (time against
    #: torch's; the course grader times it from outside the submission)
    kind: str = "correctness"
    #: names of torch's own layers and functions (classes, ops) whose use costs this check its
    #: points: the course grader's static scan reads them, the probe observes their use at run time
    #: (last field: the harness copies checks positionally)
    forbidden_names: frozenset = field(default_factory=frozenset)


KINDS = ("correctness", "benchmark")
REGISTRY: dict[str, Check] = {}


def frozen(mapping=(), **kw) -> MappingProxyType:
    """A read-only dict, for the case tables of the checks (tuples of tuples and frozen dicts:
    nothing a probe reads from them is writable state). The judges do not rely on it: they
    count what comes back against their own cases (:func:`coursekit.checks.compare.paired`)."""
    return MappingProxyType(dict(mapping, **kw))


def register_check(grade_id: str, doc: str, probe: Callable[[dict], Any], judge: Callable[[Any], None], *,
                   needs: tuple = (), forbidden_ops=(), kind: str = "correctness", forbidden_names=()) -> Check:
    """Register a check from its two halves (e.g. a template that several checks share)."""
    if grade_id in REGISTRY:
        raise ValueError(f"check {grade_id!r} registered twice")
    if kind not in KINDS:
        raise ValueError(f"check {grade_id!r}: unknown kind {kind!r}")
    REGISTRY[grade_id] = Check(grade_id=grade_id, doc=doc, probe=probe, judge=judge,
                               forbidden_ops=frozenset(forbidden_ops), needs=tuple(needs), kind=kind,
                               forbidden_names=frozenset(forbidden_names))
    return REGISTRY[grade_id]


def register(grade_id: str, *, needs: tuple = (), forbidden_ops=(), kind: str = "correctness", forbidden_names=()):
    """Class decorator: the class holds ``probe`` and ``judge`` as static methods; its docstring is the doc."""

    def deco(cls):
        doc = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else grade_id
        register_check(grade_id, doc, cls.probe, cls.judge, needs=needs, forbidden_ops=forbidden_ops, kind=kind,
                       forbidden_names=forbidden_names)
        return cls

    return deco


#: the grade ids the hidden modules registered (the course grader's referee runs their probes)
HIDDEN_IDS: set = set()


def _has_hidden() -> bool:
    """Whether the hidden checks are here: the ``course`` package with its ``hidden`` package (the
    grading sandbox has an empty folder there, a student's install has no ``course`` at all)."""
    import importlib.util
    try:
        spec = importlib.util.find_spec("course.hidden")
    except ModuleNotFoundError:
        return False
    return spec is not None and spec.origin is not None and spec.origin.endswith("__init__.py")


def load_all() -> dict[str, Check]:
    for mod in EXERCISE_MODULES + (HIDDEN_MODULES if _has_hidden() else ()):
        before = set(REGISTRY)
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as e:  # a student's install, or the grading sandbox: no course.hidden
            if e.name not in (mod, "course", "course.hidden"):
                raise
        if mod in HIDDEN_MODULES:
            HIDDEN_IDS.update(set(REGISTRY) - before)
    return REGISTRY


def get(grade_id: str) -> Check:
    load_all()
    try:
        return REGISTRY[grade_id]
    except KeyError:
        raise KeyError(f"no check is registered under grade id {grade_id!r}") from None


# --------------------------------------------------------------------------------------------
# The two halves of a run
# --------------------------------------------------------------------------------------------

def _student_frame(tb) -> str:
    """The last traceback line that is not course code: where in the student's code it broke."""
    ours = ("/course/", "/coursekit/")
    frames = [f for f in traceback.extract_tb(tb) if not any(p in f.filename.replace("\\", "/") for p in ours)]
    if not frames:
        return ""
    f = frames[-1]
    return f"{f.name}, line {f.lineno}: {(f.line or '').strip()}"


def _modes_in_place(rec) -> bool:
    """Whether the recorder's two modes are still on torch's mode stacks (the student's code may
    not pop them), as the probe ends."""
    if not rec._modes:
        return True
    if rec._code is not None and __import__("sys").getprofile() is not rec._code:
        return False  # the watch on torch's own normalizations was switched off
    import torch
    try:
        fs = [torch._C._get_function_stack_at(i) for i in range(torch._C._len_torch_function_stack())]
        ds = [torch._C._get_dispatch_stack_at(i) for i in range(torch._C._len_torch_dispatch_stack())]
    except Exception:  # noqa: BLE001 -- a torch without these: nothing to check
        return True
    return any(m is rec._modes[0] for m in fs) and any(m is rec._modes[1] for m in ds)


def collect(check: Check, ns: dict) -> dict:
    """Run the probe on the student's code and return a *record* made only of plain data.

    Record: ``{"ok": True, "out": <encoded>, "ops": [...]}`` or
    ``{"ok": False, "error": <exception type>, "message": ..., "where": ...}``.
    """
    from coursekit.checks import wire
    from coursekit.checks.remote import StudentRaised, is_remote

    # ns is the notebook's globals, or the referee's view of them (coursekit.checks.remote): then
    # the probe runs here and the student's code there, which records the ops it calls
    remote = is_remote(ns)
    try:
        missing = [name for name in check.needs if name not in ns]
        if missing:
            return {"ok": False, "error": "NameError", "where": "",
                    "message": f"{', '.join(missing)} is not defined: run the cell that defines it first"}
        # the student's prints and warnings stay out of the test cell: stock nbgrader scores a
        # grade cell with any stderr output as zero
        quiet = contextlib.nullcontext() if remote else contextlib.redirect_stdout(io.StringIO())
        with OpRecorder(active=bool(check.forbidden_ops) and not remote) as rec, quiet, \
                (contextlib.nullcontext() if remote else contextlib.redirect_stderr(io.StringIO())):
            out = check.probe(ns)
            if not remote and not _modes_in_place(rec):
                raise CheckFailed("the op recorder was taken off torch's mode stack (or its watch on torch's own normalizations' code "
                          "switched off) while your code ran, so this "
                                  "test cannot see which torch ops ran: it gives no points")
        seen = ns._link.ops if remote else rec.seen
        return {"ok": True, "out": wire.encode(out), "ops": sorted(set(seen) & check.forbidden_ops)}
    except CheckFailed as e:  # a probe may fail early, e.g. on a wrong output type
        return {"ok": False, "error": "CheckFailed", "message": str(e), "where": ""}
    except StudentRaised as e:  # the student's code raised, in the sandbox
        return {"ok": False, "error": e.error, "message": e.message[:2000], "where": e.where}
    except BaseException as e:  # noqa: BLE001 -- student code may raise anything, SystemExit included
        if isinstance(e, KeyboardInterrupt):
            raise
        return {"ok": False, "error": type(e).__name__, "message": str(e)[:2000],
                "where": _student_frame(e.__traceback__)}


def explain_error(record: dict) -> str:
    err, msg, where = record.get("error", "Error"), record.get("message", ""), record.get("where", "")
    at = f" (in {where})" if where else ""
    if err == "NotImplementedError":
        return f"not implemented yet: the stub still raises NotImplementedError{at}. Replace it with your code."
    if err == "CheckFailed":
        return msg
    if err == "NameError" and not where:
        return msg
    return f"your code raised {err}: {msg}{at}"


def verdict(check: Check, record: dict) -> None:
    """Judge a record (trusted side). Returns on a pass, raises :class:`CheckFailed` otherwise."""
    from coursekit.checks import wire

    if not isinstance(record, dict) or not isinstance(record.get("ok"), bool):
        raise CheckFailed("no result came back from your code")
    if not record["ok"]:
        raise CheckFailed(explain_error(record))
    ops = record.get("ops") or []
    if ops:
        raise CheckFailed(
            f"your code calls torch's own {', '.join(ops)}. This exercise asks you to compute it "
            "yourself from the formula, so implementation checks give no points for it."
        )
    check.judge(wire.decode(record["out"]))


def run(grade_id: str, ns: dict) -> None:
    """What a notebook's test cell calls: probe and judge in this process, print the outcome."""
    check = get(grade_id)
    record = collect(check, ns)
    with warnings.catch_warnings():  # torch's own warnings in the judge are not the student's
        warnings.simplefilter("ignore")
        verdict(check, record)
    print(f"passed {grade_id}: {check.doc}")


def smoke(call: Callable[[], Any]) -> None:
    """The visible half of a hidden test: the student's code must at least run on a small input.

    The hidden half (``run``) checks the values; this half makes the released notebook's cell fail
    on an unfinished stub (so ``nbgrader validate --invert`` holds) and tells a student early that
    something the hidden tests use still raises. Prints and warnings stay out of the cell, as in
    :func:`collect`.
    """
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            call()
    except BaseException as e:  # noqa: BLE001 -- student code may raise anything
        if isinstance(e, KeyboardInterrupt):
            raise
        record = {"ok": False, "error": type(e).__name__, "message": str(e)[:2000],
                  "where": _student_frame(e.__traceback__)}
        raise CheckFailed(explain_error(record)) from None
