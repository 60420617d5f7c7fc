"""JupyterHub's LocalProcessSpawner with limits per user: one control group per user's server.

Each user's server (and everything it starts: kernels, terminals, ``nbgrader``, a grader run) is
put in a cgroup of its own, made by the hub (root) below the hub's cgroup, with JupyterHub's own
knobs as its limits:

- ``Spawner.mem_limit``: memory of all the server's processes together (swap included);
- ``Spawner.cpu_limit``: CPU time, in cores (the cgroup's quota);
- ``LimitedSpawner.pids_limit``: processes and threads together.

The class server sets them per role (``class.json``'s ``limits``, from ``up``'s flags). The groups
come from the grader's own cgroup code (``autograder/sandbox/cgroups.py``, installed into the class's
Python as ``class_server_cgroups``; cgroup v2, or v1 with the memory, pids and cpu controllers).

A server whose processes go over their memory: the kernel kills one of them (cgroup v2 kills the
whole group, ``memory.oom.group``); the hub sees the memory kill within ``oom_check_s`` seconds,
stops the rest of that server, writes a line saying so in its log and tells the user on their next
start ("Your last server was stopped: ...", the spawn page's first message). No other user's server
is in that group, so the kernel never picks one of theirs.

With ``delegate`` (instructors: they grade on the hub), the group's folder and its ``cgroup.procs``
(and v1's ``tasks``) are given to the user, so that the grader they run makes a cgroup per
submission inside their own (``python -m autograder grade`` without ``--no-cgroups``); the limit
files stay root's, so the user's own limits cannot be raised, and the kernel keeps every child
inside them.

Each server gets folders of its own for temporary files and compiled code (:data:`PRIVATE_DIRS`:
``TMPDIR``, ``TORCHINDUCTOR_CACHE_DIR``, ``TRITON_CACHE_DIR``), in the user's home, mode 0700, made by
the server's process itself once it is the user (:func:`make_private_dirs`). torch.compile's default
is ``/tmp/torchinductor_<user>``, which it neither checks the owner of nor makes private (0755): another
student could read the compiled kernels (the student's code), or make that folder first, 0777.

Each server's port comes from :func:`server_port`, below the kernel's ephemeral range and never one
this hub has handed to a server still running. JupyterHub's own choice (``random_port``: bind port
0, close, hand the number on) lets two servers started at once get the same port, or an outgoing
connection take it first; the hub then finds *another* user's server on that port, calls the new one
ready, and the user's requests meet that other server's 404 (jupyterhub/batchspawner#58 saw the
same with 30 students on one node). Those ports are public: a student can bind them all. Every one
is tried, then another free port is taken, and the hub's log names who holds the range (by the
uid of each socket, :func:`port_holders`); a start fails only when no port is free at all.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
from pathlib import Path

import itertools
import random
import socket
import struct

from jupyterhub.spawner import LocalProcessSpawner
from traitlets import Bool, Float, Integer

try:
    import class_server_cgroups as cgroups  # the copy in the class's Python
except ImportError:  # pragma: no cover - from a checkout
    from autograder.sandbox import cgroups


#: each user's own folders, relative to their home (0700): what torch.compile, Triton and every
#: ``tempfile`` user would otherwise put in a folder of /tmp that anyone can name, or make, first
PRIVATE_DIRS = {"TMPDIR": ".tmp", "TORCHINDUCTOR_CACHE_DIR": ".cache/torchinductor", "TRITON_CACHE_DIR": ".cache/triton"}
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def private_env(home: str) -> dict[str, str]:
    """The environment naming a user's :data:`PRIVATE_DIRS` (their home ``home``)."""
    return {k: os.path.join(home, v) for k, v in PRIVATE_DIRS.items()}


