"""The check framework itself: what crosses the wire, what the op recorder sees, how errors read."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from coursekit.checks import Check, CheckFailed, collect, verdict, wire
from coursekit.checks.compare import expect_close
from coursekit.checks.ops import NORM_OPS, OpRecorder


def _roundtrip(value, tmp_path):
    path = str(tmp_path / "rec.json")
    wire.dump({"ok": True, "out": wire.encode(value), "ops": []}, path)
    return wire.decode(wire.load(path)["out"])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.bool])
def test_tensors_keep_dtype_and_values_across_the_wire(tmp_path, dtype):
    t = (torch.randn(3, 5) * 100).to(dtype)
    back = _roundtrip({"y": t, "n": 3, "s": "hi", "l": [1.5, None, True]}, tmp_path)
    assert back["y"].dtype == dtype and torch.equal(back["y"], t)
    assert back["n"] == 3 and back["s"] == "hi" and back["l"] == [1.5, None, True]


def test_a_tensor_subclass_that_lies_is_not_trusted(tmp_path):
    class Liar(torch.Tensor):
        def __eq__(self, other):
            return True

        @property
        def shape(self):
            return torch.Size([2, 2])

    liar = torch.zeros(7).as_subclass(Liar)
    back = _roundtrip({"y": liar}, tmp_path)
    with pytest.raises(CheckFailed, match="tensor subclass"):
        expect_close(back["y"], torch.ones(2, 2), what="the output")


def test_arbitrary_objects_become_bad_values(tmp_path):
    class AlwaysEqual:
        def __eq__(self, other):
            return True

    back = _roundtrip({"y": AlwaysEqual()}, tmp_path)
    with pytest.raises(CheckFailed, match="AlwaysEqual"):
        expect_close(back["y"], torch.ones(2), what="the output")


def _frame(head: dict, body: bytes = b"") -> bytes:
    h = json.dumps(head).encode()
    return struct.pack("<II", len(h), len(body)) + h + body


def test_load_refuses_an_object_array(tmp_path):
    path = tmp_path / "rec.bin"
    rec = {"ok": True, "out": {"tree": {"__tensor__": 0, "dtype": "torch.float32", "shape": [1]}, "n_arrays": 1}}
    path.write_bytes(_frame({"msg": {"record": rec}, "arrays": [["|O", [1]]]}, b"\0" * 8))
    with pytest.raises(wire.WireError, match="malformed array"):
        wire.load(str(path))


def test_load_refuses_a_record_that_is_not_one(tmp_path):
    path = tmp_path / "rec.bin"
    path.write_bytes(_frame({"msg": [1, 2, 3], "arrays": []}))
    with pytest.raises(wire.WireError):
        wire.load(str(path))


def test_a_frame_declaring_more_than_the_limit_is_refused_before_it_is_read():
    """1.5 GB declared in 8 bytes: refused from the header, nothing allocated."""
    with pytest.raises(wire.WireError, match="oversized"):
        wire.frame_sizes(struct.pack("<II", 100, 1536 << 20))


def test_arrays_must_add_up_to_the_body_exactly():
    head = json.dumps({"msg": {}, "arrays": [["<f4", [1000, 1000, 1000]]]}).encode()
    with pytest.raises(wire.WireError, match="larger than its body"):
        wire.unpack(head, b"\0" * 64)
    head = json.dumps({"msg": {}, "arrays": [["<f4", [2]]]}).encode()
    with pytest.raises(wire.WireError, match="body is larger"):
        wire.unpack(head, b"\0" * 64)


def test_the_channel_refuses_a_submission_over_its_byte_budget():
    """The grader's reader stops a submission that sends more than its budget, frame by frame."""
    import os
    import threading

    from autograder.referee.protocol import Channel, Closed
    r, w = os.pipe()
    frame = wire.pack({"event": "x"}, [np.zeros(1 << 16, dtype=np.float32)])

    def writer():
        try:
            os.write(w, frame * 3)
        except OSError:
            pass  # the reader closed its end
        os.close(w)

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    ch = Channel(r, budget=2 * len(frame))
    ch.recv_raw(5)
    ch.recv_raw(5)
    with pytest.raises(Closed, match="oversized"):
        ch.recv_raw(5)
    os.close(r)
    t.join(5)


