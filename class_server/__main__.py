"""python -m class_server up ROSTER [--dir DIR] [--ip IP] [--port PORT] [limits]   (as root)
python -m class_server down [--dir DIR] [--remove-users] [--purge]
python -m class_server env --dir DIR [--exchange ROOT] [--instructor USER] [--group GROUP]
    (as root: the students' Python on a shared machine without the hub, and its exchange)"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from class_server.server import DEFAULT_EXCHANGE, ClassError, down, student_env, up


def printable(text: str) -> str:
    """``text`` with its control characters written out (``\\x1b``): an error can quote what a user's
    code printed (an instructor's nbgrader_config.py runs in `up`), and escape sequences reaching
    root's terminal could set its title, its clipboard, or more, depending on the terminal."""
    return "".join(c if c in "\n\t" or c.isprintable() else repr(c)[1:-1] for c in text)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m class_server", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    u = sub.add_parser("up", help="create the accounts and the class's folders, start JupyterHub")
    u.add_argument("roster", type=Path, help="CSV: id,first_name,last_name[,email][,role]; role student or instructor")
    u.add_argument("--dir", type=Path, default=Path("/srv/resnorm"), help="the class's folder (default /srv/resnorm)")
    u.add_argument("--ip", default="127.0.0.1", help="where the hub listens (default 127.0.0.1; TLS in front of it)")
    u.add_argument("--port", type=int, default=8000)
    u.add_argument("--group", default="resnorm-instructors", help="the instructors' unix group")
    for role, d in (("student", "2048 MB, 1 CPU, 512 processes"),
                    ("instructor", "3/4 of the machine's memory, every CPU, 4096 processes")):
        u.add_argument(f"--{role}-memory", type=int, metavar="MB",
                       help=f"memory of one {role}'s server, its kernels and terminals together (default: {d})")
        u.add_argument(f"--{role}-cpus", type=float, metavar="N", help=f"CPU time of one {role}'s server, in cores")
        u.add_argument(f"--{role}-pids", type=int, metavar="N", help=f"processes and threads of one {role}'s server")
    u.add_argument("--no-limits", action="store_true",
                   help="no cgroup per user's server (where the machine has none): one user can then take "
                        "the memory and CPU every other user's server needs")
    d = sub.add_parser("down", help="stop JupyterHub and every process of the class's users")
    d.add_argument("--dir", type=Path, default=Path("/srv/resnorm"))
    d.add_argument("--remove-users", action="store_true", help="also delete the accounts `up` created, with their homes")
    d.add_argument("--purge", action="store_true", help="also delete the class's folder (course, gradebook, exchange)")
    e = sub.add_parser("env", help="the students' Python on a shared machine without the hub: nbgrader, "
                                   "JupyterLab, torch and the course's runtime, runnable by every user")
    e.add_argument("--dir", type=Path, required=True, help="where to build it (e.g. /opt/resnorm)")
    e.add_argument("--exchange", type=Path, default=DEFAULT_EXCHANGE,
                   help=f"nbgrader's exchange root, as in the course's nbgrader_config.py (default {DEFAULT_EXCHANGE})")
    e.add_argument("--instructor", default="root", help="who owns the course's folder in the exchange (default root)")
    e.add_argument("--group", default=None, help="the instructors' group (default: the instructor's own group)")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "env":
            venv = student_env(a.dir, a.exchange, a.instructor, a.group)
            print(f"students run {venv / 'bin' / 'nbgrader'} (fetch_assignment, submit, fetch_feedback; "
                  f"--course=resnorm) or {venv / 'bin' / 'jupyter'} lab; exchange {a.exchange}")
        elif a.cmd == "up":
            limits = {"off": True} if a.no_limits else {
                role: {"memory_mb": getattr(a, f"{role}_memory"), "cpus": getattr(a, f"{role}_cpus"),
                       "pids": getattr(a, f"{role}_pids")} for role in ("student", "instructor")}
            info = up(a.roster, a.dir, ip=a.ip, port=a.port, group=a.group, limits=limits)
            print(info["url"])
        else:
            down(a.dir, remove_users=a.remove_users, purge=a.purge)  # says what it did, on stderr
    except ClassError as e:
        print(f"class_server: {printable(str(e))}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
