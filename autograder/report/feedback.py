"""HTML for people: one feedback page per student notebook, and the class report.

Self-contained pages: inline CSS, plots as base64 PNG, no scripts, no external URLs. A feedback
page says what passed, what failed and why (the checks' messages), the benchmark's numbers and
what went wrong while the notebook ran; it never shows test code (hidden tests stay hidden).

The pages are jinja2 templates (``autograder/report/templates/``: ``base.html.j2`` with the CSS,
``feedback.html.j2``, ``report.html.j2``) rendered with autoescaping: every value that comes from a
submission (student ids and names, messages, cell errors) is escaped by the template engine, and
nothing is marked safe. This module only computes what the templates show (plots, groupings, links).
"""
from __future__ import annotations

import base64
import copy
import functools
import io
import re
from collections import Counter, defaultdict
from pathlib import Path
from urllib.parse import quote

import jinja2

from autograder.referee.protocol import bound_cell_errors

NOT_HANDED_IN = ("missing", "no-notebook")  # rows without a notebook graded: not "submitted"
STATUS_TEXT = {
    "graded": "graded",
    "timeout": "stopped: time limit",
    "crashed": "stopped: the notebook's process ended early",
    "memory": "stopped: memory limit",
    "unreadable": "could not be read",
    "missing": "not submitted",
    "no-notebook": "no notebook handed in",
    "unknown-assignment": "unknown assignment",
    "error": "grader error",
}


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.PackageLoader("autograder.report", "templates"), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["num"] = lambda x, spec="g": format(x, spec)  # 15.0 -> "15", as f"{x:g}"
    return env


def _render(template: str, **context) -> str:
    return environment().get_template(template).render(**context)


def feedback_parts(o) -> tuple[str, str, str, str]:
    """Where ``o``'s feedback page lies under the output folder, one path component each."""
    return ("feedback", o.student_id, o.assignment, Path(o.notebook).stem + ".html")


def feedback_href(o) -> str:
    """The report's link to ``o``'s feedback page: each component URL-quoted (ids may hold ``#``, ``?``,
    ``%``, spaces, Unicode), so that it resolves to the file :func:`write_all` writes."""
    return "/".join(quote(p, safe="") for p in feedback_parts(o))


def _is_benchmark(t) -> bool:
    return t.kind == "benchmark"


def feedback_html(o) -> str:
    benchmarks = []
    for t in o.tests:
        if _is_benchmark(t):
            d = getattr(t, "detail", None) or {}
            benchmarks.append({"test": t, "measures": [(k, v) for k, v in d.items() if k != "report"],
                               "report": d.get("report")})
    if getattr(o, "cell_errors", None):  # what the student's code raised, bounded however the row was made
        o = copy.copy(o)
        o.cell_errors = bound_cell_errors(o.cell_errors)
    return _render("feedback.html.j2", o=o, status_text=STATUS_TEXT.get(o.status, o.status),
                   benchmarks=benchmarks)


