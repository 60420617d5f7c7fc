"""nbgrader's ``collect``, taking only what is really the student's.

Stock ``nbgrader collect`` runs as the instructor and copies ``inbound/<student>+<assignment>+<time>+<random>/``
with ``shutil.copytree``, which follows symbolic links: a student who puts in their folder a link to
``course/solutions/.../layernorm.ipynb``, or to another student's ``submitted/`` notebook, has the
instructor copy what the link points to, which the instructor can read and the student cannot. It
also trusts the folder's name: a folder named after another student (made by anyone: ``inbound/`` is
writable by all) is collected as that student's, and the newest *claimed* time wins, so a folder
claiming a time in the future hides every later real submission of that student ("No newer
submission to collect").

:class:`CheckedCollect` (``c.ExchangeFactory.collect`` in the course's ``nbgrader_config.py``)
collects a folder only when

- it, and everything in it, is a folder or a regular file (no symbolic link anywhere, no fifo,
  socket or device), opened without following links (``O_NOFOLLOW``, each entry relative to its
  folder's descriptor), and checked on the descriptor it is then copied from, so that swapping an
  entry for a link while collect runs gains nothing;
- with ``CollectApp.check_owner`` (the default), it and everything in it belong (owner uid) to the
  unix user whose name it carries; without it, to the folder's own owner (hard links to another
  user's file are refused either way);
- it holds at most :data:`MAX_FILES` files and folders together, and each file is copied only up to
  the size checked: a file that has more bytes than that, or whose size, mtime or ctime changed
  while it was copied (the student may write it meanwhile: a sparse ``truncate`` to gigabytes costs
  them nothing), refuses the folder;
- it holds ``timestamp.txt`` and ``submission_secret.txt`` (``release_feedback`` needs the secret),
  and ``timestamp.txt`` gives the time in its name;
- that time is not later than the folder's files were last changed (their ``ctime``, which no
  user can set), plus ``future_slack`` seconds, nor earlier than that minus ``timestamp_slack``
  seconds (a submission changed after it was handed in, or backdated past a due date).

Anything else is refused: never copied, and listed (folder and reason) in the log, at the end,
for the instructor. A student's submissions are ordered by when they were really made (the
``ctime`` above), not by the time their names claim; and an existing ``submitted/`` copy whose
``timestamp.txt`` lies in the future (collected before this check) is replaced by ``--update``.
"""
from __future__ import annotations

import datetime
import fnmatch
import os
import shutil
import stat

from nbgrader.exchange.default.collect import ExchangeCollect, groupby
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.utils import parse_utc
from traitlets import Integer

try:
    import pwd
except ImportError:  # pragma: no cover - not on Windows
    pwd = None

REQUIRED = ("timestamp.txt", "submission_secret.txt")
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # a fifo must not block the open
_CHUNK = 1 << 20


class Refused(Exception):
    """A submission folder that is not collected; the message says why."""


def _utc(seconds: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).replace(tzinfo=None)


def _open(name: str, flags: int, dir_fd: int, path: str) -> int:
    try:
        return os.open(name, flags, dir_fd=dir_fd)
    except OSError as e:
        raise Refused(f"{path}: cannot be opened without following a link ({e.strerror})") from None


#: how deep a submission's folders may nest (a release has two or three levels)
MAX_DEPTH = 16
#: the largest timestamp.txt or submission_secret.txt taken (a collected copy's timestamp.txt is
#: parsed again by every later collect: one that does not parse stopped collect for everyone)
MAX_REQUIRED_BYTES = 256
#: the most files and folders a submission may hold together (each handed-in notebook may get its own
#: feedback page; each folder is one more mkdir and chmod in ``submitted/``, and costs no byte there)
MAX_FILES = 100


def _why(e: Exception) -> str:
    """Why a folder was not collected: a :class:`Refused`'s reason, or what stopped reading it."""
    return str(e) if isinstance(e, Refused) else f"it could not be read ({type(e).__name__}: {str(e)[:200]})"


