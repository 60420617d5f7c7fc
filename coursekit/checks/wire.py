"""What a probe's result may be made of, and how it crosses a process boundary.

A probe returns tensors, numbers, strings, booleans and ``None``, nested in dicts (string keys)
and lists. :func:`encode` turns that into JSON-able data plus numpy arrays, refusing anything
else: a tensor subclass that overrides ``__eq__`` or lies about its shape is rejected here,
not trusted. :func:`decode` rebuilds torch tensors with their original dtype (bfloat16 and
float16 travel as exact float32 copies).

Between the grading sandbox and the grader, messages travel as *frames* on a pipe
(:func:`pack` / :func:`unpack`)::

    <head length: u32 LE> <body length: u32 LE> <head: JSON> <body: raw array bytes>

The head is ``{"msg": <JSON>, "arrays": [[numpy dtype str, shape], ...]}``; the body is the
arrays' bytes back to back. The reader learns a frame's size from its first 8 bytes, before it
reads or allocates anything, so it can refuse an oversized frame outright; nothing is compressed
and nothing is unpickled; every array's declared size must add up to the body exactly.
:func:`dump`/:func:`load` keep one record in a file, in the same format.
"""
from __future__ import annotations

import json
import math
import struct

import numpy as np
import torch

#: dtypes a probe may return; anything else is reported, not decoded
DTYPES = {str(d): d for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16,
                              torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)}
MAX_ELEMENTS = 50_000_000  # in one record, all arrays together
MAX_STRING = 4000
#: numpy dtypes an array on the wire may have (what :func:`encode` produces)
WIRE_DTYPES = frozenset(np.dtype(t).str for t in ("<f8", "<f4", "<i8", "<i4", "<i2", "i1", "u1", "?"))
HEAD_MAX = 1 << 20  # one frame's JSON head
FRAME_MAX = 64 << 20  # one frame's arrays; the grader also bounds a submission's frames together


class WireError(ValueError):
    """A probe result (or a file claiming to be one) that is not plain data."""


def encode(value, _arrays=None, _count=None):
    """Plain-data form of a probe result; arrays go into ``{"__tensor__": i}`` slots."""
    top = _arrays is None
    arrays = [] if top else _arrays
    count = [0] if _count is None else _count

    def enc(v, depth=0):
        if depth > 20:
            raise WireError("probe result nested too deeply")
        t = type(v)
        if v is None or t is bool or t is int or t is float:
            return v
        if t is str:
            return v[:MAX_STRING]
        if t is dict:
            return {"__dict__": {str(k): enc(x, depth + 1) for k, x in v.items() if type(k) is str}}
        if t is list or t is tuple:
            return [enc(x, depth + 1) for x in v]
        if t is torch.Tensor or t is torch.nn.Parameter:
            x = torch.Tensor.detach(v)
            if x.layout != torch.strided:
                raise WireError("a sparse or otherwise non-strided tensor came back")
            dtype = str(x.dtype)
            if dtype not in DTYPES:
                return {"__baddtype__": dtype}
            count[0] += x.numel()
            if count[0] > MAX_ELEMENTS:
                raise WireError("the probe result is too large")
            x = x.cpu()
            if x.dtype in (torch.float16, torch.bfloat16):
                x = x.float()
            arrays.append(np.ascontiguousarray(x.numpy()))
            return {"__tensor__": len(arrays) - 1, "dtype": dtype, "shape": list(x.shape)}
        if isinstance(v, torch.Tensor):
            return {"__badtype__": f"a tensor subclass ({t.__name__}), not a plain torch.Tensor"}
        return {"__badtype__": f"{t.__name__}"}

    tree = enc(value)
    if top:
        return {"tree": tree, "arrays": arrays}
    return tree


class BadValue:
    """Stands in for something a probe returned that is not plain data; judges report it."""

    def __init__(self, what: str):
        self.what = what

    def __repr__(self):
        return f"<{self.what}>"


def decode(encoded):
    """Inverse of :func:`encode`: torch tensors (original dtype), numbers, strings, dicts, lists."""
    arrays = encoded["arrays"]

    def dec(v):
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, list):
            return [dec(x) for x in v]
        if isinstance(v, dict):
            if "__dict__" in v:
                return {k: dec(x) for k, x in v["__dict__"].items()}
            if "__tensor__" in v:
                arr = arrays[v["__tensor__"]]
                dtype = DTYPES[v["dtype"]]
                t = torch.from_numpy(np.array(arr, copy=True)).to(dtype)
                if list(t.shape) != list(v["shape"]):
                    raise WireError("tensor shape does not match its array")
                return t
            if "__baddtype__" in v:
                return BadValue(f"a tensor of dtype {v['__baddtype__']}")
            if "__badtype__" in v:
                return BadValue(str(v["__badtype__"]))
        raise WireError(f"unexpected value in a probe result: {type(v).__name__}")

    return dec(encoded["tree"])


