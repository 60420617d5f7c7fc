"""What to run for one submission: the released notebook is the skeleton, the student's file only
supplies answers.

* instructor cells (locked, not graded): the released source, whatever the student's copy says;
* answer cells (nbgrader ``solution: true``): the student's code cell with the same grade id,
  else the same cell id; the first one if there are several; missing -> nothing runs there;
* test cells (``grade: true``): never the student's copy. The release says which tests exist and
  what each is worth; the harness probes the check of that grade id at that point;
* cells the student added (matching no released cell) run after the matched cell before them;
* markdown and raw cells are ignored; outputs in the student's file are never read.

The student's file is read as plain JSON, defensively (:func:`read_student_notebook`): nbformat
v3 (worksheets) and v4, sources as strings or lists, any junk in metadata.
"""
from __future__ import annotations

import ast
import functools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from course import cells as cells_

MAX_NOTEBOOK_BYTES = 100 << 20  # bigger files are refused (huge outputs are fine below this)
MAX_CODE_CHARS = 2_000_000  # all code cells together
MAX_CELLS = 20_000


class BadNotebook(ValueError):
    """The student's file cannot be read as a notebook; the message is for the student."""


@dataclass
class Test:
    grade_id: str
    points: float
    index: int  # position among the release's graded cells


@dataclass
class Plan:
    steps: list[dict]  # for the harness: cells and tests, in order
    tests: list[Test]
    notes: list[str] = field(default_factory=list)  # things the feedback should say (missing answers...)
    answer_code: list[str] = field(default_factory=list)  # the student's answer cells, for the static scan
    added_code: list[str] = field(default_factory=list)  # cells the student added, likewise

    @property
    def student_code(self) -> list[str]:
        """Every cell the student wrote, answers first: what ``scan_forbidden(code, ops)`` took
        before it took answers and added cells apart (that call scans them all as answers)."""
        return self.answer_code + self.added_code


def read_student_notebook(path: Path, notes: list | None = None) -> list[dict]:
    """The student's code cells as ``{"source", "grade_id", "id"}``; raises :class:`BadNotebook`.

    Oddities that do not stop grading (old format, another kernel) are appended to ``notes``.
    """
    notes = [] if notes is None else notes
    path = Path(path)
    size = path.stat().st_size
    if size == 0:
        raise BadNotebook("the notebook file is empty (0 bytes)")
    if size > MAX_NOTEBOOK_BYTES:
        raise BadNotebook(f"the notebook file is {size >> 20} MB, more than the {MAX_NOTEBOOK_BYTES >> 20} MB "
                          "allowed (clear the outputs and submit again)")
    raw = path.read_bytes()
    try:
        nb = json.loads(raw.decode("utf-8-sig"))
    except UnicodeDecodeError:
        raise BadNotebook("the notebook file is not text (UTF-8): it is not a Jupyter notebook") from None
    except json.JSONDecodeError as e:
        cut = e.pos >= len(raw.rstrip()) - 2 or not raw.rstrip().endswith(b"}")
        hint = " (the file looks cut off: was the upload complete?)" if cut else ""
        raise BadNotebook(f"the notebook file is not valid JSON: {e.msg} at line {e.lineno}, "
                          f"column {e.colno}{hint}") from None
    if not isinstance(nb, dict):
        raise BadNotebook("the notebook file is JSON but not a notebook (no top-level object)")
    if isinstance(nb.get("cells"), list):
        cells = nb["cells"]
    elif isinstance(nb.get("worksheets"), list):  # nbformat 3
        notes.append(f"the notebook is in the old format v{nb.get('nbformat', 3)}; it was read and graded anyway")
        cells = [c for ws in nb["worksheets"] if isinstance(ws, dict) and isinstance(ws.get("cells"), list)
                 for c in ws["cells"]]
    else:
        raise BadNotebook("the file is JSON but has no cells: it is not a Jupyter notebook")
    meta = nb.get("metadata") if isinstance(nb.get("metadata"), dict) else {}
    ks = meta.get("kernelspec") if isinstance(meta.get("kernelspec"), dict) else {}
    lang = str(ks.get("language") or (meta.get("language_info") or {}).get("name", "python")
               if isinstance(meta.get("language_info", {}), dict) else "python")
    if ks and (ks.get("name") not in (None, "python3", "python") or lang.lower() != "python"):
        notes.append(f"the notebook names the kernel {str(ks.get('name'))[:40]!r} ({lang[:20]}); "
                     "it was graded with Python 3 like every submission")
    if len(cells) > MAX_CELLS:
        raise BadNotebook(f"the notebook has {len(cells)} cells, more than the {MAX_CELLS} allowed")
    out, total = [], 0
    for c in cells:
        if not isinstance(c, dict) or c.get("cell_type") != "code":
            continue
        src = cells_.source(c)
        total += len(src)
        if total > MAX_CODE_CHARS:
            raise BadNotebook(f"the notebook's code is longer than {MAX_CODE_CHARS} characters")
        cid = c.get("id")
        out.append({"source": src, "grade_id": cells_.grade_id(c), "id": cid if isinstance(cid, str) else None})
    return out


