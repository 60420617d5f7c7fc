"""Experiments too long for a book build, run once by ``make experiments`` and recorded with their
provenance; the book reads the record and refuses it when the code has changed since.

    python -m book.experiments.recorded run [NAME ...] [--jobs 2] [--short] [--out FILE]
    python -m book.experiments.recorded check [NAME ...]

An experiment is a module (:data:`EXPERIMENTS`) with ``SETTINGS`` (a dict, the same for every
run), ``runs()`` (the list of run keys: dicts such as ``{"variant": "pre-norm", "seed": 0}``) and
``run(key, settings)`` (trains one run, returns a JSON-able dict). Its record,
``book/results/<name>.json``, holds for each run: its key, the settings, what ``run`` returned,
the hash of the code it ran, the machine (platform, CPU, Python, torch and its threads), the
start and end time (UTC) and the wall time. The file is written only here, rewritten after each
finished run, so an interrupted ``make experiments`` resumes: a run already recorded with
today's code and settings is not run again.

The code hash (:func:`code_hash`) is the SHA-256 of the experiment module and of every module of
this repository it imports, directly or not (found by reading their ``import`` statements), so an
edit to the model or the training loop makes the record stale; this runner's own code is not in
it (how results are written down does not change them). :func:`load` is what the book calls: it
raises :class:`StaleResults`, naming the stale or missing runs, the files that changed and the
command that refreshes them, and the page, hence the build, fails. ``book.build`` runs the same
check (:func:`check_pages`) before Jupyter Book, so a page served from the execution cache cannot
hide a stale record; a page also pins the record file it shows by its SHA-256 (see :func:`load`).
"""
from __future__ import annotations

import argparse
import ast
import datetime as dt
import hashlib
import importlib
import json
import os
import platform
import re
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
RESULTS = ROOT / "book" / "results"
SCHEMA = 1
WRITER = "book.experiments.recorded"
REFRESH = "make experiments"  # the command that refreshes every record
#: experiment name -> the module that defines it
EXPERIMENTS = {"charlm_grid": "book.experiments.charlm_grid",
               "charlm_long": "book.experiments.charlm_long",
               "streams_long": "book.experiments.streams_long"}


class StaleResults(RuntimeError):
    """A record that today's code did not produce (or that lacks runs): it must be refreshed."""


def _module_file(name: str) -> Path | None:
    """The source file of a module of this repository (None for one from elsewhere)."""
    path = ROOT.joinpath(*name.split("."))
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def code_files(module: str) -> list[Path]:
    """``module``'s source and that of every module of this repository it imports, transitively
    (read from the ``import`` statements, without importing anything), sorted."""
    seen: dict[str, Path] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        path = _module_file(name)
        if path is None or name in seen:
            continue
        seen[name] = path
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                todo += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                todo.append(node.module)
                todo += [f"{node.module}.{a.name}" for a in node.names]  # "from pkg import mod"
    return sorted(set(seen.values()))


def file_sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def file_hashes(module: str) -> dict[str, str]:
    """Relative path -> SHA-256 of each file in :func:`code_files`."""
    return {str(p.relative_to(ROOT)): file_sha(p) for p in code_files(module)}


def code_hash(module: str) -> str:
    """One SHA-256 over the paths and contents of ``module``'s code files."""
    h = hashlib.sha256()
    for rel, digest in sorted(file_hashes(module).items()):
        h.update(f"{rel}\0{digest}\n".encode())
    return h.hexdigest()


def machine() -> dict:
    """Where a run ran: what ``platform`` and torch report, and the number of torch threads."""
    import torch

    cpu = platform.processor() or platform.machine()
    try:  # Linux names the CPU model in /proc/cpuinfo; platform.processor() often does not
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"platform": platform.platform(), "cpu": cpu, "logical_cpus": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__,
            "torch_threads": torch.get_num_threads()}


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def key_id(key: dict) -> str:
    """A run key as one stable string: ``seed=0,variant=pre-norm``."""
    return ",".join(f"{k}={key[k]}" for k in sorted(key))


