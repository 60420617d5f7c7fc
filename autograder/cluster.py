"""Grade on a Dask distributed cluster: ``python -m autograder grade ... --scheduler tcp://HOST:8786``.

Who does what:

* the client (this process, the instructor's command) finds the submissions, sends each one to
  the cluster as one task (the notebook's bytes, the limits, the course hash) with
  ``distributed.Client.submit``, and is the only writer of every output: it checks what comes
  back and turns it into the class's rows (:func:`grade_on_cluster`);
* a worker (``dask worker``, with this repository checked out and its venv) runs :func:`grade_task`:
  the same :func:`autograder.grade.grade_one` as a local run, so the same bubblewrap sandbox with
  the same limits and the same judges, and returns plain data (a dict of str, numbers, lists).

A worker refuses a task, instead of grading it, when its installed course differs from the
client's (:func:`course_hash`), or when it cannot build the sandbox (no bwrap) while the client
did not pass ``--no-sandbox``. The client then stops with exit status 2 and writes nothing: a
class graded half with other tests, or half ungraded, is worse than a clear error.

A worker that dies while grading (SIGKILL, out of memory, machine lost) loses its task, and the
scheduler runs it on another worker; after ``distributed.scheduler.allowed-failures`` deaths
(scheduler setting, default 3) it gives up with ``KilledWorker`` and the student's row says
``crashed``. Exceptions raised by the grader itself are retried once elsewhere
(:data:`RETRIES`), then give an ``error`` row, as in a local run.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import shutil
import socket
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from autograder.grade import Course, _fill_class, grade_one, select
from autograder.intake.ingest import Entry, discover
from autograder.report.outcome import Outcome, TestResult, check_for
from autograder.intake.plan import MAX_NOTEBOOK_BYTES
from autograder.sandbox.bwrap import Limits, SandboxUnavailable, ensure_bwrap
from autograder.sandbox.slots import SlotPool

ROOT = Path(__file__).resolve().parent.parent
GRADER = Path(__file__).resolve().parent
#: retries of a task whose grading raised (a grader bug, a full disk on one worker); a worker's death
#: is counted by the scheduler instead (its allowed-failures)
RETRIES = 1
#: seconds a worker gets to answer the first check (its first import of torch, a sandbox started)
CHECK_S = 300.0
STATUSES = {"graded", "timeout", "crashed", "unreadable", "missing", "no-notebook", "unknown-assignment",
            "error"}


class ClusterError(RuntimeError):
    """The class could not be graded on the cluster (exit status 2); the message says why."""


def _course_files(root: Path) -> list[tuple[str, Path]]:
    """(label, path) of every file whose content can change a grade: the check modules and the
    hidden checks (``coursekit/``, ``course/``), the released notebooks, and the grader's own code."""
    def tree(base: Path, label: str):
        return [(f"{label}/{p.relative_to(base).as_posix()}", p) for p in base.rglob("*")
                if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"]
    files = tree(root / "coursekit", "coursekit") + tree(root / "course", "course")
    files += [(f"exercises/{p.relative_to(root / 'exercises').as_posix()}", p)
              for p in (root / "exercises").glob("*/*.ipynb")]
    files += tree(GRADER, "autograder")
    return sorted(files)


def course_hash(root: Path = ROOT) -> str:
    """sha256 over the names and contents of :func:`_course_files`: equal on two machines exactly when
    they grade with the same checks, notebooks and grader."""
    h = hashlib.sha256()
    for label, path in _course_files(Path(root)):
        h.update(label.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


# --- the worker's side ------------------------------------------------------------------------------

_state: dict = {}
_state_lock = threading.Lock()


def _worker_course() -> tuple[Course, str]:
    """This process's course (its own checkout) and its hash, made once: the check modules are
    imported once too, so the hash describes what grades here."""
    with _state_lock:
        if not _state:
            import torch
            from coursekit.checks import load_all

            torch.set_num_threads(1)  # parallelism comes from the worker's threads, one sandbox each
            load_all()
            _state.update(course=Course(ROOT), hash=course_hash(ROOT))
        return _state["course"], _state["hash"]


def _where() -> str:
    try:
        from distributed import get_worker
        return f"worker {get_worker().address} ({socket.gethostname()}, {ROOT})"
    except ValueError:  # not inside a worker
        return f"{socket.gethostname()} ({ROOT})"


def worker_check(want_hash: str, sandbox: bool, limits: Limits | None = None) -> str | None:
    """None when this worker may grade for a client whose course hashes to ``want_hash``; else why not."""
    _, have = _worker_course()
    if have != want_hash:
        return (f"{_where()} has another course installed: course hash {have[:16]}, the client's "
                f"{want_hash[:16]} (the check modules, released notebooks or grader differ). Check out the "
                "client's commit there (git pull; git status clean) and restart that worker")
    if sandbox:
        try:
            ensure_bwrap(ROOT / "course", limits)
        except SandboxUnavailable as e:
            return f"{_where()} cannot sandbox submissions, so it grades none: {e}"
    return None


_pools: dict = {}  # Limits as a tuple -> [SlotPool, tasks using it]


def _nthreads() -> int:
    try:
        from distributed import get_worker
        return get_worker().state.nthreads
    except ValueError:  # not inside a worker
        return os.cpu_count() or 1


@contextlib.contextmanager
def _slots(limits: Limits, course: Course, sandbox: bool):
    """This worker's grading slots for ``limits``, as a local run has them (:mod:`autograder.sandbox.slots`:
    one pre-imported sandbox per worker thread, a fresh child of it per notebook); kept between
    tasks and runs. A pool for other limits is closed as soon as no task uses it."""
    if not sandbox:
        yield None
        return
    key = dataclasses.astuple(limits)
    with _state_lock:
        for k in [k for k, (_, users) in _pools.items() if k != key and users == 0]:
            _pools.pop(k)[0].close()
        if key not in _pools:
            _pools[key] = [SlotPool(limits, course.root / "course", size=_nthreads()), 0]
        held = _pools[key]
        held[1] += 1
    try:
        yield held[0]
    finally:
        with _state_lock:
            held[1] -= 1


def grade_task(job: dict) -> dict:
    """Run on a worker: grade one submission (``job`` from :func:`_job`) in this worker's sandbox.

    Returns ``{"outcome": <Outcome as a dict>, "worker": str}``, or ``{"refused": why}``.
    """
    why = worker_check(job["course_hash"], job["sandbox"], Limits(**job["limits"]) if "limits" in job else None)
    if why:
        return {"refused": why}
    course, _ = _worker_course()
    scratch = Path(tempfile.mkdtemp(prefix="autograde-"))
    try:
        path = scratch / "submission.ipynb"
        path.write_bytes(job["notebook"])
        entry = Entry(job["student_id"], job["assignment"], path, job["student_name"], list(job["notes"]))
        limits = Limits(**job["limits"])
        if limits.cgroups and limits.submission_mb is None:  # this worker's slots fit this machine
            from autograder.sandbox.cgroups import default_memory_mb
            limits = dataclasses.replace(limits, submission_mb=default_memory_mb(_nthreads()))
        with _slots(limits, course, job["sandbox"]) as slots:
            o = grade_one(entry, course, limits, scratch, job["sandbox"], slots, draw=job.get("draw"))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return {"outcome": dataclasses.asdict(o), "worker": _where()}


# --- the client's side ------------------------------------------------------------------------------

def _job(entry: Entry, course: Course, limits: Limits, sandbox: bool, want_hash: str) -> dict | None:
    """The task for ``entry``; None when nothing would run (nothing submitted, unknown assignment,
    a file that cannot be read or is too big): the client makes that row itself, as grade_one does."""
    if entry.path is None or entry.assignment not in course.catalog.notebooks:
        return None
    try:
        if not 0 < entry.path.stat().st_size <= MAX_NOTEBOOK_BYTES:
            return None
        data = entry.path.read_bytes()
    except OSError:
        return None
    from autograder.referee import calls as referee  # the draw of the hidden inputs is the client's (its course secret)
    draw = referee.draw_for(referee.course_secret(course.root), entry.student_id, entry.assignment, entry.path)
    return {"student_id": entry.student_id, "assignment": entry.assignment, "student_name": entry.student_name,
            "notes": list(entry.notes), "notebook": data, "limits": dataclasses.asdict(limits),
            "sandbox": sandbox, "course_hash": want_hash, "draw": draw}


class BadResult(ValueError):
    """What a worker sent back is not an outcome of the submission it was given."""


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def outcome_from(res, entry: Entry, course: Course) -> Outcome:
    """The row a worker's plain result stands for, after checking its shape, types and that it
    grades the tests the client's release has (same grade ids, in order, same points)."""
    if not isinstance(res, dict) or set(res) != {"outcome", "worker"}:
        raise BadResult(f"expected {{'outcome', 'worker'}}, got {type(res).__name__} "
                        f"{sorted(res) if isinstance(res, dict) else ''}")
    d = res["outcome"]
    names = {f.name for f in dataclasses.fields(Outcome)}
    if not isinstance(d, dict) or set(d) != names:
        raise BadResult(f"the outcome's fields are {sorted(d) if isinstance(d, dict) else type(d).__name__}")
    for k in ("student_id", "assignment", "student_name", "notebook", "status", "message", "output_tail"):
        if not isinstance(d[k], str):
            raise BadResult(f"{k} is a {type(d[k]).__name__}")
    for k in ("score", "max_score", "wall_s"):
        if not _number(d[k]):
            raise BadResult(f"{k} is a {type(d[k]).__name__}")
    if type(d["hidden_draw"]) is not int:
        raise BadResult(f"hidden_draw is a {type(d['hidden_draw']).__name__}")
    if not (isinstance(d["notes"], list) and all(isinstance(n, str) for n in d["notes"])):
        raise BadResult("notes is not a list of str")
    if not (isinstance(d["review"], list) and all(isinstance(r, str) for r in d["review"])):
        raise BadResult("review is not a list of str")
    if not (isinstance(d["cell_errors"], list) and all(isinstance(c, dict) for c in d["cell_errors"])):
        raise BadResult("cell_errors is not a list of dicts")
    timings = d["timings"]
    if not (isinstance(timings, dict) and all(isinstance(k, str) and _number(v) for k, v in timings.items())):
        raise BadResult("timings is not a dict of numbers")
    if (d["student_id"], d["assignment"]) != (entry.student_id, entry.assignment):
        raise BadResult(f"it grades {d['student_id']}/{d['assignment']}, not {entry.student_id}/{entry.assignment}")
    if d["status"] not in STATUSES:
        raise BadResult(f"unknown status {d['status']!r}")
    want = course.tests(entry.assignment)
    if not isinstance(d["tests"], list) or len(d["tests"]) != len(want):
        raise BadResult(f"{len(d['tests']) if isinstance(d['tests'], list) else 'no'} test results for the "
                        f"release's {len(want)} tests")
    tnames = {f.name for f in dataclasses.fields(TestResult)}
    tests = []
    for t, w in zip(d["tests"], want):
        if not isinstance(t, dict) or set(t) != tnames:
            raise BadResult("a test result has other fields")
        ok = (isinstance(t["grade_id"], str) and isinstance(t["doc"], str) and isinstance(t["message"], str)
              and isinstance(t["passed"], bool) and _number(t["points"]) and _number(t["max_points"])
              and isinstance(t["detail"], dict) and isinstance(t["kind"], str))
        if not ok:
            raise BadResult(f"the result of {t.get('grade_id')!r} has wrong types")
        if t["grade_id"] != w.grade_id or t["max_points"] != w.points:
            raise BadResult(f"test {t['grade_id']!r} ({t['max_points']} points) where the release has "
                            f"{w.grade_id!r} ({w.points} points)")
        if t["points"] != (w.points if t["passed"] else 0.0):
            raise BadResult(f"test {w.grade_id!r}: {t['points']} points, passed={t['passed']}")
        tests.append(TestResult(**t))
    if abs(d["score"] - sum(t.points for t in tests)) > 1e-9 or d["max_score"] != sum(w.points for w in want):
        raise BadResult(f"score {d['score']} / {d['max_score']} is not the sum of its tests")
    if d["other_assignment"] not in ("", *course.catalog.notebooks) or d["other_assignment"] == entry.assignment:
        raise BadResult(f"other_assignment {d['other_assignment']!r} is not another assignment of the course")
    from autograder.referee.protocol import OUTPUT_TAIL_CHARS, bound_cell_errors
    # the file's name is the client's (the worker saw a copy named submission.ipynb); manual grades
    # kept are the course gradebook's, read here
    return Outcome(**dict(d, tests=tests, cell_errors=bound_cell_errors(d["cell_errors"]),
                          output_tail=d["output_tail"][-OUTPUT_TAIL_CHARS:],
                          handed_in=entry.filename or (entry.path.name if entry.path else ""), manual_kept=[]))


def _zero(entry: Entry, course: Course, status: str, message: str) -> Outcome:
    """A row where every test of the release scores 0 with ``message``."""
    tests = course.tests(entry.assignment)
    o = Outcome(entry.student_id, entry.assignment, entry.student_name,
                notebook=course.catalog.notebooks[entry.assignment], status=status, message=message,
                notes=list(entry.notes), max_score=sum(t.points for t in tests),
                handed_in=(entry.filename or entry.path.name) if entry.path is not None and status != "missing" else "")
    o.tests = [TestResult(t.grade_id, getattr(check_for(t.grade_id), "doc", t.grade_id), 0.0, t.points, False,
                          message) for t in tests]
    if o.notes:
        o.message = "; ".join([o.message] + o.notes)
    return o


def _connect(scheduler: str, timeout: float):
    from distributed import Client

    try:
        return Client(scheduler, timeout=timeout, set_as_default=False)
    except (OSError, TimeoutError) as e:
        raise ClusterError(f"cannot reach the Dask scheduler at {scheduler}: {e}") from None


def _ask_workers(client, want: str, sandbox: bool, answer_s: float = CHECK_S, limits: Limits | None = None) -> list:
    """Every worker connected now says whether it would grade (:func:`worker_check`), so a wrong
    checkout or a missing bwrap stops the run before any work; workers that join later check each
    task again (:func:`grade_task`). A task on each worker's own threads, not ``client.run``: the
    first check imports torch and starts a sandbox, too long to block a worker's event loop. A
    worker that leaves meanwhile, or does not answer in ``answer_s``, is left out with a warning."""
    workers = list(client.scheduler_info(n_workers=-1)["workers"])
    futs = [client.submit(worker_check, want, sandbox, limits, workers=[w], allow_other_workers=False, pure=False,
                          key=f"autograde-check-{uuid.uuid4().hex[:8]}-{w}") for w in workers]
    deadline = time.monotonic() + answer_s
    while not all(f.done() for f in futs) and time.monotonic() < deadline:
        time.sleep(0.2)
    said = []
    for w, f in zip(workers, futs):
        if f.status == "finished":
            said.append(f.result())
        else:
            print(f"warning: worker {w} did not answer the grader's first check ({f.status}); "
                  "should it grade, each of its tasks checks the course itself", file=sys.stderr)
            f.cancel()
    return said


def grade_on_cluster(src: Path, *, scheduler: str, limits: Limits | None = None, sandbox: bool = True,
                     root: Path = ROOT, progress: bool = True, connect_s: float = 30.0,
                     assignments=None) -> list[Outcome]:
    """Grade every submission in ``src`` (only ``assignments`` when given) on the cluster behind
    ``scheduler``; return the outcomes, sorted, as :func:`autograder.grade.grade_class` does (the
    caller writes them)."""
    from distributed import KilledWorker, as_completed

    limits = limits or Limits()
    course = Course(root)
    want = course_hash(root)
    scratch = Path(tempfile.mkdtemp(prefix="autograde-"))
    try:
        entries = select(discover(src, course.catalog, scratch), course.catalog, assignments)
        from coursekit.checks import load_all
        load_all()
        with _connect(scheduler, connect_s) as client:
            said = _ask_workers(client, want, sandbox, limits=limits)
            if not said:
                raise ClusterError(f"the scheduler at {scheduler} has no workers: start some with "
                                   f"`dask worker {scheduler} --nthreads N` (docs/cluster.md, Grading on a cluster)")
            refusals = [why for why in said if why]
            if refusals:
                raise ClusterError("\n".join(refusals))
            outcomes, jobs, keys, sent = [], [], [], []
            run = uuid.uuid4().hex[:8]
            for i, e in enumerate(entries):
                job = _job(e, course, limits, sandbox, want)
                if job is None:  # nothing to run: the row is made here, without a sandbox
                    outcomes.append(grade_one(e, course, limits, scratch, sandbox))
                    continue
                jobs.append(job)
                keys.append(f"autograde-{run}-{i:05d}-{e.assignment}-{e.student_id[:60]}")
                sent.append(e)
            # One graph for the class: when it holds more than twice as many notebooks as the cluster
            # has threads, the scheduler queues them and hands each worker only as many as it has
            # threads (worker-saturation 1.0, docs/cluster.md), so a worker that dies counts against the
            # notebooks it was running and no others (allowed-failures).
            futures = dict(zip(client.map(grade_task, jobs, key=keys, pure=False, retries=RETRIES), sent))
            print(f"grading {len(futures)} notebooks on {len(said)} workers of {scheduler}", file=sys.stderr)
            bar = None
            if progress:
                from tqdm import tqdm
                bar = tqdm(total=len(futures), desc="grading", unit="nb", file=sys.stderr)
            for fut in as_completed(list(futures), loop=client.loop):
                e = futures.pop(fut)
                try:
                    res = fut.result()
                    # let the scheduler forget it: a result left on a worker that dies later would be
                    # graded again, for nothing
                    fut.release()
                    if isinstance(res, dict) and "refused" in res:
                        client.cancel(list(futures))  # the ones not back yet
                        raise ClusterError(str(res["refused"]))
                    o = outcome_from(res, e, course)
                except KilledWorker as exc:
                    o = _zero(e, course, "crashed", (
                        f"the grader's worker died {exc.allowed_failures + 1} times while running this notebook "
                        f"(last on {exc.last_worker.address}), so it was not graded: it may need more memory "
                        "than a worker machine has, or crash it; tests scored 0. Instructor: see that worker's log"))
                except BadResult as exc:
                    o = Outcome(e.student_id, e.assignment, e.student_name, status="error",
                                message=f"internal grader error: a worker sent back a malformed result ({exc})")
                except ClusterError:
                    raise
                except Exception as exc:  # noqa: BLE001 -- a grader bug must not stop the class
                    o = Outcome(e.student_id, e.assignment, e.student_name, status="error",
                                message=f"internal grader error: {type(exc).__name__}: {exc}")
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


__all__ = ["ClusterError", "course_hash", "grade_on_cluster", "grade_task", "outcome_from", "worker_check"]
