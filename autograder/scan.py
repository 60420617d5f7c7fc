"""What the grader reads in a submission's graded slice (:mod:`autograder.slicing`), outside the
sandbox: the only two things a static reading decides.

* :func:`costs`: torch's built-ins that a check forbids, named in **graded code** (the statements
  the contract's names reach, with the whole bodies of needed functions and classes): ``F.layer_norm``,
  ``nn.LayerNorm``, ``torch.ops.aten.native_layer_norm``, ``from torch.nn import RMSNorm``, torch's
  internal reference implementations (``torch._refs``...); in exercise 04 torch's own transformer
  layers. A hit costs that check's points, as a probe's observation of the built-in does. Strings,
  comments, docstrings and code that nothing graded reaches never cost anything.
* :func:`review`: code that reaches around the course, anywhere in the code that runs (answer cells
  whole, and the slice of the added cells). It costs no point: each reason, with its cell and line,
  goes to a person (the ``review`` column of grades.csv, results.json, the class report, a comment in
  nbgrader's gradebook). What is flagged: imports of modules that reach other objects, files,
  processes or threads (``gc``, ``inspect``, ``importlib``, ``ctypes``, ``os``,
  ``threading``, ``subprocess``...) and of the course's grading machinery; attributes that reach
  around names (``__globals__``, ``__dict__`` of another object, ``__subclasses__``, frames, ``sys.modules``...);
  torch's internals (``torch._C``, ``torch.ops``, ``torch.library``, ``_execution_engine``,
  ``DisableTorchFunction``, dispatch and function modes); builtins that run or look up code or files
  (``exec``, ``eval``, ``compile``, ``__import__``, ``open``, ``globals``, ``vars`` of another object,
  ``getattr`` with a computed name on another object, ``setattr`` on a module); IPython that runs
  strings or changes how cells are read, and magics other than the harmless ones; graded functions
  that write into module-level state (``global``, ``cache[k] = ...``); and in exercise 05 switching
  autograd back on inside the hand-written functions (``enable_grad``, ``set_grad_enabled``,
  ``inference_mode(False)``).
"""
from __future__ import annotations

import ast

from autograder.slicing import GradedSlice, is_get_ipython, root_name

#: torch classes that compute a normalization for you
NORM_CLASSES = frozenset({"LayerNorm", "RMSNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "GroupNorm",
                          "InstanceNorm1d", "InstanceNorm2d", "InstanceNorm3d", "LocalResponseNorm",
                          "LazyBatchNorm1d", "LazyBatchNorm2d", "LazyBatchNorm3d", "LazyInstanceNorm1d",
                          "LazyInstanceNorm2d", "LazyInstanceNorm3d", "SyncBatchNorm"})
#: torch's internal reference implementations: they compute every built-in from primitives
TORCH_INTERNALS = frozenset({"_refs", "_decomp", "_prims"})