def pack(msg, arrays=()) -> bytes:
    """One frame: ``msg`` (JSON-able) and numpy ``arrays`` (the dtypes of :data:`WIRE_DTYPES`)."""
    metas, parts = [], []
    for a in arrays:
        a = np.ascontiguousarray(a)
        if a.dtype.str not in WIRE_DTYPES:
            raise WireError(f"an array of dtype {a.dtype} cannot travel")
        metas.append([a.dtype.str, list(a.shape)])
        parts.append(a.tobytes())
    head = json.dumps({"msg": msg, "arrays": metas}).encode()
    body = b"".join(parts)
    if len(head) > HEAD_MAX or len(body) > FRAME_MAX:
        raise WireError("the message is too large to send")
    return struct.pack("<II", len(head), len(body)) + head + body


def frame_sizes(prefix: bytes, max_body: int = FRAME_MAX) -> tuple[int, int]:
    """(head length, body length) from a frame's first 8 bytes; refuses sizes over the limits."""
    nh, nb = struct.unpack("<II", prefix)
    if nh > HEAD_MAX or nb > max_body:
        raise WireError(f"an oversized message ({nh + nb} bytes)")
    return nh, nb


def unpack(head: bytes, body: bytes):
    """Inverse of :func:`pack` (trusted side): ``(msg, arrays)``, or :class:`WireError`."""
    try:
        meta = json.loads(head)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise WireError("a message head that is not JSON (or nested too deeply)") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("arrays"), list) or "msg" not in meta:
        raise WireError("a malformed message")
    arrays, pos = [], 0
    for spec in meta["arrays"]:
        if not (isinstance(spec, list) and len(spec) == 2 and spec[0] in WIRE_DTYPES
                and isinstance(spec[1], list) and len(spec[1]) <= 16
                and all(type(d) is int and d >= 0 for d in spec[1])):
            raise WireError("a malformed array in a message")
        dtype = np.dtype(spec[0])
        count = math.prod(spec[1])
        size = count * dtype.itemsize
        if pos + size > len(body):
            raise WireError("a message's arrays are larger than its body")
        arrays.append(np.frombuffer(body, dtype=dtype, count=count, offset=pos).reshape(spec[1]).copy())
        pos += size
    if pos != len(body):
        raise WireError("a message's body is larger than its arrays")
    return meta["msg"], arrays


def pack_value(value) -> bytes:
    """A frame holding any probe-style value (tensors nested in dicts and lists)."""
    enc = encode(value)
    return pack({"tree": enc["tree"]}, enc["arrays"])


def unpack_value(head: bytes, body: bytes):
    msg, arrays = unpack(head, body)
    if not isinstance(msg, dict) or "tree" not in msg:
        raise WireError("a malformed message")
    return decode({"tree": msg["tree"], "arrays": arrays})


def record_frame(record: dict, extra: dict | None = None) -> bytes:
    """A probe record (from :func:`coursekit.checks.collect`) as a frame; ``extra`` joins its head."""
    rec = dict(record)
    arrays = []
    if rec.get("ok") and isinstance(rec.get("out"), dict):
        arrays = rec["out"]["arrays"]
        rec["out"] = {"tree": rec["out"]["tree"], "n_arrays": len(arrays)}
    return pack({**(extra or {}), "record": rec}, arrays)


def check_record(rec, arrays: list) -> dict:
    """A record read from a frame, checked strictly: the shape :func:`coursekit.checks.verdict` takes."""
    if not isinstance(rec, dict) or not isinstance(rec.get("ok"), bool):
        raise WireError("not a probe record")
    if rec["ok"]:
        out = rec.get("out")
        if not isinstance(out, dict) or out.get("n_arrays") != len(arrays):
            raise WireError("probe record without its output")
        if sum(a.size for a in arrays) > MAX_ELEMENTS:
            raise WireError("record arrays too large")
        rec = {**rec, "out": {"tree": out.get("tree"), "arrays": arrays}}
        if not isinstance(rec.get("ops", []), list):
            raise WireError("bad ops list")
    elif arrays:
        raise WireError("a failed record with arrays")
    return rec


def dump(record: dict, path: str) -> None:
    """Write a record as one frame in a file (tests, debugging)."""
    with open(path, "wb") as f:
        f.write(record_frame(record))


def load(path: str, max_bytes: int = FRAME_MAX) -> dict:
    """Read a record written by :func:`dump`, strictly: sizes checked before anything is read."""
    with open(path, "rb") as f:
        nh, nb = frame_sizes(f.read(8), max_bytes)
        head, body = f.read(nh), f.read(nb)
        if len(head) != nh or len(body) != nb or f.read(1):
            raise WireError("a record file whose size does not match its header")
    msg, arrays = unpack(head, body)
    if not isinstance(msg, dict):
        raise WireError("not a probe record")
    return check_record(msg.get("record"), arrays)
