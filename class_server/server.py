"""Bring the class server up and down (see the package's docstring for the layout)."""
from __future__ import annotations

import contextlib
import csv
import grp
import io
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
PROXY = ROOT / "_build" / "chp" / "node_modules" / ".bin" / "configurable-http-proxy"
COURSE_ID = "resnorm"
# What the instructors' course directory holds: nbgrader's source and release, and the grader with
# the checks it runs (python -m autograder grade, run in the course).
COURSE_FILES = ["nbgrader_config.py", "solutions", "exercises", "autograder", "course", "coursekit"]
CODE = {"autograder", "course", "coursekit"}  # replaced at every `up`; the rest is copied once
# JupyterLab's "Would you like to get notified about official Jupyter news?" prompt: not in a class.
QUIET = {"@jupyterlab/apputils-extension:announcements": True}
NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,30}$")


class ClassError(RuntimeError):
    pass


def log(msg: str) -> None:
    print(f"class_server: {msg}", file=sys.stderr, flush=True)


def run(*argv: str, **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(argv), capture_output=True, text=True, **kw)
    if proc.returncode != 0:
        raise ClassError(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}")
    return proc


# ------------------------------------------------------------------------------------------------
# Root's file operations in folders that others can write
# ------------------------------------------------------------------------------------------------
# ``course/`` is writable by the instructors' group, ``exchange/`` by everyone: in there, root never
# follows a path by name. It opens what it changes with O_NOFOLLOW and changes the descriptor
# (fchown, fchmod), checks what it opened (a regular file with one link, or a folder), writes new
# files in ``hub/`` (root's, 0700) and renames them into place (a rename replaces a link; it never
# writes through it), and moves old trees out to ``hub/`` before deleting them.

_NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NOFOLLOW_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def secure_chown(path: Path, uid: int, gid: int, mode: int, folder: bool = False) -> None:
    """``chown uid:gid path; chmod mode path`` on ``path`` itself, never on what a link there points
    at: a folder, or a regular file with no other hard link; anything else is a :class:`ClassError`."""
    try:
        fd = os.open(path, _NOFOLLOW_DIR if folder else _NOFOLLOW_FILE)
    except OSError as e:
        raise ClassError(f"{path}: not changed, it is not a {'folder' if folder else 'regular file'} "
                         f"({e.strerror}; a symbolic link?): remove it and run `up` again") from None
    try:
        st = os.fstat(fd)
        if not folder and not (stat.S_ISREG(st.st_mode) and st.st_nlink == 1):
            raise ClassError(f"{path}: not changed, it is not a regular file with one link "
                             f"(links: {st.st_nlink}): remove it and run `up` again")
        os.fchown(fd, uid, gid)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def replace_file(dest: Path, data: str, uid: int, gid: int, mode: int, staging: Path) -> None:
    """Write ``dest`` as a new file: written in ``staging`` (root's), owned and moded there, then
    renamed over whatever ``dest`` was (a link there is replaced, not followed)."""
    staging.mkdir(mode=0o700, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=staging, prefix=dest.name + ".")
    try:
        with os.fdopen(fd, "w", newline="") as f:
            f.write(data)
            os.fchown(f.fileno(), uid, gid)
            os.fchmod(f.fileno(), mode)
        os.rename(tmp, dest)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise ClassError(f"{dest}: could not be replaced ({e})") from None


def put_in_place(staged: Path, dest: Path, staging: Path) -> None:
    """Move ``staged`` (made in root's ``staging``) to ``dest``: whatever is at ``dest`` (a file, a
    folder, a link: never followed) is first moved into ``staging`` and deleted there."""
    trash = Path(tempfile.mkdtemp(dir=staging, prefix="old."))
    try:
        os.rename(dest, trash / "old")
    except FileNotFoundError:
        pass
    try:
        os.rename(staged, dest)
    except OSError as e:
        raise ClassError(f"{dest}: something was put there while `up` replaced it ({e}); run `up` again") from None
    finally:
        shutil.rmtree(trash, ignore_errors=True)  # rmtree never follows links out of the tree


# ------------------------------------------------------------------------------------------------
# The roster
# ------------------------------------------------------------------------------------------------

def _uid_min() -> int:
    """The first uid of a person's account here (/etc/login.defs' UID_MIN; 1000 if unread)."""
    try:
        for line in Path("/etc/login.defs").read_text().splitlines():
            f = line.split()
            if len(f) >= 2 and f[0] == "UID_MIN":
                return int(f[1])
    except (OSError, ValueError):
        pass
    return 1000


def read_roster(path: Path) -> list[dict]:
    """``id,first_name,last_name[,email][,role]`` (nbgrader's roster columns plus ``role``:
    ``student``, the default, or ``instructor``); ``id`` is the unix user name."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or "id" not in rows[0]:
        raise ClassError(f"{path}: a CSV with the header id,first_name,last_name[,email][,role] and one row a person")
    people = []
    for r in rows:
        uid, role = (r.get("id") or "").strip(), (r.get("role") or "student").strip().lower()
        if not NAME.match(uid):
            raise ClassError(f"{path}: {uid!r} is not a unix user name (lower case letters, digits, _ and -)")
        if role not in ("student", "instructor"):
            raise ClassError(f"{path}: {uid}: role must be student or instructor, not {role!r}")
        people.append({"id": uid, "first_name": (r.get("first_name") or "").strip(),
                       "last_name": (r.get("last_name") or "").strip(), "email": (r.get("email") or "").strip(),
                       "role": role})
    uid_min = _uid_min()
    for p in people:
        try:
            pw = pwd.getpwnam(p["id"])
        except KeyError:
            continue
        if pw.pw_uid < uid_min:  # root, daemon, www-data...: `up` would give it a hub login and a server
            raise ClassError(f"{path}: {p['id']} is a system account of this machine (uid {pw.pw_uid}, below "
                             f"UID_MIN {uid_min}): not a person of the class; rename the row")
    ids = [p["id"] for p in people]
    if len(set(ids)) != len(ids):
        raise ClassError(f"{path}: a user name appears twice")
    if not any(p["role"] == "instructor" for p in people):
        raise ClassError(f"{path}: no instructor (add a row with role instructor)")
    return people


# ------------------------------------------------------------------------------------------------
# Accounts
# ------------------------------------------------------------------------------------------------

def user_exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
        return True
    except KeyError:
        return False


def ensure_group(group: str) -> bool:
    """The instructors' group; True when it is made here."""
    try:
        grp.getgrnam(group)
        return False
    except KeyError:
        run("groupadd", group)
        return True


