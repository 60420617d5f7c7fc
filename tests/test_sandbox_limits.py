"""Per-submission limits as containers give them, with real sandboxes: a cgroup per submission
(memory of all its processes together, processes, CPU: :mod:`autograder.sandbox.cgroups`) and a seccomp
filter modelled on Docker's default profile (:mod:`autograder.sandbox.seccomp`).

One class of five (tests/fixtures/limits/), graded in one grading slot, in order: a memory bomb
(8 processes x 1 GiB under a 2 GiB limit), the reference answers right after it in the same slot,
the reference with 8 torch threads and with 1, and honest code that needs processes, shared
memory and a compiler (torch.compile, which the grader runs eagerly, a DataLoader with workers, matplotlib).
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from autograder.sandbox import cgroups

from autograder.sandbox import seccomp
from autograder.sandbox.bwrap import Limits, run_sandboxed
from course.release import ROOT
from tools.fixture_class import _write, read_code_fixture, release_dict, solved_dict, with_code

pytestmark = [pytest.mark.autograder, pytest.mark.slow]
ASSIGNMENT = "01_layernorm"
FIXTURES = ROOT / "tests" / "fixtures" / "limits"
CLASS = [("a-bomb", "memory_bomb"), ("b-after-bomb", None), ("c-threads", "threads"),
         ("d-one-thread", "one_thread"), ("e-honest", "honest_extras")]
needs_cgroups = pytest.mark.skipif(os.geteuid() != 0 or cgroups.version() is None,
                                   reason="a cgroup per submission needs a root grader and cgroups")


def _status(field: str, pid: str = "self") -> int:
    """A ``kB`` field of /proc/PID/status, in MiB."""
    return int(Path(f"/proc/{pid}/status").read_text().split(field + ":")[1].split()[0]) >> 10


def _leftover_groups() -> list[str]:
    """Our own cgroups (this process's prefix) still on disk, in any hierarchy."""
    m, own = cgroups._mounts(), cgroups._own()
    left = []
    for c in ("memory", "pids", "cpu", ""):
        if c in m:
            d = cgroups._under(*m[c], own.get(c, "/"))
            left += [str(p) for p in d.glob(f"autograder-{os.getpid()}-*")]
    return left


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    from autograder.sandbox import slots
    from autograder.grade import grade_class
    tmp = tmp_path_factory.mktemp("limits_class")
    name, release = release_dict(ASSIGNMENT)
    for student, fixture in CLASS:
        nb = solved_dict(ASSIGNMENT) if fixture is None else \
            with_code(copy.deepcopy(release), read_code_fixture(FIXTURES / f"{fixture}.py")["code"])
        _write(tmp / "submitted", student, ASSIGNMENT, name, nb)
    started = []

    class CountedSlot(slots.Slot):
        def __init__(self, *a, **k):
            started.append(1)
            super().__init__(*a, **k)

    import torch  # the grader's own imports, before its memory is read
    torch.ones(1)
    rss0 = _status("VmRSS")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(slots, "Slot", CountedSlot)
        t0 = time.monotonic()
        outs = grade_class(tmp / "submitted", tmp / "out", jobs=1, progress=False,
                           limits=Limits(wall_s=150, submission_mb=2048))
    return {"rows": {o.student_id: o for o in outs}, "slots": len(started), "wall": time.monotonic() - t0,
            "rss": (rss0, _status("VmRSS"), _status("VmHWM"))}


@needs_cgroups
def test_a_memory_bomb_is_stopped_and_its_row_says_memory(graded):
    o = graded["rows"]["a-bomb"]
    assert o.status == "memory" and "memory" in o.message and o.score == 0, (o.status, o.message, o.output_tail)
    assert o.wall_s < 60, o.wall_s  # stopped at the first kill, not at the wall clock


@needs_cgroups
def test_the_next_student_in_the_same_slot_gets_a_correct_row(graded):
    o = graded["rows"]["b-after-bomb"]
    assert graded["slots"] == 1  # the bomb cost its own row, not the slot
    assert o.status == "graded" and o.score == o.max_score > 0, (o.status, o.message)
    assert all(t.passed for t in o.tests) and o.review == [], (o.tests, o.review)


@needs_cgroups
def test_the_graders_own_memory_stays_flat(graded):
    """8 GiB were asked for inside; the grader (this process) grew by far less than one of them."""
    rss0, rss1, hwm = graded["rss"]
    print(f"grader RSS {rss0} MiB before, {rss1} MiB after, peak {hwm} MiB")
    assert rss1 - rss0 < 512 and hwm - rss0 < 768, graded["rss"]


@needs_cgroups
def test_honest_code_with_processes_compile_and_plots_keeps_full_marks(graded):
    o = graded["rows"]["e-honest"]
    assert o.status == "graded" and o.score == o.max_score, (o.message, o.cell_errors, o.output_tail[-2000:])


def _ratio(o) -> float:
    t = next(t for t in o.tests if t.grade_id == "layernorm_benchmark")
    assert t.passed and "timed by the grader" in t.detail["report"], t
    return t.detail["ratio"]


@needs_cgroups
def test_raising_the_thread_count_changes_no_grade(graded):
    """Both rows are the reference answer; one sets torch.set_num_threads(8). They get the same grade,
    every test passed, the benchmark timed by the grader for both. That the 8 threads buy no CPU is
    the cgroup's 1-core quota (test_threads_get_one_core_of_cpu_time_per_wall_second, measured in CPU
    seconds); the two rows' timing ratios are printed, not compared: single timings of two rows
    graded minutes apart on a shared machine differ by more than any threshold a test could keep
    (2.03 against 3.29 once, with the 8-thread row the faster, under a book build beside it)."""
    c, d = graded["rows"]["c-threads"], graded["rows"]["d-one-thread"]
    threads, one = _ratio(c), _ratio(d)
    print(f"ratio with 8 threads {threads:.3f}, with 1 thread {one:.3f}")
    assert (c.score, c.max_score) == (d.score, d.max_score) and c.score == c.max_score, (c.message, d.message)
    assert [t.passed for t in c.tests] == [t.passed for t in d.tests]


@needs_cgroups
def test_no_cgroup_is_left_behind(graded):
    assert _leftover_groups() == []


# --- seccomp, from inside --------------------------------------------------------------------------

PROBE = r'''
import ctypes, json, os
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def call(nr, *a):
    args = [ctypes.c_long(x) for x in a] + [ctypes.c_long(0)] * (6 - len(a))
    ctypes.set_errno(0)
    rc = libc.syscall(ctypes.c_long(nr), *args)
    return 0 if rc != -1 else ctypes.get_errno()
numbers = json.loads(__NUMBERS__)
out = {name: call(nr) for name, nr in numbers.items()}
status = open("/proc/self/status").read()
out["Seccomp"] = status.split("Seccomp:")[1].split()[0]
if __INSIDE__:
    me = os.getpid()
    out["clone_newuser"] = call(56, 0x10000000 | 17)  # CLONE_NEWUSER | SIGCHLD, as fork would
    if os.getpid() != me:
        os._exit(0)
    out["clone_plain"] = call(56, 17)  # a plain fork: allowed
    if os.getpid() != me:
        os._exit(0)
    out["clone3"] = call(435)
    out["personality_query"] = call(135, 0xFFFFFFFF)
    out["personality_read_implies_exec"] = call(135, 0x0400000)
    out["socket_vsock"] = call(41, 40, 1)
    out["pid1_seccomp"] = open("/proc/1/status").read().split("Seccomp:")[1].split()[0]
    out["unreviewed"] = [call(nr) for nr in (470, 471, 511)]  # newer than the filter's list
    out["cgroup_paths"] = sorted({l.split(":", 2)[2] for l in open("/proc/self/cgroup").read().split()})
    try:
        open("/proc/1/mem", "rb").close()
        out["init_mem"] = "open"
    except OSError as e:
        out["init_mem"] = e.errno
print("RESULT " + json.dumps(out))
'''
EPERM, ENOSYS = 1, 38


def _probe(inside: bool) -> str:
    numbers = {n: nr[0] for n, nr in seccomp.DENIED.items()}
    return PROBE.replace("__NUMBERS__", repr(json.dumps(numbers))).replace("__INSIDE__", str(inside))


def _report(text: str) -> dict:
    line = next((l for l in text.splitlines() if l.startswith("RESULT ")), None)
    assert line, text
    return json.loads(line[len("RESULT "):])


def _check_inside(r: dict) -> None:
    denied = {k: v for k, v in r.items() if k in seccomp.DENIED}
    assert denied and all(v == EPERM for v in denied.values()), {k: v for k, v in denied.items() if v != EPERM}
    assert r["Seccomp"] == "2" and r["clone_newuser"] == EPERM and r["clone_plain"] == 0
    assert r["clone3"] == ENOSYS  # as Docker: libc falls back to clone, whose flags the filter reads
    assert r["personality_query"] == 0 and r["personality_read_implies_exec"] == EPERM
    assert r["socket_vsock"] == EPERM
    assert r["unreviewed"] == [ENOSYS] * 3  # a call added to the kernel later is not open


@pytest.fixture(scope="module")
def unfiltered():
    """The same calls on the host, as an unprivileged user with no filter: many do not fail with
    EPERM there, so EPERM inside is the filter's doing, not only the missing capabilities."""
    python = "/usr/bin/python3"  # one an unprivileged user may run (the venv's may live in /root)
    if os.geteuid() != 0 or not os.access(python, os.X_OK):
        pytest.skip("the control runs as another uid, with the system's python3")

    def nobody():
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)

    res = subprocess.run([python, "-c", _probe(False)], capture_output=True, text=True, timeout=60,
                         preexec_fn=nobody, cwd="/")
    return _report(res.stdout + res.stderr)


