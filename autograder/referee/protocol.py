"""The grader's side of the conversation with one sandboxed notebook (the harness's is in
``autograder/inside/harness.py``). Everything the sandbox says arrives here, over pipes, bounded; nothing is read
from files the sandbox could write.

Two pipes:

* the *job pipe* (the harness's stdin): the grader writes JSON lines. First the job's settings,
  then one ``{"op": "step", "n": n, ...}`` at a time (a cell to run or a test to probe), and
  ``{"op": "end"}`` after the last step. The benchmark's requests travel here too
  (:mod:`autograder.referee.clock`).
* the *reply pipe*: the harness writes frames (:func:`coursekit.checks.wire.pack`): ``hello`` once,
  then exactly one answer per step (``cell`` with the error it raised, if any; ``test`` with the
  probe's record; ``ready`` first for a benchmark the grader times), ``bye`` after ``end``.

The grader sends step ``n + 1`` only after the answer to step ``n`` came, in order, naming ``n``.
A run *finished* when every step was answered and ``bye`` came. A submission that exits, crashes,
is killed, or writes anything out of turn stops the conversation there: the steps it did not
answer score nothing, and its row says it did not finish. Every byte read counts against one
budget per submission (:data:`BUDGET`), and no frame over :data:`coursekit.checks.wire.FRAME_MAX` is
read at all.

Code in the sandbox runs in the same process as the harness and could, in principle, write frames
itself. What it could say is limited to what the protocol carries: records (judged here against
torch, so a forged record earns points only by holding the right answer), a cell's error text
(shown in the feedback as what the student's code raised) and the order of events (checked here).
"""
from __future__ import annotations

import json
import os
import secrets
import select
import time
from dataclasses import dataclass, field

from coursekit.checks import wire

BUDGET = 256 << 20  # bytes one submission may send back, all frames together
#: Text a student's code wrote, as the outputs show it. An error raised by a cell: at most
#: CELL_ERROR_CHARS characters each (the harness cuts it there, and so does the grader), at most
#: CELL_ERRORS_CHARS for all of a notebook's together; the errors past that are summarized as
#: "N more cells raised errors" (:func:`bound_cell_errors`: results.json, the feedback page, the
#: autograded notebook). The tail of the submission's stdout and stderr: OUTPUT_TAIL_CHARS, kept
#: in results.json only (for the instructor; never in the feedback or the autograded notebook).
CELL_ERROR_CHARS = 300
CELL_ERRORS_CHARS = 2000
OUTPUT_TAIL_CHARS = 4000
CELL_LABEL_CHARS = 80  # a cell's label (the grader's words, or the first line of the student's cell)
STEP_GRACE_S = 30.0  # beyond the harness's own cell alarm, before the grader stops waiting
EXIT_GRACE_S = 10.0  # after ``bye``, before the grader kills what is left of the sandbox


class Closed(Exception):
    """The harness went away (exit, crash, time limit) or broke the protocol."""


