"""What the grader reads in a submission's graded slice (:mod:`autograder.intake.slicing`), outside the
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
  ``inference_mode(False)``) or running it there (``torch.autograd.grad``, forward-mode AD,
  ``torch.func``).

  The review reads values, not spellings (:class:`Values`): what a name, an attribute, a container
  or a function's result is bound to decides, so ``_s = sys; _s.modules``, ``g = getattr``,
  ``e = exec``, ``T = torch; T._C``, ``reduce(getattr, ...)`` and ``_on = torch.enable_grad`` give
  the direct spelling's reason plus the alias; a reflective module or builtin kept in a container
  or a class attribute is flagged itself. ``getattr`` on torch's public namespaces by a config name
  (``getattr(nn, NAMES[kind])``) and seeding boilerplate (``os.environ["CUBLAS_WORKSPACE_CONFIG"]``,
  ``torch.backends.cudnn.deterministic``) are not flagged.
"""
from __future__ import annotations

import ast
import builtins
import functools
import re
import sys
import types

from autograder.intake.slicing import GradedSlice, in_time, is_get_ipython, root_name

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
    "pkgutil", "zipimport", "linecache", "dis", "traceback", "weakref", "copyreg", "_warnings", "bdb", "pdb",
    "trace", "_xxsubinterpreters", "_xxinterpchannels", "_interpreters", "_interpchannels", "_interpqueues",
    "interpreters", "tracemalloc", "_tracemalloc", "pydoc",  # pydoc.locate: any object by a dotted name (a red team's round 20)
    # libraries that keep data in their own C allocations, where neither exercise 05's walk nor its
    # Python-heap measure looks (the twenty-third red team kept x_hat in sqlite and in an ssl.MemoryBIO)
    "sqlite3", "_sqlite3", "ssl", "_ssl", "dbm", "_dbm", "_gdbm", "readline",
    # and those whose objects, made before forward, take the caller's bytes into memory they allocated
    # then (a compressor's block, a parser's buffer, an image's pixels): exercise 05's C allocator
    # totals see memory a library allocates while forward runs, not memory it filled in place
    "zlib", "bz2", "_bz2", "lzma", "_lzma", "gzip", "zipfile", "tarfile", "pyexpat", "PIL",
    "coursekit", "course", "autograder", "book", "tools", "IPython", "ipykernel", "jupyter_client",
})
#: modules of the review list that only show things (a figure, Markdown): importing them is fine
HARMLESS_MODULES = frozenset({"IPython.display"})
#: names of modules on the review list that hold plain data, not a way around the names:
#: ``from types import SimpleNamespace`` for a config object (the twenty-second red team's fairness case)
HARMLESS_NAMES = {"types": frozenset({"SimpleNamespace"})}
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
    "f_trace": "switching a frame's tracing", "f_trace_lines": "switching a frame's tracing",
    "f_trace_opcodes": "switching a frame's tracing",
    "_C": "torch's C internals", "_execution_engine": "autograd's engine",
    "_enable_record_function": "switching torch's op records off", "_clear_callbacks": "switching torch's op records off",
    "DisableTorchFunction": "switching torch's function modes off", "_disable_torch_function": "torch internals",
    "_python_dispatch": "torch's dispatch modes", "overrides": "torch's function modes",
    "TorchFunctionMode": "a torch function mode", "TorchDispatchMode": "a torch dispatch mode",
    "library": "torch.library (registering kernels)", "_dispatch": "torch's dispatcher",
    "saved_tensors_hooks": "autograd's saved-tensor hooks", "disable_saved_tensors_hooks": "autograd's saved-tensor hooks",
    "_modules": "another object's submodules", "multiprocessing": "processes",
    "modules": "every imported module (sys.modules)", "meta_path": "the import system",
    "path_hooks": "the import system", "settrace": "tracing other code", "setprofile": "tracing other code",
    "gettrace": "whether the code is being traced (the benchmark counts with a tracer)",
    "getprofile": "whether the code is being profiled", "addaudithook": "audit hooks", "attrgetter": "a lookup by a computed name",
    "findCaller": "who called the code (a log record's caller)", "currentframe": "the interpreter's frames",
    "methodcaller": "a call by a computed name",
    # an exception's traceback lists the frames it passed through, and under the benchmark's op counter
    # an error raised in a torch kernel passes through the counter's frames (the sixth red team's
    # route: a loop everywhere but where its own probe error's traceback is deeper)
    "__traceback__": "an exception's traceback (the frames it passed through)",
    "tb_next": "a traceback's frames", "tb_lineno": "a traceback's frames", "tb_lasti": "a traceback's frames",
    "exc_info": "the current exception's traceback", "exception": "the current exception (and its traceback)",
    "formatException": "an exception's traceback as text", "formatStack": "the call stack as text",
    "_current_frames": "the interpreter's frames",
}
#: library functions and classes that turn strings into objects or run them as code, by their
#: dotted path (a path under one counts too): what they reach is named by a string the review does
#: not read as code
REVIEW_PATHS = {
    "logging.config": "objects and modules looked up by dotted names in a string (logging.config)",
    "string.Formatter": "attributes and items looked up by the names in a format string (string.Formatter)",
    "unittest.mock": "objects replaced by their dotted names (unittest.mock)",
    "typing.ForwardRef": "a string evaluated as code (typing.ForwardRef)",
    "typing._eval_type": "a string evaluated as code (typing._eval_type)",
    "typing.evaluate_forward_ref": "a string evaluated as code (typing.evaluate_forward_ref)",
    "doctest": "docstrings run as code (doctest)",
    "cProfile": "a string run as code (cProfile)", "profile": "a string run as code (profile)",
    "site": "path configuration files run as code (site)",
    "timeit.main": "a string run as code (timeit)",
    "typing.get_type_hints": "string annotations evaluated as code, in namespaces it may be given (typing.get_type_hints)",
}
#: callables that run their ``stmt`` and ``setup`` arguments as code when they are strings
STRING_RUNNERS = {"timeit.timeit": ("stmt", "setup"), "timeit.repeat": ("stmt", "setup"),
                  "timeit.Timer": ("stmt", "setup")}


def _imported_reason(module: str, name: str) -> str | None:
    """Why ``from module import name`` reaches around, by the value imported: a module of the
    review list under another name (``from collections import _sys``), or a path of
    :data:`REVIEW_PATHS`."""
    v = _by_value(module, name)
    if v in REFLECTIVE_MODULES:
        return f"imports the module {v} from {module} (as {name})"
    why = review_path(f"{module}.{name}") or _sys_function_reason(module, name)
    return f"imports {name} from {module}: {why}" if why else None


def _sys_function_reason(module: str, name: str) -> str | None:
    """The review's reason for a function of ``sys`` imported from ``module`` under ``name`` (``from
    sys import getallocatedblocks``, or from a module that holds it under another name)."""
    mod = sys.modules.get(module)
    v = vars(mod).get(name) if isinstance(mod, types.ModuleType) else None
    if isinstance(v, types.BuiltinFunctionType) and getattr(v, "__self__", None) is sys:
        return path_reason(f"sys.{v.__name__}")
    return None


def review_path(p: str) -> str | None:
    """The reason :data:`REVIEW_PATHS` gives for a dotted path (or one under it), or None."""
    parts = p.split(".")
    for i in range(len(parts), 0, -1):
        why = REVIEW_PATHS.get(".".join(parts[:i]))
        if why:
            return why
    return None


#: attributes of torch that only count under torch (``torch.ops``, ``torch.library``)
TORCH_ONLY_ATTRS = frozenset({"library", "overrides", "_modules", "multiprocessing"})
#: parts of a dotted path under torch that reach its internals, however the path is spelled
#: (``import torch.utils._python_dispatch as pd``, ``T._C`` for ``import torch as T``)
TORCH_INTERNAL_PARTS = frozenset({"_C", "library", "overrides", "_python_dispatch", "_ops", "ops", "_dispatch",
                                  "_refs", "_decomp", "_prims", "multiprocessing", "_execution_engine",
                                  # graph capture (torch's own code traced ahead and replayed as plain
                                  # ops) and work on torch's own threads, where no observer watches
                                  "fx", "export", "fork", "_fork"})


#: what a function that tells whether a torch dispatch or function mode is active is called (a part of its
#: name: ``_len_torch_dispatch_stack``, ``_get_current_dispatch_mode``, ``is_in_torch_dispatch_mode``,
#: ``_is_torch_function_mode_enabled``, ``_get_current_function_mode_stack``, ``_dispatch_tls_local_include_set``...).
#: The served benchmark counts one full-size call's ops under a dispatch mode (coursekit.checks.scaling.Meter):
#: code that asks is flagged by value, as ``sys.gettrace`` is
MODE_ASK_PARTS = ("dispatch_stack", "dispatch_mode", "function_mode", "function_stack", "dispatch_tls",
                  "torch_function_enabled", "torch_function_all_disabled", "dispatch_key_included")
MODE_ASK = "whether a torch dispatch or function mode is active (the benchmark counts ops with one)"


def mode_ask(name: str) -> bool:
    """Whether ``name`` (the last part of a path under torch) asks about torch's mode stacks."""
    return any(p in name.lower() for p in MODE_ASK_PARTS)


def torch_reason(path: str) -> str:
    """The review's reason for a path under torch that reaches its internals."""
    return MODE_ASK if mode_ask(path.split(".")[-1]) else f"torch internals ({path})"


