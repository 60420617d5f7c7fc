"""The graded slice of a submission: which of the student's code runs when grading, and which of it
is *graded code*.

A submission is the release's locked cells (trusted, run as released), the student's answer cells
and the cells the student added (scratch cells). When grading:

* every **locked cell** runs, as released;
* every **answer cell** runs, whole;
* of an **added cell**, only the top-level statements that graded code needs run: a statement runs
  when it binds a name that is *needed* (``def``, ``class``, ``import``, an assignment, a ``for``
  or ``with`` target), when it writes into a needed object of the student's (``LayerNorm.eps =
  1e-5``, ``cache["k"] = v``, ``cache.update(...)``, ``setattr(LayerNorm, ...)``), or when it calls
  a function of the student's with a needed object that the function can write into. A compound
  statement (``if``, ``for``, ``try``...) runs whole or not at all. A star import runs when graded
  code reads a name that nothing binds (it may bind it; it is not graded code itself). A
  ``%%writefile NAME.py`` cell runs whole when graded code imports ``NAME``; the file's statements
  are graded code (``Statement.module``), and the row says when such a cell did not run.
  Everything else in an added cell (prints, asserts, comparisons with torch, plots, timing, test
  functions that nothing graded calls, other magics, shell escapes) does not run.

Slicing is linear in the code's size (a worklist over an index of which statements bind or write
each name) and stops at a deadline (:class:`PlanningTimeout`); a cell nested deeper than
:data:`MAX_NESTING`, or with more magics for its length than IPython can rewrite in seconds
(:data:`MAX_ESCAPE_WORK`), cannot be read.

A name is *needed* when it is one of the contract's names (``shared/CONTRACT.md``: ``LayerNorm``,
``FusedAddRMSNorm``...), or when code that is needed reads it (a function's free global names,
its decorators and default values, a class's bases, the right-hand side of a needed assignment),
transitively. **Graded code** is every statement, in answer cells and added cells, that binds or
writes a needed name (with the whole body of a needed ``def`` or ``class``): the code the probes
reach. Answer-cell statements that are not graded code still run (an answer cell runs whole), but
what they mention costs nothing (see :mod:`autograder.intake.scan`).

Cells are read as IPython reads them (``TransformerManager().transform_cell``: magics and shell
escapes become ``get_ipython()`` calls); the Python inside ``%%time`` and ``%%capture`` cells is
sliced like a cell of its own. An added cell that cannot be read as Python does not run at all; an
answer cell that cannot be read still runs (IPython says what is wrong) and is flagged for review.
The added cells' code that runs is their transformed text with the dropped statements blanked out,
so line numbers in error messages stay those of the student's cell.
"""
from __future__ import annotations

import ast
import builtins
import functools
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field

#: the student's code names the graded checks look up (fallback when coursekit.checks is unavailable)
CONTRACT_NAMES = ("LayerNorm", "RMSNorm", "apply_residual_connection", "ResidualBlock", "TransformerBlock",
                  "TransformerStack", "rmsnorm_backward", "layernorm_backward", "FusedAddRMSNorm",
                  "sinkhorn_knopp", "MHCResidual", "depth_attention")
#: cell magics whose body is Python that runs in the notebook's namespace: sliced like a cell
INLINE_CELL_MAGICS = frozenset({"time", "capture"})
#: line magics whose argument is Python that runs in the notebook's namespace, after their options:
#: read like the code they run (``%time import sys`` is ``import sys``; ``x = %time f()`` is
#: ``x = f()``: the twenty-second red team ran the review's flagged lines unread inside ``%time``)
INLINE_LINE_MAGICS = frozenset({"time", "timeit", "prun", "memit"})
#: the options of ``%memit`` (memory_profiler's, not IPython's) that take a value
MEMIT_VALUE_OPTIONS = "rti"
#: cell magics that write their body into a file (``%%file`` is IPython's other name for it)
WRITEFILE_MAGICS = frozenset({"writefile", "file"})
#: ``%%writefile [-a] NAME.py``: the module a cell writes, when it writes one in the working folder
WRITTEN_MODULE = re.compile(r"^\s*(?:-a\s+)?(?:\./)?([A-Za-z_][A-Za-z0-9_]*)\.py\s*$")
#: the deepest a cell's syntax tree may nest (``x.a.a.a...``, ``a + b + ...`` one level per part):
#: deeper code is not read (the readers of the tree recurse; honest code nests a few dozen levels)
MAX_NESTING = 150
#: how deep ``%%time`` cells may sit inside ``%%time`` cells
MAX_INLINE_MAGICS = 8
#: names every cell can read without binding them: Python's builtins and what IPython puts in the
#: namespace; a free name of graded code outside these, that no statement binds, may come from a
#: star import
PREDEFINED = frozenset(dir(builtins)) | {"get_ipython", "display", "In", "Out", "_", "__", "___", "_i", "_ii",
                                         "_iii", "_ih", "_oh", "_dh", "exit", "quit", "__builtins__"}
