"""Grade a class: run each submission in its sandbox, judge its records here, write the results.

Per submission (one thread each, ``--jobs`` at a time, each driving one sandboxed process):

1. read the student's file defensively and build the plan from the *released* notebook;
2. run the harness in the sandbox and walk it through the plan one step at a time
   (:mod:`autograder.referee.protocol`): it runs each cell and sends back one probe record per test;
3. judge every test of the release here, in the trusted process: a record that is missing,
   malformed or fails its judge scores 0; a pass scores the cell's points. For checks that forbid
   torch's built-in normalizations, the built-ins that graded code names also cost
   (:func:`autograder.intake.scan.costs`); code that reaches around the course is flagged for a person to
   review (:func:`autograder.intake.scan.review`), which costs no point.

The score never depends on anything the submission's process claims about itself.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import sys
import shutil
import signal
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from autograder.intake import plan as planmod
from autograder.referee import protocol
from autograder.intake.ingest import Catalog, Entry, InputError, _grade_ids, class_assignments, discover, settle
from autograder.referee.judge import judge_records
from autograder.report.outcome import Outcome, TestResult, check_for as _check
from autograder.referee.clock import measure, served_device
from autograder.referee import calls as referee
from autograder.sandbox.bwrap import HARNESS_IN, Limits, run_sandboxed
from autograder.sandbox.slots import Child, SlotPool

ROOT = Path(__file__).resolve().parent.parent
MAX_REVIEW = 20  # review reasons kept per submission (each names its cell and line)
__all__ = ["Course", "Outcome", "TestResult", "grade_class", "grade_one"]
#: a Canvas file marked late: ``<name>_LATE_<userid>_<submissionid>_<file>`` (autograder.intake.ingest.CANVAS)
CANVAS_LATE = re.compile(r"^[^_/]+?_LATE_\d+_\d+_.+$")
#: the note a late submission's row carries (results.write_csv reads it into the ``late`` column)
LATE_NOTE = "handed in late (the LMS marked the file _LATE_)"


def select(entries: list[Entry], catalog: Catalog, assignments=None, check_only: bool = False) -> list[Entry]:
    """The entries to grade: only ``assignments`` when given (``--assignment``; an unknown name is
    an :class:`InputError`), each late one noted as such, and a ``no-notebook`` row for each
    student without a notebook of the class's assignments (:func:`autograder.intake.ingest.settle`).
    ``check_only``: only check the names."""
    if assignments:
        unknown = sorted(set(assignments) - set(catalog.notebooks))
        if unknown:
            raise InputError(f"no assignment called {', '.join(map(repr, unknown))} in this course "
                             f"(known: {', '.join(catalog.assignments)})")
        if check_only:
            return entries
        if not any(e.assignment in set(assignments) for e in entries):
            raise InputError(f"nothing was handed in for {', '.join(sorted(assignments))}")
    entries = settle(entries, catalog, assignments)
    for e in entries:
        if e.path is not None and CANVAS_LATE.match(e.path.name) and LATE_NOTE not in e.notes:
            e.notes.append(LATE_NOTE)
    return entries


def other_assignment(path: Path, assignment: str, catalog: Catalog) -> str | None:
    """The assignment whose notebook ``path`` is when it is not ``assignment``'s: none of its grade
    ids (answer and test cells) are ``assignment``'s and some are another's. None otherwise."""
    ids = _grade_ids(path)
    if not ids or ids & catalog.ids.get(assignment, set()):
        return None
    other = catalog.by_content(path)
    return other if other and other != assignment else None


class Course:
    """The trusted side's view of the course: released notebooks and the checks registry."""

    def __init__(self, root: Path = ROOT):
        self.root = Path(root)
        self.catalog = Catalog(self.root / "exercises")
        self._release: dict = {}
        self._lock = threading.Lock()

    def release(self, assignment: str) -> list[dict]:
        with self._lock:
            if assignment not in self._release:
                nb = self.root / "exercises" / assignment / self.catalog.notebooks[assignment]
                self._release[assignment] = planmod.release_cells(nb)
            return self._release[assignment]

    def tests(self, assignment: str) -> list[planmod.Test]:
        return planmod.make_plan(self.release(assignment), []).tests


