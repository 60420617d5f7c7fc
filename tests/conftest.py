"""One line of progress per test file: ``make test`` runs for most of an hour, and rows of dots say
neither where it is nor what takes the time.

After the last test of each file (its module fixtures torn down too)::

    [ 12/50] tests/test_x.py  34 passed, 1 skipped  in 61.2 s  (total 14:05)

With ``-q`` the dots stay; the lines come between them.
"""
from __future__ import annotations

import time
from collections import Counter

import pytest

_T0 = time.monotonic()
_FILES: list[str] = []
_STATE: dict = {"file": None, "start": 0.0, "counts": Counter()}


def _file(item) -> str:
    return item.nodeid.split("::")[0]


def pytest_collection_finish(session):
    _FILES.extend(dict.fromkeys(_file(item) for item in session.items))


def pytest_runtest_logreport(report):
    # one outcome per test: its call, or the setup that failed or skipped it, or a failed teardown
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed") or (
            report.when == "teardown" and report.outcome == "failed"):
        _STATE["counts"][report.outcome] += 1


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    path = _file(item)
    if _STATE["file"] != path:
        _STATE.update(file=path, start=time.monotonic(), counts=Counter())
    yield
    if nextitem is None or _file(nextitem) != path:
        tr = item.config.pluginmanager.get_plugin("terminalreporter")
        if tr is not None:
            if getattr(tr._tw, "width_of_current_line", 0):  # after a row of dots
                tr.write("\n")
            tr.write_line(_line(path))


def _line(path: str) -> str:
    c = _STATE["counts"]
    parts = ", ".join(f"{c[k]} {k}" for k in ("passed", "failed", "skipped") if c[k]) or "nothing run"
    now = time.monotonic()
    total = int(now - _T0)
    k = _FILES.index(path) + 1 if path in _FILES else 0
    return (f"[{k:>3}/{len(_FILES)}] {path}  {parts}  in {now - _STATE['start']:.1f} s  "
            f"(total {total // 60}:{total % 60:02d})")