#: modules whose import in code that runs goes to review: they reach other objects, code, files,
#: processes or threads
REVIEW_MODULES = frozenset({
    "gc", "inspect", "importlib", "ctypes", "_ctypes", "cffi", "os", "posix", "pathlib", "io", "shutil",
    "tempfile", "glob", "fcntl", "mmap", "resource", "signal", "faulthandler", "atexit", "threading", "_thread",
    "multiprocessing", "concurrent", "subprocess", "pty", "socket", "asyncio", "selectors", "pickle", "dill",
    "cloudpickle", "marshal", "shelve", "builtins", "__builtin__", "types", "code", "codeop", "runpy",
    "pkgutil", "zipimport", "linecache", "dis", "traceback", "weakref", "copyreg",
    "coursekit", "course", "autograder", "book", "tools", "IPython", "ipykernel", "jupyter_client",
})
#: what the released setup cell imports from the course's runtime (not the machinery)
PUBLIC_RUNTIME = frozenset({"run", "smoke", "CheckFailed"})
#: attributes that reach around the names in the code, or into torch's internals
REVIEW_ATTRS = {
    "__globals__": "a function's module namespace", "__closure__": "a function's closure",
    "__code__": "a function's code object", "__subclasses__": "every subclass of a class",
    "__builtins__": "the builtins namespace", "__dict__": "another object's namespace",
    "__getattribute__": "an attribute lookup around the names", "__self__": "a bound method's object",
    "__wrapped__": "the function a wrapper hides", "__reduce__": "pickling internals",
    "__reduce_ex__": "pickling internals", "__mro__": "a class's whole hierarchy",
    "f_globals": "a frame's globals", "f_locals": "a frame's locals", "f_back": "the calling frame",
    "f_builtins": "a frame's builtins", "gi_frame": "a generator's frame", "cr_frame": "a coroutine's frame",
    "tb_frame": "a traceback's frame", "_getframe": "the interpreter's frames",
    "_C": "torch's C internals", "_execution_engine": "autograd's engine",
    "DisableTorchFunction": "switching torch's function modes off", "_disable_torch_function": "torch internals",
    "_python_dispatch": "torch's dispatch modes", "overrides": "torch's function modes",
    "TorchFunctionMode": "a torch function mode", "TorchDispatchMode": "a torch dispatch mode",
    "library": "torch.library (registering kernels)", "_dispatch": "torch's dispatcher",
    "saved_tensors_hooks": "autograd's saved-tensor hooks", "disable_saved_tensors_hooks": "autograd's saved-tensor hooks",
    "_modules": "another object's submodules", "multiprocessing": "processes",
    "modules": "every imported module (sys.modules)", "meta_path": "the import system",
    "path_hooks": "the import system", "settrace": "tracing other code", "setprofile": "tracing other code",
    "addaudithook": "audit hooks", "attrgetter": "a lookup by a computed name",
    "methodcaller": "a call by a computed name",
}
#: attributes of torch that only count under torch (``torch.ops``, ``torch.library``)
TORCH_ONLY_ATTRS = frozenset({"library", "overrides", "_modules", "multiprocessing"})
#: parts of a dotted path under torch that reach its internals, however the path is spelled
#: (``import torch.utils._python_dispatch as pd``, ``T._C`` for ``import torch as T``)
TORCH_INTERNAL_PARTS = frozenset({"_C", "library", "overrides", "_python_dispatch", "_ops", "ops", "_dispatch",
                                  "_refs", "_decomp", "_prims", "multiprocessing", "_execution_engine"})
#: modules reached as an attribute of another module (``torch.sys``, ``np.os``): the route around
#: an import the review would see
MODULE_ATTRS = frozenset({"sys", "os", "gc", "inspect", "importlib", "ctypes", "subprocess", "threading",
                          "multiprocessing", "builtins", "marshal", "pickle", "socket", "_thread", "posix",
                          "concurrent", "shutil", "io", "pathlib", "types", "linecache", "dis"})
#: attributes of sys that only count under sys (``sys.modules``; a model's ``.modules()`` is fine)
SYS_ONLY_ATTRS = frozenset({"modules", "meta_path", "path_hooks", "settrace", "setprofile", "addaudithook"})
#: builtins that run or look up code, files or namespaces
REVIEW_BUILTINS = {"exec": "runs a string as code", "eval": "runs a string as code",
                   "compile": "compiles a string as code", "__import__": "imports by a computed name",
                   "open": "file access", "globals": "the module namespace", "locals": "a namespace",
                   "breakpoint": "the debugger", "memoryview": "raw memory"}
#: IPython methods that run strings as code or change how cells are read
IPYTHON_RUNNERS = frozenset({"run_cell", "run_cell_async", "ex", "ev", "run_code", "run_ast_nodes",
                             "safe_execfile", "safe_execfile_ipy", "safe_run_module", "push", "define_macro",
                             "magic", "input_transformers_post", "input_transformers_cleanup",
                             "input_transformer_manager", "ast_transformers", "register_magic_function",
                             "events", "set_hook", "user_ns", "user_global_ns", "kernel"})