def release_cells(path: Path) -> list[dict]:
    """The released notebook's cells (trusted): role, grade id, cell id, source, points."""
    import nbformat

    nb = nbformat.read(str(path), as_version=4)
    return [{"role": cells_.role(c), "grade_id": cells_.grade_id(c), "id": c.get("id"),
             "source": c.source, "points": cells_.points(c)} for c in nb.cells]


def make_plan(release: list[dict], student: list[dict]) -> Plan:
    by_gid, by_id = {}, {}
    for j, c in enumerate(release):
        if c["role"] == "markdown":
            continue
        if c["grade_id"]:
            by_gid.setdefault(c["grade_id"], j)
        if c["id"]:
            by_id.setdefault(c["id"], j)

    answers: dict[int, str] = {}  # release index -> student's source
    added: dict[int, list[str]] = {}  # release index of the matched cell before -> added cells
    anchor = -1
    notes = []
    dupes = set()
    for s in student:
        j = by_gid.get(s["grade_id"]) if s["grade_id"] else None
        if j is None and s["id"]:
            j = by_id.get(s["id"])
        if j is None:
            added.setdefault(anchor, []).append(s["source"])
            continue
        anchor = j
        if release[j]["role"] == "answer":
            if j in answers:
                dupes.add(release[j]["grade_id"] or release[j]["id"])
            else:
                answers[j] = s["source"]
    for d in sorted(dupes):
        notes.append(f"the answer cell {d} appears more than once; the first copy was graded")

    steps, tests, answer_code, added_code = [], [], [], []
    first_answer = next((j for j, c in enumerate(release) if c["role"] == "answer"), len(release))

    def add_extra(j):
        for src in added.get(j, []):
            steps.append({"kind": "cell", "label": "a cell you added", "source": src})
            added_code.append(src)

    n_test = 0
    for j, c in enumerate(release):
        if j == first_answer:
            add_extra(-1)  # added before any matched cell: after the setup, before the first answer
        if c["role"] == "instructor":
            steps.append({"kind": "cell", "label": c["grade_id"] or "setup", "source": c["source"]})
        elif c["role"] == "answer":
            if j in answers:
                steps.append({"kind": "cell", "label": c["grade_id"] or "answer", "source": answers[j]})
                answer_code.append(answers[j])
            else:
                notes.append(f"your notebook has no answer cell {c['grade_id'] or c['id']} "
                             "(deleted, or its metadata changed); nothing ran in its place")
        elif c["role"] == "test":
            t = Test(c["grade_id"], c["points"], n_test)
            n_test += 1
            tests.append(t)
            steps.append({"kind": "test", "grade_id": t.grade_id, "index": t.index})
        if c["role"] != "markdown":
            add_extra(j)
    if first_answer == len(release):
        add_extra(-1)
    return Plan(steps=steps, tests=tests, notes=notes, answer_code=answer_code, added_code=added_code)


# ------------------------------------------------------------------------------------------------
# The static scan: torch's built-in normalizations in the student's code, judged by what it does
# ------------------------------------------------------------------------------------------------
#
# Graded code is scanned fully: the answer cells, and every def, class and lambda body anywhere
# (graded code can call them). Any mention of a built-in normalization there is reported: an
# attribute or imported name of NORM_OPS (``F.layer_norm``, ``torch.ops.aten.native_group_norm``),
# a norm class (``nn.LayerNorm``), a string naming one (``"aten::native_layer_norm"``), a lookup by
# a computed name (``getattr(F, name)``; ``getattr(self, name)`` is fine), torch's internal
# reference implementations (``torch._refs``, ``torch._decomp``, ``torch._prims``).
#
# Module-level code in the cells the student added (scratch cells) is judged by what it can do to
# graded code, not by the names it mentions:
# * binding a built-in to a name (``ref = nn.LayerNorm(8)``, ``from torch.nn import LayerNorm as
#   L``) taints that name; graded code that uses a tainted name (or a contract name such as
#   ``LayerNorm`` rebound that way) is reported;
# * assigning a built-in to an attribute or an item (``LayerNorm.forward = ...``,
#   ``globals()["x"] = ...``), passing one to ``setattr``, to ``globals().update``, to a module's
#   ``__dict__``, or to a function of the student's that could keep it, is reported (monkeypatching);
# * a method call on one of the student's objects with a built-in as argument
#   (``cache.append(F.layer_norm)``) taints that object;
# * expressions (``print(torch.allclose(mine(x), nn.LayerNorm(32)(x)))``) and assignments to
#   names graded code never uses are fine.
# Everywhere: the builtins ``exec``, ``eval``, ``compile`` and ``__import__`` (as names, not as
# attributes: ``model.eval()`` and ``re.compile`` are fine), ``from torch... import *``, and strings
# run as code by IPython other than the magics IPython itself writes.
#
# Cells are read as IPython reads them (``TransformerManager().transform_cell``: magics, shell
# escapes, ``x = %pwd``), and the Python inside magics (``%time``, ``%%capture``...) is scanned in
# place. A cell that still does not parse is reported: it cannot be read here, yet may run
# (student code can register its own input transformers).