@pytest.mark.skipif(seccomp.platform.machine() != "x86_64", reason="the probe uses x86_64 numbers")
def test_each_denied_syscall_is_eperm_in_a_one_off_sandbox(unfiltered):
    res = run_sandboxed(["python", "-c", _probe(True)], limits=Limits(wall_s=60))
    _check_inside(_report(res.output))
    open_outside = sorted(k for k in seccomp.DENIED if unfiltered[k] != EPERM)
    assert unfiltered["Seccomp"] == "0" and len(open_outside) >= 10, open_outside


@pytest.mark.skipif(seccomp.platform.machine() != "x86_64", reason="the probe uses x86_64 numbers")
def test_each_denied_syscall_is_eperm_in_a_slots_child_and_its_init():
    """The zygote's own filter allows unshare and mount (it builds each child's namespaces); the
    child installs the full filter in its init, before the harness is forked."""
    from autograder.referee import protocol
    from autograder.sandbox.slots import Slot
    s = Slot(Limits(wall_s=60))
    try:
        reply_r, reply_w = os.pipe()
        box = {}

        def on_start(child):
            os.close(reply_w)
            box["tr"] = protocol.converse(child.stdin, protocol.Channel(reply_r),
                                          [{"kind": "cell", "label": "probe", "source": _probe(True)}],
                                          {"cell_s": 60}, step_s=90, measure=None)
            child.wait(10)

        try:
            res = s.run(on_start, reply_w)
        finally:
            os.close(reply_r)
        r = _report(res.output)
        _check_inside(r)
        assert r["pid1_seccomp"] == "2"
        assert r["cgroup_paths"] == ["/"], r["cgroup_paths"]  # its own cgroup namespace: no grader's path
        assert r["init_mem"] != "open"  # init is not dumpable: its memory is not the student's to write
        zygote = [p for p in os.listdir("/proc") if p.isdigit() and "zygote.py" in _cmdline(p)
                  and f"{s.proc.pid}" in _ancestors(p)]
        assert zygote and all(_field(p, "Seccomp") == "2" for p in zygote)
    finally:
        s.close()


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _field(pid: str, name: str) -> str:
    return Path(f"/proc/{pid}/status").read_text().split(name + ":")[1].split()[0]


