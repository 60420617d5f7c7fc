"""Run one submission's code in a bubblewrap sandbox, with limits, and make sure nothing outlives it.

What the sandbox is (``bwrap`` arguments built by :func:`bwrap_argv`):

* new namespaces for everything bwrap supports (``--unshare-all``: user, pid, net, ipc, uts,
  cgroup where possible): no network but a private loopback, its own pid 1, its own hostname;
* a filesystem made of read-only binds of only what Python needs (``/usr``, the interpreter's
  prefix, the virtual environment, the ``course`` package), a fresh ``/proc``, a minimal ``/dev``,
  a size-limited tmpfs on ``/tmp``, and two writable binds: a private working directory (the cwd,
  also ``$HOME``) and an output directory for the records. The repository, ``solutions/``, the
  gradebook, other students' files and the instructor's home are simply not there;
* ``--die-with-parent`` and ``--new-session``; the parent starts bwrap in its own process group
  and kills the group on timeout; killing the pid namespace's init kills every process in it;
* rlimits set before exec (inherited by everything inside): address space, CPU seconds, number of
  processes, file size, open files, no core dumps.

Nothing here ever falls back to running without a sandbox: :func:`ensure_bwrap` raises
:class:`SandboxUnavailable` with the reason, and the caller decides (the CLI's ``--no-sandbox``).
"""
from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HARNESS = Path(__file__).resolve().parent / "harness.py"
#: where things appear inside the sandbox
WORK, OUT, HARNESS_IN = "/home/student", "/grader/out", "/grader/harness.py"


@dataclass
class Limits:
    """Per-submission limits (CLI flags of ``python -m autograder grade``)."""

    wall_s: float = 300.0  # whole notebook, wall clock
    cpu_s: int = 600  # RLIMIT_CPU, seconds of CPU for the process tree's each process
    cell_s: float = 120.0  # one cell, wall clock (an alarm inside the harness)
    memory_mb: int = 4096  # RLIMIT_AS, per process
    nproc: int = 64  # RLIMIT_NPROC, processes and threads (above what the user already runs)
    fsize_mb: int = 256  # RLIMIT_FSIZE, largest file a process may write
    nofile: int = 256  # RLIMIT_NOFILE
    tmp_mb: int = 256  # size of the tmpfs on /tmp
    threads: int = 1  # OMP/MKL threads inside (parallelism comes from --jobs)


class SandboxUnavailable(RuntimeError):
    """bwrap is missing or cannot create namespaces here."""


def _user_process_count() -> int:
    """Processes and threads this user runs now: RLIMIT_NPROC counts them all, per real uid."""
    uid, n = os.getuid(), 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                st = os.stat(f"/proc/{d}")
                if st.st_uid == uid:
                    n += len(os.listdir(f"/proc/{d}/task"))
            except OSError:
                pass
    return n


def _ro_binds() -> list[str]:
    """Read-only binds: system dirs, the interpreter, the venv, the course package."""
    paths = ["/usr", "/etc/ld.so.cache", "/etc/localtime", "/etc/alternatives"]
    for p in {sys.base_prefix, sys.prefix, os.path.realpath(sys.base_prefix)}:
        paths.append(p)
    args = []
    for p in paths:
        if os.path.exists(p):
            args += ["--ro-bind", p, p]
    # Merged-/usr systems: /bin, /lib, /lib64 are links into /usr.
    for name in ("bin", "lib", "lib64", "lib32", "sbin"):
        p = f"/{name}"
        if os.path.islink(p):
            args += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            args += ["--ro-bind", p, p]
    return args


def bwrap_argv(work: Path, out: Path, limits: Limits, course_dir: Path = ROOT / "course") -> list[str]:
    course_dir = Path(course_dir).resolve()
    return [
        shutil.which("bwrap") or "bwrap",
        "--unshare-all", "--unshare-user-try", "--unshare-cgroup-try",
        "--die-with-parent", "--new-session",
        "--hostname", "sandbox",
        # /tmp first: binds made after it may live under /tmp (a checkout or venv in /tmp/...)
        "--size", str(limits.tmp_mb << 20), "--tmpfs", "/tmp",
        *_ro_binds(),
        "--proc", "/proc", "--dev", "/dev",
        "--bind", str(work), WORK,
        "--bind", str(out), OUT,
        # The course package at its own path, so an editable install's finder and PYTHONPATH both find it;
        # its parent (the repository) appears as an empty folder holding only course/.
        "--ro-bind", str(course_dir), str(course_dir),
        # ...without the book's experiment code: its transformer block is close to exercise 04's answer
        *(["--tmpfs", str(course_dir / "experiments")] if (course_dir / "experiments").is_dir() else []),
        "--ro-bind", str(HARNESS), HARNESS_IN,
        "--chdir", WORK,
        "--clearenv",
        "--setenv", "PATH", f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "--setenv", "HOME", WORK,
        "--setenv", "TMPDIR", "/tmp",
        "--setenv", "LANG", "C.UTF-8",
        "--setenv", "PYTHONPATH", str(course_dir.parent),
        "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
        "--setenv", "PYTHONHASHSEED", "0",
        "--setenv", "MPLBACKEND", "Agg",
        "--setenv", "OMP_NUM_THREADS", str(limits.threads),
        "--setenv", "MKL_NUM_THREADS", str(limits.threads),
        "--setenv", "AUTOGRADER_OUT", OUT,
        "--",
    ]


