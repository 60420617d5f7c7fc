"""Command line: ``python -m autograder grade [SUBMISSIONS] --out DIR [--jobs N] [limits...]``.

Exit status: 0 when the run finished (whatever the submissions did), 2 when it could not run
(bad arguments, unreadable or empty input, no sandbox available without ``--no-sandbox``,
earlier results in ``--out`` that cannot be read; with ``--scheduler``: no scheduler or no workers
there, or a worker that refuses, having another course installed or no sandbox).

``--scheduler ADDRESS`` grades on a Dask distributed cluster (:mod:`autograder.cluster`); this
process still writes every output.

SUBMISSIONS is required, except with ``--course DIR``, in an nbgrader course directory (its
``submitted/``) or with ``--sample-class`` (the bundled sample class, ``tools/sample_class``, what
``make grade`` grades). ``--assignment NAME`` (repeatable) grades only those assignments.

Grading into a folder that holds earlier results merges with them (:mod:`autograder.report.results`)
when this run regrades the same class (at least one student in common): this run's rows replace
those of the same student and assignment, the others stay. Another class is refused; ``--fresh``
discards the earlier results first. Nothing is written to ``--out`` (not even the folder) before
the grading has started.

Grading a course's own ``submitted/`` folder (SUBMISSIONS is ``<course>/submitted`` and
``<course>`` holds an ``nbgrader_config.py``, or ``--course DIR``) also writes the scores into that
course's gradebook and ``autograded/`` notebooks, as ``nbgrader autograde`` would
(:mod:`autograder.nbgrader.course_dir`); ``--no-course`` grades such a folder like any other.
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

from autograder.sandbox.bwrap import Limits

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "tools" / "sample_class"


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m autograder")
    sub = ap.add_subparsers(dest="cmd")
    g = sub.add_parser("grade", help="grade a class of submissions")
    g.add_argument("submissions", nargs="?", default=None,
                   help="folder in nbgrader's submitted layout, a .zip of one, an LMS download "
                        "(Canvas, Moodle), or one .ipynb. Required, except with --course or --sample-class, "
                        "or in an nbgrader course directory (then its submitted/ folder)")
    g.add_argument("--sample-class", action="store_true",
                   help=f"grade the bundled sample class ({SAMPLE.relative_to(ROOT)}/, what `make grade` grades)")
    g.add_argument("--assignment", action="append", default=None, metavar="NAME",
                   help="grade only this assignment (repeatable); default: every assignment handed in")
    g.add_argument("--out", required=True, help="output folder (grades.csv, feedback/, report.html); "
                                                "earlier results there of the same class are kept and merged")
    g.add_argument("--fresh", action="store_true",
                   help="discard the earlier results in --out (grades.csv, results.json, report.html, "
                        "feedback/, its gradebook.db) instead of merging with them")
    g.add_argument("--jobs", type=int, default=None, help="submissions graded at once (default: cores)")
    g.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="grade on a running Dask distributed cluster, e.g. tcp://10.0.0.5:8786 (its workers "
                        "need this course checked out, same commit, and bubblewrap); this process writes "
                        "every output. Default: grade on this machine")
    g.add_argument("--gradebook", default=None,
                   help="nbgrader gradebook to write (sqlite file; default OUT/gradebook.db, or none when "
                        "grading a course's submitted/ folder; 'none' to skip)")
    g.add_argument("--course", default=None, metavar="DIR",
                   help="nbgrader course directory (holds nbgrader_config.py) whose submitted/ folder is "
                        "graded: its gradebook and autograded/ notebooks get the results, for the formgrader, "
                        "nbgrader generate_feedback and export. Found by itself when SUBMISSIONS is "
                        "<course>/submitted")
    g.add_argument("--no-course", action="store_true",
                   help="never write into a course's gradebook or autograded/ folder")
    d = Limits()
    g.add_argument("--timeout", type=float, default=d.wall_s, help=f"wall-clock seconds per notebook ({d.wall_s:g})")
    g.add_argument("--cell-timeout", type=float, default=d.cell_s, help=f"wall-clock seconds per cell ({d.cell_s:g})")
    g.add_argument("--cpu", type=int, default=d.cpu_s, help=f"CPU seconds per process ({d.cpu_s})")
    g.add_argument("--memory", type=int, default=None,
                   help="memory of one submission's processes together, tmpfs included, MB: its cgroup's "
                        "limit (default: 3/4 of the machine's memory split between the --jobs slots)")
    g.add_argument("--address-space", type=int, default=d.memory_mb,
                   help=f"address space per process, MB: RLIMIT_AS ({d.memory_mb})")
    g.add_argument("--cpus", type=float, default=d.cpus,
                   help=f"CPU time of one submission, in cores: its cgroup's quota ({d.cpus:g})")
    g.add_argument("--no-cgroups", action="store_true",
                   help="no cgroup per submission (when the grader is not root, or has no cgroups): "
                        "per-process rlimits only, so --memory and --cpus do not apply")
    g.add_argument("--nproc", type=int, default=d.nproc, help=f"extra processes/threads allowed ({d.nproc})")
    g.add_argument("--fsize", type=int, default=d.fsize_mb, help=f"largest file written, MB ({d.fsize_mb})")
    g.add_argument("--nofile", type=int, default=d.nofile, help=f"open files per process ({d.nofile})")
    g.add_argument("--tmp", type=int, default=d.tmp_mb, help=f"size of the sandbox's /tmp, MB ({d.tmp_mb})")
    g.add_argument("--threads", type=int, default=d.threads, help=f"torch/OpenMP threads per submission ({d.threads})")
    g.add_argument("--no-sandbox", action="store_true",
                   help="run submissions WITHOUT the bubblewrap sandbox (only rlimits): trusted code only")
    g.add_argument("--course-root", default=str(ROOT), help=argparse.SUPPRESS)  # tests: another course tree
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    return ap


class _Beside(threading.Thread):
    """``fn()`` in a thread of its own; :meth:`result` waits and raises what it raised."""

    def __init__(self, fn):
        super().__init__(daemon=True, name="beside")
        self.fn, self.error = fn, None
        self.start()

    def run(self) -> None:
        try:
            self.fn()
        except BaseException as e:  # noqa: BLE001 -- handed to the caller by result()
            self.error = e

    def result(self) -> None:
        self.join()
        if self.error is not None:
            raise self.error


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.cmd is None:
        ap.print_usage(sys.stderr)
        print("error: give a command: grade (python -m autograder grade --help)", file=sys.stderr)
        return 2
    from autograder.sandbox.bwrap import SandboxUnavailable, ensure_bwrap

    limits = Limits(wall_s=args.timeout, cell_s=args.cell_timeout, cpu_s=args.cpu, memory_mb=args.address_space,
                    nproc=args.nproc, fsize_mb=args.fsize, nofile=args.nofile, tmp_mb=args.tmp,
                    threads=args.threads, submission_mb=args.memory, cpus=args.cpus,
                    cgroups=not args.no_cgroups)
    if args.scheduler and args.jobs:
        print("warning: --jobs is ignored with --scheduler: each worker grades --nthreads notebooks at once",
              file=sys.stderr)
    if args.no_sandbox:
        print("warning: --no-sandbox: submissions run with your permissions (rlimits only)"
              + (" on every worker" if args.scheduler else ""), file=sys.stderr)
    elif not args.scheduler:  # on a cluster, each worker checks its own sandbox (autograder.cluster)
        # The sandbox's check (bwrap starts the course's Python, which finds and reads its packages)
        # runs beside this process's own imports; its answer is awaited below. imports=False: the
        # course's imports are the first zygote's, which grade_class starts before grading; its
        # SandboxUnavailable stops the run below as the probe's would.
        probe = _Beside(lambda: ensure_bwrap(limits=limits, imports=False))
    from autograder.report import results
    from autograder.cluster import ClusterError, grade_on_cluster
    from autograder.grade import grade_class
    from autograder.intake.ingest import InputError
    if not args.no_sandbox and not args.scheduler:
        try:
            probe.result()
        except SandboxUnavailable as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    from autograder.nbgrader import course_dir as nbgrader_course
    nbcourse = None
    if args.course and args.no_course:
        print("error: --course and --no-course exclude each other", file=sys.stderr)
        return 2
    if args.sample_class:
        if args.submissions is not None or args.course:
            print("error: --sample-class grades the bundled sample class: give no SUBMISSIONS or --course with it",
                  file=sys.stderr)
            return 2
        args.submissions, args.no_course = str(SAMPLE), True
    elif args.submissions is None and not args.course:
        here = Path.cwd()
        if (here / nbgrader_course.CONFIG).is_file() and not args.no_course:  # a course directory: its submitted/
            args.course = str(here)
        else:
            print("error: no SUBMISSIONS given: name the submissions to grade (a folder laid out "
                  "<student_id>/<assignment>/<notebook>.ipynb such as an nbgrader course's submitted/, a .zip "
                  "of one, or an LMS download), or run in an nbgrader course directory (its submitted/ is "
                  "graded), or --course DIR. The bundled sample class is graded only when asked for: "
                  f"--sample-class (or {SAMPLE.relative_to(ROOT)}; `make grade`)", file=sys.stderr)
            return 2
    if args.course:
        try:
            nbcourse = nbgrader_course.load(Path(args.course))
        except nbgrader_course.CourseError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if args.submissions is None:
            args.submissions = str(nbcourse.submitted)
            if not nbcourse.submitted.is_dir():
                print(f"error: no SUBMISSIONS given, and the course {nbcourse.root} has no {nbcourse.submitted.name}/ "
                      "folder to grade (`nbgrader collect` makes it): name the submissions to grade, or "
                      "--sample-class for the bundled sample class", file=sys.stderr)
                return 2
        elif Path(args.submissions).resolve() != nbcourse.submitted.resolve():
            print(f"error: --course {args.course}: SUBMISSIONS must be that course's submitted folder "
                  f"{nbcourse.submitted} (or left out)", file=sys.stderr)
            return 2
    elif not args.no_course:
        nbcourse = nbgrader_course.detect(Path(args.submissions))
    if args.assignment:  # an unknown name is an error before anything else is said or done
        from autograder.intake.ingest import Catalog
        try:
            from autograder.grade import select
            select([], Catalog(Path(args.course_root) / "exercises"), args.assignment, check_only=True)
        except InputError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2

    def announce() -> None:  # once the run is known to go ahead
        if nbcourse is not None:
            print(f"grading the nbgrader course {nbcourse.root}: results also go to its gradebook "
                  f"({nbcourse.db_url}) and {nbcourse.autograded}/", file=sys.stderr)
    out = Path(args.out)
    gb = args.gradebook if args.gradebook is not None else ("none" if nbcourse is not None else None)
    gb_path = None if (gb or "").lower() == "none" else (Path(gb) if gb else out / "gradebook.db")
    try:
        before = None if args.fresh else results.earlier(out)
    except results.EarlierResultsError as e:
        print(f"error: {e}. Grading into {out} would lose the earlier grades: repair or move that file, "
              "grade into another --out, or --fresh to discard them", file=sys.stderr)
        return 2

    def same_class(students) -> None:
        why = results.other_class(before or [], students)
        if why:
            raise InputError(f"{out} holds the results of another class: {why}. Nothing was graded or written. "
                             "Grade this class into another --out, or add --fresh to discard the earlier "
                             "results there")

    t0 = time.perf_counter()
    try:
        if args.scheduler:
            outcomes = grade_on_cluster(Path(args.submissions), scheduler=args.scheduler, limits=limits,
                                        sandbox=not args.no_sandbox, progress=not args.no_progress,
                                        root=Path(args.course_root), assignments=args.assignment)
            same_class({o.student_id for o in outcomes})
            announce()
        else:
            outcomes = grade_class(Path(args.submissions), out, jobs=args.jobs, limits=limits,
                                   sandbox=not args.no_sandbox, progress=not args.no_progress,
                                   root=Path(args.course_root), assignments=args.assignment,
                                   before_grading=lambda es: (same_class({e.student_id for e in es}), announce()))
    except (InputError, SandboxUnavailable) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ClusterError as e:
        print(f"error: the class was not graded, nothing was written: {e}", file=sys.stderr)
        return 2
    if args.fresh:
        gone = results.clear(out, gb_path if gb_path == out / "gradebook.db" else None)
        if gone:
            print(f"--fresh: removed the earlier {', '.join(gone)} from {out}", file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)  # only now: an error exit leaves no empty folder behind
    n = len(outcomes)
    fresh = outcomes
    nonb = sorted({o.student_id for o in outcomes if o.status == "no-notebook"})
    if nonb:
        print(f"{len(nonb)} student{'s' if len(nonb) != 1 else ''} handed in no notebook of the assignment "
              f"(status no-notebook, the row names what was handed in): {', '.join(nonb[:10])}"
              + (", ..." if len(nonb) > 10 else ""), file=sys.stderr)
    if before is not None:
        outcomes, fresh, kept = results.merge(before, outcomes)
        if kept:
            rows = lambda k: f"{k} row{'s' if k != 1 else ''}"  # noqa: E731
            print(f"regraded {rows(len(fresh))}, kept {rows(kept)} of earlier runs: students and assignments not "
                  f"in this run (from {out / 'results.json'})", file=sys.stderr)
    if nbcourse is not None:  # names and kept manual grades from the course's gradebook
        nbgrader_course.annotate(outcomes, nbcourse, {(o.student_id, o.assignment) for o in fresh})
        results.print_kept_manual(fresh, nbcourse.db_url)
    outcomes = [results.printable(o) for o in outcomes]  # every writer below gets text it can encode
    fresh = [results.printable(o) for o in fresh]
    results.write_csv(outcomes, out / "grades.csv")
    results.write_json(outcomes, out / "results.json")
    from autograder.report import feedback
    from autograder.nbgrader import gradebook
    # The gradebook (nbgrader's database, filled by a subprocess of nbgrader) is written beside the
    # feedback and the report (this process, matplotlib): each keeps a core busy for seconds.
    gb_job = (_Beside(lambda: gradebook.write(fresh, gb_path, root=Path(args.course_root)))
              if gb_path is not None and nbcourse is None else None)
    try:
        feedback.write_all(outcomes, out)
        if nbcourse is not None:
            try:
                warned = nbgrader_course.write(fresh, nbcourse, root=Path(args.course_root),
                                               submissions=Path(args.submissions))
            except (nbgrader_course.CourseError, RuntimeError) as e:
                print(f"error: the grades are in {out}, but writing them into the course failed: {e}",
                      file=sys.stderr)
                return 2
            for w in warned:
                print(f"warning: {w}", file=sys.stderr)
    finally:  # the gradebook is never left half written by an error here
        if gb_job is not None:
            gb_job.join()
    if gb_job is not None:
        gb_job.result()
    elif gb_path is not None:
        gradebook.write(fresh, gb_path, root=Path(args.course_root))
    print(f"graded {n} submission rows in {time.perf_counter() - t0:.1f} s: {out / 'grades.csv'}, "
          f"{out / 'report.html'}, {out / 'feedback'}/"
          + (f"; the course's gradebook and {nbcourse.autograded}/" if nbcourse is not None else ""),
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
