"""Find the submissions in what the instructor hands the grader, whatever its shape.

* a folder in nbgrader's submitted layout: ``<student_id>/<assignment>/<notebook>.ipynb``
  (a folder holding just ``submitted/`` is entered);
* a ``.zip`` of one;
* the zip a learning-management system hands out, e.g. Canvas: flat files
  ``<name>_<userid>_<submissionid>_<original name>.ipynb`` (``_LATE_`` after the name when late,
  ``-1``, ``-2`` before ``.ipynb`` for resubmissions), or Moodle: folders
  ``<Full Name>_<id>_assignsubmission_file_/<file>.ipynb``;
* one ``.ipynb``: one student's submission (the id from a Canvas file name, else the file's stem).

Files are mapped to assignments by notebook name (``layernorm.ipynb`` -> ``01_layernorm``), and
failing that by the nbgrader grade ids inside. When one student has several files for one
assignment, the latest resubmission wins (highest ``-N``, then newest). In an assignment folder
holding several notebooks, content decides first (:func:`_pick`: the assignment's cells with
answers written beat a copy of the release, which beats another notebook, which beats an empty or
unreadable file), then the name, then the time; the row's notes say which file was graded and
which were not.

Student ids are kept as given (Unicode, spaces: nbgrader keeps them too); only what cannot be one
path component (``feedback/<student_id>/``, ``submitted/<student_id>/``) is replaced. Two
different folders or LMS ids never share a row: a clash gets a ``-2`` suffix and a note.
"""
from __future__ import annotations

import contextlib
import json
import re
import shutil
import stat
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

MAX_ZIP_BYTES = 2 << 30
MAX_ZIP_FILES = 100_000
MAX_NAME_BYTES = 255  # one file name (path component) on Linux and macOS file systems

CANVAS = re.compile(r"^(?P<name>[^_/]+?)(?:_LATE)?_(?P<uid>\d+)_(?P<sid>\d+)_(?P<orig>.+)$")
MOODLE = re.compile(r"^(?P<name>.+?)_(?P<uid>\d+)_assignsubmission_file_?$")
RESUB = re.compile(r"^(?P<stem>.*?)(?:-(?P<n>\d+)| \((?P<m>\d+)\))?\.ipynb$", re.I)
LAYOUTS = ("expected <student_id>/<assignment>/<notebook>.ipynb folders (nbgrader's submitted/ layout), "
           "Canvas files <name>_<id>_<submission>_<file>.ipynb, Moodle folders "
           "<Full Name>_<id>_assignsubmission_file_/, a .zip of one of these, or one .ipynb")
UNKNOWN = "\0unknown"  # the raw id of files nobody can be told from (never a real name: it holds NUL)
#: the assignment of a placeholder entry: a student whose download holds no notebook (only other
#: files, or nothing); :func:`settle` turns it into ``no-notebook`` rows of the class's assignments
NO_NOTEBOOK = "(no notebook)"
#: an assignment is graded for the whole class (a row for every student, "not submitted" when
#: absent) when this many students handed in its notebook, or --assignment names it (:func:`settle`)
CLASS_MIN_STUDENTS = 2


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
    filename: str = ""  # the name the student gave the file (an LMS prefixes its own); default path's
    handed: list[str] | None = None  # a ``no-notebook`` row: the files the student handed in instead


def _cut(s: str, limit: int) -> str:
    """``s`` shortened to at most ``limit`` UTF-8 bytes, on a character boundary."""
    b = s.encode("utf-8", "surrogatepass")
    return s if len(b) <= limit else b[:limit].decode("utf-8", "ignore")


def safe_id(s: str) -> str:
    """A student id as given, usable as one path component: ``/`` and NUL become ``_``; the names
    ``.`` and ``..`` and the empty name become ``unnamed``; a name over 255 bytes is cut there.
    Unicode and spaces stay."""
    s = _cut(s.replace("/", "_").replace("\0", "_"), MAX_NAME_BYTES)
    return "unnamed" if s in ("", ".", "..") else s


def _shown(name: str, limit: int = 120) -> str:
    return name if len(name) <= limit else f"{name[:70]}...{name[-40:]}"