def _test_step(st: dict, draw: int) -> dict:
    """A plan's test step as the harness gets it: served (the grader times it), refereed (the
    grader probes it: :mod:`autograder.referee.calls`, with the names it needs and the ops it watches).
    A benchmark's step carries the seed of the inputs its count of work runs on
    (:mod:`coursekit.checks.scaling`), from this submission's draw: unknown before the call."""
    from coursekit.checks.served import SERVED
    gid = st["grade_id"]
    if referee.refereed(gid):
        check = _check(gid)
        return dict(st, served=False, refereed=True, needs=list(check.needs), watch=sorted(check.forbidden_ops))
    return dict(st, served=gid in SERVED, count_seed=referee.draw(str(draw), gid))


def grade_one(entry: Entry, course: Course, limits: Limits, scratch: Path, sandbox: bool = True,
              slots: SlotPool | None = None, draw: int | None = None) -> Outcome:
    """``draw``: the hidden checks' inputs for this submission (:func:`autograder.referee.calls.draw_for`;
    by default from the course's secret and the handed-in file)."""
    o = Outcome(entry.student_id, entry.assignment, entry.student_name, notes=list(entry.notes))
    if entry.handed is not None and entry.assignment not in course.catalog.notebooks:  # nothing to grade against
        o.status, o.message = "no-notebook", "; ".join(entry.notes)
        return o
    if entry.assignment not in course.catalog.notebooks:
        o.status = "unknown-assignment"
        o.message = "; ".join(entry.notes) or f"unknown assignment {entry.assignment}"
        return o
    o.notebook = course.catalog.notebooks[entry.assignment]
    tests = course.tests(entry.assignment)
    o.max_score = sum(t.points for t in tests)

    def zero(status, message):
        extra = [n for n in o.notes if n not in message]  # e.g. which file was graded, which ignored
        o.status, o.message = status, "; ".join([message] + extra)
        o.tests = [TestResult(t.grade_id, getattr(_check(t.grade_id), "doc", t.grade_id), 0.0, t.points, False,
                              message) for t in tests]
        return o

    if entry.path is None and entry.handed is not None:  # files, none a notebook of this assignment
        return zero("no-notebook", "; ".join(entry.notes))
    if entry.path is None:
        return zero("missing", "; ".join(entry.notes) or "nothing was submitted")
    o.handed_in = entry.filename or entry.path.name
    try:
        cells = planmod.read_student_notebook(entry.path, o.notes)
    except planmod.BadNotebook as e:
        return zero("unreadable", str(e))
    except OSError as e:
        return zero("unreadable", f"the file could not be read: {e.strerror}")
    try:  # bounded: a budget of time, and code too deep to read is the student's message (unreadable)
        plan, review = planmod.bounded_plan(course.release(entry.assignment), cells)
    except planmod.BadNotebook as e:
        return zero("unreadable", str(e))
    other = other_assignment(entry.path, entry.assignment, course.catalog)
    if other:  # the wrong notebook: say whose it is, not which of this assignment's cells it lacks
        o.other_assignment = other
        o.notes.insert(0, f"this is {other}'s notebook ({course.catalog.notebooks[other]}: its cells are "
                          f"that assignment's), not {entry.assignment}'s: it was graded against "
                          f"{entry.assignment}'s tests; hand in {o.notebook} for {entry.assignment}")
        o.notes.extend(n for n in plan.notes if not n.startswith("your notebook has no answer cell"))
    else:
        o.notes.extend(plan.notes)
    o.review = review[:MAX_REVIEW]

    block = sorted(set().union(*[c.forbidden_ops for c in map(_check, [t.grade_id for t in tests]) if c]))
    from coursekit.checks.served import SERVED
    if draw is None:
        draw = referee.draw_for(referee.course_secret(course.root), entry.student_id, entry.assignment, entry.path)
    o.hidden_draw = draw
    steps = [_test_step(st, draw) if st["kind"] == "test" else st for st in plan.steps]
    device = served_device()  # the served benchmarks' device: the harness and the grader's clock agree on it
    job = {"cell_s": limits.cell_s, "test_s": max(limits.cell_s, 120.0), "block_ops": block, "bench_device": device,
           "isolated": bool(sandbox)}
    if plan.slice is not None and plan.slice.written:  # %%writefile modules the notebook imports
        job["modules"] = list(plan.slice.written)
    step_s = max(limits.cell_s, 120.0) + protocol.STEP_GRACE_S
    # Results come back over a pipe of their own (the protocol); the harness gets its write end.
    reply_r, reply_w = os.pipe()
    box: dict = {}

    def on_start(proc):
        os.close(reply_w)  # only the sandbox holds the write end now: its exit means end-of-file
        box["closed"] = True
        box["tr"] = tr = protocol.converse(proc.stdin, protocol.Channel(reply_r), steps, job,
                                           step_s=step_s, measure=functools.partial(measure, device=device, draw=draw),
                                           referee=functools.partial(referee.run, salt=draw))
        if tr.finished:  # it said bye: it gets a moment to exit (a traced or stuck init never does)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=protocol.EXIT_GRACE_S)
        if isinstance(proc, Child):  # out of protocol, silent, or done
            proc.kill()
        else:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)

    work = Path(tempfile.mkdtemp(prefix="sub-", dir=scratch)) if not sandbox else None
    try:
        if sandbox and slots is not None:  # a fresh child of a pre-imported sandbox (autograder.sandbox.slots)
            for attempt in range(2):
                with slots.slot() as slot:
                    res = slot.run(on_start, reply_w)
                if box.get("closed"):
                    break  # it started: whatever happened next is the submission's
                # the slot could not start a child (no student code ran): once more, on a fresh slot
        else:
            res = run_sandboxed(["python", HARNESS_IN, str(reply_w)], limits=limits, sandbox=sandbox,
                                course_dir=course.root / "course", on_start=on_start, pass_fds=(reply_w,),
                                scratch=work, gpu=device == "cuda")
    finally:
        os.close(reply_r)
        if not box.get("closed"):
            os.close(reply_w)
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)
    tr = box.get("tr") or protocol.Transcript(broke="the notebook's process did not start")
    o.wall_s = res.wall_s
    o.timings = {k: round(v, 3) for k, v in tr.timings.items()}
    o.output_tail = res.output[-protocol.OUTPUT_TAIL_CHARS:]  # results.json only: never shown to students
    o.cell_errors = protocol.bound_cell_errors(tr.cell_errors)
    o.tests = judge_records(tests, tr.records, plan, tr.served, tr.observed, draw=draw)
    # the student's audit events in ordinary cells (autograder/inside/observers.py): for a person
    o.review = (o.review + [e if e.startswith("threads your notebook started") else f"audit event: {e}"
                            for e in tr.cell_events])[:MAX_REVIEW]
    o.score = sum(t.points for t in o.tests)
    if tr.disk_full:
        o.notes.append(f"your code filled the sandbox's writable space ({limits.tmp_mb} MB in the working "
                       f"folder, {limits.tmp_mb} MB in /tmp); writes beyond that failed")
    if res.oom:
        mb = limits.submission_mb
        o.status, o.message = "memory", ("the notebook's processes together used more than the "
                                         + (f"{mb} MB " if mb else "") + "of memory a submission may hold "
                                         "(files it wrote in its working folder and /tmp count too) and were "
                                         "stopped; tests after that point scored 0")
    elif res.timed_out:
        o.status, o.message = "timeout", (f"the notebook ran longer than the {limits.wall_s:g} s allowed "
                                          "and was stopped; tests after that point scored 0")
    elif not tr.finished:
        o.status, o.message = "crashed", ("the notebook's process ended before grading finished "
                                          f"(exit status {res.returncode}: your code exited, was killed "
                                          "for using too much memory or CPU, or crashed Python; "
                                          f"the grader saw: {tr.broke}); tests after that point scored 0")
    else:
        failed = [t for t in o.tests if not t.passed]
        o.message = f"{len(o.tests) - len(failed)} of {len(o.tests)} tests passed"
    if o.notes:
        o.message = "; ".join([o.message] + o.notes)
    return o