def _preexec(limits: Limits, nproc_base: int):
    def apply():
        os.setsid()  # own process group: the parent kills the whole group on timeout
        mb = 1 << 20
        for res, val in (
            (resource.RLIMIT_AS, limits.memory_mb * mb),
            (resource.RLIMIT_CPU, limits.cpu_s),
            (resource.RLIMIT_NPROC, nproc_base + limits.nproc),
            (resource.RLIMIT_FSIZE, limits.fsize_mb * mb),
            (resource.RLIMIT_NOFILE, limits.nofile),
            (resource.RLIMIT_CORE, 0),
        ):
            resource.setrlimit(res, (val, val))
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)

    return apply


@dataclass
class Result:
    returncode: int | None
    timed_out: bool
    wall_s: float
    output: str  # the tail of stdout and stderr together


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_sandboxed(cmd: list[str], *, work: Path, out: Path, limits: Limits, sandbox: bool = True,
                  stdin_data: bytes = b"", course_dir: Path = ROOT / "course",
                  on_start=None, output_cap: int = 64 << 10, pass_fds: tuple = ()) -> Result:
    """Run ``cmd`` (paths as seen inside) in a fresh sandbox; return when it and its children are gone.

    ``on_start(proc)`` (optional) runs in the calling thread after the job was written to stdin and
    may talk to the process over its pipes (the benchmark protocol); the wall clock runs meanwhile.
    ``pass_fds``: descriptors the process inherits under the same numbers (the benchmark's reply pipe).
    """
    work, out = Path(work), Path(out)
    if sandbox:
        argv = bwrap_argv(work, out, limits, course_dir) + cmd
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    else:  # --no-sandbox: the instructor asked for it explicitly; only the rlimits remain
        argv = [cmd[0] if cmd[0] != "python" else sys.executable] + [
            str(HARNESS) if c == HARNESS_IN else c for c in cmd[1:]]
        env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(work),
               "PYTHONPATH": str(Path(course_dir).resolve().parent), "MPLBACKEND": "Agg",
               "OMP_NUM_THREADS": str(limits.threads), "AUTOGRADER_OUT": str(out),
               "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
    log_path = out.parent / (out.name + ".log")
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT,
                                cwd=str(work), env=env, close_fds=True, pass_fds=tuple(pass_fds),
                                preexec_fn=_preexec(limits, _user_process_count()))
        fired = []

        def expire():
            fired.append(True)
            _kill_group(proc)

        timer = threading.Timer(limits.wall_s, expire)
        timer.daemon = True
        timer.start()
        try:
            try:
                proc.stdin.write(stdin_data)
                proc.stdin.flush()
            except (BrokenPipeError, OSError):
                pass
            if on_start is not None:
                on_start(proc)
            try:
                proc.stdin.close()
            except OSError:
                pass
            proc.wait()
        finally:
            timer.cancel()
            _kill_group(proc)  # whatever is left of the group (the pid namespace is gone with bwrap)
            proc.wait()
    wall = time.monotonic() - t0
    timed_out = bool(fired)
    size = log_path.stat().st_size
    with open(log_path, "rb") as f:
        if size > output_cap:
            f.seek(size - output_cap)
        tail = f.read().decode("utf-8", "replace")
    return Result(proc.returncode, timed_out, wall, tail)


_checked: dict = {}


def ensure_bwrap() -> None:
    """Raise :class:`SandboxUnavailable` unless bwrap can build the sandbox on this machine."""
    if "ok" in _checked:
        if not _checked["ok"]:
            raise SandboxUnavailable(_checked["why"])
        return
    why = None
    if shutil.which("bwrap") is None:
        why = "bubblewrap (bwrap) is not installed: run `make system` (Debian package bubblewrap)"
    else:
        import tempfile
        with tempfile.TemporaryDirectory() as tmp:
            work, out = Path(tmp, "w"), Path(tmp, "o")
            work.mkdir(), out.mkdir()
            try:
                proc = subprocess.run(bwrap_argv(work, out, Limits()) + ["/bin/sh", "-c", "echo ok"],
                                      capture_output=True, text=True, timeout=60)
                if proc.returncode != 0 or proc.stdout.strip() != "ok":
                    why = ("bwrap cannot create its namespaces on this machine "
                           f"(exit {proc.returncode}): {proc.stderr.strip()[:500]}")
            except subprocess.TimeoutExpired:
                why = "bwrap did not start within 60 s"
    _checked.update(ok=why is None, why=why)
    if why:
        raise SandboxUnavailable(
            why + "\nThe grader never runs submissions unsandboxed on its own; if you trust them, "
                  "pass --no-sandbox.")
