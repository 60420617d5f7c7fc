"""One line of progress per test file, and the order and the pairing of the files when ``make test``
runs them two at a time (pytest-xdist, ``-n 2``).

After the last test of each file (its module fixtures torn down too)::

    [ 12/50] tests/test_x.py  34 passed, 1 skipped  in 61.2 s, cpu 88 s  (total 14:05; make test 25 min)

(cpu: the file's CPU seconds, its subprocesses that ended included; make test: since make began,
the venv and the book included, which is what CI's time limit counts.)

With ``-q`` the dots stay; the lines come between them. Under xdist the line is printed by the
controller when the last report of the file comes in, and its time runs from the start of its
first test (a file runs whole on one worker).

Two at a time: ``make test`` runs ``pytest -n 2`` on this 2-core machine. Many files leave a core
idle for long stretches (the in-process checks run on one thread; the class server waits on its
processes), so two files side by side finish sooner than one after the other. A file is never
split (its module fixtures, a graded class or a Dask cluster, are made once), and the files that
change the machine itself, unix accounts and the shared exchange (:data:`ONE_AT_A_TIME`), form one
unit that one worker runs in sequence. The longest units are handed out first (:data:`LONGEST`),
so no long file starts last.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from collections import Counter

import pytest

_T0 = time.monotonic()
#: when ``make test`` began (its venv, system packages and book first), from the Makefile
_MAKE_T0 = float(os.environ.get("MAKE_T0") or 0) or None
_FILES: list[str] = []
_STATE: dict = {"file": None, "start": 0.0, "counts": Counter(), "cpu": 0.0}

#: files that make unix accounts, run a class server or write the machine's shared exchange: run
#: one after another by one worker (two ``useradd`` at once can fail on /etc/passwd's lock)
ONE_AT_A_TIME = frozenset({
    "tests/test_class_load.py", "tests/test_class_server.py", "tests/test_class_server_ports.py",
    "tests/test_class_server_private_tmp.py", "tests/test_collect_limits.py", "tests/test_docs_commands.py",
    "tests/test_exchange.py", "tests/test_instructor_docs.py", "tests/test_shared_machine_exchange.py",
})
#: the longest units first, longest to shortest (seconds in a fresh clone on this machine, each
#: file beside another, 2026-11-28), so the last file to start is a short one; the rest follow in
#: name order
LONGEST = (
    ("one at a time", 1150), ("tests/test_grading_verdicts.py", 840), ("tests/test_checks_backward.py", 614),
    ("tests/test_cluster.py", 529), ("tests/test_checks_in_process.py", 443),
    ("tests/test_exercises_nbgrader.py", 401), ("tests/test_autograder_hostile.py", 256),
    ("tests/test_full_size_count.py", 226), ("tests/test_release.py", 212), ("tests/test_autograder_ingest.py", 199),
    ("tests/test_autograder_cli.py", 192), ("tests/test_book_axe.py", 184), ("tests/test_formgrader.py", 138),
    ("tests/test_student_pack.py", 134), ("tests/test_checks_streams.py", 116),
)


def _file(item) -> str:
    return _file_of(item.nodeid)


def _file_of(nodeid: str) -> str:
    return nodeid.split("::")[0]


def _order(path: str) -> tuple:
    """The sort key of a test file: its unit's place in :data:`LONGEST`, then names."""
    rank = {name: i for i, (name, _) in enumerate(LONGEST)}
    return rank.get(unit_of(path), len(rank)), unit_of(path), path


def _print_line(tr, line: str) -> None:
    if getattr(tr._tw, "width_of_current_line", 0):  # after a row of dots
        tr.write("\n")
    tr.write_line(line)


def unit_of(path: str) -> str:
    """The unit of work a test file belongs to under xdist: its own, or :data:`ONE_AT_A_TIME`'s."""
    return "one at a time" if path in ONE_AT_A_TIME else path


def pytest_collection_modifyitems(session, config, items):
    """Longest units first (:data:`LONGEST`), each file's tests in their own order."""
    items.sort(key=lambda item: _order(_file(item)))


def pytest_collection_finish(session):
    _FILES.extend(dict.fromkeys(_file(item) for item in session.items))


# -- two at a time: xdist's scheduler, with a file (or the ONE_AT_A_TIME group) as the unit -------

@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByFile(LoadScopeScheduling):
        """xdist's ``--dist loadfile``, with the ONE_AT_A_TIME files as one unit, in collection order."""

        def _split_scope(self, nodeid: str) -> str:
            return unit_of(_file_of(nodeid))

    config.option.loadscopereorder = False  # keep the order of pytest_collection_modifyitems
    return ByFile(config, log)


_CONTROLLER: dict = {"expected": None, "done": Counter(), "start": {}, "counts": {}, "running": {}, "cpu": {}}

#: a test still running after this many seconds is named on stderr, and again every as many seconds
#: (CI's log then says what a run that hit its time limit was doing)
STILL_RUNNING_S = 600