#: torch classes that compute a normalization for you
NORM_CLASSES = frozenset({"LayerNorm", "RMSNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "GroupNorm",
                          "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "LocalResponseNorm",
                          "LazyBatchNorm1d", "LazyBatchNorm2d", "LazyBatchNorm3d", "LazyInstanceNorm1d",
                          "LazyInstanceNorm2d", "LazyInstanceNorm3d", "SyncBatchNorm"})
#: builtins that run code given as data: reported wherever they are named
EXEC_BUILTINS = frozenset({"exec", "eval", "compile", "__import__"})
#: torch's internal reference implementations: they compute every built-in from primitives
TORCH_INTERNALS = frozenset({"_refs", "_decomp", "_prims"})
#: attributes and functions that reach objects around the names in the code (a module's namespace,
#: every live object, a class's subclasses...)
REACH_ATTRS = frozenset({"__subclasses__", "__globals__", "__builtins__", "__code__", "__closure__", "__dict__",
                         "get_objects", "get_referents", "get_referrers", "getmembers", "getattr_static"})
#: namespaces looked up by a computed key: ``globals()[name]``, ``vars(m)[name]``...
NAMESPACE_CALLS = frozenset({"globals", "vars", "locals"})
#: methods that write into a mapping or an object
WRITERS = frozenset({"update", "setdefault", "__setitem__", "__setattr__", "__init__"})
#: what IPython's own transformer writes for magics and shell escapes (get_ipython().<method>)
IPYTHON_MAGIC_CALLS = frozenset({"run_line_magic", "run_cell_magic", "system", "getoutput"})
#: IPython methods and attributes that run strings as code or change how cells are read
IPYTHON_RUNNERS = frozenset({"run_cell", "run_cell_async", "ex", "ev", "run_code", "run_ast_nodes", "safe_execfile",
                             "safe_execfile_ipy", "safe_run_module", "push", "define_macro", "magic",
                             "input_transformers_post", "input_transformers_cleanup", "input_transformer_manager",
                             "ast_transformers", "register_magic_function", "events", "set_hook"})
#: the student's code names the graded checks look up (fallback when coursekit.checks is unavailable)
CONTRACT_NAMES = ("LayerNorm", "RMSNorm", "apply_residual_connection", "ResidualBlock", "TransformerBlock",
                  "TransformerStack", "rmsnorm_backward", "layernorm_backward", "FusedAddRMSNorm")

_PATH_STRING = re.compile(r"^[A-Za-z_][\w.:]*$")
_CODE_HINT = re.compile(r"\bimport\b|[(=\n]")


@functools.lru_cache(maxsize=1)
def _contract_names() -> frozenset:
    try:
        from coursekit.checks import load_all
        names = {n for c in load_all().values() for n in c.needs}
    except Exception:  # noqa: BLE001 -- the scan must not depend on the checks importing
        names = set()
    return frozenset(names | set(CONTRACT_NAMES))


@functools.lru_cache(maxsize=1)
def _transformer():
    from IPython.core.inputtransformer2 import TransformerManager
    return TransformerManager()


def _parse(src: str) -> ast.Module:
    """A cell as IPython reads it; raises SyntaxError (or what IPython raises) when it cannot."""
    return ast.parse(_transformer().transform_cell(src))


def _parse_magic_text(text: str) -> ast.Module | None:
    """The Python in a magic's argument (``%time y = f(x)``, ``%timeit -n 10 f(x)``), else None."""
    words = text.split()
    for k in range(min(len(words), 8) + 1):  # leading options: -n 10, -r 3, -o, -q...
        rest = text.strip()
        for w in words[:k]:
            rest = rest[len(w):].lstrip() if rest.startswith(w) else rest
        try:
            return _parse(rest)
        except Exception:  # noqa: BLE001 -- IPython may raise anything on odd text
            continue
    return None


def _root(node):
    """The innermost object of ``a.b[c].d(...)``: a Name, a Call, or anything else."""
    while True:
        if isinstance(node, (ast.Attribute, ast.Subscript)):
            node = node.value
        elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Attribute, ast.Subscript)):
            node = node.func
        else:
            return node


def _chain_attrs(node) -> list[str]:
    out = []
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        if isinstance(node, ast.Attribute):
            out.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Subscript):
            node = node.value
        else:
            node = node.func
    return out


def _is_get_ipython(node) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "get_ipython"


def _show(node) -> str:
    try:
        text = ast.unparse(node)
    except Exception:  # noqa: BLE001
        text = type(node).__name__
    return text if len(text) <= 60 else text[:57] + "..."


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp, ast.SetComp,
           ast.DictComp, ast.GeneratorExp)


def _outer_parts(scope) -> list:
    """What a scope node evaluates in the scope around it: decorators, defaults, bases,
    annotations, a comprehension's first iterable."""
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
        a = scope.args
        parts = list(a.defaults) + [d for d in a.kw_defaults if d is not None]
        if not isinstance(scope, ast.Lambda):
            parts += list(scope.decorator_list) + ([scope.returns] if scope.returns else [])
            parts += [x.annotation for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg]
                      if x is not None and x.annotation is not None]
        return parts
    if isinstance(scope, ast.ClassDef):
        return list(scope.decorator_list) + list(scope.bases) + [k.value for k in scope.keywords]
    return [scope.generators[0].iter]


