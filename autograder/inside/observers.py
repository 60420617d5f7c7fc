"""Runs INSIDE the sandbox, installed by the harness before any student code runs: observers that
report what the student's code did, and cannot be switched off unseen.

* An **audit hook** (PEP 578, :func:`sys.addaudithook`: no Python code can remove it) notes the
  reflective and low-level operations of the student's code: ``gc.get_objects``/``get_referrers``/
  ``get_referents``, ``sys._getframe``, ``sys._current_frames``, restricted attributes
  (``__code__``, ``tb_frame``, ``gi_frame``, ``f_code``: ``object.__getattr__``), writing a
  function's code (``object.__setattr__``/``__delattr__``), ``ctypes``, ``compile``/``exec`` called by
  the student's code, ``sys.settrace``/``sys.setprofile``, a second audit hook, and, during a graded
  call, imports of new modules and processes started. An event is the student's when the code that
  caused it is the notebook's (IPython's cell files, ``<ipython-input-...>``): for ``sys._getframe``,
  restricted attributes, ``compile`` and ``exec`` the direct caller (``inspect`` and ``traceback``
  stepped over), for the others the nearest frame above it that is not the standard library.
  torch (``torch.compile``, dynamo), IPython, the harness and the course's probes are never the
  student. The hook is cheap on the hot path (a frozenset look-up first), re-entrant safe, and never
  raises into the code it watches.
* **Identity and state checks** before and after every probe: the course's checks and spies (every
  function and class of ``coursekit.checks.*`` and the methods of those classes), the torch entry
  points the probes rely on (``torch.autograd.grad``, ``Tensor.backward``, grad-mode switches,
  autograd's engine, module hooks, ``sys.setprofile``, ``gc``...) are the objects they were before
  any student code ran; torch's mode stacks are empty and torch functions enabled outside a probe;
  the kernel block (:func:`coursekit.checks.ops.block_kernels`) still raises.
* **Thread starts** are recorded with who started them (:data:`coursekit.checks.threads.STARTED`), so
  that the grader can name the threads the student's code started that run beside a test.
* **torch's op records** (what exercise 05's profiler reads, in every thread): switching them off in a
  thread (``torch.autograd._enable_record_function(False)``, thread-local), clearing the profiler's
  callbacks (``torch._C._autograd._clear_callbacks``), or stopping, starting or swapping a profiler
  session directly (``_disable_profiler``, ``_enable_profiler_legacy``...) goes through a wrapper
  installed here, in every loaded torch module that holds the function, and is the student's event
  when the student's own code called it (``torch.profiler.profile`` calls them from torch's code:
  not an event).
* A **nonce** per probe, sent by the grader, goes through the audit hook (``sys.audit``) and back
  with the test's reply: a hook that did not see it is an observation too.

The harness sends what was observed with each reply (:mod:`autograder.referee.protocol`); the grader decides:
an observation during a probe costs that test its points, naming it; a student's event during an
ordinary cell is a review flag on the row, naming the event and the cell.
"""
from __future__ import annotations

import os
import sys
import sysconfig
import types

#: audit events the hook looks at (everything else returns at once)
EVENTS = frozenset({
    "gc.get_objects", "gc.get_referrers", "gc.get_referents", "sys._getframe", "sys._current_frames",
    "object.__getattr__", "object.__setattr__", "object.__delattr__", "compile", "exec", "import",
    "sys.settrace", "sys.setprofile", "sys.addaudithook", "os.fork", "os.forkpty", "os.posix_spawn",
    "os.exec", "os.system", "subprocess.Popen", "resnorm.nonce", "function.__new__", "code.__new__",
    # another interpreter in this process: its own thread state, so no tracer, op counter or audit hook
    # of this one sees the code it runs (the tenth red team's per-row loop in _xxsubinterpreters)
    "cpython.PyInterpreterState_New",
})
#: events judged by their direct caller (stdlib's own uses, e.g. logging's frame look-up,
#: dataclasses' and namedtuple's exec, are not the student's); inspect/traceback are stepped over
DIRECT = frozenset({"sys._getframe", "object.__getattr__", "compile", "exec", "function.__new__", "code.__new__"})
#: events that count only during a graded call (a cell may import and start what it likes)
PROBE_ONLY = frozenset({"import", "os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.system",
                        "subprocess.Popen"})