#: methods through which a function can write into an object it is given
WRITER_METHODS = frozenset({"update", "setdefault", "__setitem__", "__setattr__", "append", "extend", "insert",
                            "add", "pop", "clear", "register_buffer", "register_parameter", "add_module",
                            "register_module", "register_forward_hook", "register_forward_pre_hook"})


@functools.lru_cache(maxsize=1)
def contract_names() -> frozenset:
    """The contract's names: those the checks need, and the fixed list as a fallback."""
    try:
        from coursekit.checks import load_all
        names = {n for c in load_all().values() for n in c.needs}
    except Exception:  # noqa: BLE001 -- the slice must not depend on the checks importing
        names = set()
    return frozenset(names | set(CONTRACT_NAMES))


# ------------------------------------------------------------------------------------------------
# Reading cells
# ------------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _transformer():
    from IPython.core.inputtransformer2 import TransformerManager
    return TransformerManager()


#: text in which IPython's token transforms change nothing: no ``!``, ``%`` or ``?`` anywhere, no
#: line that starts with ``,``, ``;`` or ``/`` (autocall)
_MAY_ESCAPE = re.compile(r"[!%?]|^[ \t]*[,;/]", re.M)
#: lines IPython may rewrite, one per pass over the whole cell
_ESCAPE_LINE = re.compile(r"^[ \t]*[!%?,;/]|=[ \t]*[!%]|\?[ \t]*$", re.M)
#: IPython tokenizes the whole cell again for each magic or shell escape it rewrites (5 to 20 us a
#: character on one core): (such lines) x (the cell's characters) above this is not read
MAX_ESCAPE_WORK = 250_000


@functools.lru_cache(maxsize=16)
def transform(src: str) -> str:
    """A cell's text as IPython runs it (magics become ``get_ipython()`` calls). Plain Python skips
    IPython's tokenizing passes (they would change nothing); a cell with so many magics for its
    length that reading it would take more than seconds raises SyntaxError."""
    tm = _transformer()
    if not _MAY_ESCAPE.search(src):
        lines = (src if src.endswith("\n") else src + "\n").splitlines(keepends=True)
        for t in tm.cleanup_transforms + tm.line_transforms:
            lines = t(lines)
        return "".join(lines)
    escapes = len(_ESCAPE_LINE.findall(src))
    if escapes * len(src) > MAX_ESCAPE_WORK:
        raise SyntaxError(f"{escapes} lines with magics or shell escapes in a cell of {len(src)} characters, "
                          "more than the grader reads")
    return tm.transform_cell(src)


#: CPython 3.11 keeps ``ast.parse``'s nesting count in one place per interpreter, not per thread:
#: two threads parsing at once (the grader plans several notebooks in threads, and a plan past its
#: budget is left to finish) can fail with "SystemError: AST constructor recursion depth mismatch"
#: (python/cpython#106905), which read a sound cell as unreadable. One parse at a time.
_PARSE_LOCK = threading.Lock()


def parse_python(text: str) -> ast.Module:
    """``ast.parse(text)``, one thread at a time (:data:`_PARSE_LOCK`)."""
    with _PARSE_LOCK:
        return ast.parse(text)


def parse(src: str) -> ast.Module:
    """A cell as IPython reads it; raises SyntaxError (or what IPython raises) when it cannot."""
    return parse_python(transform(src))


class PlanningTimeout(Exception):
    """Planning went past its deadline (:func:`slice_cells`'s ``deadline``)."""


def in_time(deadline: float | None) -> None:
    """Raise :class:`PlanningTimeout` when ``deadline`` has passed: a time of this thread's own
    processor clock (``time.thread_time()``), which other work on the machine does not advance (the
    budget then does not depend on the load: the twentieth red team's table planned within it on a
    quiet machine and not on a busy one)."""
    if deadline is not None and time.thread_time() > deadline:
        raise PlanningTimeout


