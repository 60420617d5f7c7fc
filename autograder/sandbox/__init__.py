"""What builds the sandbox a submission runs in (the grader's side; privileged where the grader is root).

* :mod:`.bwrap`: bubblewrap's arguments, the sandbox's uid, its limits, a one-off sandboxed process;
* :mod:`.slots`: a long-lived sandbox per job whose zygote forks a fresh child per submission;
* :mod:`.cgroups`: a control group per submission (memory, processes, CPU);
* :mod:`.seccomp`: the system-call filter.

The code that runs *inside* is :mod:`autograder.inside`. These modules import one another in one
direction only (bwrap and slots use cgroups and seccomp; those import nothing of the others).
"""


class SandboxUnavailable(RuntimeError):
    """The sandbox cannot be built here (bubblewrap missing, no user namespaces, no cgroup)."""
