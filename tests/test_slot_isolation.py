"""A grading slot's children (:mod:`autograder.sandbox.slots`, :mod:`autograder.inside.zygote`) against submissions
that try to leave their sandbox, reach the pre-imported interpreter they were forked from, or leave
something behind for the next submission of the same slot.

Each attempt runs as a notebook cell in a real slot, through the same harness and protocol as a
graded submission; the cell prints a JSON report, and the tests assert on it and on the host.
"""
from __future__ import annotations

import json
import os
import site
from pathlib import Path

import pytest

from autograder.referee import protocol
from autograder.sandbox.bwrap import SANDBOX_UIDS, Limits
from autograder.sandbox.slots import Slot
from course.release import ROOT

pytestmark = [pytest.mark.autograder, pytest.mark.slow]

ATTEMPTS = r'''
import ctypes, json, os, socket, subprocess, sys
import course
libc = ctypes.CDLL(None, use_errno=True)
status = open("/proc/self/status").read()
field = lambda k: status.split(k + ":")[1].split()[0]
import resource
r = {"uid": os.getuid(), "pid": os.getpid(), "cpu_limit": resource.getrlimit(resource.RLIMIT_CPU)[1], "capeff": field("CapEff"), "capprm": field("CapPrm"),
     "capbnd": field("CapBnd"), "nonewprivs": field("NoNewPrivs")}
pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
r["pids"] = sorted(pids)
cmdlines = []  # of every process but this one and the namespace's init (forks of the zygote:
for p in pids:  # their command lines say so)
    if p in (1, os.getpid()):
        continue
    try:
        cmdlines.append(open(f"/proc/{p}/cmdline", "rb").read().decode(errors="replace"))
    except OSError:
        pass
r["sees_zygote"] = any("zygote" in c for c in cmdlines)
def sh(cmd):
    return subprocess.run(cmd, shell=True, capture_output=True, text=True).returncode
r["umount_proc"] = sh("umount /proc")
r["umount_tmp"] = sh("umount /tmp")
r["umount_work"] = sh("umount /home/student")
r["mount_tmpfs"] = libc.mount(b"tmpfs", b"/mnt", b"tmpfs", 0, None)
r["remount_venv_rw"] = sh(f"mount -o remount,rw,bind {sys.prefix}")
CLONE_NEWUSER, CLONE_NEWNS = 0x10000000, 0x20000
r["new_userns"] = libc.unshare(CLONE_NEWUSER | CLONE_NEWNS)
# the harness has threads (unshare(CLONE_NEWUSER) then fails with EINVAL anyway): try again from a
# single-threaded child, where only the max_user_namespaces knob and the lost capabilities stop it
pid = os.fork()
if pid == 0:
    rc = libc.unshare(CLONE_NEWUSER | CLONE_NEWNS)
    os._exit(0 if rc == 0 else min(ctypes.get_errno(), 255))
r["new_userns_single_thread_errno"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
def write(path):
    try:
        with open(path, "w") as f:
            f.write("import os\n")
        return "written"
    except OSError as e:
        return e.errno
r["pth"] = write(os.path.join(__import__("site").getsitepackages()[0], "zz_pwned.pth"))
r["course_file"] = write(os.path.join(os.path.dirname(course.__file__), "pwned.py"))
s = socket.socket(); s.settimeout(2)
try:
    s.connect(("10.0.0.1", 80)); r["network"] = "connected"
except OSError as e:
    r["network"] = e.errno
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
c = socket.create_connection(srv.getsockname(), timeout=2); r["loopback"] = True
r["hostname"] = socket.gethostname()
print("RESULT " + json.dumps(r))
'''

PLANT = r'''
import os, subprocess
for d in ("/tmp", "/home/student", "/dev/shm"):
    open(os.path.join(d, "left_behind"), "w").write("x")
subprocess.Popen(["sleep", "1000"], start_new_session=True)
print("PLANTED")
'''

LOOK = r'''
import json, os
print("RESULT " + json.dumps({d: os.path.exists(os.path.join(d, "left_behind")) for d in ("/tmp", "/home/student", "/dev/shm")}
                             | {"procs": sorted(int(p) for p in os.listdir("/proc") if p.isdigit())}))
'''