class _Walk:
    """One pass over a submission folder by descriptors: checks every entry, measures it and, when
    ``dest`` is given, copies it there (a folder that does not exist yet)."""

    def __init__(self, owner: int, coursedir, log, dest: str | None = None, groupshared: bool = False):
        self.owner, self.coursedir, self.log, self.dest, self.groupshared = owner, coursedir, log, dest, groupshared
        self.ctime = 0.0
        self.size = 0
        self.files = 0  # files and folders below the submission's own folder
        self.top: dict[str, bytes] = {}  # timestamp.txt and submission_secret.txt, as read

    def _check(self, st: os.stat_result, path: str) -> None:
        if st.st_uid != self.owner:
            who = pwd.getpwuid(st.st_uid).pw_name if pwd is not None and _known(st.st_uid) else st.st_uid
            raise Refused(f"{path or 'the folder'} belongs to {who}, not to the submitting user")
        self.ctime = max(self.ctime, st.st_ctime)

    def _count(self) -> None:
        self.files += 1
        if self.files > MAX_FILES:  # max_dir_size counts bytes: thousands of empty files or folders cost nothing there
            raise Refused(f"it holds more than {MAX_FILES} files and folders (a release has a few)")

    def folder(self, fd: int, path: str) -> None:
        own = os.fstat(fd)
        if not stat.S_ISDIR(own.st_mode):
            raise Refused(f"{path or 'the folder'} is not a folder")
        if path.count("/") >= MAX_DEPTH:
            raise Refused(f"it nests folders more than {MAX_DEPTH} deep (nbgrader's release has a few levels)")
        self._check(own, path)
        if path:
            self._count()
        if self.dest is not None:
            os.mkdir(os.path.join(self.dest, path) if path else self.dest, 0o700)
        for name in sorted(os.listdir(fd)):
            sub = f"{path}/{name}" if path else name
            if any(fnmatch.fnmatch(name, g) for g in (self.coursedir.ignore or [])):
                continue  # nbgrader's CourseDirectory.ignore: not looked at, not copied
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                raise Refused(f"{sub} is a symbolic link")
            if stat.S_ISDIR(st.st_mode):
                child = _open(name, _DIR, fd, sub)
                try:
                    self.folder(child, sub)
                finally:
                    os.close(child)
            elif stat.S_ISREG(st.st_mode):
                child = _open(name, _FILE, fd, sub)
                try:
                    self.file(child, sub, top=not path)
                finally:
                    os.close(child)
            else:
                raise Refused(f"{sub} is not a regular file")
        if self.dest is not None:
            target = os.path.join(self.dest, path) if path else self.dest
            os.chmod(target, (stat.S_IMODE(own.st_mode) & 0o755 | 0o700) | (0o2770 if self.groupshared else 0))

    def file(self, fd: int, path: str, top: bool) -> None:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Refused(f"{path} is not a regular file")
        self._check(st, path)
        self.size += st.st_size
        self._count()
        limit = 1000 * (self.coursedir.max_dir_size or 0)
        if limit and self.size > limit:
            raise Refused(f"larger than CourseDirectory.max_dir_size ({self.coursedir.max_dir_size} kB)")
        name = os.path.basename(path)
        if top and name in REQUIRED:
            if st.st_size > MAX_REQUIRED_BYTES:  # nbgrader submit writes a time or a short secret
                raise Refused(f"its {name} is {st.st_size} bytes (nbgrader submit writes a few dozen)")
            self.top[name] = os.read(fd, MAX_REQUIRED_BYTES + 1)
            os.lseek(fd, 0, os.SEEK_SET)
        if self.dest is None:
            return
        include = self.coursedir.include
        if include and not any(fnmatch.fnmatch(name, g) for g in include):
            return
        if self.coursedir.max_file_size and st.st_size > 1000 * self.coursedir.max_file_size:
            self.log.warning("Ignoring file too large '%s' (see config option CourseDirectory.max_file_size)", path)
            return
        mode = stat.S_IMODE(st.st_mode) & 0o755 | 0o600 | (0o660 if self.groupshared else 0)
        out = os.open(os.path.join(self.dest, path), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        try:
            # The size checked above, and no more: the student can write the file while it is copied
            # (a sparse truncate to gigabytes costs them nothing, the copy's disk everything).
            left = st.st_size
            while left > 0:
                chunk = os.read(fd, min(_CHUNK, left))
                if not chunk:
                    break
                os.write(out, chunk)
                left -= len(chunk)
            after = os.fstat(fd)
            if left or os.read(fd, 1) or _changed(st, after):
                raise Refused(f"{path} changed while collect copied it ({st.st_size} bytes when checked, "
                              f"{after.st_size} after)")
            os.fchmod(out, mode)
            os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
        finally:
            os.close(out)


def _changed(before: os.stat_result, after: os.stat_result) -> bool:
    """Whether a file was written (or its inode changed) between two fstat calls."""
    return (before.st_size, before.st_mtime_ns, before.st_ctime_ns) != (after.st_size, after.st_mtime_ns,
                                                                        after.st_ctime_ns)


def _known(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


class CheckedCollect(ExchangeCollect):
    """nbgrader's default ``collect``, refusing what is not the named student's own (module docstring)."""

    timestamp_slack = Integer(
        600, help="Seconds a submission's files may have changed after the time in its name "
                  "(nbgrader submit copies, then writes it); later changes refuse it.").tag(config=True)
    future_slack = Integer(
        60, help="Seconds the time in a submission's name may be later than its files were made "
                 "(clock skew); later refuses it as forged.").tag(config=True)

    def _refuse(self, filename: str, why: str) -> None:
        self.refused.append((filename, why))
        self.log.warning("Not collecting %s: %s", filename, why)

    def _owner(self, username: str, folder_st: os.stat_result) -> int:
        if not (self.check_owner and pwd is not None):
            return folder_st.st_uid
        try:
            return pwd.getpwnam(username).pw_uid
        except KeyError:
            raise Refused(f"no unix user {username!r} to own it") from None

    def _inspect(self, filename: str, dest: str | None = None) -> dict:
        """Check (and with ``dest``, copy) ``inbound/<filename>``; the record, or :class:`Refused`."""
        parts = filename.rsplit("+", 3)
        if len(parts) < 3:
            raise Refused("not a submission's name (<student>+<assignment>+<time>[+<random>])")
        username = parts[0]
        try:
            claimed = parse_utc(parts[2])
        except (ValueError, OverflowError, TypeError) as e:
            raise Refused(f"the time in its name, {parts[2]!r}, is not a time ({e})") from None
        inbound = os.open(self.inbound_path, _DIR)
        try:
            fd = _open(filename, _DIR, inbound, filename)
        finally:
            os.close(inbound)
        try:
            owner = self._owner(username, os.fstat(fd))
            walk = _Walk(owner, self.coursedir, self.log, dest, self.coursedir.groupshared)
            walk.folder(fd, "")
        finally:
            os.close(fd)
        for name in REQUIRED:
            if name not in walk.top:
                raise Refused(f"no {name} in it (nbgrader submit writes one)")
        try:
            written = parse_utc(walk.top["timestamp.txt"].decode("utf-8", "replace").strip())
        except (ValueError, OverflowError, TypeError):
            raise Refused("its timestamp.txt does not hold a time") from None
        if written != claimed:
            raise Refused(f"its timestamp.txt says {written}, its name {claimed}")
        made = _utc(walk.ctime)
        if claimed > made + datetime.timedelta(seconds=self.future_slack):
            raise Refused(f"it claims to be submitted at {claimed} UTC, but its files were made at {made} UTC "
                          f"(a forged time)")
        if claimed < made - datetime.timedelta(seconds=self.timestamp_slack):
            raise Refused(f"its files were changed at {made} UTC, after the time it claims, {claimed} UTC "
                          f"(more than CheckedCollect.timestamp_slack = {self.timestamp_slack} s)")
        return {"username": username, "filename": filename, "timestamp": claimed, "made": made}

    def init_src(self):
        if self.coursedir.course_id == '':
            self.fail("No course id specified. Re-run with --course flag.")
        self.refused = []
        self.course_path = os.path.join(self.root, self.coursedir.course_id)
        self.inbound_path = os.path.join(self.course_path, 'inbound')
        if not os.path.isdir(self.inbound_path):
            self.fail("Course not found: {}".format(self.inbound_path))
        if not os.access(self.inbound_path, os.R_OK | os.X_OK):
            self.fail("You don't have read permissions for the directory: {}".format(self.inbound_path))
        student_id = self.coursedir.student_id if self.coursedir.student_id else '*'
        pattern = '{}+{}+*'.format(student_id, self.coursedir.assignment_id)
        records = []
        for filename in sorted(os.listdir(self.inbound_path)):
            if not fnmatch.fnmatchcase(filename, pattern):
                continue
            try:
                records.append(self._inspect(filename))
            except Exception as e:  # noqa: BLE001 -- Refused, unreadable, vanished mid-walk: this folder only
                self._refuse(filename, _why(e))
        usergroups = groupby(records, lambda item: item['username'])

        with Gradebook(self.coursedir.db_url, self.coursedir.course_id) as gb:
            try:
                self.duedate = gb.find_assignment(self.coursedir.assignment_id).duedate
            except MissingEntry:
                self.duedate = None
        self.src_records = []
        for v in usergroups.values():
            # newest first by when the files were really made; the claimed time only breaks ties
            ordered = sorted(v, key=lambda r: (r['made'], r['timestamp']), reverse=True)
            if self.duedate is not None and self.before_duedate:
                before = [r for r in ordered if r['timestamp'] <= self.duedate]
                ordered = before or ordered
            self.src_records.append(ordered[0])

    def copy_files(self):
        if not self.src_records:
            self.log.warning("No submissions of '{}' for course '{}' to collect".format(
                self.coursedir.assignment_id, self.coursedir.course_id))
        else:
            self.log.info("Processing {} submissions of '{}' for course '{}'".format(
                len(self.src_records), self.coursedir.assignment_id, self.coursedir.course_id))
        now = datetime.datetime.utcnow()
        for rec in self.src_records:
            student_id = rec['username']
            dest_path = self.coursedir.format_path(self.coursedir.submitted_directory, student_id,
                                                   self.coursedir.assignment_id)
            os.makedirs(os.path.dirname(dest_path), exist_ok=True)
            copy = updating = False
            if os.path.isdir(dest_path):
                try:
                    existing = self.coursedir.get_existing_timestamp(dest_path)
                except Exception as e:  # noqa: BLE001 -- a copy collected before this check existed
                    self.log.warning("The collected submission of %s has a timestamp.txt that does not parse "
                                     "(%s): replacing it", student_id, type(e).__name__)
                    existing = None
                if existing is not None and existing > now + datetime.timedelta(seconds=self.future_slack):
                    self.log.warning("The collected submission of %s has a time in the future (%s UTC): replacing it",
                                     student_id, existing)
                    existing = None
                if self.update and (existing is None or rec['timestamp'] > existing):
                    copy = updating = True
                elif self.before_duedate and existing != rec['timestamp']:
                    copy = updating = True
            else:
                copy = True
            if not copy:
                if self.update:
                    self.log.info("No newer submission to collect: {} {}".format(student_id, self.coursedir.assignment_id))
                else:
                    self.log.info("Submission already exists, use --update to update: {} {}".format(
                        student_id, self.coursedir.assignment_id))
                continue
            tmp = dest_path + ".collecting"
            shutil.rmtree(tmp, ignore_errors=True)
            try:
                self._inspect(rec['filename'], dest=tmp)  # checked again, on what is copied
            except Exception as e:  # noqa: BLE001 -- Refused, or unreadable now: this folder only
                shutil.rmtree(tmp, ignore_errors=True)
                self._refuse(rec['filename'], f"{_why(e)} (changed while collect ran)")
                continue
            self.log.info("{} submission: {} {}".format("Updating" if updating else "Collecting", student_id,
                                                        self.coursedir.assignment_id))
            if updating:
                shutil.rmtree(dest_path)
            os.rename(tmp, dest_path)
        if self.refused:
            self.log.error("Not collected, %d submission folder%s in %s (look at each; nothing of them was copied):\n%s",
                           len(self.refused), "" if len(self.refused) == 1 else "s", self.inbound_path,
                           "\n".join(f"  {name}: {why}" for name, why in self.refused))
