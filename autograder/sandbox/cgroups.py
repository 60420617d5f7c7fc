"""One control group per submission: memory (all its processes together, tmpfs included), processes
and CPU, as a container runtime gives them.

    group = create(limits)        # under the grader's own cgroup of each controller
    group.join_files()            # cgroup.procs paths: a process writes "0" into each to join
    group.oom_killed()            # did the kernel's OOM killer kill something in it?
    group.close()                 # kill what is left, remove the group (always, even after a kill)

Two backends behind that one surface:

* **cgroup v2** (one unified hierarchy, ``/sys/fs/cgroup/cgroup.controllers`` exists): the group is
  a child of the grader's cgroup, with ``memory.max`` (and ``memory.swap.max`` 0),
  ``memory.oom.group`` 1 (a memory kill takes the whole submission), ``pids.max`` and ``cpu.max``.
  The grader's own cgroup must hand the controllers down (``cgroup.subtree_control``); since a
  cgroup that does so may hold no process itself, the grader's processes move into a leaf
  ``grader`` child first when the kernel says so (EBUSY), as systemd's delegation asks.
* **cgroup v1** (one hierarchy per controller, ``/sys/fs/cgroup/memory``, ``pids``, ``cpu``):
  a child of the grader's cgroup in each of the three, with ``memory.limit_in_bytes`` (and
  ``memory.memsw.limit_in_bytes``, so swap gives no more), ``pids.max``, ``cpu.cfs_quota_us``.

Which cgroup is the grader's comes from ``/proc/self/cgroup`` and where each hierarchy is mounted
from ``/proc/self/mountinfo``: the groups are made below the grader's own (in a container or a
systemd unit, the root is not its to write). Tmpfs pages are charged to the cgroup of the process
that writes them, so the sandbox's sized tmpfs count against its memory too.

A memory kill is read from the group's counters (``oom_kill`` in v2's ``memory.events``, in v1's
``memory.oom_control``) while the submission runs (:class:`OomWatch`): the grader kills the rest of
the submission at once and its row says the memory limit stopped it. The grader, the other slots
and the next submission are in other groups, so the kernel never picks them.

Nothing here falls back silently: :func:`create` raises :class:`CgroupUnavailable` with the reason
(the grader is not root, no hierarchy has the three controllers, a write is refused), and the CLI
refuses to grade unless the instructor passes ``--no-cgroups`` (rlimits only, as before).
"""
from __future__ import annotations

import contextlib
import errno
import itertools
import os
import signal
import threading
import time
import uuid
from pathlib import Path

try:
    from autograder.sandbox import SandboxUnavailable
except ImportError:  # copied alone into the class server's hub (class_server/spawner.py)
    class SandboxUnavailable(RuntimeError):
        pass

CONTROLLERS = ("memory", "pids", "cpu")
CPU_PERIOD_US = 100_000
#: processes beyond ``Limits.nproc`` that a submission's group must hold: a slot's intermediate
#: process and the namespace's init (a one-off sandbox: bwrap's two processes)
PIDS_EXTRA = 4
#: share of the machine's memory the grading slots may hold together (the rest: the grader,
#: its torch, the page cache)
MACHINE_SHARE = 0.75


class CgroupUnavailable(SandboxUnavailable):
    """No control group can be made here: the message says why and what to do."""

    def __init__(self, why: str):
        super().__init__(why + ". Each submission's memory, processes and CPU are bounded by a cgroup of "
                         "its own; run the grader as root on a machine with cgroups, or pass --no-cgroups "
                         "to grade with per-process rlimits only (a submission's processes together may "
                         "then hold more memory and CPU than one slot's share)")


def _mounts() -> dict:
    """{controller or "": (mount point, mount root)}: "" is the cgroup v2 hierarchy."""
    out = {}
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            fields, rfields = left.split(), right.split()
            if len(rfields) < 3:
                continue
            fstype, opts = rfields[0], rfields[2].split(",")
            root, point = fields[3], fields[4].encode().decode("unicode_escape")
            if fstype == "cgroup2":
                out.setdefault("", (point, root))
            elif fstype == "cgroup":
                for o in opts:
                    if o in CONTROLLERS:
                        out.setdefault(o, (point, root))
    return out


def _own() -> dict:
    """{controller or "": the grader's cgroup path} from ``/proc/self/cgroup``."""
    out = {}
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, names, path = line.rstrip("\n").split(":", 2)
            for n in names.split(",") if names else [""]:
                out[n] = path
    return out


def _under(point: str, root: str, path: str) -> Path:
    rel = os.path.relpath(path, root) if root != "/" else path.lstrip("/")
    return Path(point) / ("" if rel == "." else rel)


def version() -> int | None:
    """2 where the memory controller is on the unified hierarchy, 1 where it is on its own v1
    hierarchy (as on hybrid hosts, whose v2 mount holds no controller), None without either."""
    m = _mounts()
    if "" in m and not {"memory", "pids", "cpu"} & set(m):
        point, _ = m[""]
        with contextlib.suppress(OSError):
            if "memory" in Path(point, "cgroup.controllers").read_text().split():
                return 2
    if all(c in m for c in CONTROLLERS):
        return 1
    return None


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


