"""A student's self-check: run a notebook top to bottom in a fresh kernel, report every test.

    python -m coursekit.selfcheck layernorm.ipynb     (from the folder that holds the notebook)

Prints PASS or FAIL for every visible graded test cell, with the line that says what it checks
and, on a failure, the test's message; hidden tests (only their description is in your
notebook) are listed as graded on submission. Exit status 0 when every visible test passes,
1 otherwise (2 when the notebook cannot be read or run at all). The notebook file is not
modified.

Like the grader, it runs the setup and test cells as they were released, not as they are in your
file: a test cell that was edited or deleted (easy in Colab or VS Code, which do not lock cells)
is put back from the release (``coursekit/released.json``, made by ``make exercises``), and the
report says which.
"""
from __future__ import annotations

import argparse
import ast
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HIDDEN = "### BEGIN HIDDEN TESTS"


@dataclass
class Result:
    grade_id: str
    doc: str
    points: float
    status: str  # "PASS", "FAIL", "HIDDEN" (checked only when graded) or "NOT RUN"
    message: str = ""
    hidden: bool = False  # a hidden test: its values are checked only when the notebook is graded

    def __post_init__(self):
        self.hidden = self.hidden or self.status == "HIDDEN"


def _doc(source: str) -> str:
    """First line of the cell's docstring (or leading comment): what the test checks."""
    try:
        tree = ast.parse(source)
        doc = ast.get_docstring(tree, clean=True) if tree.body else None
    except SyntaxError:
        doc = None
    if not doc:
        m = re.match(r"\s*#\s*(.+)", source)
        doc = m.group(1) if m else ""
    return doc.strip().splitlines()[0] if doc.strip() else ""


def _runs_something(source: str) -> bool:
    """Does the cell contain code beyond its docstring/comments? (Hidden tests are stripped.)"""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return True
    body = tree.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    return bool(body)


def _only_smoke(source: str) -> bool:
    """Is the cell's code only ``smoke(...)`` calls: the visible half of a hidden test?"""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return False
    calls = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
    return bool(calls) and all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)
                               and getattr(n.value.func, "id", None) == "smoke" for n in calls)


def released() -> dict:
    """``"<assignment>/<notebook>"`` -> the release's nbgrader cells in order (see
    ``course.release.released_cells``): grade id, role, and the source of each locked cell."""
    import json

    return json.loads((Path(__file__).with_name("released.json")).read_text())


def _ids(nb) -> set:
    return {c.get("metadata", {}).get("nbgrader", {}).get("grade_id") for c in nb.cells} - {None}


def release_of(nb, catalog: dict | None = None) -> str | None:
    """Which released notebook this is: the one sharing the most nbgrader cell ids with it."""
    catalog = released() if catalog is None else catalog
    ids = _ids(nb)
    best = max(catalog, key=lambda k: len(ids & {r["grade_id"] for r in catalog[k]}), default=None)
    return best if best is not None and ids & {r["grade_id"] for r in catalog[best]} else None


def is_source(nb) -> bool:
    """An instructor's source notebook (solutions/): it holds solutions or hidden tests, and is
    checked as it is."""
    return any(m in "".join(c.get("source", "")) for c in nb.cells
               for m in ("### BEGIN SOLUTION", HIDDEN))


def restore_released(nb, catalog: dict | None = None) -> tuple[str | None, list[str]]:
    """Put the release's locked cells back into ``nb`` (in place): an edited one gets its released
    source, a missing one is inserted after the released cell before it. Returns the notebook's
    release name and one note per cell put back."""
    import nbformat

    catalog = released() if catalog is None else catalog
    name = release_of(nb, catalog)
    if name is None or is_source(nb):
        return name, []
    notes = []
    by_id = {}
    for i, c in enumerate(nb.cells):
        gid = c.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        by_id.setdefault(gid, c)
    previous = None  # the cell of the release's order that the next missing one goes after
    for row in catalog[name]:
        gid, cell = row["grade_id"], by_id.get(row["grade_id"])
        if "source" in row:
            if cell is None or cell.get("cell_type") != "code":
                cell = nbformat.v4.new_code_cell(row["source"])
                cell.metadata["nbgrader"] = {"grade_id": gid, "locked": True}
                if row["role"] == "test":
                    cell.metadata["nbgrader"].update(grade=True, solution=False, points=row["points"])
                at = nb.cells.index(previous) + 1 if previous is not None else 0
                nb.cells.insert(at, cell)
                by_id[gid] = cell
                notes.append(f"{gid}: this cell is missing from your notebook; checked with the released "
                             "one (the grader runs it too)")
            elif cell.source != row["source"]:
                cell.source = row["source"]
                notes.append(f"{gid}: this cell was edited; checked with its released version (the "
                             "grader runs that one, not yours)")
        if cell is not None:
            previous = cell
    return name, notes


def _error_text(outputs) -> str | None:
    for out in outputs:
        if out.get("output_type") == "error":
            name, value = out.get("ename", "Error"), out.get("evalue", "")
            return value if name == "CheckFailed" else f"{name}: {value}"
    return None


def ipc_config(folder: str):
    """Config for a kernel that talks over local (IPC) sockets in ``folder``, not TCP.

    Over TCP, ipykernel warns at every start that the traffic is not encrypted
    (``IPKernelApp.init_sockets``: transport "tcp" without CurveZMQ keys). Sockets in a private
    folder of ours are reachable only by this user: the warning's cause is gone, not hidden."""
    from traitlets.config import Config

    return Config({"KernelManager": {"transport": "ipc", "ip": str(Path(folder) / "kernel")}})


