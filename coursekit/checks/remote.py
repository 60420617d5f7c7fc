"""Probes that run outside the student's process: the *referee* asks, the notebook answers.

A check's probe is ordinary Python that builds inputs and calls the student's code. In the
notebook (the self-check, stock nbgrader) it runs right there, on the notebook's globals. In the
course grader the probes of the hidden checks run in the grader's own process (the referee,
:mod:`autograder.referee.calls`): their code and their case tables never enter the sandbox. The probe
gets a :class:`RemoteNamespace` instead of the notebook's globals, and every function that touches
the student's code is a *remotable helper*: decorated with :func:`remotable`, it runs where the
student's code is. Called with a remote object among its arguments, it sends its name and its
concrete arguments (tensors, numbers, strings, tuples, dtypes) into the sandbox; the harness runs
the same function there, under the op recorder, and sends back plain data, or a handle
(:class:`RemoteHandle`) for an object that is not data (the student's class, a module it built).

So the sandbox sees what the student's code is given (inputs, like any probe's), one call at a
time, and nothing else: no seeds table, no case list, no judge, no hidden code. The helpers are
visible course code (this package ships them), registered by name: the harness runs only those.
"""
from __future__ import annotations

import functools
import itertools
import os
from types import MappingProxyType

import torch

#: name -> function: the only code the harness runs when the referee asks
HELPERS: dict = {}


#: this process is the grader's sandbox (the harness: ``autograder/inside/zygote.py`` and
#: ``harness.py`` set ``COURSEKIT_SIDE=sandbox`` before they import the checks). No remote object
#: is real there (handles live in the referee), so a remotable helper is the plain function: a
#: helper that calls another with the notebook's globals never looks through them for a link, and
#: an object the notebook made to look like a handle, with a link of its own, is never asked.
SANDBOX_SIDE = os.environ.get("COURSEKIT_SIDE") == "sandbox"


def remotable(fn):
    """Mark ``fn`` as a helper that touches the student's code: it runs where that code lives.

    Called with a :class:`RemoteNamespace` or :class:`RemoteHandle` among its arguments (at any
    depth), it is sent to the sandbox; otherwise it is an ordinary call. In the sandbox itself
    (:data:`SANDBOX_SIDE`) it is always an ordinary call."""
    name = f"{fn.__module__}.{fn.__qualname__}"
    if name in HELPERS:
        raise ValueError(f"remotable helper {name} registered twice")
    if SANDBOX_SIDE:
        HELPERS[name] = fn
        fn.remote_name = name
        return fn

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        link = _link_of((args, kwargs))
        if link is None:
            return fn(*args, **kwargs)
        return link.ask(name, list(args), kwargs)

    HELPERS[name] = fn
    wrapper.remote_name = name
    return wrapper


class Remote:
    """Something that lives in the sandbox: the referee holds only a handle to it."""

    __slots__ = ("_link", "_id")

    def __init__(self, link, ident):
        object.__setattr__(self, "_link", link)
        object.__setattr__(self, "_id", ident)


class RemoteNamespace(Remote):
    """The notebook's globals, seen from the referee: ``name in ns``, ``ns[name]`` (a handle)."""

    __slots__ = ()

    def __contains__(self, name):
        return bool(self._link.ask("has", [name], {}))

    def __getitem__(self, name):
        return self._link.ask("get", [name], {})

    def get(self, name, default=None):
        return self[name] if name in self else default


class RemoteHandle(Remote):
    """An object in the sandbox that is not plain data (the student's class, a module): it can be
    called, and its methods called (``blk.train()``, ``m.eval()``), in the sandbox."""

    __slots__ = ()

    def __call__(self, *args, **kwargs):
        return self._link.ask("call", [self, *args], kwargs)

    def __getattr__(self, attr):
        if attr.startswith("_"):
            raise AttributeError(attr)
        link = self._link

        def method(*args, **kwargs):
            return link.ask("method", [self, attr, *args], kwargs)

        return method

    def __repr__(self):
        return f"<object {self._id} in the sandbox>"


def namespace(link) -> RemoteNamespace:
    """The notebook's globals, for the referee's probes (id 0 on the notebook's side)."""
    return RemoteNamespace(link, 0)


#: the most values :func:`_link_of` looks at per call: the referee's arguments are a few small lists
#: and dicts, while a notebook's globals, which helpers hand each other in a student's Jupyter or under
#: stock nbgrader, can hold a list of 60,000 nested lists (tests/fixtures/hostile/tracer_dropped_by_recursion.py),
#: whose walk under the checks' profile function took about 2 s per helper call (in the grader's
#: sandbox there is no walk: :data:`SANDBOX_SIDE`)
LINK_WALK_BUDGET = 4096