def extract_zip(zpath: Path, dest: Path) -> list[tuple[list[str], str]]:
    """Extract a zip without trusting it: no absolute paths, no ``..``, no links, bounded size.

    An entry that cannot be a file here (a file and a folder of the same name, a name longer than
    a file name can be) is skipped; returns those as (path parts, why), the rest is extracted.
    """
    try:
        zf = zipfile.ZipFile(zpath)
    except (zipfile.BadZipFile, OSError) as e:
        raise InputError(f"{zpath} is not a readable zip file: {e}") from None
    skipped: list[tuple[list[str], str]] = []
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with zf:
        infos = zf.infolist()
        if not any(not i.is_dir() for i in infos):
            raise InputError(f"{zpath} is empty")
        if len(infos) > MAX_ZIP_FILES:
            raise InputError(f"{zpath} holds {len(infos)} files, more than {MAX_ZIP_FILES}")
        if sum(i.file_size for i in infos) > MAX_ZIP_BYTES:
            raise InputError(f"{zpath} unpacks to more than {MAX_ZIP_BYTES >> 30} GB")
        for info in infos:
            name = _zip_name(info).replace("\\", "/")
            parts = [p for p in name.split("/") if p not in ("", ".")]
            if not parts or ".." in parts or name.startswith("/") or parts[0].startswith("__MACOSX"):
                continue
            if stat.S_ISLNK(info.external_attr >> 16) or any("\0" in p for p in parts):
                continue
            if any(len(p.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES for p in parts):
                if not info.is_dir():
                    skipped.append((parts, f"its name is longer than the {MAX_NAME_BYTES} bytes a file "
                                           "name can have"))
                continue
            target = dest.joinpath(*parts)
            try:
                clash = next((i for i in range(1, len(parts)) if dest.joinpath(*parts[:i]).is_file()), None)
                if info.is_dir():
                    if clash is None and not target.is_file():
                        target.mkdir(parents=True, exist_ok=True)
                elif clash is not None:
                    skipped.append((parts, f"the zip also has a file {'/'.join(parts[:clash])}, "
                                           "so it cannot be a folder too"))
                elif target.is_dir():
                    skipped.append((parts, "the zip also has a folder of the same name"))
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    with zf.open(info) as src, open(target, "wb") as dst:
                        shutil.copyfileobj(src, dst)
            except OSError as e:
                if not info.is_dir():
                    with contextlib.suppress(OSError):
                        target.unlink()
                    skipped.append((parts, f"it could not be extracted ({e.strerror or e})"))
    return skipped


def _zip_name(info: zipfile.ZipInfo) -> str:
    """The entry's name: without the UTF-8 flag, zipfile reads it as cp437, but most tools that
    leave the flag out (Windows' Send to zip, some LMS exports) wrote UTF-8: tried first."""
    if info.flag_bits & 0x800:
        return info.filename
    try:
        return info.filename.encode("cp437").decode("utf-8")
    except (UnicodeEncodeError, UnicodeDecodeError):
        return info.filename


def _cells(path: Path) -> list | None:
    """The notebook's cells, or None when it cannot be read as a notebook (empty, not JSON, too big)."""
    try:
        if path.stat().st_size > 100 << 20:
            return None
        nb = json.loads(path.read_bytes().decode("utf-8-sig"))
        cells = nb.get("cells") if isinstance(nb.get("cells"), list) else \
            [c for ws in nb["worksheets"] for c in ws.get("cells", [])]
        return [c for c in cells if isinstance(c, dict)]
    except Exception:  # noqa: BLE001 -- unreadable files are reported when graded
        return None


def _grade_ids(path: Path) -> set:
    from course import cells as cells_
    return {gid for gid in map(cells_.grade_id, _cells(path) or []) if gid}


def _answers(cells: list) -> dict:
    """grade id -> source of each answer cell (nbgrader ``solution``), first copy."""
    from course import cells as cells_
    out: dict = {}
    for c in cells:
        gid = cells_.grade_id(c)
        if gid and cells_.role(c) == "answer":
            out.setdefault(gid, cells_.source(c).strip())
    return out


class Catalog:
    """The released assignments: notebook names and grade ids, to recognise a file."""

    def __init__(self, exercises: Path):
        self.notebooks: dict[str, str] = {}  # assignment -> notebook file name
        self.ids: dict[str, set] = {}
        self.stubs: dict[str, dict] = {}  # assignment -> answer grade id -> the released stub
        for d in sorted(Path(exercises).iterdir()) if Path(exercises).is_dir() else []:
            nbs = sorted(d.glob("*.ipynb"))
            if d.is_dir() and nbs:
                self.notebooks[d.name] = nbs[0].name
                self.ids[d.name] = _grade_ids(nbs[0])
                self.stubs[d.name] = _answers(_cells(nbs[0]) or [])

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

    def content(self, path: Path, assignment: str) -> tuple[str, int]:
        """What ``path`` holds for ``assignment``: ``("unreadable", 0)`` (empty, not a notebook),
        ``("other", 0)`` (a notebook without that assignment's cells), or ``("ours", n)``: its
        cells are the assignment's, ``n`` answer cells hold work (differ from the released stub)."""
        cells = _cells(path)
        if cells is None:
            return "unreadable", 0
        from course import cells as cells_
        if not {gid for gid in map(cells_.grade_id, cells) if gid} & self.ids.get(assignment, set()):
            return "other", 0
        stubs = self.stubs.get(assignment, {})
        return "ours", sum(1 for gid, src in _answers(cells).items() if gid in stubs and src != stubs[gid])

    def by_content(self, path: Path) -> str | None:
        ids = _grade_ids(path)
        best = max(self.assignments, key=lambda a: len(ids & self.ids[a]), default=None)
        return best if best and ids & self.ids[best] else None


def discover(src: Path, catalog: Catalog, scratch: Path) -> list[Entry]:
    """Every submission in ``src`` (folder, zip or one notebook) as entries, resubmissions resolved."""
    given = src = Path(src)
    if not src.exists():
        raise InputError(f"{src} does not exist")
    skipped: list[tuple[list[str], str]] = []
    root = src
    if src.is_file():
        if src.suffix.lower() == ".ipynb":
            return _assign_ids([_single_notebook(src, catalog)])
        if src.suffix.lower() != ".zip":
            raise InputError(f"{src} is neither a folder, a .zip nor an .ipynb")
        root = src = Path(scratch) / "unzipped"
        skipped = extract_zip(given, src)
    try:
        top = [p for p in src.iterdir() if not p.name.startswith(".")]
    except OSError as e:
        raise InputError(f"cannot read {given}: {e.strerror or e}") from None
    # Descend through single wrapping folders (submitted/, the zip's own top folder).
    while len(top) == 1 and top[0].is_dir() and not _looks_like_student(top[0], catalog):
        src = top[0]
        top = [p for p in src.iterdir() if not p.name.startswith(".")]

    entries: list[Entry] = []
    for p in sorted(top):
        m = MOODLE.match(p.name) if p.is_dir() else None
        if p.is_dir() and m:
            nbs = sorted(p.rglob("*.ipynb"))
            for f in nbs:
                entries.append(_lms_entry(f, m.group("uid"), m.group("name"), catalog))
            if not nbs:  # a student whose folder holds no notebook: a placeholder naming the files
                others = [f.relative_to(p).as_posix() for f in sorted(p.rglob("*")) if f.is_file()]
                entries.append(Entry(m.group("uid"), NO_NOTEBOOK, None, m.group("name").replace("_", " "),
                                     handed=others))
        elif p.is_dir():
            entries.extend(_student_folder(p, catalog))
        elif p.suffix.lower() == ".ipynb":
            c = CANVAS.match(p.name)
            if c:
                entries.append(_lms_entry(p, c.group("uid"), c.group("name"), catalog, c.group("orig")))
            else:
                entries.append(Entry(UNKNOWN, "(unknown)", None,
                                     notes=[f"{p.name}: cannot tell whose notebook this is "
                                            "(not in a student folder, no LMS file name)"]))
        elif p.is_file() and CANVAS.match(p.name):  # a Canvas upload that is not a notebook
            c = CANVAS.match(p.name)
            entries.append(Entry(c.group("uid"), NO_NOTEBOOK, None, c.group("name").replace("_", " "),
                                 handed=[c.group("orig")]))
    prefix = list(src.relative_to(root).parts)
    for parts, why in skipped:
        rel = parts[len(prefix):] if parts[:len(prefix)] == prefix else []
        _attach(entries, _skipped_entry(rel, "/".join(parts), why, catalog, _is_dir(src, rel)))
    if all(e.assignment == NO_NOTEBOOK for e in entries):
        raise InputError(f"no submissions found in {given}: {LAYOUTS}")
    return _latest(_assign_ids(entries))


def _is_dir(src: Path, rel: list[str]) -> bool:
    try:
        return bool(rel) and (src / rel[0]).is_dir()
    except OSError:  # a name too long to look up
        return False


def _single_notebook(f: Path, catalog: Catalog) -> Entry:
    """One ``.ipynb`` given on its own: one student's submission."""
    c = CANVAS.match(f.name)
    if c:
        return _lms_entry(f, c.group("uid"), c.group("name"), catalog, c.group("orig"))
    a, n = catalog.by_name(f.name)
    if a is None:
        a = catalog.by_content(f)
        if a is None:
            return Entry(f.stem, "(unknown)", None,
                         notes=[f"{f.name}: not a notebook of this course (unknown name, no course cells)"])
        return Entry(f.stem, a, f, notes=[f"the file is named {f.name}, expected {catalog.notebooks[a]}; "
                                          "it was recognised by its cells and graded"])
    return Entry(f.stem, a, f, rank=(n, f.stat().st_mtime))


def _skipped_entry(rel: list[str], name: str, why: str, catalog: Catalog, folder: bool) -> Entry:
    """A zip entry that could not be extracted, as a note for the student it belongs to
    (``rel``: its path in the class; ``folder``: its first part is a folder there)."""
    note = f"{_shown(name)}: skipped, {why}"
    raw, sname, a = UNKNOWN, "", None
    m = MOODLE.match(rel[0]) if len(rel) > 1 else None
    c = CANVAS.match(rel[0]) if rel else None
    if m:
        raw, sname, a = m.group("uid"), m.group("name"), catalog.by_name(rel[-1])[0]
    elif c:
        raw, sname, a = c.group("uid"), c.group("name").replace("_", " "), catalog.by_name(c.group("orig"))[0]
    elif len(rel) > 1 or folder:
        raw = rel[0]
        a = rel[1] if len(rel) > 2 and rel[1] in catalog.notebooks else catalog.by_name(rel[-1])[0]
    return Entry(raw, a or "(unknown)", None, student_name=sname, notes=[note])


def _attach(entries: list[Entry], skip: Entry) -> None:
    """A skipped file whose assignment is unknown goes on its student's rows, when there are any."""
    mine = [e for e in entries if e.student_id == skip.student_id and skip.student_id != UNKNOWN]
    if skip.assignment == "(unknown)" and mine:
        for e in mine:
            e.notes.extend(skip.notes)
    else:
        entries.append(skip)


def _assign_ids(entries: list[Entry]) -> list[Entry]:
    """Raw ids (folder names, LMS ids) -> distinct student ids: never two raw ids on one row.

    A raw id that is already a usable id keeps it; the others are cleaned (:func:`safe_id`) and,
    when that id is taken, get the first free ``-2``, ``-3``... suffix, with a note saying so.
    """
    raws = sorted({e.student_id for e in entries}, key=lambda r: (r == UNKNOWN, safe_id(r) != r, r))
    base = {r: "unknown" if r == UNKNOWN else safe_id(r) for r in raws}
    taken: set = set()
    final, notes = {}, {}
    for r in raws:
        sid, n = base[r], 1
        while sid in taken or (sid != base[r] and sid in base.values()):
            n += 1
            sid = f"{_cut(base[r], MAX_NAME_BYTES - len(str(n)) - 1)}-{n}"
        taken.add(sid)
        final[r] = sid
        if r != UNKNOWN and sid != r:
            why = (f"the name {_shown(r)!r} cannot be a file name as it is" if base[r] != r else
                   f"another student's folder or LMS id is also {base[r]!r}")
            notes[r] = f"{why}: graded as student {_shown(sid)!r}"
    for e in entries:
        raw = e.student_id
        e.student_id = final[raw]
        if raw in notes:
            e.notes.insert(0, notes[raw])
    return entries


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
            return Entry(uid, "(unknown)", None, student_name=name,
                         notes=[f"{orig}: not a notebook of this course (unknown name, no course cells)"])
        notes.append(f"the file is named {orig}, expected {catalog.notebooks[a]}; "
                     "it was recognised by its cells and graded")
    return Entry(uid, a, f, student_name=name.replace("_", " "), notes=notes,
                 rank=(n, f.stat().st_mtime), filename=orig)


def _student_folder(d: Path, catalog: Catalog) -> list[Entry]:
    sid = d.name  # the raw id: _assign_ids makes the student ids
    out = []
    for sub in sorted(p for p in d.iterdir() if p.is_dir()):
        a = sub.name
        nbs = sorted(sub.glob("*.ipynb"))
        if a not in catalog.notebooks:
            out.append(Entry(sid, a, None, notes=[f"there is no assignment called {a!r} in this course "
                                                   f"(known: {', '.join(catalog.assignments)})"]))
            continue
        want = catalog.notebooks[a]
        nbs = [p for p in nbs if p.is_file()]
        if nbs:
            pick, notes = _pick(nbs, a, want, catalog)
            out.append(Entry(sid, a, pick, notes=notes))
        else:
            others = [f"{a}/{f.relative_to(sub).as_posix()}" for f in sorted(sub.rglob("*"))
                      if f.is_file() and not f.name.startswith(".")]
            if others:  # files, none a notebook: a no-notebook row naming them
                out.append(Entry(sid, a, None, handed=others, notes=[
                    f"no notebook of {a} ({want}): handed in {', '.join(map(_shown, others))}"]))
            else:
                out.append(Entry(sid, a, None, notes=[f"the notebook {want} is missing from the submission"]))
    for f in sorted(d.glob("*.ipynb")):  # a notebook dropped directly in the student's folder
        a, n = catalog.by_name(f.name)
        a = a or catalog.by_content(f)
        if a and not any(e.assignment == a for e in out):
            out.append(Entry(sid, a, f, notes=[f"{f.name} was not inside an {a}/ folder; graded it anyway"],
                             rank=(n, f.stat().st_mtime)))
    if not out and "_assignsubmission_" not in d.name:  # (Moodle's online-text folders are not students)
        others = [f.relative_to(d).as_posix() for f in sorted(d.rglob("*"))
                  if f.is_file() and not any(x.startswith(".") for x in f.relative_to(d).parts)]
        out.append(Entry(sid, NO_NOTEBOOK, None, handed=others))
    return out


WHY_NOT = {"unreadable": "not a readable notebook", "other": "no cells of {a}", "stub": "no answers written",
           "older": "older or an earlier copy"}


def _pick(nbs: list[Path], a: str, want: str, catalog: Catalog) -> tuple[Path, list[str]]:
    """The notebook of an assignment folder to grade, and notes saying which and what was ignored.

    By content first: a notebook with this assignment's nbgrader cells and work in its answer
    cells, then one with the cells, then any readable notebook, then an unreadable file (empty, not
    JSON); among equals by name (``want``, then ``want``'s resubmission names, highest ``-N``), then
    the newest."""
    seen = {p: catalog.content(p, a) for p in nbs}

    def rank(p):
        kind, work = seen[p]
        a_, n = catalog.by_name(p.name)
        return ({"unreadable": 0, "other": 1, "ours": 2}[kind], work > 0, p.name == want, a_ == a, n,
                p.stat().st_mtime)

    pick = max(nbs, key=rank)
    kind, work = seen[pick]
    notes = []
    if pick.name != want:
        what = {"ours": f"its cells are {a}'s" + ("" if work else ", no answer written"),
                "other": f"it has no cells of {a}", "unreadable": "no readable notebook was handed in"}[kind]
        head = (f"{want} is not a notebook of {a} with your answers" if (want in {p.name for p in nbs})
                else f"no {want} in the submission")
        notes.append(f"{head}; graded {pick.name} instead ({what})")
    ignored = []
    for p in sorted(nbs, key=lambda p: p.name):
        if p == pick:
            continue
        k, w = seen[p]
        why = ("unreadable" if k == "unreadable" else "other" if k == "other"
               else "stub" if not w and work else "older")
        ignored.append(f"{p.name} ({WHY_NOT[why].format(a=a)})")
    if ignored:
        notes.append(f"graded {pick.name}; not graded: {', '.join(ignored)}")
    return pick, notes


def _latest(entries: list[Entry]) -> list[Entry]:
    """One entry per (student, assignment): the latest resubmission that is a readable notebook
    (an empty or unreadable later file never replaces one). The notes of an entry without a file
    (a skipped or missing one) stay on the row that is kept."""
    best: dict = {}
    seen: dict = {}

    def readable(e: Entry) -> bool:
        if e.path not in seen:
            seen[e.path] = _cells(e.path) is not None
        return seen[e.path]

    for e in entries:
        key = (e.student_id, e.assignment)
        if e.assignment == "(unknown)":
            key = (e.student_id, e.assignment, len(best))
        cur = best.get(key)
        if cur is None:
            best[key] = e
            continue
        if e.path is not None and (cur.path is None or (readable(e), e.rank) > (readable(cur), cur.rank)):
            keep, drop = e, cur
        else:
            keep, drop = cur, e
        if keep.path is not None and drop.path is not None:
            if keep.rank > drop.rank:
                keep.notes.append(f"resubmitted: graded {keep.path.name}, not the earlier {drop.path.name}")
            else:  # an empty or unreadable later file never replaces a readable notebook
                keep.notes.append(f"graded {keep.path.name}: the later {drop.path.name} is not a readable notebook")
        if drop.path is None:
            keep.notes.extend(n for n in drop.notes if n not in keep.notes)
            if drop.handed is not None:
                keep.handed = sorted(set(keep.handed or []) | set(drop.handed))
        best[key] = keep
    return list(best.values())


def class_assignments(handed: set, present: set) -> list[str]:
    """The assignments graded for the whole class, from ``handed`` (the (student, assignment) pairs
    of notebooks handed in) and ``present`` (every assignment with a row): those at least
    :data:`CLASS_MIN_STUDENTS` students handed in; when none is, every one present (a class of one
    or two, or one assignment each: nothing tells a stray notebook from the class's work)."""
    count: dict = {}
    for _, a in handed:
        count[a] = count.get(a, 0) + 1
    return sorted(a for a, n in count.items() if n >= CLASS_MIN_STUDENTS) or sorted(present)


def _what(e: Entry, catalog: Catalog, wanted) -> str:
    """How a no-notebook row names a file its student handed in."""
    name = e.filename or (e.path.name if e.path is not None else "")
    if e.assignment in catalog.notebooks:
        how = ("not graded: only --assignment " + ", ".join(sorted(wanted)) + " is") if wanted else \
            "graded in its own row"
        return f"{name} ({e.assignment}'s notebook, {how})"
    return f"{name} (not a notebook of this course)" if name else ""


def settle(entries: list[Entry], catalog: Catalog, wanted=None) -> list[Entry]:
    """Every student of the input gets a row of each assignment graded for the class.

    ``wanted``: the assignments asked for (``--assignment``), else :func:`class_assignments`. An
    entry of another assignment is dropped with ``wanted``, kept (graded, its own row) without. A
    student with no notebook of any of those assignments (only other files, another assignment's
    notebook, or nothing) gets a ``no-notebook`` row for each, naming what was handed in; the
    placeholders of students who have a row are dropped (their other files are ignored, as before).
    """
    real = [e for e in entries if e.assignment != NO_NOTEBOOK]
    course = [e for e in real if e.assignment in catalog.notebooks]
    if wanted:
        wanted = set(wanted)
        ours = sorted(wanted)
    else:
        ours = class_assignments({(e.student_id, e.assignment) for e in course if e.path is not None},
                                 {e.assignment for e in course})
    keep = [e for e in real if not wanted or e.assignment in wanted]
    covered = {e.student_id for e in keep if e.assignment in ours}
    order, files = [], {}
    for e in entries:
        if e.student_id not in files:
            order.append(e)
            files[e.student_id] = []
        if e.assignment == NO_NOTEBOOK:
            files[e.student_id].extend(e.handed or [])
        elif e.path is not None or e.filename:
            files[e.student_id].append(_what(e, catalog, wanted))
    for first in order:
        sid = first.student_id
        if sid in covered or sid == "unknown":
            continue
        mine = [e for e in entries if e.student_id == sid]
        if not wanted and any(e.assignment not in catalog.notebooks and e.assignment != NO_NOTEBOOK
                              for e in mine) and not ours:
            continue  # its rows say what is wrong (unknown assignment), and nothing is graded for the class
        names = [f for f in files[sid] if f]
        name = next((e.student_name for e in mine if e.student_name), "")
        notes = [n for e in mine if e.path is None for n in e.notes]
        for a in ours or [NO_NOTEBOOK]:
            what = (f"handed in {', '.join(_shown(n) for n in names)}" if names
                    else "the submission holds no files")
            head = f"no notebook of {a} ({catalog.notebooks[a]}): " if a in catalog.notebooks else "no notebook: "
            keep.append(Entry(sid, a, None, name, notes=[head + what] + [n for n in notes if n not in what],
                              handed=names))
    return keep