def execute(path: Path, timeout: int = 600, nb=None):
    """Run every cell in order in a fresh kernel (continuing past errors); return the executed
    notebook (``nb``: the notebook read from ``path`` and changed, else the file as it is)."""
    import tempfile

    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4) if nb is None else nb
    with tempfile.TemporaryDirectory(prefix="selfcheck-") as sockets:  # short: a socket path is < 108 bytes
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                                resources={"metadata": {"path": str(path.parent.resolve())}},
                                config=ipc_config(sockets))
        client.execute()
    return nb


def results(nb) -> list[Result]:
    out = []
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type != "code" or not meta.get("grade"):
            continue
        gid, pts = meta.get("grade_id", "?"), float(meta.get("points", 0) or 0)
        doc = _doc(cell.source)
        if HIDDEN not in cell.source and not _runs_something(cell.source):
            out.append(Result(gid, doc, pts, "HIDDEN", hidden=True))
            continue
        if HIDDEN not in cell.source and _only_smoke(cell.source):
            # a hidden test whose visible half only runs the code: its values are checked when graded
            err = _error_text(cell.get("outputs", []))
            out.append(Result(gid, doc, pts, "FAIL", f"your code must at least run here: {err}", hidden=True)
                       if err else Result(gid, doc, pts, "HIDDEN", hidden=True))
            continue
        if cell.get("execution_count") is None and not cell.get("outputs"):
            out.append(Result(gid, doc, pts, "NOT RUN", "the cell did not run"))
            continue
        err = _error_text(cell.get("outputs", []))
        out.append(Result(gid, doc, pts, "FAIL" if err else "PASS", err or ""))
    return out


def _message(r: Result, stream) -> None:
    for line in r.message.strip().splitlines()[:12]:
        print(f"        {line}", file=stream)


def report(res: list[Result], stream=None, notes: list[str] = ()) -> int:
    """Print every test and a summary; the exit status (0: every visible test passes and every
    hidden test could run your code). ``notes``: locked cells put back from the release."""
    stream = stream or sys.stdout
    visible = [r for r in res if not r.hidden]
    hidden = [r for r in res if r.hidden]
    for r in visible:
        print(f"{r.status:4}  {r.grade_id} ({r.points:g} pt): {r.doc}", file=stream)
        if r.status != "PASS" and r.message:
            _message(r, stream)
    for r in hidden:
        if r.status == "FAIL":
            print(f"FAIL  {r.grade_id} ({r.points:g} pt): {r.doc}  [hidden test]", file=stream)
            _message(r, stream)
        else:
            print(f"  ?   {r.grade_id} ({r.points:g} pt): {r.doc}  [hidden: graded when you submit]",
                  file=stream)
    passed = sum(r.status == "PASS" for r in visible)
    got = sum(r.points for r in visible if r.status == "PASS")
    total = sum(r.points for r in visible)
    broken = sum(r.status == "FAIL" for r in hidden)
    print(f"\n{passed}/{len(visible)} visible tests pass ({got:g} of {total:g} visible points).",
          end="", file=stream)
    if hidden:
        print(f" {len(hidden)} hidden tests ({sum(r.points for r in hidden):g} points) also run "
              "when your notebook is graded: passing the visible ones does not guarantee them.",
              end="", file=stream)
        if broken:
            print(f" {broken} of them cannot run your code yet (FAIL above).", end="", file=stream)
    print(file=stream)
    if notes:
        print("\nPut back as released (your file still has your version):", file=stream)
        for n in notes:
            print(f"  {n}", file=stream)
        print("The grader runs the released cells, so fetch a fresh copy of the notebook or undo "
              "those edits; only the answer cells and cells you add are yours.", file=stream)
    return 0 if visible and passed == len(visible) and not broken else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("notebook", nargs="?", help="path of an exercise notebook (.ipynb)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds allowed per cell")
    args = ap.parse_args(argv)
    if not args.notebook:
        ap.print_usage()
        print("give the notebook to check, e.g. python -m coursekit.selfcheck layernorm.ipynb")
        return 2
    path = Path(args.notebook)
    if not path.is_file():
        print(f"no such notebook: {path} (from {Path.cwd()}). Run this from the folder that holds "
              "the notebook, or give its path, e.g. python -m coursekit.selfcheck "
              "01_layernorm/layernorm.ipynb")
        return 2
    import nbformat

    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as e:  # noqa: BLE001 -- not JSON, not a notebook
        print(f"could not read {path} as a notebook: {type(e).__name__}: {e}")
        return 2
    name, notes = restore_released(nb)
    if name is not None and is_source(nb):
        print(f"{path} holds solutions or hidden tests (an instructor's source): checking it as it is")
    if name is None:
        print(f"{path} is not one of the course's notebooks (none of its cells is): checking it as it is")
    print(f"running {path} in a fresh kernel ...", flush=True)
    t0 = time.perf_counter()
    try:
        nb = execute(path, args.timeout, nb)
    except Exception as e:  # noqa: BLE001 -- a kernel that dies or a cell that times out
        print(f"could not run the notebook: {type(e).__name__}: {e}")
        return 2
    print(f"ran in {time.perf_counter() - t0:.1f} s\n")
    return report(results(nb), notes=notes)


if __name__ == "__main__":
    sys.exit(main())
