"""The benchmark, timed from outside the submission's process (the grader holds the clock).

When the harness reaches a benchmark cell it builds the student's module, says ``ready`` on the
reply pipe and waits for requests on its job pipe (``autograder/inside/harness.py``, ``_serve``); the conversation around
it is :mod:`autograder.referee.protocol`'s. Here, in the grader:

1. ``ping`` a few times (build the input, send back zeros of the output's shape): the cost of a
   round trip without the student's work. The allowance taken off each round is the fastest
   ping, capped at twice what building and shipping the same data costs in this process plus
   1 ms and at half the round, so a submission that slows its pings down gains nothing worth
   having. The number of calls per round ``k`` comes from the time of 1 and of 5 calls on fresh
   inputs (the slope, free of the round trip), so that a round lasts about ``TARGET_S`` (a first
   call that alone lasts :data:`SLOW_CALL` rounds makes ``k`` 1 without the five);
2. rounds: a fresh seed from :mod:`secrets` each round, unknown in advance. This process builds
   the same input from the seed, times torch's own module on it (``k_torch`` calls, one thread),
   and, interleaved (who goes first alternates), sends ``run`` with the seed and ``k`` and
   stops its clock when the reply arrives. The ``k`` calls are chained (each call's input is the
   previous call's output), and the last output is checked against the same chain computed by
   torch's module from that seed: no work can be skipped or cached, and a wrong output fails the
   benchmark;
3. one more exchange, before the round :func:`count_position` picks from this submission's secret
   draw (or after the last round, when the time budget ends the rounds first): ``run`` with
   ``"count": i``, a call ``i`` of the chain picked from the draw too; the harness runs that call
   under the op and line counter (:class:`coursekit.checks.scaling.Meter`), from the same line as
   every other call, and sends its counts with the output. The output is checked as every round's;
   the exchange's time is left out of the times. The student's process is told nothing before the
   request, and every request looks alike from inside the student's calls: the calls not counted
   run under the same op counter on torch's dispatch stack (:class:`coursekit.checks.scaling.Idle`),
   since a dispatch mode changes what some of torch's composite ops hand back; torch's module and
   the course solution are timed here under it too, so both sides pay its cost per op;
4. the result (seconds per call per round, both sides measured here, and ``full``: the counts of
   that one full-size call) goes to :func:`coursekit.checks.served.served_report`, which prints the
   times for information: the points come from the count of work the harness took
   (:mod:`coursekit.checks.scaling`: the small inputs, grown, and the full-size call against them),
   and from every output being right.

Patching the clock, ``torch.cuda.Event`` or ``coursekit.bench`` inside the sandbox changes nothing:
no time measured there is used.

On a grading host with a CUDA GPU (:func:`served_device`) the workload is the GPU one
(:func:`coursekit.bench.bench_config`: bfloat16, transformer sizes); the sandbox gets the GPU's
device files (:func:`autograder.sandbox.bwrap.gpu_device_binds`), replies carry one number per row
(:func:`coursekit.checks.served.reply`), this process synchronizes the GPU around its own timed
calls, rounds are longer (:data:`TARGET_S`), and ``torch.compile`` of torch's module is timed as
well (reported unavailable when it does not compile). The verdict is still yours against torch eager.
"""
from __future__ import annotations

import contextlib
import hashlib
import secrets
import statistics
import struct
import time

from autograder.referee.protocol import Channel, Closed, send
from coursekit.checks.scaling import LINE_CAP, Idle, capped

#: per device type: one round of the student's calls lasts about this long (torch's: a fifth of it);
#: on a GPU a call takes ~0.1-1 ms and the pipe's round trip more, so rounds are longer there
TARGET_S = {"cpu": 0.05, "cuda": 0.25}
#: per device type: calls per round at most; chained, so values stay well within the tolerance
MAX_K = {"cpu": 200, "cuda": 1000}
#: rounds of timed calls: the times only inform the feedback (the points come from the counts of work),
#: so five, not the nine of when a time decided; each round costs the student's ~TARGET_S plus torch's
#: chain to check the output and torch's (and the solution's) own timed calls
ROUNDS = 5
PINGS = 5
# the output tolerance: coursekit.checks.served.TOL (CPU: 5e-3; chained calls amplify rounding
# differences a little, measured under 5e-5 at 200 calls)
BUDGET_S = 120.0  # the whole benchmark, after which it is judged on the rounds it has (at least 3)
#: a first call slower than this many rounds (TARGET_S each) skips the calibration's five more calls:
#: the rounds are one call each anyway (the times inform the feedback; the points come from counts)
SLOW_CALL = 20
REPLY_S = 60.0  # one reply