STUDENT_FILES = ("<ipython-input-",)
#: file names of code made at run time that is not the student's: the interpreter's frozen modules,
#: the course's compiled hidden checks, torch.fx's generated forward functions
TRUSTED_GENERATED = ("<frozen ", "<hidden check", "<eval_with_key>")
#: the modules whose classes' attributes are guarded (writing them is an event)
GUARDED_MODULES = ("torch", "coursekit", "course", "observers", "harness", "autograder")
MAX_EVENTS = 50


def _stdlib_prefixes():
    paths = sysconfig.get_paths()
    return tuple({os.path.realpath(p) + os.sep for p in (paths.get("stdlib"), paths.get("platstdlib")) if p})


def _installed_prefixes():
    """The folders of code the student cannot write: the interpreter's and the venv's (the standard
    library, site-packages), the course's packages and the harness's own folder, as real paths."""
    import coursekit
    paths = sysconfig.get_paths()
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, *(paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")),
             os.path.dirname(os.path.dirname(os.path.abspath(coursekit.__file__))), os.path.dirname(os.path.abspath(__file__))}
    return tuple(sorted({os.path.realpath(p) + os.sep for p in roots if p}))


class Observers:
    """The observers of one submission's process (one instance, made by :func:`install`)."""

    def __init__(self):
        import _thread
        self._ident = _thread.get_ident
        self._busy = set()
        self._stdlib = _stdlib_prefixes()
        self._installed = _installed_prefixes()
        self._real = {}  # a code's file name -> its real path (the file a name like torch/../../x.py is)
        self._realpath = os.path.realpath
        self._step = ("setup", "")  # (kind, label) of the step running now
        self._events = []  # student's events in the current step: (event, detail, file, line)
        self._cells = {}  # cell file name -> the label of the cell it came from
        self._nonce = None
        self._phase_test = False
        self._baseline = {}
        self._block = None
        self._started = {}  # the hook's own copy of coursekit.checks.threads.STARTED
        self._starts = [0]  # the hook's own count of thread starts (coursekit.checks.threads.STARTS)
        self._starts_public = None  # the list object coursekit.checks.threads.STARTS must stay
        self._wrapped = []  # (owner, name) of the functions watch_op_records put wrappers in place of
        #: the notebook's %%writefile modules (the plan names them): importing one during a test, as a
        #: function's first call may, is not an event (its file is graded code, reviewed like a cell)
        self.own_modules = frozenset()
        self._modules_seen = set(sys.modules)  # the modules loaded before any student code
        self._imported_at = {}  # module name -> (file, line) of the student's code that imported it first
        self._eager = False  # torch.compile was switched off (dynamo's config.disable) before any student code

    # ---------------------------------------------------------------- the audit hook
    def hook(self, event, args):
        if event not in EVENTS and event[:7] != "ctypes.":
            return
        # the hot path's bulk, left before any frame is looked at: torch and dynamo reading frames'
        # code (the student needs a frame first: sys._getframe, tb_frame are events themselves), and
        # imports executing modules' code (compiled from a file: its compile or unmarshalling was
        # the event, if any)
        if event == "object.__getattr__":
            if len(args) > 1 and args[1] == "f_code":
                return
        elif event == "exec":
            fn = getattr(args[0], "co_filename", "") if args else ""
            if isinstance(fn, str) and fn.startswith(("/", "<frozen ")):
                return
        ident = self._ident()
        if ident in self._busy:
            return
        self._busy.add(ident)
        try:
            self._see(event, args)
        except BaseException:  # noqa: BLE001 -- never raise into the code being watched
            pass
        finally:
            self._busy.discard(ident)

    def _see(self, event, args):
        if event == "resnorm.nonce":
            self._nonce = args[0] if args else None
            return
        if event == "import" and args and args[0] not in self._imported_at and args[0] not in self._modules_seen:
            # where the student's code imported a module first (the review names it with a module
            # loaded from a file the notebook wrote, :meth:`_foreign_modules`)
            where = self._is_student(sys._getframe(2), direct=False)
            if where is not None:
                self._imported_at[args[0]] = where
        if event in PROBE_ONLY and not self._phase_test:
            return
        if event == "import" and args and args[0] in self.own_modules:
            return  # the notebook's own %%writefile module: graded code, scanned like a cell
        frame = sys._getframe(2)  # 0: _see, 1: hook, 2: the code that raised the event
        if event == "compile" and len(args) > 1 and isinstance(args[1], str) and args[1].startswith(STUDENT_FILES) \
                and not self._is_student(frame, direct=True):
            self._cells[args[1]] = self._step[1]  # IPython compiling a cell: its file name is that cell's
            return
        if event in ("object.__setattr__", "object.__delattr__") and args and \
                isinstance(args[0], (type, types.FunctionType)) and \
                not str(getattr(args[0], "__module__", "")).startswith(GUARDED_MODULES):
            # a class or function of the student's or the standard library's (namedtuple sets a class's
            # __module__ and __doc__, and its __new__'s __defaults__)
            return
        where = self._is_student(frame, direct=event in DIRECT)
        if where is None:
            return
        if len(self._events) < MAX_EVENTS:
            self._events.append((event, _detail(event, args), where[0], where[1]))

    def _is_student(self, frame, direct):
        """``(file, line)`` of the student's code that caused an event raised in ``frame``, or None."""
        f = frame
        while f is not None:
            fn = f.f_code.co_filename
            if fn.startswith(STUDENT_FILES):
                return fn, f.f_lineno
            if fn.startswith("<") and not fn.startswith(TRUSTED_GENERATED):
                # code compiled from a string at run time (timeit's template, a pickle's exec, eval):
                # whoever supplied the string, it is not a library's own code, so it is the student's
                return fn, f.f_lineno
            real = self._real.get(fn)
            if real is None:  # a path is judged by the file it names: <torch>/../../home/student/x.py is the student's
                real = self._real[fn] = self._realpath(fn)  # a relative name too (a sys.path entry ".")
            stdlib = fn.startswith("<frozen ") or (real.startswith(self._stdlib) and "-packages" not in real)
            if not stdlib:
                # code from a file outside the installed folders is a file the student wrote (a
                # %%writefile module, one written with open()): the student's; the rest is a library's
                return None if real.startswith(self._installed) else (fn, f.f_lineno)
            # modules that hand frames to their caller (bdb and pdb: the debuggers' get_stack) read them
            # on its behalf, so their reads are the caller's (the ninth red team's bdb.Bdb().get_stack)
            if direct and not fn.endswith(("inspect.py", "traceback.py", "linecache.py", "bdb.py", "pdb.py")):
                return None
            f = f.f_back
        return None

    # ---------------------------------------------------------------- steps
    def cell(self, label):
        """Start of an ordinary cell."""
        self._step, self._events, self._phase_test = ("cell", label), [], False

    def cell_report(self) -> list:
        """The student's events in the cell that just ran, as text (the grader flags the row)."""
        out = [self._text(e) for e in self._events] + self._foreign_modules()
        self._events = []
        return out

    def _foreign_modules(self) -> list:
        """Modules loaded since the last look from a file outside the installed folders that is not
        one of the notebook's %%writefile modules: code the review never read (a module written into
        a zip on ``sys.path``, the sixteenth red team's loop unless traced). Each is named once."""
        found = []
        try:
            names = [n for n in list(sys.modules) if n not in self._modules_seen]
        except Exception:  # noqa: BLE001
            return found
        for name in names:
            self._modules_seen.add(name)
            m = sys.modules.get(name)
            if name in self.own_modules or not isinstance(m, types.ModuleType):
                continue
            try:  # the module's own dict, read without any attribute code of a subclass
                file = _MODULE_DICT.__get__(m).get("__file__")
            except Exception:  # noqa: BLE001
                continue
            if isinstance(file, str):
                real = self._real.get(file) or self._realpath(file)
                if not real.startswith(self._installed):
                    at = self._imported_at.get(name) or self._imported_at.get(name.split(".")[0])
                    place = self._place(*at) if at else f"{self._step[1]}, line ?"
                    found.append(f"a module loaded from a file the notebook wrote, which the review did not read: "
                                 f"{name} ({file[:120]}) ({place})")
        return found

    def probe_start(self, label):
        """Before a test's probe: the state checks, then watch."""
        problems = self.check(inside=False)
        self._step, self._events, self._phase_test, self._nonce = ("test", label), [], True, None
        return problems

    def probe_end(self, nonce) -> dict:
        """After the probe: the nonce through the hook, the state checks; what was observed."""
        self._phase_test = False
        try:
            sys.audit("resnorm.nonce", nonce)
        except BaseException:  # noqa: BLE001 -- another hook refused it: the nonce does not come back
            pass
        events = [self._text(e) for e in self._events] + self._foreign_modules()
        self._events = []
        return {"events": events, "problems": self.check(inside=False), "nonce": self._nonce}

    def _text(self, e) -> str:
        event, detail, fn, line = e
        return f"{event}{(' ' + detail) if detail else ''} ({self._place(fn, line)})"

    def _place(self, fn, line) -> str:
        """Where in the notebook a file name and line are: the cell's label and the line."""
        cell = self._cells.get(fn)
        return f"{cell}, line {line}" if cell else (f"line {line}" if fn.startswith(STUDENT_FILES) else
                                                     f"code compiled from a string, {fn} line {line}")

    # ---------------------------------------------------------------- identity and state
    def take_baseline(self, blocked=None, guarded=()):
        """Every object the probes rely on, as it is before any student code runs."""
        import types

        import torch
        self._block = blocked
        base = {}
        for name, mod in list(sys.modules.items()):
            if mod is None or not (name == "coursekit.checks" or name.startswith("coursekit.checks.")):
                continue
            for attr, v in list(vars(mod).items()):
                if isinstance(v, (types.FunctionType, type)) or attr in ("_ACTIVE", "SEEN", "REGISTRY", "STARTED",
                                                                                "GROWTH", "_OWN", "_settrace", "_gettrace"):
                    base[(mod, attr)] = v
                if isinstance(v, type) and getattr(v, "__module__", "") == name:
                    for k, m in list(vars(v).items()):
                        if isinstance(m, (types.FunctionType, staticmethod, classmethod, property)):
                            base[(v, k)] = m
        import gc
        import threading

        import torch.autograd.graph as graph
        import torch.nn.modules.module as module
        from torch.autograd.variable import Variable
        from torch.overrides import TorchFunctionMode
        from torch.utils._python_dispatch import TorchDispatchMode
        for owner, names in (
                (torch.autograd, ("grad", "backward")), (torch.Tensor, ("backward", "requires_grad_")),
                (torch, ("inference_mode", "enable_grad", "no_grad", "set_grad_enabled", "is_grad_enabled")),
                (graph, ("_engine_run_backward", "saved_tensors_hooks")), (Variable, ("_execution_engine",)),
                (module, ("register_module_forward_pre_hook", "_global_forward_pre_hooks")),
                (torch.nn.Module, ("__call__", "_call_impl", "_wrapped_call_impl")),
                (TorchFunctionMode, ("__enter__", "__exit__")), (TorchDispatchMode, ("__enter__", "__exit__")),
                (torch._C._functorch, ("get_interpreter_stack",)),
                (sys, ("setprofile", "getprofile", "settrace", "gettrace", "_current_frames", "_getframe", "audit")),
                (threading, ("setprofile", "getprofile", "enumerate", "Thread")), (threading.Thread, ("start",)),
                (gc, ("get_objects", "get_referents", "collect", "freeze", "unfreeze"))):
            for n in names:
                if n in vars(owner) or hasattr(owner, n):
                    base[(owner, n)] = vars(owner)[n] if n in vars(owner) else getattr(owner, n)
        for owner, n in tuple(guarded) + tuple(self._wrapped):
            base[(owner, n)] = vars(owner)[n] if n in vars(owner) else getattr(owner, n)
        for c in (torch.nn.TransformerEncoderLayer, torch.nn.TransformerDecoderLayer, torch.nn.TransformerEncoder,
                  torch.nn.TransformerDecoder, torch.nn.Transformer):
            for k, m in list(vars(c).items()):
                if isinstance(m, types.FunctionType):
                    base[(c, k)] = m
                    base[(m, "__code__")] = m.__code__
        self._baseline = base

    def check(self, inside=False) -> list:
        """What is not as it was before any student code ran (text; empty when all is in place)."""
        import torch
        problems = []
        for (owner, attr), v in self._baseline.items():
            try:
                now = vars(owner).get(attr, _GONE) if isinstance(owner, type) or hasattr(owner, "__dict__") else _GONE
                if now is _GONE and hasattr(owner, attr):
                    now = getattr(owner, attr)
            except Exception:  # noqa: BLE001
                now = _GONE
            if now is not v:
                problems.append(f"{getattr(owner, '__name__', type(owner).__name__)}.{attr} was replaced")
                if len(problems) >= 5:
                    break
        if not inside:
            try:
                if torch._C._len_torch_function_stack() or torch._C._len_torch_dispatch_stack():
                    problems.append("a torch function or dispatch mode was left on torch's mode stack")
                if not torch._C._is_torch_function_enabled():
                    problems.append("torch functions were left switched off (DisableTorchFunction)")
                if sys.getprofile() is not None or sys.gettrace() is not None:
                    problems.append("a profile or trace function was left set")
                dynamo = sys.modules.get("torch._dynamo.config")
                if dynamo is not None and self._eager and getattr(dynamo, "disable", None) is not True:
                    problems.append("torch.compile was switched back on (torch._dynamo.config.disable)")
            except Exception as e:  # noqa: BLE001
                problems.append(f"torch's state could not be read ({type(e).__name__})")
        try:
            from coursekit.checks import threads
            public = threads.STARTED or {}
            if any(public.get(i) != v for i, v in self._started.items()) or \
                    any(i not in self._started for i in public) or threads.STARTS != self._starts \
                    or (self._starts_public is not None and threads.STARTS is not self._starts_public):
                problems.append("the record of who started each thread was changed")
        except Exception:  # noqa: BLE001
            problems.append("the record of who started each thread could not be read")
        blocked = self._block
        if blocked is not None and not getattr(blocked, "_released_by_harness", False):
            from coursekit.checks import ops
            if blocked not in ops._ACTIVE or not blocked.libraries:
                problems.append("the block on torch's built-in normalization kernels was released")
            elif any(q.startswith("aten::native_layer_norm") for q, _ in blocked.registered):
                try:
                    torch.native_layer_norm(torch.zeros(1, 2), [2], None, None, 1e-5)
                    problems.append("torch's built-in layer_norm kernel runs again (the kernel block is off)")
                except RuntimeError as e:
                    if "switched off" not in str(e):
                        problems.append("torch's built-in layer_norm kernel does not raise the block's error")
                except Exception:  # noqa: BLE001
                    pass
        return problems

    # ---------------------------------------------------------------- threads
    def watch_threads(self):
        """Record who starts each thread from now on (:data:`coursekit.checks.threads.STARTED`)."""
        import threading

        from coursekit.checks import threads
        started, mine, count = {}, self._started, [0]
        threads.STARTED, threads.STARTS = started, count
        self._starts_public = count
        original = threading.Thread.start
        me = self

        def start(thread):
            where = me._is_student(sys._getframe(1), direct=False)
            student = where is not None
            if not student and me._step[0] == "setup":
                pass  # no student code has run yet: the harness's own (IPython's history thread, with a home)
            elif not student:
                student = threads._carries_student_code([getattr(thread, "_target", None),
                                                         getattr(thread, "_args", ()), thread])
            count[0] += 1
            me._starts[0] += 1
            original(thread)
            started[thread.ident] = mine[thread.ident] = student
            if where is not None:
                threads.WHERE[thread.ident] = me._place(*where)

        start.__name__, start.__qualname__, start.__doc__ = original.__name__, original.__qualname__, original.__doc__
        threading.Thread.start = start
        for t in threading.enumerate():  # alive before any student code: the sandbox's own
            started[t.ident] = mine[t.ident] = False


    # ---------------------------------------------------------------- torch's op records
    def watch_op_records(self):
        """Wrap the functions that switch torch's op records off or stop, start or swap a profiler
        session (see the module docstring), in every loaded torch module that holds them."""
        import torch
        import torch._C._autograd as native
        me = self
        holders = [m for n, m in list(sys.modules.items())
                   if m is not None and (n == "torch" or n.startswith("torch.")) and hasattr(m, "__dict__")]

        def wrap(name, off, what):
            original = getattr(native, name, None)
            if original is None:
                return

            def wrapper(*args, **kwargs):
                if off(args, kwargs):
                    where = me._is_student(sys._getframe(1), direct=False)
                    if where is not None and len(me._events) < MAX_EVENTS:
                        me._events.append((f"torch.autograd.{name}", f"({what})", where[0], where[1]))
                return original(*args, **kwargs)

            wrapper.__name__ = wrapper.__qualname__ = name
            wrapper.__doc__ = original.__doc__
            for owner in [native, torch.autograd, *holders]:
                if vars(owner).get(name) is original:
                    setattr(owner, name, wrapper)
                    if (owner, name) not in self._wrapped:
                        self._wrapped.append((owner, name))

        records_off = "switches torch's op records off"
        wrap("_enable_record_function", lambda a, k: not (a[0] if a else k.get("enable", True)), records_off)
        wrap("_clear_callbacks", lambda a, k: True, records_off)
        for name in ("_enable_profiler", "_enable_profiler_legacy", "_disable_profiler", "_disable_profiler_legacy",
                     "_prepare_profiler", "_toggle_collection_dynamic", "_add_metadata_json"):
            wrap(name, lambda a, k: True, "starts, stops or changes a profiler session, whose records the grader reads")


