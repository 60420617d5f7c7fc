"""Grading slots: one long-lived sandbox per concurrent job, holding a pre-imported interpreter
(:mod:`autograder.inside.zygote`) that forks a fresh sandbox for each submission.

Starting Python and importing torch, ``torch._dynamo`` and IPython costs seconds per submission;
forking a process that already imported them costs milliseconds. A :class:`Slot` starts the
zygote once in the same bubblewrap sandbox a one-off run gets (:func:`autograder.sandbox.bwrap.bwrap_argv`:
its own unprivileged uid, no capability, read-only root, no network, rlimits), and each
submission then runs in a child that has entered new namespaces, fresh sized tmpfs and a new
pid 1 before its first line (see the zygote's docstring for the list).

Each submission gets a cgroup of its own (:mod:`autograder.sandbox.cgroups`), made here before the fork:
the fork request carries its ``cgroup.procs`` files, opened here (as root), and the child writes
itself into them before anything else, then closes them, so that everything the submission
starts and every page it writes (its tmpfs too) is counted there; the grader checks the group is
not empty before the submission's first cell. The zygote's bwrap installs the seccomp filter
without ``unshare`` and ``mount`` (:func:`autograder.sandbox.seccomp.program`, ``slot=True``), which the
child needs for its namespaces; the child installs the full filter before its init forks the
harness.

:meth:`Slot.run` has the contract of :func:`autograder.sandbox.bwrap.run_sandboxed`: ``on_start`` gets a
handle with ``stdin`` (the job pipe), ``wait(timeout)`` and ``kill()``; the wall clock runs
meanwhile; the result carries the exit code, whether the clock ran out, the wall time and the
output's tail. A slot whose zygote stops answering is torn down (its whole process group) and the
next submission starts a new one: a submission can cost its own row, never another's.

    with SlotPool(limits, course_dir, size=jobs) as pool:
        with pool.slot() as slot:
            res = slot.run(on_start, reply_w)
"""
from __future__ import annotations

import base64
import contextlib
import json
import os
import queue
import select
import signal
import socket
import subprocess
import threading
import time
from dataclasses import replace
from pathlib import Path

from autograder.sandbox import cgroups

from autograder.sandbox import seccomp
from autograder.sandbox.bwrap import (ROOT, ZYGOTE_IN, Limits, Result, SandboxUnavailable, _preexec,
                                _Tail, _user_process_count, bwrap_argv, sandbox_uid,
                                staged_sources)

START_S = 180.0  # the zygote's imports, on a loaded machine
ZYGOTE_CPU_S = 86400  # RLIMIT_CPU of the zygote itself; each submission's child gets Limits.cpu_s
SLOT_PROCESSES = 8  # bwrap (2), the zygote, a child's intermediate and init: above Limits.nproc
FORK_S = 30.0  # one fork and the child's namespaces


class Child:
    """What ``on_start`` gets for one submission (the same surface as the Popen of a one-off run)."""

    def __init__(self, slot: "Slot", job_w: int, ident: int):
        self.slot, self.id = slot, ident
        self.stdin = os.fdopen(job_w, "wb", buffering=0)
        self.exit: int | None = None
        self.gone = False

    def wait(self, timeout: float | None = None) -> int | None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.gone:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            msg = self.slot._recv(left)
            if msg is None:
                raise subprocess.TimeoutExpired("submission", timeout)
            if msg.get("id") == self.id and "exit" in msg:
                with self.slot._lock:
                    self.exit, self.gone = msg.get("exit"), True
        return self.exit

    def kill(self) -> None:
        """Kill this submission (and all it started); a no-op once it is gone. The kill names this
        child, so one that arrives late never reaches the next submission of the slot."""
        with self.slot._lock:
            if not self.gone:
                self.slot._send({"op": "kill", "id": self.id})