def grade_class(src: Path, out_dir: Path, *, jobs: int | None = None, limits: Limits | None = None,
                sandbox: bool = True, root: Path = ROOT, progress: bool = True,
                zygote: bool = True, assignments=None, before_grading=None) -> list[Outcome]:
    """Grade every submission in ``src``; return the outcomes, sorted. Nothing is written to
    ``out_dir`` (the caller writes the results; it is not even created here).

    ``assignments``: grade only those (:func:`select`). ``before_grading``: called with the
    entries once they are known, before any is graded (it may raise to stop the run).

    ``zygote``: run each submission as a fresh child of a pre-imported sandbox per job
    (:mod:`autograder.sandbox.slots`); False starts a whole sandbox and interpreter per submission (slower:
    ``make bench-grade`` times both)."""
    import torch

    torch.set_num_threads(1)
    limits = limits or Limits()
    jobs = max(1, jobs or os.cpu_count() or 1)
    if limits.cgroups and limits.submission_mb is None:  # the slots, side by side, fit the machine
        from autograder.sandbox.cgroups import default_memory_mb
        limits = dataclasses.replace(limits, submission_mb=default_memory_mb(jobs))
    course = Course(root)
    scratch = Path(tempfile.mkdtemp(prefix="autograde-"))
    try:
        entries = select(discover(src, course.catalog, scratch), course.catalog, assignments)
        if before_grading is not None:
            before_grading(entries)
        from coursekit.checks import load_all
        load_all()
        # the slots' sandboxes get the GPU when the served benchmarks run on it (outside.served_device)
        slots = (SlotPool(limits, course.root / "course", size=jobs, gpu=served_device() == "cuda")
                 if sandbox and zygote else None)
        outcomes = []
        bar = None
        if progress and sys.stderr.isatty():  # a bar redrawn into a log file floods it
            from tqdm import tqdm
            bar = tqdm(total=len(entries), desc="grading", unit="nb", file=sys.stderr)
        with ThreadPoolExecutor(max_workers=jobs) as pool, (slots or contextlib.nullcontext()):
            if slots is not None and entries:
                # The first slot starts before any submission is graded: a sandbox that cannot start
                # the course's Python (its imports, the memory limit, seccomp) stops the run here,
                # SandboxUnavailable saying why, instead of failing every row (the caller's probe,
                # ensure_bwrap(imports=False), left the imports to this zygote)
                with slots.slot():
                    pass
            futs = {pool.submit(grade_one, e, course, limits, scratch, sandbox, slots): e for e in entries}
            for fut in as_completed(futs):
                e = futs[fut]
                try:
                    outcomes.append(fut.result())
                except Exception as exc:  # noqa: BLE001 -- a grader bug must not stop the class
                    o = Outcome(e.student_id, e.assignment, e.student_name, status="error",
                                message=f"internal grader error: {type(exc).__name__}: {exc}")
                    with contextlib.suppress(Exception):  # the row keeps the assignment's points
                        o.max_score = sum(t.points for t in course.tests(e.assignment))
                    outcomes.append(o)
                if bar:
                    bar.set_postfix_str(f"{e.student_id}/{e.assignment}"[:40])
                    bar.update()
        if bar:
            bar.close()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    outcomes = _fill_class(outcomes, course, assignments)
    return sorted(outcomes, key=lambda o: (o.student_id, o.assignment))


