"""What a call writes into the small writable filesystems: exercise 05's probe reads it across forward
(:func:`coursekit.checks.backward._saved_once`). A copy of x_hat written to a file (``torch.save``,
``np.save``, a log handler's stream) and read back in backward is kept as surely as a saved tensor,
in memory outside the process (a tmpfs is memory).

In the grader's sandbox the only writable places are three tmpfs of a few hundred MB (the working
directory, ``/tmp``, ``/dev/shm``: ``autograder/sandbox/bwrap.py``). Each of them is read two ways:

* every file under it on its own filesystem (a read-only bind of the course inside it is not read),
  by size, modification time and content digest: a file made during the call
  counts whole, one only appended to counts what was appended (an honest log's new lines), and one
  changed otherwise counts whole (made in advance and overwritten in place);
* its used bytes (``statvfs``): a file written and unlinked while still open is in no folder, but it
  still takes pages.

A filesystem bigger than :data:`SMALL` (a laptop's home disk, a desktop's /tmp of half the RAM) is
not read: there other programs write at any moment, and walking it would take seconds.
"""
from __future__ import annotations

import hashlib
import os
import tempfile

#: the largest filesystem read (the sandbox's are 256 MB by default)
SMALL = 1 << 30
#: files walked at most per filesystem (the walk stops there, and says so)
MAX_FILES = 20_000
#: the bytes of file content digested at most (beyond that a changed file counts whole)
MAX_DIGESTED = 64 << 20


def places() -> list:
    """The writable folders read: the temporary folder, /dev/shm and the working directory, each once,
    when its filesystem is small and this process may write there."""
    out = []
    for p in (tempfile.gettempdir(), "/dev/shm", os.getcwd()):
        try:
            st = os.statvfs(p)
            real = os.path.realpath(p)
        except OSError:
            continue
        # only a place this process may write: a read-only folder or filesystem cannot hold what
        # forward writes (and a read-only root can hold the whole installation)
        if st.f_blocks * st.f_frsize <= SMALL and real not in out and os.access(real, os.W_OK) \
                and not st.f_flag & os.ST_RDONLY:
            out.append(real)
    return out


def state(where: list, digest: bool = True) -> dict:
    """``{"files": {path: (size, mtime_ns)}, "digests": {path: digest}, "used": {place: bytes},
    "complete": bool}`` now."""
    files, used, complete = {}, {}, True
    for top in where:
        try:
            st = os.statvfs(top)
            used[top] = (st.f_blocks - st.f_bfree) * st.f_frsize
        except OSError:
            continue
        try:
            device = os.stat(top).st_dev
        except OSError:
            continue
        n = 0
        for root, dirs, names in os.walk(top, onerror=None, followlinks=False):
            # this filesystem only: the sandbox binds the course and its Python read-only wherever they
            # are on the host, under /tmp too when the checkout is there (tens of thousands of files,
            # none writable), and a folder mounted inside is another filesystem (``find -xdev``)
            dirs[:] = [d for d in dirs if _on(os.path.join(root, d), device)]
            for name in names:
                n += 1
                if n > MAX_FILES:
                    complete = False
                    break
                path = os.path.join(root, name)
                try:
                    s = os.lstat(path)
                except OSError:
                    continue
                files[path] = (s.st_size, s.st_mtime_ns)
            if n > MAX_FILES:
                break
    digests, budget = {}, MAX_DIGESTED if digest else 0
    for path, (size, _) in files.items():
        if size > budget:
            continue
        budget -= size
        got = _digest(path, size)
        if got is not None:
            digests[path] = got
    return {"files": files, "digests": digests, "used": used, "complete": complete}


def _on(path: str, device: int) -> bool:
    """Whether ``path`` is on the filesystem ``device`` (not a mount point of another)."""
    try:
        return os.lstat(path).st_dev == device
    except OSError:
        return False


def _digest(path: str, size: int) -> bytes | None:
    """The digest of a file's first ``size`` bytes (None if it cannot be read, or is shorter)."""
    try:
        with open(path, "rb", buffering=0) as f:
            data = f.read(size)
    except OSError:
        return None
    return hashlib.blake2b(data, digest_size=16).digest() if len(data) == size else None


def written(before: dict, after: dict) -> int:
    """Bytes the call kept in files: the files made (whole), appended to (what was appended) or
    changed otherwise (whole), or the filesystems' growth in used bytes, whichever is more."""
    changed = 0
    for path, (size, mtime) in after["files"].items():
        old_size, old_mtime = before["files"].get(path, (None, None))
        if old_mtime == mtime:
            continue
        old = before.get("digests", {}).get(path)
        appended = old is not None and size >= old_size and _digest(path, old_size) == old
        changed += size - old_size if appended else size
    grown = sum(max(0, after["used"].get(p, 0) - b) for p, b in before["used"].items())
    return max(changed, grown)