def _inner_parts(scope) -> list:
    """What a scope node evaluates in its own scope."""
    if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return list(scope.body)
    if isinstance(scope, ast.Lambda):
        return [scope.body]
    gens = scope.generators
    parts = [g.target for g in gens] + [g.iter for g in gens[1:]] + [c for g in gens for c in g.ifs]
    return parts + ([scope.key, scope.value] if isinstance(scope, ast.DictComp) else [scope.elt])


def _direct(parts):
    """The nodes of ``parts`` outside nested scopes, and the nested scope nodes themselves."""
    todo, nodes, scopes = list(parts), [], []
    while todo:
        n = todo.pop()
        if isinstance(n, _SCOPES):
            scopes.append(n)
            todo.extend(_outer_parts(n))
            continue
        nodes.append(n)
        todo.extend(ast.iter_child_nodes(n))
    return nodes, scopes


def _free_globals(tree) -> set[str]:
    """Module-level names the code in ``tree`` reads (a Module, or a def/class/lambda node):
    loads at module level, and loads inside functions of names they do not bind themselves."""
    out: set[str] = set()

    def visit(parts, visible: frozenset, module: bool):
        nodes, scopes = _direct(parts)
        for n in nodes:
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in visible:
                out.add(n.id)
        for sc in scopes:
            inner, _ = _direct(_inner_parts(sc))
            declared = {g for n in inner if isinstance(n, ast.Global) for g in n.names}
            local = {n.id for n in inner if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
            local |= {a.asname or a.name.split(".")[0] for n in inner if isinstance(n, (ast.Import, ast.ImportFrom))
                      for a in n.names}
            local |= {n.name for n in inner if isinstance(n, ast.ExceptHandler) and n.name}
            _, nested = _direct(_inner_parts(sc))
            local |= {n.name for n in nested if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
            if not isinstance(sc, ast.ClassDef) and hasattr(sc, "args"):
                a = sc.args
                local |= {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg] if x is not None}
            local -= declared
            if isinstance(sc, ast.ClassDef):  # a class body's names are not visible in its methods
                visit_class(sc, visible, local)
            else:
                visit(_inner_parts(sc), visible | local, False)

    def visit_class(sc, visible, local):
        nodes, scopes = _direct(_inner_parts(sc))
        for n in nodes:
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in visible | local:
                out.add(n.id)
        for inner in scopes:
            visit([inner], visible, False)

    if isinstance(tree, ast.Module):
        visit(tree.body, frozenset(), True)
    else:
        visit([tree], frozenset(), True)
    return out


def _walk_here(node):
    """ast.walk that yields def, class and lambda nodes but not what is inside (graded code)."""
    todo = [node]
    while todo:
        n = todo.pop()
        yield n
        if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(n))