def served_device() -> str:
    """``"cuda"`` or ``"cpu"``: where this grader runs the served benchmarks. The same answer for
    the harness (sent in the job), the sandbox's device binds and :func:`measure`; it comes from
    :func:`coursekit.bench.default_device`, the one place that decides."""
    from coursekit import bench
    return bench.default_device().type


def _sync(device) -> None:
    import torch
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _local(fn, x, k: int, moded: bool = True):
    """Seconds per call of ``k`` chained calls ``y = fn(y)`` from ``x`` in this process, and the last
    ``y``; on a GPU the clock starts and stops with the GPU idle (synchronized). ``moded``: under the
    op counter the student's timed calls run under (:class:`coursekit.checks.scaling.Idle`), so that
    both sides pay its cost per op; not for a compiled module (dynamo runs eagerly under a mode)."""
    y = x
    _sync(x.device)
    with Idle() if moded else contextlib.nullcontext():
        t0 = time.perf_counter()
        for _ in range(k):
            y = fn(y)
        _sync(x.device)
        t = time.perf_counter() - t0
    return t / k, y


def _next_k(k: int, t: float, best_per_call: float, kind: str = "cpu") -> int:
    """Calls in the next round: a round of about TARGET_S by the best time per call so far, and at
    least twice as many when this round was short (then the round trip weighed too much in it)."""
    target = TARGET_S[kind]
    want = int(target / max(best_per_call, 1e-7))
    if t < target / 2:
        want = max(want, 2 * k)
    return max(1, min(MAX_K[kind], want))


def count_position(draw: int | None, gid: str) -> tuple[int, float]:
    """(the round before which the full-size call is counted, in ``range(ROUNDS)``; where in that
    exchange's chain of ``k`` calls, as a fraction in [0, 1)), from this submission's secret draw
    (:func:`autograder.referee.calls.draw_for`), or from :mod:`secrets` when there is none."""
    if draw is None:
        return secrets.randbelow(ROUNDS), secrets.randbits(53) / (1 << 53)
    h = hashlib.sha256(f"{draw}\x00{gid}\x00full-size count".encode()).digest()
    return h[0] % ROUNDS, int.from_bytes(h[1:8], "little") / (1 << 56)


