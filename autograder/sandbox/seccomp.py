"""The sandbox's seccomp filter: the system calls Docker's default profile denies, answered with EPERM.

Docker's default profile (moby ``profiles/seccomp/default.json``, documented at
docs.docker.com/engine/security/seccomp) is an allowlist that leaves about 44 of 300+ calls out for
a container without extra capabilities; this filter denies those same calls (a denylist below
:data:`UNREVIEWED`, so a call the kernel adds later answers ENOSYS until it is reviewed), grouped as Docker's documentation
explains them (plus a few Docker's allowlist leaves out that a review found open here: ``syslog``,
``vhangup``, ``fanotify_init``, ``migrate_pages``, ``process_madvise``, ``sethostname``,
``setdomainname``, and newer calls: ``open_tree_attr``, ``statmount``, ``listmount``,
``lsm_set_self_attr``); every number from :data:`UNREVIEWED` on answers ENOSYS:

* kernel modules and the running kernel: ``init_module``, ``finit_module``, ``delete_module``,
  ``create_module``, ``query_module``, ``get_kernel_syms``, ``kexec_load``, ``kexec_file_load``,
  ``reboot``, ``uselib``, ``nfsservctl``, ``afs_syscall``, ``tuxcall``, ``security``, ``vserver``,
  ``getpmsg``, ``putpmsg`` (never implemented, never needed);
* the system's clock, accounting, swap, quotas, sysfs: ``clock_settime``, ``clock_adjtime``,
  ``settimeofday``, ``acct``, ``swapon``, ``swapoff``, ``quotactl``, ``quotactl_fd``, ``sysfs``,
  ``_sysctl``, ``ustat``, ``lookup_dcookie``;
* namespaces and mounts (container escapes go through them): ``unshare``, ``setns``, ``clone`` with
  a namespace flag, ``clone3`` (answered ENOSYS, as Docker does, so that libc falls back to
  ``clone``, whose flags a filter can read), ``mount``, ``umount2``, ``pivot_root``, and the new
  mount API ``fsopen``, ``fsconfig``, ``fsmount``, ``fspick``, ``open_tree``, ``move_mount``,
  ``mount_setattr``; file handles that bypass paths: ``name_to_handle_at``, ``open_by_handle_at``;
* the kernel's keyring: ``add_key``, ``request_key``, ``keyctl``;
* attack surface with a history of kernel bugs: ``bpf``, ``perf_event_open``, ``userfaultfd``,
  ``io_uring_setup``, ``io_uring_enter``, ``io_uring_register`` (Docker since moby#46762, 2023);
* other processes' memory: ``ptrace``, ``process_vm_readv``, ``process_vm_writev``, ``kcmp``,
  ``pidfd_getfd`` (Docker allows these on kernels from 4.8 with ``CAP_SYS_PTRACE``; a submission
  has no reason to trace anything, so they stay denied here);
* NUMA memory policy: ``get_mempolicy``, ``set_mempolicy``, ``set_mempolicy_home_node``, ``mbind``,
  ``move_pages`` (Docker: only with ``CAP_SYS_NICE``); port I/O: ``ioperm``, ``iopl``;
* ``personality`` except the values Docker allows (0, ``PER_LINUX32`` 8, ``UNAME26`` 0x20000, both,
  and the query 0xffffffff);
* ``socket(AF_VSOCK)``: the one address family a network namespace does not cut off (it reaches
  the hypervisor of a virtual machine).

Also, as libseccomp does: an x32 system call (``__X32_SYSCALL_BIT``, x86_64) is denied, and a
call from another architecture's ABI (``int 0x80`` on x86_64) kills the process, so no number of
another table can slip by. The architectures built here are x86_64 and aarch64.

:func:`program` returns the compiled classic-BPF program (``struct sock_filter`` array) that
``bwrap --seccomp FD`` installs just before it runs the sandbox's command; a grading slot's zygote
needs ``unshare``, ``mount`` and ``sethostname`` to build each submission's namespaces, so its bwrap
gets ``program(slot=True)`` (all but those three) and each submission's child installs the full program
itself (``autograder/inside/zygote.py``) before its init forks the harness.
"""
from __future__ import annotations

