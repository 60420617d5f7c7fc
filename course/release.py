"""Make exercises/ from solutions/ with nbgrader, or check that it is in sync.

    python -m course.release            # regenerate every assignment into exercises/ (make exercises)
    python -m course.release --check    # exit 1 if exercises/ differs from what nbgrader generates

Before generating, each test cell's first line in solutions/ is set to its check's description
(the check's ``doc`` in ``coursekit.checks``), written once, so a student reads the same sentence in
the notebook and in the grader's feedback. nbgrader runs in a scratch copy of the course, so the
repository's gradebook is never touched.
"""
from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def assignments(root: Path = ROOT) -> list[str]:
    return sorted(p.name for p in (root / "solutions").iterdir() if p.is_dir() and p.name[:2].isdigit())


def venv_env() -> dict:
    """The environment with this interpreter's bin/ first on PATH (nbgrader shells out to alembic),
    and this checkout first on PYTHONPATH (a second checkout sharing the venv imports its own code)."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def nbgrader(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run an nbgrader command in ``cwd`` (a course directory) and fail loudly with its log."""
    proc = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=cwd,
                          capture_output=True, text=True, env=venv_env())
    if proc.returncode != 0:
        raise RuntimeError(f"nbgrader {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def scratch_course(tmp: Path, root: Path = ROOT) -> Path:
    """A throwaway course directory holding the config and solutions/ (nbgrader's source)."""
    course = tmp / "course"
    course.mkdir(parents=True)
    shutil.copy(root / "nbgrader_config.py", course / "nbgrader_config.py")
    shutil.copytree(root / "solutions", course / "solutions",
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    return course


def _docstring_line(doc: str) -> str:
    return '"""' + doc.replace('"""', "'''") + '"""'


def sync_test_docstrings(root: Path = ROOT, check: bool = False) -> list[str]:
    """Make every test cell of solutions/ open with its check's doc as a one-line docstring.

    Returns the grade ids whose cell said something else (with ``check``, nothing is written).
    """
    import nbformat

    from course import cells
    from coursekit.checks import get

    stale = []
    for a in assignments(root):
        for path in sorted((root / "solutions" / a).glob("*.ipynb")):
            nb = nbformat.read(str(path), as_version=4)
            changed = False
            for c in nb.cells:
                if cells.role(c) != "test":
                    continue
                want = _docstring_line(get(cells.grade_id(c)).doc)
                lines = c.source.split("\n")
                if lines[0] == want:
                    continue
                stale.append(cells.grade_id(c))
                first = lines[0].strip()
                if len(first) > 6 and first[:3] in ('"""', "'''") and first[-3:] == first[:3]:
                    lines[0] = want
                else:
                    lines.insert(0, want)
                c.source = "\n".join(lines)
                changed = True
            if changed and not check:
                nbformat.write(nb, str(path))
    return stale


def generate(tmp: Path, root: Path = ROOT) -> Path:
    """Generate every assignment in a scratch course; return its exercises/ folder."""
    course = scratch_course(tmp, root)
    for a in assignments(root):
        nbgrader("generate_assignment", a, "--force", cwd=course)
    return course / "exercises"


def differences(a: Path, b: Path) -> list[str]:
    """Relative paths that differ between two trees (missing on either side included)."""
    out = []
    cmp = filecmp.dircmp(a, b, ignore=[".ipynb_checkpoints", "__pycache__"])

    def walk(c: filecmp.dircmp, rel: str):
        out.extend(f"{rel}{n} (only in {Path(c.left).name if n in c.left_only else Path(c.right).name})"
                   for n in c.left_only + c.right_only)
        for n in c.common_files:
            if (Path(c.left) / n).read_bytes() != (Path(c.right) / n).read_bytes():
                out.append(f"{rel}{n}")
        for n, sub in c.subdirs.items():
            walk(sub, f"{rel}{n}/")

    walk(cmp, "")
    return sorted(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only check that exercises/ is in sync")
    args = ap.parse_args(argv)
    stale = sync_test_docstrings(check=args.check)
    if stale:
        if args.check:
            print("test cells in solutions/ whose first line is not their check's description "
                  f"(run `make exercises`): {', '.join(stale)}")
            return 1
        print(f"set the description line of {len(stale)} test cells from their checks")
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        rc = sync_tree(fresh, ROOT / "exercises", check=args.check,
                       stale="exercises/ is not what nbgrader generates from solutions/; run `make exercises`",
                       done=f"regenerated exercises/ for: {', '.join(assignments())}")
        return max(rc, sync_released_cells(fresh, check=args.check))


def released_cells(exercises: Path) -> dict:
    """Every released notebook's nbgrader cells in order (``"<assignment>/<notebook>"`` ->
    ``[{"grade_id", "role", "source", "points"}]``; the source only for locked code cells, the setup and the
    visible tests, which the release shows every student). The self-check runs these as released,
    as the grader does (:mod:`coursekit.released`)."""
    import nbformat

    from course import cells

    out = {}
    for path in sorted(exercises.glob("*/*.ipynb")):
        nb = nbformat.read(str(path), as_version=4)
        rows = []
        for c in nb.cells:
            gid, r = cells.grade_id(c), cells.role(c)
            if gid is None or r == "markdown":
                continue
            locked = r != "answer" and cells.meta(c).get("locked") is True
            row = {"grade_id": gid, "role": r, **({"source": c.source} if locked else {})}
            if r == "test":
                row["points"] = float(cells.meta(c).get("points") or 0)
            rows.append(row)
        out[f"{path.parent.name}/{path.name}"] = rows
    return out


def sync_released_cells(exercises: Path, check: bool) -> int:
    """``coursekit/released.json`` is generated from the release, like ``exercises/`` itself."""
    import json

    target = ROOT / "coursekit" / "released.json"
    text = json.dumps(released_cells(exercises), indent=1, sort_keys=True) + "\n"
    if check:
        if not target.exists() or target.read_text() != text:
            print("coursekit/released.json is not the release's locked cells; run `make exercises`")
            return 1
        print("coursekit/released.json is in sync")
        return 0
    target.write_text(text)
    print("wrote coursekit/released.json")
    return 0


def sync_tree(fresh: Path, target: Path, *, check: bool, stale: str, done: str, shown: int = 30) -> int:
    """Every generated folder's one mechanism: with ``check``, exit status 1 and the differing
    paths when ``target`` is not ``fresh``; otherwise replace ``target`` with ``fresh``."""
    if check:
        diff = differences(fresh, target) if target.exists() else [f"{target.name}/ is missing"]
        if diff:
            print(f"{stale}:")
            print("\n".join(f"  {d}" for d in diff[:shown]))
            return 1
        print(f"{target.name}/ is in sync")
        return 0
    if target.exists():
        shutil.rmtree(target)
    shutil.copytree(fresh, target)
    print(done)
    return 0


if __name__ == "__main__":
    sys.exit(main())
