"""Run one submission's code in a bubblewrap sandbox, with limits, and make sure nothing outlives it.

What the sandbox is (``bwrap`` arguments built by :func:`bwrap_argv`):

* an unprivileged user: when the grader runs as root, bwrap itself is started as a uid of its own
  for each concurrent job (:data:`SANDBOX_UIDS`, no such user exists on the host; one lock file per
  uid in :data:`UID_LOCKS` keeps them apart across processes), so nothing the
  submission does acts as root anywhere, and files of the host (the venv, the course) are not its
  own even where it can see them; inside, ``--cap-drop ALL``: no capability, so no remounting a
  read-only bind;
* new namespaces for everything bwrap supports (``--unshare-all``: user, pid, net, ipc, uts,
  cgroup where possible): no network but a private loopback, its own pid 1, its own hostname;
* a filesystem made of read-only binds of only what Python needs (``/usr``, the interpreter's
  prefix, the virtual environment, the ``course`` package, but an empty read-only folder over its
  ``hidden/``: the grader's referee runs the hidden checks, ``autograder/referee/calls.py``), a fresh
  ``/proc``, a minimal ``/dev``,
  and two size-limited tmpfs, the only writable places: the working directory (``$HOME``) and
  ``/tmp``. Nothing of the host is writable; the repository, ``solutions/``, the gradebook, other
  students' files and the instructor's home are simply not there. Results leave over pipes only
  (:mod:`autograder.referee.protocol`);
* ``--die-with-parent`` and ``--new-session``; the parent starts bwrap in its own process group
  and kills the group on timeout; killing the pid namespace's init kills every process in it;
* rlimits set before exec (inherited by everything inside): address space, CPU seconds, number of
  processes (enforced, since the uid is not root), file size, open files, no core dumps;
* a control group of its own (:mod:`autograder.sandbox.cgroups`), joined before exec: memory of all its
  processes together (tmpfs included), processes, and CPU time (1 core by default), so a memory
  bomb meets the kernel's OOM killer inside its own group (the row says so) and threads buy no
  wall time;
* a seccomp filter (:mod:`autograder.sandbox.seccomp`, ``--seccomp``): the system calls Docker's default
  profile denies answer EPERM;
* only when the grader's benchmarks run on a GPU (``gpu=True``, see
  :func:`autograder.referee.clock.served_device`): the NVIDIA device files that exist
  (:func:`gpu_device_binds`, ``--dev-bind``), the folders of the driver's libraries that the
  ``/usr`` bind does not cover (:func:`gpu_library_dirs`), and a data-size limit instead of the
  address-space one (the CUDA driver reserves tens of GiB of address space it never touches).

Nothing here ever falls back to running without a sandbox: :func:`ensure_bwrap` raises
:class:`SandboxUnavailable` with the reason, and the caller decides (the CLI's ``--no-sandbox``).
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: what runs inside the sandbox (:mod:`autograder.inside`): bound read-only as ``/grader``
INSIDE = Path(__file__).resolve().parents[1] / "inside"
HARNESS, ZYGOTE = INSIDE / "harness.py", INSIDE / "zygote.py"
#: where things appear inside the sandbox
WORK, INSIDE_IN = "/home/student", "/grader"
HARNESS_IN, ZYGOTE_IN = f"{INSIDE_IN}/harness.py", f"{INSIDE_IN}/zygote.py"
#: uids the sandbox runs as when the grader is root, one per concurrent job (none is a host user)
SANDBOX_UIDS = range(61000, 61256)


@dataclass
class Limits:
    """Per-submission limits (CLI flags of ``python -m autograder grade``)."""

    wall_s: float = 300.0  # whole notebook, wall clock
    cpu_s: int = 600  # RLIMIT_CPU, seconds of CPU for the process tree's each process
    cell_s: float = 120.0  # one cell, wall clock (an alarm inside the harness)
    memory_mb: int = 4096  # RLIMIT_AS, per process (--address-space)
    nproc: int = 64  # RLIMIT_NPROC, processes and threads (above what the user already runs)
    fsize_mb: int = 256  # RLIMIT_FSIZE, largest file a process may write
    nofile: int = 256  # RLIMIT_NOFILE
    tmp_mb: int = 256  # size of the tmpfs on /tmp, and of the one on the working directory
    threads: int = 1  # OMP/MKL threads inside (parallelism comes from --jobs)
    #: memory of all the submission's processes together, tmpfs included, MB (its cgroup, --memory);
    #: None: sized so that the grading slots fit the machine (autograder.sandbox.cgroups.default_memory_mb)
    submission_mb: int | None = None
    cpus: float = 1.0  # CPU time per wall second of the submission's cgroup, in cores (--cpus)
    cgroups: bool = True  # a cgroup per submission (False: --no-cgroups, rlimits only)


from autograder.sandbox import SandboxUnavailable  # noqa: E402 -- one class for the whole package


def _user_process_count(uid: int) -> int:
    """Processes and threads ``uid`` runs now: RLIMIT_NPROC counts them all, per real uid."""
    n = 0
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                st = os.stat(f"/proc/{d}")
                if st.st_uid == uid:
                    n += len(os.listdir(f"/proc/{d}/task"))
            except OSError:
                pass
    return n


#: device files of an NVIDIA GPU, as globs under the device folder: the GPUs (nvidia0...), nvidiactl,
#: nvidia-uvm, nvidia-uvm-tools, nvidia-modeset, nvidia-caps (MIG), and the DRM folder
GPU_DEVICE_GLOBS = ("nvidia*", "dri")
#: the CUDA driver's user-space libraries (where they are is how the host's loader finds them)
GPU_LIBRARIES = ("libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1")


def gpu_device_binds(dev_root: str | Path = "/dev") -> list[str]:
    """``--dev-bind SRC /dev/NAME`` for each NVIDIA device file that exists under ``dev_root``
    (the host's ``/dev``; a folder of fake files in tests): nothing when there is none."""
    import glob
    out = []
    for pattern in GPU_DEVICE_GLOBS:
        for src in sorted(glob.glob(os.path.join(str(dev_root), pattern))):
            out += ["--dev-bind", src, "/dev/" + os.path.basename(src)]
    return out


def gpu_library_dirs(ld_library_path: str | None = None) -> list[str]:
    """Folders on the host's ``LD_LIBRARY_PATH`` holding the CUDA driver's libraries, outside ``/usr``
    (which the sandbox binds anyway, and where the loader's cache finds them on most hosts):
    containers often put them in e.g. /usr/local/nvidia/lib64 or /run/nvidia and point
    ``LD_LIBRARY_PATH`` there, which ``--clearenv`` would otherwise drop."""
    path = os.environ.get("LD_LIBRARY_PATH", "") if ld_library_path is None else ld_library_path
    dirs = []
    for d in filter(None, path.split(":")):
        d = os.path.realpath(d)
        if d in dirs or d == "/usr" or d.startswith("/usr/"):
            continue
        if any(os.path.exists(os.path.join(d, lib)) for lib in GPU_LIBRARIES):
            dirs.append(d)
    return dirs


def _ro_sources(course_dir: Path, gpu: bool = False) -> list[tuple[str, str]]:
    """(host path, path inside) of every read-only bind: system dirs, the interpreter, the venv,
    the course package, what runs inside (``autograder/inside/``); with ``gpu``, the driver's library folders too."""
    pairs = [(p, p) for p in ("/usr", "/etc/ld.so.cache", "/etc/localtime", "/etc/alternatives")]
    for p in {sys.base_prefix, sys.prefix, os.path.realpath(sys.base_prefix)}:
        pairs.append((p, p))
    # Merged-/usr systems have /bin, /lib, /lib64 as links into /usr (made with --symlink below).
    pairs += [(f"/{n}", f"/{n}") for n in ("bin", "lib", "lib64", "lib32", "sbin")
              if os.path.isdir(f"/{n}") and not os.path.islink(f"/{n}")]
    # The course package at its own path, so an editable install's finder and PYTHONPATH both find
    # it; its parent (the repository) appears as an empty folder holding only course/ and coursekit/.
    pairs.append((str(course_dir), str(course_dir)))
    # ...and the student runtime beside it (coursekit: the check framework and visible checks)
    kit = course_dir.parent / "coursekit"
    pairs.append((str(kit), str(kit)))
    pairs.append((str(INSIDE), INSIDE_IN))  # the harness and the zygote (autograder/inside/)
    if gpu:
        pairs += [(d, d) for d in gpu_library_dirs()]
    return [(src, dst) for src, dst in pairs if os.path.exists(src)]


def bwrap_argv(limits: Limits, course_dir: Path = ROOT / "course", staged: bool = False, gpu: bool = False,
               dev_root: str | Path = "/dev", seccomp_fd: int | None = None) -> list[str]:
    """bwrap's arguments. ``staged``: the read-only sources are read from :func:`stage_dir` (bwrap
    runs as an unprivileged uid that may not walk to them: see :func:`_preexec`). ``gpu``: the
    benchmarks run on the GPU, so the NVIDIA device files under ``dev_root`` are bound in
    (:func:`gpu_device_binds`) and the driver's library folders are reachable. ``seccomp_fd``: a
    descriptor bwrap reads the seccomp filter from (:func:`autograder.sandbox.seccomp.memfd`)."""
    course_dir = Path(course_dir).resolve()
    binds = []
    for i, (src, dst) in enumerate(_ro_sources(course_dir, gpu)):
        binds += ["--ro-bind", str(stage_dir(course_dir, gpu) / str(i)) if staged else src, dst]
    hidden = []  # course/hidden: an empty read-only folder (the referee runs the hidden checks: autograder/referee/calls.py)
    if (course_dir / "hidden").is_dir():
        h = str(course_dir / "hidden")
        hidden = ["--size", "4096", "--perms", "0555", "--tmpfs", h, "--remount-ro", h]
    devices = gpu_device_binds(dev_root) if gpu else []
    libs = [d for d in gpu_library_dirs() if os.path.exists(d)] if gpu else []
    links = []
    for n in ("bin", "lib", "lib64", "lib32", "sbin"):
        if os.path.islink(f"/{n}"):
            links += ["--symlink", os.readlink(f"/{n}"), f"/{n}"]
    return [
        shutil.which("bwrap") or "bwrap",
        "--unshare-all", "--unshare-user-try", "--unshare-cgroup-try",
        "--die-with-parent", "--new-session", "--cap-drop", "ALL",
        "--hostname", "sandbox",
        # /tmp first: binds made after it may live under /tmp (a checkout or venv in /tmp/...)
        "--size", str(limits.tmp_mb << 20), "--tmpfs", "/tmp",
        *binds, *links,
        "--proc", "/proc", "--dev", "/dev", *devices,
        "--size", str(limits.tmp_mb << 20), "--tmpfs", "/dev/shm",
        "--perms", "0700", "--size", str(limits.tmp_mb << 20), "--tmpfs", WORK,
        *hidden,
        # bwrap's own root and /dev are tmpfs without a size: read-only, so that the three sized
        # tmpfs (the working directory, /tmp, /dev/shm) are the only places a submission can write
        "--remount-ro", "/dev", "--remount-ro", "/",
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
        # inductor compiles in this process, not in a pool of worker processes: before each test the
        # harness freezes every other process of the sandbox (autograder/inside/harness.py, _stop_others)
        "--setenv", "TORCHINDUCTOR_COMPILE_THREADS", "1",
        # torch.compile runs the student's code eagerly (autograder/inside/harness.py, _eager_compile)
        "--setenv", "TORCH_COMPILE_DISABLE", "1",
        # torch.cuda.is_available() asks NVML instead of initializing the CUDA driver: the grading
        # slot's zygote (autograder/inside/zygote.py) forks a child per submission, and a process that
        # initialized CUDA before fork() cannot use it in the child
        "--setenv", "PYTORCH_NVML_BASED_CUDA_CHECK", "1",
        *(["--setenv", "LD_LIBRARY_PATH", ":".join(libs)] if libs else []),
        *(["--seccomp", str(seccomp_fd)] if seccomp_fd is not None else []),
        "--",
    ]


_stage: list = []


def stage_dir(course_dir: Path, gpu: bool = False) -> Path:
    """Empty mount points, one per read-only source, in a folder every user may walk through.

    When the grader is root, the child that becomes bwrap first takes a private mount namespace
    and binds each source onto its mount point here (:func:`_preexec`), then drops to the
    sandbox's uid: the interpreter may live where that uid cannot walk (``/root/.pyenv``), yet
    bwrap can reach it. The host never sees these mounts; the folder itself stays empty.
    """
    if not _stage:
        import atexit
        import tempfile
        d = Path(tempfile.mkdtemp(prefix="autograde-stage-"))
        d.chmod(0o755)
        _stage.append(d)
        atexit.register(shutil.rmtree, d, True)
    d = _stage[0]
    for i, (src, _) in enumerate(_ro_sources(Path(course_dir).resolve(), gpu)):
        p = d / str(i)
        if not p.exists():
            p.mkdir() if os.path.isdir(src) else p.touch()
    return d


def staged_sources(course_dir: Path, gpu: bool = False) -> list[tuple[str, str]]:
    """(host path, its mount point under :func:`stage_dir`) of every read-only source: what the
    child that becomes bwrap binds before it drops to the sandbox's uid (:func:`_preexec`)."""
    d = stage_dir(course_dir, gpu)
    return [(src, str(d / str(i))) for i, (src, _) in enumerate(_ro_sources(Path(course_dir).resolve(), gpu))]


def _unused(uid: int) -> bool:
    import pwd
    try:
        pwd.getpwuid(uid)
        return False
    except KeyError:
        return True


#: one lock file per sandbox uid, in a folder only root may write: a uid is taken while some process
#: holds an flock on its file. Several grader processes on one machine (``--jobs`` threads, Dask
#: workers, two graders run at once) then never share a uid, and a process that dies, even by
#: SIGKILL, gives its uids back with its open files.
UID_LOCKS = Path("/run/autograder-sandbox-uids")


def _lock_dir() -> Path:
    try:
        with contextlib.suppress(FileExistsError):
            UID_LOCKS.mkdir(mode=0o700)
        st = os.lstat(UID_LOCKS)
    except OSError as e:
        raise SandboxUnavailable(f"cannot make {UID_LOCKS}, where the sandbox uids are leased: "
                                 f"{e.strerror}") from None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022:
        raise SandboxUnavailable(f"{UID_LOCKS} (the sandbox uids' lock files) must be a folder that only root "
                                 "can write: remove it, the grader makes it again")
    return UID_LOCKS


@contextlib.contextmanager
def sandbox_uid(wait_s: float = 0.2):
    """A uid of its own for one sandbox while the grader is root (None otherwise: bwrap then runs
    as the grader's own unprivileged user). Waits while every uid is taken."""
    if os.geteuid() != 0:
        yield None
        return
    locks = _lock_dir()
    while True:
        for uid in _SANDBOX_FREE:
            fd = os.open(locks / str(uid), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            try:
                yield uid
            finally:
                os.close(fd)  # the lock goes with the descriptor
            return
        time.sleep(wait_s)


_SANDBOX_FREE = [u for u in SANDBOX_UIDS if _unused(u)]


def _preexec(limits: Limits, nproc_base: int, uid: int | None, stage: list[tuple[str, str]], gpu: bool = False,
             join: list[str] = ()):
    """What the child that becomes bwrap does before exec: its own session, its cgroup (``join``: the
    ``cgroup.procs`` files it writes itself into, while still root), the staged sources and the
    sandbox's uid, the rlimits."""
    if uid is not None:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        # looked up here, in the parent: the child of a fork makes no symbol lookup (another thread
        # of the parent may hold the dynamic loader's lock, importing an extension, as it forks)
        unshare, mount = libc.unshare, libc.mount
        CLONE_NEWNS, MS_BIND, MS_REC, MS_PRIVATE = 0x00020000, 4096, 16384, 1 << 18

    def apply():
        os.setsid()  # own process group: the parent kills the whole group on timeout
        for path in join:  # before anything it runs allocates: all of it is the submission's
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            os.write(fd, b"0")
            os.close(fd)
        if uid is not None:  # the grader is root: stage the sources, then run bwrap as ``uid``
            if unshare(CLONE_NEWNS) != 0 or mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:
                raise OSError(ctypes.get_errno(), "cannot take a private mount namespace")
            for src, point in stage:
                if mount(src.encode(), point.encode(), None, MS_BIND | MS_REC, None) != 0:
                    raise OSError(ctypes.get_errno(), f"cannot stage {src}")
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        mb = 1 << 20
        # with a GPU the CUDA driver reserves far more address space than any limit worth having
        # (cuInit fails under one): the limit is then on data (writable private memory) instead,
        # and the address space keeps the limit the grader itself runs under
        memory = (resource.RLIMIT_DATA if gpu else resource.RLIMIT_AS, limits.memory_mb * mb)
        for res, val in (
            memory,
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
    oom: bool = False  # the kernel killed a process of it for its cgroup's memory limit


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


class _Tail(threading.Thread):
    """Reads a pipe to its end, keeping only the last ``cap`` bytes: output never touches the disk."""

    def __init__(self, fd: int, cap: int):
        super().__init__(daemon=True)
        self.fd, self.cap, self.data = fd, cap, bytearray()

    def run(self):
        while True:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except OSError:
                break
            if not chunk:
                break
            self.data += chunk
            if len(self.data) > 2 * self.cap:
                del self.data[:-self.cap]
        os.close(self.fd)

    def text(self) -> str:
        return bytes(self.data[-self.cap:]).decode("utf-8", "replace")


def run_sandboxed(cmd: list[str], *, limits: Limits, sandbox: bool = True, course_dir: Path = ROOT / "course",
                  on_start=None, output_cap: int = 64 << 10, pass_fds: tuple = (),
                  scratch: Path | None = None, gpu: bool = False) -> Result:
    """Run ``cmd`` (paths as seen inside) in a fresh sandbox; return when it and its children are gone.

    ``on_start(proc)`` (optional) runs in the calling thread and talks to the process over its stdin
    and the descriptors in ``pass_fds`` (inherited under the same numbers); the wall clock runs
    meanwhile, and stdin is closed after it returns. ``scratch``: with ``sandbox=False`` only, the
    host folder used as the working directory. ``gpu``: give the sandbox the GPU (:func:`bwrap_argv`).
    """
    from autograder.sandbox import cgroups
    from autograder.sandbox import seccomp
    with sandbox_uid() as uid, contextlib.ExitStack() as stack:
        group = cgroups.for_limits(limits)
        if group is not None:
            stack.callback(group.close)
        stage, filter_fd = [], None
        if sandbox:
            filter_fd = seccomp.memfd(seccomp.program())
            stack.callback(os.close, filter_fd)
            pass_fds = (*pass_fds, filter_fd)
            argv = bwrap_argv(limits, course_dir, staged=uid is not None, gpu=gpu, seccomp_fd=filter_fd) + cmd
            if uid is not None:
                stage = staged_sources(course_dir, gpu)
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
            cwd = "/"
        else:  # --no-sandbox: the instructor asked for it explicitly; only the rlimits remain
            argv = [cmd[0] if cmd[0] != "python" else sys.executable] + [
                str(HARNESS) if c == HARNESS_IN else c for c in cmd[1:]]
            env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(scratch),
                   "PYTHONPATH": str(Path(course_dir).resolve().parent), "MPLBACKEND": "Agg",
                   "OMP_NUM_THREADS": str(limits.threads), "TORCHINDUCTOR_COMPILE_THREADS": "1",
                   "TORCH_COMPILE_DISABLE": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
            if gpu and gpu_library_dirs():
                env["LD_LIBRARY_PATH"] = ":".join(gpu_library_dirs())
            cwd, uid = str(scratch), None
        out_r, out_w = os.pipe()
        t0 = time.monotonic()
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=out_w, stderr=out_w,
                                    cwd=cwd, env=env, close_fds=True, pass_fds=tuple(pass_fds),
                                    preexec_fn=_preexec(limits, _user_process_count(
                                        uid if uid is not None else os.getuid()), uid, stage, gpu,
                                        group.join_files() if group is not None else ()))
        finally:
            os.close(out_w)
        tail = _Tail(out_r, output_cap)
        tail.start()
        fired = []

        def expire():
            fired.append(True)
            _kill_group(proc)

        timer = threading.Timer(limits.wall_s, expire)
        timer.daemon = True
        timer.start()
        watch = cgroups.OomWatch(group, lambda: (_kill_group(proc), group.kill()))
        try:
            if on_start is not None:
                on_start(proc)
            try:
                proc.stdin.close()
            except OSError:
                pass
            proc.wait()
        finally:
            timer.cancel()
            oom = watch.stop()
            _kill_group(proc)  # whatever is left of the group (the pid namespace is gone with bwrap)
            proc.wait()
            tail.join(5)
    return Result(proc.returncode, bool(fired), time.monotonic() - t0, tail.text(), oom)


_checked: dict = {}


def ensure_bwrap(course_dir: Path = ROOT / "course", limits: Limits | None = None, imports: bool = True) -> None:
    """Raise :class:`SandboxUnavailable` unless bwrap can build the sandbox on this machine, as the
    user it will run as, with the course's Python importable inside, in a cgroup of its own unless
    ``limits`` says ``cgroups=False`` (:class:`autograder.sandbox.cgroups.CgroupUnavailable` says why not).

    ``imports=False``: the sandbox's Python only finds and reads the course's packages; their imports
    (torch's: seconds of CPU) are left to the caller's first zygote, whose failure to start must then
    stop the run as this would (``autograder.grade.grade_class`` starts one before grading)."""
    from dataclasses import replace
    if shutil.which("bwrap") is not None and (limits is None or limits.cgroups):
        from autograder.sandbox import cgroups
        cgroups.ensure(limits or Limits())  # raises CgroupUnavailable, which says why and what to do
    if imports in _checked or True in _checked:
        ok, why = _checked.get(imports) or _checked[True]
        if not ok:
            raise SandboxUnavailable(why)
        return
    why = None
    if shutil.which("bwrap") is None:
        why = "bubblewrap (bwrap) is not installed: run `make system` (Debian package bubblewrap)"
    else:
        probe = ["python", "-c", "import coursekit.checks, torch, IPython; print('ok')"] if imports else [
            "python", "-c", "import importlib.util as u\n"
            "for m in ('coursekit', 'torch', 'IPython'):\n"
            "    open(u.find_spec(m).origin, 'rb').close()\n"
            "print('ok')"]
        res = run_sandboxed(probe, limits=replace(limits or Limits(), wall_s=120), course_dir=course_dir)
        if res.returncode != 0 or res.output.strip().splitlines()[-1:] != ["ok"]:
            who = "" if os.geteuid() != 0 else f" as the unprivileged uid {SANDBOX_UIDS[0]}"
            why = (f"bwrap cannot run the course's Python in its sandbox{who} (exit {res.returncode}): "
                   f"{res.output.strip()[-800:]}\n(Every folder on the way to the virtual environment "
                   "and the course must be readable by that user, and unprivileged user namespaces "
                   "must be allowed.)")
    _checked[imports] = (why is None, why)
    if why:
        raise SandboxUnavailable(
            why + "\nThe grader never runs submissions unsandboxed on its own; if you trust them, "
                  "pass --no-sandbox.")