def torch_internal(parts) -> bool:
    """Whether a dotted path's parts under ``torch`` reach its internals: a part in
    :data:`TORCH_INTERNAL_PARTS`, or any private part (``_mode_utils``, ``_inductor``,
    ``_disable_profiler``...; dunder names such as ``__version__`` aside). torch's private API is
    where its guards and records are switched off, so the review reads all of it, whatever the name."""
    return any(p in TORCH_INTERNAL_PARTS or (p.startswith("_") and not (p.startswith("__") and p.endswith("__")))
               for p in parts)


#: modules reached as an attribute of another module (``torch.sys``, ``np.os``): the route around
#: an import the review would see
MODULE_ATTRS = frozenset({"sys", "os", "gc", "inspect", "importlib", "ctypes", "subprocess", "threading",
                          "multiprocessing", "builtins", "marshal", "pickle", "socket", "_thread", "posix",
                          "concurrent", "shutil", "io", "pathlib", "types", "linecache", "dis"})
#: the attributes of sys that are plain data, streams or settings a notebook uses honestly; every other
#: one reads or changes the interpreter's own state (``sys.getallocatedblocks``: the benchmark's counter
#: allocates while it traces, the twenty-fourth red team's detector; ``getrefcount``, ``_debugmallocstats``,
#: ``setswitchinterval``...) and is flagged, whatever it is called
SYS_PLAIN = frozenset({
    "version", "version_info", "hexversion", "api_version", "implementation", "platform", "platlibdir", "byteorder",
    "maxsize", "maxunicode", "float_info", "int_info", "hash_info", "thread_info", "float_repr_style", "copyright",
    "flags", "stdout", "stderr", "stdin", "__stdout__", "__stderr__", "__stdin__", "argv", "orig_argv", "executable",
    "prefix", "base_prefix", "exec_prefix", "base_exec_prefix", "path", "exit", "getdefaultencoding",
    "getfilesystemencoding", "getfilesystemencodeerrors", "getrecursionlimit", "setrecursionlimit", "exc_info",
    "exception", "last_value", "last_type", "last_traceback", "getsizeof", "intern", "builtin_module_names",
    "stdlib_module_names", "warnoptions", "dont_write_bytecode", "pycache_prefix", "ps1", "ps2", "is_finalizing",
    "get_int_max_str_digits", "set_int_max_str_digits", "getdlopenflags", "abiflags"})
SYS_STATE = "the interpreter's own state (the benchmark counts with a tracer, which shows there)"
#: attributes of sys that only count under sys (``sys.modules``; a model's ``.modules()`` is fine)
SYS_ONLY_ATTRS = frozenset({"modules", "meta_path", "path_hooks", "settrace", "setprofile", "gettrace", "getprofile",
                            "addaudithook"})
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
#: the names IPython's shell binds to earlier outputs and inputs (``_``, ``__``, ``_7``, ``Out``, ``_i3``...):
#: a value that reaches graded code through them is bound by no code (the twenty-second red team showed
#: ``sys`` as a cell's last line and read ``_.gettrace`` in a later cell). The grader's shell keeps no
#: output cache (autograder/inside/harness.py), and graded code reading one is flagged.
SHELL_CACHE = re.compile(r"^(_{1,3}|_\d+|_i{1,3}|_i\d+|Out|In|_oh|_ih|_dh)$")
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


class _StringAnnotations(ast.NodeTransformer):
    """A string annotation read as the expression it holds: ``typing.get_type_hints``,
    ``functools.singledispatch``'s ``register`` and ``inspect.get_annotations(eval_str=True)`` run it
    as code (``def f(a: "__import__('sys').modules")``), so the review reads it as code. A string
    that is not an expression stays a string (evaluating it would raise)."""

    def _code(self, ann, depth: int = 0):
        """``ann`` with every string in it read as code, strings within those too (to a depth)."""
        if ann is None or depth > 8:
            return ann
        if isinstance(ann, ast.Constant):
            if not isinstance(ann.value, str):
                return ann
            code = _parsed(ann)
            return ann if code is ann else self._code(code, depth + 1)
        for field, value in ast.iter_fields(ann):
            if isinstance(value, ast.AST):
                setattr(ann, field, self._code(value, depth))
            elif isinstance(value, list):
                setattr(ann, field, [self._code(v, depth) if isinstance(v, ast.AST) else v for v in value])
        return ann

    def visit_arg(self, node):
        node.annotation = self._code(node.annotation)
        return node

    def visit_FunctionDef(self, node):
        self.generic_visit(node)
        node.returns = self._code(node.returns)
        return node

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_AnnAssign(self, node):
        self.generic_visit(node)
        node.annotation = self._code(node.annotation)
        return node


