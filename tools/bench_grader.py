"""The course grader alone on ``make bench-grade``'s class, for comparing two checkouts.

    python -m tools.bench_grader [--students N] [--jobs J] [--only A,B] [--cpu]

Builds the class of :mod:`tools.bench_stock` (N students per assignment, reference solutions and
untouched stubs alternating), grades it once to warm up (slots, caches), then once timed, and prints
seconds per notebook, the mean of each phase per submission, and the scores. To compare a change
with the code before it, run it in each checkout side by side, alternating, e.g.
``cd OLD && PYTHONPATH=$PWD python -m tools.bench_grader`` then the same in the new one.
``--only`` keeps the assignments both checkouts have; ``--cpu`` (root, cgroup v1) also prints the CPU
time of every process of the timed grading (the sandboxes included), read from a cpuacct group this
process moves into: under load, CPU time moves less than wall time.
"""
from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from tools.bench_stock import build_class


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--students", type=int, default=4)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--only", help="comma-separated assignments to keep (e.g. those an older checkout has)")
    ap.add_argument("--cpu", action="store_true", help="also the CPU time of the timed grading (root, cgroup v1)")
    args = ap.parse_args(argv)
    from autograder.grade import grade_class

    tmp = Path(tempfile.mkdtemp(prefix="bench-grader-"))
    build_class(tmp / "submitted", args.students)
    if args.only:
        keep = set(args.only.split(","))
        for d in (tmp / "submitted").glob("*/*"):
            if d.name not in keep:
                shutil.rmtree(d)
    group = _cpu_group() if args.cpu else None
    grade_class(tmp / "submitted", tmp / "warm", jobs=args.jobs, progress=False)
    cpu0 = _usage(group)
    t0 = time.perf_counter()
    outs = grade_class(tmp / "submitted", tmp / "timed", jobs=args.jobs, progress=False)
    wall = time.perf_counter() - t0
    if group is not None:
        print(f"CPU time of the timed grading: {(_usage(group) - cpu0) / 1e9 / len(outs):.3f} s per notebook")
    phases: dict = {}
    for o in outs:
        for k, v in o.timings.items():
            phases.setdefault(k, []).append(v)
    print(f"{len(outs)} notebooks in {wall:.2f} s: {wall / len(outs):.3f} s per notebook; per submission: wall "
          f"{statistics.mean(o.wall_s for o in outs):.3f} s, "
          + ", ".join(f"{k} {statistics.mean(v):.3f}" for k, v in sorted(phases.items())))
    print("scores:", " ".join(f"{o.student_id}/{o.assignment}={o.score:g}" for o in outs))
    return 0


def _cpu_group() -> Path:
    """A cpuacct cgroup (v1) holding this process and so every process it starts from now on."""
    root = Path("/sys/fs/cgroup/cpuacct")
    if not (root / "cpuacct.usage").exists():
        raise SystemExit("--cpu needs cgroup v1's cpuacct hierarchy at /sys/fs/cgroup/cpuacct (and root)")
    group = root / f"bench-grader-{os.getpid()}"
    group.mkdir(exist_ok=True)
    (group / "cgroup.procs").write_text(str(os.getpid()))

    def leave():  # back to the root group, and the empty group removed
        (root / "cgroup.procs").write_text(str(os.getpid()))
        try:
            group.rmdir()
        except OSError:
            pass
    atexit.register(leave)
    return group


def _usage(group: Path | None) -> int:
    return int((group / "cpuacct.usage").read_text()) if group is not None else 0


if __name__ == "__main__":
    raise SystemExit(main())