def ensure_accounts(people: list[dict], group: str) -> dict[str, str]:
    """One unix account per person (home 0700), the instructors in ``group``. Returns the first
    password of each account created here (existing accounts keep theirs)."""
    created = {}
    for p in people:
        u = p["id"]
        if not user_exists(u):
            gecos = f"{p['first_name']} {p['last_name']}".strip().replace(":", " ")
            run("useradd", "--create-home", "--shell", "/bin/bash", "--comment", gecos, u)
            password = secrets.token_urlsafe(12)
            run("chpasswd", input=f"{u}:{password}\n")
            created[u] = password
        home = Path(pwd.getpwnam(u).pw_dir)
        try:  # the user's own folder: changed through a descriptor, never through a link
            fd = os.open(home, _NOFOLLOW_DIR)
        except OSError as e:
            log(f"{u}'s home {home} left as it is ({e.strerror}: not a folder, or a symbolic link)")
        else:
            try:
                os.fchmod(fd, 0o700)
            finally:
                os.close(fd)
        if p["role"] == "instructor":
            run("usermod", "-a", "-G", group, u)
        else:  # a student removed from the instructors keeps no access to the course
            members = grp.getgrnam(group).gr_mem
            if u in members:
                run("gpasswd", "-d", u, group)
    return created


def remove_accounts(users: list[str], group: str | None) -> None:
    for u in users:
        if user_exists(u):
            subprocess.run(["userdel", "--remove", u], capture_output=True)
    if group:
        subprocess.run(["groupdel", group], capture_output=True)


#: as the user, before their command: make each of the folders given (0700), refuse one that is not a
#: folder of theirs (a link, another's), then cd to $0 (unless empty) and run the command after the "--"
PRIVATE_SH = (
    'cwd="$0"; while [ "$1" != -- ]; do '
    '(umask 077 && mkdir -p -- "$1") && [ -d "$1" ] && [ ! -L "$1" ] && [ -O "$1" ] && chmod 700 -- "$1" '
    '|| { echo "class_server: $1 is not a folder of $(id -un) only: not run" >&2; exit 126; }; shift; done; '
    'shift; if [ -n "$cwd" ]; then cd "$cwd" || exit 126; fi; exec "$@"')