def _parsed(const: ast.Constant):
    """The expression a string constant holds, at the constant's place, or the constant."""
    try:
        expr = ast.parse(const.value.strip(), mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return const
    for n in ast.walk(expr):
        if "lineno" in n._attributes:  # not Load/Store: one object shared by every tree
            ast.copy_location(n, const)
            n.end_lineno, n.end_col_offset = const.end_lineno, const.end_col_offset
    return expr


def _string_annotation(node) -> bool:
    anns = [x.annotation for x in ([node] if isinstance(node, ast.arg) else [])]
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        anns.append(node.returns)
    elif isinstance(node, ast.AnnAssign):
        anns.append(node.annotation)
    return any(isinstance(m, ast.Constant) and isinstance(m.value, str) for a in anns if a is not None
               for m in ast.walk(a))


def resolved(node):
    """A copy of ``node`` with constant ``getattr`` lookups read as attributes and string annotations
    read as the code they hold (line numbers kept); ``node`` itself when it has neither (nothing to
    rewrite, and its callers only read it: a deep copy of a 100,000-number table was a third of its
    planning)."""
    import copy
    lookups = annotations = False
    for n in ast.walk(node):
        lookups = lookups or isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "getattr"
        annotations = annotations or _string_annotation(n)
    if not (lookups or annotations):
        return node
    node = copy.deepcopy(node)
    if annotations:
        node = _StringAnnotations().visit(node)
    return _ConstantLookups().visit(node) if lookups else node


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


def _values_of(sl: GradedSlice, deadline: float | None = None):
    """(the running statements' trees as the review reads them, :class:`Values` of them), made once
    per slice: the review makes them in the planning thread, under its budget, and the costs of
    every test (the referee's judge) read the same ones instead of rebuilding them (a notebook whose
    values take long to read would take that long once per test, with no budget: the twenty-first
    red team)."""
    cached = getattr(sl, "_values_cache", None)
    if cached is not None:
        return cached
    running = sl.running_code()
    trees = {id(st): resolved(st.node) for st in running}
    values = Values([trees[id(st)] for st in running],
                    [s.node for s in sl.statements if s.runs and sl.cells[s.cell].kind == "locked"],
                    deadline=deadline)
    sl._values_cache = (trees, values)
    return trees, values


def costs(sl: GradedSlice, forbidden: frozenset) -> list[str]:
    """Where graded code names one of ``forbidden`` (attribute, imported name or plain name that the
    student does not define): ``[]`` when nowhere. Each hit says what and where."""
    if not forbidden:
        return []
    own_defs = {n for s in sl.statements if sl.cells[s.cell].kind != "locked"
                for n in _defined_names(s.node)}
    own_modules = {s.module for s in sl.statements if s.module}  # the notebook's %%writefile modules
    found = []
    paths = module_paths(sl)
    graded = sl.graded_code()
    # names looked up by value: getattr(F, TABLE["k"]) costs as F.layer_norm does when "layer_norm"
    # is among the values the lookup's name may hold (the review's reading of the code, by value)
    trees, values = _values_of(sl)
    for st in graded:
        own_attrs = _own_attrs(st.node)
        for n in ast.walk(trees.get(id(st)) or resolved(st.node)):  # the trees the values were read from
            hit = None
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "getattr" \
                    and len(n.args) >= 2:
                named = sorted(values.strings(n.args[1]) & forbidden)
                if named:
                    hit = f"getattr(..., {ast.unparse(n.args[1])[:40]}) naming {', '.join(named)}"
            if hit:
                pass
            elif isinstance(n, ast.Attribute):
                on_self = isinstance(n.value, ast.Name) and n.value.id in ("self", "cls") and n.attr in own_attrs
                if n.attr in forbidden and not on_self and not _only_own(values.ev(n.value), own_modules):
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


def _only_own(vals, own_modules) -> bool:
    """Whether every value an expression may hold is the student's own: a class or function the
    graded code defines (``Norms.rms_norm`` of ``class Norms``), or one of the notebook's
    ``%%writefile`` modules (``helper.rms_norm``), whose files are graded code scanned like a cell,
    so what they bind under the name costs there (the thirteenth red team: an honest helper named
    ``rms_norm`` lost 14 of 18 points)."""
    return bool(vals) and all(v.startswith("<def>") or v.split(".")[0] in own_modules for v in vals)


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

def review(sl: GradedSlice, deadline: float | None = None) -> list[str]:
    """Every reason to look at this submission, with its cell and line: ``[]`` when nothing.
    ``deadline`` (``time.thread_time()``, see ``slicing.in_time``): past it, :class:`~autograder.intake.slicing.PlanningTimeout`
    is raised (checked at every statement and every nested function, so a notebook of many nested
    definitions cannot keep the review running after its budget)."""
    out: list[str] = []
    flagged: set[int] = set()

    def flag(st, node, why):
        flagged.add(id(node))
        out.append(f"{why}: {_show(node)} ({sl.where(st, node)})")

    for k, why in sl.unreadable.items():
        if sl.cells[k].kind == "answer":
            out.append(f"a cell that could not be read as Python ({why}); it ran as written ({sl.cells[k].label})")
    modules = _import_bound(sl)
    hand_written = _hand_written(sl)
    paths = module_paths(sl)
    probe_reach = _probe_reach(sl)
    running = sl.running_code()
    trees, values = _values_of(sl, deadline)
    if not values.converged:
        out.append(f"names bound through more aliases in a row than the review follows ({_PASSES}); "
                   "what they hold was not read")
    for st in running:
        in_time(deadline)
        tree = trees[id(st)]
        methods_self = _self_methods(tree, deadline)
        inner: set[int] = set()  # attributes inside one already flagged (torch._C inside torch._C._nn)
        docstrings = {id(m.value) for m in ast.walk(tree) if isinstance(m, ast.Expr)
                      and isinstance(m.value, ast.Constant)}  # a bare string statement is passed nowhere
        for n in ast.walk(tree):
            if id(n) in inner:
                continue
            if isinstance(n, ast.Import):
                for a in n.names:
                    if a.name == "os" and (a.asname or "os") in values.seeding_only:
                        continue  # os.environ["CUBLAS_WORKSPACE_CONFIG"] = ... and nothing else
                    if a.name.split(".")[0] in REVIEW_MODULES and a.name not in HARMLESS_MODULES:
                        flag(st, n, f"imports {a.name}")
                    elif a.name.split(".")[0] == "torch" and torch_internal(a.name.split(".")[1:]):
                        flag(st, n, f"imports {a.name}")
                    elif review_path(a.name):
                        flag(st, n, f"imports {a.name}: {review_path(a.name)}")
            elif isinstance(n, ast.ImportFrom):
                mod = (n.module or "").split(".")
                names = {a.name for a in n.names}
                if n.module == "os" and names == {"environ"} \
                        and all((a.asname or a.name) in values.seeding_only for a in n.names):
                    continue
                if mod[0] in REVIEW_MODULES and n.module not in HARMLESS_MODULES \
                        and not (n.module == "coursekit" and names <= PUBLIC_RUNTIME) \
                        and not names <= HARMLESS_NAMES.get(n.module, frozenset()):
                    flag(st, n, f"imports from {n.module}")
                elif mod[0] == "torch" and any(mode_ask(a) for a in names):
                    flag(st, n, f"{MODE_ASK}, imported from {n.module}")
                elif mod[0] == "torch" and (torch_internal(mod[1:] + sorted(names)) or "DisableTorchFunction" in names):
                    flag(st, n, f"imports torch internals from {n.module}")
                elif n.module and not n.level and (why := next((
                        w for a in sorted(names) if a != "*" for w in [_imported_reason(n.module, a)] if w), None)):
                    flag(st, n, why)
            elif isinstance(n, ast.Attribute):
                base_is_self = isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")
                if n.attr in MODULE_ATTRS and not base_is_self:
                    flag(st, n, f"the module {n.attr} reached through another object")
                    inner |= {id(m) for m in ast.walk(n.value)}
                    continue
                path = dotted(n, paths)
                if path and path.split(".")[0] == "torch" and torch_internal(path.split(".")[1:]):
                    flag(st, n, torch_reason(path))
                    inner |= {id(m) for m in ast.walk(n.value)}
                    continue
                why = REVIEW_ATTRS.get(n.attr)
                if why is None and n.attr in IPYTHON_RUNNERS and is_get_ipython(n.value):
                    why = "IPython running code from a string or changing how cells are read"
                elif why is None and is_get_ipython(n.value) and n.attr not in IPYTHON_MAGIC_CALLS:
                    # the shell holds the magics (find_line_magic('time')("code") runs a string: the
                    # twenty-third red team), the namespaces and the kernel: only the two calls IPython
                    # writes for %magic and %%magic are read (by the magic's name, below)
                    why = f"the IPython shell's {n.attr} (it reaches the notebook's machinery)"
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
                _review_call(sl, st, n, modules, methods_self, flag, values)
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in ("__builtins__",):
                flag(st, n, "the builtins namespace")
            elif isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings \
                    and (why := code_in_string(n.value)):
                flag(st, n, f"a string holding code that reaches around the course ({why}): whatever "
                            "evaluates it (a library, a magic) runs that code")
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and SHELL_CACHE.match(n.id) \
                    and n.id not in values.bound:
                flag(st, n, "IPython's output cache or input history, which the grader's shell does not keep "
                            "(a value no code of the notebook binds)")
        _review_module_state(sl, st, modules, flag, probe_reach, values, deadline)
        if st in hand_written:
            for n in ast.walk(tree):
                if isinstance(n, ast.Call) and _switches_grad_on(n):
                    flag(st, n, "autograd switched back on inside a hand-written backward")
        _review_values(values, st, tree, flagged | inner, flag, st in hand_written, modules, methods_self)
    seen, unique = set(), []
    for r in out:
        if r not in seen:
            seen.add(r)
            unique.append(r)
    return unique


def _import_bound(sl: GradedSlice) -> set[str]:
    """Names bound by imports (in any cell, the setup included) and never otherwise by the student."""
    from autograder.intake.slicing import module_names
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


def _switches_grad_on(call: ast.Call, name: str | None = None) -> bool:
    """``torch.enable_grad()``, ``set_grad_enabled(x)`` and ``inference_mode(x)`` unless ``x`` is the
    constant False (``inference_mode()`` and ``set_grad_enabled(False)`` switch autograd off).
    ``name``: the switch the call's function is bound to, however it is spelled."""
    fn = call.func
    if name is None:
        name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else None
    if name not in GRAD_SWITCHES:
        return False
    if name == "enable_grad":
        return True
    arg = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg in ("mode", "mode_")), None)
    if name == "inference_mode":
        return arg is not None and not (isinstance(arg, ast.Constant) and arg.value is True)
    return not (isinstance(arg, ast.Constant) and arg.value is False)


def _self_methods(stmt, deadline: float | None = None) -> set[int]:
    """ids of ``getattr(self, ...)``/``setattr(self, ...)`` calls inside methods that never rebind self."""
    out = set()
    for fn in ast.walk(stmt):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        in_time(deadline)
        first = (fn.args.posonlyargs + fn.args.args)[:1]
        if not first or first[0].arg not in ("self", "cls"):
            continue
        me = first[0].arg
        if any(isinstance(n, ast.Name) and n.id == me and isinstance(n.ctx, (ast.Store, ast.Del)) for n in ast.walk(fn)):
            continue
        out |= {id(n) for n in ast.walk(fn) if isinstance(n, ast.Call) and n.args
                and isinstance(n.args[0], ast.Name) and n.args[0].id == me}
    return out


#: what a call that walks the stack past its own line is said to do: a warning or a log record
#: names the file and line of the code ``stacklevel`` frames up, read in C (no frame object, no audit
#: event), and the probes are told apart by their files and lines (the fifth red team's route: a
#: loop everywhere but where the benchmark counts, copies kept everywhere but where memory is measured)
CALLER_WALK = "asks where it was called from (stacklevel: a warning or log record names the calling code's file and line)"
#: the same for a log record that carries the call stack or the current exception's traceback as text
STACK_AS_TEXT = "asks for the call stack or a traceback as text (stack_info or exc_info: a log record lists the frames)"
#: the functions whose third positional argument is the stack level
STACKLEVEL_POSITIONAL = frozenset({"warnings.warn", "_warnings.warn"})


def _walks_the_stack(n: ast.Call, callee: str | None = None) -> bool:
    """A call with a ``stacklevel`` other than the constant 1 (its own line): a keyword, a ``**``
    mapping, or for ``warnings.warn`` (``callee``, by value) a third positional argument."""
    for k in n.keywords:
        if k.arg is None and callee in STACKLEVEL_POSITIONAL:
            return True
        if k.arg == "stacklevel" and not (isinstance(k.value, ast.Constant) and k.value.value == 1):
            return True
    if callee in STACKLEVEL_POSITIONAL and len(n.args) >= 3:
        a = n.args[2]
        return not (isinstance(a, ast.Constant) and a.value == 1)
    return False


def _stack_as_text(n: ast.Call) -> bool:
    """A call with ``stack_info`` or ``exc_info`` other than a constant False or None (logging's
    keywords)."""
    return any(k.arg in ("stack_info", "exc_info")
               and not (isinstance(k.value, ast.Constant) and k.value.value in (False, None)) for k in n.keywords)


def _review_call(sl, st, n: ast.Call, modules, on_self: set, flag, values=None) -> None:
    fn = n.func
    if _walks_the_stack(n):
        flag(st, n, CALLER_WALK)
    if _stack_as_text(n):
        flag(st, n, STACK_AS_TEXT)
    if isinstance(fn, ast.Name):
        if fn.id in REVIEW_BUILTINS:
            flag(st, n, f"{fn.id}() ({REVIEW_BUILTINS[fn.id]})")
        elif fn.id == "getattr" and len(n.args) >= 2 and not isinstance(n.args[1], ast.Constant) and id(n) not in on_self \
                and not (values is not None and values.public_lookup(n)):
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
        elif name == "config" and _config_runs_code(n.args[1].value if len(n.args) > 1 else ""):
            flag(st, n, "the magic %config with code on its right side (it runs it)")
        elif name == "load_ext" and (why := _load_ext_reason(n.args[1].value if len(n.args) > 1 else "")):
            flag(st, n, why)
        else:  # the Python inside %time/%timeit: flag what it reaches too
            from autograder.intake.slicing import line_magic_code, parse
            for a in n.args[1:]:
                try:
                    inner = parse(line_magic_code(name, a.value) or a.value)  # its code, as IPython splits it
                except Exception:  # noqa: BLE001
                    continue
                for m in ast.walk(inner):
                    if isinstance(m, ast.Call) and isinstance(m.func, ast.Name) and m.func.id in REVIEW_BUILTINS:
                        flag(st, n, f"{m.func.id}() inside a magic")