def make_private_dirs(home: str) -> None:
    """Make the :data:`PRIVATE_DIRS` below ``home``, as the user (after setuid): each component made
    0700 if missing, opened without following a link, and refused unless it is a folder of this user's
    own; each folder's mode is then set to 0700. A :class:`PermissionError` says which one is not."""
    uid = os.getuid()
    top = os.open(home, _DIR)
    try:
        if os.fstat(top).st_uid != uid:
            raise PermissionError(f"{home} is not this user's own folder (uid {uid})")
        for rel in PRIVATE_DIRS.values():
            fd = os.dup(top)
            try:
                path = home
                for name in rel.split("/"):
                    path = os.path.join(path, name)
                    try:
                        os.mkdir(name, 0o700, dir_fd=fd)
                    except FileExistsError:
                        pass
                    try:
                        sub = os.open(name, _DIR | os.O_NOFOLLOW, dir_fd=fd)
                    except OSError as e:
                        raise PermissionError(f"{path} is not a folder ({e.strerror}; a symbolic link?)") from None
                    os.close(fd)
                    fd = sub
                    if os.fstat(fd).st_uid != uid:
                        raise PermissionError(f"{path} is not this user's own folder")
                os.fchmod(fd, 0o700)
            finally:
                os.close(fd)
    finally:
        os.close(top)


#: the servers' ports now handed out by this hub (one process, one event loop: no lock needed)
_PORTS_TAKEN: set[int] = set()


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel gives to bind(0) and to outgoing connections (Linux's default if unread)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _tcp_sockets_netlink() -> list[tuple[int, int, int]]:
    """(state, local port, owner uid) of every TCP socket of this network namespace, IPv4 and IPv6,
    from the kernel's sock_diag (netlink): listening, connected, and (Linux 6.8 on) bound only."""
    out = []
    for family in (socket.AF_INET, socket.AF_INET6):
        with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, 4) as s:  # NETLINK_SOCK_DIAG
            req = struct.pack("=BBBBI", family, socket.IPPROTO_TCP, 0, 0, 0xFFFFFFFF) + bytes(48)
            s.sendto(struct.pack("=IHHII", 16 + len(req), 20, 0x301, 1, 0) + req, (0, 0))  # SOCK_DIAG_BY_FAMILY, dump
            s.settimeout(5)
            done = False
            while not done:
                data, off = s.recv(1 << 16), 0
                while off + 16 <= len(data):
                    length, kind = struct.unpack_from("=IH", data, off)
                    if kind == 3:  # NLMSG_DONE
                        done = True
                        break
                    if kind == 2:  # NLMSG_ERROR
                        raise OSError(-struct.unpack_from("=i", data, off + 16)[0], "sock_diag refused")
                    state = data[off + 17]
                    port = struct.unpack_from(">H", data, off + 20)[0]
                    uid = struct.unpack_from("=I", data, off + 80)[0]
                    out.append((state, port, uid))
                    off += (length + 3) & ~3
    return out


def _tcp_sockets_proc() -> list[tuple[int, int, int]]:
    """The same from /proc/net/tcp and tcp6 (which list no socket that is only bound)."""
    out = []
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            try:
                out.append((int(f[3], 16), int(f[1].rsplit(":", 1)[1], 16), int(f[7])))
            except (IndexError, ValueError):
                continue
    return out


#: TCP states of a socket that holds its local port for itself: listening, closed but bound (the
#: kernel's sock_diag reports bound-only sockets as TCP_CLOSE, or TCP_BOUND_INACTIVE)
_HOLDING = {7, 10, 13}


def port_holders(first: int, end: int) -> dict[int, int]:
    """uid -> how many ports in ``first..end-1`` that user's TCP sockets hold (listening or bound)."""
    try:
        sockets = _tcp_sockets_netlink()
    except (OSError, struct.error, IndexError):  # no sock_diag here, or a reply this parser does not read
        sockets = _tcp_sockets_proc()
    ports: dict[int, set[int]] = {}
    for state, port, uid in sockets:
        if state in _HOLDING and first <= port < end:
            ports.setdefault(uid, set()).add(port)
    return {uid: len(p) for uid, p in sorted(ports.items(), key=lambda kv: -len(kv[1]))}


