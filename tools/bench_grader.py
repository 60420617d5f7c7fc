"""The course grader alone on ``make bench-grade``'s class, for comparing two checkouts.

    python -m tools.bench_grader [--students N] [--jobs J]

Builds the class of :mod:`tools.bench_stock` (N students per assignment, reference solutions and
untouched stubs alternating), grades it once to warm up (slots, caches), then once timed, and prints
seconds per notebook, the mean of each phase per submission, and the scores. To compare a change
with the code before it, run it in each checkout side by side, alternating, e.g.
``cd OLD && PYTHONPATH=$PWD python -m tools.bench_grader`` then the same in the new one.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from tools.bench_stock import build_class


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--students", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args(argv)
    from autograder.grade import grade_class

    tmp = Path(tempfile.mkdtemp(prefix="bench-grader-"))
    build_class(tmp / "submitted", args.students)
    grade_class(tmp / "submitted", tmp / "warm", jobs=args.jobs, progress=False)
    t0 = time.perf_counter()
    outs = grade_class(tmp / "submitted", tmp / "timed", jobs=args.jobs, progress=False)
    wall = time.perf_counter() - t0
    phases: dict = {}
    for o in outs:
        for k, v in o.timings.items():
            phases.setdefault(k, []).append(v)
    print(f"{len(outs)} notebooks in {wall:.2f} s: {wall / len(outs):.3f} s per notebook; per submission: wall "
          f"{statistics.mean(o.wall_s for o in outs):.3f} s, "
          + ", ".join(f"{k} {statistics.mean(v):.3f}" for k, v in sorted(phases.items())))
    print("scores:", " ".join(f"{o.student_id}/{o.assignment}={o.score:g}" for o in outs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
