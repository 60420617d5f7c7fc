"""Runs INSIDE a long-lived sandbox, one per grading slot: imports torch, IPython and the checks
once, then forks one child per submission, and each child enters a fresh sandbox of its own
before any student code runs (the grader's side is :mod:`autograder.sandbox.slots`).

Started as ``python /grader/zygote.py SOCKET_FD TMP_MB CPU_S`` inside the same bubblewrap sandbox as a
one-off submission (:func:`autograder.sandbox.bwrap.bwrap_argv`: unprivileged uid, no capability,
read-only root, no network). Its stdin brings one JSON line, ``{"seccomp": ...}``: the filter
each child installs (the hidden checks never come here: the grader's referee runs them,
``autograder/referee/calls.py``). ``SOCKET_FD`` is a ``SOCK_SEQPACKET`` socket to the grader. Messages
are JSON; the grader sends::

    {"op": "fork", "id": n, "cgroups": k}  + 3 + k descriptors: the job pipe's read end, the reply
                      pipe's write end, the output pipe's write end, and the ``cgroup.procs`` files of
                      the submission's cgroup, opened by the grader (SCM_RIGHTS)
    {"op": "kill", "id": n}  while child n runs: kill it (and everything it started) now

and this process answers ``{"ready": true}`` once at start, then per fork ``{"forked": true,
"id": n}`` and, when that child and everything it started are gone, ``{"exit": code, "id": n}``.

Why a child is as fresh as a sandbox of its own. Between fork and the student's first line, the
child (:func:`_enter`):

0. writes itself into its cgroup's ``cgroup.procs`` files (the descriptors were opened by the
   grader, as root, which is what the kernel checks) and closes them: everything it starts, and
   every page it writes, is the submission's (:mod:`autograder.sandbox.cgroups`);
1. ``unshare`` s new user, mount, pid, network, IPC and UTS namespaces (the zygote never runs
   student code: each fork is a pristine copy of it);
2. mounts new, sized tmpfs on the working directory, ``/tmp`` and ``/dev/shm``: nothing an
   earlier submission wrote is there (read-only binds that lived below them, such as a checkout
   and its virtual environment in ``/tmp``, are bound again on top, still read-only);
3. forks pid 1 of the new pid namespace, with a new ``/proc``: nothing in it can see (so signal
   or trace) the zygote or any earlier submission; it dies with its parent
   (``PR_SET_PDEATHSIG``), and killing it kills everything in the namespace. It stays a minimal
   init that reaps orphans, and the harness runs as its child, pid 2;
4. brings up its own loopback, sets the hostname, forbids further user namespaces where the
   kernel allows it, drops every capability (bounding set, ambient, effective, permitted), sets
   ``no_new_privs`` and the submission's own CPU-seconds limit: mounts inherited from the slot are locked, and without
   ``CAP_SYS_ADMIN`` it cannot unmount its own tmpfs or ``/proc`` either; and installs the full
   seccomp filter (:mod:`autograder.sandbox.seccomp`; the zygote's own lacks ``unshare`` and ``mount``,
   which step 1 needs), in the init, so the harness and all it starts have it;
5. keeps only its three pipes, reseeds torch's, numpy's and Python's global generators
   (:func:`_reseed`), then runs :func:`harness.main`.

The zygote is not dumpable (``PR_SET_DUMPABLE`` 0), so even a process of the same uid that could
name it could not trace it or read its memory.
"""
import ctypes
import json
import os
import resource
import select
import signal
import socket
import sys
import time

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
CLONE_NEWCGROUP = 0x02000000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 8, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 1, 4, 24, 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 22, 2
WORK = "/home/student"

libc = ctypes.CDLL(None, use_errno=True)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _check(rc, what):
    if rc != 0:
        e = ctypes.get_errno()
        raise OSError(e, f"{what}: {os.strerror(e)}")


def _mount(src, target, fstype, flags, data):
    _check(libc.mount(src and src.encode(), target.encode(), fstype and fstype.encode(),
                      ctypes.c_ulong(flags), data and data.encode()), f"mount {target}")


def _loopback_up():
    import fcntl
    import struct
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH", b"lo", 0))[:18])[1]  # SIOCGIFFLAGS
        fcntl.ioctl(s, 0x8914, struct.pack("16sH", b"lo", flags | 1))  # SIOCSIFFLAGS, IFF_UP
    finally:
        s.close()


