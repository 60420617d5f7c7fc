"""The book prints no answer to an exercise (issue 17).

The book may show a variant of what an exercise asks (one row, post-norm only, other argument
order, other submodule names), never code that earns an exercise's marks. This test collects
every class and function the chapters can hand a reader:

* everything defined in a module of ``book/experiments/`` that a chapter imports from
  (``from book.experiments import backward as bw`` or ``from book.experiments.blocks import
  Block``) or prints with ``literalinclude``;
* every function and class defined in a chapter's code cell that the book prints (all but the
  cells tagged ``remove-cell`` or ``remove-input``).

Each one whose signature fits an exercise's contract (``/work/shared/CONTRACT.md``: a module
class for the module names, an ``autograd.Function`` for ``FusedAddRMSNorm``, a function of the
same number of positional arguments for the functions) is bound under the contract's name and run
through that name's graded correctness checks (``coursekit.checks`` and ``course.hidden``), in
process as ``tests/test_checks_in_process.py`` runs them. It must fail at least one of them.

The detector's self-test binds the reference solutions (``course.solutions``) the same way and
expects them to pass, and plants a solution in a chapter-like file to show the scan finds it.
"""
from __future__ import annotations

import ast
import functools
import importlib
import inspect
import re
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from course.release import ROOT
from course.solutions import load_reference
from coursekit.checks import get
from notebook_ns import grade_ids, outcome, setup_ns

pytestmark = pytest.mark.book

# name -> (assignment, what it is, positional arguments its call takes (not counting self/ctx))
CONTRACT = {
    "LayerNorm": ("01_layernorm", "module", 1),
    "RMSNorm": ("02_rmsnorm", "module", 1),
    "apply_residual_connection": ("03_residual", "function", 2),
    "ResidualBlock": ("03_residual", "module", 2),
    "TransformerBlock": ("04_transformer_block", "module", 3),
    "TransformerStack": ("04_transformer_block", "module", 4),
    "rmsnorm_backward": ("05_backward", "function", 4),
    "layernorm_backward": ("05_backward", "function", 5),
    "FusedAddRMSNorm": ("05_backward", "autograd", 4),
    "sinkhorn_knopp": ("06_streams", "function", 2),
    "MHCResidual": ("06_streams", "module", 2),
    "depth_attention": ("06_streams", "function", 2),
}

# the instructors' pages (docs/, issue 29) are built into the same book: read like the chapters
CHAPTERS = sorted((ROOT / "chapters").rglob("*.md")) + sorted((ROOT / "docs").rglob("*.md"))
CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```\s*$", re.S | re.M)
INCLUDE = re.compile(r"^```\{literalinclude\}\s+(\S+)", re.M)
HIDDEN_TAGS = ("remove-cell", "remove-input")


@functools.cache
def checks_for(name: str) -> tuple[str, ...]:
    """The graded correctness checks that use ``name`` alone, in notebook order."""
    assignment = CONTRACT[name][0]
    return tuple(g for g in grade_ids(assignment)
                 if get(g).kind == "correctness" and set(get(g).needs) == {name})


@functools.cache
def _setup(assignment: str) -> dict:
    return setup_ns(assignment)


def failed_checks(name: str, obj) -> dict[str, str]:
    """Bind ``obj`` as ``name`` after the notebook's setup cell; the checks it fails, with why."""
    ns = dict(_setup(CONTRACT[name][0]), **{name: obj})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {g: msg for g in checks_for(name) if (msg := outcome(g, ns)) is not None}


# --- what the chapters hand a reader ------------------------------------------------------------

def _cells(text: str) -> list[tuple[list[str], str]]:
    """(tags, source) of every code cell of a MyST notebook."""
    out = []
    for body in CELL.findall(text):
        lines = body.splitlines()
        tags = []
        while lines and lines[0].startswith(":"):
            m = re.match(r":tags:\s*\[(.*)\]", lines[0])
            if m:
                tags += [t.strip().strip("'\"") for t in m.group(1).split(",")]
            lines.pop(0)
        out.append((tags, "\n".join(lines)))
    return out


def _experiment_modules(text: str, source: str) -> set[str]:
    """book.experiments modules that a chapter imports from or literalincludes."""
    mods = set()
    for _, src in _cells(text):
        try:
            tree = ast.parse(src)
        except SyntaxError:  # IPython magics
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("book.experiments"):
                if node.module == "book.experiments":
                    mods |= {f"book.experiments.{a.name}" for a in node.names}
                else:
                    mods.add(node.module)
            elif isinstance(node, ast.Import):
                mods |= {a.name for a in node.names if a.name.startswith("book.experiments.")}
    for rel in INCLUDE.findall(text):
        path = (Path(source).parent / rel).resolve()
        if path.suffix == ".py" and (ROOT / "book" / "experiments") in path.parents:
            mods.add(f"book.experiments.{path.stem}")
    return mods


def _printed_definitions(text: str, source: str) -> dict[str, object]:
    """Functions and classes defined in the printed code cells, made by running their ``def`` and
    ``class`` statements after every import statement of the chapter."""
    imports, defs = [], []
    for tags, src in _cells(text):
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                imports.append(node)
            elif isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not set(tags) & set(HIDDEN_TAGS):
                defs.append(node)
    ns: dict = {"__name__": f"chapter:{Path(source).name}"}
    exec(compile(ast.Module(body=imports, type_ignores=[]), source, "exec"), ns)
    found = {}
    for node in defs:
        exec(compile(ast.Module(body=[node], type_ignores=[]), source, "exec"), ns)
        found[f"{Path(source).name}:{node.name}"] = ns[node.name]
    return found