def run_cell(slot: Slot, source: str):
    """Run ``source`` as the only cell of a submission in a fresh child of ``slot``."""
    reply_r, reply_w = os.pipe()
    box = {}

    def on_start(child):
        os.close(reply_w)
        box["closed"] = True
        box["tr"] = protocol.converse(child.stdin, protocol.Channel(reply_r),
                                      [{"kind": "cell", "label": "attempt", "source": source}],
                                      {"cell_s": 60}, step_s=90, measure=None)
        child.wait(10)

    try:
        res = slot.run(on_start, reply_w)
    finally:
        os.close(reply_r)
        if not box.get("closed"):
            os.close(reply_w)
    return res, box.get("tr") or protocol.Transcript(broke="no child started")


def report(res) -> dict:
    line = next((l for l in res.output.splitlines() if l.startswith("RESULT ")), None)
    assert line, res.output
    return json.loads(line[len("RESULT "):])


@pytest.fixture(scope="module")
def slot():
    s = Slot(Limits(wall_s=120))
    yield s
    s.close()


@pytest.fixture(scope="module")
def attempts(slot):
    res, tr = run_cell(slot, ATTEMPTS)
    assert tr.finished, (tr.broke, res.output)
    return report(res)


SEEDS = r'''
import json, random
import numpy, torch
print("RESULT " + json.dumps({"torch": torch.initial_seed(), "torch_draw": torch.rand(1).item(),
                              "numpy": numpy.random.random(), "random": random.random()}))
'''


def test_each_submission_of_a_slot_gets_fresh_random_seeds(slot):
    """torch, numpy and Python's random are reseeded in each child: two submissions forked from the same
    zygote do not draw the same numbers (nor could one tell what the next will draw)."""
    first, second = (report(run_cell(slot, SEEDS)[0]) for _ in range(2))
    for k in ("torch", "torch_draw", "numpy", "random"):
        assert first[k] != second[k], (k, first, second)


def test_child_has_no_capability_and_no_new_privileges(attempts):
    assert attempts["capeff"] == attempts["capprm"] == attempts["capbnd"] == "0" * 16
    assert attempts["nonewprivs"] == "1"


@pytest.mark.skipif(os.geteuid() != 0, reason="the uid switch happens when the grader runs as root")
def test_child_runs_as_the_slots_unprivileged_uid(attempts):
    assert attempts["uid"] in SANDBOX_UIDS