class _Scan:
    def __init__(self, ops: frozenset):
        self.ops = frozenset(ops)
        self.names = self.ops | NORM_CLASSES
        self.found: set[str] = set()
        self.tainted: dict[str, str] = {}  # name -> what it was bound to
        self.graded_refs: set[str] = set(_contract_names())
        self.defined: set[str] = set()  # names the student binds (def, class, assignment, argument)
        self.imported: set[str] = set()  # names bound by import statements
        self.own_attrs: set[str] = set()  # methods of the student's classes, self.X = ... targets
        self.functions: dict[str, list] = {}  # the student's functions and classes by name
        self.docstrings: set[int] = set()  # ids of docstring nodes (never code)
        self.own_getattr: set[int] = set()  # ids of getattr(self, ...) calls inside methods
        self.changed = False

    # ---- what the student's code defines ------------------------------------------------------

    def collect(self, tree, answer: bool) -> None:
        for node in ast.walk(tree):
            body = getattr(node, "body", None)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and body \
                    and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                self.docstrings.add(id(body[0].value))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.defined.add(node.name)
                self.functions.setdefault(node.name, []).append(node)
                if isinstance(node, ast.ClassDef):
                    methods = [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
                    self.own_attrs.update(m.name for m in methods)
                    for m in methods:
                        self._own_getattrs(m)
            elif isinstance(node, ast.arg):
                self.defined.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                self.defined.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                    and isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                self.own_attrs.add(node.attr)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                for a in node.names:
                    if a.name != "*":
                        self.imported.add(a.asname or a.name.split(".")[0])
            elif isinstance(node, ast.ExceptHandler) and node.name:
                self.defined.add(node.name)
        if answer:  # functions and classes an answer cell defines are graded, whoever rebinds them
            self.graded_refs.update(stmt.name for stmt in tree.body
                                    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)))

    def _own_getattrs(self, method) -> None:
        """getattr(self, <computed>) in a method whose first parameter is self (or cls) and that
        never rebinds it: a lookup among the object's own attributes."""
        a = method.args
        first = (a.posonlyargs + a.args)[:1]
        if not first or first[0].arg not in ("self", "cls"):
            return
        me = first[0].arg
        if any(isinstance(n, ast.Name) and n.id == me and isinstance(n.ctx, (ast.Store, ast.Del))
               for n in ast.walk(method)):
            return
        for n in ast.walk(method):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "getattr" \
                    and len(n.args) == 2 and isinstance(n.args[0], ast.Name) and n.args[0].id == me \
                    and not any(isinstance(x, ast.Starred) for x in n.args):
                self.own_getattr.add(id(n))

    # ---- what an expression mentions -------------------------------------------------------------

    def _string(self, value: str) -> str | None:
        """A string that names a built-in (``"layer_norm"``, ``"aten::native_layer_norm.default"``,
        ``"torch.nn.LayerNorm"``) or is code using one (``"from torch.nn.functional import layer_norm"``,
        written to a file or run): prose that mentions one (``"my layer_norm"``) is fine."""
        v = value.strip()
        if v in self.names:
            return repr(v)
        if _PATH_STRING.match(v) and ("." in v or "::" in v):
            parts = re.split(r"::|\.", v)
            if any(p in self.names or p in TORCH_INTERNALS for p in parts):
                return repr(v)
        if _CODE_HINT.search(v) and len(v) < 100_000 and set(re.findall(r"[A-Za-z_]\w*", v)) & (
                self.names | TORCH_INTERNALS):
            try:
                tree = ast.parse(v)
            except (SyntaxError, ValueError):
                return None  # prose ("compare with torch.nn.LayerNorm (reference)")
            imports = [m for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)) for m in self._import(n)]
            if imports or self.mentions(tree):
                return f"code in a string ({v[:40]!r})"
        return None

    def mentions(self, node) -> list[str]:
        """What in ``node`` names or may reach a built-in normalization (descriptions)."""
        out = []
        called = {id(n.func) for n in ast.walk(node) if isinstance(n, ast.Call)}
        for n in ast.walk(node):
            if isinstance(n, ast.Attribute):
                own = isinstance(n.value, ast.Name) and n.value.id in ("self", "cls") and n.attr in self.own_attrs
                if (n.attr in self.ops or n.attr in NORM_CLASSES) and not own:
                    out.append(_show(n))
                elif n.attr in TORCH_INTERNALS:
                    out.append(f"torch's internal reference implementations ({_show(n)})")
                elif n.attr in REACH_ATTRS:
                    out.append(f"{n.attr} (a lookup around the names in your code)")
                elif _is_get_ipython(n.value) and n.attr in IPYTHON_RUNNERS:
                    out.append(f"get_ipython().{n.attr} (code run from a string)")
                elif n.attr in EXEC_BUILTINS and isinstance(_root(n), ast.Name) and _root(n).id in ("builtins", "__builtins__"):
                    out.append(f"{_show(n)}()")
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                if n.id in self.ops and n.id not in self.defined:
                    out.append(n.id)
                elif n.id in self.tainted:
                    out.append(f"{n.id} (bound to {self.tainted[n.id]})")
                elif n.id == "__builtins__":
                    out.append("__builtins__ (a lookup around the names in your code)")
                elif n.id == "getattr" and id(n) not in called and n.id not in self.defined:
                    out.append("getattr passed as a value (a lookup by computed names)")
            elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in self.docstrings:
                hit = self._string(n.value)
                if hit:
                    out.append(hit)
            elif isinstance(n, ast.Call):
                out.extend(self._dynamic_call(n))
            elif isinstance(n, ast.Subscript) and not isinstance(n.slice, ast.Constant):
                base = n.value
                if (isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and base.func.id in NAMESPACE_CALLS) \
                        or (isinstance(base, ast.Attribute) and base.attr in ("__dict__", "modules")):
                    out.append(f"{_show(base)}[...] with a computed key")
        return out

    def _dynamic_call(self, n: ast.Call) -> list[str]:
        fn = n.func
        name = fn.id if isinstance(fn, ast.Name) else fn.attr if isinstance(fn, ast.Attribute) else ""
        if name == "getattr" and isinstance(fn, ast.Name):
            attr = n.args[1] if len(n.args) >= 2 else None
            if isinstance(attr, ast.Constant) and not any(isinstance(x, ast.Starred) for x in n.args):
                if isinstance(attr.value, str) and attr.value in EXEC_BUILTINS:
                    return [f"getattr(..., {attr.value!r})"]
                return []
            if id(n) in self.own_getattr:
                return []
            return ["getattr() with a computed name"]
        if name == "vars" and isinstance(fn, ast.Name) and n.args and not (
                isinstance(n.args[0], ast.Name) and n.args[0].id == "self"):
            return ["vars() of another object (a lookup around the names in your code)"]
        if name in ("get", "pop", "setdefault", "__getitem__") and isinstance(fn, ast.Attribute) \
                and isinstance(fn.value, ast.Call) and isinstance(fn.value.func, ast.Name) \
                and fn.value.func.id in NAMESPACE_CALLS and any(not isinstance(a, ast.Constant) for a in n.args[:1]):
            return [f"{fn.value.func.id}().{name}() with a computed key"]
        if name in ("__getattribute__", "__getattr__") and any(not isinstance(a, ast.Constant) for a in n.args):
            return [f"{name}() with a computed name"]
        if name in ("attrgetter", "methodcaller") and any(not isinstance(a, ast.Constant) for a in n.args[:1]):
            return [f"{name}() with a computed name"]
        if name == "import_module" and any(not isinstance(a, ast.Constant) for a in n.args[:1]):
            return ["import_module() with a computed name"]
        if _is_get_ipython(getattr(fn, "value", None)) and name in IPYTHON_MAGIC_CALLS \
                and any(not isinstance(a, ast.Constant) for a in n.args):
            return [f"get_ipython().{name}() with a computed argument (code run from a string)"]
        return []

    # ---- graded code: everything counts --------------------------------------------------------

    def graded(self, tree, where: str) -> None:
        self.graded_refs.update(_free_globals(tree))
        for n in ast.walk(tree):
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
                if n.id in EXEC_BUILTINS:
                    self.found.add(f"{n.id}()")
            elif isinstance(n, ast.Subscript) and isinstance(n.value, ast.Call) \
                    and isinstance(n.value.func, ast.Name) and n.value.func.id in NAMESPACE_CALLS \
                    and isinstance(n.slice, ast.Constant) and isinstance(n.slice.value, str):
                self.graded_refs.add(n.slice.value)  # globals()["name"]
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                self.found.update(self._import(n))
            elif isinstance(n, ast.Call):
                self._magic(n, graded=True, where=where)
        self.found.update(m for m in self.mentions(tree) if " (bound to " not in m)

    def _import(self, n) -> list[str]:
        out = []
        if isinstance(n, ast.ImportFrom):
            mod = n.module or ""
            parts = mod.split(".")
            for a in n.names:
                if a.name == "*" and parts[0] == "torch":
                    out.append(f"from {mod} import *")
                elif a.name in self.names or a.name in TORCH_INTERNALS:
                    out.append(f"from {mod} import {a.name}")
                elif mod in ("builtins", "__builtin__") and a.name in EXEC_BUILTINS:
                    out.append(f"from builtins import {a.name}")
            if any(p in TORCH_INTERNALS for p in parts):
                out.append(f"torch's internal reference implementations (from {mod} import ...)")
        else:
            for a in n.names:
                if any(p in TORCH_INTERNALS for p in a.name.split(".")):
                    out.append(f"torch's internal reference implementations (import {a.name})")
        return out

    def _magic(self, call: ast.Call, graded: bool, where: str) -> None:
        """Scan the Python inside a magic IPython wrote (``%time ...``, ``%%capture``), in place."""
        fn = call.func
        if not (isinstance(fn, ast.Attribute) and _is_get_ipython(fn.value) and fn.attr in IPYTHON_MAGIC_CALLS):
            return
        texts = [a.value for a in call.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if fn.attr in ("run_line_magic", "run_cell_magic"):
            texts = texts[1:]  # the magic's name
        for text in texts:
            tree = _parse_magic_text(text) if fn.attr not in ("system", "getoutput") else None
            if tree is not None:
                if graded:
                    self.graded(tree, where)
                else:
                    self.scratch(tree.body, where)
            else:
                words = set(re.findall(r"[A-Za-z_]\w*", text))
                hits = sorted(words & (self.names | EXEC_BUILTINS | TORCH_INTERNALS))
                if hits:
                    self.found.add(f"{', '.join(hits)} in a magic or shell command ({where})")

    # ---- cells the student added: module-level code by what it does ----------------------------

    def scratch(self, stmts, where: str) -> None:
        for stmt in stmts:
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.graded(stmt, where)
            elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
                for a in stmt.names:
                    bad = self._import(ast.ImportFrom(module=stmt.module, names=[a], level=0)
                                       if isinstance(stmt, ast.ImportFrom) else ast.Import(names=[a]))
                    if a.name == "*" or (isinstance(stmt, ast.ImportFrom) and stmt.module in ("builtins", "__builtin__")):
                        self.found.update(bad)
                    elif bad:
                        self._taint(a.asname or a.name.split(".")[0], bad[0])
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                value = stmt.value
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                if value is not None:
                    self.expression(value, where)
                    self._bind(targets, self.mentions(value), where)
            elif isinstance(stmt, ast.Expr):
                self.expression(stmt.value, where)
            elif isinstance(stmt, (ast.For, ast.AsyncFor)):
                self.expression(stmt.iter, where)
                self._bind([stmt.target], self.mentions(stmt.iter), where)
                self.scratch(stmt.body + stmt.orelse, where)
            elif isinstance(stmt, (ast.With, ast.AsyncWith)):
                for item in stmt.items:
                    self.expression(item.context_expr, where)
                    if item.optional_vars is not None:
                        self._bind([item.optional_vars], self.mentions(item.context_expr), where)
                self.scratch(stmt.body, where)
            elif isinstance(stmt, (ast.If, ast.While)):
                self.expression(stmt.test, where)
                self.scratch(stmt.body + stmt.orelse, where)
            elif isinstance(stmt, (ast.Try, getattr(ast, "TryStar", ast.Try))):
                for h in stmt.handlers:
                    if h.type is not None:
                        self.expression(h.type, where)
                    self.scratch(h.body, where)
                self.scratch(stmt.body + stmt.orelse + stmt.finalbody, where)
            elif isinstance(stmt, ast.Match):
                self.expression(stmt.subject, where)
                for case in stmt.cases:
                    self.scratch(case.body, where)
            elif isinstance(stmt, ast.Delete):
                for t in stmt.targets:
                    if not isinstance(t, ast.Name) and self.mentions(t):
                        self.found.add(f"del {_show(t)} ({where})")
            else:  # return, raise, assert, global...: their expressions
                for child in ast.iter_child_nodes(stmt):
                    if isinstance(child, ast.expr):
                        self.expression(child, where)

    def _taint(self, name: str, what: str) -> None:
        if name not in self.tainted:
            m = re.match(r"^\w+ \(bound to (.*)\)$", what)
            self.tainted[name] = m.group(1) if m else what
            self.changed = True

    def _bind(self, targets, found: list[str], where: str) -> None:
        for t in targets:
            if isinstance(t, ast.Name):
                if found:
                    self._taint(t.id, found[0])
            elif isinstance(t, (ast.Tuple, ast.List)):
                self._bind(t.elts, found, where)
            elif isinstance(t, ast.Starred):
                self._bind([t.value], found, where)
            else:  # an attribute or an item: monkeypatching
                hit = found or self.mentions(t)
                if hit:
                    self.found.add(f"{hit[0]} assigned to {_show(t)} ({where})")

    def expression(self, expr, where: str) -> None:
        """Module-level expression in an added cell: lambdas are graded code, calls are judged,
        code in a string (to be written to a file, or run) is reported."""
        magic_text = {id(a) for n in _walk_here(expr) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                      and _is_get_ipython(n.func.value) and n.func.attr in IPYTHON_MAGIC_CALLS for a in n.args}
        for n in _walk_here(expr):
            if isinstance(n, ast.Lambda):
                self.graded(n, where)
            elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in magic_text \
                    and id(n) not in self.docstrings:
                hit = self._string(n.value)
                if hit and hit.startswith("code in a string"):
                    self.found.add(f"{hit} ({where})")
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in EXEC_BUILTINS:
                self.found.add(f"{n.id}()")
            elif isinstance(n, ast.NamedExpr):
                found = self.mentions(n.value)
                if found:
                    self._taint(n.target.id, found[0])
            elif isinstance(n, ast.Call):
                self._magic(n, graded=False, where=where)
                self._call(n, where)
            elif isinstance(n, ast.Attribute) and _is_get_ipython(n.value) and n.attr in IPYTHON_RUNNERS:
                self.found.add(f"get_ipython().{n.attr} (code run from a string)")

    def _call(self, n: ast.Call, where: str) -> None:
        args = list(n.args) + [k.value for k in n.keywords]
        found = [m for a in args for m in self.mentions(a)]
        found += self._dynamic_call(n)
        if not found:
            return
        fn = n.func
        if isinstance(fn, ast.Name):
            if fn.id in ("setattr", "delattr"):
                self.found.add(f"{fn.id}() with {found[0]} ({where})")
            elif fn.id in self.functions and not self._harmless(fn.id):
                self.found.add(f"{found[0]} passed to {fn.id}() ({where})")
            return
        root = _root(fn)
        attrs = _chain_attrs(fn)
        if isinstance(root, ast.Call) and isinstance(root.func, ast.Name) and root.func.id in NAMESPACE_CALLS:
            self.found.add(f"{found[0]} written into {root.func.id}() ({where})")
        elif isinstance(root, ast.Name) and root.id in self.imported and root.id not in self.defined:
            if "__dict__" in attrs or (attrs and attrs[0] in WRITERS):
                self.found.add(f"{found[0]} written into {_show(fn)} ({where})")
        elif isinstance(root, ast.Name):
            self._taint(root.id, found[0])  # its method may keep what it was given

    def _harmless(self, name: str, seen: frozenset = frozenset()) -> bool:
        """A function or class of the student's that can keep nothing it is given beyond the
        instance it builds: no global/nonlocal, no stores into attributes or items other than
        ``self.x = ...``, no setattr/globals()/exec, no method calls with arguments on names from
        outside (other than imported modules), and only such functions of the student's called."""
        nodes = self.functions.get(name, [])
        if not nodes or name in seen:
            return bool(nodes)
        seen = seen | {name}
        for node in nodes:
            local = {n.arg for n in ast.walk(node) if isinstance(n, ast.arg)} | {
                n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
            for n in ast.walk(node):
                if isinstance(n, (ast.Global, ast.Nonlocal)):
                    return False
                if isinstance(n, (ast.Attribute, ast.Subscript)) and isinstance(n.ctx, (ast.Store, ast.Del)) \
                        and not (isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"):
                    return False
                if isinstance(n, ast.Call):
                    fn = n.func
                    if isinstance(fn, ast.Name):
                        if fn.id in ("setattr", "delattr") or fn.id in NAMESPACE_CALLS or fn.id in EXEC_BUILTINS:
                            return False
                        if fn.id in self.functions and not self._harmless(fn.id, seen):
                            return False
                        continue
                    root = _root(fn)
                    if (n.args or n.keywords) and isinstance(root, ast.Name) and root.id not in local \
                            and not (root.id in self.imported and root.id not in self.defined):
                        return False  # e.g. _cache.append(f): an object from outside keeps f
        return True


def _cells(cells) -> list[str]:
    return [c if isinstance(c, str) else "" for c in (cells or [])]


def scan_forbidden(answer_cells: list[str], added_cells=None, forbidden_ops=None) -> list[str]:
    """What in the student's code uses (or may reach) a built-in normalization: [] when nothing.

    ``answer_cells``: the student's answer cells (nbgrader ``solution: true``); ``added_cells``:
    the cells the student added; ``forbidden_ops``: op names (``coursekit.checks.ops.NORM_OPS``).
    The old call ``scan_forbidden(code_cells, forbidden_ops)`` still works and scans every cell
    as an answer cell (the strict reading: scratch cells are then judged like answers).
    See the comment above for the rules.
    """
    if forbidden_ops is None and isinstance(added_cells, (set, frozenset)):
        answer_cells, added_cells, forbidden_ops = answer_cells, [], added_cells
    return list(_scan(tuple(_cells(answer_cells)), tuple(_cells(added_cells)), frozenset(forbidden_ops or ())))


@functools.lru_cache(maxsize=64)
def _scan(answers: tuple, added: tuple, ops: frozenset) -> tuple:
    scan = _Scan(ops)
    trees = []
    for kind, cells in (("answer cell", answers), ("cell you added", added)):
        for i, src in enumerate(cells, 1):
            where = f"{kind} {i}"
            try:
                tree = _parse(src)
            except Exception as e:  # noqa: BLE001 -- SyntaxError, or IPython's own errors on odd input
                first = next((line.strip() for line in src.splitlines() if line.strip()), "")[:40]
                why = f"{type(e).__name__}: {getattr(e, 'msg', None) or e}"
                line = f" at line {e.lineno}" if getattr(e, "lineno", None) else ""
                scan.found.add(f"a cell that could not be read as Python ({where}, starting {first!r}: {why}{line})")
                continue
            trees.append((kind, tree, where))
            scan.collect(tree, answer=kind == "answer cell")
    for kind, tree, where in trees:
        if kind == "answer cell":
            scan.graded(tree, where)
    scan.changed = True
    rounds = 0
    while scan.changed and rounds < 20:  # taint spreads through assignments until nothing changes
        scan.changed = False
        rounds += 1
        for kind, tree, where in trees:
            if kind == "cell you added":
                scan.scratch(tree.body, where)
    for name in sorted(scan.tainted.keys() & scan.graded_refs):
        scan.found.add(f"{name}, bound to {scan.tainted[name]} in a cell you added and used by your graded code")
    return tuple(sorted(scan.found))


# ------------------------------------------------------------------------------------------------
# The grading machinery: no exercise's code may reach into it
# ------------------------------------------------------------------------------------------------
# The probes run in the student's process, beside the student's code: code that imports the
# check modules can swap a probe, compute what a judge expects, or switch the kernel block off.
# No honest notebook does: the released setup cell imports ``run`` and ``smoke`` from coursekit,
# and nothing else of the course is needed to answer. So every cell is scanned (answers and
# scratch cells, every exercise), and a hit costs every test of the notebook, with a message
# saying why, for a human to look at.

#: packages of the course and its grader: importing anything of them but the public runtime
MACHINERY_PACKAGES = ("coursekit", "course", "autograder", "book", "tools")
PUBLIC_RUNTIME = frozenset({"run", "smoke", "CheckFailed"})  # ``from coursekit import run, smoke``
#: names of the machinery's own objects
MACHINERY_NAMES = frozenset({"REGISTRY", "SERVED", "_ACTIVE", "OpRecorder", "block_kernels", "load_all",
                             "collect", "verdict", "torch_module", "torch_cls"})
#: routes that load code or objects by a name or bytes the scan cannot read
DYNAMIC_ROUTES = frozenset({"locate", "find_class", "marshal", "FunctionType", "CodeType", "import_module",
                            "get_referrers", "get_referents", "get_objects", "modules"})


def scan_machinery(code_cells: list[str]) -> list[str]:
    """What in the student's cells reaches into the course's grading machinery: [] when nothing.
    A cell that cannot be read is skipped here (the norm exercises' scan fails it; elsewhere it can
    only run through IPython machinery that :data:`IPYTHON_RUNNERS` already names)."""
    found = set()
    for src in _cells(code_cells):
        try:
            tree = _parse(src)
        except Exception:  # noqa: BLE001
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.split(".")[0] in MACHINERY_PACKAGES:
                        found.add(f"import {a.name}")
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in MACHINERY_PACKAGES:
                names = {a.name for a in node.names}
                if node.module != "coursekit" or not names <= PUBLIC_RUNTIME:
                    found.add(f"from {node.module} import {', '.join(sorted(names))}")
            elif isinstance(node, (ast.Attribute, ast.Name)):
                name = node.attr if isinstance(node, ast.Attribute) else node.id
                if name in MACHINERY_NAMES:
                    found.add(name)
                elif name in DYNAMIC_ROUTES and (isinstance(node, ast.Attribute) or name != "modules"):
                    found.add(f".{name}" if isinstance(node, ast.Attribute) else f"{name}()")
                elif isinstance(node, ast.Attribute) and name in IPYTHON_RUNNERS and _is_get_ipython(node.value):
                    found.add(f"get_ipython().{name}")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value.split(".")[0] in MACHINERY_PACKAGES and _PATH_STRING.match(node.value) \
                        and "." in node.value:
                    found.add(f"the module name {node.value!r}")
    return sorted(found)