def _drop_capabilities():
    for cap in range(64):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 and ctypes.get_errno() == 22:  # EINVAL: past the last
            break
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    data = (_CapData * 2)()
    _check(libc.capset(ctypes.byref(_CapHeader(0x20080522, 0)), data), "capset")
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _install_seccomp(prog: bytes) -> None:
    """Install ``prog`` (``struct sock_filter`` bytes) as this process's seccomp filter (stacked on
    the zygote's; inherited by all it starts). Needs ``no_new_privs``, set just before."""
    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = _SockFprog(len(prog) // 8, ctypes.addressof(buf))
    _check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp")


def _mounts_below(path: str) -> list[str]:
    """The top-most mount points strictly below ``path`` (e.g. the read-only binds of a checkout or a
    virtual environment that lives in ``/tmp``), from ``/proc/self/mountinfo``."""
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4]
            point = point.encode().decode("unicode_escape").encode("latin-1").decode()  # \040 and co.
            if point.startswith(path.rstrip("/") + "/"):
                points.append(point)
    points.sort(key=len)
    top = []
    for p in points:
        if not any(p == t or p.startswith(t + "/") for t in top):
            top.append(p)
    return top


def _fresh_tmpfs(path: str, options: str) -> None:
    """A new tmpfs on ``path``; read-only binds that lived below it (a checkout or venv in /tmp) are
    bound again on top, from the covered tree, with everything mounted below them (MS_REC)."""
    below = _mounts_below(path)
    old = os.open(path, os.O_PATH | os.O_DIRECTORY) if below else None
    _mount("tmpfs", path, "tmpfs", MS_NOSUID | MS_NODEV, options)
    for point in below:
        src = f"/proc/self/fd/{old}/{os.path.relpath(point, path)}"
        if os.path.isdir(src):
            os.makedirs(point, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(point), exist_ok=True)
            open(point, "a").close()
        _mount(src, point, None, MS_BIND | MS_REC, None)
    if old is not None:
        os.close(old)


def _enter(tmp_mb: int, cpu_s: int, status_w: int, keep: tuple, seccomp: bytes | None) -> None:
    """Steps 1-4 of the module docstring. Returns in the process that runs the harness (pid 2 of
    its namespace, under a minimal init); the intermediate process waits for the init and exits
    with its status, which it gets only once every process of the namespace is gone."""
    uid, gid = os.getuid(), os.getgid()
    libc.prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # the zygote is not; this child must write its own maps
    # a cgroup namespace too: the child joined its submission's group in step 0, so inside, that group
    # is the root ("/" in /proc/self/cgroup, as in a one-off sandbox), not the grader's path
    _check(libc.unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
                        | CLONE_NEWCGROUP), "unshare")
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{uid} {uid} 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{gid} {gid} 1")
    _mount(None, "/", None, MS_REC | MS_PRIVATE, None)
    size = f"size={tmp_mb}m"
    _fresh_tmpfs(WORK, f"{size},mode=0700")
    _fresh_tmpfs("/tmp", f"{size},mode=1777")
    _fresh_tmpfs("/dev/shm", f"{size},mode=1777")
    pid = _fork()
    if pid:  # the intermediate: report the init's pid, hold nothing, wait, pass its status on
        for fd in keep:
            os.close(fd)
        os.write(status_w, f"{pid}\n".encode())
        os.close(status_w)
        _, st = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(st)
        os._exit(code if code >= 0 else 128 - code)
    os.close(status_w)
    _check(libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)
    _check(libc.sethostname(b"sandbox", 7), "sethostname")
    _loopback_up()
    try:  # no user namespaces below this one (a kernel that has the knob per namespace)
        with open("/proc/sys/user/max_user_namespaces", "w") as f:
            f.write("0")
    except OSError:
        pass
    _drop_capabilities()
    if seccomp:
        _install_seccomp(seccomp)
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))  # per submission (the zygote's is longer)
    os.chdir(WORK)
    # pid 1 stays a minimal init: it reaps orphans (as bwrap's init does in a one-off sandbox) and
    # exits with the harness's status; the harness runs as pid 2, where signals behave as usual
    harness_pid = _fork()
    if harness_pid:
        libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # the student's code may not read or write init's memory
        for fd in keep:
            os.close(fd)
        while True:
            try:
                done, st = os.waitpid(-1, 0)
            except ChildProcessError:
                os._exit(70)
            if done == harness_pid:
                code = os.waitstatus_to_exitcode(st)
                os._exit(code if code >= 0 else 128 - code)  # the namespace, and all in it, go with pid 1


def _fork(tries: int = 50) -> int:
    """``os.fork``, retried a moment while the uid's process count is at its limit (processes of
    a submission killed just before are still being torn down)."""
    for i in range(tries):
        try:
            return os.fork()
        except BlockingIOError:
            time.sleep(0.02 * (i + 1))
    return os.fork()