def test_each_child_has_the_submissions_cpu_limit_and_the_zygote_a_longer_one(slot, attempts):
    """RLIMIT_CPU counts a process's whole life: the zygote, alive for a whole class, must not run
    into a submission's limit; each child sets the submission's own."""
    from autograder.sandbox.slots import ZYGOTE_CPU_S
    assert attempts["cpu_limit"] == slot.limits.cpu_s
    zygotes = sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and "zygote.py" in _cmdline(p)
                     and _cmdline(p).endswith(f" {slot.limits.tmp_mb} {slot.limits.cpu_s}")
                     and _is_descendant(int(p), slot.proc.pid))
    assert zygotes
    limits = Path(f"/proc/{zygotes[0]}/limits").read_text()  # the oldest: the zygote, not a child
    assert f"Max cpu time              {ZYGOTE_CPU_S}" in limits, limits


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _is_descendant(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def test_child_runs_under_its_own_init_and_cannot_see_the_zygote(attempts):
    assert attempts["pid"] == 2  # pid 1 is the namespace's minimal init
    assert attempts["sees_zygote"] is False
    assert max(attempts["pids"]) < 50  # only what the cell itself started


def test_child_cannot_unmount_or_mount_or_make_a_user_namespace(attempts):
    for key in ("umount_proc", "umount_tmp", "umount_work", "mount_tmpfs", "remount_venv_rw", "new_userns"):
        assert attempts[key] != 0, key
    assert attempts["new_userns_single_thread_errno"] in (1, 28)  # EPERM, or ENOSPC: the knob at 0


def test_child_cannot_write_the_graders_python_or_course(attempts):
    assert attempts["pth"] != "written" and attempts["course_file"] != "written"
    assert not Path(site.getsitepackages()[0], "zz_pwned.pth").exists()
    assert not (ROOT / "course" / "pwned.py").exists()


def test_child_has_loopback_but_no_network(attempts):
    assert attempts["loopback"] is True and attempts["network"] != "connected"
    assert attempts["hostname"] == "sandbox"


def _processes_of(uid: int) -> list[str]:
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.stat(f"/proc/{d}").st_uid == uid:
                    out.append(Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                pass
    return out


def test_nothing_a_submission_leaves_reaches_the_next_one_of_the_same_slot(slot):
    res, tr = run_cell(slot, PLANT)
    assert tr.finished and "PLANTED" in res.output, res.output
    res, tr = run_cell(slot, LOOK)
    seen = report(res)
    assert seen["/tmp"] is seen["/home/student"] is seen["/dev/shm"] is False
    assert seen["procs"] == [1, 2]  # the earlier child's detached `sleep` died with its namespace
    if os.geteuid() == 0:
        uid = int(Path(f"/proc/{slot.proc.pid}/status").read_text().split("Uid:")[1].split()[0])
        assert not any("sleep" in c for c in _processes_of(uid))


def test_a_child_that_will_not_stop_is_killed_at_the_wall_clock_and_the_slot_goes_on():
    s = Slot(Limits(wall_s=4))
    try:
        res, tr = run_cell(s, "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True: pass\n")
        assert res.timed_out and not tr.finished and not s.broken
        res, tr = run_cell(s, "print('RESULT {}')")
        assert tr.finished and report(res) == {}
    finally:
        s.close()


def test_a_dead_zygote_breaks_only_its_slot():
    s = Slot(Limits(wall_s=30))
    try:
        os.killpg(s.proc.pid, 9)
        s.proc.wait()
        res, tr = run_cell(s, "print('RESULT {}')")
        assert s.broken and not tr.finished and res.returncode is None
    finally:
        s.close()


SPAWN_AND_BREAK = r'''
import os, time
for _ in range(50):  # processes that hold memory, so tearing them down takes a moment
    if os.fork() == 0:
        b = bytearray(40 << 20)
        time.sleep(600)
        os._exit(0)
for fd in range(3, 256):  # the reply pipe is one of these: garbage on it breaks the protocol
    try:
        os.write(fd, b"garbage!" * 4)
    except OSError:
        pass
time.sleep(600)
'''


def test_a_killed_submissions_processes_are_gone_before_the_next_one_starts(slot):
    """The grader kills a submission that breaks the protocol at once; its 50 processes must be
    gone (not just signalled) before the slot reports it ended, or the next submission's fork
    fails against the uid's process limit and that student's row is lost."""
    reply_r, reply_w = os.pipe()
    box = {}

    def on_start(child):
        os.close(reply_w)
        box["tr"] = protocol.converse(child.stdin, protocol.Channel(reply_r),
                                      [{"kind": "cell", "label": "a", "source": SPAWN_AND_BREAK}],
                                      {"cell_s": 60}, step_s=60, measure=None)
        child.kill()  # as grade_one does when the conversation breaks

    try:
        slot.run(on_start, reply_w)
        if os.geteuid() == 0:  # the moment the slot says it ended: only bwrap and the zygote remain
            uid = int(Path(f"/proc/{slot.proc.pid}/status").read_text().split("Uid:")[1].split()[0])
            left = _processes_of(uid)
            assert len(left) <= 3 and not any("sleep" in c for c in left), left
    finally:
        os.close(reply_r)
    assert not box["tr"].finished
    res, tr = run_cell(slot, "print('RESULT {}')")
    assert tr.finished and report(res) == {} and not slot.broken, res.output


def test_orphans_are_reaped_and_signals_behave_as_in_a_one_off_sandbox(slot):
    source = r'''
import json, os, signal, subprocess, time
subprocess.run("for i in $(seq 70); do (sleep 0 &); done", shell=True)
time.sleep(1)
states = [open(f"/proc/{p}/stat").read().split(")")[1].split()[0] for p in os.listdir("/proc") if p.isdigit()]
forked = subprocess.run(["true"]).returncode
got = []
signal.signal(signal.SIGTERM, lambda *a: got.append(1))
os.kill(os.getpid(), signal.SIGTERM)
print("RESULT " + json.dumps({"zombies": states.count("Z"), "fork": forked, "sigterm": got}))
'''
    res, tr = run_cell(slot, source)
    seen = report(res)
    assert seen == {"zombies": 0, "fork": 0, "sigterm": [1]}, res.output
