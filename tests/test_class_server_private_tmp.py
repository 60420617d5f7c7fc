"""Each user's server, and what root runs as a user, keeps its temporary files and compiled code in
folders of its own (class_server.spawner.PRIVATE_DIRS: TMPDIR, TORCHINDUCTOR_CACHE_DIR,
TRITON_CACHE_DIR, in the user's home, 0700).

The red team's hole: torch.compile writes the kernels it generates from a student's code to
``/tmp/torchinductor_<user>`` (``tempfile.gettempdir()``), made 0755 and used whoever owns it; another
student can read it, or make it first, 0777, and read and write everything compiled there.

Real accounts (made here, removed afterwards): mallory makes ``/tmp/torchinductor_<alice>`` 0777;
alice's server process (the hub's spawner's environment and preexec, the system's Python standing in
for the server) finds its TMPDIR and torch's cache folder in her home, 0700, and torch, given that
environment, resolves its cache there, not to mallory's folder. The class server's own tests
(tests/test_class_server.py) compile with torch.compile as a student in the class's Python.
"""
from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from class_server import spawner as sp

pytestmark = pytest.mark.hub


@pytest.fixture()
def accounts():
    if os.geteuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser"):
        pytest.skip("makes unix accounts: needs root, useradd and runuser")
    users = [f"rnpt{os.getpid() % 10000}{n}" for n in ("a", "m")]
    for u in users:
        subprocess.run(["userdel", "-r", u], capture_output=True)
        subprocess.run(["useradd", "-m", "-s", "/bin/sh", u], check=True, capture_output=True)
    try:
        yield users
    finally:
        for u in users:
            subprocess.run(["pkill", "-KILL", "-u", u], capture_output=True)
            subprocess.run(["userdel", "-r", u], capture_output=True)
            shutil.rmtree(f"/tmp/torchinductor_{u}", ignore_errors=True)


PROBE = ("import json, os, stat, tempfile; d = {k: os.environ.get(k) for k in ('TMPDIR', 'TORCHINDUCTOR_CACHE_DIR', "
         "'TRITON_CACHE_DIR')}; print(json.dumps({'uid': os.getuid(), 'tmp': tempfile.gettempdir(), 'env': d, "
         "'modes': {k: [stat.S_IMODE(os.lstat(v).st_mode), os.lstat(v).st_uid] for k, v in d.items() if v}}))")


def test_a_users_server_gets_private_tmp_and_compile_caches(accounts):
    alice, mallory = accounts
    home = pwd.getpwnam(alice).pw_dir
    trap = Path(f"/tmp/torchinductor_{alice}")
    shutil.rmtree(trap, ignore_errors=True)
    subprocess.run(["runuser", "-u", mallory, "--", "mkdir", "-m", "0777", str(trap)], check=True)
    subprocess.run(["runuser", "-u", mallory, "--", "chmod", "0777", str(trap)], check=True)

    s = sp.LimitedSpawner(limits=False)
    s.user = SimpleNamespace(name=alice)
    env = dict(s.user_env({}), PATH="/usr/bin:/bin")
    proc = subprocess.run(["/usr/bin/python3", "-c", PROBE], env=env, preexec_fn=s.make_preexec_fn(alice),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    uid = pwd.getpwnam(alice).pw_uid
    assert got["uid"] == uid
    assert set(got["env"]) == {"TMPDIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"}
    for k, v in got["env"].items():
        assert v and v.startswith(home + "/"), (k, v)
        assert got["modes"][k] == [0o700, uid], (k, got["modes"])
    assert got["tmp"] == got["env"]["TMPDIR"]

    # torch, given that environment, compiles into her folder, never into the one mallory made
    code = "import torch._inductor.runtime.cache_dir_utils as c; print(c.cache_dir())"
    torch_env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=got["env"]["TORCHINDUCTOR_CACHE_DIR"],
                     TMPDIR=got["env"]["TMPDIR"])
    where = subprocess.run([sys.executable, "-c", code], env=torch_env, capture_output=True, text=True, timeout=120)
    assert where.returncode == 0, where.stderr[-2000:]
    assert where.stdout.strip() == got["env"]["TORCHINDUCTOR_CACHE_DIR"]
    assert list(trap.iterdir()) == []


def test_a_link_in_place_of_a_private_folder_stops_the_start(accounts):
    """A folder that is not the user's own (here the user's own link to /tmp) is refused, not used."""
    alice, _ = accounts
    home = Path(pwd.getpwnam(alice).pw_dir)
    subprocess.run(["runuser", "-u", alice, "--", "ln", "-s", "/tmp", str(home / ".tmp")], check=True)
    s = sp.LimitedSpawner(limits=False)
    s.user = SimpleNamespace(name=alice)
    with pytest.raises(subprocess.SubprocessError, match="preexec_fn"):
        subprocess.run(["/usr/bin/true"], env={"PATH": "/usr/bin:/bin"}, preexec_fn=s.make_preexec_fn(alice),
                       capture_output=True, timeout=60)
    assert os.path.islink(home / ".tmp")  # left as she made it
