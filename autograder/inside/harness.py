"""Runs INSIDE the sandbox: execute one submission's cells and probe the graded tests, one step
at a time, as the grader asks (the protocol: :mod:`autograder.referee.protocol`).

Started as ``python /grader/harness.py REPLY_FD``. The job pipe (stdin) brings the job's settings
as one JSON line, then one step per line::

    {"op": "step", "n": 0, "kind": "cell", "label": ..., "source": ...}
    {"op": "step", "n": 5, "kind": "test", "grade_id": ..., "index": i, "served": false, "count_seed": s}
    {"op": "step", "n": 6, "kind": "test", "grade_id": ..., "index": i, "refereed": true, "needs": [...],
     "watch": [...]}
    {"op": "end"}

Each step is answered with one frame on the reply pipe (``REPLY_FD``). Cells run in IPython's
``InteractiveShell`` (magics work; no Jupyter kernel, no zmq): an error in a cell is reported and
execution goes on, as with ``nbgrader autograde --ExecutePreprocessor.allow_errors``. A test step
never runs code from the notebook: the harness calls ``coursekit.checks.collect`` on the namespace as
it stands and sends the record. Nothing here decides a score: the grader judges the records and
treats anything missing, malformed or out of turn as a failure.

A *refereed* test (``"refereed": true``: every test but the benchmarks) is probed by the grader itself
(``autograder/referee/calls.py``): this process says ``ready`` and answers the grader's calls, each one
of the course's remotable helpers on concrete inputs (:func:`_answer`), until ``end``. The hidden
checks' code, case tables and judges never come here.

Before any student code runs, the harness moves its pipes to high descriptor numbers, points
stdin at ``/dev/null`` and makes torch's built-in normalization kernels raise for the exercises
that forbid them.
"""
import json
import os
import signal
import sys


class _CappedText:
    """sys.stdout/sys.stderr for student code: passes the first ``cap`` characters, drops the rest."""

    def __init__(self, stream, cap=1 << 20):
        self.stream, self.left = stream, cap
        self.encoding = getattr(stream, "encoding", "utf-8")

    def write(self, s):
        s = str(s)
        if self.left > 0:
            part = s[: self.left]
            self.left -= len(part)
            try:
                self.stream.write(part)
            except Exception:  # noqa: BLE001
                pass
        return len(s)

    def flush(self):
        try:
            self.stream.flush()
        except Exception:  # noqa: BLE001
            pass

    def isatty(self):
        return False

    def fileno(self):
        return self.stream.fileno()


class CellTimeout(Exception):
    pass


class Lines:
    """JSON lines from the job pipe."""

    def __init__(self, fd):
        self.fd, self.buf = fd, b""

    def next(self):
        while b"\n" not in self.buf:
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)


def _writable_full(paths=("/home/student", "/tmp", "/dev/shm")) -> bool:
    """Whether a writable area of the sandbox is (nearly) full: the grader says so on the row."""
    for p in paths:
        try:
            st = os.statvfs(p)
        except OSError:
            continue
        if st.f_blocks and st.f_bavail * 50 < st.f_blocks:  # under 2% left
            return True
    return False


class _WorkingFolder:
    """A finder, last on ``sys.meta_path``, for the modules the grader's plan says the notebook's
    ``%%writefile NAME.py`` cells write into the working folder, and for no other name: a file
    written there never stands in for a module that is missing or installed."""

    def __init__(self, folder, names):
        self.folder, self.names = folder, frozenset(str(n) for n in names)

    def find_spec(self, name, path=None, target=None):
        if name not in self.names:
            return None
        from importlib.machinery import PathFinder
        return PathFinder.find_spec(name, [self.folder])


def preload():
    """Import what the harness uses before student code runs (the zygote calls this once, before it
    forks a child per submission: :mod:`autograder.inside.zygote`). torch's first ``__torch_function__``
    imports ``torch._dynamo`` (a second or more), so it is imported here too."""
    import torch
    import torch._dynamo  # noqa: F401
    from IPython.core.interactiveshell import InteractiveShell  # noqa: F401
    import coursekit.checks as checks
    from coursekit.checks import wire  # noqa: F401
    from coursekit.checks import ops  # noqa: F401
    checks.load_all()
    try:
        import coursekit.checks.served  # noqa: F401
    except Exception:  # noqa: BLE001 -- main() says so when it matters
        pass
    try:  # first uses that import or build torch's machinery lazily: once here, not in every child
        from coursekit.checks import backward, scaling
        x = torch.ones(2, 2)
        with ops.OpRecorder():
            (x * 2).sum()
        with torch.inference_mode(), backward.ByHand("the harness's warm-up"):
            x * 2
        with scaling._OpCount():
            x + 1
        torch._dynamo.eval_frame.TorchPatcher.patch()
    except Exception:  # noqa: BLE001 -- a warm-up only: the checks themselves say what fails
        pass
    return torch