class Channel:
    """Frames from the harness's reply pipe, read with deadlines, a size limit per frame and a
    byte budget for the whole submission."""

    def __init__(self, fd: int, budget: int = BUDGET):
        self.fd, self.left = fd, budget
        self.buf = bytearray()

    def _read(self, n: int, deadline: float) -> bytes:
        while len(self.buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            r, _, _ = select.select([self.fd], [], [], min(left, 5.0))
            if not r:
                continue
            chunk = os.read(self.fd, min(1 << 20, max(n - len(self.buf), 1 << 16)))
            if not chunk:
                raise Closed("the notebook's process closed the pipe")
            self.buf += chunk
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    def recv_raw(self, timeout: float) -> tuple[object, list]:
        """``(msg, arrays)`` of the next frame."""
        deadline = time.monotonic() + timeout
        try:
            nh, nb = wire.frame_sizes(self._read(8, deadline), min(wire.FRAME_MAX, max(self.left, 0)))
        except wire.WireError as e:
            raise Closed(f"{e}, over what one submission may send back") from None
        self.left -= 8 + nh + nb
        head, body = self._read(nh, deadline), self._read(nb, deadline)
        try:
            return wire.unpack(head, body)
        except wire.WireError as e:
            raise Closed(f"a malformed message came back ({e})") from None

    def recv(self, timeout: float):
        """The next frame as a value (tensors rebuilt): what :func:`coursekit.checks.wire.pack_value` sent."""
        msg, arrays = self.recv_raw(timeout)
        try:
            if not isinstance(msg, dict) or "tree" not in msg:
                raise wire.WireError("not a value")
            return wire.decode({"tree": msg["tree"], "arrays": arrays})
        except Exception as e:  # noqa: BLE001 -- anything odd from the sandbox: a protocol error
            raise Closed(f"a malformed message came back ({type(e).__name__})") from None


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "\u2026"


def bound_cell_errors(errors) -> list[dict]:
    """``errors`` (``[{"label", "error"}]``) as the outputs show them: each error cut at
    :data:`CELL_ERROR_CHARS`, all of them within :data:`CELL_ERRORS_CHARS`, the ones past that
    counted in a last entry ``{"label": "more errors", "error": "N more cells raised errors",
    "more": N}``. Bounding a bounded list changes nothing, so every place that shows them applies it."""
    out, used, more = [], 0, 0
    for e in errors if isinstance(errors, list) else []:
        if not isinstance(e, dict):
            continue
        if "more" in e:  # the summary of an earlier bound
            more += e["more"] if type(e["more"]) is int and e["more"] > 0 else 1
            continue
        err = _clip(str(e.get("error", "")), CELL_ERROR_CHARS)
        if more or used + len(err) > CELL_ERRORS_CHARS:
            more += 1
            continue
        used += len(err)
        out.append({"label": _clip(str(e.get("label", "")), CELL_LABEL_CHARS), "error": err})
    if more:
        out.append({"label": "more errors", "error": f"{more} more cell{'s' if more > 1 else ''} raised "
                    f"error{'s' if more > 1 else ''} (not shown)", "more": more})
    return out


MAX_OBSERVED = 5  # observations kept per test (each bounded to OBSERVED_CHARS)
OBSERVED_CHARS = 200


def _texts(v) -> list:
    """A list of short strings from the sandbox (anything else: nothing)."""
    if not isinstance(v, list):
        return []
    return [_clip(x, OBSERVED_CHARS) for x in v[:MAX_OBSERVED * 4] if isinstance(x, str)]


def observations(obs, nonce) -> list:
    """The reasons a test's probe cannot be trusted, in the grader's words, from what the observers
    inside reported with the test's reply (:mod:`autograder.inside.observers`): the student's audit
    events during the probe, an observer or guard found replaced or off, and the nonce this side
    sent with the step, which must come back through the audit hook."""
    if not isinstance(obs, dict):
        return ["the observers' report did not come back with this test"]
    out = [f"your code did {e} while this test ran" for e in _texts(obs.get("events"))]
    out += [f"{p}" for p in _texts(obs.get("problems"))]
    if nonce is not None and obs.get("nonce") != nonce:
        out.append("the grader's audit check did not answer for this test (its nonce did not come back "
                   "through the audit hook)")
    return list(dict.fromkeys(out))[:MAX_OBSERVED]


def _threads_beside(tr, obs, step) -> None:
    """Threads the notebook started that were alive while a test ran (the harness names them): work
    in another thread is not what the in-process observers watch, so a person should look. A review
    reason, once per submission; it costs no point."""
    names = [str(t)[:120] for t in (obs.get("threads") or [])][:4] if isinstance(obs, dict) and \
        isinstance(obs.get("threads"), list) else []
    if names and not any(e.startswith("threads your notebook started") for e in tr.cell_events):
        tr.cell_events.append(f"threads your notebook started were alive while the tests ran ({', '.join(names)}, "
                              f"first at {str(step.get('grade_id', ''))[:60]}): work done in another thread is "
                              "not what the grader's observers watch")


def send(stdin, obj) -> None:
    try:
        stdin.write((json.dumps(obj) + "\n").encode())
        stdin.flush()
    except (BrokenPipeError, OSError, ValueError):
        raise Closed("the notebook's process is gone") from None


@dataclass
class Transcript:
    """What the conversation established (all decided on the grader's side)."""

    answered: int = 0  # steps answered, in order
    finished: bool = False  # every step answered and ``bye`` received
    records: dict = field(default_factory=dict)  # test index -> record (checked shape)
    served: dict = field(default_factory=dict)  # test index -> benchmark measurement or message
    cell_errors: list = field(default_factory=list)  # {"label", "error"}, bounded: bound_cell_errors
    disk_full: bool = False  # a cell ended with the sandbox's writable space full
    broke: str = ""  # why the conversation stopped early, in the grader's words
    #: what the observers inside saw during each test's probe (test index -> reasons, the grader's
    #: words; autograder/inside/observers.py): that test scores nothing
    observed: dict = field(default_factory=dict)
    #: the student's audit events in ordinary cells: ``"<event> (<cell>, line <n>)"``, for review
    cell_events: list = field(default_factory=list)
    #: seconds spent, by phase (grader's clock): "start" (sandbox and interpreter up, until
    #: ``hello``), "cells", "tests", "benchmark" (served), "exit" (``end`` until ``bye``)
    timings: dict = field(default_factory=dict)


def converse(stdin, ch: Channel, steps: list[dict], job: dict, *, step_s: float, measure,
             referee=None) -> Transcript:
    """Drive one notebook through ``steps``; returns when it is done, gone or out of protocol.

    ``measure(grade_id, stdin, ch)``: times a served benchmark (:func:`autograder.referee.clock.measure`).
    ``referee(grade_id, stdin, ch, timeout)``: probes a refereed test from here (a step with
    ``"refereed": true``; :func:`autograder.referee.calls.run`) and returns its record.
    """
    tr = Transcript()
    clock = {"t": time.monotonic()}

    def spent(phase):
        now = time.monotonic()
        tr.timings[phase] = tr.timings.get(phase, 0.0) + (now - clock["t"])
        clock["t"] = now

    def expect(kind, n, timeout):
        msg, arrays = ch.recv_raw(timeout)
        if not (isinstance(msg, dict) and msg.get("event") == kind and msg.get("n") == n):
            what = msg.get("event") if isinstance(msg, dict) else type(msg).__name__
            raise Closed(f"the notebook's process sent {str(what)[:40]!r} out of turn (expected {kind})")
        return msg, arrays

    try:
        send(stdin, dict(job, cell_error_chars=CELL_ERROR_CHARS))  # the harness cuts there too
        expect("hello", None, step_s)
        spent("start")
        for n, step in enumerate(steps):
            nonce = secrets.randbits(48) if step["kind"] == "test" else None
            send(stdin, {"op": "step", "n": n, **step, **({"nonce": nonce} if nonce is not None else {})})
            if step["kind"] == "cell":
                msg, _ = expect("cell", n, step_s)
                if msg.get("error"):
                    tr.cell_errors.append({"label": _clip(str(step.get("label", "")), CELL_LABEL_CHARS),
                                           "error": _clip(str(msg["error"]), CELL_ERROR_CHARS)})
                tr.disk_full = tr.disk_full or msg.get("full") is True
                for ev in _texts(msg.get("observed")):
                    if len(tr.cell_events) < MAX_OBSERVED * 4 and ev not in tr.cell_events:
                        tr.cell_events.append(ev)
                spent("cells")
            else:
                index = step["index"]
                if step.get("refereed"):  # the probe runs here; the notebook answers its calls
                    ready, _ = expect("ready", n, step_s)
                    try:
                        tr.records[index] = referee(step["grade_id"], stdin, ch, step_s)
                    except TimeoutError:
                        tr.records[index] = "this test did not finish: your code did not answer in time"
                        raise
                    except Closed as e:
                        tr.records[index] = f"this test did not finish: {e}"
                        raise
                    send(stdin, {"op": "end"})
                    msg, _ = expect("test", n, step_s)  # what the observers saw while it answered
                    tr.observed[index] = observations(msg.get("observed"), nonce)
                    _threads_beside(tr, msg.get("observed"), step)
                    spent("tests")
                    tr.answered = n + 1
                    continue
                if step.get("served"):
                    ready, _ = expect("ready", n, step_s)
                    if ready.get("ok") is True:
                        try:
                            tr.served[index] = measure(step["grade_id"], stdin, ch)
                        except Closed as e:
                            tr.served[index] = f"the benchmark could not finish: {e}"
                            raise
                        finally:
                            spent("benchmark")
                        send(stdin, {"op": "end"})
                msg, arrays = expect("test", n, step_s)
                spent("tests")
                tr.observed[index] = observations(msg.get("observed"), nonce)
                _threads_beside(tr, msg.get("observed"), step)
                try:
                    tr.records[index] = wire.check_record(msg.get("record"), arrays)
                except wire.WireError as e:
                    tr.records[index] = f"the result of your code could not be read ({e})"
            tr.answered = n + 1
        send(stdin, {"op": "end"})
        expect("bye", None, step_s)
        spent("exit")
        tr.finished = True
    except TimeoutError:
        tr.broke = "no answer from the notebook's process in time"
    except Closed as e:
        tr.broke = str(e)
    tr.cell_errors = bound_cell_errors(tr.cell_errors)
    return tr