#: what IPython writes for magics and shell escapes, and the magics that are harmless
IPYTHON_MAGIC_CALLS = frozenset({"run_line_magic", "run_cell_magic", "system", "getoutput"})
HARMLESS_MAGICS = frozenset({"time", "timeit", "matplotlib", "capture", "precision", "pprint", "who", "whos",
                             "autoreload", "load_ext", "config", "xmode", "prun", "memit", "page", "pdef",
                             "pdoc", "psource", "pinfo", "pinfo2"})
#: exercise 05: switching autograd back on inside the hand-written backward
GRAD_SWITCHES = frozenset({"enable_grad", "set_grad_enabled", "inference_mode"})
HAND_WRITTEN = frozenset({"rmsnorm_backward", "layernorm_backward", "FusedAddRMSNorm"})


class _ConstantLookups(ast.NodeTransformer):
    """``getattr(obj, "name")`` read as ``obj.name`` (and ``getattr(obj, "name", default)`` too): a
    constant lookup is an attribute, whatever it is spelled as."""

    def visit_Call(self, node):
        self.generic_visit(node)
        fn = node.func
        if isinstance(fn, ast.Name) and fn.id == "getattr" and len(node.args) in (2, 3) and not node.keywords \
                and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str) \
                and node.args[1].value.isidentifier():
            return ast.copy_location(ast.Attribute(value=node.args[0], attr=node.args[1].value, ctx=ast.Load()), node)
        return node


def resolved(node):
    """A copy of ``node`` with constant ``getattr`` lookups read as attributes (line numbers kept)."""
    import copy
    return _ConstantLookups().visit(copy.deepcopy(node))


def module_paths(sl: GradedSlice) -> dict:
    """Every name an import binds (in any cell) -> the dotted path it stands for: ``T`` -> ``torch``
    for ``import torch as T``, ``pd`` -> ``torch.utils._python_dispatch``, ``F`` ->
    ``torch.nn.functional``."""
    out = {}
    for s in sl.statements:
        for n in ast.walk(s.node):
            if isinstance(n, ast.Import):
                for a in n.names:
                    out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
            elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
                for a in n.names:
                    if a.name != "*":
                        out[a.asname or a.name] = f"{n.module}.{a.name}"
    return out