def path_of(name: str) -> Path:
    return RESULTS / f"{name}.json"


def _empty(name: str) -> dict:
    return {"schema": SCHEMA, "written_by": WRITER, "experiment": name,
            "module": EXPERIMENTS[name], "runs": {}}


def read(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _write(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)  # atomic: an interrupted run never leaves half a file


def _one(module: str, key: dict, settings: dict, command: str) -> dict:
    """Run one key in a worker process, on one torch thread, with its provenance."""
    import torch

    torch.set_num_threads(1)
    exp = importlib.import_module(module)
    started, t0 = _now(), time.perf_counter()
    result = exp.run(key, settings)
    return {"key": key, "settings": settings, "result": result, "code_hash": code_hash(module),
            "code_files": file_hashes(module), "machine": machine(), "started": started,
            "finished": _now(), "wall_s": round(time.perf_counter() - t0, 2), "command": command}


def run(name: str, jobs: int = 2, short: bool = False, out: Path | None = None,
        log=print) -> dict:
    """Run what the record of ``name`` lacks (or holds from other code or settings), ``jobs`` runs
    at a time, rewriting the record after each; ``short``: the experiment's SHORT settings (a
    few steps, for the tests) into ``out``. Returns the record."""
    module = EXPERIMENTS[name]
    exp = importlib.import_module(module)
    settings = dict(exp.SHORT if short else exp.SETTINGS)
    path = out or path_of(name)
    record = read(path) if path.exists() else _empty(name)
    if record.get("schema") != SCHEMA:
        record = _empty(name)
    current = code_hash(module)
    keys = exp.runs()
    todo = [k for k in keys if not _fresh_run(record["runs"].get(key_id(k)), current, settings)]
    n, done = len(keys), len(keys) - len(todo)
    log(f"{name}: {n} runs, {done} already recorded with today's code (hash {current[:12]}), "
        f"{len(todo)} to run, {jobs} at a time -> {path}")
    # drop the runs that are not in today's list, or not from today's code and settings
    record["runs"] = {key_id(k): record["runs"][key_id(k)] for k in keys
                      if k not in todo and key_id(k) in record["runs"]}
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        command = os.environ.get("RECORDED_COMMAND") or " ".join(["python -m", WRITER, *sys.argv[1:]])
        futures = {pool.submit(_one, module, k, settings, command): k for k in todo}
        for i, fut in enumerate(as_completed(futures), start=done + 1):
            entry = fut.result()
            record["runs"][key_id(entry["key"])] = entry
            _write(path, record)
            summary = exp.summary(entry["result"]) if hasattr(exp, "summary") else ""
            log(f"[{i}/{n}] {key_id(entry['key'])}: {entry['wall_s']:.0f} s {summary} "
                f"({time.perf_counter() - t0:.0f} s so far)", flush=True)
    if not todo:
        _write(path, record)
    return record


def _fresh_run(entry: dict | None, current: str, settings: dict) -> bool:
    return entry is not None and entry.get("code_hash") == current and entry.get("settings") == settings


def check(record: dict, module: str | None = None, settings: dict | None = None,
          path: Path | str = "the record") -> None:
    """Raise :class:`StaleResults` unless every run the experiment lists is in ``record``, made by
    today's code (its hash) with ``settings`` (default: the experiment's SETTINGS)."""
    if record.get("schema") != SCHEMA or record.get("written_by") != WRITER:
        raise StaleResults(f"{path} was not written by {WRITER} (schema {SCHEMA}); "
                           f"refresh it with: {REFRESH}")
    module = module or record["module"]
    exp = importlib.import_module(module)
    settings = dict(exp.SETTINGS) if settings is None else settings
    current, files = code_hash(module), file_hashes(module)
    stale, missing, changed = [], [], set()
    for k in exp.runs():
        entry = record["runs"].get(key_id(k))
        if entry is None:
            missing.append(key_id(k))
        elif not _fresh_run(entry, current, settings):
            stale.append(key_id(k))
            changed |= {f for f in set(files) | set(entry.get("code_files", {}))
                        if files.get(f) != entry.get("code_files", {}).get(f)}
            if entry.get("settings") != settings:
                changed.add("the settings")
    if stale or missing:
        lines = [f"{path} does not hold today's results of {module} (code hash {current[:12]})."]
        if stale:
            lines.append(f"Stale runs (other code or settings): {', '.join(stale)}.")
            lines.append(f"Changed since they ran: {', '.join(sorted(changed)) or 'unknown'}.")
        if missing:
            lines.append(f"Missing runs: {', '.join(missing)}.")
        lines.append(f"Refresh them with: {REFRESH}  (it reruns only what is stale or missing)")
        raise StaleResults("\n".join(lines))


def _shown(path: Path) -> Path:
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def load(name: str, pin: str | None = None, path: Path | None = None) -> dict:
    """The record of ``name``, checked against today's code (:func:`check`): what the book reads.

    ``pin``: the first hex digits of the record file's SHA-256, written in the page that calls
    this. Jupyter Book caches a page's outputs under the hash of its code cells, so a record
    refreshed under an unchanged page would leave the page showing the old numbers; with the pin
    in the cell, a new record fails here until the pin is updated, and updating it re-executes
    the page."""
    path = path or path_of(name)
    shown = _shown(path)
    if not path.exists():
        raise StaleResults(f"{shown} does not exist; make it with: {REFRESH}")
    record = read(path)
    check(record, EXPERIMENTS[name], path=shown)
    if pin is not None and not file_sha(path).startswith(pin):
        raise StaleResults(f"{shown} is not the record the page pins (sha256 {pin}...): it was "
                           f"refreshed; set the page's pin to \"{file_sha(path)[:16]}\" so the "
                           f"page re-executes with it")
    return record


#: how a page loads a record: ``recorded.load("charlm_long", pin="0123abcd...")``
PAGE_LOAD = re.compile(r"""recorded\.load\(\s*["'](\w+)["']\s*,\s*pin\s*=\s*["']([0-9a-f]+)["']""")


def check_pages(pages: list[Path] | None = None) -> None:
    """What ``book.build`` runs before Jupyter Book: every record is today's code's, and every
    page that loads one pins the record file as it is now (else a cached page would show old
    numbers). Raises :class:`StaleResults`."""
    problems = []
    for name in EXPERIMENTS:
        try:
            load(name)
        except StaleResults as e:
            problems.append(str(e))
    for page in pages if pages is not None else sorted((ROOT / "chapters").rglob("*.md")):
        for name, pin in PAGE_LOAD.findall(page.read_text(encoding="utf-8")):
            if path_of(name).exists() and not file_sha(path_of(name)).startswith(pin):
                problems.append(f"{_shown(page)} pins {name}.json at sha256 {pin}..., but the "
                                f"file is now {file_sha(path_of(name))[:16]}...: update the pin so the "
                                f"page re-executes with the refreshed record")
    if problems:
        raise StaleResults("\n".join(problems))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m book.experiments.recorded", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run what a record lacks (resumes; a recorded run is not rerun)")
    r.add_argument("names", nargs="*", default=list(EXPERIMENTS))
    r.add_argument("--jobs", type=int, default=2, help="runs at once, one torch thread each")
    r.add_argument("--short", action="store_true", help="a few steps (what the tests run)")
    r.add_argument("--out", type=Path, help="record file (default book/results/NAME.json)")
    sub.add_parser("check", help="fail unless the records hold today's code's results and the "
                                 "pages pin them as they are (what book.build checks)")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "run":
            for name in args.names:
                run(name, jobs=args.jobs, short=args.short, out=args.out)
        else:
            check_pages()
            print("book/results: every record holds today's code's results, and the pages pin them")
    except StaleResults as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
