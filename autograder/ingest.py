"""Find the submissions in what the instructor hands the grader, whatever its shape.

* a folder in nbgrader's submitted layout: ``<student_id>/<assignment>/<notebook>.ipynb``
  (a folder holding just ``submitted/`` is entered);
* a ``.zip`` of one;
* the zip a learning-management system hands out, e.g. Canvas: flat files
  ``<name>_<userid>_<submissionid>_<original name>.ipynb`` (``_LATE_`` after the name when late,
  ``-1``, ``-2`` before ``.ipynb`` for resubmissions), or Moodle: folders
  ``<Full Name>_<id>_assignsubmission_file_/<file>.ipynb``.

Files are mapped to assignments by notebook name (``layernorm.ipynb`` -> ``01_layernorm``), and
failing that by the nbgrader grade ids inside. When one student has several files for one
assignment, the latest resubmission wins (highest ``-N``, then newest).
"""
from __future__ import annotations

import json
import re
import shutil
import stat
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

MAX_ZIP_BYTES = 2 << 30
MAX_ZIP_FILES = 100_000

CANVAS = re.compile(r"^(?P<name>[^_/]+?)(?:_LATE)?_(?P<uid>\d+)_(?P<sid>\d+)_(?P<orig>.+)$")
MOODLE = re.compile(r"^(?P<name>.+?)_(?P<uid>\d+)_assignsubmission_file_?$")
RESUB = re.compile(r"^(?P<stem>.*?)(?:-(?P<n>\d+)| \((?P<m>\d+)\))?\.ipynb$", re.I)


class InputError(Exception):
    """The submissions could not be read at all (exit code 2)."""


@dataclass
class Entry:
    """One student's file for one assignment (``path`` None: nothing usable was handed in)."""

    student_id: str
    assignment: str
    path: Path | None
    student_name: str = ""
    notes: list[str] = field(default_factory=list)
    rank: tuple = (0, 0.0)  # resubmission order: (suffix number, mtime)


def safe_id(s: str) -> str:
    s = re.sub(r"[^A-Za-z0-9._-]+", "_", s.strip()).strip("._")
    return s or "unnamed"


def extract_zip(zpath: Path, dest: Path) -> Path:
    """Extract a zip without trusting it: no absolute paths, no ``..``, no links, bounded size."""
    try:
        zf = zipfile.ZipFile(zpath)
    except (zipfile.BadZipFile, OSError) as e:
        raise InputError(f"{zpath} is not a readable zip file: {e}") from None
    with zf:
        infos = zf.infolist()
        if len(infos) > MAX_ZIP_FILES:
            raise InputError(f"{zpath} holds {len(infos)} files, more than {MAX_ZIP_FILES}")
        if sum(i.file_size for i in infos) > MAX_ZIP_BYTES:
            raise InputError(f"{zpath} unpacks to more than {MAX_ZIP_BYTES >> 30} GB")
        for info in infos:
            name = info.filename.replace("\\", "/")
            parts = [p for p in name.split("/") if p not in ("", ".")]
            if not parts or ".." in parts or name.startswith("/") or parts[0].startswith("__MACOSX"):
                continue
            if stat.S_ISLNK(info.external_attr >> 16):
                continue
            target = dest.joinpath(*parts)
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with zf.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
    return dest


def _grade_ids(path: Path) -> set:
    try:
        if path.stat().st_size > 100 << 20:
            return set()
        nb = json.loads(path.read_bytes().decode("utf-8-sig"))
        cells = nb.get("cells") or [c for ws in nb.get("worksheets", []) for c in ws.get("cells", [])]
        return {c["metadata"]["nbgrader"]["grade_id"] for c in cells
                if isinstance(c, dict) and isinstance(c.get("metadata"), dict)
                and isinstance(c["metadata"].get("nbgrader"), dict)
                and isinstance(c["metadata"]["nbgrader"].get("grade_id"), str)}
    except Exception:  # noqa: BLE001 -- unreadable files are reported when graded
        return set()


class Catalog:
    """The released assignments: notebook names and grade ids, to recognise a file."""

    def __init__(self, exercises: Path):
        self.notebooks: dict[str, str] = {}  # assignment -> notebook file name
        self.ids: dict[str, set] = {}
        for d in sorted(Path(exercises).iterdir()) if Path(exercises).is_dir() else []:
            nbs = sorted(d.glob("*.ipynb"))
            if d.is_dir() and nbs:
                self.notebooks[d.name] = nbs[0].name
                self.ids[d.name] = _grade_ids(nbs[0])

    @property
    def assignments(self) -> list[str]:
        return sorted(self.notebooks)

    def by_name(self, filename: str) -> tuple[str | None, int]:
        """(assignment, resubmission number) for a file name such as ``layernorm-2.ipynb``."""
        m = RESUB.match(filename)
        if not m:
            return None, 0
        stem, n = m.group("stem").lower(), int(m.group("n") or m.group("m") or 0)
        for a, nb in self.notebooks.items():
            if stem == nb[:-6].lower():
                return a, n
        return None, n

    def by_content(self, path: Path) -> str | None:
        ids = _grade_ids(path)
        best = max(self.assignments, key=lambda a: len(ids & self.ids[a]), default=None)
        return best if best and ids & self.ids[best] else None


