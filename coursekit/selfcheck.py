"""A student's self-check: run a notebook top to bottom in a fresh kernel, report every test.

    python -m coursekit.selfcheck layernorm.ipynb     (from the folder that holds the notebook)

Prints PASS or FAIL for every visible graded test cell, with the line that says what it checks
and, on a failure, the test's message; hidden tests (only their description is in your
notebook) are listed as graded on submission. Exit status 0 when every visible test passes,
1 otherwise (2 when the notebook cannot be read or run at all). The notebook file is not
modified.
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
    status: str  # "PASS", "FAIL", "HIDDEN" (not in this notebook) or "NOT RUN"
    message: str = ""


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


def execute(path: Path, timeout: int = 600):
    """Run every cell in order in a fresh kernel (continuing past errors); return the executed notebook."""
    import tempfile

    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
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
            out.append(Result(gid, doc, pts, "HIDDEN"))
            continue
        if HIDDEN not in cell.source and _only_smoke(cell.source):
            # a hidden test whose visible half only runs the code: its values are checked when graded
            err = _error_text(cell.get("outputs", []))
            out.append(Result(gid, doc, pts, "FAIL", f"(hidden test) your code must at least run: {err}")
                       if err else Result(gid, doc, pts, "HIDDEN"))
            continue
        if cell.get("execution_count") is None and not cell.get("outputs"):
            out.append(Result(gid, doc, pts, "NOT RUN", "the cell did not run"))
            continue
        err = _error_text(cell.get("outputs", []))
        out.append(Result(gid, doc, pts, "FAIL" if err else "PASS", err or ""))
    return out


def report(res: list[Result], stream=None) -> int:
    stream = stream or sys.stdout
    visible = [r for r in res if r.status != "HIDDEN"]
    hidden = [r for r in res if r.status == "HIDDEN"]
    for r in visible:
        print(f"{r.status:4}  {r.grade_id} ({r.points:g} pt): {r.doc}", file=stream)
        if r.status != "PASS" and r.message:
            for line in r.message.strip().splitlines()[:12]:
                print(f"        {line}", file=stream)
    for r in hidden:
        print(f"  ?   {r.grade_id} ({r.points:g} pt): {r.doc}  [hidden: graded when you submit]",
              file=stream)
    passed = sum(r.status == "PASS" for r in visible)
    got = sum(r.points for r in visible if r.status == "PASS")
    total = sum(r.points for r in visible)
    print(f"\n{passed}/{len(visible)} visible tests pass ({got:g} of {total:g} visible points).",
          end="", file=stream)
    if hidden:
        print(f" {len(hidden)} hidden tests ({sum(r.points for r in hidden):g} points) also run "
              "when your notebook is graded: passing the visible ones does not guarantee them.",
              file=stream)
    else:
        print(file=stream)
    return 0 if visible and passed == len(visible) else 1


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
        print(f"no such notebook: {path}")
        return 2
    print(f"running {path} in a fresh kernel ...", flush=True)
    t0 = time.perf_counter()
    try:
        nb = execute(path, args.timeout)
    except Exception as e:  # noqa: BLE001 -- a kernel that dies or a cell that times out
        print(f"could not run the notebook: {type(e).__name__}: {e}")
        return 2
    print(f"ran in {time.perf_counter() - t0:.1f} s\n")
    return report(results(nb))


if __name__ == "__main__":
    sys.exit(main())