def _png(fig) -> str:
    """The figure as base64 PNG (for a data: URI), closed."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _group(msg: str) -> str:
    """Failure messages with their numbers blanked, so the same mistake groups together."""
    m = re.sub(r"-?\d+(\.\d+)?(e[-+]?\d+)?", "#", msg)
    return m[:220]


def report_html(outcomes) -> str:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_a = defaultdict(list)
    for o in outcomes:
        if o.notebook:
            by_a[o.assignment].append(o)
    students = sorted({o.student_id for o in outcomes})

    # At a glance: one row per assignment.
    glance = []
    for a, os_ in sorted(by_a.items()):
        sub = [o for o in os_ if o.status not in NOT_HANDED_IN]
        st = Counter(o.status for o in os_ if o.status != "graded")
        st.update("another assignment's notebook" for o in os_ if getattr(o, "other_assignment", ""))
        glance.append({"assignment": a, "submitted": len(sub), "rows": len(os_),
                       "mean": sum(o.score for o in sub) / len(sub) if sub else 0,
                       "max_score": max((o.max_score for o in os_), default=0) or 1,
                       "full": sum(o.score == o.max_score for o in sub), "zero": sum(o.score == 0 for o in sub),
                       "problems": ", ".join(f"{k}: {v}" for k, v in sorted(st.items())) or "-"})

    score_png = pass_rate_png = benchmark_png = None
    if by_a:
        n = len(by_a)
        fig, axes = plt.subplots(1, n, figsize=(3.2 * n, 2.6), squeeze=False)
        for ax, (a, os_) in zip(axes[0], sorted(by_a.items())):
            mx = max(o.max_score for o in os_) or 1
            ax.hist([o.score for o in os_], bins=min(16, int(mx) + 1), range=(0, mx), color="#3b6fb6",
                    edgecolor="white")
            ax.set_title(a, fontsize=9)
            ax.set_xlabel("score")
        axes[0][0].set_ylabel("students")
        fig.suptitle("Score distribution per assignment", fontsize=10, y=1.04)
        score_png = _png(fig)

        rates = []
        for a, os_ in sorted(by_a.items()):
            sub = [o for o in os_ if o.status not in NOT_HANDED_IN]
            for i, t in enumerate(sub[0].tests if sub else []):
                got = [o.tests[i].passed for o in sub if i < len(o.tests)]
                rates.append((f"{a}: {t.grade_id}", sum(got) / max(1, len(got))))
        if rates:
            fig, ax = plt.subplots(figsize=(8, 0.28 * len(rates) + 0.8))
            labels = [r[0] for r in rates][::-1]
            vals = [100 * r[1] for r in rates][::-1]
            ax.barh(labels, vals, color=["#106b21" if v >= 70 else "#e09b00" if v >= 40 else "#b3261e" for v in vals])
            ax.set_xlim(0, 100)
            ax.set_xlabel("% of submissions passing")
            ax.tick_params(axis="y", labelsize=7)
            pass_rate_png = _png(fig)

    # Most common mistakes: each message counted once per student notebook, with the tests it failed.
    groups = Counter()
    example, tests_of = {}, defaultdict(list)
    for o in outcomes:
        if o.status in NOT_HANDED_IN:
            continue
        mine = {}
        for t in o.tests:
            if not t.passed and t.message:
                mine.setdefault((o.assignment, _group(t.message)), (t.message, []))[1].append(t.grade_id)
        for k, (msg, gids) in mine.items():
            groups[k] += 1
            example.setdefault(k, msg)
            tests_of[k].extend(g for g in gids if g not in tests_of[k])
    mistakes = [{"count": c, "assignment": k[0], "grade_ids": tests_of[k], "example": example[k][:400]}
                for k, c in groups.most_common(25)]

    # Benchmarks: the factor (student time / torch time) where the check reports one.
    series = defaultdict(list)
    for o in outcomes:
        for t in o.tests:
            d = getattr(t, "detail", None) or {}
            if _is_benchmark(t) and isinstance(d.get("ratio"), (int, float)):
                series[o.assignment].append(float(d["ratio"]))
    if series:
        fig, ax = plt.subplots(figsize=(6, 2.8))
        names = sorted(series)
        ax.boxplot([series[k] for k in names])  # vertical (the default)
        for i, k in enumerate(names, 1):
            ax.scatter([i] * len(series[k]), series[k], s=12, alpha=.6, color="#3b6fb6")
        ax.set_xticks(range(1, len(names) + 1), names, fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("time / torch's time")
        benchmark_png = _png(fig)

    # Every student: one cell per assignment, linking to the feedback page.
    assignments = sorted(by_a)
    cell = {(o.student_id, o.assignment): o for o in outcomes}
    rows = []
    for s in students:
        cells = []
        for a in assignments:
            o = cell.get((s, a))
            cells.append(None if o is None else
                         {"href": feedback_href(o), "score": o.score, "max_score": o.max_score, "status": o.status})
        rows.append({"student_id": s, "cells": cells})

    return _render("report.html.j2", n_students=len(students), n_assignments=len(by_a), n_rows=len(outcomes),
                   assignments=assignments, glance=glance, score_png=score_png, pass_rate_png=pass_rate_png,
                   mistakes=mistakes, benchmark_png=benchmark_png, students=rows,
                   needs_review=[{"student_id": o.student_id, "assignment": o.assignment, "href": feedback_href(o),
                                  "reasons": _review_reasons(o)} for o in outcomes if _review_reasons(o)],
                   manual_kept=[{"student_id": o.student_id, "assignment": o.assignment, **m}
                                for o in outcomes for m in getattr(o, "manual_kept", None) or []],
                   unknown=[o for o in outcomes if not o.notebook])


def _review_reasons(o) -> list[str]:
    """What the report's "Needs review" lists for ``o``: the scan's flags, and a notebook of another
    assignment handed in (graded against this one's tests: likely 0, and the student's work elsewhere)."""
    reasons = list(getattr(o, "review", None) or [])
    other = getattr(o, "other_assignment", "")
    if other:
        reasons.insert(0, f"handed in {other}'s notebook ({o.handed_in or '?'}) for {o.assignment}: graded "
                          f"against {o.assignment}'s tests")
    return reasons


def write_all(outcomes, out: Path) -> None:
    out = Path(out)
    for o in outcomes:
        if not o.notebook:
            continue
        p = out.joinpath(*feedback_parts(o))
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(feedback_html(o), encoding="utf-8")
    (out / "report.html").write_text(report_html(outcomes), encoding="utf-8")