def as_user(user: str, argv: list[str], class_dir: Path, cwd: Path | None = None, timeout: float = 600,
            input: str | None = None) -> subprocess.CompletedProcess:
    """Run ``argv`` as ``user`` with the environment the hub gives that user's server (their HOME,
    the class's Python first on PATH, their role's Jupyter config), as a terminal in JupyterLab would."""
    cfg = json.loads((class_dir / "hub" / "class.json").read_text())
    role = "instructor" if user in cfg["instructors"] else "student"
    pw = pwd.getpwnam(user)
    env = ["HOME=" + pw.pw_dir, "USER=" + user, "LOGNAME=" + user, "LANG=C.UTF-8", "OMP_NUM_THREADS=1",
           "PATH=" + os.pathsep.join([str(Path(cfg["venv"]) / "bin"), "/usr/local/bin", "/usr/bin", "/bin"]),
           "JUPYTER_CONFIG_PATH=" + str(Path(cfg["etc"]) / role)]
    if role == "instructor":  # the course's code, which its nbgrader_config.py names (as the hub does)
        env.append("PYTHONPATH=" + cfg["course"])
    # the user's own TMPDIR and torch.compile/Triton caches in their home, 0700 (as the hub's spawner
    # gives their server): made by the user's own shell, each checked to be a folder of theirs
    from class_server.spawner import private_env

    private = private_env(pw.pw_dir)
    env += [f"{k}={v}" for k, v in private.items()]
    cmd = ["runuser", "-u", user, "--", "env", "-i", *env, "sh", "-c", PRIVATE_SH, str(cwd or ""),
           *private.values()]
    # a session of its own and no terminal: the user's code (an instructor's nbgrader_config.py runs
    # here) must not reach root's terminal, where TIOCSTI would type commands into root's shell.
    # Output to files, not pipes: a process the command leaves behind (the user's code may start
    # one) would hold a pipe open, and reading it to its end would wait for that process.
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd + ["--", *argv], stdout=out, stderr=err, start_new_session=True,
                                stdin=subprocess.DEVNULL if input is None else subprocess.PIPE)
        try:
            proc.communicate(input=None if input is None else input.encode(), timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            err.seek(0)
            raise ClassError(f"{' '.join(argv)} (as {user}) did not finish within {timeout:g} s and was "
                             f"stopped; its last output:\n{err.read()[-2000:].decode(errors='replace')}") from None
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(cmd, proc.returncode, out.read().decode(errors="replace"),
                                           err.read().decode(errors="replace"))


# ------------------------------------------------------------------------------------------------
# The class's Python
# ------------------------------------------------------------------------------------------------

def _world_executable(path: Path) -> bool:
    """Whether a user with no group in common with the owners can run ``path``."""
    path = path.resolve()
    if not path.is_file() or not path.stat().st_mode & stat.S_IXOTH:
        return False
    return all(d.stat().st_mode & stat.S_IXOTH for d in path.parents)


def _link_copy(src: Path, dst: Path, skip: Path) -> None:
    """``cp -al src dst`` (``cp -a`` across file systems), leaving out ``skip``."""
    dst.mkdir()
    shutil.copystat(src, dst)
    for e in src.iterdir():
        if e == skip:
            continue
        if skip.is_relative_to(e) and e.is_dir() and not e.is_symlink():
            _link_copy(e, dst / e.name, skip)
        elif subprocess.run(["cp", "-al", str(e), str(dst / e.name)]).returncode != 0:
            run("cp", "-a", str(e), str(dst / e.name))


def base_python(class_dir: Path) -> Path:
    """The interpreter this venv was made from, runnable by every user: itself when it is, else a
    copy of its installation in ``CLASS_DIR/python`` (hard links; a pyenv under /root is not
    reachable by other users). Not another Python of the same minor version: the venv's packages
    are installed for this one (soupsieve, which nbgrader's feedback uses, fails on Python 3.11.2's
    ``re`` and works on 3.11.7's)."""
    ver = f"{sys.version_info.major}.{sys.version_info.minor}"
    exe = Path(sys._base_executable if hasattr(sys, "_base_executable") else sys.executable).resolve()
    prefix = Path(sys.base_prefix).resolve()
    if _world_executable(exe) and all(_world_executable(p) for p in (prefix / "lib").glob("libpython*.so*")
                                      if p.is_file()):
        return exe
    copy = class_dir / "python"
    if not (copy / "bin" / exe.name).exists():
        log(f"{exe} is not runnable by every user: copying {prefix} to {copy}")
        tmp = class_dir / "python.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        _link_copy(prefix, tmp, skip=prefix / "lib" / f"python{ver}" / "site-packages")  # not its packages
        (tmp / "lib" / f"python{ver}" / "site-packages").mkdir()
        # The interpreter finds libpython through its RUNPATH, an absolute path into the original:
        # rewrite it in place to $ORIGIN/../lib (shorter, padded with NULs, as patchelf does).
        binary = tmp / "bin" / exe.name
        data = binary.read_bytes()
        old, new = (str(prefix) + "/lib").encode() + b"\0", b"$ORIGIN/../lib"
        if data.count(old) == 1 and len(new) < len(old):
            data = data.replace(old, new.ljust(len(old), b"\0"))
        binary.unlink()
        binary.write_bytes(data)
        binary.chmod(0o755)
        tmp.rename(copy)
    exe = copy / "bin" / exe.name
    probe = subprocess.run(["runuser", "-u", "nobody", "--", str(exe), "-c", "import sys, ssl, sqlite3"],
                           stdin=subprocess.DEVNULL, start_new_session=True,
                           capture_output=True, text=True)
    if probe.returncode != 0:
        raise ClassError(f"{exe} does not run for other users:\n{probe.stderr[-2000:]}\n"
                         f"Build .venv from a Python every user can run (e.g. under /usr/local or /opt).")
    return exe


def build_env(class_dir: Path) -> Path:
    """``CLASS_DIR/venv``: a venv of :func:`base_python` holding this venv's packages (hard links:
    seconds, no second copy on disk) without the editable install that points at this checkout, and
    the student pack's runtime (the coursekit wheel) installed."""
    from course.pack import build_wheel

    dest = class_dir / "venv"
    src_site = Path(sysconfig.get_paths()["purelib"])
    rel_site = src_site.relative_to(sys.prefix)
    stamp = dest / ".built-from"
    want = f"{sys.prefix}\n{src_site.stat().st_mtime_ns}\n"
    if not (stamp.exists() and stamp.read_text() == want):
        if dest.exists():
            shutil.rmtree(dest)
        log(f"building the class's Python in {dest} from {sys.prefix}")
        run(str(base_python(class_dir)), "-m", "venv", "--without-pip", str(dest))
        shutil.rmtree(dest / rel_site)
        for sub in (rel_site, Path("share"), Path("etc")):
            if (Path(sys.prefix) / sub).exists():
                (dest / sub).parent.mkdir(parents=True, exist_ok=True)
                if subprocess.run(["cp", "-al", str(Path(sys.prefix) / sub), str(dest / sub)]).returncode != 0:
                    run("cp", "-a", str(Path(sys.prefix) / sub), str(dest / sub))  # another file system
        for p in (dest / rel_site).iterdir():  # the editable install of this checkout (instructor code)
            if p.name.startswith("__editable__") or p.name.startswith("resnorm_course"):
                shutil.rmtree(p) if p.is_dir() else p.unlink()
        py = str(dest / "bin" / "python")
        for script in (Path(sys.prefix) / "bin").iterdir():
            if script.name.startswith(("python", "activate", "Activate")) or not script.is_file():
                continue
            data = script.read_bytes()
            first, nl, rest = data.partition(b"\n")
            if first.startswith(b"#!") and b"python" in first:
                target = dest / "bin" / script.name
                target.write_bytes(b"#!" + py.encode() + nl + rest)
                target.chmod(0o755)
        kernel = dest / "share" / "jupyter" / "kernels" / "python3" / "kernel.json"
        if kernel.exists():  # a copy (not a link) naming the class's interpreter
            spec = json.loads(kernel.read_text())
            kernel.unlink()
            spec["argv"][0] = py
            kernel.write_text(json.dumps(spec, indent=1))
        stamp.write_text(want)
    wheels = class_dir / "hub" / "wheels"
    wheel = build_wheel(wheels)
    run(str(dest / "bin" / "python"), "-m", "pip", "install", "-qq", "--no-deps", "--no-index",
        "--force-reinstall", "--disable-pip-version-check", str(wheel))
    shutil.copy(HERE / "exchange.py", dest / rel_site / "class_server_exchange.py")
    # the hub's spawner (a cgroup per user's server) and the grader's cgroup code it uses
    shutil.copy(HERE / "spawner.py", dest / rel_site / "class_server_spawner.py")
    shutil.copy(ROOT / "autograder" / "sandbox" / "cgroups.py", dest / rel_site / "class_server_cgroups.py")
    for d, _, files in os.walk(dest):
        for f in files:
            p = Path(d) / f
            if not p.is_symlink() and not p.stat().st_mode & stat.S_IROTH:
                raise ClassError(f"{p} is not readable by every user; the class's Python must be")
    return dest


DEFAULT_EXCHANGE = Path("/usr/local/share/nbgrader/exchange")  # nbgrader's default, and the course's


def student_env(env_dir: Path, exchange: Path = DEFAULT_EXCHANGE, instructor: str = "root",
                group: str | None = None) -> Path:
    """The students' Python on a shared machine without the class server (``python -m class_server
    env``, as root): ``ENV_DIR/venv``, the class server's environment (:func:`build_env`: nbgrader,
    JupyterLab, torch and the course's runtime, runnable by every user), configured for the exchange
    at ``exchange`` in its own ``etc/jupyter/nbgrader_config.py``, which nbgrader and Jupyter read
    from any Python's prefix. Students run ``ENV_DIR/venv/bin/nbgrader ...`` or
    ``ENV_DIR/venv/bin/jupyter lab``; the course's ``.venv`` is not for them (its interpreter may
    live where only its owner can read, e.g. a pyenv under /root). The exchange is made as the class
    server makes its own (:func:`harden_exchange`: a sticky root, the course's folder the
    ``instructor``'s, in ``group``, default the instructor's own), and students' submissions are
    readable by the instructors only (``class_server_exchange.PrivateSubmit``). Returns the venv."""
    pw = pwd.getpwnam(instructor)
    gid = grp.getgrnam(group).gr_gid if group else pw.pw_gid
    harden_exchange(Path(exchange), pw.pw_uid, gid)
    env_dir = Path(env_dir).resolve()
    env_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(env_dir, 0o755)
    venv = build_env(env_dir)
    conf = venv / "etc" / "jupyter" / "nbgrader_config.py"
    conf.parent.mkdir(parents=True, exist_ok=True)
    if conf.exists() or conf.is_symlink():
        conf.unlink()  # never write through a hard link into the course's own .venv (build_env links it)
    conf.write_text(
        "# The students' nbgrader on this machine (python -m class_server env): the course's exchange.\n"
        "c = get_config()  # noqa: F821\n"
        f"c.Exchange.root = {str(exchange)!r}\n"
        f"c.CourseDirectory.course_id = {COURSE_ID!r}\n"
        "# submissions only the instructors can read (class_server/exchange.py)\n"
        "c.ExchangeFactory.submit = 'class_server_exchange.PrivateSubmit'\n")
    os.chmod(conf, 0o644)
    return venv


# ------------------------------------------------------------------------------------------------
# The course, the exchange, the Jupyter config of each role
# ------------------------------------------------------------------------------------------------

def _share_with_group(path: Path, gid: int) -> None:
    """root:<instructors>, group read/write, setgid folders, nothing for others. Only on a tree in
    root's ``hub/staging`` (nobody else can put a link in it while this runs)."""
    for d, dirs, files in os.walk(path):
        os.chown(d, 0, gid)
        os.chmod(d, 0o2770)
        for f in files:
            p = Path(d) / f
            os.chown(p, 0, gid, follow_symlinks=False)
            if not p.is_symlink():
                os.chmod(p, 0o660 | (p.stat().st_mode & 0o110))


def make_course(class_dir: Path, group: str, exchange: Path) -> Path:
    """The instructors' course directory. The instructors' material (``nbgrader_config.py``,
    ``solutions/``, ``exercises/``) is copied once and then theirs; the grader's code (``autograder/``,
    ``course/``, ``coursekit/``) is this checkout's at every ``up``, like the students' coursekit.
    The instructors can write the course: each item is made in ``hub/staging`` (root's), given its
    owner and modes there, and renamed into place (:func:`put_in_place`)."""
    course = class_dir / "course"
    gid = grp.getgrnam(group).gr_gid
    staging = class_dir / "hub" / "staging"
    staging.mkdir(mode=0o700, exist_ok=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".ipynb_checkpoints")
    first = not course.exists()
    if first:
        log(f"copying the course into {course}")
        course.mkdir(mode=0o700)
    if course.is_symlink() or not course.is_dir():
        raise ClassError(f"{course} is not a folder")
    for name in COURSE_FILES:
        src = ROOT / name
        if name not in CODE and not first:
            continue
        work = Path(tempfile.mkdtemp(dir=staging, prefix="new."))
        staged = work / name
        shutil.copytree(src, staged, ignore=ignore) if src.is_dir() else shutil.copy(src, staged)
        if name == "nbgrader_config.py":
            with open(staged, "a") as f:
                f.write("\n# The class server (python -m class_server up): this course's exchange, shared by its\n"
                        "# instructors (files nbgrader writes are group-writable).\n"
                        f"c.Exchange.root = {str(exchange)!r}\n"
                        "c.CourseDirectory.groupshared = True\n")
        if staged.is_dir():
            _share_with_group(staged, gid)
        else:
            os.chown(staged, 0, gid)
            os.chmod(staged, 0o660)
        try:
            put_in_place(staged, course / name, staging)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    os.chown(course, 0, gid, follow_symlinks=False)
    os.chmod(course, 0o2770)  # course/ is in CLASS_DIR (root's, 0755): nobody else can swap it
    return course


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _trusted(owner: int, uid: int, gid: int) -> bool:
    """Whether ``owner`` is root, the instructor ``uid`` or a member of the instructors' group ``gid``."""
    if owner in (0, uid):
        return True
    try:
        pw = pwd.getpwuid(owner)
        return pw.pw_gid == gid or pw.pw_name in grp.getgrgid(gid).gr_mem
    except KeyError:
        return False


def make_exchange(class_dir: Path, group: str, first_instructor: str) -> Path:
    """nbgrader's exchange for a multi-user hub: see :func:`harden_exchange`."""
    return harden_exchange(class_dir / "exchange", pwd.getpwnam(first_instructor).pw_uid, grp.getgrnam(group).gr_gid)


def harden_exchange(exchange: Path, uid: int, gid: int) -> Path:
    """nbgrader's exchange for several users on one machine: a root everyone may write (sticky, so
    nobody renames or removes another's entry, the course's folder included), the course's folder
    owned by the instructor ``uid`` and group ``gid``, and its ``inbound/`` as below."""
    exchange.mkdir(parents=True, exist_ok=True)
    # everyone writes it (nbgrader's fetch and submit refuse to run unless they could), sticky: no one
    # renames or removes another's entry. A course a student opens here beside the real one is not
    # listed to the others: their nbgrader config names the course (write_jupyter_config, env)
    secure_chown(exchange, 0, 0, 0o1777, folder=True)
    mine = exchange / COURSE_ID  # in a folder everyone writes: what is there may be anyone's link
    try:
        mine.mkdir()
    except FileExistsError:
        # made before the exchange was made safe (stock nbgrader's is 0777): by whom? A student's
        # folder there, or one of theirs in it, would stay theirs (the owner of inbound/ lists,
        # removes and, through its group, reads every submission): refused, nothing is changed.
        for p in (mine, mine / "inbound", mine / "outbound", mine / "feedback"):
            try:
                owner = os.lstat(p).st_uid
            except OSError:  # gone meanwhile: nothing there to trust or refuse
                continue
            if not _trusted(owner, uid, gid):
                raise ClassError(f"{p} belongs to {_user_name(owner)}, who is not an instructor: "
                                 f"someone made it before the exchange was made safe; look at it, remove "
                                 f"{mine}, and run again")
    # From here on by descriptor: the course's folder is the instructor's, who may rename it (a
    # sticky root lets an owner rename their own entry) and put a link in its place, so nothing
    # below it is reached by name: inbound/ is made and changed relative to the folder opened.
    try:
        fd = os.open(mine, _NOFOLLOW_DIR)
    except OSError as e:
        raise ClassError(f"{mine}: not changed, it is not a folder ({e.strerror}; a symbolic link?): "
                         "remove it and run again") from None
    try:
        if not _trusted(os.fstat(fd).st_uid, uid, gid):
            raise ClassError(f"{mine} belongs to {_user_name(os.fstat(fd).st_uid)}, who is not an instructor: "
                             "look at it, remove it, and run again")
        os.fchown(fd, uid, gid)
        os.fchmod(fd, 0o2775)
        # inbound/ as nbgrader's release_assignment makes it for a shared course (students write, do
        # not list; setgid: each submission gets the instructors' group), plus the sticky bit: a
        # student who learns another's folder name still cannot remove or rename it.
        # release_assignment keeps the mode of an inbound/ that exists.
        try:
            os.mkdir("inbound", 0o700, dir_fd=fd)
            made = True
        except FileExistsError:
            made = False
        try:
            ifd = os.open("inbound", _NOFOLLOW_DIR, dir_fd=fd)
        except OSError as e:
            raise ClassError(f"{mine / 'inbound'}: not changed, it is not a folder ({e.strerror}; a symbolic "
                             "link?): remove it and run again") from None
        try:
            st = os.fstat(ifd)
            if not made and not _trusted(st.st_uid, uid, gid):
                raise ClassError(f"{mine / 'inbound'} belongs to {_user_name(st.st_uid)}, who is not an "
                                 "instructor: look at it, remove it, and run again")
            os.fchown(ifd, uid if made else st.st_uid, gid)
            os.fchmod(ifd, 0o3773)
        finally:
            os.close(ifd)
    finally:
        os.close(fd)
    return exchange


def write_jupyter_config(class_dir: Path, course: Path, exchange: Path) -> Path:
    etc = class_dir / "etc"
    for role in ("student", "instructor"):
        (etc / role / "labconfig").mkdir(parents=True, exist_ok=True)
    (etc / "student" / "nbgrader_config.py").write_text(
        "# Students (JUPYTER_CONFIG_PATH of their servers): the class's exchange, and submissions\n"
        "# that only the instructors can read (class_server/exchange.py).\n"
        "c = get_config()  # noqa: F821\n"
        f"c.Exchange.root = {str(exchange)!r}\n"
        "# the class's course only: a course a student opens in the exchange is not listed, fetched\n"
        "# or submitted to (the Assignments tab would list every course, the first one first)\n"
        f"c.CourseDirectory.course_id = {COURSE_ID!r}\n"
        "c.ExchangeFactory.submit = 'class_server_exchange.PrivateSubmit'\n")
    # The servers' kernels talk to them over Unix sockets beside their connection files (the user's
    # own runtime folder), not TCP ports on 127.0.0.1: a kernel's ports are chosen by binding port 0
    # and closing it, and with a class starting kernels at once another process, or any outgoing
    # connection, can take one first (a CI run of the load test: "zmq.error.ZMQError: Address
    # already in use", the kernel restarted on the same ports until the server gave up); nor can
    # another user reach the sockets. Only the servers read this file: a kernel that nbconvert or
    # nbgrader starts resolves a relative socket name in its own working folder, not its client's.
    kernels = {"KernelManager": {"transport": "ipc"}}
    (etc / "student" / "jupyter_server_config.json").write_text(json.dumps(
        {"ServerApp": {"jpserver_extensions": {"nbgrader.server_extensions.formgrader": False}}, **kernels}, indent=1))
    (etc / "instructor" / "jupyter_server_config.json").write_text(json.dumps(kernels, indent=1))
    (etc / "student" / "labconfig" / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {"@jupyter/nbgrader:formgrader": True, "@jupyter/nbgrader:create-assignment": True,
                                **QUIET}}, indent=1))
    (etc / "instructor" / "nbgrader_config.py").write_text(
        "# Instructors (JUPYTER_CONFIG_PATH of their servers): the course and its exchange.\n"
        "c = get_config()  # noqa: F821\n"
        f"c.CourseDirectory.root = {str(course)!r}\n"
        f"c.CourseDirectory.course_id = {COURSE_ID!r}\n"
        f"c.Exchange.root = {str(exchange)!r}\n"
        "c.CourseDirectory.groupshared = True\n"
        "# collect only what is the student's own (autograder/nbgrader/collect.py; also in the course's\n"
        "# nbgrader_config.py, which a course made before it may lack)\n"
        "c.ExchangeFactory.collect = 'autograder.nbgrader.collect.CheckedCollect'\n"
        "c.ExchangeFactory.release_feedback = 'autograder.nbgrader.release_feedback.ReleaseFeedback'\n")
    (etc / "instructor" / "labconfig" / "page_config.json").write_text(json.dumps({"disabledExtensions": QUIET}))
    for d, _, files in os.walk(etc):
        os.chmod(d, 0o755)
        for f in files:
            os.chmod(Path(d) / f, 0o644)
    return etc


