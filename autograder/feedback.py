"""HTML for people: one feedback page per student notebook, and the class report.

Self-contained pages: inline CSS, plots as base64 PNG, no scripts, no external URLs. A feedback
page says what passed, what failed and why (the checks' messages), the benchmark's numbers and
what went wrong while the notebook ran; it never shows test code (hidden tests stay hidden).
"""
from __future__ import annotations

import base64
import html
import io
import re
from collections import Counter, defaultdict
from pathlib import Path

CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.8em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;width:100%;margin:.5em 0}th,td{border:1px solid #ddd;padding:.35em .5em;text-align:left;vertical-align:top}
th{background:#f4f4f4}.pass{color:#106b21;font-weight:600}.fail{color:#b3261e;font-weight:600}
.note{background:#fff8e1;border-left:4px solid #f0b400;padding:.5em .8em;margin:.5em 0}
.err{background:#fdecea;border-left:4px solid #b3261e;padding:.5em .8em;margin:.5em 0}
.score{font-size:2em;font-weight:700}.muted{color:#666}code,pre{font-family:ui-monospace,monospace;font-size:.9em}
pre{white-space:pre-wrap;background:#f7f7f7;padding:.5em}img{max-width:100%}
"""


def _page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style></head><body>{body}</body></html>")


def e(s) -> str:
    return html.escape(str(s))


STATUS_TEXT = {
    "graded": "graded",
    "timeout": "stopped: time limit",
    "crashed": "stopped: the notebook's process ended early",
    "unreadable": "could not be read",
    "missing": "not submitted",
    "unknown-assignment": "unknown assignment",
    "error": "grader error",
}


def feedback_html(o) -> str:
    who = e(o.student_name or o.student_id)
    body = [f"<h1>{e(o.assignment)} / {e(o.notebook)}: feedback for {who}</h1>",
            f"<p class='score'>{o.score:g} / {o.max_score:g}</p>",
            f"<p>Status: <b>{e(STATUS_TEXT.get(o.status, o.status))}</b>. {e(o.message)}</p>"]
    for n in o.notes:
        body.append(f"<div class='note'>{e(n)}</div>")
    body.append("<h2>Tests</h2><table><tr><th>test</th><th>what it checks</th><th>points</th><th>result</th></tr>")
    for t in o.tests:
        res = ("<span class='pass'>passed</span>" if t.passed else
               f"<span class='fail'>failed</span><br>{e(t.message)}")
        if t.passed and t.message:
            res += f"<br><span class='muted'>{e(t.message)}</span>"
        body.append(f"<tr><td><code>{e(t.grade_id)}</code></td><td>{e(t.doc)}</td>"
                    f"<td>{t.points:g} / {t.max_points:g}</td><td>{res}</td></tr>")
    body.append("</table>")
    bench = [t for t in o.tests if t.grade_id.endswith("_benchmark")]
    if bench:
        body.append("<h2>Benchmark</h2>")
        for t in bench:
            d = getattr(t, "detail", None) or {}
            rows = "".join(f"<tr><td>{e(k)}</td><td>{e(v)}</td></tr>" for k, v in d.items() if k != "report")
            if rows:
                body.append(f"<table><tr><th>measure</th><th>value</th></tr>{rows}</table>")
            if d.get("report"):
                body.append(f"<pre>{e(d['report'])}</pre>")
            body.append(f"<p>{'passed' if t.passed else 'failed'}: {e(t.message or t.doc)}</p>")
    if o.cell_errors:
        body.append("<h2>Errors while your notebook ran</h2>")
        for c in o.cell_errors:
            body.append(f"<div class='err'><b>{e(c['label'])}</b>: <code>{e(c['error'])}</code></div>")
    body.append("<p class='muted'>Each test is worth its points when it passes, zero otherwise. "
                "Run the notebook top to bottom in a fresh kernel before you submit.</p>")
    return _page(f"{o.assignment} feedback: {o.student_id}", "\n".join(body))


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt
    plt.close(fig)
    return "<img alt='plot' src='data:image/png;base64," + base64.b64encode(buf.getvalue()).decode() + "'>"


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
    body = [f"<h1>Class report</h1><p>{len(students)} students, {len(by_a)} assignments, "
            f"{len(outcomes)} rows.</p>"]

    # At a glance: one row per assignment.
    body.append("<h2>At a glance</h2><table><tr><th>assignment</th><th>submitted</th><th>mean score</th>"
                "<th>full marks</th><th>zero</th><th>problems (status)</th></tr>")
    for a, os_ in sorted(by_a.items()):
        sub = [o for o in os_ if o.status != "missing"]
        mx = max((o.max_score for o in os_), default=0) or 1
        mean = sum(o.score for o in sub) / len(sub) if sub else 0
        st = Counter(o.status for o in os_ if o.status != "graded")
        body.append(f"<tr><td>{e(a)}</td><td>{len(sub)} / {len(os_)}</td><td>{mean:.1f} / {mx:g}</td>"
                    f"<td>{sum(o.score == o.max_score for o in sub)}</td><td>{sum(o.score == 0 for o in sub)}</td>"
                    f"<td>{e(', '.join(f'{k}: {v}' for k, v in sorted(st.items())) or '-')}</td></tr>")
    body.append("</table>")

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
        body.append("<h2>Score distribution</h2>" + _png(fig))

        rates = []
        for a, os_ in sorted(by_a.items()):
            sub = [o for o in os_ if o.status != "missing"]
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
            body.append("<h2>Pass rate of each test</h2>" + _png(fig))

    # Most common mistakes.
    groups = Counter()
    example = {}
    for o in outcomes:
        if o.status in ("missing",):
            continue
        for t in o.tests:
            if not t.passed and t.message:
                k = (o.assignment, t.grade_id, _group(t.message))
                groups[k] += 1
                example.setdefault(k, t.message)
    body.append("<h2>Most common mistakes</h2><table><tr><th>count</th><th>assignment</th><th>test</th>"
                "<th>message (example)</th></tr>")
    for (a, gid, _), c in groups.most_common(25):
        body.append(f"<tr><td>{c}</td><td>{e(a)}</td><td><code>{e(gid)}</code></td>"
                    f"<td>{e(example[(a, gid, _)][:400])}</td></tr>")
    body.append("</table>")

    # Benchmarks: the factor (student time / torch time) where the check reports one.
    series = defaultdict(list)
    for o in outcomes:
        for t in o.tests:
            d = getattr(t, "detail", None) or {}
            if t.grade_id.endswith("_benchmark") and isinstance(d.get("ratio"), (int, float)):
                series[o.assignment].append(float(d["ratio"]))
    body.append("<h2>Benchmark results</h2>")
    if series:
        fig, ax = plt.subplots(figsize=(6, 2.8))
        names = sorted(series)
        ax.boxplot([series[k] for k in names], vert=True)
        for i, k in enumerate(names, 1):
            ax.scatter([i] * len(series[k]), series[k], s=12, alpha=.6, color="#3b6fb6")
        ax.set_xticks(range(1, len(names) + 1), names, fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("time / torch's time")
        body.append(_png(fig))
    else:
        body.append("<p class='muted'>No benchmark timings in this run.</p>")

    # Every student.
    body.append("<h2>Students</h2><table><tr><th>student</th>" +
                "".join(f"<th>{e(a)}</th>" for a in sorted(by_a)) + "</tr>")
    cell = {(o.student_id, o.assignment): o for o in outcomes}
    for s in students:
        row = [f"<td>{e(s)}</td>"]
        for a in sorted(by_a):
            o = cell.get((s, a))
            if o is None:
                row.append("<td>-</td>")
                continue
            link = f"feedback/{s}/{a}/{Path(o.notebook).stem}.html"
            flag = "" if o.status == "graded" else f" <span class='muted'>({e(o.status)})</span>"
            row.append(f"<td><a href='{e(link)}'>{o.score:g} / {o.max_score:g}</a>{flag}</td>")
        body.append("<tr>" + "".join(row) + "</tr>")
    body.append("</table>")
    unknown = [o for o in outcomes if not o.notebook]
    if unknown:
        body.append("<h2>Files that match no assignment</h2><ul>" +
                    "".join(f"<li>{e(o.student_id)}: {e(o.message)}</li>" for o in unknown) + "</ul>")
    return _page("Class report", "\n".join(body))


def write_all(outcomes, out: Path) -> None:
    out = Path(out)
    for o in outcomes:
        if not o.notebook:
            continue
        p = out / "feedback" / o.student_id / o.assignment / (Path(o.notebook).stem + ".html")
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(feedback_html(o))
    (out / "report.html").write_text(report_html(outcomes))