def _reseed():
    """Fresh seeds for this submission's global generators: a fork would repeat the zygote's state in
    every child, so one submission's draws would tell the next one's. numpy's and Python's from the
    OS (as a fresh interpreter seeds them); torch's too (a fresh interpreter starts it from a
    constant), from ``os.urandom``; CUDA's generators follow torch's lazily, without starting CUDA."""
    import random
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "torch" in sys.modules:
        sys.modules["torch"].manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)


def _run_child(sock, fds, tmp_mb, cpu_s, status_w, harness, seccomp):
    """In the forked child: never returns."""
    code = 70
    try:
        sock.close()
        job_r, reply_w, out_w, *joins = fds
        for fd in joins:  # step 0: into the submission's cgroup, first of all
            os.write(fd, b"0")
            os.close(fd)
        _enter(tmp_mb, cpu_s, status_w, (job_r, reply_w, out_w), seccomp)
        os.dup2(out_w, 1)
        os.dup2(out_w, 2)
        os.close(out_w)
        keep = {0, 1, 2, job_r, reply_w}
        for fd in map(int, os.listdir("/proc/self/fd")):
            if fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass
        _reseed()
        harness.main(reply_w, job_r)
    except BaseException as e:  # noqa: BLE001 -- the grader sees the message and a crashed row
        try:
            os.write(2, f"the grading sandbox could not start: {type(e).__name__}: {e}\n".encode())
        except OSError:
            pass
    os._exit(code)


def _send(sock, obj):
    sock.send(json.dumps(obj).encode())


def _one(sock, fds, req, harness, seccomp=None):
    """Fork one submission's child, relay its life to the grader, return when it is gone.

    A kill names the fork it is for (``id``): a late kill meant for an earlier submission never
    reaches a later one. Killing sends SIGKILL to the namespace's init only: the intermediate's
    ``waitpid`` returns once the kernel has torn the whole namespace down, so ``exit`` is sent
    only when nothing of the submission is left (its processes no longer count against the
    uid's process limit for the next one)."""
    status_r, status_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = _fork()
    if pid == 0:
        os.close(status_r)
        _run_child(sock, fds, int(req["tmp_mb"]), int(req["cpu_s"]), status_w, harness, seccomp)
    os.close(status_w)
    for fd in fds:
        os.close(fd)
    inner = None
    r, _, _ = select.select([status_r], [], [], 30.0)
    if r:
        line = os.read(status_r, 64).decode().strip()
        inner = int(line) if line.isdigit() else None
    os.close(status_r)
    _send(sock, {"forked": inner is not None, "id": req.get("id")})
    killed_at = None

    def kill():
        target = inner if inner else pid
        try:
            os.kill(target, signal.SIGKILL)
        except ProcessLookupError:
            pass

    if inner is None:
        kill()
        killed_at = time.monotonic()
    while True:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if killed_at is not None and time.monotonic() - killed_at > 20:  # the init would not go
            os.kill(pid, signal.SIGKILL)
        r, _, _ = select.select([sock], [], [], 0.02)
        if r:
            msg = sock.recv(4096)
            if not msg:  # the grader is gone
                kill()
                os.waitpid(pid, 0)
                sys.exit(0)
            try:
                order = json.loads(msg)
            except ValueError:
                continue
            if order.get("op") == "kill" and order.get("id") == req.get("id"):
                kill()
                killed_at = killed_at or time.monotonic()
    code = os.waitstatus_to_exitcode(st)
    _send(sock, {"exit": code, "id": req.get("id")})


def _read_start():
    """One JSON line on stdin from the grader (:class:`autograder.sandbox.slots.Slot`), read to its end: the
    seccomp filter (base64); stdin is ``/dev/null`` afterwards."""
    chunks = []
    while True:
        chunk = os.read(0, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    data = b"".join(chunks).strip()
    return json.loads(data) if data else {}


def main():
    sock = socket.socket(fileno=int(sys.argv[1]))
    tmp_mb, cpu_s = int(sys.argv[2]), int(sys.argv[3])
    start = _read_start()
    import base64
    seccomp = base64.b64decode(start["seccomp"]) if start.get("seccomp") else None
    os.environ["COURSEKIT_SIDE"] = "sandbox"  # before the checks are imported: coursekit.checks.remote.SANDBOX_SIDE
    import harness  # beside this file in /grader
    del start
    harness.preload()
    libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    _send(sock, {"ready": True})
    while True:
        msg, fds, _, _ = socket.recv_fds(sock, 4096, 8)
        if not msg:
            return
        req = json.loads(msg)
        if req.get("op") != "fork" or len(fds) != 3 + int(req.get("cgroups", 0)):
            for fd in fds:
                os.close(fd)
            continue
        _one(sock, fds, {"tmp_mb": tmp_mb, "cpu_s": cpu_s, **req}, harness, seccomp)


if __name__ == "__main__":
    main()