def discover(src: Path, catalog: Catalog, scratch: Path) -> list[Entry]:
    """Every submission in ``src`` (folder or zip) as entries, resubmissions resolved."""
    src = Path(src)
    if not src.exists():
        raise InputError(f"{src} does not exist")
    if src.is_file():
        if src.suffix.lower() != ".zip":
            raise InputError(f"{src} is neither a folder nor a .zip")
        src = extract_zip(src, Path(scratch) / "unzipped")
    try:
        top = [p for p in src.iterdir() if not p.name.startswith(".")]
    except OSError as e:
        raise InputError(f"cannot read {src}: {e}") from None
    # Descend through single wrapping folders (submitted/, the zip's own top folder).
    while len(top) == 1 and top[0].is_dir() and not _looks_like_student(top[0], catalog):
        src = top[0]
        top = [p for p in src.iterdir() if not p.name.startswith(".")]

    entries: list[Entry] = []
    for p in sorted(top):
        m = MOODLE.match(p.name) if p.is_dir() else None
        if p.is_dir() and m:
            for f in sorted(p.rglob("*.ipynb")):
                entries.append(_lms_entry(f, m.group("uid"), m.group("name"), catalog))
        elif p.is_dir():
            entries.extend(_student_folder(p, catalog))
        elif p.suffix.lower() == ".ipynb":
            c = CANVAS.match(p.name)
            if c:
                entries.append(_lms_entry(p, c.group("uid"), c.group("name"), catalog, c.group("orig")))
            else:
                entries.append(Entry("unknown", "(unknown)", None,
                                     notes=[f"{p.name}: cannot tell whose notebook this is "
                                            "(not in a student folder, no LMS file name)"]))
    return _latest(entries)


def _looks_like_student(d: Path, catalog: Catalog) -> bool:
    if MOODLE.match(d.name):
        return True
    return any((d / a).is_dir() for a in catalog.assignments) or any(
        c.is_dir() and c.name[:2].isdigit() for c in d.iterdir())


def _lms_entry(f: Path, uid: str, name: str, catalog: Catalog, orig: str | None = None) -> Entry:
    orig = orig or f.name
    a, n = catalog.by_name(orig)
    notes = []
    if a is None:
        a = catalog.by_content(f)
        if a is None:
            return Entry(safe_id(uid), "(unknown)", None, student_name=name,
                         notes=[f"{orig}: not a notebook of this course (unknown name, no course cells)"])
        notes.append(f"the file is named {orig}, expected {catalog.notebooks[a]}; "
                     "it was recognised by its cells and graded")
    return Entry(safe_id(uid), a, f, student_name=name.replace("_", " "), notes=notes,
                 rank=(n, f.stat().st_mtime))


def _student_folder(d: Path, catalog: Catalog) -> list[Entry]:
    sid = safe_id(d.name)
    out = []
    for sub in sorted(p for p in d.iterdir() if p.is_dir()):
        a = sub.name
        nbs = sorted(sub.glob("*.ipynb"))
        if a not in catalog.notebooks:
            out.append(Entry(sid, a, None, notes=[f"there is no assignment called {a!r} in this course "
                                                   f"(known: {', '.join(catalog.assignments)})"]))
            continue
        want = catalog.notebooks[a]
        if (sub / want).is_file():
            out.append(Entry(sid, a, sub / want))
        elif nbs:
            pick = max(nbs, key=lambda p: (catalog.by_name(p.name)[0] == a, catalog.by_name(p.name)[1],
                                           p.stat().st_mtime))
            out.append(Entry(sid, a, pick, notes=[f"no {want} in the submission; graded {pick.name} instead"]))
        else:
            out.append(Entry(sid, a, None, notes=[f"the notebook {want} is missing from the submission"]))
    for f in sorted(d.glob("*.ipynb")):  # a notebook dropped directly in the student's folder
        a, n = catalog.by_name(f.name)
        a = a or catalog.by_content(f)
        if a and not any(e.assignment == a for e in out):
            out.append(Entry(sid, a, f, notes=[f"{f.name} was not inside an {a}/ folder; graded it anyway"],
                             rank=(n, f.stat().st_mtime)))
    return out


def _latest(entries: list[Entry]) -> list[Entry]:
    """One entry per (student, assignment): the latest resubmission."""
    best: dict = {}
    for e in entries:
        key = (e.student_id, e.assignment)
        if e.assignment == "(unknown)":
            key = (e.student_id, e.assignment, len(best))
        cur = best.get(key)
        if cur is None or (e.path is not None and (cur.path is None or e.rank > cur.rank)):
            if cur is not None and cur.path is not None and e.path is not None:
                e.notes.append(f"resubmitted: graded {e.path.name}, not the earlier {cur.path.name}")
            best[key] = e
    return list(best.values())