@pytest.mark.parametrize("call", [
    lambda x: F.layer_norm(x, (4,)),
    lambda x: nn.LayerNorm(4)(x),
    lambda x: torch.layer_norm(x, (4,)),
    lambda x: F.rms_norm(x, (4,)),
    lambda x: nn.RMSNorm(4)(x),
    lambda x: torch.ops.aten.native_layer_norm(x, [4], None, None, 1e-5)[0],
], ids=["F.layer_norm", "nn.LayerNorm", "torch.layer_norm", "F.rms_norm", "nn.RMSNorm", "aten"])
def test_op_recorder_sees_builtin_norms_whatever_the_route(call):
    with OpRecorder() as rec:
        call(torch.randn(3, 4))
    assert rec.seen & NORM_OPS


def test_op_recorder_sees_no_norm_in_a_hand_written_one():
    x = torch.randn(3, 4)
    with OpRecorder() as rec:
        (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)
    assert not rec.seen & NORM_OPS


def _check(probe, judge=lambda out: None, forbidden=()):
    return Check("demo", "a demo check", staticmethod(probe), staticmethod(judge), frozenset(forbidden), ("f",))


def test_a_stub_reads_as_not_implemented():
    def f(x):
        raise NotImplementedError()

    rec = collect(_check(lambda ns: ns["f"](1)), {"f": f})
    with pytest.raises(CheckFailed, match="not implemented yet"):
        verdict(_check(lambda ns: None), rec)


def test_exiting_the_process_from_student_code_is_a_failure_not_an_exit():
    def f(x):
        raise SystemExit(0)

    rec = collect(_check(lambda ns: ns["f"](1)), {"f": f})
    assert rec["ok"] is False and rec["error"] == "SystemExit"


def test_a_missing_name_says_which():
    rec = collect(_check(lambda ns: ns["f"](1)), {})
    with pytest.raises(CheckFailed, match="f is not defined"):
        verdict(_check(lambda ns: None), rec)


def test_calling_the_builtin_loses_forbidden_checks():
    chk = _check(lambda ns: {"y": ns["f"](torch.randn(2, 4))}, forbidden=NORM_OPS)
    rec = collect(chk, {"f": lambda x: F.layer_norm(x, (4,))})
    with pytest.raises(CheckFailed, match="calls torch's own"):
        verdict(chk, rec)


def test_suspects_name_the_mistake():
    x = torch.randn(4, 8)
    right = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)
    wrong = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=True, keepdim=True) + 1e-5)
    with pytest.raises(CheckFailed, match="divide by D"):
        expect_close(wrong, right, what="LayerNorm(x)", suspects={"the variance is unbiased: divide by D": wrong})


def test_a_message_head_nested_too_deeply_is_a_wire_error():
    """json's recursion limit must not escape as RecursionError into the grader."""
    head = json.dumps({"msg": None, "arrays": []}).replace("null", "[" * 100_000 + "]" * 100_000).encode()
    with pytest.raises(wire.WireError, match="nested too deeply"):
        wire.unpack(head, b"")


def test_benchmarks_are_the_checks_that_declare_the_kind():
    """The grader recognises a benchmark by the check's declared kind, and every benchmark has a
    limit and a served version (timed from outside the sandbox)."""
    from coursekit.checks import KINDS, load_all
    from coursekit.checks.benchmark import TYPICAL
    from coursekit.checks.served import SERVED
    checks = load_all()
    assert all(c.kind in KINDS for c in checks.values())
    bench = {gid for gid, c in checks.items() if c.kind == "benchmark"}
    assert bench == set(TYPICAL) == set(SERVED)