def code_in_string(text: str) -> str | None:
    """Why a string's text, read as Python, would reach around the course (the reason its code would
    get), or None: a string is code to whatever evaluates it (``sympy.parse_expr``, a magic found on
    the shell, an evaluator no list names), so what the review flags in code it flags in a string
    that holds it. Only a string that parses as Python and holds a call, an attribute or an import
    is read."""
    if not 4 <= len(text) <= 20_000 or not any(c in text for c in "(.") and "import" not in text:
        return None
    try:
        from autograder.intake.slicing import parse_python, too_deep
        tree = parse_python(text.strip())
        if too_deep(tree):
            return None
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    for m in ast.walk(tree):
        if isinstance(m, ast.Call) and isinstance(m.func, ast.Name) and m.func.id in REVIEW_BUILTINS:
            return f"{m.func.id}() ({REVIEW_BUILTINS[m.func.id]})"
        if isinstance(m, ast.Import):
            for a in m.names:
                root = a.name.split(".")
                if root[0] in REVIEW_MODULES or root[0] == "torch" and torch_internal(root[1:]) or review_path(a.name):
                    return f"imports {a.name}"
        if isinstance(m, ast.ImportFrom) and m.module:
            mod = m.module.split(".")
            if mod[0] in REVIEW_MODULES or mod[0] == "torch" and torch_internal(mod[1:]) or review_path(m.module):
                return f"imports from {m.module}"
        if isinstance(m, ast.Attribute):
            root = root_name(m.value)
            if m.attr in MODULE_ATTRS:
                return f"the module {m.attr} reached through another object"
            why = REVIEW_ATTRS.get(m.attr)
            if why and not (m.attr in SYS_ONLY_ATTRS and root != "sys") \
                    and not ((m.attr in TORCH_ONLY_ATTRS or m.attr == "_C") and root not in ("torch", None)):
                return why
        if isinstance(m, ast.Name) and m.id == "__builtins__":
            return "the builtins namespace"
    return None