import os
import platform
import struct

from autograder.sandbox import SandboxUnavailable

AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
X32_SYSCALL_BIT = 0x40000000
RET_ALLOW, RET_ERRNO, RET_KILL_PROCESS = 0x7FFF0000, 0x00050000, 0x80000000
EPERM, ENOSYS = 1, 38
#: clone's namespace flags (CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET)
CLONE_NS_FLAGS = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000
PERSONALITY_ALLOWED = (0x0, 0x8, 0x20000, 0x20008, 0xFFFFFFFF)
AF_VSOCK = 40

#: denied calls: name -> (x86_64 number, aarch64 number or None where the call does not exist)
DENIED = {
    "acct": (163, 89), "add_key": (248, 217), "bpf": (321, 280), "clock_adjtime": (305, 266),
    "clock_settime": (227, 112), "create_module": (174, None), "delete_module": (176, 106),
    "finit_module": (313, 273), "get_kernel_syms": (177, None), "get_mempolicy": (239, 236),
    "init_module": (175, 105), "ioperm": (173, None), "iopl": (172, None), "kcmp": (312, 272),
    "kexec_file_load": (320, 294), "kexec_load": (246, 104), "keyctl": (250, 219),
    "lookup_dcookie": (212, 18), "mbind": (237, 235), "mount": (165, 40), "move_pages": (279, 239),
    "name_to_handle_at": (303, 264), "nfsservctl": (180, 42), "open_by_handle_at": (304, 265),
    "perf_event_open": (298, 241), "pivot_root": (155, 41), "process_vm_readv": (310, 270),
    "process_vm_writev": (311, 271), "ptrace": (101, 117), "query_module": (178, None),
    "quotactl": (179, 60), "quotactl_fd": (443, 443), "reboot": (169, 142), "request_key": (249, 218),
    "set_mempolicy": (238, 237), "set_mempolicy_home_node": (450, 450), "setns": (308, 268),
    "settimeofday": (164, 170), "swapon": (167, 224), "swapoff": (168, 225), "sysfs": (139, None),
    "_sysctl": (156, None), "umount2": (166, 39), "unshare": (272, 97), "uselib": (134, None),
    "userfaultfd": (323, 282), "ustat": (136, None), "io_uring_setup": (425, 425),
    "io_uring_enter": (426, 426), "io_uring_register": (427, 427), "fsopen": (430, 430),
    "fsconfig": (431, 431), "fsmount": (432, 432), "fspick": (433, 433), "open_tree": (428, 428),
    "move_mount": (429, 429), "mount_setattr": (442, 442), "pidfd_getfd": (438, 438),
    "afs_syscall": (183, None), "tuxcall": (184, None), "security": (185, None),
    "vserver": (236, None), "getpmsg": (181, None), "putpmsg": (182, None),
    # left out of Docker's allowlist too (a red-team read found them open here)
    "syslog": (103, 116), "vhangup": (153, 58), "fanotify_init": (300, 262), "migrate_pages": (256, 238),
    "process_madvise": (440, 440), "sethostname": (170, 161), "setdomainname": (171, 162),
    # newer than Docker's list: the rest of the mount API, mount listings, setting LSM attributes
    "open_tree_attr": (467, 467), "statmount": (457, 457), "listmount": (458, 458),
    "lsm_set_self_attr": (460, 460),
}
#: the first system call number nobody has reviewed for this filter (x86_64 and aarch64 share the
#: numbers from 424 on): it and every later one answer ENOSYS, as a kernel without them would, so
#: a call added to the kernel after this list is not open by default
UNREVIEWED = 470
#: what a slot's zygote needs to build each submission's namespaces (its children deny them too)
SLOT_NEEDS = ("unshare", "mount", "sethostname")
#: calls denied for some arguments only: name -> (x86_64, aarch64)
CLONE, CLONE3, PERSONALITY, SOCKET = (56, 220), (435, 435), (135, 92), (41, 198)