def dotted(node, paths: dict) -> str | None:
    """``T._C._nn`` -> ``torch._C._nn`` when ``T`` is an alias of torch; None when the root is not
    a name bound by an import."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name) or node.id not in paths:
        return None
    return ".".join([paths[node.id]] + parts[::-1])


def _show(node) -> str:
    try:
        text = ast.unparse(node)
    except Exception:  # noqa: BLE001
        text = type(node).__name__
    text = " ".join(text.split())
    return text if len(text) <= 60 else text[:57] + "..."


# ------------------------------------------------------------------------------------------------
# Costs: built-ins named in graded code
# ------------------------------------------------------------------------------------------------

def forbidden_names(check) -> frozenset:
    """The names whose use in graded code costs ``check``: its forbidden ops, the norm classes when
    it forbids norm ops, and the names it forbids itself (exercise 04's transformer layers)."""
    ops = frozenset(getattr(check, "forbidden_ops", ()) or ())
    names = frozenset(getattr(check, "forbidden_names", ()) or ())
    return ops | (NORM_CLASSES if ops else frozenset()) | names


def costs(sl: GradedSlice, forbidden: frozenset) -> list[str]:
    """Where graded code names one of ``forbidden`` (attribute, imported name or plain name that the
    student does not define): ``[]`` when nowhere. Each hit says what and where."""
    if not forbidden:
        return []
    own_defs = {n for s in sl.statements if sl.cells[s.cell].kind != "locked"
                for n in _defined_names(s.node)}
    found = []
    paths = module_paths(sl)
    for st in sl.graded_code():
        own_attrs = _own_attrs(st.node)
        for n in ast.walk(resolved(st.node)):
            hit = None
            if isinstance(n, ast.Attribute):
                on_self = isinstance(n.value, ast.Name) and n.value.id in ("self", "cls") and n.attr in own_attrs
                if n.attr in forbidden and not on_self:
                    hit = _show(n)
                elif n.attr in TORCH_INTERNALS:
                    hit = f"torch's internal reference implementations ({_show(n)})"
                elif isinstance(n.value, ast.Subscript) and isinstance(n.value.slice, ast.Constant) \
                        and any(p in TORCH_INTERNALS for p in str(n.value.slice.value).split(".")):
                    hit = f"torch's internal reference implementations ({_show(n)})"
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in forbidden and n.id not in own_defs:
                hit = n.id
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in paths \
                    and (set(paths[n.id].split(".")[1:]) & (TORCH_INTERNALS | forbidden)):
                hit = f"{n.id} ({paths[n.id]})"
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                mod = getattr(n, "module", None) or ""
                for a in n.names:
                    parts = (mod.split(".") if mod else []) + a.name.split(".")
                    if a.name in forbidden or (a.name == "*" and mod.split(".")[0] == "torch") \
                            or any(p in TORCH_INTERNALS for p in parts):
                        hit = f"{'from ' + mod + ' ' if mod else ''}import {a.name}"
            if hit:
                found.append(f"{hit} ({sl.where(st, n)})")
    return sorted(set(found))


def _defined_names(stmt) -> set[str]:
    """Names the student binds other than by import (anywhere in the statement)."""
    out = set()
    for n in ast.walk(stmt):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
            out.add(n.id)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
    return out


def _own_attrs(stmt) -> set[str]:
    """Methods of the student's classes and ``self.X = ...`` targets in a statement."""
    out = set()
    for n in ast.walk(stmt):
        if isinstance(n, ast.ClassDef):
            out |= {m.name for m in n.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name) \
                and n.value.id in ("self", "cls"):
            out.add(n.attr)
    return out


# ------------------------------------------------------------------------------------------------
# Review: code that reaches around the course, for a person to look at
# ------------------------------------------------------------------------------------------------

def review(sl: GradedSlice) -> list[str]:
    """Every reason to look at this submission, with its cell and line: ``[]`` when nothing."""
    out: list[str] = []
    flag = lambda st, node, why: out.append(f"{why}: {_show(node)} ({sl.where(st, node)})")  # noqa: E731
    for k, why in sl.unreadable.items():
        if sl.cells[k].kind == "answer":
            out.append(f"a cell that could not be read as Python ({why}); it ran as written ({sl.cells[k].label})")
    modules = _import_bound(sl)
    hand_written = _hand_written(sl)
    paths = module_paths(sl)
    probe_reach = _probe_reach(sl)
    for st in sl.running_code():
        tree = resolved(st.node)
        methods_self = _self_methods(tree)
        inner: set[int] = set()  # attributes inside one already flagged (torch._C inside torch._C._nn)
        for n in ast.walk(tree):
            if id(n) in inner:
                continue
            if isinstance(n, ast.Import):
                for a in n.names:
                    if a.name.split(".")[0] in REVIEW_MODULES:
                        flag(st, n, f"imports {a.name}")
                    elif a.name.split(".")[0] == "torch" and set(a.name.split(".")[1:]) & TORCH_INTERNAL_PARTS:
                        flag(st, n, f"imports {a.name}")
            elif isinstance(n, ast.ImportFrom):
                mod = (n.module or "").split(".")
                names = {a.name for a in n.names}
                if mod[0] in REVIEW_MODULES and not (n.module == "coursekit" and names <= PUBLIC_RUNTIME):
                    flag(st, n, f"imports from {n.module}")
                elif mod[0] == "torch" and (set(mod[1:]) | names) & (TORCH_INTERNAL_PARTS | {"DisableTorchFunction"}):
                    flag(st, n, f"imports torch internals from {n.module}")
            elif isinstance(n, ast.Attribute):
                base_is_self = isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")
                if n.attr in MODULE_ATTRS and not base_is_self:
                    flag(st, n, f"the module {n.attr} reached through another object")
                    inner |= {id(m) for m in ast.walk(n.value)}
                    continue
                path = dotted(n, paths)
                if path and path.split(".")[0] == "torch" and set(path.split(".")[1:]) & TORCH_INTERNAL_PARTS:
                    flag(st, n, f"torch internals ({path})")
                    inner |= {id(m) for m in ast.walk(n.value)}
                    continue
                why = REVIEW_ATTRS.get(n.attr)
                if why is None and n.attr in IPYTHON_RUNNERS and is_get_ipython(n.value):
                    why = "IPython running code from a string or changing how cells are read"
                if why is None:
                    continue
                base = n.value
                if n.attr in ("__dict__", "_modules") and isinstance(base, ast.Name) and base.id in ("self", "cls"):
                    continue
                if n.attr == "_C" and not _under_torch(base, modules):
                    continue
                if n.attr in TORCH_ONLY_ATTRS and not _under_torch(base, modules):
                    continue
                if n.attr in SYS_ONLY_ATTRS and root_name(base) != "sys":
                    continue
                flag(st, n, why)
            elif isinstance(n, ast.Call):
                _review_call(sl, st, n, modules, methods_self, flag)
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in ("__builtins__",):
                flag(st, n, "the builtins namespace")
        _review_module_state(sl, st, modules, flag, probe_reach)
        if st in hand_written:
            for n in ast.walk(st.node):
                if isinstance(n, ast.Call) and _switches_grad_on(n):
                    flag(st, n, "autograd switched back on inside a hand-written backward")
    seen, unique = set(), []
    for r in out:
        if r not in seen:
            seen.add(r)
            unique.append(r)
    return unique


def _import_bound(sl: GradedSlice) -> set[str]:
    """Names bound by imports (in any cell, the setup included) and never otherwise by the student."""
    from autograder.slicing import module_names
    return module_names(sl.statements, lambda s: sl.cells[s.cell].kind != "locked")


def _under_torch(node, modules) -> bool:
    r = root_name(node)
    return r is not None and (r == "torch" or r in modules and r in ("nn", "F", "torch"))


def _hand_written(sl: GradedSlice) -> list:
    """Exercise 05 (a submission that defines its hand-written functions): every graded def and class."""
    if not any(isinstance(s.node, (ast.FunctionDef, ast.ClassDef)) and s.node.name in HAND_WRITTEN
               for s in sl.statements):
        return []
    return [s for s in sl.graded_code() if isinstance(s.node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]


def _switches_grad_on(call: ast.Call) -> bool:
    """``torch.enable_grad()``, ``set_grad_enabled(x)`` and ``inference_mode(x)`` unless ``x`` is the
    constant False (``inference_mode()`` and ``set_grad_enabled(False)`` switch autograd off)."""
    fn = call.func
    name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else None
    if name not in GRAD_SWITCHES:
        return False
    if name == "enable_grad":
        return True
    arg = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg in ("mode", "mode_")), None)
    if name == "inference_mode":
        return arg is not None and not (isinstance(arg, ast.Constant) and arg.value is True)
    return not (isinstance(arg, ast.Constant) and arg.value is False)