def _config_runs_code(line: str) -> bool:
    """Whether ``%config LINE`` runs more than setting a constant (it runs ``cfg.LINE`` as code)."""
    left, eq, right = line.partition("=")
    if not eq:
        return not (left.strip() == "" or left.strip().replace(".", "").replace("_", "").isalnum())
    if not left.strip().replace(".", "").replace("_", "").isalnum():
        return True
    try:
        ast.literal_eval(right.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return True
    return False


def _load_ext_reason(line: str) -> str | None:
    """Why ``%load_ext MODULE`` reaches around: it imports the module, as ``import MODULE`` would."""
    mod = line.strip()
    parts = mod.split(".")
    if not mod or not all(p.isidentifier() for p in parts):
        return "the magic %load_ext with a module name it cannot read"
    if parts[0] in REVIEW_MODULES or parts[0] == "torch" and torch_internal(parts[1:]) or review_path(mod):
        return f"imports {mod} (%load_ext)"
    return None


def _probe_reach(sl: GradedSlice) -> set[str]:
    """Names the probes can call: the contract's, and those the bodies of graded functions and
    classes read (not their decorators: a decorator runs once, when the cell runs)."""
    from autograder.intake.slicing import contract_names, free_globals
    out = set(contract_names())
    for st in sl.graded_code():
        if isinstance(st.node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out |= free_globals(st.node.body)
    return out


_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _scope_nodes(scope):
    """The nodes of a function's, lambda's or class's own body: not the bodies of the functions,
    lambdas and classes in it (each its own scope), but their names, decorators, defaults and
    bases, which run in it."""
    todo = list(scope.body) if isinstance(scope.body, list) else [scope.body]
    while todo:
        n = todo.pop()
        yield n
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            todo += n.args.defaults + [d for d in n.args.kw_defaults if d is not None] + getattr(n, "decorator_list", [])
        elif isinstance(n, ast.ClassDef):
            todo += n.bases + [k.value for k in n.keywords] + n.decorator_list
        else:
            todo += ast.iter_child_nodes(n)


def _scope_binds(scope) -> set[str]:
    """Names a function, lambda or class binds in its own scope: its arguments, assignment, for,
    with, except-as, match and comprehension targets, and the functions and classes it defines;
    not names it declares ``global``, nor imports (a module is module-level state however bound)."""
    out, declared_global = set(), set()
    if not isinstance(scope, ast.ClassDef):
        a = scope.args
        out |= {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg] if x is not None}
    for n in _scope_nodes(scope):
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            out.add(n.id)
        elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(n.name)
        elif isinstance(n, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and n.name:
            out.add(n.name)
        elif isinstance(n, ast.MatchMapping) and n.rest:
            out.add(n.rest)
        elif isinstance(n, ast.Global):
            declared_global |= set(n.names)
    return out - declared_global


def _scopes(node, outer: frozenset = frozenset(), in_function: bool = False):
    """(scope, the names local to it) for each function and lambda in a top-level ``def`` or
    ``class``, and each class inside a function: a name is local if the scope or an enclosing
    function binds it (closures write into their enclosing function's locals, not module state;
    a class's own names are not visible in its methods)."""
    local = outer | _scope_binds(node)
    is_class = isinstance(node, ast.ClassDef)
    if in_function or not is_class:
        yield node, local
    for n in _scope_nodes(node):
        if isinstance(n, _SCOPES):
            yield from _scopes(n, outer if is_class else local, in_function or not is_class)


def _review_module_state(sl, st, modules, flag, probe_reach=frozenset(), values=None, deadline=None) -> None:
    """Functions the probes can call that write into module-level state, and module-level writes
    into modules."""
    node = st.node
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        if not st.graded or node.name not in probe_reach:
            return
        for scope, local in _scopes(node):
            in_time(deadline)
            for m in _scope_nodes(scope):
                if isinstance(m, ast.Global):  # ``nonlocal x`` is an enclosing function's local
                    flag(st, m, "a graded function that rebinds module-level names")
                elif isinstance(m, (ast.Attribute, ast.Subscript)) and isinstance(m.ctx, (ast.Store, ast.Del)):
                    if values is not None and values.seeding_write(m):
                        continue
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
                and root_name(m.value) in modules and not (values is not None and values.seeding_write(m)):
            flag(st, m, "writes into an imported module")



# ------------------------------------------------------------------------------------------------
# Values: what a name is bound to decides, not how it is spelled
# ------------------------------------------------------------------------------------------------

#: builtins that reach around the names when called (through any name, they give the direct reason)
REFLECTIVE_BUILTINS = frozenset(REVIEW_BUILTINS) | {"getattr", "setattr", "delattr", "vars"}
#: modules that reach other objects: kept in a container or a class attribute, they are flagged
REFLECTIVE_MODULES = REVIEW_MODULES | MODULE_ATTRS | {"sys"}
#: exercise 05: autograd run inside the hand-written functions by a route other than a switch
AUTOGRAD_ROUTES = ("torch.autograd.grad", "torch.autograd.backward", "torch.autograd.forward_ad",
                   "torch.autograd.functional", "torch.func", "torch._functorch", "functorch")
#: ... of which these only vectorize (``torch.vmap`` is ``torch.func.vmap``): no autograd in them
NOT_AUTOGRAD = frozenset({"torch.func.vmap", "torch.func.functional_call", "functorch.vmap"})
#: torch's public namespaces, where ``getattr(nn, name)`` picks a class or function by a config string
PUBLIC_TORCH = frozenset({"torch", "torch.nn", "torch.nn.functional"})
#: environment variables a notebook sets for determinism (``os.environ[...] = ...``)
DETERMINISM_VARS = frozenset({"CUBLAS_WORKSPACE_CONFIG", "PYTHONHASHSEED", "CUDA_LAUNCH_BLOCKING"})
#: torch's determinism switches a notebook may set
DETERMINISM_SETTINGS = frozenset({"torch.backends.cudnn.deterministic", "torch.backends.cudnn.benchmark",
                                  "torch.backends.cudnn.allow_tf32", "torch.backends.cudnn.enabled",
                                  "torch.backends.cuda.matmul.allow_tf32"})
#: methods that put what they are given into a container
STORING_METHODS = frozenset({"append", "extend", "insert", "add", "update", "setdefault", "__setitem__"})
#: methods of a container that give back what it holds
READING_METHODS = frozenset({"get", "pop", "values", "items", "copy", "popitem", "setdefault", "__getitem__"})
#: methods that build a string from pieces: a name built so is not a config name
STRING_BUILDERS = frozenset({"join", "format", "format_map", "replace", "decode", "encode", "lower", "upper",
                             "capitalize", "title", "swapcase", "strip", "lstrip", "rstrip", "translate",
                             "removeprefix", "removesuffix", "__add__", "__mod__", "zfill", "center", "ljust",
                             "rjust", "casefold", "expandtabs"})
_ASSEMBLED = "<assembled>"  # the value of a string assembled at run time
_MAX_PARTS, _MAX_VALUES, _PASSES, _MAX_DEPTH = 8, 24, 40, 150
_BUILTIN_NAMES = frozenset(dir(__import__("builtins")))


def _is_str(v: str) -> bool:
    return v.startswith("'")


def _is_path(v: str) -> bool:
    return not v.startswith(("'", "<"))


def _join(p: str, attr: str) -> str | None:
    """The dotted path of ``p.attr``: a module reached through another object is that module
    (``torch.sys`` is ``sys``)."""
    if not _is_path(p) or p.count(".") >= _MAX_PARTS:
        return None
    if attr == "__call__":  # g.__call__ is g
        return p
    if attr in MODULE_ATTRS:
        return attr
    return _by_value(p, attr) or f"{p}.{attr}"


def _by_value(p: str, attr: str) -> str | None:
    """What ``p.attr`` is, read from the module ``p`` as imported in this process (its ``__dict__``:
    no code runs): another module under another name is that module (``collections._sys`` is
    ``sys``, ``enum.bltns`` is ``builtins``: the twenty-first red team), a builtin function under
    another name is that builtin. None when ``p`` is not an imported module or ``attr`` neither."""
    mod = sys.modules.get(p)
    if not isinstance(mod, types.ModuleType):
        return _module_imports(p).get(attr)
    v = vars(mod).get(attr)
    if isinstance(v, types.ModuleType):
        name = vars(v).get("__name__")
        return name if isinstance(name, str) and name != p else None
    if isinstance(v, types.BuiltinFunctionType) and getattr(builtins, getattr(v, "__name__", ""), None) is v:
        return f"builtins.{v.__name__}"
    return None


@functools.lru_cache(maxsize=512)
def _module_imports(p: str) -> dict:
    """The modules a module this process has not imported binds at its top level, read from its
    source without running it: ``{"_sys": "sys"}`` for ``curses`` (``import sys as _sys``),
    ``{"pdb": "pdb"}`` for ``doctest``. Only a top-level module or a submodule whose parent is
    imported is looked up (finding a submodule would import its parent); ``{}`` when there is no
    readable source."""
    import importlib.util
    if not p.replace(".", "").replace("_", "").isalnum() or p.count(".") > 3:
        return {}
    parent = p.rpartition(".")[0]
    if parent and not isinstance(sys.modules.get(parent), types.ModuleType):
        return {}
    try:
        spec = importlib.util.find_spec(p)
        origin = spec.origin if spec else None
        if not origin or not origin.endswith(".py"):
            return {}
        with open(origin, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (ImportError, ValueError, OSError, SyntaxError, RecursionError, MemoryError, UnicodeDecodeError):
        return {}
    out = {}
    stack = list(tree.body)
    while stack:  # the module's body, and what its top-level if/try blocks run
        n = stack.pop()
        if isinstance(n, ast.Import):
            for a in n.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(n, ast.ImportFrom) and n.module and not n.level:
            for a in n.names:
                if a.name != "*" and n.module.split(".")[0] in REFLECTIVE_MODULES:
                    out[a.asname or a.name] = f"{n.module}.{a.name}"
        elif isinstance(n, (ast.If, ast.Try, getattr(ast, "TryStar", ast.Try))):
            stack += n.body + n.orelse + getattr(n, "finalbody", []) + [
                x for h in getattr(n, "handlers", []) for x in h.body]
    return out


def path_reason(p: str, own_only: bool = False) -> str | None:
    """Why a value reached under the dotted path ``p`` reaches around the course (the reason its
    direct spelling gets), or None. ``own_only``: only when the last part of ``p`` is what reaches
    around (the node that introduces it)."""
    if not _is_path(p):
        return None
    parts = p.split(".")
    if parts == ["builtins"]:
        return "the builtins namespace"
    for i in [len(parts) - 1] if own_only else range(1, len(parts)):
        if i < 1:
            continue
        a = parts[i]
        if parts[0] == "torch" and torch_internal([a]):
            return torch_reason(".".join(parts[:i + 1]))
        if a in MODULE_ATTRS:
            return f"the module {a} reached through another object"
        why = REVIEW_ATTRS.get(a)
        if why is None or (a in SYS_ONLY_ATTRS and parts[0] != "sys") \
                or ((a in TORCH_ONLY_ATTRS or a == "_C") and parts[0] != "torch"):
            continue
        return why
    if len(parts) > 1 and parts[0] == "sys" and parts[1] in vars(sys) and parts[1] not in SYS_PLAIN \
            and not parts[1].startswith("__") and not (own_only and len(parts) > 2):
        return SYS_STATE
    return None


def _reflective(v: str) -> str | None:
    """What a reflective value is, in words (for "kept in a container"), or None."""
    if v in REFLECTIVE_MODULES:
        return f"the module {v}"
    if v.startswith("builtins.") and v[9:] in REFLECTIVE_BUILTINS:
        return f"the builtin {v[9:]}"
    if v == "<globals>":
        return "a module namespace"
    if v == "<ipython>":
        return "the IPython shell"
    if path_reason(v):
        return v
    return None


def _fn_key(fn) -> str:
    """The key of a def (``<def>name``) or of a lambda (``<def><lambda@line:col>``, one per lambda)."""
    if isinstance(fn, ast.Lambda):
        return f"<def><lambda@{getattr(fn, 'lineno', 0)}:{getattr(fn, 'col_offset', 0)}:{id(fn)}>"
    return f"<def>{fn.name}"


class _Scope:
    """A function's (or a lambda's) scope: the names it binds itself (parameters, assignment, for, with, except and
    import targets, nested defs and classes) less those it declares global or nonlocal."""

    def __init__(self, fn, parent: "_Scope | None"):
        self.prefix = f"{_fn_key(fn)}:"
        self.parent = parent
        a = fn.args
        self.own = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg] if x}
        declared, self.globals = set(), set()
        stack = [fn.body] if isinstance(fn, ast.Lambda) else list(fn.body)
        while stack:
            n = stack.pop()
            if isinstance(n, (ast.Global, ast.Nonlocal)):
                declared |= set(n.names)
                if isinstance(n, ast.Global):
                    self.globals |= set(n.names)
            elif isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
                self.own.add(n.id)
            elif isinstance(n, ast.ExceptHandler) and n.name:
                self.own.add(n.name)
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                self.own |= {a.asname or a.name.split(".")[0] for a in n.names if a.name != "*"}
            elif hasattr(ast, "MatchAs") and isinstance(n, (ast.MatchAs, ast.MatchStar)) and n.name:
                self.own.add(n.name)
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                self.own.add(n.name)  # bound here; its body is its own scope (a class's: read as outside)
                a2 = getattr(n, "args", None)
                stack += n.decorator_list + (a2.defaults + [d for d in a2.kw_defaults if d] if a2 else [])
                continue
            if isinstance(n, ast.Lambda):
                stack += n.args.defaults + [d for d in n.args.kw_defaults if d] + [n.body]
                continue
            stack += list(ast.iter_child_nodes(n))
        self.own -= declared

    def resolve(self, name: str) -> str:
        s = self
        while s is not None:
            if name in s.globals:
                return name
            if name in s.own:
                return s.prefix + name
            s = s.parent
        return name


class Values:
    """A small abstract interpretation of the code that runs: the values of interest (modules,
    reflective builtins, torch's namespaces and whatever is reached under them, short strings) each
    name, attribute name, function result and container may hold. Flow-insensitive (a name holds
    everything it is ever bound to in its scope), so an alias cannot hide a value; a name a function
    binds (a parameter, an assignment's target... unless declared global or nonlocal) is that
    function's own, keyed "<def>f:name" (a closure reads the enclosing function's), so a local named
    like a module-level import does not take the import's value; a container holds what is put in
    it; a fixed number of passes over the code keeps it linear."""

    def __init__(self, trees: list, locked_trees: list, deadline: float | None = None):
        self._deadline = deadline  # slicing.in_time's: checked once per binding and per call read
        self.names: dict[str, set] = {}
        self.attrs: dict[str, set] = {}  # attribute name -> values stored under it (any object, class bodies too)
        self.returns: dict[str, set] = {}  # "<def>f" -> what f returns
        self.params: dict[str, list] = {}  # "<def>f" -> [(its positional parameters, its receiver)] for each f
        self.classes: set[str] = set()  # "<def>C" for each class C
        self.bound: set[str] = set()  # names the code binds (otherwise a builtin's name is the builtin)
        self.imported: dict[str, set] = {}  # name -> paths an import binds it to
        self.otherwise: set[str] = set()  # names bound other than by an import
        self.locked: set[str] = set()  # names the locked cells bind
        self.star: set[str] = set()  # modules imported with *
        self._edges: list = []
        self._calls: list = []
        self._scope: dict[int, _Scope] = {}  # id(node) -> the scope its names are looked up in
        for tree in locked_trees:
            self.locked |= {a.asname or a.name.split(".")[0] for n in ast.walk(tree)
                            if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
        for tree in list(locked_trees) + list(trees):
            self._scopes(tree)
            self._collect(tree)
        self.converged = False
        for _ in range(_PASSES):  # each pass follows every binding once, in order; most code settles in 2
            self._memo: dict[int, frozenset] = {}
            if not self._propagate():
                self.converged = True
                break
        self._memo = {}
        self.seeding_only = self._seeding_only(trees)

    # -- collecting bindings ---------------------------------------------------------------------
    def _add(self, table: dict, key: str, vals) -> bool:
        have = table.setdefault(key, set())
        new = {v for v in vals if v not in have}
        if new and len(have) < _MAX_VALUES:
            have |= set(sorted(new)[:_MAX_VALUES - len(have)])
            return True
        return False

    def _scopes(self, tree) -> None:
        """Each node's scope: a function's parameters and body are its own; its decorators,
        defaults and annotations, and everything outside functions, the enclosing one's."""
        stack = [(tree, None)]
        while stack:
            node, scope = stack.pop()
            self._scope[id(node)] = scope
            if isinstance(node, ast.Lambda):  # its parameters are its own, as a def's
                inner = _Scope(node, scope)
                a = node.args
                stack += [(c, scope) for c in a.defaults + [d for d in a.kw_defaults if d is not None]]
                stack.append((a, inner))
                self._scope[id(a)] = inner
                stack.append((node.body, inner))
                continue
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                inner = _Scope(node, scope)
                a = node.args
                outer = a.defaults + [d for d in a.kw_defaults if d is not None] + node.decorator_list \
                    + [x.annotation for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg]
                       if x is not None and x.annotation is not None] + ([node.returns] if node.returns else [])
                stack += [(c, scope) for c in outer]
                stack.append((a, inner))
                self._scope[id(a)] = inner
                stack += [(c, inner) for c in node.body]
                continue
            stack += [(c, scope) for c in ast.iter_child_nodes(node)]

    def _key(self, node, name: str) -> str:
        """The key ``name`` is tracked under where ``node`` is."""
        scope = self._scope.get(id(node))
        return scope.resolve(name) if scope is not None else name

    def _collect(self, tree) -> None:
        stack = [(tree, None, False)]
        while stack:
            node, fn, in_class = stack.pop()
            child_fn, child_class = fn, False
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                key = f"<def>{node.name}"
                self._bind_name(node.name, None, const={key}, key=self._key(node, node.name))
                self._decorated(node)
                a = node.args
                decorators = {d.id if isinstance(d, ast.Name) else getattr(d, "attr", None) for d in node.decorator_list}
                # the receiver its first parameter takes through obj.f(...): a method's self, a classmethod's cls
                receiver = None if not in_class or "staticmethod" in decorators else \
                    "cls" if "classmethod" in decorators else "self"
                self._parameters(key, a, receiver)
                if in_class:  # a method is an attribute; a property's value is what it returns
                    props = any((d.id if isinstance(d, ast.Name) else getattr(d, "attr", None))
                                in ("property", "cached_property") for d in node.decorator_list)
                    self._edges.append(("attr_returns" if props else "attr_const", node.name, key))
                child_fn = key
            elif isinstance(node, ast.ClassDef):
                self._bind_name(node.name, None, const={f"<def>{node.name}"}, key=self._key(node, node.name))
                self._decorated(node)
                self.classes.add(f"<def>{node.name}")
                child_class = True
            elif isinstance(node, ast.Lambda):
                # a lambda is a function: its parameters take its defaults and what calls pass it
                # ((lambda n, i=__import__: i(n))("sys")), and it returns its body
                key = _fn_key(node)
                self._parameters(key, node.args, None)
                self._edges.append(("return", key, node.body))
                child_fn = None
            elif isinstance(node, ast.Return) and fn and node.value is not None:
                self._edges.append(("return", fn, node.value))
            elif isinstance(node, (ast.Yield, ast.YieldFrom)) and fn and node.value is not None:
                self._edges.append(("return", fn, node.value))  # what a generator yields, next() returns
            elif hasattr(ast, "Match") and isinstance(node, ast.Match):
                # match SUBJECT: case NAME / case [*NAME] / case X(...) as NAME: a capture is bound to
                # the subject (or to a part of it: the subject's values cover them)
                for case in node.cases:
                    for n in ast.walk(case.pattern):
                        if isinstance(n, (ast.MatchAs, ast.MatchStar)) and n.name:
                            self._bind_name(n.name, node.subject, key=self._key(n, n.name))
            elif isinstance(node, ast.Assign):
                for t in node.targets:
                    self._bind(t, node.value, in_class)
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and node.value is not None:
                self._bind(node.target, node.value, in_class)
            elif isinstance(node, ast.NamedExpr):
                self._bind(node.target, node.value, False)
            elif isinstance(node, (ast.For, ast.AsyncFor, ast.comprehension)):
                self._bind(node.target, node.iter, False)
            elif isinstance(node, ast.withitem) and node.optional_vars is not None:
                self._bind(node.optional_vars, node.context_expr, False)
            elif isinstance(node, ast.Import):
                for a in node.names:
                    name = a.asname or a.name.split(".")[0]
                    path = a.name if a.asname else a.name.split(".")[0]
                    self.bound.add(name)
                    self.imported.setdefault(name, set()).add(path)
                    self.names.setdefault(self._key(node, name), set()).add(path)
            elif isinstance(node, ast.ImportFrom):
                for a in node.names:
                    if a.name == "*":  # every name the code does not bind may come from the module
                        if node.module and not node.level:
                            self.star.add(node.module)
                        continue
                    name = a.asname or a.name
                    self.bound.add(name)
                    path = f"{node.module}.{a.name}" if node.module and not node.level else None
                    self.imported.setdefault(name, set()).add(path or f"<relative>{a.name}")
                    if path:
                        self.names.setdefault(self._key(node, name), set()).add(path)
            elif isinstance(node, ast.Call):
                self._calls.append(node)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                self.bound.add(node.name)
                self.otherwise.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
                self.bound.add(node.id)
                self.otherwise.add(node.id)
            for c in ast.iter_child_nodes(node):
                stack.append((c, child_fn, child_class))

    def _decorated(self, node) -> None:
        """``@d def f`` binds ``f`` to ``d(f)``: the name holds what the decorators return as well
        (``@lambda f: getattr`` makes ``f`` the builtin getattr). The call is built from the
        decorator's own node, and read in the scope the decorator is read in."""
        value = None
        for d in reversed(node.decorator_list):
            arg = value or ast.Constant(value=None)
            value = ast.copy_location(ast.Call(func=d, args=[arg], keywords=[]), d)
            self._scope[id(value)] = self._scope.get(id(d))
            self._scope[id(arg)] = self._scope.get(id(d))
            self._calls.append(value)
        if value is not None:
            self._edges.append(("name", self._key(node, node.name), value))

    def _parameters(self, key: str, a: ast.arguments, receiver) -> None:
        """A def's or a lambda's parameters (``a``): what calls of ``key`` pass them (read in
        :meth:`_propagate`), and their defaults, bound as their values."""
        params = [x.arg for x in a.posonlyargs + a.args]
        local = lambda p: self._key(a, p)  # noqa: E731 -- a parameter's key in the function
        self.params.setdefault(key, []).append((params, receiver, {p: local(p) for p in params}))
        self.bound |= {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg] if x}
        self.otherwise |= {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg] if x}
        for p, d in zip(params[::-1], a.defaults[::-1]):
            self._edges.append(("name", local(p), d))
        for x, d in zip(a.kwonlyargs, a.kw_defaults):
            if d is not None:
                self._edges.append(("name", local(x.arg), d))

    def _bind_name(self, name: str, expr, const=None, key: str | None = None) -> None:
        key = key or name
        self.bound.add(name)
        self.otherwise.add(name)
        if const:
            self.names.setdefault(key, set()).update(const)
        if expr is not None:
            self._edges.append(("name", key, expr))
            if isinstance(expr, ast.Lambda):
                self.names.setdefault(key, set()).add(f"<def>{name}")
                self._edges.append(("return", f"<def>{name}", expr.body))

    def _bind(self, target, value, in_class: bool) -> None:
        if isinstance(target, ast.Name):
            self._bind_name(target.id, value, key=self._key(target, target.id))
            if in_class:
                self._edges.append(("attr", target.id, value))
        elif isinstance(target, (ast.Tuple, ast.List)):
            elts = target.elts
            if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(elts) \
                    and not any(isinstance(e, ast.Starred) for e in elts + value.elts):
                for t, v in zip(elts, value.elts):
                    self._bind(t, v, in_class)
            else:
                for t in elts:
                    self._bind(t.value if isinstance(t, ast.Starred) else t, value, in_class)
        elif isinstance(target, ast.Starred):
            self._bind(target.value, value, in_class)
        elif isinstance(target, ast.Attribute):
            self._edges.append(("attr", target.attr, value))
        elif isinstance(target, ast.Subscript):
            root = target.value
            while isinstance(root, (ast.Attribute, ast.Subscript)):
                root = root.value
            if isinstance(root, ast.Name):  # a container holds what is put in it (its keys' strings aside)
                self._edges.append(("held", self._key(root, root.id), value))

    def _propagate(self) -> bool:
        changed = False
        for kind, key, expr in self._edges:
            in_time(self._deadline)
            if kind in ("attr_const", "attr_returns"):
                vals = {expr} if kind == "attr_const" else self.returns.get(expr, set())
                changed |= bool(vals) and self._add(self.attrs, key, vals)
                continue
            vals = self.ev(expr)
            if kind == "held":
                vals, kind = {v for v in vals if not _is_str(v)}, "name"
            if vals:
                table = self.names if kind == "name" else self.attrs if kind == "attr" else self.returns
                changed |= self._add(table, key, vals)
        for call in self._calls:  # a student's function called with values: its parameters hold them
            for f in self.ev(call.func):
                for params, receiver, keys in self.params.get(f, ()):
                    in_time(self._deadline)  # many defs of one name, each called many times: a product
                    for skip in self._skips(call, params, receiver):
                        for p, a in zip(params[skip:], call.args):
                            if not isinstance(a, ast.Starred):
                                changed |= self._add(self.names, keys[p], self.ev(a))
                    for k in call.keywords:
                        if k.arg in keys:
                            changed |= self._add(self.names, keys[k.arg], self.ev(k.value))
        return changed

    def _skips(self, call: ast.Call, params: list, receiver) -> tuple:
        """The parameters a call's first positional argument may bind to, as how many it skips.
        obj.m(a) -> a binds to m's second parameter (the first is obj: self, or cls for a
        classmethod); Cls.m(obj, a), type(obj).m(obj, a) -> obj to the first, as for a function or a
        staticmethod. A method reached by a bare name may be bound or not: both, when it is short of
        arguments."""
        fn = call.func
        if receiver and isinstance(fn, ast.Attribute):
            return (1,) if receiver == "cls" or not self._may_be_class(fn.value) else (0, 1)
        if len(params) > len(call.args) and (receiver or params[:1] in (["self"], ["cls"])):
            return (0, 1)
        return (0,)

    def _may_be_class(self, node) -> bool:
        """Whether ``node`` may be a class (a class's name or alias, ``type(x)``, ``x.__class__``)."""
        if isinstance(node, ast.Attribute) and node.attr == "__class__":
            return True
        if isinstance(node, ast.Call) and "builtins.type" in self.ev(node.func):
            return True
        return bool(self.ev(node) & self.classes)

    # -- evaluating ------------------------------------------------------------------------------
    def ev(self, node, depth: int = 0) -> frozenset:
        """The values of interest ``node`` may evaluate to (empty when none is known)."""
        if node is None or depth > _MAX_DEPTH:
            return frozenset()
        key = id(node)
        got = self._memo.get(key)
        if got is None:
            self._memo[key] = frozenset()  # a cycle reads as nothing known
            got = frozenset(sorted(self._ev(node, depth + 1))[:_MAX_VALUES])
            self._memo[key] = got
        return got

    def strings(self, node) -> set[str]:
        return {v[1:] for v in self.ev(node) if _is_str(v)}

    def _ev(self, node, d) -> set:
        ev = lambda n: self.ev(n, d)  # noqa: E731
        if isinstance(node, ast.Name):
            out = set(self.names.get(self._key(node, node.id), ()))
            if node.id == "__builtins__":
                out.add("builtins")
            elif node.id in _BUILTIN_NAMES and node.id not in self.imported:
                out.add(f"builtins.{node.id}")  # a name the student binds somewhere may be the builtin elsewhere
            if self.star and node.id not in self.bound:
                out |= {j for m in self.star if (j := _join(m, node.id))}
            return out
        if isinstance(node, ast.Constant):
            return {f"'{node.value}"} if isinstance(node.value, str) and len(node.value) <= 80 else set()
        if isinstance(node, ast.Attribute):
            out = {j for p in ev(node.value) if (j := _join(p, node.attr))}
            return out | self.attrs.get(node.attr, set())
        if isinstance(node, ast.Subscript):
            if isinstance(node.slice, ast.Slice):  # "mron_reyal"[::-1]
                return {_ASSEMBLED}
            keys = self.strings(node.slice)
            out = set()
            for p in ev(node.value):
                if self._namespace(p):
                    out |= self._lookup(p, keys)
                else:  # a container holds what was put in it
                    out.add(p)
            return out
        if isinstance(node, ast.Call):
            return self._ev_call(node, ev)
        if isinstance(node, ast.BinOp):  # a string assembled from pieces: known when its pieces are
            left, right = self.strings(node.left), self.strings(node.right)
            out = {_ASSEMBLED}
            if isinstance(node.op, ast.Add):
                out |= {f"'{a}{b}" for a in sorted(left)[:4] for b in sorted(right)[:4] if len(a) + len(b) <= 80}
            return out
        if isinstance(node, ast.JoinedStr):
            if all(isinstance(v, ast.Constant) for v in node.values):
                return {"'" + "".join(str(v.value) for v in node.values)}
            return {_ASSEMBLED}
        if isinstance(node, (ast.BoolOp,)):
            return set().union(*(ev(v) for v in node.values))
        if isinstance(node, ast.IfExp):
            return set(ev(node.body)) | ev(node.orelse)
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return set().union(set(), *(ev(e) for e in node.elts))
        if isinstance(node, ast.Dict):
            return set().union(set(), *(ev(v) for v in node.values))
        if isinstance(node, (ast.Starred, ast.NamedExpr, ast.Await)):
            return set(ev(node.value))
        if isinstance(node, ast.Lambda):  # the lambda itself: calling it gives its body's values
            return {_fn_key(node)}
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            return set(ev(node.elt))
        if isinstance(node, ast.DictComp):
            return set(ev(node.value))
        return set()

    def _ev_call(self, node: ast.Call, ev) -> set:
        out = set()
        args = node.args
        fn = node.func
        if isinstance(fn, ast.Attribute) and fn.attr in STRING_BUILDERS \
                or isinstance(fn, ast.Name) and fn.id in ("str", "chr", "format", "repr", "bytes"):
            out.add(_ASSEMBLED)  # "".join([...]), "{}".format(...), b"...".decode(), chr(...)
        if isinstance(node.func, ast.Lambda):  # (lambda: sys)()
            out |= ev(node.func.body)
        if isinstance(fn, ast.Name) and fn.id == "get_ipython" and fn.id not in self.bound:
            out.add("<ipython>")  # the shell: its attributes reached through a name are flagged
        for c in ev(node.func):
            if c == "builtins.getattr" and len(args) >= 2:
                out |= {j for p in ev(args[0]) for k in self.strings(args[1]) if (j := _join(p, k))}
                if len(args) > 2:
                    out |= ev(args[2])
            elif c in ("builtins.__import__", "importlib.import_module", "importlib.__import__") and args:
                out |= self.strings(args[0])
            elif c == "builtins.vars":
                out |= {f"{p}.__dict__" for p in ev(args[0]) if _is_path(p)} if args else {"<globals>"}
            elif c in ("builtins.globals", "builtins.locals"):
                out.add("<globals>")
            elif c == "builtins.iter" and len(args) == 2:  # iter(callable, sentinel) yields the calls' results
                out |= {r for f in ev(args[0]) if f.startswith("<def>") for r in self.returns.get(f, set())}
            elif c in ("functools.partial", "builtins.next", "builtins.iter", "builtins.list", "builtins.tuple",
                       "builtins.dict", "builtins.set", "builtins.reversed", "builtins.sorted") and args:
                out |= ev(args[0])
            elif c == "builtins.dict":
                out |= {v for k in node.keywords for v in ev(k.value)}
            elif c.startswith("<def>"):
                out |= self.returns.get(c, set())
        if isinstance(node.func, ast.Attribute) and node.func.attr in READING_METHODS:
            keyed = node.func.attr in ("get", "pop", "setdefault", "__getitem__")
            keys = self.strings(args[0]) if args and keyed else set()
            for p in ev(node.func.value):
                if self._namespace(p):  # sys.modules.get("gc"), F.__dict__.get("layer_norm")
                    out |= self._lookup(p, keys)
                else:  # a container gives back what it holds
                    out.add(p)
        return out

    @staticmethod
    def _namespace(p: str) -> bool:
        return p in ("sys.modules", "builtins", "<globals>") or p.endswith((".__dict__", ".__globals__"))

    def _lookup(self, p: str, keys) -> set:
        """``p[k]`` for a namespace ``p`` and each string ``k``."""
        if p == "sys.modules":
            return set(keys)
        if p == "<globals>":
            return {v for k in keys for v in self.names.get(k, set()) | (
                {f"builtins.{k}"} if k in _BUILTIN_NAMES else set())}
        if p == "builtins" or p.endswith(".__dict__"):
            base = "builtins" if p == "builtins" else p[:-len(".__dict__")]
            return {j for k in keys if (j := _join(base, k))}
        return set()  # a function's globals: a module the code does not name

    # -- what the review asks of values ----------------------------------------------------------
    def alias(self, node) -> str:
        """`` (through the alias X)`` when the name at the root of ``node`` is not the value's own
        name (``_s`` for sys, ``g`` for getattr, ``T`` for torch); "" for the direct spelling."""
        while True:
            if isinstance(node, (ast.Attribute, ast.Subscript, ast.Starred)):
                node = node.value
            elif isinstance(node, ast.Call):
                node = node.func
            else:
                break
        if not isinstance(node, ast.Name):
            return " (through a value held elsewhere)"  # a container, a comprehension, a lambda...
        name = node.id
        if name not in self.bound or name in self.locked and name not in self.otherwise:
            return ""
        if name not in self.otherwise and all(p.split(".")[-1] == name for p in self.imported.get(name, ())):
            return ""
        return f" (through the alias {name})"

    def import_flagged(self, name: str) -> bool:
        """Whether ``name`` is bound only by imports that the review flags themselves."""
        paths = self.imported.get(name)
        if not paths or name in self.otherwise:
            return False
        return all(p.split(".")[0] in REVIEW_MODULES
                   or p.split(".")[0] == "torch" and torch_internal(p.split(".")[1:]) for p in paths)

    def public_lookup(self, call: ast.Call) -> bool:
        """``getattr(nn, NAMES[kind])``, ``getattr(F, act_name)``, ``getattr(torch, dtype_name)``: a
        lookup on torch's public namespaces by a name held in a variable, a table or an attribute
        (not assembled from pieces), whose known values are all public names."""
        if len(call.args) < 2:
            return False
        base = self.ev(call.args[0])
        name = call.args[1]
        if not base or not base <= PUBLIC_TORCH:
            return False
        if not isinstance(name, (ast.Name, ast.Subscript, ast.Attribute, ast.Constant)) \
                or _ASSEMBLED in self.ev(name):
            return False
        known = self.strings(name)
        # no known value (a name from dir(), input, a loop over anything): a computed name, not a config's
        return bool(known) and all(s.isidentifier() and not s.startswith("_") and s not in MODULE_ATTRS
                                   and s not in TORCH_INTERNAL_PARTS and s not in REVIEW_ATTRS for s in known)

    def seeding_write(self, target) -> bool:
        """``os.environ["CUBLAS_WORKSPACE_CONFIG"] = ...`` (a known determinism variable, by a
        literal key) or ``torch.backends.cudnn.deterministic = ...``."""
        if isinstance(target, ast.Subscript):
            key = target.slice
            return isinstance(key, ast.Constant) and key.value in DETERMINISM_VARS \
                and {v for v in self.ev(target.value) if _is_path(v)} == {"os.environ"}
        if isinstance(target, ast.Attribute):
            paths = {j for p in self.ev(target.value) if (j := _join(p, target.attr))}
            return bool(paths) and paths <= DETERMINISM_SETTINGS
        return False

    def _seeding_only(self, trees) -> set[str]:
        """Names bound to ``os`` or ``os.environ`` used, and only, for seeding writes."""
        paths = {n: {x for x in v if _is_path(x)} for n, v in self.names.items()}
        names = {n for n, v in paths.items() if v and v <= {"os", "os.environ"}}
        if not names:
            return set()
        ok, used = set(names), set()
        for tree in trees:
            parent = {}
            for n in ast.walk(tree):
                for c in ast.iter_child_nodes(n):
                    parent[id(c)] = n
            for n in ast.walk(tree):
                if not (isinstance(n, ast.Name) and n.id in ok and isinstance(n.ctx, ast.Load)):
                    continue
                up = parent.get(id(n))
                if paths[n.id] == {"os"}:
                    up = parent.get(id(up)) if isinstance(up, ast.Attribute) and up.attr == "environ" else None
                    node = up and up.value
                else:
                    node = n
                if isinstance(up, ast.Subscript) and isinstance(up.ctx, ast.Store) and self.seeding_write(up):
                    used.add(n.id)
                    continue
                if isinstance(up, ast.Attribute) and up.attr == "setdefault" and up.value is node:
                    call = parent.get(id(up))
                    if isinstance(call, ast.Call) and call.func is up and call.args \
                            and isinstance(call.args[0], ast.Constant) and call.args[0].value in DETERMINISM_VARS:
                        used.add(n.id)
                        continue
                ok.discard(n.id)
        return ok & used


