"""How long the grader takes to plan one submission (read its cells, slice them, review the slice),
for notebooks with long chains of statements in a cell the student added.

    python -m tools.bench_planning [N ...]        # default: 1000 2000 4000

Each case is exercise 01's reference answers with added cells: ``chain``, one cell
``a1 = 1``, ``a2 = a1 + 1``, ... ``aN = aN-1 + 1`` and ``LayerNorm.chain_end = aN`` (graded code
reads the whole chain); ``independent``, one cell of N statements that graded code does not need;
``cells``, N added cells of one statement each. Prints seconds per case (the planning the grader
does in ``autograder.grade.grade_one`` before the sandbox starts: ``make_plan`` and
``scan.review``); no timing is asserted anywhere.
"""
from __future__ import annotations

import sys
import time

from autograder.intake import plan as planmod
from autograder.intake import scan
from autograder.grade import Course
from tools.fixture_class import solved_dict

ASSIGNMENT = "01_layernorm"


def student_cells(kind: str, n: int) -> list[dict]:
    from course import cells as cells_
    nb = solved_dict(ASSIGNMENT)
    out = [{"source": cells_.source(c), "grade_id": cells_.grade_id(c), "id": c.get("id")}
           for c in nb["cells"] if c["cell_type"] == "code"]
    if kind == "chain":
        src = "a1 = 1\n" + "".join(f"a{i} = a{i - 1} + 1\n" for i in range(2, n + 1)) + f"LayerNorm.chain_end = a{n}\n"
        added = [src]
    elif kind == "independent":
        added = ["".join(f"b{i} = {i}\n" for i in range(1, n + 1))]
    else:
        added = [f"c{i} = {i}\n" for i in range(1, n + 1)]
    return out + [{"source": s, "grade_id": None, "id": None} for s in added]


def plan_seconds(kind: str, n: int) -> float:
    course = Course()
    release = course.release(ASSIGNMENT)
    cells = student_cells(kind, n)
    t = time.perf_counter()
    plan = planmod.make_plan(release, cells)
    scan.review(plan.slice)
    return time.perf_counter() - t


def main(argv: list[str]) -> None:
    sizes = [int(a) for a in argv] or [1000, 2000, 4000]
    plan_seconds("chain", 10)  # warm: IPython's transformer, the checks registry
    for kind in ("chain", "independent", "cells"):
        for n in sizes:
            print(f"{kind:12s} {n:6d} statements: {plan_seconds(kind, n):8.2f} s", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