def _fill_class(outcomes: list[Outcome], course: Course, wanted=None) -> list[Outcome]:
    """A row for every student and every assignment graded for the class: 'not submitted' rows.
    Those are the assignments of the rows (``wanted``: --assignment was given), else the ones at
    least two students handed in (:func:`autograder.intake.ingest.class_assignments`): one
    student's stray notebook of another assignment is graded in its own row, not given to everyone."""
    students = {o.student_id: o.student_name for o in outcomes}
    seen = {(o.student_id, o.assignment) for o in outcomes}
    present = {o.assignment for o in outcomes if o.assignment in course.catalog.notebooks}
    assignments = sorted(present) if wanted else class_assignments(
        {(o.student_id, o.assignment) for o in outcomes
         if o.assignment in present and o.status not in ("missing", "no-notebook")}, present)
    for s, name in students.items():
        for a in assignments:
            if (s, a) not in seen:
                o = Outcome(s, a, name, notebook=course.catalog.notebooks[a], status="missing",
                            message="not submitted")
                tests = course.tests(a)
                o.max_score = sum(t.points for t in tests)
                o.tests = [TestResult(t.grade_id, getattr(_check(t.grade_id), "doc", t.grade_id), 0.0, t.points,
                                      False, "not submitted") for t in tests]
                outcomes.append(o)
    return outcomes