def _link_of(tree):
    """The link of the first :class:`Remote` in ``tree`` (lists, tuples and dicts, breadth first,
    9 deep at most, :data:`LINK_WALK_BUDGET` values at most), or None."""
    level, budget = [tree], LINK_WALK_BUDGET
    for _ in range(10):  # depth 0 (tree itself) to 9
        nested = []
        for x in level:
            if isinstance(x, Remote):
                return x._link
            if isinstance(x, (list, tuple)):
                nested.append(x)
            elif isinstance(x, (dict, MappingProxyType)):
                nested.append(x.values())
        level = []
        for items in nested:
            level.extend(itertools.islice(items, budget - len(level)))
            if len(level) >= budget:
                break
        budget -= len(level)
        if not level:
            return None
    return None


def is_remote(obj) -> bool:
    return isinstance(obj, Remote)


# --------------------------------------------------------------------------------------------
# Values on the way in and out: tagged trees that coursekit.checks.wire can carry
# --------------------------------------------------------------------------------------------

_DTYPES = {str(d): d for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64,
                               torch.int32, torch.bool)}


def tag(value, handle_of, depth=0):
    """``value`` as dicts, lists and plain tensors only: tuples, dtypes, sizes, tensors that require
    grad and handles get a tag. ``handle_of(obj)``: the id for an object that is not data, or None
    (then it cannot travel: ``TypeError``)."""
    if depth > 20:
        raise TypeError("a value nested too deeply")
    t = type(value)
    if value is None or t in (bool, int, float, str):
        return value
    if t is torch.Tensor or t is torch.nn.Parameter:
        return {"__t__": value, "rg": bool(value.requires_grad)} if value.requires_grad else value
    if isinstance(value, Remote):
        return {"__h__": value._id}
    if isinstance(value, torch.dtype):
        return {"__dtype__": str(value)}
    if t is torch.Size or t is tuple:
        return {"__tuple__": [tag(x, handle_of, depth + 1) for x in value]}
    if t is list:
        return [tag(x, handle_of, depth + 1) for x in value]
    if t is dict or t is MappingProxyType:
        if all(type(k) is str for k in value):
            return {"__d__": {k: tag(v, handle_of, depth + 1) for k, v in value.items()}}
    ident = handle_of(value)
    if ident is None:
        raise TypeError(f"a {t.__name__} cannot travel between the referee and the notebook")
    return {"__h__": ident}


def untag(value, handle, depth=0):
    """Inverse of :func:`tag`; ``handle(id)`` gives the object (or the referee's handle) for an id."""
    if depth > 22:
        raise ValueError("a value nested too deeply")
    if isinstance(value, list):
        return [untag(x, handle, depth + 1) for x in value]
    if isinstance(value, dict):
        if "__t__" in value:
            return value["__t__"].requires_grad_(bool(value.get("rg")))
        if "__h__" in value:
            return handle(value["__h__"])
        if "__dtype__" in value:
            return _DTYPES[value["__dtype__"]]
        if "__tuple__" in value:
            return tuple(untag(x, handle, depth + 1) for x in value["__tuple__"])
        if "__d__" in value:
            return {k: untag(v, handle, depth + 1) for k, v in value["__d__"].items()}
        raise ValueError("an untagged dict")
    return value


@remotable
def manual_seed(ns, seed: int) -> None:
    """``torch.manual_seed(seed)`` where the student's code runs (``ns`` says where: the notebook's
    globals, or the referee's view of them)."""
    torch.manual_seed(seed)


def answer_table() -> dict:
    """What the notebook's side may run for the referee: the remotable helpers, and each registered
    check's own probe under ``probe:<grade id>`` (a visible check's probe is public code: the referee
    asks for it whole, and its result comes back as data). The harness takes this table before any
    student code runs."""
    from coursekit.checks import REGISTRY, load_all
    load_all()
    return {**HELPERS, **{f"probe:{gid}": c.probe for gid, c in REGISTRY.items()}}


def whole_probe(grade_id: str, ns):
    """The probe of a check whose probe runs whole where the student's code is (the referee's side
    of ``probe:<grade id>``; in the notebook, simply that probe)."""
    if isinstance(ns, Remote):
        return ns._link.ask(f"probe:{grade_id}", [ns], {})
    from coursekit.checks import get
    return get(grade_id).probe(ns)