PROFILE_DIR = Path("/etc/profile.d")


def write_profile(state: dict) -> Path:
    """``/etc/profile.d/class_server-<group>.sh``: a login shell of a member of the instructors'
    group (``su - INSTRUCTOR``, ssh) gets what the hub gives the instructors' servers: the class's
    Python first on PATH, the course's code on PYTHONPATH, the instructors' Jupyter config.
    ``down`` removes it."""
    profile = PROFILE_DIR / f"class_server-{state['group']}.sh"
    venv_bin = str(Path(state["venv"]) / "bin")
    profile.write_text(
        f"# The class server in {Path(state['course']).parent} (python -m class_server up; `down` removes this file):\n"
        f"# the instructors ({state['group']}) get the class's Python and the course's nbgrader config.\n"
        f'case " $(id -Gn 2>/dev/null) " in\n'
        f'  *" {state["group"]} "*)\n'
        f'    PATH="{venv_bin}:$PATH"\n'
        f'    PYTHONPATH="{state["course"]}${{PYTHONPATH:+:$PYTHONPATH}}"\n'
        f'    JUPYTER_CONFIG_PATH="{Path(state["etc"]) / "instructor"}"\n'
        f"    OMP_NUM_THREADS=1\n"
        f"    export PATH PYTHONPATH JUPYTER_CONFIG_PATH OMP_NUM_THREADS\n"
        f"    ;;\n"
        f"esac\n")
    os.chmod(profile, 0o644)
    state["profile"] = str(profile)
    (Path(state["course"]).parent / "hub" / "class.json").write_text(json.dumps(state, indent=1))
    return profile