def _review_values(values: Values, st, tree, done: set, flag, hand_written: bool, modules, on_self) -> None:
    """What the direct spelling does not show: uses of values of interest reached through another
    name, a container, a class attribute or a higher-order call; reflective values stored; and in
    exercise 05 autograd reached inside the hand-written functions by any name."""
    ev = values.ev
    class_bodies: set[int] = set()  # statements directly in a class body (filled as the walk, parents first, meets them)
    unpacked: set[int] = set()  # the right side of ``a, b = x, y``: aliases, not a container
    for n in ast.walk(tree):
        if isinstance(n, ast.ClassDef):
            class_bodies |= {id(s) for s in n.body}
        elif isinstance(n, ast.Assign) and isinstance(n.value, (ast.Tuple, ast.List)) and all(
                isinstance(t, (ast.Tuple, ast.List)) and len(t.elts) == len(n.value.elts) for t in n.targets):
            unpacked.add(id(n.value))
        if id(n) in done:
            continue
        why = None
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load):
            if not values.alias(n) and values.import_flagged(n.id):
                continue  # ``builtins`` after ``import builtins``: the import says it
            why = next((r for v in sorted(ev(n)) if (r := path_reason(v, own_only=True))), None)
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load):
            why = next((r for v in sorted(ev(n)) if (r := path_reason(v, own_only=True))), None)
            if why is None and n.attr not in MODULE_ATTRS:
                # another module's name for a module of the review list (random._os, logging.weakref,
                # doctest.pdb): the module it is, reached through another object
                base = {v for v in ev(n.value) if _is_path(v)}
                mod = next((v for p in sorted(base) if (v := _join(p, n.attr)) in REFLECTIVE_MODULES), None)
                if mod:
                    why = f"the module {mod} reached through another object"
            if why is None:
                base = [v for v in ev(n.value) if _is_path(v)]
                why = next((r for p in sorted(base) if (j := _join(p, n.attr)) and (r := review_path(j))
                            and not review_path(p)), None)
            if why is None and not is_get_ipython(n.value) and "<ipython>" in ev(n.value):
                why = f"the IPython shell's {n.attr} (it reaches the notebook's machinery)"
        elif isinstance(n, ast.Attribute) and isinstance(n.ctx, (ast.Store, ast.Del)) \
                and root_name(n.value) not in modules | {"self", "cls"} and not values.seeding_write(n) \
                and any(_is_path(v) and not v.startswith("builtins.") for v in ev(n.value)):
            flag(st, n, "writes into an imported module" + values.alias(n))
            continue
        if why:
            why += values.alias(n)
        elif isinstance(n, ast.Call):
            why = _value_call_reason(values, n, hand_written, modules, on_self)
        if why:
            flag(st, n, why)
            done |= {id(m) for m in ast.walk(n)}
            continue
        # reflective values kept in a container or a class attribute
        kept = []
        if isinstance(n, (ast.List, ast.Tuple, ast.Set)) and isinstance(getattr(n, "ctx", ast.Load()), ast.Load) \
                and id(n) not in unpacked:
            kept = n.elts
        elif isinstance(n, ast.Dict):
            kept = n.values
        elif isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None:
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            if id(n) in class_bodies or any(isinstance(t, (ast.Attribute, ast.Subscript)) for t in targets):
                kept = [n.value]
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in STORING_METHODS:
            kept = list(n.args) + [k.value for k in n.keywords]
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "setattr" and len(n.args) == 3:
            kept = [n.args[2]]
        for e in kept:
            what = next((w for v in sorted(ev(e)) if (w := _reflective(v))), None)
            if what:
                flag(st, e, f"{what} kept in a container or class attribute" + values.alias(e))
                break


