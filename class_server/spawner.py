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
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
from pathlib import Path

from jupyterhub.spawner import LocalProcessSpawner
from traitlets import Bool, Float, Integer

try:
    import class_server_cgroups as cgroups  # the copy in the class's Python
except ImportError:  # pragma: no cover - from a checkout
    from autograder.sandbox import cgroups


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

        def preexec():  # in the child, still root: join the group, then become the user
            for f in joins:
                fd = os.open(f, os.O_WRONLY | os.O_CLOEXEC)
                try:
                    os.write(fd, str(os.getpid()).encode())
                finally:
                    os.close(fd)
            setuid()

        return preexec

    async def progress(self):
        why = self.stopped_why.pop(self.user.name, "")
        if why:
            yield {"progress": 10, "message": f"Your last server was stopped: {why}"}
        async for event in super().progress():
            yield event

    async def start(self):
        self._group = self._make_group()
        try:
            ip_port = await super().start()
        except BaseException:
            self._close_group()
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

    async def poll(self):
        status = await super().poll()
        if status is not None and self._group is not None:
            self._close_group()
        return status

    async def stop(self, now=False):
        await super().stop(now=now)
        self._close_group()

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