# classic BPF (linux/filter.h, linux/seccomp.h): struct seccomp_data {int nr; u32 arch; u64 ip; u64 args[6]}
LD_W_ABS, JEQ, JSET, JGE, RET = 0x20, 0x15, 0x45, 0x35, 0x06
OFF_NR, OFF_ARCH, OFF_ARG0 = 0, 4, 16


def _assemble(code: list) -> bytes:
    """``code``: (op, k, jt, jf) with jt/jf a label name or 0; (label,) marks a label. Labels must
    lie ahead (classic BPF jumps only forward, by at most 255)."""
    where, n = {}, 0
    for ins in code:
        if len(ins) == 1:
            where[ins[0]] = n
        else:
            n += 1
    out, i = [], 0
    for ins in code:
        if len(ins) == 1:
            continue
        op, k, jt, jf = ins
        rel = [where[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf)]
        assert all(0 <= r <= 255 for r in rel), ins
        out.append(struct.pack("<HBBI", op, rel[0], rel[1], k & 0xFFFFFFFF))
        i += 1
    return b"".join(out)


def program(arch: str | None = None, slot: bool = False) -> bytes:
    """The filter for ``arch`` (default: this machine's) as ``struct sock_filter`` bytes;
    ``slot``: a grading slot's zygote (``unshare`` and ``mount`` allowed: see the module docstring)."""
    arch = arch or platform.machine()
    if arch not in AUDIT_ARCH:
        raise SandboxUnavailable(f"no seccomp filter for the architecture {arch!r} (x86_64 and aarch64 "
                                 "only): the grader does not sandbox without one; --no-sandbox runs unsandboxed")
    a = 0 if arch == "x86_64" else 1
    denied = sorted({nums[a] for name, nums in DENIED.items()
                     if nums[a] is not None and not (slot and name in SLOT_NEEDS)})
    code = [(LD_W_ABS, OFF_ARCH, 0, 0), (JEQ, AUDIT_ARCH[arch], 0, "kill"), (LD_W_ABS, OFF_NR, 0, 0)]
    if arch == "x86_64":
        code.append((JGE, X32_SYSCALL_BIT, "deny", 0))
    code.append((JGE, UNREVIEWED, "enosys", 0))
    code += [(JEQ, nr, "deny", 0) for nr in denied]
    code += [(JEQ, CLONE3[a], "enosys", 0), (JEQ, PERSONALITY[a], "personality", 0),
             (JEQ, SOCKET[a], "socket", 0)]
    code += [(JEQ, CLONE[a], "clone", 0), (RET, RET_ALLOW, 0, 0)]
    # clone(flags, ...): the flags are the first argument on x86_64 and aarch64
    code += [("clone",), (LD_W_ABS, OFF_ARG0, 0, 0), (JSET, CLONE_NS_FLAGS, "deny", "allow")]
    code += [("personality",), (LD_W_ABS, OFF_ARG0, 0, 0)]
    code += [(JEQ, v, "allow", 0) for v in PERSONALITY_ALLOWED]
    code += [(RET, RET_ERRNO | EPERM, 0, 0)]
    code += [("socket",), (LD_W_ABS, OFF_ARG0, 0, 0), (JEQ, AF_VSOCK, "deny", "allow")]
    code += [("allow",), (RET, RET_ALLOW, 0, 0), ("deny",), (RET, RET_ERRNO | EPERM, 0, 0),
             ("enosys",), (RET, RET_ERRNO | ENOSYS, 0, 0), ("kill",), (RET, RET_KILL_PROCESS, 0, 0)]
    return _assemble(code)


def memfd(prog: bytes) -> int:
    """A descriptor to read ``prog`` from, at offset 0 (what ``bwrap --seccomp FD`` reads to its end)."""
    fd = os.memfd_create("seccomp", os.MFD_CLOEXEC)
    os.write(fd, prog)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
