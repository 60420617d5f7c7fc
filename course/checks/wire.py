"""What a probe's result may be made of, and how it crosses a process boundary.

A probe returns tensors, numbers, strings, booleans and ``None``, nested in dicts (string keys)
and lists. :func:`encode` turns that into JSON-able data plus numpy arrays, refusing anything
else: a tensor subclass that overrides ``__eq__`` or lies about its shape is rejected here,
not trusted. :func:`decode` rebuilds torch tensors with their original dtype (bfloat16 and
float16 travel as exact float32 copies). :func:`dump`/:func:`load` write and read one record
as a JSON file and an ``.npz`` beside it, never with pickle.
"""
from __future__ import annotations

import json
import os

import numpy as np
import torch

#: dtypes a probe may return; anything else is reported, not decoded
DTYPES = {str(d): d for d in (torch.float64, torch.float32, torch.float16, torch.bfloat16,
                              torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)}
MAX_ELEMENTS = 50_000_000  # in one record, all arrays together
MAX_STRING = 4000


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


def dump(record: dict, path: str) -> None:
    """Write a record (from :func:`course.checks.collect`) as ``path`` (JSON) and ``path + '.npz'``."""
    rec = dict(record)
    arrays = []
    if rec.get("ok") and "out" in rec:
        arrays = rec["out"]["arrays"]
        rec["out"] = {"tree": rec["out"]["tree"], "n_arrays": len(arrays)}
    with open(path, "w") as f:
        json.dump(rec, f)
    np.savez(path + ".npz", *arrays)


def load(path: str, max_bytes: int = 1 << 31) -> dict:
    """Read a record written by :func:`dump`, strictly: no pickle, bounded size, known keys."""
    if os.path.getsize(path) > 64 << 20:
        raise WireError("record file too large")
    with open(path) as f:
        rec = json.load(f)
    if not isinstance(rec, dict) or not isinstance(rec.get("ok"), bool):
        raise WireError("not a probe record")
    if rec["ok"]:
        out = rec.get("out")
        if not isinstance(out, dict) or not isinstance(out.get("n_arrays"), int):
            raise WireError("probe record without its output")
        npz = path + ".npz"
        if os.path.getsize(npz) > max_bytes:
            raise WireError("record arrays too large")
        with np.load(npz, allow_pickle=False) as z:
            arrays = [z[f"arr_{i}"] for i in range(out["n_arrays"])]
        for a in arrays:
            if a.dtype.kind not in "fiub":
                raise WireError("record array of a non-numeric dtype")
        rec["out"] = {"tree": out["tree"], "arrays": arrays}
        if not isinstance(rec.get("ops", []), list):
            raise WireError("bad ops list")
    return rec
