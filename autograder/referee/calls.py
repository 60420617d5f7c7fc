"""The referee: the hidden checks' probes run here, in the grader's process, and the student's
code answers their calls in the sandbox.

When the plan reaches a refereed test (every check of ``course/hidden``, :func:`refereed`), the
grader sends the step; the harness answers ``ready`` and waits. This module then runs the check's
probe (:func:`coursekit.checks.collect`) on a :class:`coursekit.checks.remote.RemoteNamespace`:
each remotable helper the probe calls becomes one request on the job pipe
(``{"op": "ask", "data": <a wire frame, base64>}``) and one reply frame (plain data, or a handle
for an object that stays in the sandbox). ``{"op": "end"}`` closes the test. The record is made
here, from the replies, so the sandbox never holds the check's code, its case table or its judge:
only the concrete inputs of each call, as any probe's inputs are.

The inputs are drawn for this run (:func:`draw`): the seeds of the hidden checks are moved by a
number made from the run's own random seed and the submission, recorded in the row
(``hidden_draw``). The judge, later in this process, rebuilds its expectations with the same draw.
"""
from __future__ import annotations

import base64
import hashlib
import time


from autograder.referee.protocol import Closed, send
from coursekit.checks import wire
from coursekit.checks.remote import RemoteHandle, StudentRaised, namespace, request, untag

#: one request's reply: beyond this the student's code is stuck (the harness's own alarm fires first)
ASK_S = 150.0


def hidden_ids() -> frozenset:
    """The grade ids of the hidden checks: those ``course.hidden`` registers."""
    from coursekit.checks import HIDDEN_IDS, load_all
    load_all()
    return frozenset(HIDDEN_IDS)


def refereed(grade_id: str) -> bool:
    """Whether the referee runs this test: every test but the benchmarks (timed by the grader from
    outside, :mod:`autograder.referee.clock`). A hidden test's probe runs here, a visible one's in the
    sandbox, whole (:func:`refereed_check`)."""
    from coursekit.checks import get
    hidden_ids()
    try:
        return get(grade_id).kind != "benchmark"
    except KeyError:
        return False


def draw(run_seed: str, *parts: str) -> int:
    """The hidden inputs' draw for one submission: from the run's seed and the submission's identity."""
    h = hashlib.sha256("\x00".join((run_seed, *parts)).encode()).digest()
    return int.from_bytes(h[:6], "little") or 1


class Link:
    """The referee's end of one test's requests: the job pipe out, the reply channel in."""

    def __init__(self, stdin, ch, salt: int, deadline: float):
        self.stdin, self.ch, self.salt, self.deadline = stdin, ch, salt, deadline
        self.ops: set = set()  # the watched ops the student's code called, over every request
        self.asked = 0

    def _handle(self, ident):
        if type(ident) is not int or ident < 0:
            raise Closed("a malformed handle came back")
        return RemoteHandle(self, ident)

    def ask(self, helper: str, args: list, kwargs: dict):
        frame = wire.pack_value(request(helper, args, kwargs, self.salt))
        send(self.stdin, {"op": "ask", "data": base64.b64encode(frame).decode()})
        self.asked += 1
        left = max(1.0, min(ASK_S, self.deadline - time.monotonic()))
        reply = self.ch.recv(left)
        if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
            raise Closed("a malformed reply came back")
        ops = reply.get("ops") or []
        if not (isinstance(ops, list) and all(isinstance(o, str) for o in ops)):
            raise Closed("a malformed reply came back")
        self.ops.update(o[:80] for o in ops[:200])
        if not reply["ok"]:
            error, message, where = (str(reply.get(k, ""))[:2000] for k in ("error", "message", "where"))
            if error == "CheckFailed":
                from coursekit.checks import CheckFailed
                raise CheckFailed(message)
            raise StudentRaised(error or "Error", message, where)
        try:
            return untag(reply.get("value"), self._handle)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise Closed(f"a malformed reply came back ({type(e).__name__})") from None


def run(grade_id: str, stdin, ch, timeout: float, *, salt: int = 0) -> dict:
    """Probe ``grade_id`` from here, the student's code answering in the sandbox; the record, as
    :func:`coursekit.checks.collect` makes it. A broken conversation raises :class:`Closed`."""
    from coursekit.checks import collect
    from coursekit.checks.seeded import salted

    salt = salt if grade_id in hidden_ids() else 0  # a visible check's inputs are the notebook's own
    link = Link(stdin, ch, salt, time.monotonic() + timeout)
    with salted(salt):
        return collect(refereed_check(grade_id), namespace(link))


def refereed_check(grade_id: str):
    """The check as the referee runs it: a hidden check's own probe, here (its calls of the student's
    code go to the sandbox); a visible check's probe, whole, in the sandbox (its code is public), its
    result coming back as data. Either way the record, and the verdict, are made here."""
    import dataclasses
    import functools

    from coursekit.checks import get
    from coursekit.checks.remote import whole_probe
    check = get(grade_id)
    if grade_id in hidden_ids():
        return check
    return dataclasses.replace(check, probe=functools.partial(whole_probe, grade_id))


def course_secret(root) -> str:
    """The instructor's secret that, with each submission, draws the hidden checks' inputs: a file
    in the course checkout (``.hidden-draw-secret``, mode 0600, git-ignored), made on first use.
    Students never see the checkout; a regrade of the same notebook draws the same inputs (a grade
    is a function of the submission), a new submission draws new ones."""
    import os
    import secrets
    from pathlib import Path

    path = Path(root) / DRAW_SECRET
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(16) + "\n")
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd) as f:
        return f.read().strip()


#: the file of :func:`course_secret`, in the course checkout
DRAW_SECRET = ".hidden-draw-secret"


def draw_for(secret: str, student_id: str, assignment: str, path) -> int:
    """:func:`draw` for one handed-in file: the secret, the student, the assignment, the file's bytes."""
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    except OSError:
        pass
    return draw(secret, student_id, assignment, digest.hexdigest())