def lock_checkout() -> int | None:
    """This checkout holds solutions/, course/hidden/ and their git history: nobody but its owner
    may read it while students have accounts here. Returns the mode it had when it changed."""
    mode = stat.S_IMODE(ROOT.stat().st_mode)
    if mode & 0o077:
        os.chmod(ROOT, mode & 0o700)
        log(f"{ROOT} was readable by others (mode {mode:o}): now {mode & 0o700:o}")
        return mode
    return None


# ------------------------------------------------------------------------------------------------
# Up and down
# ------------------------------------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _hub_pid(class_dir: Path) -> int | None:
    f = class_dir / "hub" / "up.pid"
    if not f.exists():
        return None
    pid = int(f.read_text())
    try:
        os.kill(pid, 0)
        return pid
    except ProcessLookupError:
        return None


# ------------------------------------------------------------------------------------------------
# Limits per user's server (class_server/spawner.py: a cgroup each)
# ------------------------------------------------------------------------------------------------

#: what one student's server (JupyterLab, its kernels and terminals together) may use
STUDENT_LIMITS = {"memory_mb": 2048, "cpus": 1.0, "pids": 512}


def default_limits(student: dict | None = None, instructor: dict | None = None) -> dict:
    """Each role's limits: ``memory_mb`` (all the server's processes together), ``cpus`` (cores of
    CPU time), ``pids`` (processes and threads). Students :data:`STUDENT_LIMITS`; instructors, who
    grade on the hub, three quarters of the machine's memory, every core and 4096 processes, their
    group delegated to them (the grader makes a group per submission inside it)."""
    from autograder.sandbox import cgroups

    out = {"student": dict(STUDENT_LIMITS),
           "instructor": {"memory_mb": cgroups.default_memory_mb(1), "cpus": float(os.cpu_count() or 1),
                          "pids": 4096}}
    for role, given in (("student", student), ("instructor", instructor)):
        out[role].update({k: v for k, v in (given or {}).items() if v is not None})
    return out