def _watch_running() -> None:
    """On the xdist controller: every minute, name each test that has run for another
    :data:`STILL_RUNNING_S` seconds (its worker sends nothing until it ends)."""
    told: dict = {}
    while True:
        time.sleep(60)
        now = time.monotonic()
        for nodeid, t in list(_CONTROLLER["running"].items()):
            n = int((now - t) // STILL_RUNNING_S)
            if n and told.get(nodeid, 0) < n:
                told[nodeid] = n
                print(f"\n[still running] {nodeid}: {int(now - t) // 60} min so far ({_clock()})",
                      file=sys.__stderr__, flush=True)


def pytest_configure(config):
    if not hasattr(config, "workerinput") and getattr(config.option, "numprocesses", None):
        threading.Thread(target=_watch_running, daemon=True, name="still-running").start()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    if _CONTROLLER["expected"] is None:
        _CONTROLLER["expected"] = Counter(map(_file_of, ids))
        _FILES.extend(sorted(_CONTROLLER["expected"], key=_order))


def pytest_runtest_logstart(nodeid, location):
    # on the xdist controller: a worker starts this test (its file's fixtures are set up after this)
    _CONTROLLER["start"].setdefault(_file_of(nodeid), time.monotonic())
    _CONTROLLER["running"][nodeid] = time.monotonic()


def pytest_runtest_logreport(report):
    # one outcome per test: its call, or the setup that failed or skipped it, or a failed teardown
    counted = report.when == "call" or (report.when == "setup" and report.outcome != "passed") or (
        report.when == "teardown" and report.outcome == "failed")
    cpu = dict(report.user_properties).get("cpu_s", 0.0) if report.when == "teardown" else 0.0
    if not hasattr(report, "node"):  # not the xdist controller: pytest_runtest_protocol prints
        if counted:
            _STATE["counts"][report.outcome] += 1
        _STATE["cpu"] += cpu
        return
    path = _file_of(report.nodeid)
    c = _CONTROLLER
    counts = c["counts"].setdefault(path, Counter())
    if counted:
        counts[report.outcome] += 1
    c["cpu"][path] = c["cpu"].get(path, 0.0) + cpu
    if report.when not in ("setup", "call"):  # its teardown, or xdist's report of a crashed worker
        c["running"].pop(report.nodeid, None)
    if report.when == "teardown":
        c["done"][path] += 1
        if c["expected"] is not None and c["done"][path] == c["expected"][path]:
            tr = report.node.config.pluginmanager.get_plugin("terminalreporter")
            if tr is not None:
                _print_line(tr, _line(path, counts, c["start"].get(path, _T0), c["cpu"].get(path, 0.0)))


def _cpu() -> float:
    """CPU seconds of this process and of its children that ended and were waited for (a notebook
    graded in a sandbox, a kernel, a server stopped by the test)."""
    import resource
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Each test's CPU seconds (see :func:`_cpu`, from the start of its setup: module fixtures made
    for it count) ride on its teardown report to the controller."""
    outcome = yield
    if call.when == "teardown" and _CPU0 in item.stash:
        outcome.get_result().user_properties.append(("cpu_s", _cpu() - item.stash[_CPU0]))


_CPU0 = pytest.StashKey[float]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    item.stash[_CPU0] = _cpu()
    path = _file(item)
    if _STATE["file"] != path:
        _STATE.update(file=path, start=time.monotonic(), counts=Counter(), cpu=0.0)
    yield
    if nextitem is None or _file(nextitem) != path:
        if hasattr(item.config, "workerinput"):  # an xdist worker: the controller prints
            return
        tr = item.config.pluginmanager.get_plugin("terminalreporter")
        if tr is not None:
            _print_line(tr, _line(path, _STATE["counts"], _STATE["start"], _STATE["cpu"]))


def _line(path: str, c: Counter, start: float, cpu: float) -> str:
    """The file's progress line: its outcomes, its wall time and CPU time (:func:`_cpu`), the clock."""
    parts = ", ".join(f"{c[k]} {k}" for k in ("passed", "failed", "skipped") if c[k]) or "nothing run"
    now = time.monotonic()
    k = _FILES.index(path) + 1 if path in _FILES else 0
    return f"[{k:>3}/{len(_FILES)}] {path}  {parts}  in {now - start:.1f} s, cpu {cpu:.0f} s  ({_clock()})"


def _clock() -> str:
    """``total M:SS`` of the tests so far, and since ``make test`` began when the Makefile says."""
    total = int(time.monotonic() - _T0)
    since = f"; make test {int(time.time() - _MAKE_T0) // 60} min" if _MAKE_T0 else ""
    return f"total {total // 60}:{total % 60:02d}{since}"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not hasattr(config, "workerinput"):
        terminalreporter.write_line(f"tests done ({_clock()})")