def _ancestors(pid: str) -> list[str]:
    out = []
    while pid not in ("0", "1"):
        try:
            pid = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
        except (OSError, IndexError):
            break
        out.append(pid)
    return out


def test_the_filter_assembles_for_both_architectures_and_kills_a_foreign_abi():
    for arch in ("x86_64", "aarch64"):
        prog = seccomp.program(arch)
        assert len(prog) % 8 == 0 and len(prog) // 8 < 4096
        code, jt, jf, k = __import__("struct").unpack("<HBBI", prog[8:16])  # arch check, else kill
        assert k == seccomp.AUDIT_ARCH[arch]
        assert prog[-8:] == __import__("struct").pack("<HBBI", seccomp.RET, 0, 0, seccomp.RET_KILL_PROCESS)
    from autograder.sandbox.bwrap import SandboxUnavailable
    with pytest.raises(SandboxUnavailable, match="riscv64"):
        seccomp.program("riscv64")


# --- where cgroups cannot be made ------------------------------------------------------------------

def test_without_cgroups_the_grader_refuses_and_names_the_flag(monkeypatch):
    monkeypatch.setattr(cgroups.os, "geteuid", lambda: 1000)
    with pytest.raises(cgroups.CgroupUnavailable, match="--no-cgroups"):
        cgroups.for_limits(Limits())
    assert cgroups.for_limits(Limits(cgroups=False)) is None


