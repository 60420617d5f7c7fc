"""Timing for the benchmark cells (and for the autograder, which times from outside the sandbox).

    from coursekit.bench import time_fn, time_interleaved
    t = time_fn(lambda: layer(x))                                    # median seconds per call
    runs = time_interleaved({"yours": f, "torch": g})                # seconds per call, per round

On CUDA (when ``torch.cuda.is_available()``) a call is timed with ``torch.cuda.Event`` pairs
after synchronizing; on the CPU with ``time.perf_counter``. Every function is warmed up first,
and a fast one is called several times per sample (``number``) so that a sample lasts at least
about ``target`` seconds. :func:`time_interleaved` takes the samples in rounds, each round
calling every function once in a rotating order, so a burst of load on a shared machine slows
all of them alike; :func:`ratios` then compares them round by round.

:func:`summarize` turns times into a table: median time, effective bandwidth (bytes read plus
bytes written, divided by the time) and that bandwidth as a share of the same device's
bandwidth for a plain copy of a tensor of the same size (:func:`copy_time`).
"""
from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _sample(fn: Callable[[], object], number: int, device: torch.device) -> float:
    """Seconds per call, averaged over ``number`` back-to-back calls."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        _sync(device)
        start.record()
        for _ in range(number):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / number
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - t0) / number


def _calibrate(fn, device, warmup: int, target: float, max_number: int) -> int:
    for _ in range(max(warmup, 1)):
        one = _sample(fn, 1, device)
    return max(1, min(max_number, int(target / max(one, 1e-9))))


def time_interleaved(fns: dict[str, Callable[[], object]], *, repeat: int = 15, warmup: int = 2,
                     target: float = 2e-3, max_number: int = 200,
                     device: torch.device | str | None = None) -> dict[str, list[float]]:
    """``{name: [seconds per call in round 0, round 1, ...]}``; calls run under ``torch.no_grad()``."""
    device = torch.device(device) if device is not None else default_device()
    names = list(fns)
    with torch.no_grad():
        number = {n: _calibrate(fns[n], device, warmup, target, max_number) for n in names}
        out: dict[str, list[float]] = {n: [] for n in names}
        for r in range(repeat):
            k = r % len(names)
            for n in names[k:] + names[:k]:  # rotate who goes first
                out[n].append(_sample(fns[n], number[n], device))
    return out


def time_fn(fn: Callable[[], object], *, repeat: int = 15, warmup: int = 2, target: float = 2e-3,
            device: torch.device | str | None = None) -> float:
    """Median seconds per call of ``fn()``."""
    return statistics.median(time_interleaved({"fn": fn}, repeat=repeat, warmup=warmup,
                                              target=target, device=device)["fn"])


def ratios(times: dict[str, list[float]], num: str, den: str) -> list[float]:
    """Round-by-round ``times[num] / times[den]``: load that hits a round hits both."""
    return [a / b for a, b in zip(times[num], times[den])]


def copy_time(like: torch.Tensor, *, repeat: int = 15) -> float:
    """Median seconds to copy a tensor like ``like`` into another on the same device."""
    src = torch.empty_like(like).normal_()
    dst = torch.empty_like(like)
    return time_fn(lambda: dst.copy_(src), repeat=repeat, device=like.device)


def summarize(times: dict[str, list[float]], nbytes: int, copy_seconds: float | None,
              device: str) -> list[dict]:
    """One row per implementation: median seconds, GB/s moved, % of the copy bandwidth."""
    rows = []
    copy_bw = 2 * nbytes / copy_seconds if copy_seconds else None  # a copy reads and writes
    for name, ts in times.items():
        med = statistics.median(ts)
        bw = nbytes * 2 / med if med > 0 else float("inf")
        rows.append({"name": name, "seconds": med, "min": min(ts), "max": max(ts),
                     "gbps": bw / 1e9, "pct_copy": 100 * bw / copy_bw if copy_bw else None,
                     "device": device})
    return rows


def format_table(rows: list[dict], baseline: str = "torch") -> str:
    base = next((r["seconds"] for r in rows if r["name"] == baseline), None)
    lines = [f"{'':18} {'median':>10} {'vs ' + baseline:>9} {'GB/s':>8} {'% of copy':>10}"]
    for r in rows:
        rel = f"{r['seconds'] / base:8.2f}x" if base else ""
        pct = f"{r['pct_copy']:9.1f}%" if r["pct_copy"] is not None else ""
        lines.append(f"{r['name']:18} {_fmt_s(r['seconds']):>10} {rel:>9} {r['gbps']:8.2f} {pct:>10}")
    return "\n".join(lines)


def _fmt_s(s: float) -> str:
    return f"{s * 1e6:.0f} µs" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def plot(rows: list[dict], title: str = "", ax=None):
    """Bar chart of a :func:`summarize` table: time (left) and % of copy bandwidth (right)."""
    import matplotlib.pyplot as plt

    if ax is None:
        fig, ax = plt.subplots(1, 2, figsize=(9, 3))
    names = [r["name"] for r in rows]
    ax[0].barh(names, [r["seconds"] * 1e3 for r in rows], color="tab:blue")
    ax[0].set_xlabel("median time per call (ms)")
    ax[1].barh(names, [r["pct_copy"] or 0 for r in rows], color="tab:green")
    ax[1].set_xlabel("effective bandwidth, % of a plain copy")
    ax[1].set_yticks([])
    ax[0].figure.suptitle(title or f"on {rows[0]['device'] if rows else '?'}")
    ax[0].figure.tight_layout()
    return ax[0].figure


def sweep_norm(student_cls, torch_cls, dims=(64, 256, 1024), rows: int = 2048, repeat: int = 7,
               device=None, show: bool = True):
    """Time a norm layer against torch's over feature sizes ``dims``; plot time and % of copy."""
    import matplotlib.pyplot as plt

    device = torch.device(device) if device is not None else default_device()
    result = {"dims": list(dims), "device": str(device), "yours": [], "torch": [], "pct_yours": [], "pct_torch": []}
    for d in dims:
        x = torch.randn(rows, d, device=device)
        mine, theirs = student_cls(d).to(device), torch_cls(d).to(device)
        times = time_interleaved({"yours": lambda: mine(x), "torch": lambda: theirs(x)},
                                 repeat=repeat, device=device)
        table = summarize(times, x.numel() * x.element_size(), copy_time(x, repeat=repeat), str(device))
        for r in table:
            result[r["name"]].append(r["seconds"])
            result["pct_" + r["name"]].append(r["pct_copy"])
    fig, ax = plt.subplots(1, 2, figsize=(9, 3))
    for name in ("yours", "torch"):
        ax[0].plot(dims, [t * 1e3 for t in result[name]], "o-", label=name)
        ax[1].plot(dims, result["pct_" + name], "o-", label=name)
    ax[0].set(xscale="log", yscale="log", xlabel=f"features D ({rows} rows)", ylabel="ms per call")
    ax[1].set(xscale="log", xlabel="features D", ylabel="% of copy bandwidth")
    ax[0].legend()
    fig.suptitle(f"{student_cls.__name__} on {device}")
    fig.tight_layout()
    if show:
        plt.show()
    result["figure"] = fig
    return result
