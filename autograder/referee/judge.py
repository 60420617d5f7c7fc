"""Judge a submission's records in the grader's own process (trusted side): each check's judge, the
built-ins graded code names (:func:`autograder.intake.scan.costs`), and the benchmark's verdict on the
grader's own timings."""
from __future__ import annotations

import contextlib
import io
import threading

from autograder.intake import plan as planmod
from autograder.intake import scan
from autograder.referee.protocol import CELL_ERROR_CHARS
from autograder.report.outcome import TestResult, check_for as _check

_JUDGE_LOCK = threading.Lock()  # judges print (the benchmark's table): one at a time, output captured


def _served_detail(m: dict) -> dict:
    """The benchmark's numbers for the feedback and the report, all measured in this process."""
    from coursekit.checks.benchmark import TYPICAL, robust_ratio
    t = m["times"]
    return {"ratio": round(float(robust_ratio(t)), 3), "typical": TYPICAL.get(m["grade_id"]),
            "device": ("cpu, 1 thread, timed by the grader" if m.get("device_type", "cpu") == "cpu" else
                       f"{m.get('device')} ({m.get('dtype')}), timed by the grader"), "rounds": m["rounds"],
            "calls per round (yours, torch)": f"{m['k']}, {m['k_torch']}",
            "pipe allowance s/round": f"{m['allowance']:.3g}",
            **{f"median s/call ({k})": f"{sorted(v)[len(v) // 2]:.3g}" for k, v in t.items() if v}}


def judge_records(tests: list[planmod.Test], records: dict, plan: planmod.Plan,
                  served: dict | None = None, observed: dict | None = None, draw: int = 0) -> list[TestResult]:
    """The verdict on each test, from ``records`` (test index -> record, or a message saying why
    there is none), in the trusted process.

    ``plan``: its graded slice says which built-ins graded code names (:func:`scan.costs`).
    ``observed``: test index -> what the observers inside the sandbox saw during its probe
    (:func:`autograder.referee.protocol.observations`): such a test scores nothing, the message naming it.
    ``served``: the benchmarks timed from here (:mod:`autograder.referee.clock`), by test index. A
    benchmark passes when its record from the sandbox holds a count of work that does not grow with
    the input (:mod:`coursekit.checks.scaling`, taken under the observers when the module was built)
    and every output timed from here was right; the times are for information.
    """
    served = served or {}
    observed = observed or {}
    from coursekit.checks import HIDDEN_IDS, CheckFailed, verdict
    from coursekit.checks.seeded import salted

    results, costs = [], {}
    for t in tests:
        check = _check(t.grade_id)
        doc = check.doc if check else t.grade_id
        record = records.get(t.index)
        passed, msg, detail = False, "", {}
        bench = check is not None and check.kind == "benchmark"
        if check is None:
            msg = f"the grader has no check {t.grade_id!r} (instructor: is the course package complete?)"
        elif record is None:
            msg = "this test did not run: the notebook stopped before it (crash, exit, or time limit)"
        elif isinstance(record, str):
            msg = record
        else:
            if isinstance(record, dict) and record.get("error") not in (None, "CheckFailed") \
                    and isinstance(record.get("message"), str):  # text the student's code raised: bounded
                record = dict(record, message=record["message"][:CELL_ERROR_CHARS],
                              where=str(record.get("where", ""))[:CELL_ERROR_CHARS])
            try:
                names = scan.forbidden_names(check)
                if names not in costs:
                    costs[names] = scan.costs(plan.slice, names) if plan.slice is not None else []
                seen = costs[names]
                if observed.get(t.index):  # the observers inside saw the probe's ground taken away
                    from coursekit.checks import explain_error
                    also = ""
                    if isinstance(record, dict) and record.get("ok") is False:
                        also = f" The probe itself reported: {explain_error(record)[:500]}"
                    raise CheckFailed(
                        "this test gives no points: while it ran, the grader's observers saw "
                        + "; ".join(observed[t.index]) + ". The test cannot trust what it measured "
                        "(the course's guards and probes must run as released)." + also)
                if seen:
                    what = ("the normalization yourself from the formula" if check.forbidden_ops else
                            "the block yourself from its parts")
                    raise CheckFailed(
                        f"your graded code uses {', '.join(seen[:6])}. This exercise asks you to compute "
                        f"{what}, so implementation checks give no points for torch's built-in.")
                if bench and record.get("ok"):
                    m = served.get(t.index)
                    if not isinstance(m, dict):
                        raise CheckFailed(m if isinstance(m, str) else
                                          "the benchmark did not run (the grader times it from outside "
                                          "your notebook, and no measurement came back)")
                    detail = _served_detail(m)
                buf = io.StringIO()
                with _JUDGE_LOCK, contextlib.redirect_stdout(buf):
                    try:
                        if bench and record.get("ok"):
                            from coursekit.checks import wire
                            from coursekit.checks.served import served_report
                            built = wire.decode(record["out"])
                            served_report(served[t.index], built.get("work") if isinstance(built, dict) else None)
                        else:  # the hidden checks' judges rebuild the inputs of this submission's draw
                            with salted(draw if t.grade_id in HIDDEN_IDS else 0):
                                verdict(check, record)
                    finally:
                        if bench:
                            detail["report"] = buf.getvalue()[-3000:]
                passed = True
            except CheckFailed as e:
                msg = str(e)
            except Exception as e:  # noqa: BLE001 -- a malformed record, a judge tripping on odd data
                msg = f"the result of your code could not be checked ({type(e).__name__}: {str(e)[:300]})"
        results.append(TestResult(t.grade_id, doc, t.points if passed else 0.0, t.points, passed, msg[:2000],
                                  detail, check.kind if check else "correctness"))
    return results
