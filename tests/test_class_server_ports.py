"""Each user's server gets a port no other server and no outgoing connection can hold (class_server.spawner).

A CI run of the class load test saw a student's kernel request answered 404 by a Jupyter server
that was not theirs: JupyterHub's ``random_port`` hands out a number from the kernel's ephemeral
range (bind port 0, close), which another server started at the same moment, or an outgoing
connection, can take before the user's server binds it.
"""
from __future__ import annotations

import asyncio
import socket

import pytest

from class_server import spawner as sp


def test_the_stock_choice_is_in_the_range_outgoing_connections_use():
    from jupyterhub.utils import random_port

    low, high = sp.ephemeral_range()
    assert all(low <= random_port() <= high for _ in range(20))


def test_servers_ports_are_distinct_and_below_the_ephemeral_range(monkeypatch):
    monkeypatch.setattr(sp, "_PORTS_TAKEN", set())
    low, _ = sp.ephemeral_range()
    ports = [sp.server_port() for _ in range(300)]
    assert len(set(ports)) == 300
    assert all(low - 4096 <= p < low for p in ports)


def test_an_ephemeral_range_from_1024_up_leaves_the_ports_above_it(monkeypatch):
    monkeypatch.setattr(sp, "_PORTS_TAKEN", set())
    monkeypatch.setattr(sp, "ephemeral_range", lambda: (1024, 49999))
    assert all(50000 <= sp.server_port() < 50000 + 4096 for _ in range(20))
    monkeypatch.setattr(sp, "ephemeral_range", lambda: (1024, 65535))  # nothing outside it: any free port
    assert 1024 <= sp.server_port() < 65536


def test_a_port_held_by_a_running_server_or_another_listener_is_never_handed_out(monkeypatch):
    monkeypatch.setattr(sp, "_PORTS_TAKEN", set())
    with socket.socket() as listener:
        low, _ = sp.ephemeral_range()
        for busy in range(low - 4096, low):
            try:
                listener.bind(("127.0.0.1", busy))
                break
            except OSError:
                continue
        listener.listen()
        free = next(p for p in range(low - 1, low - 4096, -1) if p != busy and _free(p))
        draws = iter([busy, free, free, busy, free])
        monkeypatch.setattr(sp.random, "randrange", lambda a, b: next(draws))
        assert sp.server_port() == free  # the listener's port is skipped
        with pytest.raises(StopIteration):  # the running server's port is skipped too, every time
            sp.server_port()
    sp.release_port(free)
    monkeypatch.setattr(sp.random, "randrange", lambda a, b: free)
    assert sp.server_port() == free  # given back when that server stopped


def test_a_spawner_takes_a_new_port_for_each_start_and_gives_it_back_when_it_stops(monkeypatch):
    from jupyterhub.spawner import LocalProcessSpawner

    monkeypatch.setattr(sp, "_PORTS_TAKEN", set())
    bound = []

    async def start(self):
        bound.append(self.port)
        return ("127.0.0.1", self.port)

    async def stop(self, now=False):
        return None

    monkeypatch.setattr(LocalProcessSpawner, "start", start)
    monkeypatch.setattr(LocalProcessSpawner, "stop", stop)
    s = sp.LimitedSpawner(limits=False)
    asyncio.run(s.start())
    assert sp._PORTS_TAKEN == {bound[0]}
    asyncio.run(s.stop())
    assert sp._PORTS_TAKEN == set()
    asyncio.run(s.start())  # a second start does not reuse the old number as if it were configured
    assert sp._PORTS_TAKEN == {bound[1]}
    fixed = sp.LimitedSpawner(limits=False, port=bound[1] + 1)  # a configured port is kept
    asyncio.run(fixed.start())
    assert bound[-1] == bound[1] + 1 and sp._PORTS_TAKEN == {bound[1]}


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


# A student holds every port of the servers' range (the red team's squat.py: binds, never listens;
# here a third listen too, and some on every address): each one's socket is theirs, by uid.
SQUAT = """
import socket, sys
first, end = int(sys.argv[1]), int(sys.argv[2])
held = []
for i, p in enumerate(range(first, end)):
    s = socket.socket()
    try:
        s.bind(("0.0.0.0" if i % 2 else "127.0.0.1", p))
    except OSError:
        s.close()
        continue
    if i % 3 == 0:
        s.listen()
    held.append(s)
print(len(held), flush=True)
sys.stdin.read()
"""


@pytest.fixture()
def squatter():
    import os
    import pwd
    import shutil
    import subprocess

    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser"):
        pytest.skip("makes a unix account: needs root, useradd and runuser")
    user = f"rnsq{os.getpid() % 10000}"
    subprocess.run(["userdel", "-r", user], capture_output=True)
    subprocess.run(["useradd", "-m", "-s", "/bin/sh", user], check=True, capture_output=True)
    procs = []

    def squat(first: int, end: int) -> int:
        p = subprocess.Popen(["runuser", "-u", user, "--", "/usr/bin/python3", "-c", SQUAT, str(first), str(end)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        procs.append(p)
        return int(p.stdout.readline())

    try:
        yield user, pwd.getpwnam(user).pw_uid, squat
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=30)
        subprocess.run(["pkill", "-KILL", "-u", user], capture_output=True)
        subprocess.run(["userdel", "-r", user], capture_output=True)


def test_a_student_holding_every_port_of_the_range_stops_no_start_and_is_named(monkeypatch, squatter, caplog):
    import logging

    user, uid, squat = squatter
    monkeypatch.setattr(sp, "_PORTS_TAKEN", set())
    low, high = sp.ephemeral_range()
    first, end = low - 64, low
    held = squat(first, end)
    assert held > 0 and not any(_free(p) for p in range(first, end))
    port = sp.server_port(span=64)  # before: "no free port ... after 200 tries", every start failed
    assert not first <= port < end and _free(port) and port in sp._PORTS_TAKEN
    assert sp.port_holders(first, end).get(uid) == held  # bound-only and listening sockets alike
    log = logging.getLogger("test-ports")
    with caplog.at_level(logging.WARNING, logger="test-ports"):
        sp.server_port(span=64, log=log)
    assert f"{user} (uid {uid}) holds {held}" in caplog.text, caplog.text
    # with no other port anywhere, the start's error names them too
    monkeypatch.setattr(sp, "_bind_free", lambda ip, port: False)
    monkeypatch.setattr(sp, "_kernel_port", lambda ip, tries: 0)
    with pytest.raises(RuntimeError, match=rf"{user} \(uid {uid}\) holds {held}"):
        sp.server_port(span=64)