def _builtin_reason(name: str) -> str:
    if name in REVIEW_BUILTINS:
        return f"{name}() ({REVIEW_BUILTINS[name]})"
    return {"getattr": "getattr() with a computed name on another object", "vars": "vars() of another object",
            "setattr": "setattr() on a module", "delattr": "delattr() on a module"}[name]


def _value_call_reason(values: Values, n: ast.Call, hand_written: bool, modules, on_self) -> str | None:
    ev = values.ev
    fn = n.func
    spelled = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else None
    for c in sorted(ev(fn)):
        if c in STACKLEVEL_POSITIONAL and _walks_the_stack(n, c):
            return CALLER_WALK + values.alias(n)
        direct = isinstance(fn, ast.Name) and c == f"builtins.{fn.id}"  # the builtin by its own name
        if c.startswith("builtins.") and c[9:] in REFLECTIVE_BUILTINS and not direct:
            b = c[9:]
            if b == "getattr":
                if len(n.args) < 2 or id(n) in on_self or values.public_lookup(n):
                    continue
                names = values.strings(n.args[1])
                if isinstance(n.args[1], ast.Constant) or names:
                    base = ev(n.args[0])
                    for k in sorted(names):
                        paths = [j for p in base if (j := _join(p, k))]
                        why = next((r for p in sorted(paths) if (r := path_reason(p, own_only=True))), None)
                        if why is None and not paths and k not in SYS_ONLY_ATTRS | TORCH_ONLY_ATTRS | {"_C"}:
                            why = REVIEW_ATTRS.get(k) or (f"the module {k} reached through another object"
                                                          if k in MODULE_ATTRS else None)
                        if why:
                            return why + values.alias(n)
                    if isinstance(n.args[1], ast.Constant):
                        continue
                return _builtin_reason(b) + values.alias(n)
            if b == "vars" and (not n.args or id(n) in on_self):
                continue
            if b in ("setattr", "delattr") and not (n.args and (root_name(n.args[0]) in modules
                                                               or any(_is_path(v) for v in ev(n.args[0])))):
                continue
            return _builtin_reason(b) + values.alias(n)
        if hand_written and c.startswith("torch.") and c.split(".")[-1] in GRAD_SWITCHES \
                and spelled not in GRAD_SWITCHES and _switches_grad_on(n, c.split(".")[-1]):
            return "autograd switched back on inside a hand-written backward" + values.alias(n)
        if hand_written and c not in NOT_AUTOGRAD and any(c == r or c.startswith(r + ".") for r in AUTOGRAD_ROUTES):
            return f"autograd run inside a hand-written backward ({c})" + values.alias(n)
    for c in sorted(ev(fn)):  # timeit.timeit("code"): a string statement runs as code
        names = STRING_RUNNERS.get(c)
        if names is None:
            continue
        given = list(n.args[:len(names)]) + [k.value for k in n.keywords if k.arg in names]
        if any(isinstance(a, (ast.Constant, ast.JoinedStr, ast.BinOp)) and not (
                isinstance(a, ast.Constant) and a.value in ("pass", "")) or any(
                _is_str(v) or v == _ASSEMBLED for v in ev(a)) for a in given):
            return f"a string run as code ({c})" + values.alias(n)
    for a in list(n.args) + [k.value for k in n.keywords]:  # a reflective builtin handed to a call
        for v in sorted(ev(a)):
            if v.startswith("builtins.") and v[9:] in REFLECTIVE_BUILTINS:
                return f"{_builtin_reason(v[9:])} (passed to {_show(fn)}){values.alias(a)}"
    return None