def _self_methods(stmt) -> set[int]:
    """ids of ``getattr(self, ...)``/``setattr(self, ...)`` calls inside methods that never rebind self."""
    out = set()
    for fn in ast.walk(stmt):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        first = (fn.args.posonlyargs + fn.args.args)[:1]
        if not first or first[0].arg not in ("self", "cls"):
            continue
        me = first[0].arg
        if any(isinstance(n, ast.Name) and n.id == me and isinstance(n.ctx, (ast.Store, ast.Del)) for n in ast.walk(fn)):
            continue
        out |= {id(n) for n in ast.walk(fn) if isinstance(n, ast.Call) and n.args
                and isinstance(n.args[0], ast.Name) and n.args[0].id == me}
    return out


def _review_call(sl, st, n: ast.Call, modules, on_self: set, flag) -> None:
    fn = n.func
    if isinstance(fn, ast.Name):
        if fn.id in REVIEW_BUILTINS:
            flag(st, n, f"{fn.id}() ({REVIEW_BUILTINS[fn.id]})")
        elif fn.id == "getattr" and len(n.args) >= 2 and not isinstance(n.args[1], ast.Constant) and id(n) not in on_self:
            flag(st, n, "getattr() with a computed name on another object")
        elif fn.id == "vars" and n.args and id(n) not in on_self:
            flag(st, n, "vars() of another object")
        elif fn.id in ("setattr", "delattr") and n.args and root_name(n.args[0]) in modules:
            flag(st, n, f"{fn.id}() on a module")
        return
    if isinstance(fn, ast.Attribute) and is_get_ipython(fn.value) and fn.attr in IPYTHON_MAGIC_CALLS:
        name = n.args[0].value if n.args and isinstance(n.args[0], ast.Constant) else None
        if fn.attr in ("system", "getoutput"):
            flag(st, n, "a shell command")
        elif not isinstance(name, str) or name not in HARMLESS_MAGICS:
            flag(st, n, f"the magic %{name}" if isinstance(name, str) else "a magic with a computed name")
        elif not all(isinstance(a, ast.Constant) for a in n.args):
            flag(st, n, "a magic with a computed argument")
        else:  # the Python inside %time/%timeit: flag what it reaches too
            from autograder.slicing import parse
            for a in n.args[1:]:
                try:
                    inner = parse(a.value)
                except Exception:  # noqa: BLE001
                    continue
                for m in ast.walk(inner):
                    if isinstance(m, ast.Call) and isinstance(m.func, ast.Name) and m.func.id in REVIEW_BUILTINS:
                        flag(st, n, f"{m.func.id}() inside a magic")