def measure(gid: str, stdin, ch: Channel, device: str | None = None, draw: int | None = None):
    """One benchmark's rounds (see the module docstring); a dict, or a str saying what failed.
    ``device``: ``"cpu"`` or ``"cuda"``, the one the harness was told (default :func:`served_device`).
    ``draw``: this submission's secret draw, which picks the call counted at full size."""
    import torch

    from coursekit import bench
    from coursekit.checks import CheckFailed
    from coursekit.checks import wire
    from coursekit.checks.benchmark import LOOP_HINT
    from coursekit.checks.served import SERVED, expect_reply_close, reply

    spec = SERVED.get(gid)
    if spec is None:
        return f"the grader has no served benchmark {gid!r}"
    cfg = bench.bench_config(device or served_device())
    kind, target, max_k = cfg.kind, TARGET_S[cfg.kind], MAX_K[cfg.kind]
    torch.set_num_threads(1)  # like the sandbox: one thread (OMP_NUM_THREADS=1 there)
    t_start = time.monotonic()
    with torch.no_grad():
        mods = {"torch": spec.torch_module(cfg)}
        try:
            from course.solutions import load_reference
            ns = load_reference(spec.assignment)
            if ns:
                mods["course solution"] = spec.build(ns, cfg)
        except Exception:  # noqa: BLE001 -- the course solution column is optional
            pass
        unavailable = {}
        if cfg.compile:  # torch.compile of torch's own module: shown, never judged
            fast, why = bench.compiled(mods["torch"], spec.x(0, cfg))
            if fast is None:
                unavailable["torch.compile"] = why
            else:
                mods["torch.compile"] = fast

        def ask(req):
            t0 = time.perf_counter()
            send(stdin, req)
            try:
                rep = ch.recv(REPLY_S)
            except TimeoutError:
                raise Closed(f"no reply within {REPLY_S:g} s") from None
            return time.perf_counter() - t0, rep

        def student(seed, k, want, count=None):
            """``want``: torch's chain of ``k`` calls from ``seed``, as :func:`reply` sends it;
            ``count``: the call of the chain the harness counts (its counts are kept in ``full``)."""
            t, rep = ask({"op": "run", "seed": seed, "k": k, **({} if count is None else {"count": count})})
            if not isinstance(rep, dict) or "y" not in rep:
                err = rep.get("error") if isinstance(rep, dict) else None
                raise CheckFailed(f"your {spec.name} raised {err}" if err else "no output came back")
            if count is not None:
                w = rep.get("work")
                full.update({k_: w[k_] for k_ in ("ops", "lines", "hot", "lost") if k_ in w} if isinstance(w, dict) else {})
                if type(full.get("lines")) is int and full["lines"] > LINE_CAP:  # the counted call was stopped
                    raise CheckFailed(capped(spec.name, f"one grader-timed call on the full input "
                                                        f"({'x'.join(map(str, full.get('shape', [])))})", LOOP_HINT[gid]))
            expect_reply_close(rep["y"], reply(want, seed, cfg),
                               f"{spec.name} on the benchmark's input (a fresh random input each round)", kind)
            return t

        full = {}  # the counts of one full-size call (count_position), judged by scaling.judge_full
        at_round, at_call = count_position(draw, gid)

        def count_one():
            """The full-size call's count: one exchange like a round's, its time not kept."""
            seed = secrets.randbits(31)
            x = spec.x(seed, cfg)
            k = ks[-1]
            call = min(k - 1, int(at_call * k))
            full.update(shape=list(x.shape), k=k, call=call)
            student(seed, k, _local(mods["torch"], x, k)[1], call)

        try:
            # the pipe's cost: measured, and capped by what the same work costs here
            seed = secrets.randbits(31)
            x0 = spec.x(seed, cfg)
            shape = tuple(reply(mods["torch"](x0), seed, cfg).shape)  # what a reply carries
            est = []
            for _ in range(3):
                t0 = time.perf_counter()
                xx = spec.x(secrets.randbits(31), cfg)
                _sync(cfg.device)
                f = wire.pack_value({"y": torch.zeros(shape)})
                nh = struct.unpack("<II", f[:8])[0]
                wire.unpack_value(f[8:8 + nh], f[8 + nh:])
                est.append(time.perf_counter() - t0)
                del xx
            pings = [ask({"op": "ping", "seed": secrets.randbits(31)})[0] for _ in range(PINGS)]
            # the fastest ping: load only adds time, and rounds are compared fastest against fastest
            allowance = min(min(pings), 2 * min(est) + 1e-3)

            def per_call(t, k):  # the allowance never takes more than half a round
                return max(t - allowance, t / 2) / k

            # calibration: how many calls make a round of about TARGET_S on each side
            seed = secrets.randbits(31)
            x = spec.x(seed, cfg)
            k_local = {}
            for name, m in mods.items():
                _local(m, x, 2, name != "torch.compile")
                one, _ = _local(m, x, 1, name != "torch.compile")
                k_local[name] = max(1, min(max_k, int(target / 5 / max(one, 1e-7))))
            t1 = student(seed, 1, mods["torch"](x))
            if per_call(t1, 1) > SLOW_CALL * target:
                # one call alone outlasts many rounds' worth: a round is one call whatever five more
                # would measure, so they are not made (a loop over 8192 matrices spent a minute here)
                one = per_call(t1, 1)
            else:
                seed = secrets.randbits(31)
                x = spec.x(seed, cfg)
                t5 = student(seed, 5, _local(mods["torch"], x, 5)[1])
                # the slope of 1 -> 5 calls is free of the round trip's cost (a hiccup in either: the other)
                one = min((t5 - t1) / 4 if t5 > t1 else float("inf"), per_call(t5, 5))
            k = max(1, min(max_k, int(target / max(one, 1e-7))))

            times = {"yours": [], **{n: [] for n in mods}}
            ks = [k]  # calls per round, adapted after each round

            def rounds(n):
                for r in range(n):
                    if len(times["yours"]) >= 3 and time.monotonic() - t_start > BUDGET_S:
                        return
                    if r == at_round and not full:
                        count_one()
                    seed = secrets.randbits(31)
                    x = spec.x(seed, cfg)
                    order = ["yours", *mods] if r % 2 else [*mods, "yours"]
                    k = ks[-1]
                    want = _local(mods["torch"], x, k)[1]  # the student's k chained calls, by torch
                    for name in order:
                        if name == "yours":
                            t = student(seed, k, want)
                            times["yours"].append(per_call(t, k))
                            ks.append(_next_k(k, t, min(times["yours"]), kind))
                        else:
                            times[name].append(_local(mods[name], x, k_local[name], name != "torch.compile")[0])

            rounds(ROUNDS)
            if not full:  # the budget ended the rounds before the picked one
                count_one()
            copy = bench.copy_time(x, repeat=5)
        except CheckFailed as e:
            return str(e)
    return {"grade_id": gid, "times": times, "bytes": x.numel() * x.element_size(), "copy": copy,
            "allowance": allowance, "ping_s": statistics.median(pings), "k": ks[-1], "k_torch": k_local["torch"],
            "rounds": len(times["yours"]), "device_type": kind, "device": cfg.label, "dtype": str(cfg.dtype)[6:],
            "unavailable": unavailable, "full": full}