def test_the_cli_refuses_without_cgroups_and_runs_with_no_cgroups(tmp_path, monkeypatch):
    from autograder import __main__ as cli
    from autograder.sandbox import bwrap as sandbox
    monkeypatch.setattr(cgroups, "version", lambda: None)
    monkeypatch.setattr(sandbox, "_checked", {})
    assert cli.main(["grade", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    args = cli.build_parser().parse_args(["grade", "--out", "x", "--no-cgroups", "--memory", "3000", "--cpus", "2"])
    assert args.no_cgroups and args.memory == 3000 and args.cpus == 2


@needs_cgroups
def test_a_one_off_sandbox_is_in_its_own_group_with_the_limits():
    """Read from the host while the sandbox runs: its processes are in a group of their own with
    the memory, process and CPU limits asked for, and the group is gone afterwards."""
    seen = {}

    def on_start(proc):
        for _ in range(200):
            groups = _leftover_groups()
            if groups:
                break
            time.sleep(0.02)
        for g in groups:
            for f in ("memory.limit_in_bytes", "pids.max", "cpu.cfs_quota_us", "memory.max", "cpu.max",
                      "memory.kmem.tcp.limit_in_bytes"):
                if Path(g, f).exists():
                    seen[f] = Path(g, f).read_text().split()[0]
            seen.setdefault("procs", []).extend(Path(g, "cgroup.procs").read_text().split())

    res = run_sandboxed(["python", "-c", "import time; time.sleep(1)"], on_start=on_start,
                        limits=Limits(wall_s=60, submission_mb=1500, nproc=30, cpus=1))
    assert res.returncode == 0 and seen["procs"], (res, seen)
    if cgroups.version() == 1:
        assert seen["memory.limit_in_bytes"] == str(1500 << 20) and seen["pids.max"] == str(30 + cgroups.PIDS_EXTRA)
        assert seen["cpu.cfs_quota_us"] == str(cgroups.CPU_PERIOD_US)
        if "memory.kmem.tcp.limit_in_bytes" in seen:  # v1 charges TCP buffers only once it is set
            assert seen["memory.kmem.tcp.limit_in_bytes"] == str(cgroups.TCP_MB << 20)
    else:
        assert seen["memory.max"] == str(1500 << 20) and seen["cpu.max"] == str(cgroups.CPU_PERIOD_US)
    assert _leftover_groups() == []


BUSY = r'''
import resource, time, torch
torch.set_num_threads(4)
a = torch.randn(512, 512)
t0, c0 = time.monotonic(), resource.getrusage(resource.RUSAGE_SELF)
while time.monotonic() - t0 < 1.5:
    a = torch.tanh(a @ a)
c1 = resource.getrusage(resource.RUSAGE_SELF)
print("RESULT", ((c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime)) / (time.monotonic() - t0))
'''


@needs_cgroups
def test_threads_get_one_core_of_cpu_time_per_wall_second():
    """Four torch threads busy on matrix products for 1.5 s: under the 1-core quota the process
    gets at most about one second of CPU per second of wall time, whatever the machine's cores."""
    res = run_sandboxed(["python", "-c", BUSY], limits=Limits(wall_s=60))
    line = next(l for l in res.output.splitlines() if l.startswith("RESULT"))
    share = float(line.split()[1])
    print(f"CPU seconds per wall second with 4 threads: {share:.2f} (machine: {os.cpu_count()} cores)")
    assert share < 1.15, res.output


@needs_cgroups
def test_files_in_the_sandboxs_tmpfs_count_against_its_memory():
    """Three sized tmpfs (256 MB each) hold more than a 400 MB limit: files written there are the
    writer's memory, so filling two of them is a memory kill, not a way around the limit."""
    fill = ("import time\nfor d in ('/tmp', '/dev/shm'):\n"
            "    with open(d + '/fill', 'wb') as f:\n"
            "        for _ in range(250):\n            f.write(b'x' * (1 << 20))\n"
            "print('FILLED')\ntime.sleep(30)\n")
    res = run_sandboxed(["python", "-c", fill], limits=Limits(wall_s=60, submission_mb=400))
    assert res.oom and "FILLED" not in res.output and not res.timed_out, res


@needs_cgroups
def test_groups_left_by_a_killed_grader_are_removed_by_the_next(monkeypatch):
    """A grader killed mid-run (a Dask worker, SIGKILL) cannot remove its groups: the next one to
    make a group removes those of graders no longer running, and never one still in use."""
    proc = subprocess.Popen(["sleep", "0"])  # a pid that has exited
    proc.wait()
    dead = proc.pid
    parent = cgroups._under(*cgroups._mounts()["memory"], cgroups._own()["memory"]) if cgroups.version() == 1 \
        else cgroups._under(*cgroups._mounts()[""], cgroups._own()[""])
    stale, mine = parent / f"autograder-{dead}-0-deadbeef", parent / f"autograder-{os.getpid()}-99-live"
    stale.mkdir()
    mine.mkdir()
    try:
        monkeypatch.setattr(cgroups, "_swept", set())
        cgroups.create(1024, 10, 1).close()
        assert not stale.exists() and mine.exists()
    finally:
        for d in (stale, mine):
            if d.exists():
                d.rmdir()


TCP_FILL = r'''
import socket
pairs, queued = [], 0
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(64)
for _ in range(60):  # loopback pairs whose receiver never reads
    a = socket.create_connection(srv.getsockname()); b, _ = srv.accept()
    a.setblocking(False); pairs.append((a, b))
chunk = b"x" * (1 << 20)
for a, _ in pairs:
    while True:
        try:
            queued += a.send(chunk)
        except OSError:  # EAGAIN when the buffers are full, ENOBUFS when the group's TCP memory is
            break
print("RESULT", queued >> 20)
'''


@needs_cgroups
def test_tcp_buffers_count_against_the_submission_not_the_host():
    """Sixty loopback connections whose receivers never read: without a TCP limit on its group
    (cgroup v1 charges socket buffers only then) they would queue hundreds of MB outside the
    submission's memory and press on the host's tcp_mem; with it they stop near TCP_MB."""
    if cgroups.version() != 1:
        pytest.skip("cgroup v2 charges socket buffers to memory.max")
    res = run_sandboxed(["python", "-c", TCP_FILL], limits=Limits(wall_s=60))
    line = next(l for l in res.output.splitlines() if l.startswith("RESULT"))
    queued = int(line.split()[1])
    print(f"MB queued on 60 loopback connections: {queued}")
    assert queued <= 2 * cgroups.TCP_MB, res.output