def check_limits() -> None:
    """Raise :class:`ClassError` unless this machine can give each user's server a cgroup."""
    from autograder.sandbox import cgroups

    try:
        cgroups.create(64, 16, 0.1).close()
    except cgroups.CgroupUnavailable as e:
        raise ClassError(f"{e}\n(for the class server: `up --no-limits` starts it without limits per user)") from None


#: seconds `up` gives `nbgrader db student import` (run as the first instructor, with the course's config)
IMPORT_TIMEOUT = 600


def up(roster: Path, class_dir: Path, ip: str = "127.0.0.1", port: int = 8000, group: str = "resnorm-instructors",
       wait: float = 180, limits: dict | None = None) -> dict:
    """Lay out the class (:func:`prepare`) and start JupyterHub."""
    class_dir = class_dir.resolve()
    state = prepare(roster, class_dir, ip=ip, port=port, group=group, limits=limits)
    return start_hub(class_dir, state, wait=wait)


def prepare(roster: Path, class_dir: Path, ip: str = "127.0.0.1", port: int = 8000,
            group: str = "resnorm-instructors", limits: dict | None = None) -> dict:
    """Everything ``up`` does but start the hub: accounts, the class's Python, the exchange, the
    course, the Jupyter config, the instructors' profile. Returns the class's state (class.json).
    ``limits``: {role: {memory_mb, cpus, pids}} over :func:`default_limits`; ``{"off": True}``: none."""
    if os.geteuid() != 0:
        raise ClassError("run as root: it creates unix accounts and starts a server for each user as that user")
    if not PROXY.exists():
        raise ClassError(f"{PROXY} is missing: `make class-server` installs configurable-http-proxy from npm")
    class_dir = class_dir.resolve()
    if _hub_pid(class_dir):
        raise ClassError(f"a class server already runs from {class_dir} (python -m class_server down --dir {class_dir})")
    people = read_roster(roster)
    if (limits or {}).get("off"):
        limits = None
    else:
        check_limits()
        limits = default_limits((limits or {}).get("student"), (limits or {}).get("instructor"))
    instructors = [p["id"] for p in people if p["role"] == "instructor"]
    students = [p["id"] for p in people if p["role"] == "student"]
    class_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(class_dir, 0o755)
    hub = class_dir / "hub"
    hub.mkdir(exist_ok=True)
    os.chmod(hub, 0o700)
    state_file = hub / "class.json"
    state = json.loads(state_file.read_text()) if state_file.exists() else {"created_users": []}

    if ensure_group(group):
        state["created_group"] = group
    created = ensure_accounts(people, group)
    # Recorded at once, so that `down --remove-users` finds them even if a later step fails.
    state["created_users"] = sorted(set(state["created_users"]) | set(created))
    state.setdefault("instructors", instructors)
    state.setdefault("students", students)
    state_file.write_text(json.dumps(state, indent=1))
    if created:
        pw_file = class_dir / "passwords.csv"
        new = not pw_file.exists()
        with open(os.open(pw_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "a", newline="") as f:
            w = csv.writer(f, lineterminator="\n")  # LF: `cut -d, -f2` gives the password, no \r
            if new:
                w.writerow(["id", "password"])
            w.writerows(created.items())
        log(f"created {len(created)} accounts; their first passwords are in {pw_file} (root only)")
    old_mode = lock_checkout()
    venv = build_env(class_dir)
    exchange = make_exchange(class_dir, group, instructors[0])
    course = make_course(class_dir, group, exchange)
    etc = write_jupyter_config(class_dir, course, exchange)
    state.update({
        "ip": ip, "port": port, "hub_port": _free_port(), "proxy_api_port": _free_port(), "proxy": str(PROXY),
        "venv": str(venv), "course": str(course), "exchange": str(exchange), "etc": str(etc), "group": group,
        "instructors": instructors, "students": students, "checkout": str(ROOT), "limits": limits,
        "created_users": sorted(set(state["created_users"]) | set(created)),
    })
    if old_mode is not None:
        state.setdefault("checkout_mode", old_mode)
    state_file.write_text(json.dumps(state, indent=1))
    shutil.copy(HERE / "jupyterhub_config.py", hub / "jupyterhub_config.py")

    # Names in the formgrader: the roster's students, in the course's gradebook (as an instructor).
    # The instructors can write course/: roster.csv is written anew and renamed over whatever is
    # there, gradebook.db is changed only through a descriptor opened without following links.
    gid = grp.getgrnam(group).gr_gid
    rows = io.StringIO()
    w = csv.DictWriter(rows, ["id", "first_name", "last_name", "email"], extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    w.writerows(p for p in people if p["role"] == "student")
    replace_file(course / "roster.csv", rows.getvalue(), 0, gid, 0o660, hub / "staging")
    gradebook = course / "gradebook.db"  # every instructor writes it (the formgrader, the grader)
    if os.path.lexists(gradebook) and not stat.S_ISREG(os.lstat(gradebook).st_mode):
        raise ClassError(f"{gradebook} is not a regular file (a symbolic link?): not touched; remove it "
                         f"(or put the real gradebook there) and run `up` again")
    proc = as_user(instructors[0], ["nbgrader", "db", "student", "import", "roster.csv"], class_dir, cwd=course,
                   timeout=IMPORT_TIMEOUT)
    if proc.returncode != 0:
        raise ClassError(f"nbgrader db student import failed:\n{proc.stdout}{proc.stderr}")
    secure_chown(gradebook, -1, gid, 0o660)
    write_profile(state)
    return state


def start_hub(class_dir: Path, state: dict, wait: float = 180) -> dict:
    hub, venv, ip, port = class_dir / "hub", Path(state["venv"]), state["ip"], state["port"]
    instructors, students = state["instructors"], state["students"]
    logf = open(hub / "jupyterhub.log", "a")
    env = {"PATH": os.pathsep.join([str(venv / "bin"), "/usr/local/bin", "/usr/bin", "/bin"]),
           "LANG": "C.UTF-8", "HOME": "/root"}
    hubproc = subprocess.Popen([str(venv / "bin" / "jupyterhub"), "-f", str(hub / "jupyterhub_config.py")],
                               cwd=hub, env=env, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                               start_new_session=True)
    (hub / "up.pid").write_text(str(hubproc.pid))
    url = f"http://{ip}:{port}"
    deadline = time.monotonic() + wait
    while True:
        if hubproc.poll() is not None:
            raise ClassError(f"jupyterhub exited ({hubproc.returncode}); its log, {hub / 'jupyterhub.log'}:\n"
                             + (hub / "jupyterhub.log").read_text()[-3000:])
        try:
            with urllib.request.urlopen(f"{url}/hub/api", timeout=5) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if time.monotonic() > deadline:
            down(class_dir)
            raise ClassError(f"jupyterhub did not answer on {url} within {wait:.0f} s; see {hub / 'jupyterhub.log'}")
        time.sleep(0.5)
    log(f"the class server is up on {url}: {len(students)} student{'' if len(students) == 1 else 's'}, "
        f"instructor{'' if len(instructors) == 1 else 's'} {', '.join(instructors)}")
    return {"url": url, "pid": hubproc.pid, **state}


def _kill_group(pid: int, timeout: float) -> None:
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10)):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                return
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            time.sleep(0.2)