#: v1 only: TCP buffer memory a submission's sockets may hold together (its sandbox has loopback only)
TCP_MB = 64


def default_memory_mb(jobs: int = 1) -> int:
    """Memory per submission when ``--memory`` is not given: :data:`MACHINE_SHARE` of the machine's
    (or the grader's own cgroup's, if lower) memory, split between the ``jobs`` slots; at least 1 GiB."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    with contextlib.suppress(Exception):
        m, own = _mounts(), _own()
        if version() == 2:
            v = (_under(*m[""], own.get("", "/")) / "memory.max").read_text().strip()
        else:
            v = (_under(*m["memory"], own.get("memory", "/")) / "memory.limit_in_bytes").read_text().strip()
        if v.isdigit():
            total = min(total, int(v))
    return max(1024, int(total * MACHINE_SHARE / max(1, jobs)) >> 20)


_v2_ready: list = []
_v2_lock = threading.Lock()


def _v2_parent(point: str, root: str, own: str) -> Path:
    """The grader's v2 cgroup, its controllers handed down to children (moving the grader's own
    processes into a leaf ``grader`` child when the kernel asks for that, once per process)."""
    parent = _under(point, root, own)
    with _v2_lock:
        if parent.name == "grader" and _v2_ready:
            return parent.parent
        want = " ".join(f"+{c}" for c in CONTROLLERS)
        try:
            _write(parent / "cgroup.subtree_control", want)
        except OSError as e:
            if e.errno != errno.EBUSY:
                raise
            leaf = parent / "grader"
            leaf.mkdir(exist_ok=True)
            for pid in (parent / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError, OSError):
                    _write(leaf / "cgroup.procs", pid)
            _write(parent / "cgroup.subtree_control", want)
        _v2_ready.append(True)
    return parent


class Group:
    """One submission's control group (one directory in v2, one per controller in v1)."""

    def __init__(self, ver: int, dirs: list[Path]):
        self.version, self.dirs = ver, dirs
        self.memory = dirs[0]  # v1: the memory hierarchy's directory; v2: the group

    def join_files(self) -> list[str]:
        """The ``cgroup.procs`` file of each directory: writing "0" into them moves the writer."""
        return [str(d / "cgroup.procs") for d in self.dirs]

    def add(self, pid: int) -> None:
        for f in self.join_files():
            _write(Path(f), str(pid))

    def pids(self) -> list[int]:
        with contextlib.suppress(OSError):
            return [int(p) for p in (self.memory / "cgroup.procs").read_text().split()]
        return []

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of this group for its memory limit."""
        name = "memory.events" if self.version == 2 else "memory.oom_control"
        try:
            for line in (self.memory / name).read_text().splitlines():
                k, _, v = line.partition(" ")
                if k == "oom_kill" and v.strip().isdigit():
                    return int(v) > 0
        except OSError:
            return False
        if self.version == 1:  # kernels before 4.13 have no oom_kill line: the limit was hit
            with contextlib.suppress(OSError, ValueError):
                return int((self.memory / "memory.failcnt").read_text()) > 0
        return False

    def kill(self) -> None:
        """SIGKILL every process in the group (v2: ``cgroup.kill`` where the kernel has it)."""
        if self.version == 2:
            with contextlib.suppress(OSError):
                _write(self.memory / "cgroup.kill", "1")
                return
        for _ in range(100):
            pids = self.pids()
            if not pids:
                return
            for p in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(p, signal.SIGKILL)
            time.sleep(0.01)

    def close(self, wait_s: float = 10.0) -> None:
        """Kill what is left and remove the directories (retried while the last processes exit)."""
        deadline = time.monotonic() + wait_s
        for d in self.dirs:
            while True:
                try:
                    d.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as e:
                    if e.errno != errno.EBUSY or time.monotonic() > deadline:
                        break
                    self.kill()
                    time.sleep(0.02)


_seq = itertools.count()
_swept: set = set()


def _sweep(parent: Path) -> None:
    """Remove the groups that graders which died (SIGKILL, a killed Dask worker) left under
    ``parent``: named ``autograder-PID-...`` for a PID no longer running, and empty (rmdir fails on
    a group that still has a process, so a live one is never touched). Once per parent and process."""
    if parent in _swept:
        return
    _swept.add(parent)
    for d in parent.glob("autograder-*-*"):
        pid = d.name.split("-")[1]
        if pid.isdigit() and int(pid) != os.getpid() and not os.path.exists(f"/proc/{pid}"):
            with contextlib.suppress(OSError):
                d.rmdir()


def delegated() -> bool:
    """Whether this process may make groups below its own without being root: its cgroup's folders
    are its user's (the class server's hub delegates an instructor's server's group; systemd's
    ``Delegate=yes`` does the same)."""
    with contextlib.suppress(Exception):
        m, own = _mounts(), _own()
        ver = version()
        if ver == 2:
            dirs = [_under(*m[""], own.get("", "/"))]
        elif ver == 1:
            dirs = [_under(*m[c], own.get(c, "/")) for c in CONTROLLERS]
        else:
            return False
        return all(d.stat().st_uid == os.geteuid() and os.access(d, os.W_OK) for d in dirs)
    return False


def create(memory_mb: int, nproc: int, cpus: float) -> Group:
    """A fresh group under the grader's own: ``memory_mb`` for all its processes together (swap
    included), at most ``nproc`` processes and threads, ``cpus`` cores of CPU time. Raises
    :class:`CgroupUnavailable` with the reason when none can be made."""
    ver = version()
    if ver is None:
        raise CgroupUnavailable("no cgroup hierarchy with the memory, pids and cpu controllers is mounted "
                                "(cgroup v2 at /sys/fs/cgroup, or v1 at /sys/fs/cgroup/{memory,pids,cpu})")
    m, own = _mounts(), _own()
    if os.geteuid() != 0 and not delegated():
        raise CgroupUnavailable("the grader is not root and its cgroup is not delegated to it, so it cannot "
                                "make a control group per submission")
    name = f"autograder-{os.getpid()}-{next(_seq)}-{uuid.uuid4().hex[:8]}"
    mem, quota = memory_mb << 20, int(cpus * CPU_PERIOD_US)
    dirs: list[Path] = []
    try:
        if ver == 2:
            parent = _v2_parent(*m[""], own.get("", "/"))
            _sweep(parent)
            d = parent / name
            d.mkdir(mode=0o755)
            dirs.append(d)
            _write(d / "memory.max", str(mem))
            with contextlib.suppress(FileNotFoundError):
                _write(d / "memory.swap.max", "0")
            with contextlib.suppress(FileNotFoundError):
                _write(d / "memory.oom.group", "1")
            _write(d / "pids.max", str(nproc))
            _write(d / "cpu.max", f"{quota} {CPU_PERIOD_US}")
        else:
            for c in CONTROLLERS:  # memory first: Group.memory is dirs[0]
                _sweep(_under(*m[c], own.get(c, "/")))
                d = _under(*m[c], own.get(c, "/")) / name
                d.mkdir(mode=0o755)
                dirs.append(d)
            mdir, pdir, cdir = dirs
            _write(mdir / "memory.limit_in_bytes", str(mem))
            if (mdir / "memory.memsw.limit_in_bytes").exists():
                _write(mdir / "memory.memsw.limit_in_bytes", str(mem))
            # v1 charges TCP socket buffers to a group only once this is set: without it a
            # submission's loopback sockets could hold gigabytes outside its limit and push every
            # TCP socket on the host into tcp_mem's hard limit (v2 charges them to memory.max)
            if (mdir / "memory.kmem.tcp.limit_in_bytes").exists():
                _write(mdir / "memory.kmem.tcp.limit_in_bytes", str(min(mem, TCP_MB << 20)))
            _write(pdir / "pids.max", str(nproc))
            _write(cdir / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(cdir / "cpu.cfs_quota_us", str(quota))
    except OSError as e:
        Group(ver, dirs).close(0)
        raise CgroupUnavailable(f"cannot make a cgroup v{ver} for a submission ({e.filename}: "
                                f"{e.strerror})") from None
    return Group(ver, dirs)


def for_limits(limits) -> Group | None:
    """The group a submission gets under ``limits`` (:class:`autograder.sandbox.bwrap.Limits`), or None
    when the instructor turned control groups off (``--no-cgroups``)."""
    if not limits.cgroups:
        return None
    return create(limits.submission_mb or default_memory_mb(os.cpu_count() or 1),
                  limits.nproc + PIDS_EXTRA, limits.cpus)


def ensure(limits) -> None:
    """Raise :class:`CgroupUnavailable` unless a group for ``limits`` can be made here (the CLI's check)."""
    g = for_limits(limits)
    if g is not None:
        g.close()


class OomWatch:
    """While a submission runs: polls its group's memory-kill counter and calls ``kill`` once on the
    first kill, so the rest of the submission goes at once (v1 has no ``memory.oom.group``)."""

    def __init__(self, group: Group | None, kill, every_s: float = 0.1):
        self.group, self.kill, self.every_s = group, kill, every_s
        self.fired = False
        self._stop = threading.Event()
        self._t = None
        if group is not None:
            self._t = threading.Thread(target=self._run, daemon=True)
            self._t.start()

    def _run(self):
        while not self._stop.wait(self.every_s):
            if self.group.oom_killed():
                self.fired = True
                self.kill()
                return

    def stop(self) -> bool:
        """Stop watching; whether the group saw a memory kill (checked once more)."""
        self._stop.set()
        if self._t is not None:
            self._t.join(1)
        if self.group is not None and not self.fired and self.group.oom_killed():
            self.fired = True
        return self.fired
