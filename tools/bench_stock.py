"""Stock ``nbgrader autograde`` against the course autograder on the same class, side by side.

    python -m tools.bench_stock [--students N] [--jobs J] [--one-off]     (make bench-grade)

The class: N students per assignment, alternating the reference solution and the untouched stub
(honest submissions, so both graders must agree on every test). Prints both wall times, the
speed-up, where the course grader's seconds went per submission (sandbox and interpreter start,
cells, tests, the served benchmark), and exits 1 if any score differs. ``--one-off`` also times
the course grader with a whole sandbox and interpreter started per submission (no zygote), the
way it ran before :mod:`autograder.sandbox.slots`.
"""
from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from pathlib import Path

from tools.fixture_class import _write, release_dict, solved_dict
from course.release import ROOT, assignments


GOAL, FLOOR = 10.0, 8.0  # the course grader against stock nbgrader on this class (issue 12)


def build_class(dest: Path, students: int) -> None:
    for a in assignments():
        name, rel = release_dict(a)
        sol = solved_dict(a)
        for i in range(students):
            _write(dest, f"student{i:02d}", a, name, copy.deepcopy(sol if i % 2 == 0 else rel))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--students", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--one-off", action="store_true", help="also time one sandbox per submission")
    args = ap.parse_args(argv)
    from autograder.grade import grade_class
    from tools.stock import autograde_stock

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        build_class(tmp / "submitted", args.students)
        n = sum(1 for _ in (tmp / "submitted").glob("*/*/*.ipynb"))
        t0 = time.perf_counter()
        stock = autograde_stock(tmp / "submitted", tmp / "stock")
        t_stock = time.perf_counter() - t0
        t0 = time.perf_counter()
        ours = grade_class(tmp / "submitted", tmp / "ours", jobs=args.jobs, progress=True)
        t_ours = time.perf_counter() - t0
        t_once = None
        if args.one_off:
            t0 = time.perf_counter()
            once = grade_class(tmp / "submitted", tmp / "once", jobs=args.jobs, progress=True, zygote=False)
            t_once = time.perf_counter() - t0
    stock.pop("_timings", None)
    diffs = []
    for o in ours:
        row = stock.get((o.student_id, o.assignment), {})
        for t in o.tests:
            s = row.get(t.grade_id, (None,))[0]
            if s != t.points:
                diffs.append(f"{o.student_id}/{o.assignment}/{t.grade_id}: stock {s}, ours {t.points}")
    print(f"{n} notebooks ({args.students} students x {len(assignments())} assignments, solutions and stubs)")
    print(f"stock nbgrader autograde: {t_stock:7.1f} s  ({t_stock / n:.2f} s per notebook)")
    print(f"course autograder:        {t_ours:7.1f} s  ({t_ours / n:.2f} s per notebook, sandboxed, "
          f"--jobs {args.jobs or 'cores'})")
    ratio = t_stock / t_ours
    verdict = "met" if ratio >= GOAL else ("above the floor, under the goal" if ratio >= FLOOR else "BELOW THE FLOOR")
    print(f"speed-up: {ratio:.1f}x (goal {GOAL:g}x, floor {FLOOR:g}x: {verdict})")
    print("course grader, mean seconds per submission by phase (grader's clock):")
    print(_phases(ours, "  forked from a zygote"))
    if t_once is not None:
        print(f"one sandbox and interpreter per submission: {t_once:7.1f} s ({t_stock / t_once:.1f}x stock)")
        print(_phases(once, "  one-off sandbox     "))
    if diffs:
        print("scores differ:\n  " + "\n  ".join(diffs[:40]))
        return 1
    print("identical scores on every test of every notebook")
    return 0


def _phases(outcomes, label: str) -> str:
    phases = ("start", "cells", "tests", "benchmark", "exit")
    n = max(1, len(outcomes))
    mean = {p: sum(o.timings.get(p, 0.0) for o in outcomes) / n for p in phases}
    wall = sum(o.wall_s for o in outcomes) / n
    return f"{label}: " + "  ".join(f"{p} {mean[p]:.2f}" for p in phases) + f"  | wall {wall:.2f}"


if __name__ == "__main__":
    sys.exit(main())