def group_pids(pgid: int) -> list[int]:
    """The processes of one process group (the hub's: the hub, the proxy, what they started)."""
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                pids.append(int(d.name))
    return pids


def user_pids(uids: set[int]) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if d.stat().st_uid in uids:
                    pids.append(int(d.name))
            except FileNotFoundError:
                pass
    return pids


def hub_cgroups(pid: int) -> list[Path]:
    """The cgroups the hub ``pid`` made for its users' servers (class_server/spawner.py: named
    ``autograder-<pid>-...`` below the hub's own cgroup, in each hierarchy)."""
    from autograder.sandbox import cgroups

    found: list[Path] = []
    try:
        ver, mounts = cgroups.version(), cgroups._mounts()
        own = {}
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, names, path = line.split(":", 2)
            for n in names.split(",") if names else [""]:
                own[n] = path
    except (OSError, ValueError):
        return found
    for c in ([""] if ver == 2 else list(cgroups.CONTROLLERS) if ver == 1 else []):
        if c not in mounts:
            continue
        parent = cgroups._under(*mounts[c], own.get(c, "/"))
        for d in (parent, parent.parent) if parent.name == "grader" else (parent,):
            found += sorted(d.glob(f"autograder-{pid}-*"))
    return found


#: the folders every user may write, where a removed account's files would stay
SHARED_TMP = ("/tmp", "/var/tmp", "/dev/shm")