def main(reply_fd: int, ctrl_fd: int = 0):
    import fcntl
    import resource

    # the pipes move to the top of the descriptor range, closed on exec; the student's stdin reads
    # end-of-file
    high = max(3, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 8)
    reply = fcntl.fcntl(reply_fd, fcntl.F_DUPFD_CLOEXEC, high)
    ctrl = fcntl.fcntl(ctrl_fd, fcntl.F_DUPFD_CLOEXEC, high)
    os.close(reply_fd)
    if ctrl_fd != 0:
        os.close(ctrl_fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    lines = Lines(ctrl)
    job = lines.next()

    sys.stdout = _CappedText(sys.stdout)
    sys.stderr = _CappedText(sys.stderr)

    # Everything the harness needs is imported and looked up before any student code runs.
    import coursekit.checks as checks
    from coursekit.checks import wire
    collect, record_frame, pack, make_check = checks.collect, wire.record_frame, wire.pack, checks.Check

    def send(frame):
        while frame:
            frame = frame[os.write(reply, frame):]

    served = None
    try:
        from coursekit.bench import bench_config
        from coursekit.checks.served import SERVED, Served
        from coursekit.checks.served import reply as served_reply  # (``reply`` is the reply pipe here)
        from coursekit.checks.scaling import Idle, Meter, measure as served_work
        # the device the grader times on (its outside.served_device()); on "cuda" this is where a
        # sandbox that cannot reach the GPU shows, before any student code runs
        cfg = bench_config(job.get("bench_device") or "cpu")
        if cfg.kind == "cuda" and not __import__("torch").cuda.is_available():
            raise RuntimeError("the grader times the benchmarks on its GPU, but the sandbox cannot reach it "
                               "(instructor: are the NVIDIA device files and driver libraries there?)")
        served = ({gid: Served(s.name, s.assignment, s.build, s.torch_module, s.x, s.torch_name)
                   for gid, s in SERVED.items()}, wire.pack_value, checks.Check, checks.CheckFailed, served_reply, cfg,
                  served_work, Meter, Idle())
    except Exception as e:  # noqa: BLE001 -- no served benchmark: the grader says so
        print(f"harness: no served benchmark ({type(e).__name__}: {str(e)[:300]})", file=sys.stderr)
        served = None
    tests, load_error = {}, None
    try:
        checks.load_all()
        # the harness's own copies of each check's parts, taken before any student code runs
        tests = {gid: checks.Check(gid, c.doc, c.probe, c.judge, c.forbidden_ops, c.needs, c.kind)
                 for gid, c in checks.REGISTRY.items()}
    except Exception as e:  # noqa: BLE001 -- the course package itself is broken: every test reports it
        load_error = f"the course's checks could not be imported: {type(e).__name__}: {e}"
    isolated = bool(job.get("isolated"))  # this process has a pid namespace of its own (the sandbox)
    answer_parts = _answer_parts()  # the refereed tests' machinery, looked up before any student code
    blocked = _block_ops(job.get("block_ops") or [])
    if blocked is not None and served is not None:
        # the benchmark is timed from outside (no torch kernel is needed in here): the block is made
        # permanent, so that no student code can lift it, even for the length of one call
        blocked.seal()
    # the observers (autograder/inside/observers.py): an audit hook, thread starts, and the state of
    # everything the probes rely on, as it is now, before any student code runs
    _eager_compile()
    compilers = []
    try:  # torch's compilers refuse torch's transformer layers (their compiled forms run outside Python)
        from coursekit.checks.transformer import block_layer_compilers
        compilers = block_layer_compilers()
    except Exception as e:  # noqa: BLE001 -- the course's checks could not be imported: reported with them
        print(f"harness: torch's compilers not guarded ({type(e).__name__}: {str(e)[:200]})", file=sys.stderr)
    import observers as _observers_module
    obs = _observers_module.install(blocked, compilers)
    sys.modules.pop("observers", None)  # reachable from here on only through the collector or frames (audited)
    del _observers_module

    from IPython.core.interactiveshell import InteractiveShell
    # no output cache: ``_``, ``__``, ``Out[n]`` would hold what a cell showed, a value no code
    # binds (the twenty-second red team's route from a shown ``sys`` to ``_.gettrace``)
    shell = InteractiveShell.instance(colors="NoColor", cache_size=0)
    shell.user_ns["__name__"] = "__main__"
    shell.enable_gui = lambda gui=None: None  # %matplotlib inline: plots go nowhere (MPLBACKEND=Agg)
    # the modules the notebook's %%writefile cells write into its working folder (``helper.py``)
    # import as in Jupyter: those names only, and after every installed module
    if job.get("modules"):
        sys.meta_path.append(_WorkingFolder(os.getcwd(), job["modules"]))
        obs.own_modules = frozenset(str(n) for n in job["modules"])
    cell_s = float(job.get("cell_s", 120))
    error_chars = int(job.get("cell_error_chars", 300))  # autograder.referee.protocol.CELL_ERROR_CHARS
    test_s = float(job.get("test_s", max(cell_s, 120)))
    probed = {}  # name -> the objects the correctness tests found under it (the benchmark times those)

    def alarm(signum, frame):
        raise CellTimeout("the cell (or the test's run of your code) took longer than the time allowed")

    send(pack({"event": "hello"}))
    while True:
        step = lines.next()
        if step is None or step.get("op") != "step":
            break
        n = step["n"]
        if step["kind"] == "cell":
            signal.signal(signal.SIGALRM, alarm)
            signal.setitimer(signal.ITIMER_REAL, cell_s)
            obs.cell(str(step.get("label", ""))[:80])
            try:
                res = shell.run_cell(step["source"], store_history=False)
                err = res.error_before_exec or res.error_in_exec
            except BaseException as e:  # noqa: BLE001 -- a timeout between IPython's own handlers
                err = e
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            send(pack({"event": "cell", "n": n, "full": _writable_full(), "observed": obs.cell_report(),
                       "error": None if err is None else _error_text(err, error_chars)}))
            continue
        gid = step["grade_id"]
        if step.get("refereed"):  # the grader runs this test's probe; this process answers its calls
            for name in step.get("needs") or []:
                probed.setdefault(name, []).append(shell.user_ns.get(name, _MISSING))
            frozen = _stop_others(isolated)  # no process of the notebook's answers for it while it is tested
            beside = _threads_beside()
            before = obs.probe_start(gid)  # the observers watch every call the grader asks for
            signal.signal(signal.SIGALRM, alarm)
            signal.setitimer(signal.ITIMER_REAL, test_s)
            try:
                _answer(shell.user_ns, frozenset(step.get("watch") or ()), lines, send, n, answer_parts)
            except BaseException:  # noqa: BLE001 -- the alarm between requests: the grader sees the end
                pass
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            seen = obs.probe_end(step.get("nonce"))
            _resume(frozen)
            observed = {"events": seen["events"], "problems": before + seen["problems"], "nonce": seen["nonce"],
                        "threads": beside}
            send(record_frame({"ok": False, "error": "CheckFailed", "message": "refereed", "where": ""},
                              {"event": "test", "n": n, "observed": observed}))
            continue
        check = tests.get(gid)
        count_seed = step.get("count_seed") if type(step.get("count_seed")) is int else None
        frozen = _stop_others(isolated)
        beside = _threads_beside()
        before = obs.probe_start(gid)
        bench = check is not None and check.kind == "benchmark"
        if check is None:
            rec = {"ok": False, "error": "CheckFailed", "where": "",
                   "message": load_error or f"no check is registered under grade id {gid!r}"}
            if step.get("served"):
                send(pack({"event": "ready", "n": n, "ok": False}))
        else:
            ns, pinned = shell.user_ns, None
            if bench:
                ns, pinned = _pinned(check, ns, probed)
            else:
                for name in check.needs:
                    probed.setdefault(name, []).append(ns.get(name, _MISSING))
            signal.signal(signal.SIGALRM, alarm)
            signal.setitimer(signal.ITIMER_REAL, test_s)  # a probe (the benchmark) may need longer
            try:
                if pinned:
                    rec = {"ok": False, "error": "CheckFailed", "message": pinned, "where": ""}
                    if step.get("served"):
                        send(pack({"event": "ready", "n": n, "ok": False}))
                elif step.get("served") and served is not None and gid in served[0]:
                    rec = _serve(gid, check, ns, n, lines, send, collect, served, count_seed)
                else:
                    if step.get("served"):  # no served workload here: say so, the grader gets no timing
                        send(pack({"event": "ready", "n": n, "ok": False}))
                    if bench and blocked is not None:
                        blocked._released_by_harness = True  # the observers know it is the harness's doing
                        blocked.release()  # the notebook's benchmark times torch's own op beside the student's
                    if bench:  # the count's inputs are drawn from the grader's seed for this submission
                        probe = check.probe
                        check = make_check(gid, check.doc, lambda ns_, p=probe, s=count_seed: p(ns_, count_seed=s),
                                             check.judge, check.forbidden_ops, check.needs, check.kind)
                    rec = collect(check, ns)
            except BaseException as e:  # noqa: BLE001
                rec = {"ok": False, "error": type(e).__name__, "message": str(e)[:500], "where": ""}
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        seen = obs.probe_end(step.get("nonce"))
        _resume(frozen)
        observed = {"events": seen["events"], "problems": before + seen["problems"], "nonce": seen["nonce"],
                        "threads": beside}
        try:
            frame = record_frame(rec, {"event": "test", "n": n, "observed": observed})
        except Exception as e:  # noqa: BLE001 -- e.g. a probe result that cannot be encoded
            frame = record_frame({"ok": False, "error": type(e).__name__, "message": str(e)[:500], "where": ""},
                                 {"event": "test", "n": n, "observed": observed})
        send(frame)
    send(pack({"event": "bye"}))
    sys.__stdout__.flush()
    os._exit(0)  # no atexit hooks, no finalizers a submission may have registered


def _error_text(err, n):
    """``Type: message`` of a cell's error, at most ``n`` characters (the grader cuts it again)."""
    try:
        text = f"{type(err).__name__}: {str(err)[: n + 1]}"
    except BaseException as e:  # noqa: BLE001 -- a student's exception whose __str__ raises
        text = f"{type(err).__name__}: (its message could not be read: {type(e).__name__})"
    return text if len(text) <= n else text[: n - 1] + "\u2026"


def _pinned(check, ns, probed):
    """The namespace a benchmark sees: the objects the correctness tests checked, not whatever the
    names point to now. ``(ns, None)``, or ``(ns, message)`` when the tests saw different objects."""
    view = dict(ns)
    for name in check.needs:
        seen = probed.get(name)
        if not seen:
            continue
        if any(obj is not seen[0] for obj in seen) and seen[0] is not _MISSING:
            return ns, (f"{name} was redefined between the tests, so no single {name} passed them all: "
                        f"the benchmark times only the {name} that every test checked. Define it once, "
                        "before the tests, and run the notebook top to bottom")
        if seen[0] is _MISSING:  # not defined when the tests ran: neither is it for the benchmark
            view.pop(name, None)
        else:
            view[name] = seen[0]
    return view, None


_MISSING = object()


def _serve(gid, check, ns, n, lines, send, collect, served, count_seed=None):
    """The benchmark, timed by the grader: build the student's module, then answer its requests.

    Requests arrive as JSON lines on the job pipe: ``{"op": "run", "seed": s, "k": k}`` (build the
    input from ``s``, call the module ``k`` times, each call on the previous call's output, and send
    the last output: no two calls see the same input, so nothing can be cached; with ``"count": i``,
    the ``i``-th call runs under :class:`coursekit.checks.scaling.Meter`, from the same line as every
    other call, and its counts go back as ``work``: the grader picks that call from its secret draw
    and leaves its round out of the times), ``{"op": "ping",
    "seed": s}`` (build the input, send zeros of the output's shape: the pipe's cost),
    ``{"op": "end"}``. Replies are frames on the reply pipe. The grader's clock runs from its request
    to the reply, and it checks every output against torch on the same seed, so nothing here can
    make a submission look faster than it is. The torch kernels blocked for the exercise stay
    blocked: only the student's module runs here.
    """
    import torch

    SERVED, pack_value, Check, CheckFailed, reply, cfg, work, Meter, idle = served
    spec = SERVED[gid]
    box = {}

    def build(ns):
        m = spec.build(ns, cfg)
        cls = ns.get(spec.name)
        if isinstance(cls, type) and type(m) is not cls:
            raise CheckFailed(f"the benchmark built a {type(m).__name__}, not your {spec.name}")
        with torch.no_grad():
            y = m(spec.x(0, cfg))
        if type(y) is not torch.Tensor:
            raise CheckFailed(f"{spec.name} returned {type(y).__name__}, not a torch.Tensor")
        box["m"], box["shape"] = m, tuple(y.shape)
        # the verdict: how the work of one call grows with the input, counted here under the observers
        return {"shape": list(y.shape), "work": work(gid, ns, count_seed)}

    rec = collect(Check(gid, check.doc, build, check.judge, needs=check.needs), ns)
    from coursekit.checks import wire
    send(wire.pack({"event": "ready", "n": n, "ok": rec["ok"]}))
    if not rec["ok"]:
        return rec
    torch.set_num_threads(1)
    m = box["m"]
    while True:
        req = lines.next()
        if req is None or req.get("op") == "end":
            return rec
        op = req.get("op")
        try:
            seed = int(req["seed"])
            x = spec.x(seed, cfg)
            meter = None
            if op == "ping":  # the same reply, of zeros: the pipe's cost
                y = torch.zeros(box["shape"], device=cfg.device, dtype=cfg.dtype)
            else:
                y, at = x, req.get("count")
                at = at if type(at) is int else -1
                meter = Meter() if at >= 0 else None
                with torch.no_grad():
                    for i in range(max(1, int(req.get("k", 1)))):
                        with meter if i == at else idle:  # the grader's pick is counted, the others not
                            y = m(y)  # chained: each call's input is the last call's output
            out = {"y": reply(y, seed, cfg) if type(y) is torch.Tensor else y}
            if meter is not None:
                out["work"] = meter.counts
            send(pack_value(out))
        except BaseException as e:  # noqa: BLE001 -- student code may raise anything
            if isinstance(e, (KeyboardInterrupt, CellTimeout)):
                raise
            send(pack_value({"error": f"{type(e).__name__}: {str(e)[:500]}"}))


def _eager_compile() -> None:
    """``torch.compile`` runs the student's code eagerly in here (``TORCH_COMPILE_DISABLE=1`` in the
    sandbox's environment says the same; this covers ``--no-sandbox``). Compiled code behaves
    differently under a dispatch mode: dynamo runs the function eagerly whenever one is on torch's
    mode stack (the benchmark's op counter, the op recorder), and an inductor-compiled sum rounds
    differently from ATen's, so a compiled detector could tell the counted call from the timed
    ones (the eleventh red team's route); and dynamo's guards evaluate strings that the observers
    took for the student's own code, flagging or failing honest compiled code. Eager, every call
    runs the same code, counted or not. The observers see the switch turned back on
    (:meth:`observers.Observers.check`)."""
    try:
        import torch._dynamo.config as dynamo_config
        dynamo_config.disable = True
    except Exception as e:  # noqa: BLE001 -- no dynamo in this torch: nothing compiles anyway
        print(f"harness: torch.compile not switched off ({type(e).__name__}: {str(e)[:200]})", file=sys.stderr)


def _threads_beside() -> list:
    """The live threads the notebook started (coursekit.checks.threads), named for the grader: a
    review reason (autograder.referee.protocol), never a point."""
    try:
        from coursekit.checks.threads import foreign_threads
        return foreign_threads()[:8]
    except Exception:  # noqa: BLE001 -- the course's checks could not be imported: nothing to name
        return []


def _ppid(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return int(f.read().rsplit(b")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _stop_others(isolated):
    """Freeze every other process the notebook started, for a test (``SIGSTOP``; :func:`_resume`
    after it): a process forked in a cell (a DataLoader worker that never returns, say) is outside
    the observers and the op recorder, so nothing it computes may answer for the student's code
    while it is tested. In the sandbox (a pid namespace of its own) that is every process but this
    one, its ancestors and pid 1, orphans included; unsandboxed, this process's descendants only.
    Frozen, not killed: an honest DataLoader's live workers go on after the test (torch raises in
    the notebook when a worker dies, not when it stops). Nothing of the student's compiles in the
    sandbox (:func:`_eager_compile`), so no compile waits on a frozen process. Returns the frozen pids."""
    me = os.getpid()
    keep, p = {1}, me
    while p and p not in keep:
        keep.add(p)
        p = _ppid(p)
    keep.add(me)
    try:
        pids = [int(n) for n in os.listdir("/proc") if n.isdigit()]
    except OSError:
        return
    if not isolated:
        parent = {q: _ppid(q) for q in pids}
        mine, todo = set(), [me]
        while todo:
            q = todo.pop()
            kids = [c for c, pp in parent.items() if pp == q and c not in mine]
            mine.update(kids)
            todo += kids
        pids = sorted(mine)
    frozen = []
    for q in pids:
        if q not in keep:
            try:
                os.kill(q, signal.SIGSTOP)
                frozen.append(q)
            except OSError:
                pass
    return frozen


def _resume(frozen):
    for q in frozen or ():
        try:
            os.kill(q, signal.SIGCONT)
        except OSError:
            pass


def _answer_parts():
    import base64
    import contextlib
    import io

    from coursekit.checks import wire
    from coursekit.checks.ops import OpRecorder
    from coursekit.checks import _modes_in_place
    from coursekit.checks.remote import Answerer, answer_table
    return (base64.b64decode, contextlib.redirect_stdout, contextlib.redirect_stderr, io.StringIO, wire.frame_sizes,
            wire.unpack_value, wire.pack_value, wire.pack, OpRecorder, Answerer, answer_table(), _modes_in_place)


def _answer(ns, watch, lines, send, n, parts):
    """A refereed test (``autograder/referee/calls.py``): say ``ready``, then answer each request
    (``{"op": "ask", "data": <a wire frame, base64>}``) with one frame, until ``{"op": "end"}``.
    Each request runs one of the course's remotable helpers (``coursekit.checks.remote.HELPERS``,
    and nothing else) on the notebook's globals, under the op recorder of the ``watch`` ops,
    prints and warnings kept out; objects that are not data stay here, behind a handle, until the
    end of the test."""
    (b64decode, redirect_stdout, redirect_stderr, StringIO, frame_sizes, unpack_value, pack_value, pack,
     OpRecorder, Answerer, helpers, modes_in_place) = parts
    answerer = Answerer(ns, helpers)
    send(pack({"event": "ready", "n": n, "ok": True}))
    while True:
        req = lines.next()
        if req is None or req.get("op") != "ask":
            return
        frame = b64decode(req["data"])
        nh, nb = frame_sizes(frame[:8])
        request = unpack_value(frame[8:8 + nh], frame[8 + nh:8 + nh + nb])
        with OpRecorder(active=bool(watch)) as rec, redirect_stdout(StringIO()), redirect_stderr(StringIO()):
            reply = answerer.answer(request)
            # the recorder taken off torch's mode stacks while the student's code ran (a test over its
            # time is stopped by an alarm raised wherever the code was, the recorder's watch too: that
            # reply says so, and fails the test by itself)
            if not modes_in_place(rec) and not (reply.get("ok") is False and reply.get("error") == "CellTimeout"):
                reply = {"ok": False, "error": "CheckFailed", "where": "",
                         "message": "the op recorder was taken off torch's mode stack (or its watch on torch's own "
                                    "normalizations' code switched off) while your code ran, so this "
                                    "test cannot see which torch ops ran: it gives no points"}
        reply["ops"] = sorted(rec.seen & watch)
        try:
            out = pack_value(reply)
        except Exception as e:  # noqa: BLE001 -- a value that cannot travel (too large, too deep)
            out = pack_value({"ok": False, "error": type(e).__name__, "message": str(e)[:500], "where": "",
                              "ops": reply["ops"]})
        send(out)


def _block_ops(names):
    """Make torch's own kernels for ``names`` raise (the norm exercises forbid the built-ins); a handle
    whose ``release()`` undoes it, or None. A second line of defence: the verdict does not depend on
    it (the grader scans the source, and judges values)."""
    if not names:
        return None
    from coursekit.checks.ops import block_kernels
    return block_kernels(names)


if __name__ == "__main__":
    os.environ["COURSEKIT_SIDE"] = "sandbox"  # before the checks are imported: coursekit.checks.remote.SANDBOX_SIDE
    main(int(sys.argv[1]))