def nesting(tree) -> tuple[int, int | None]:
    """(how deep ``tree`` nests, the line where it is deepest), counted without recursion."""
    deepest, line = 0, None
    todo = [(tree, 0, None)]
    while todo:
        node, depth, at = todo.pop()
        at = getattr(node, "lineno", at)
        if depth > deepest:
            deepest, line = depth, at
        todo.extend((child, depth + 1, at) for child in ast.iter_child_nodes(node))
    return deepest, line


def too_deep(tree) -> str | None:
    """Why ``tree`` is too deep for the grader to read, or None."""
    depth, line = nesting(tree)
    if depth <= MAX_NESTING:
        return None
    return (f"its code nests more than {MAX_NESTING} levels deep" + (f" at line {line}" if line else "")
            + ", too deep for the grader to read")


def read_cell(src: str) -> ast.Module:
    """:func:`parse`, refusing a tree too deep to read (a SyntaxError saying so)."""
    tree = parse(src)
    why = too_deep(tree)
    if why:
        raise SyntaxError(why)
    return tree


def written_module(line: str) -> str | None:
    """The module ``%%writefile LINE`` writes (``helper`` for ``helper.py``, ``-a helper.py``), or None."""
    m = WRITTEN_MODULE.match(line)
    return m.group(1) if m else None