def _probe_reach(sl: GradedSlice) -> set[str]:
    """Names the probes can call: the contract's, and those the bodies of graded functions and
    classes read (not their decorators: a decorator runs once, when the cell runs)."""
    from autograder.slicing import contract_names, free_globals
    out = set(contract_names())
    for st in sl.graded_code():
        if isinstance(st.node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out |= free_globals(st.node.body)
    return out


def _review_module_state(sl, st, modules, flag, probe_reach=frozenset()) -> None:
    """Functions the probes can call that write into module-level state, and module-level writes
    into modules."""
    node = st.node
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        if not st.graded or node.name not in probe_reach:
            return
        for fn in ast.walk(node):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            a = fn.args
            local = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg] if x is not None}
            body = fn.body if isinstance(fn.body, list) else [fn.body]
            local |= {m.id for b in body for m in ast.walk(b) if isinstance(m, ast.Name) and isinstance(m.ctx, ast.Store)}
            for m in (x for b in body for x in ast.walk(b)):
                if isinstance(m, (ast.Global, ast.Nonlocal)):
                    flag(st, m, "a graded function that rebinds module-level names")
                elif isinstance(m, (ast.Attribute, ast.Subscript)) and isinstance(m.ctx, (ast.Store, ast.Del)):
                    r = root_name(m.value)
                    if r is not None and r not in local and r not in ("self", "cls"):
                        flag(st, m, "a graded function that writes into module-level state")
                elif isinstance(m, ast.Call) and isinstance(m.func, ast.Attribute) \
                        and m.func.attr in ("update", "setdefault", "__setitem__", "append", "extend", "insert", "add"):
                    r = root_name(m.func.value)
                    if r is not None and r not in local and r not in ("self", "cls") and r not in modules:
                        flag(st, m, "a graded function that writes into module-level state")
        return
    for m in ast.walk(node):  # module level: writes into torch, nn, F or any imported module
        if isinstance(m, (ast.Attribute, ast.Subscript)) and isinstance(m.ctx, (ast.Store, ast.Del)) \
                and root_name(m.value) in modules:
            flag(st, m, "writes into an imported module")