_GONE = object()
#: a module's own dict (the member of ModuleType itself: a subclass's __dict__ property is not run)
_MODULE_DICT = types.ModuleType.__dict__["__dict__"]


def _detail(event, args) -> str:
    try:
        if event == "object.__getattr__" or event in ("object.__setattr__", "object.__delattr__"):
            return f"{type(args[0]).__name__}.{args[1]}"
        if event == "compile":
            return f"of {str(args[1])[:60]!r}" if len(args) > 1 else ""
        if event == "import":
            return str(args[0])[:80]
        if event.startswith("ctypes.") or event in ("os.system", "subprocess.Popen", "os.exec"):
            return str(args[0])[:60] if args else ""
    except Exception:  # noqa: BLE001
        return ""
    return ""


_INSTALLED = None


def install(blocked=None, guarded=()) -> Observers:
    """Install the observers (once per process) before any student code runs; take the baseline.
    ``guarded``: more ``(owner, name)`` pairs whose objects must stay as they are now (the harness's
    guards on torch's compilers, :func:`coursekit.checks.transformer.block_layer_compilers`)."""
    global _INSTALLED
    if _INSTALLED is None:
        obs = Observers()
        sys.addaudithook(obs.hook)
        obs.watch_threads()
        obs.watch_op_records()
        _INSTALLED = obs
    _INSTALLED.take_baseline(blocked, guarded)
    dynamo = sys.modules.get("torch._dynamo.config")
    _INSTALLED._eager = dynamo is not None and getattr(dynamo, "disable", None) is True
    return _INSTALLED
