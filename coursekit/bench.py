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

Every benchmark (the four of :mod:`coursekit.checks.benchmark`, the grader's served one, the
backward pass's) picks its device, dtype and sizes the same way, from :func:`bench_config`::

    cfg = bench_config()                      # CUDA when torch.cuda.is_available(), else the CPU
    sizes = cfg.sizes("norm")                 # coursekit.contract.BENCH_SIZES[cfg.kind]["norm"]
    x = torch.randn(*sizes["input"], device=cfg.device, dtype=cfg.dtype)
    fast, why_not = compiled(torch_module, x) if cfg.compile else (None, cfg.no_compile)
    print(cfg.header())                       # what ran where, and what the numbers are
    print(format_table(summarize(times, nbytes, copy_time(x), cfg.label), unavailable=...))

On CUDA: bfloat16, the GPU sizes, CUDA events, and a ``torch.compile`` column. On the CPU:
float32, the small CPU sizes, one thread, ``time.perf_counter``, and no compile column (compiling
takes tens of seconds of a C++ compiler per module, longer than the whole benchmark).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from coursekit.contract import BENCH_DTYPE, BENCH_SIZES


def default_device() -> torch.device:
    """The benchmarks' device: the GPU when torch sees one, else the CPU (the one place that decides)."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


#: what the report says instead of a torch.compile column on the CPU
NO_COMPILE_ON_CPU = ("torch.compile is not timed on the CPU: compiling a module there takes tens of "
                     "seconds of a C++ compiler, longer than the whole benchmark")


@dataclass(frozen=True)
class BenchConfig:
    """How a benchmark runs on one device: see :func:`bench_config`."""

    device: torch.device
    dtype: torch.dtype
    compile: bool  # whether to time torch.compile(torch's module) as a third column
    threads: int | None  # CPU: the benchmark runs on this many threads (None: the GPU's business)
    clock: str  # how a call is timed, in words
    label: str  # the device in words ("cpu", or the GPU's name)

    @property
    def kind(self) -> str:
        return self.device.type

    @property
    def no_compile(self) -> str | None:
        """Why there is no torch.compile column, or None when there is one."""
        return None if self.compile else NO_COMPILE_ON_CPU

    def sizes(self, workload: str) -> dict:
        """``coursekit.contract.BENCH_SIZES[kind][workload]``: ``input`` shape and module sizes."""
        return BENCH_SIZES[self.kind][workload]

    def header(self) -> str:
        """What ran where, for the top of a report (:func:`describe`)."""
        return describe(self.kind, self.label, str(self.dtype)[6:], self.clock)


def describe(kind: str, label: str, dtype: str, clock: str | None = None) -> str:
    """One line for the top of a report: what ran where. ``kind`` is ``"cuda"`` or ``"cpu"``, ``label``
    the device in words, ``dtype`` e.g. ``"bfloat16"``; ``clock``: how it was timed (default: the
    :func:`bench_config` clock of that kind). On the CPU it says plainly these are CPU numbers and
    that GPU figures need a GPU. A judge that prints a record measured elsewhere calls this with the
    record's fields."""
    if kind == "cuda":
        return (f"GPU numbers ({label}, {dtype}, the GPU sizes of coursekit.contract), "
                f"timed with {clock or 'synchronized CUDA events'}")
    return (f"CPU numbers ({dtype}, 1 thread, the small CPU sizes of coursekit.contract), timed with "
            f"{clock or 'time.perf_counter'}. GPU figures (bfloat16, transformer-sized inputs, a "
            "torch.compile column) need a machine with a CUDA GPU")


def bench_config(device: torch.device | str | None = None) -> BenchConfig:
    """The benchmark settings for ``device`` (default: :func:`default_device`).

    ``cuda``: bfloat16, the GPU sizes, CUDA events after a synchronize, torch.compile timed too.
    ``cpu``: float32, the CPU sizes, one thread, ``time.perf_counter``, no torch.compile.
    """
    device = torch.device(device) if device is not None else default_device()
    if device.type == "cuda":  # the settings only: asking for them needs no GPU (tests, a judge elsewhere)
        label = torch.cuda.get_device_name(device) if torch.cuda.is_available() else "cuda"
        return BenchConfig(device, BENCH_DTYPE["cuda"], True, None, "synchronized CUDA events", label)
    if device.type != "cpu":
        raise ValueError(f"the benchmarks run on cuda or cpu, not {device.type}")
    return BenchConfig(device, BENCH_DTYPE["cpu"], False, 1, "time.perf_counter", "cpu")


def compiled(module: Callable, example: torch.Tensor) -> tuple[Callable | None, str | None]:
    """``(torch.compile(module), None)`` once it has run on ``example``, or ``(None, why)`` when
    compiling fails (no compiler, no Triton, an unsupported op): the column is then reported as
    unavailable and nothing else changes."""
    try:
        fast = torch.compile(module)
        with torch.no_grad():
            fast(example)  # torch.compile is lazy: this is where a missing compiler shows
            _sync(example.device)
        return fast, None
    except Exception as e:  # noqa: BLE001 -- whatever broke, the other columns stand
        return None, f"torch.compile failed here ({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})"


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


#: the paragraphs every notebook's benchmark markdown ends with (tests/test_bench.py checks they do)
NOTEBOOK_MARKDOWN = """\
The benchmark runs where your notebook runs. **On a CUDA GPU** (when `torch.cuda.is_available()`)
the input is bfloat16 and as large as a transformer's activations on a GPU (the sizes are in
`coursekit.contract.BENCH_SIZES["cuda"]`), every call is timed with synchronized CUDA events, and
`torch.compile` of torch's module is timed too (the report shows that row as *unavailable* when
it cannot compile here). **On the CPU** the input is float32 and small
(`BENCH_SIZES["cpu"]`), it runs on one thread, timed with `time.perf_counter`, and there is no
`torch.compile` row: compiling takes longer there than the whole benchmark. The report's first
lines say which of the two you got.

The columns: *fastest* and *median* are the fastest and the median time per call over the rounds;
*vs torch* is your fastest time divided by torch eager's fastest (load on a shared machine only ever
adds time, so the fastest runs compare best); *GB/s* counts the input's bytes read plus as many
written, per second; *% of copy* is that bandwidth as a share of a plain copy of the input on
the same device (100% is as fast as the memory allows). The line under the table says where
straightforward vectorized code usually lands. These times are for your information: no point
depends on them. The autograder counts the same way, and times the same workload from outside
your notebook, on its GPU when it has one."""

#: what each column of :func:`format_table` means, printed under it
COLUMNS = ("fastest, median: time per call over the rounds; vs torch: fastest over torch eager's fastest "
           "(for information: the points come from the count of work); GB/s (at the median): bytes of the input "
           "read plus the same bytes written, per second; % of copy: that bandwidth as a share of a "
           "plain copy of the input on the same device (100% = as fast as memory allows)")


def format_table(rows: list[dict], baseline: str = "torch", unavailable: dict[str, str] | None = None,
                 legend: bool = False) -> str:
    """The :func:`summarize` rows as text; ``unavailable``: name -> why, for a column that could
    not be timed (``torch.compile`` without a compiler), shown as a row saying so; ``legend``:
    add :data:`COLUMNS` below."""
    # one ratio: fastest against fastest, as every verdict (coursekit.checks.benchmark.robust_ratio)
    base = next((r["min"] for r in rows if r["name"] == baseline), None)
    lines = [f"{'':18} {'fastest':>10} {'median':>10} {'vs ' + baseline:>9} {'GB/s':>8} {'% of copy':>10}"]
    for r in rows:
        rel = f"{r['min'] / base:8.2f}x" if base else ""
        pct = f"{r['pct_copy']:9.1f}%" if r["pct_copy"] is not None else ""
        lines.append(f"{r['name']:18} {_fmt_s(r['min']):>10} {_fmt_s(r['seconds']):>10} {rel:>9} "
                     f"{r['gbps']:8.2f} {pct:>10}")
    for name, why in (unavailable or {}).items():
        lines.append(f"{name:18} {'unavailable':>10}  ({why})")
    if legend:
        lines.append(COLUMNS)
    return "\n".join(lines)


def verdict_line(baseline: str, ratio: float, rounds: list[float], typical: float, unit: str = "run") -> str:
    """The line every benchmark prints under its table: the ratio of fastest ``unit`` against fastest
    ``unit``, where vectorized code usually lands, and the spread of single rounds, which is load.
    For information: the benchmark's points come from counting the work (coursekit.checks.scaling)."""
    return (f"yours / {baseline}: {ratio:.2f}x, fastest {unit} against fastest {unit} (straightforward vectorized "
            f"code usually lands under {typical:g}x). Single rounds ranged from {min(rounds):.2f}x to "
            f"{max(rounds):.2f}x: a busy machine slows single rounds. These times are for your information; "
            "the test's points come from the count of work above, which no machine's load changes")


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