def remove_files_of(uids: set[int]) -> tuple[int, int]:
    """Delete what the users ``uids`` own in :data:`SHARED_TMP` (find: its own file system only,
    never following a link, deepest first). Returns (removed, left)."""
    removed = left = 0
    for top in SHARED_TMP:
        if not os.path.isdir(top) or os.path.islink(top):
            continue
        who = []
        for uid in sorted(uids):
            who += (["-o"] if who else []) + ["-uid", str(uid)]
        proc = subprocess.run(["find", top, "-xdev", "-mindepth", "1", "-depth", "(", *who, ")", "-print0",
                               "-delete"], capture_output=True, stdin=subprocess.DEVNULL)
        failed = proc.stderr.count(b"cannot delete")
        removed += proc.stdout.count(b"\0") - failed
        left += failed
    return removed, left


def down(class_dir: Path, remove_users: bool = False, purge: bool = False, timeout: float = 30) -> list[str]:
    """Stop the hub (which stops every user's server), then every process left of the class's
    users; optionally remove the accounts ``up`` created, and the whole class folder. Says what it
    did, one line each (on stderr), and returns those lines."""
    done = []

    def said(msg: str) -> None:
        done.append(msg)
        log(msg)

    class_dir = class_dir.resolve()
    state_file = class_dir / "hub" / "class.json"
    state = json.loads(state_file.read_text()) if state_file.exists() else {}
    if not state:
        said(f"no class in {class_dir} (no hub/class.json)")
    pid = _hub_pid(class_dir)
    groups = hub_cgroups(pid) if pid else []
    if pid:
        _kill_group(pid, timeout)
        said(f"stopped jupyterhub (pid {pid}) and the users' servers it started")
    elif state:
        said(f"jupyterhub was not running from {class_dir}")
    (class_dir / "hub" / "up.pid").unlink(missing_ok=True)
    uids = set()
    for u in state.get("instructors", []) + state.get("students", []):
        try:
            uids.add(pwd.getpwnam(u).pw_uid)
        except KeyError:
            pass
    uids.discard(0)
    killed = set()
    for _ in range(3):
        pids = user_pids(uids)
        if not pids:
            break
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
                killed.add(p)
            except ProcessLookupError:
                pass
        time.sleep(0.5)
    if killed:
        said(f"killed {len(killed)} process{'' if len(killed) == 1 else 'es'} left of the class's users")
    removed = 0
    for g in groups:  # the users' servers' cgroups (the hub removes each when the server stops), and
        subs = sorted((p for p in g.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
        for d in subs + [g]:  # those an instructor made inside theirs, deepest first (their processes are killed above)
            for _ in range(50):
                try:
                    d.rmdir()
                    removed += d == g
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
    if removed:
        said(f"removed {removed} cgroup folder{'' if removed == 1 else 's'} of the users' servers")
    profile = state.get("profile")
    if profile and os.path.lexists(profile):
        os.unlink(profile)
        said(f"removed the instructors' profile {profile}")
    if remove_users:
        users = [u for u in state.get("created_users", []) if user_exists(u)]
        gone_uids = {pwd.getpwnam(u).pw_uid for u in users} - {0}
        remove_accounts(users, state.get("created_group"))
        said(f"removed {len(users)} account{'' if len(users) == 1 else 's'} `up` had created, with their homes"
             + (f": {', '.join(users)}" if users else ""))
        if gone_uids:
            removed_n, left_n = remove_files_of(gone_uids)
            said(f"removed {removed_n} file{'' if removed_n == 1 else 's'} and folders of those accounts in "
                 f"{', '.join(SHARED_TMP)} (a later account with the same uid would own them)"
                 + (f"; {left_n} could not be removed (folders holding others' files): look at them" if left_n else ""))
        if state.get("created_group"):
            said(f"removed the group {state['created_group']}")
        checkout, mode = state.get("checkout"), state.get("checkout_mode")
        left = [u for u in state.get("students", []) if user_exists(u)]
        if checkout and mode is not None and left:
            said(f"{checkout} stays readable by its owner only: {len(left)} of the class's students still "
                 f"have accounts (not made by `up`)")
        elif checkout and mode is not None and Path(checkout).is_dir():
            os.chmod(checkout, mode)
            said(f"gave {checkout} its mode back ({mode:o}; `up` had made it {0o700:o} while the class's accounts existed)")
    elif state.get("checkout_mode") is not None:
        said(f"{state.get('checkout')} stays readable by its owner only while the class's accounts exist "
             f"(--remove-users gives it its mode back, {state['checkout_mode']:o})")
    if purge:
        # rm, not shutil.rmtree: a student's folder nested thousands deep in the exchange would stop
        # Python's recursion; rm walks any depth, and never follows a link out of the tree
        gone = subprocess.run(["rm", "-rf", "--one-file-system", "--", str(class_dir)], capture_output=True,
                              text=True, stdin=subprocess.DEVNULL)
        if gone.returncode == 0:
            said(f"deleted {class_dir} (the course, its gradebook, the exchange, the class's Python)")
        else:
            said(f"could not delete all of {class_dir}: {gone.stderr.strip()[-300:]}")
    elif state:
        said(f"kept {class_dir} (the course, its gradebook, the exchange): `up` brings the class back; --purge deletes it")
    return done