def request(helper: str, args: list, kwargs: dict, salt: int) -> dict:
    """One request of the referee, tagged for the wire: the helper, its concrete arguments, the grad
    mode the referee's probe is in and the draw (:class:`Loopback` and the grader's link alike)."""
    return {"helper": helper, "args": tag(list(args), lambda o: None), "kwargs": tag(dict(kwargs), lambda o: None),
            "grad": torch.is_grad_enabled(), "salt": salt}


class StudentRaised(Exception):
    """The student's code raised in the sandbox: the record says what, as a local raise would."""

    def __init__(self, error: str, message: str, where: str):
        super().__init__(message)
        self.error, self.message, self.where = error, message, where


# --------------------------------------------------------------------------------------------
# The notebook's side: what the harness runs for each request
# --------------------------------------------------------------------------------------------

class Answerer:
    """Runs the referee's requests on the notebook's globals ``ns`` (inside the sandbox).

    ``request``: ``{"helper": name, "args": [...], "kwargs": {...}, "grad": bool, "salt": int}``
    (untagged). The reply: ``{"ok": True, "value": tagged}`` or
    ``{"ok": False, "error", "message", "where"}``. Objects that are not data stay here, in
    :attr:`objects`, under the id their handle carries; they are dropped at the end of the test.
    """

    def __init__(self, ns, helpers=None):
        self.ns, self.objects = ns, {0: ns}  # id 0: the namespace (the referee's RemoteNamespace)
        #: the functions it may run: the harness passes the table as it was before any student code ran
        self.helpers = HELPERS if helpers is None else helpers

    def _handle_of(self, obj):
        ident = len(self.objects) + 1
        self.objects[ident] = obj
        return ident

    def _object(self, ident):
        if type(ident) is not int or ident not in self.objects:
            raise ValueError("a handle to nothing")
        return self.objects[ident]

    def answer(self, request: dict) -> dict:
        from coursekit.checks import CheckFailed, _student_frame
        from coursekit.checks.seeded import salted

        name = request["helper"]
        try:
            args = untag(request["args"], self._object)
            kwargs = untag(request["kwargs"], self._object)
            with salted(int(request.get("salt") or 0)), torch.set_grad_enabled(bool(request.get("grad", True))):
                if name == "has":
                    value = args[0] in self.ns
                elif name == "get":
                    value = self.ns[args[0]]
                elif name == "call":
                    value = args[0](*args[1:], **kwargs)
                elif name == "method":
                    value = getattr(args[0], args[1])(*args[2:], **kwargs)
                elif name in self.helpers:
                    value = self.helpers[name](*args, **kwargs)
                else:
                    raise CheckFailed(f"the grader asked for {name!r}, which the course does not have")
            return {"ok": True, "value": tag(value, self._handle_of)}
        except CheckFailed as e:
            return {"ok": False, "error": "CheckFailed", "message": str(e)[:2000], "where": ""}
        except BaseException as e:  # noqa: BLE001 -- student code may raise anything
            if isinstance(e, KeyboardInterrupt):
                raise
            try:
                message = str(e)[:2000]
            except BaseException:  # noqa: BLE001 -- an exception whose __str__ raises
                message = "(its message could not be read)"
            return {"ok": False, "error": type(e).__name__, "message": message,
                    "where": _student_frame(e.__traceback__)}


class Loopback:
    """A referee's link to a namespace in this same process, through the same encoding as the pipe
    (tests, and the fast loop of the course's own checks): ``collect(check, Loopback(ns).namespace())``
    gives the record the course grader's referee would get from a sandbox running ``ns``."""

    def __init__(self, ns, salt: int = 0, watch=frozenset()):
        self.answerer, self.salt, self.watch = Answerer(ns, answer_table()), salt, frozenset(watch)
        self.ops: set = set()

    def namespace(self) -> RemoteNamespace:
        return namespace(self)

    def ask(self, helper: str, args: list, kwargs: dict):
        from coursekit.checks import CheckFailed, wire
        from coursekit.checks.ops import OpRecorder

        req = _through_wire(wire, request(helper, args, kwargs, self.salt))
        with OpRecorder(active=bool(self.watch)) as rec:
            reply = self.answerer.answer(req)
        reply = _through_wire(wire, dict(reply, ops=sorted(rec.seen & self.watch)))
        self.ops.update(reply["ops"])
        if not reply["ok"]:
            if reply["error"] == "CheckFailed":
                raise CheckFailed(reply["message"])
            raise StudentRaised(reply["error"], reply["message"], reply["where"])
        return untag(reply["value"], lambda i: RemoteHandle(self, i))


def _through_wire(wire, value):
    frame = wire.pack_value(value)
    nh, nb = wire.frame_sizes(frame[:8])
    return wire.unpack_value(frame[8:8 + nh], frame[8 + nh:8 + nh + nb])
