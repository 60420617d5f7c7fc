"""Judge a submission's records in the grader's own process (trusted side): the static scan of the
student's code, each check's judge, and the benchmark's verdict on the grader's own timings."""
from __future__ import annotations

import contextlib
import io
import threading

from autograder import plan as planmod
from autograder.outcome import TestResult, check_for as _check

_JUDGE_LOCK = threading.Lock()  # judges print (the benchmark's table): one at a time, output captured


def _served_detail(m: dict) -> dict:
    """The benchmark's numbers for the feedback and the report, all measured in this process."""
    from coursekit.checks.benchmark import LIMITS, robust_ratio
    t = m["times"]
    return {"ratio": round(float(robust_ratio(t)), 3), "limit": LIMITS.get(m["grade_id"]),
            "device": ("cpu, 1 thread, timed by the grader" if m.get("device_type", "cpu") == "cpu" else
                       f"{m.get('device')} ({m.get('dtype')}), timed by the grader"), "rounds": m["rounds"],
            "calls per round (yours, torch)": f"{m['k']}, {m['k_torch']}",
            "pipe allowance s/round": f"{m['allowance']:.3g}",
            **{f"median s/call ({k})": f"{sorted(v)[len(v) // 2]:.3g}" for k, v in t.items() if v}}


def judge_records(tests: list[planmod.Test], records: dict, plan: planmod.Plan,
                  served: dict | None = None) -> list[TestResult]:
    """The verdict on each test, from ``records`` (test index -> record, or a message saying why
    there is none), in the trusted process.

    ``plan``: the student's answer and added cells, for the static scan (:func:`plan.scan_forbidden`).
    ``served``: the benchmarks timed from here (:mod:`autograder.outside`), by test index. A
    benchmark passes only on those measurements; its record from the sandbox can only fail it
    (the student's module could not be built).
    """
    served = served or {}
    from coursekit.checks import CheckFailed, verdict

    machinery = planmod.scan_machinery(plan.answer_code + plan.added_code)
    results = []
    for t in tests:
        check = _check(t.grade_id)
        doc = check.doc if check else t.grade_id
        record = records.get(t.index)
        passed, msg, detail = False, "", {}
        if machinery and check is not None:  # the probes ran beside code that can reach them
            also = planmod.scan_forbidden(plan.answer_code, plan.added_code, check.forbidden_ops) \
                if check.forbidden_ops else []
            record = (f"your code reaches into the course's grading machinery ({', '.join(machinery[:6])}), "
                      "so no result from your notebook can be trusted and no test scores. Nothing in the "
                      "exercise needs it: remove it, or ask your instructor to look at your notebook"
                      + (f". It also uses {', '.join(also)}" if also else ""))
        bench = check is not None and check.kind == "benchmark"
        if check is None:
            msg = f"the grader has no check {t.grade_id!r} (instructor: is the course package complete?)"
        elif record is None:
            msg = "this test did not run: the notebook stopped before it (crash, exit, or time limit)"
        elif isinstance(record, str):
            msg = record
        else:
            try:
                if check.forbidden_ops:
                    seen = planmod.scan_forbidden(plan.answer_code, plan.added_code, check.forbidden_ops)
                    if seen:
                        raise CheckFailed(
                            f"your code uses {', '.join(seen)}. This exercise asks you to compute the "
                            "normalization yourself from the formula, so implementation checks give no "
                            "points for torch's built-in (or for code that looks names up dynamically).")
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
                            from coursekit.checks.served import served_report
                            served_report(served[t.index])
                        else:
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
