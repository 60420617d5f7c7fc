"""Runs INSIDE the sandbox: execute one submission's cells, probe the graded tests, write records.

Started as ``python /grader/harness.py`` with the job as one JSON line on stdin::

    {"steps": [{"kind": "cell", "label": ..., "source": ...},
               {"kind": "test", "grade_id": ..., "index": i}, ...],
     "cell_s": 120, "block_ops": ["native_layer_norm", ...]}

Cells run in order in IPython's ``InteractiveShell`` (magics work; no Jupyter kernel, no zmq):
an error in a cell is logged and execution goes on, as with ``nbgrader autograde
--ExecutePreprocessor.allow_errors``. A test step never runs code from the notebook: the harness
calls ``course.checks.collect`` on the namespace as it stands at that point and writes the record
(``out/test_<i>.json`` + ``.npz``, :func:`course.checks.wire.dump`). Nothing here decides a score:
the parent judges the records, and treats anything missing or malformed as a failure. Whatever a
submission does to this process can only cost it points.
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


def main():
    job = json.loads(sys.stdin.buffer.readline())
    out = os.environ.get("AUTOGRADER_OUT", "/grader/out")
    # The job pipe stays ours; student code reading stdin gets end-of-file.
    ctrl = os.dup(0)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    log = open(os.path.join(out, "log.jsonl"), "a", buffering=1)

    def note(**kw):
        log.write(json.dumps(kw) + "\n")

    sys.stdout = _CappedText(sys.stdout)
    sys.stderr = _CappedText(sys.stderr)

    # Everything the harness needs is imported and looked up before any student code runs.
    import course.checks as checks
    from course.checks import wire
    collect, dump = checks.collect, wire.dump
    serve_fd = job.get("serve_fd")  # the grader times the benchmark from outside (see _serve)
    served = None
    if isinstance(serve_fd, int):
        try:
            from course.checks.benchmark import SERVED, pack_frame
            served = (SERVED, pack_frame, checks.Check, checks.CheckFailed)
        except Exception:  # noqa: BLE001 -- no served benchmark: the grader says so
            served = None
    tests, load_error = {}, None
    try:
        checks.load_all()
    except Exception as e:  # noqa: BLE001 -- the course package itself is broken: every test reports it
        load_error = f"the course's checks could not be imported: {type(e).__name__}: {e}"
    for step in job["steps"]:
        if step["kind"] == "test" and load_error is None:
            try:
                tests[step["grade_id"]] = checks.get(step["grade_id"])
            except Exception:  # noqa: BLE001
                pass
    _block_ops(job.get("block_ops") or [])

    from IPython.core.interactiveshell import InteractiveShell
    shell = InteractiveShell.instance(colors="NoColor")
    shell.user_ns["__name__"] = "__main__"
    cell_s = float(job.get("cell_s", 120))
    test_s = float(job.get("test_s", max(cell_s, 120)))

    def alarm(signum, frame):
        raise CellTimeout("the cell (or the test's run of your code) took longer than the time allowed")

    note(event="start")
    for i, step in enumerate(job["steps"]):
        if step["kind"] == "cell":
            signal.signal(signal.SIGALRM, alarm)
            signal.setitimer(signal.ITIMER_REAL, cell_s)
            try:
                res = shell.run_cell(step["source"], store_history=False)
                err = res.error_before_exec or res.error_in_exec
            except BaseException as e:  # noqa: BLE001 -- a timeout between IPython's own handlers
                err = e
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            note(event="cell", i=i, label=step.get("label", ""),
                 error=None if err is None else f"{type(err).__name__}: {str(err)[:500]}")
        elif step["kind"] == "test":
            gid = step["grade_id"]
            check = tests.get(gid)
            if check is None:
                rec = {"ok": False, "error": "CheckFailed", "where": "",
                       "message": load_error or f"no check is registered under grade id {gid!r}"}
            elif served is not None and gid in served[0]:
                signal.signal(signal.SIGALRM, alarm)
                signal.setitimer(signal.ITIMER_REAL, test_s)
                try:
                    rec = _serve(gid, check, shell.user_ns, step["index"], ctrl, serve_fd, collect, served)
                except BaseException as e:  # noqa: BLE001
                    rec = {"ok": False, "error": type(e).__name__, "message": str(e)[:500], "where": ""}
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            else:
                if gid.endswith("_benchmark") and _LIB is not None:
                    _LIB._destroy()  # the benchmark times torch's own op beside the student's
                signal.signal(signal.SIGALRM, alarm)
                signal.setitimer(signal.ITIMER_REAL, test_s)  # a probe (the benchmark) may need longer
                try:
                    rec = collect(check, shell.user_ns)
                except BaseException as e:  # noqa: BLE001
                    rec = {"ok": False, "error": type(e).__name__, "message": str(e)[:500], "where": ""}
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
            try:
                dump(rec, os.path.join(out, f"test_{step['index']}.json"))
            except Exception as e:  # noqa: BLE001 -- e.g. a probe result that cannot be encoded
                dump({"ok": False, "error": type(e).__name__, "message": str(e)[:500], "where": ""},
                     os.path.join(out, f"test_{step['index']}.json"))
            note(event="test", i=i, grade_id=gid)
    note(event="done")
    log.close()
    sys.__stdout__.flush()
    os._exit(0)  # no atexit hooks, no finalizers a submission may have registered


def _serve(gid, check, ns, index, ctrl, reply, collect, served):
    """The benchmark, timed by the grader: build the student's module, then answer its requests.

    Requests arrive as JSON lines on the job pipe (``ctrl``): ``{"op": "run", "seed": s, "k": k}``
    (build the input from ``s``, call the module ``k`` times, each call on the previous call's
    output, and send the last output: no two calls see the same input, so nothing can be cached),
    ``{"op": "ping", "seed": s}`` (build the input, send zeros of the output's shape: the pipe's
    cost), ``{"op": "end"}``. Replies are frames on ``reply`` (``pack_frame``). The grader's clock
    runs from its request to the reply, and it checks every output against torch on the same seed,
    so nothing here can make a submission look faster than it is. The torch kernels blocked for the
    exercise stay blocked: only the student's module runs here.
    """
    import torch

    SERVED, pack_frame, Check, CheckFailed = served
    spec = SERVED[gid]
    box = {}

    def build(ns):
        m = spec.build(ns)
        with torch.no_grad():
            y = m(spec.x(0))
        if type(y) is not torch.Tensor:
            raise CheckFailed(f"{spec.name} returned {type(y).__name__}, not a torch.Tensor")
        box["m"], box["shape"] = m, tuple(y.shape)
        return {"shape": list(y.shape)}

    rec = collect(Check(gid, check.doc, build, check.judge, needs=check.needs), ns)

    def send(obj):
        data = pack_frame(obj)
        while data:
            data = data[os.write(reply, data):]

    send({"event": "ready", "grade_id": gid, "index": index, "ok": rec["ok"]})
    if not rec["ok"]:
        return rec
    torch.set_num_threads(1)
    m = box["m"]
    buf = b""
    while True:
        while b"\n" not in buf:
            chunk = os.read(ctrl, 4096)
            if not chunk:
                return rec
            buf += chunk
        line, buf = buf.split(b"\n", 1)
        req = json.loads(line)
        op = req.get("op")
        if op == "end":
            return rec
        try:
            x = spec.x(int(req["seed"]))
            if op == "ping":
                y = torch.zeros(box["shape"])
            else:
                y = x
                with torch.no_grad():
                    for _ in range(max(1, int(req.get("k", 1)))):
                        y = m(y)  # chained: each call's input is the last call's output
            send({"y": y})
        except BaseException as e:  # noqa: BLE001 -- student code may raise anything
            if isinstance(e, (KeyboardInterrupt, CellTimeout)):
                raise
            send({"error": f"{type(e).__name__}: {str(e)[:500]}"})


def _block_ops(names):
    """Make torch's own kernels for ``names`` raise (the norm exercises forbid the built-ins).

    A second line of defence only: the verdict does not depend on it (the parent scans the source).
    """
    if not names:
        return
    import warnings

    import torch

    def refuse(name):
        def kernel(*args, **kwargs):
            raise RuntimeError(f"torch's built-in {name} is switched off while grading this exercise: "
                               "compute it from the formula")
        return kernel

    global _LIB
    _LIB = torch.library.Library("aten", "IMPL")  # kept alive: dropping it unregisters the kernels
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in names:
            for key in ("CPU", "CompositeImplicitAutograd"):
                try:
                    _LIB.impl(name, refuse(name), key)
                    break
                except Exception:  # noqa: BLE001 -- op absent in this torch, or no kernel under that key
                    continue


_LIB = None

if __name__ == "__main__":
    main()