def line_magic(node):
    """(name, line) of ``get_ipython().run_line_magic(name, line)`` with constant arguments, else None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "run_line_magic" \
            and is_get_ipython(node.func.value) and len(node.args) == 2 and not node.keywords \
            and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in node.args):
        return node.args[0].value, node.args[1].value
    return None


def line_magic_code(name: str, line: str) -> str | None:
    """The Python a code-running line magic runs (its line less its options, as IPython's own parser
    splits them: ``%time -x`` runs ``-x``, the twenty-third red team's ``%time -len([...])``), ""
    when IPython would refuse the line, or None for another magic."""
    if name not in INLINE_LINE_MAGICS:
        return None
    try:
        if name == "time":
            from IPython.core import magic_arguments
            from IPython.core.magics.execution import ExecutionMagics
            _, extra = magic_arguments.parse_argstring(ExecutionMagics.time, line, partial=True)
            return " ".join(extra)
        if name in ("timeit", "prun"):
            from IPython.core.magic import Magics
            parser = Magics.__new__(Magics)  # parse_options reads nothing of the instance
            if name == "timeit":
                return parser.parse_options(line, "n:r:tcp:qov:", posix=False, strict=False,
                                            preserve_non_opts=True)[1]
            return parser.parse_options(line, "D:l:rs:T:q", list_all=True, posix=False)[1]
    except (Exception, SystemExit):  # noqa: BLE001 -- IPython's UsageError, argparse's exit: nothing runs
        return ""
    takes = MEMIT_VALUE_OPTIONS  # %memit (memory_profiler): its options, read here
    rest = line.strip()
    while rest.startswith("-") and not rest.startswith("--"):
        head, _, rest = rest.partition(" ")
        letters = head[1:]
        for i, c in enumerate(letters):
            if c in takes:
                if i == len(letters) - 1:  # its value is the next word
                    _, _, rest = rest.lstrip().partition(" ")
                break
        rest = rest.lstrip()
    return rest


def _inlined_line_magic(stmt, depth: int) -> list | None:
    """The statements a line magic that runs Python stands for (see :data:`INLINE_LINE_MAGICS`),
    each marked with the magic's statement (``_inline_of``); None when ``stmt`` is not one, or its
    code is not Python (the magic is then read as a call)."""
    target = None
    if isinstance(stmt, ast.Expr):
        magic = line_magic(stmt.value)
    elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and stmt.value is not None:
        magic, target = line_magic(stmt.value), stmt
    else:
        return None
    code = line_magic_code(*magic) if magic else None
    if code is None:
        return None
    try:
        if depth >= MAX_INLINE_MAGICS:
            raise SyntaxError("magics nested too deep")
        if target is None:
            inner = _statements(read_cell(code), depth + 1)
        else:
            expr = read_cell(code).body
            if len(expr) != 1 or not isinstance(expr[0], ast.Expr):
                return None
            import copy
            new = copy.copy(target)
            new.value = expr[0].value
            ast.copy_location(new, target)
            for n in ast.walk(new.value):  # the magic's line, in the cell's numbering (not Load/Store:
                if "lineno" in n._attributes:  # those are shared by every tree)
                    n.lineno, n.end_lineno = target.lineno, target.end_lineno
            inner = [new]
    except Exception:  # noqa: BLE001 -- not Python: read as the magic's call
        return None
    for s in inner:
        if target is None:
            ast.increment_lineno(s, stmt.lineno - 1)
        setattr(s, "_inline_of", stmt)  # the line the cell shows (a magic's code nested in it too)
    return inner


def is_get_ipython(node) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "get_ipython"


def cell_magic(stmt, with_line: bool = False):
    """(magic name, body) of ``get_ipython().run_cell_magic(name, line, body)``, else None;
    ``with_line``: (name, line, body)."""
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
        fn, args = stmt.value.func, stmt.value.args
        if isinstance(fn, ast.Attribute) and fn.attr == "run_cell_magic" and is_get_ipython(fn.value) \
                and len(args) == 3 and all(isinstance(a, ast.Constant) and isinstance(a.value, str) for a in args):
            return (args[0].value, args[1].value, args[2].value) if with_line else (args[0].value, args[2].value)
    return None


# ------------------------------------------------------------------------------------------------
# Scopes: which names a statement binds and reads
# ------------------------------------------------------------------------------------------------

SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef, ast.ListComp, ast.SetComp,
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


#: per thread (the grader plans submissions in threads side by side), ``direct``: :func:`direct` of one
#: statement, by the statement's id (the statement held, so no id is reused): the analyses below each
#: ask for the same statements' nodes (a cell with a 100,000-number table was walked 25 times, most of
#: its planning); a new one for each :func:`slice_cells`
_LOCAL = threading.local()


def direct(parts):
    """The nodes of ``parts`` outside nested scopes, and the nested scope nodes themselves (lists the
    caller reads, never changes: one statement's are shared, :data:`_DIRECT`)."""
    cache = getattr(_LOCAL, "direct", None)
    if len(parts) == 1 and cache is not None:
        hit = cache.get(id(parts[0]))
        if hit is not None and hit[0] is parts[0]:
            return hit[1], hit[2]
        nodes, scopes = _direct(parts)
        cache[id(parts[0])] = (parts[0], nodes, scopes)
        return nodes, scopes
    return _direct(parts)


def _direct(parts):
    todo, nodes, scopes = list(parts), [], []
    while todo:
        n = todo.pop()
        if isinstance(n, SCOPES):
            scopes.append(n)
            todo.extend(_outer_parts(n))
            continue
        nodes.append(n)
        todo.extend(ast.iter_child_nodes(n))
    return nodes, scopes


def free_globals(stmts) -> set[str]:
    """Module-level names that ``stmts`` read: loads at module level, and loads inside functions
    and classes of names they do not bind themselves."""
    out: set[str] = set()

    def local_names(sc) -> set[str]:
        inner, nested = direct(_inner_parts(sc))
        declared = {g for n in inner if isinstance(n, ast.Global) for g in n.names}
        local = {n.id for n in inner if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
        local |= {a.asname or a.name.split(".")[0] for n in inner if isinstance(n, (ast.Import, ast.ImportFrom))
                  for a in n.names}
        local |= {n.name for n in inner if isinstance(n, ast.ExceptHandler) and n.name}
        local |= {n.name for n in nested if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        if hasattr(sc, "args"):
            a = sc.args
            local |= {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg] if x is not None}
        return local - declared

    def visit(parts, visible: frozenset):
        nodes, scopes = direct(parts)
        for n in nodes:
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in visible:
                out.add(n.id)
        for sc in scopes:
            local = local_names(sc)
            if isinstance(sc, ast.ClassDef):  # a class body's names are not visible in its methods
                body_nodes, body_scopes = direct(_inner_parts(sc))
                for n in body_nodes:
                    if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in visible | local:
                        out.add(n.id)
                for inner in body_scopes:
                    visit([inner], visible)
            else:
                visit(_inner_parts(sc), visible | local)

    visit(list(stmts), frozenset())
    return out


def binds(stmt) -> set[str]:
    """The module-level names a top-level statement binds."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    nodes, scopes = direct([stmt])
    out = {n.id for n in nodes if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
    out |= {a.asname or a.name.split(".")[0] for n in nodes if isinstance(n, (ast.Import, ast.ImportFrom))
            for a in n.names if a.name != "*"}
    out |= {n.name for n in nodes if isinstance(n, ast.ExceptHandler) and n.name}
    out |= {n.name for n in nodes if isinstance(n, (ast.MatchAs, ast.MatchStar)) and n.name}
    out |= {n.name for n in scopes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    return out


def import_binds(stmt) -> set[str]:
    """The module-level names a top-level statement binds by ``import`` (also inside ``try``/``if``)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return set()
    nodes, _ = direct([stmt])
    return {a.asname or a.name.split(".")[0] for n in nodes if isinstance(n, (ast.Import, ast.ImportFrom))
            for a in n.names if a.name != "*"}


def module_names(statements, is_student) -> set[str]:
    """Names only ever bound by imports (``torch``, ``nn``, ``F``, ``math``...): the student binds
    them in no other way."""
    imported, own = set(), set()
    for s in statements:
        imp = import_binds(s.node)
        imported |= imp
        if is_student(s):
            own |= binds(s.node) - imp
    return imported - own


def root_name(node) -> str | None:
    """The name at the root of ``a.b[c].d``, or None (a call, a literal...)."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def _writes(stmt, functions: dict) -> tuple[set[str], set[str]]:
    """(names whose object a top-level statement writes into, names it hands to a function of the
    student's that can write into its arguments)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return set(), set()
    nodes, _ = direct([stmt])
    into, handed = set(), set()
    for n in nodes:
        if isinstance(n, (ast.Attribute, ast.Subscript)) and isinstance(n.ctx, (ast.Store, ast.Del)):
            into.add(root_name(n.value))
        elif isinstance(n, ast.Call):
            fn = n.func
            if isinstance(fn, ast.Attribute) and fn.attr in WRITER_METHODS:
                into.add(root_name(fn.value))
            elif isinstance(fn, ast.Name) and fn.id in ("setattr", "delattr") and n.args:
                into.add(root_name(n.args[0]))
            elif isinstance(fn, ast.Name) and fn.id in functions and functions[fn.id]:
                handed |= {root_name(a) for a in list(n.args) + [k.value for k in n.keywords]}
    return into - {None}, handed - {None}


def module_writes(fn) -> set[str]:
    """Module-level names a def or class (with everything nested in it) rebinds (``global``) or
    writes into (``NAMES[k] = f``, ``NAMES.append(f)``, ``obj.attr = v``) when it runs: names it
    does not bind itself."""
    local = {n.arg for n in ast.walk(fn) if isinstance(n, ast.arg)}
    local |= {n.id for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
    local |= {n.name for n in ast.walk(fn) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
    declared = {g for n in ast.walk(fn) if isinstance(n, ast.Global) for g in n.names}
    out = set(declared)
    for n in ast.walk(fn):
        if isinstance(n, (ast.Attribute, ast.Subscript)) and isinstance(n.ctx, (ast.Store, ast.Del)):
            out.add(root_name(n.value))
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in WRITER_METHODS:
            out.add(root_name(n.func.value))
    return {x for x in out if x is not None and (x not in local or x in declared) and x not in ("self", "cls")}


def _called(expr) -> str | None:
    """The student's function a decorator or call names: ``f``, ``f(...)`` (a decorator factory)."""
    while isinstance(expr, ast.Call):
        expr = expr.func
    return expr.id if isinstance(expr, ast.Name) else None


def _writes_by_call(stmt, writes: dict) -> set[str]:
    """Module-level names a top-level statement writes through the student's functions it calls,
    decorators included (``@register("layer")`` runs ``register`` on the new function)."""
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {w for d in stmt.decorator_list for w in writes.get(_called(d), ())}
    nodes, _ = direct([stmt])
    return {w for n in nodes if isinstance(n, ast.Call) for w in writes.get(_called(n), ())}


def _writes_into_arguments(fn) -> bool:
    """Whether a def can write into an object it is given (a store, a writer method or setattr on
    one of its parameters)."""
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return isinstance(fn, ast.ClassDef)  # a class's __init__ may keep and change what it gets
    a = fn.args
    params = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg] if x is not None}
    for n in ast.walk(fn):
        if isinstance(n, (ast.Attribute, ast.Subscript)) and isinstance(n.ctx, (ast.Store, ast.Del)) \
                and root_name(n.value) in params:
            return True
        if isinstance(n, ast.Call):
            f = n.func
            if isinstance(f, ast.Attribute) and f.attr in WRITER_METHODS and root_name(f.value) in params:
                return True
            if isinstance(f, ast.Name) and f.id in ("setattr", "delattr") and n.args and root_name(n.args[0]) in params:
                return True
    return False


# ------------------------------------------------------------------------------------------------
# The slice
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Cell:
    kind: str  # "locked" | "answer" | "added"
    label: str  # "setup", "answer cell layernorm_impl", "cell you added 2"
    source: str


@dataclass
class Statement:
    cell: int  # index into GradedSlice.cells
    node: ast.stmt
    graded: bool = False  # binds or writes a needed name (the probes reach it)
    runs: bool = False
    module: str | None = None  # the module a %%writefile cell writes this statement into (else the notebook's)


@dataclass
class GradedSlice:
    cells: list[Cell]
    statements: list[Statement] = field(default_factory=list)
    needed: frozenset = frozenset()
    unreadable: dict = field(default_factory=dict)  # cell index -> why it cannot be read
    runs: list = field(default_factory=list)  # cell index -> the source that runs ("" for nothing)
    notes: list = field(default_factory=list)  # what the student should know about the slice (for the row)
    written: list = field(default_factory=list)  # modules %%writefile cells that run write (harness imports them)

    def where(self, st_or_cell, node=None) -> str:
        """``answer cell layernorm_impl, line 12`` for a node of a statement."""
        k = st_or_cell.cell if isinstance(st_or_cell, Statement) else st_or_cell
        line = getattr(node if node is not None else getattr(st_or_cell, "node", None), "lineno", None)
        return f"{self.cells[k].label}, line {line}" if line else self.cells[k].label

    def graded_code(self) -> list[Statement]:
        return [s for s in self.statements if s.graded]

    def running_code(self) -> list[Statement]:
        return [s for s in self.statements if s.runs and self.cells[s.cell].kind != "locked"]


def _statements(tree: ast.Module, depth: int = 0) -> list[ast.stmt]:
    """A cell's top-level statements, the bodies of ``%%time``/``%%capture`` in place of the magic,
    and the body of a ``%%writefile NAME.py`` cell in place of the magic, each of its statements
    marked with the module it writes (``_written_by``: (the magic, the module))."""
    out = []
    for stmt in tree.body:
        inlined = _inlined_line_magic(stmt, depth)
        if inlined is not None:
            out += inlined
            continue
        magic = cell_magic(stmt, with_line=True)
        if magic and magic[0] in INLINE_CELL_MAGICS:
            try:
                if depth >= MAX_INLINE_MAGICS:
                    raise SyntaxError("magics nested too deep")
                inner = read_cell(magic[2])
            except Exception:  # noqa: BLE001 -- the body is not Python: the magic is dropped
                continue
            for s in _statements(inner, depth + 1):
                setattr(s, "_inline_of", stmt)
                out.append(s)
            continue
        module = written_module(magic[1]) if magic and magic[0] in WRITEFILE_MAGICS else None
        if module:
            try:
                inner = parse_python(magic[2])  # a .py file: plain Python, as the import reads it
                if too_deep(inner):
                    raise SyntaxError(too_deep(inner))
            except Exception as e:  # noqa: BLE001 -- not Python: the file is never written
                setattr(stmt, "_unreadable_file", (module, f"{type(e).__name__}: {getattr(e, 'msg', None) or e}"))
                out.append(stmt)
                continue
            ast.increment_lineno(inner, stmt.lineno)  # line 1 of the file is the cell's line 2
            for s in inner.body:
                setattr(s, "_written_by", (stmt, module))
                out.append(s)
            continue
        out.append(stmt)
    return out


def _imported_modules(stmt) -> set[str]:
    """The top-level module names a statement imports, anywhere in it (function bodies too)."""
    out = set()
    for n in ast.walk(stmt):
        if isinstance(n, ast.Import):
            out |= {a.name.split(".")[0] for a in n.names}
        elif isinstance(n, ast.ImportFrom) and not n.level and n.module:
            out.add(n.module.split(".")[0])
    return out


def _has_star_import(stmt) -> bool:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return False
    nodes, _ = direct([stmt])
    return any(isinstance(n, ast.ImportFrom) and any(a.name == "*" for a in n.names) for n in nodes)


def slice_cells(cells: list[Cell], contract: frozenset | None = None, deadline: float | None = None) -> GradedSlice:
    """Which statements of ``cells`` are graded code and which run (see the module's docstring).

    Linear in the size of the code: each statement's effects are read once, and a worklist of
    needed names visits the statements that bind or write each name once. ``deadline``
    (``time.thread_time()``, see :func:`in_time`): past it, :class:`PlanningTimeout` is raised.
    """
    _LOCAL.direct = {}
    sl = GradedSlice(list(cells))
    trees: dict[int, ast.Module] = {}
    for k, c in enumerate(sl.cells):
        in_time(deadline)
        try:
            trees[k] = read_cell(c.source)
        except Exception as e:  # noqa: BLE001 -- SyntaxError, or IPython's own errors on odd input
            line = f" at line {e.lineno}" if getattr(e, "lineno", None) else ""
            sl.unreadable[k] = f"{type(e).__name__}: {getattr(e, 'msg', None) or e}{line}"
            if c.kind == "added" and "too deep" in sl.unreadable[k]:
                sl.notes.append(f"{c.label} did not run: {getattr(e, 'msg', None) or e}")
            continue
        for st in _statements(trees[k]):
            wb = getattr(st, "_written_by", None)
            sl.statements.append(Statement(k, st, module=wb[1] if wb else None))

    is_student = lambda s: sl.cells[s.cell].kind != "locked"  # noqa: E731
    notebook = [s for s in sl.statements if s.module is None]
    student = [s for s in notebook if is_student(s)]
    modules = module_names(notebook, is_student)
    functions, writes = {}, {}  # the student's functions: can write into arguments; module names they write
    for s in student:
        if isinstance(s.node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            functions[s.node.name] = functions.get(s.node.name, False) or _writes_into_arguments(s.node)
            writes.setdefault(s.node.name, set()).update(module_writes(s.node))

    # name -> the student's statements that bind it, or write into (or hand to a function that can
    # write into) the object it names
    trigger: dict[str, list[Statement]] = {}
    bound_anywhere = {n for s in notebook if not is_student(s) for n in binds(s.node)}
    stars = []
    for i, s in enumerate(student):
        if i % 256 == 0:
            in_time(deadline)
        bound = binds(s.node)
        into, handed = _writes(s.node, functions)
        into |= _writes_by_call(s.node, writes)
        bound_anywhere |= bound
        for name in bound | ((into | handed) - modules):
            trigger.setdefault(name, []).append(s)
        if _has_star_import(s.node):
            stars.append(s)
    files: dict[str, list[Statement]] = {}  # module -> the statements %%writefile cells write into it
    for s in sl.statements:
        if s.module is not None:
            files.setdefault(s.module, []).append(s)

    needed = set(contract if contract is not None else contract_names())
    seeds = frozenset(needed)  # the contract's names: those of other exercises are bound by nothing
    todo = deque(needed)
    written_needed: set[str] = set()
    kept: set[int] = set()  # star imports that run (see below)
    pending: list[Statement] = []  # statements of needed files whose imports are still to follow

    def need_modules(st: Statement) -> None:
        for mod in _imported_modules(st.node):
            if mod in files and mod not in written_needed:
                written_needed.add(mod)
                for f in files[mod]:  # the whole file is graded code, as a needed class's whole body
                    f.graded = True
                    pending.append(f)

    def mark(st: Statement) -> None:
        st.graded = True
        for g in free_globals([st.node]):
            if g not in needed:
                needed.add(g)
                todo.append(g)
        need_modules(st)

    n = 0
    while todo or pending:
        n += 1
        if n % 256 == 0:
            in_time(deadline)
        if pending:
            need_modules(pending.pop())
            continue
        name = todo.popleft()
        for st in trigger.get(name, ()):
            if not st.graded:
                mark(st)
        if stars and name not in bound_anywhere and name not in PREDEFINED and name not in seeds:
            # graded code reads a name nothing binds: a star import may, so each of them runs (and
            # what its statement reads is needed). It is not graded code itself: a forbidden name
            # that graded code reads costs wherever it comes from (autograder.intake.scan.costs)
            for st in stars:
                kept.add(id(st))
                for g in free_globals([st.node]):
                    if g not in needed:
                        needed.add(g)
                        todo.append(g)
            stars = []
    sl.needed = frozenset(needed)
    for s in sl.statements:
        s.runs = sl.cells[s.cell].kind in ("locked", "answer") or s.graded or id(s) in kept
    by_cell: dict[int, list[Statement]] = {}
    for s in sl.statements:
        by_cell.setdefault(s.cell, []).append(s)
    sl.runs = []
    for k in range(len(sl.cells)):
        in_time(deadline)
        sl.runs.append(_source_that_runs(sl, k, trees.get(k), by_cell.get(k, [])))
    sl.notes += _writefile_notes(sl, trees, written_needed)
    sl.written = sorted({s.module for s in sl.statements if s.module is not None and s.runs})
    return sl


def _writefile_notes(sl: GradedSlice, trees: dict, written_needed: set) -> list[str]:
    """What the row says about ``%%writefile NAME.py`` cells the student added that did not run."""
    out = []
    for k, tree in trees.items():
        if sl.cells[k].kind != "added":
            continue
        for stmt in tree.body:
            magic = cell_magic(stmt, with_line=True)
            module = written_module(magic[1]) if magic and magic[0] in WRITEFILE_MAGICS else None
            if not module:
                continue
            label = f"{sl.cells[k].label}: %%{magic[0]} {magic[1].strip()}"
            if module not in written_needed:
                out.append(f"{label} did not run: no graded code imports {module}")
            elif hasattr(stmt, "_unreadable_file"):
                out.append(f"{label} did not run: its code cannot be read as Python ({stmt._unreadable_file[1]})")
    return out


#: the line breaks of Python's tokenizer, which numbers the AST's lines: ``\r\n``, ``\r`` and ``\n``
#: only. ``str.splitlines`` also breaks at form feeds, vertical tabs, ``\x1c``-``\x1e``, ``\x85``,
#: U+2028 and U+2029, which Python reads as ordinary characters of a line (inside a comment, say):
#: cutting a cell with it shifts every later line, so the text kept for one statement would be
#: another's (the seventh red team hid ``import sys; traced = sys.gettrace`` after a U+2028 in a
#: comment, and an Emacs page break ``^L`` made an honest helper lose its body)
_PY_BREAK = re.compile(r"\r\n|\r|\n")


def python_lines(text: str) -> list[str]:
    """``text`` cut into lines where Python's tokenizer cuts it: element ``i`` is line ``i + 1``
    of the AST's numbering (a break at the very end starts no line, as with ``str.splitlines``)."""
    lines = _PY_BREAK.split(text)
    if len(lines) > 1 and lines[-1] == "":
        lines.pop()
    return lines


def _span(stmt) -> tuple[int, int]:
    outer = getattr(stmt, "_inline_of", None) or (getattr(stmt, "_written_by", None) or (None,))[0]
    if outer is not None:
        return outer.lineno, outer.end_lineno
    first = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])])
    return first, stmt.end_lineno


def _source_that_runs(sl: GradedSlice, k: int, tree, mine: list) -> str:
    cell = sl.cells[k]
    if cell.kind != "added":
        return cell.source
    if tree is None:
        return ""
    if not any(s.runs for s in mine):
        return ""
    if all(s.runs for s in mine) and not any(hasattr(s.node, "_inline_of") for s in mine):
        return cell.source
    lines = python_lines(transform(cell.source))
    out = [""] * len(lines)
    groups: list[list[Statement]] = []  # statements whose lines overlap (a; b) or share a magic
    for s in sorted(mine, key=lambda s: _span(s.node)):
        a, _ = _span(s.node)
        if groups and a <= _span(groups[-1][-1].node)[1]:
            groups[-1].append(s)
        else:
            groups.append([s])
    for g in groups:
        a, b = _span(g[0].node)[0], max(_span(s.node)[1] for s in g)
        kept = [s for s in g if s.runs]
        if not kept:
            continue
        if len(kept) == len(g) and not any(hasattr(s.node, "_inline_of") for s in g):
            out[a - 1:b] = lines[a - 1:b]
        else:  # part of a line, or the inside of a %%time cell: the kept statements, unparsed
            texts = [ast.unparse(s.node) for s in kept]
            out[a - 1] = "; ".join(texts) if not any("\n" in t for t in texts) else "\n".join(texts)
            out[a:b] = [""] * (b - a)
    return "\n".join(out) + "\n"