def handed_out(chapters=CHAPTERS) -> dict[str, object]:
    """Every class and function the chapters import from book/experiments or print, by label."""
    found, mods = {}, set()
    for path in chapters:
        text = path.read_text(encoding="utf-8")
        mods |= _experiment_modules(text, str(path))
        found.update(_printed_definitions(text, str(path)))
    for modname in sorted(mods):
        mod = importlib.import_module(modname)
        for attr, obj in vars(mod).items():
            if (inspect.isclass(obj) or inspect.isfunction(obj)) and getattr(obj, "__module__", "") == modname:
                found[f"{modname}.{attr}"] = obj
    return found


def _positional_fits(fn, n: int, skip_first: bool = False) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    params = list(sig.parameters.values())[1 if skip_first else 0:]
    try:
        inspect.Signature(params).bind(*range(n))
    except TypeError:
        return False
    return True


def contracts_fitting(obj) -> list[str]:
    """The contract names ``obj`` could stand for, judged by kind and signature alone."""
    fits = []
    for name, (_, kind, n) in CONTRACT.items():
        if kind == "module" and inspect.isclass(obj) and issubclass(obj, nn.Module):
            ok = _positional_fits(obj, n)
        elif kind == "autograd" and inspect.isclass(obj) and issubclass(obj, torch.autograd.Function):
            ok = _positional_fits(obj.forward, n, skip_first=True)
        elif kind == "function" and inspect.isfunction(obj):
            ok = _positional_fits(obj, n)
        else:
            ok = False
        if ok:
            fits.append(name)
    return fits


def candidates(found: dict[str, object]):
    return [(label, name, obj) for label, obj in found.items() for name in contracts_fitting(obj)]


_CANDIDATES = candidates(handed_out())


def test_the_scan_finds_what_the_chapters_print_and_import():
    """The scan sees the objects issue 17 named, so an empty list cannot pass unnoticed."""
    labels = {label for label, _, _ in _CANDIDATES}
    for label in ("book.experiments.blocks.Block", "book.experiments.blocks.Stack",
                  "book.experiments.backward.FusedAddRMSNorm", "07_numerics.md:naive_rms_norm"):
        assert any(l == label for l in labels) or label in handed_out(), label
    assert {"book.experiments.backward.rmsnorm_backward", "book.experiments.blocks.Block"} <= labels


@pytest.mark.parametrize("label,name,obj", [pytest.param(*c, id=f"{c[0]}-as-{c[1]}") for c in _CANDIDATES])
def test_book_code_fails_the_graded_checks(label, name, obj):
    """Bound under the contract name it fits, the book's code loses at least one graded check."""
    assert checks_for(name), f"no graded correctness check uses {name} alone"
    failed = failed_checks(name, obj)
    assert failed, (f"{label}, bound as {name}, passes every graded check of "
                    f"{CONTRACT[name][0]} ({', '.join(checks_for(name))}): the book prints a solution")


# --- the detector's self-test --------------------------------------------------------------------

@pytest.mark.parametrize("name", list(CONTRACT))
def test_detector_passes_the_reference_solution(name):
    """A planted copy of the reference solution fits its contract and passes every check, so the
    test above would fail on it."""
    obj = load_reference(CONTRACT[name][0])[name]
    assert name in contracts_fitting(obj)
    assert failed_checks(name, obj) == {}


def _answer_source(assignment: str) -> str:
    import nbformat
    from course import cells
    nb = nbformat.read(next((ROOT / "solutions" / assignment).glob("*.ipynb")), as_version=4)
    return "\n".join(line for c in nb.cells if cells.role(c) == "answer" for line in c.source.splitlines()
                     if line.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION"))


def test_detector_finds_a_solution_planted_in_a_chapter(tmp_path):
    """A chapter that prints exercise 03's answer cells is caught: the scan finds the code and it
    passes the graded checks."""
    page = tmp_path / "planted.md"
    page.write_text("# Planted\n\n```{code-cell} ipython3\nimport torch\nfrom torch import nn\n```\n\n"
                    "```{code-cell} ipython3\n:tags: [hide-input]\n" + _answer_source("03_residual") + "\n```\n")
    found = candidates(handed_out([page]))
    passing = {(label, name) for label, name, obj in found if not failed_checks(name, obj)}
    assert ("planted.md:apply_residual_connection", "apply_residual_connection") in passing
    assert ("planted.md:ResidualBlock", "ResidualBlock") in passing


def test_instructor_pages_print_no_solution_line_and_no_hidden_test():
    """The book's "For instructors" part (docs/) is read by students too: none of its text holds a
    line of a reference solution, of a hidden test cell or of a hidden check (``course/hidden/``)."""
    import nbformat
    from course import cells

    secret = set()
    for path in sorted((ROOT / "solutions").glob("*/*.ipynb")):
        for c in nbformat.read(str(path), as_version=4).cells:
            src = cells.source(c)
            for begin, end in (("### BEGIN SOLUTION", "### END SOLUTION"),
                               ("### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS")):
                for block in src.split(begin)[1:]:
                    secret |= {ln.strip() for ln in block.split(end, 1)[0].splitlines() if len(ln.strip()) >= 24}
    for path in sorted((ROOT / "course" / "hidden").glob("*.py")):
        secret |= {ln.strip() for ln in path.read_text().splitlines()
                   if len(ln.strip()) >= 32 and not ln.strip().startswith(("#", "from ", "import ", '"""'))}
    assert len(secret) > 50
    pages = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]
    assert len(pages) > 5
    found = [f"{p.relative_to(ROOT)}: {s[:80]}" for p in pages for s in secret if s in p.read_text()]
    assert not found, found