class Slot:
    def __init__(self, limits: Limits, course_dir: Path = ROOT / "course", gpu: bool = False):
        self.limits, self.course_dir, self.gpu = limits, Path(course_dir), gpu
        self._uid_cm = sandbox_uid()
        uid = self._uid_cm.__enter__()
        self._lock = threading.Lock()
        self.broken = False
        self.forks = 0
        try:
            self._start(uid)
        except BaseException:
            self.close()
            raise

    def _start(self, uid):
        stage = staged_sources(self.course_dir, self.gpu) if uid is not None else []
        self.sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        filter_fd = seccomp.memfd(seccomp.program(slot=True))
        argv = bwrap_argv(self.limits, self.course_dir, staged=uid is not None, gpu=self.gpu,
                          seccomp_fd=filter_fd) + [
            "python", ZYGOTE_IN, str(theirs.fileno()), str(self.limits.tmp_mb), str(self.limits.cpu_s)]
        out_r, out_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=out_w, stderr=out_w, cwd="/",
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, close_fds=True,
                pass_fds=(theirs.fileno(), filter_fd),
                # the zygote lives for many submissions: its own CPU limit is a day's, each child
                # sets the submission's; bwrap, the zygote and a child's intermediate and init are
                # not the submission's to count against its process limit
                preexec_fn=_preexec(replace(self.limits, cpu_s=ZYGOTE_CPU_S),
                                    _user_process_count(uid if uid is not None else os.getuid()) + SLOT_PROCESSES,
                                    uid, stage, self.gpu))
        finally:
            os.close(out_w)
            os.close(filter_fd)
            theirs.close()
        self.tail = _Tail(out_r, 16 << 10)
        self.tail.start()
        # the full seccomp filter, which each submission's child installs; written from a thread,
        # so a zygote that never reads its stdin costs START_S, not a hang
        payload = (json.dumps({"seccomp": base64.b64encode(seccomp.program()).decode()}) + "\n").encode()

        def write(stdin=self.proc.stdin):
            with contextlib.suppress(OSError, ValueError):
                stdin.write(payload)
            with contextlib.suppress(OSError, ValueError):
                stdin.close()

        threading.Thread(target=write, daemon=True).start()
        msg = self._recv(START_S)
        if not (isinstance(msg, dict) and msg.get("ready") is True):
            raise SandboxUnavailable("the grading sandbox's interpreter did not start: "
                                     + self.tail.text()[-1500:]
                                     + "\n(Every folder on the way to the virtual environment and the course must be "
                                       "readable by the sandbox's user, and the limits must leave room for torch's "
                                       "import.) The grader never runs submissions unsandboxed on its own; if you "
                                       "trust them, pass --no-sandbox.")

    # -- the socket to the zygote ------------------------------------------------------------------

    def _send(self, obj, fds=()) -> None:
        try:
            if fds:
                socket.send_fds(self.sock, [json.dumps(obj).encode()], list(fds))
            else:
                self.sock.send(json.dumps(obj).encode())
        except OSError:
            self.broken = True

    def _recv(self, timeout: float | None):
        """The zygote's next message (a dict), or None on timeout or a dead or babbling zygote."""
        r, _, _ = select.select([self.sock], [], [], timeout)
        if not r:
            return None
        try:
            data = self.sock.recv(4096)
            msg = json.loads(data) if data else None
        except (OSError, ValueError):
            msg = None
        if not isinstance(msg, dict):
            self.broken = True
            return None
        return msg

    # -- one submission ----------------------------------------------------------------------------

    def run(self, on_start, reply_w: int, output_cap: int = 64 << 10, exit_s: float = 15.0) -> Result:
        """Run one submission in a fresh child of this slot (see the module docstring)."""
        group = cgroups.for_limits(self.limits)
        try:
            return self._run(on_start, reply_w, output_cap, exit_s, group)
        finally:
            if group is not None:
                group.close()

    def _run(self, on_start, reply_w, output_cap, exit_s, group) -> Result:
        job_r, job_w = os.pipe()
        out_r, out_w = os.pipe()
        joins = [os.open(f, os.O_WRONLY | os.O_CLOEXEC) for f in group.join_files()] if group is not None else []
        t0 = time.monotonic()
        self.forks += 1
        ident = self.forks
        self._send({"op": "fork", "id": ident, "cgroups": len(joins)}, (job_r, reply_w, out_w, *joins))
        for fd in (job_r, out_w, *joins):
            os.close(fd)
        tail = _Tail(out_r, output_cap)
        tail.start()
        msg = None if self.broken else self._recv(FORK_S)
        if not (isinstance(msg, dict) and msg.get("forked") is True and msg.get("id") == ident) \
                or (group is not None and not group.pids()):  # the child must be in its group
            self.broken = True
            os.close(job_w)
            tail.join(1)
            return Result(None, False, time.monotonic() - t0,
                          (self.tail.text()[-2000:] + tail.text()) or "the grading sandbox did not start")
        child = Child(self, job_w, ident)
        fired = []

        def expire():
            fired.append(True)
            child.kill()

        timer = threading.Timer(self.limits.wall_s, expire)
        timer.daemon = True
        timer.start()
        watch = cgroups.OomWatch(group, lambda: (child.kill(), group.kill()))
        try:
            if on_start is not None:
                on_start(child)
            with contextlib.suppress(OSError):
                child.stdin.close()
            try:
                child.wait(self.limits.wall_s)
            except subprocess.TimeoutExpired:
                pass
        finally:
            timer.cancel()
            oom = watch.stop()
            if not child.gone:  # killed, and still no word: the zygote is not to be trusted again
                child.kill()
                try:
                    child.wait(exit_s)
                except subprocess.TimeoutExpired:
                    self.broken = True
            tail.join(5)
        return Result(child.exit, bool(fired), time.monotonic() - t0, tail.text(), oom)

    def close(self) -> None:
        proc = getattr(self, "proc", None)
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            self.tail.join(2)
        sock = getattr(self, "sock", None)
        if sock is not None:
            sock.close()
        if self._uid_cm is not None:
            self._uid_cm.__exit__(None, None, None)
            self._uid_cm = None


class SlotPool:
    """Up to ``size`` slots, started when first needed, torn down and replaced when broken."""

    def __init__(self, limits: Limits, course_dir: Path = ROOT / "course", size: int = 1, gpu: bool = False):
        self.limits, self.course_dir, self.gpu = limits, Path(course_dir), gpu
        self._idle: queue.Queue = queue.Queue()
        self._all: list[Slot] = []
        self._lock = threading.Lock()
        self._sem = threading.BoundedSemaphore(size)

    @contextlib.contextmanager
    def slot(self):
        with self._sem:
            try:
                s = self._idle.get_nowait()
            except queue.Empty:
                s = Slot(self.limits, self.course_dir, self.gpu)
                with self._lock:
                    self._all.append(s)
            try:
                yield s
            finally:
                if s.broken or s.proc.poll() is not None:
                    s.close()
                    with self._lock:
                        self._all.remove(s)
                else:
                    self._idle.put(s)

    def close(self) -> None:
        with self._lock:
            for s in self._all:
                s.close()
            self._all.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