def _who(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def describe_holders(first: int, end: int, most: int = 5) -> str:
    """Who holds the ports of ``first..end-1``: "alice (uid 1001) holds 4095, ..." (the top ``most``)."""
    held = port_holders(first, end)
    if not held:
        return f"no socket of this machine's users holds a port in {first}..{end - 1} now"
    names = [f"{_who(uid)} holds {n}" for uid, n in list(held.items())[:most]]
    rest = len(held) - most
    return (f"ports in {first}..{end - 1} held by: " + ", ".join(names)
            + (f", and {rest} other user{'s' if rest > 1 else ''}" if rest > 0 else ""))


def _bind_free(ip: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((ip or "127.0.0.1", port))
            return True
        except OSError:
            return False


def _kernel_port(ip: str, tries: int) -> int:
    """A free port the kernel picks (bind 0: in the ephemeral range, where an outgoing connection may
    take it before the server binds it), none this hub handed out; 0 if there is none."""
    for _ in range(tries):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((ip or "127.0.0.1", 0))
            except OSError:
                return 0
            if s.getsockname()[1] not in _PORTS_TAKEN:
                return s.getsockname()[1]
    return 0


def server_port(ip: str = "127.0.0.1", span: int = 4096, tries: int = 200, log=None) -> int:
    """A port for a user's server: in the ``span`` ports just below the ephemeral range (which
    bind(0) and outgoing connections never use), none this hub has handed to a running server, and
    free now (a bind to it succeeds). Give it back with :func:`release_port`.

    Every port of that range is tried before any other (random draws first, then each in turn).
    When none is free (a user can bind them all: they are public), the users whose sockets hold them
    are named in a warning on ``log``, and the port is any other free one (a random one outside the
    ephemeral range, else one the kernel picks with bind(0)); only when there is none at all is it a
    :class:`RuntimeError`, which names them too (JupyterHub shows it as the start's error)."""
    low, high = ephemeral_range()
    first, end = max(1024, low - span), low
    if first >= end:  # the ephemeral range starts at 1024 or below: the ports above it, else any
        first, end = (high + 1, min(65536, high + 1 + span)) if high < 65535 else (1024, 65536)
    for _ in range(tries):
        port = random.randrange(first, end)
        if port not in _PORTS_TAKEN and _bind_free(ip, port):
            _PORTS_TAKEN.add(port)
            return port
    start = random.randrange(first, end)
    for port in itertools.chain(range(start, end), range(first, start)):
        if port not in _PORTS_TAKEN and _bind_free(ip, port):
            _PORTS_TAKEN.add(port)
            return port
    who = describe_holders(first, end)
    outside = [p for p in (random.randrange(1024, 65536) for _ in range(tries)) if not low <= p <= high]
    for port in outside:
        if port not in _PORTS_TAKEN and _bind_free(ip, port):
            break
    else:
        port = _kernel_port(ip, tries)
    if not port:
        raise RuntimeError(f"no free port for a user's server in {first}..{end - 1}, nor any other; {who}")
    if log is not None:
        log.warning("No free port for a user's server in %d..%d (%s): using port %d outside it", first, end - 1,
                    who, port)
    _PORTS_TAKEN.add(port)
    return port


def release_port(port: int) -> None:
    _PORTS_TAKEN.discard(port)


class LimitedSpawner(LocalProcessSpawner):
    pids_limit = Integer(512, config=True, help="Processes and threads of one user's server together (0: none).")
    oom_check_s = Float(2.0, config=True, help="How often the hub looks for a memory kill in a user's server.")
    delegate = Bool(False, config=True,
                    help="Give the user their group's folder, so that their grader makes groups inside it.")
    limits = Bool(True, config=True, help="False: no cgroup (a plain LocalProcessSpawner).")

    _group = None
    _watch = None
    #: user -> why the hub stopped their last server (the hub makes a new Spawner for each start)
    stopped_why: dict[str, str] = {}

    def _mb(self) -> int:
        return int(self.mem_limit or 0) >> 20

    def _make_group(self):
        self._close_group()
        if not self.limits:
            return None
        mb = self._mb() or cgroups.default_memory_mb(1)
        cpus = float(self.cpu_limit or os.cpu_count() or 1)
        nproc = int(self.pids_limit or 1 << 22)
        group = cgroups.create(mb, nproc, cpus)
        if self.delegate:
            pw = pwd.getpwnam(self.user.name)
            for d in group.dirs:
                os.chown(d, pw.pw_uid, pw.pw_gid)
                for name in ("cgroup.procs", "tasks", "cgroup.subtree_control"):
                    with contextlib.suppress(FileNotFoundError):
                        os.chown(d / name, pw.pw_uid, pw.pw_gid)
        self.log.info("%s's server: cgroup %s (memory %d MiB, %g CPUs, %d processes%s)", self.user.name,
                      group.dirs[0].name, mb, cpus, nproc, ", delegated" if self.delegate else "")
        return group

    def _close_group(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None
        if self._group is not None:
            group, self._group = self._group, None
            for d in group.dirs:  # the groups a delegated user made inside, deepest first (v1 lists
                subs = sorted((p for p in d.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
                for sub in subs:  # only each group's own processes in cgroup.procs)
                    cgroups.Group(group.version, [sub]).close(wait_s=5)
            group.kill()
            group.close(wait_s=5)

    def make_preexec_fn(self, name):
        setuid = super().make_preexec_fn(name)
        joins = self._group.join_files() if self._group is not None else []

        home = pwd.getpwnam(name).pw_dir

        def preexec():  # in the child, still root: join the group, then become the user
            for f in joins:
                fd = os.open(f, os.O_WRONLY | os.O_CLOEXEC)
                try:
                    os.write(fd, str(os.getpid()).encode())
                finally:
                    os.close(fd)
            setuid()
            make_private_dirs(home)  # as the user: nothing of root's follows a path the user can write

        return preexec

    def user_env(self, env):
        env = super().user_env(env)
        if env.get("HOME"):
            env.update(private_env(env["HOME"]))
        return env

    async def progress(self):
        why = self.stopped_why.pop(self.user.name, "")
        if why:
            yield {"progress": 10, "message": f"Your last server was stopped: {why}"}
        async for event in super().progress():
            yield event

    _own_port = 0  # the port server_port gave this server and this hub holds for it (0: none)
    _ports_ours = False  # Spawner.port was not configured: every start takes a port from server_port

    async def start(self):
        if self.port == 0 or self._ports_ours:
            self._release_port()
            self.port = self._own_port = server_port(self.ip, log=self.log)
            self._ports_ours = True
        self._group = self._make_group()
        try:
            ip_port = await super().start()
        except BaseException:
            self._close_group()
            self._release_port()
            raise
        if self._group is not None:
            self._watch = asyncio.ensure_future(self._watch_memory(self._group))
        return ip_port

    async def _watch_memory(self, group) -> None:
        while True:
            await asyncio.sleep(self.oom_check_s)
            if group is not self._group:
                return
            if group.oom_killed():
                break
        mb = self._mb() or cgroups.default_memory_mb(1)
        why = (f"its processes together went over the memory limit of {mb} MiB and the kernel "
                             f"killed one of them; the hub stopped the rest (start it again, and use less memory)")
        self.stopped_why[self.user.name] = why
        self.log.warning("Stopping %s's server: %s", self.user.name, why)
        group.kill()
        self._watch = None
        with contextlib.suppress(Exception):
            await self.wait_for_death(10)
        with contextlib.suppress(Exception):
            await self.poll_and_notify()  # the hub marks the server stopped now, not at its next poll

    def _release_port(self) -> None:
        if self._own_port:
            release_port(self._own_port)
            self._own_port = 0

    async def poll(self):
        status = await super().poll()
        if status is not None:
            if self._group is not None:
                self._close_group()
            self._release_port()
        return status

    async def stop(self, now=False):
        await super().stop(now=now)
        self._close_group()
        self._release_port()

    def get_state(self):
        state = super().get_state()
        if self._group is not None:
            state["cgroup"] = {"version": self._group.version, "dirs": [str(d) for d in self._group.dirs]}
        return state

    def load_state(self, state):
        super().load_state(state)
        g = state.get("cgroup")
        if g and self._group is None:
            self._group = cgroups.Group(g["version"], [Path(d) for d in g["dirs"]])
