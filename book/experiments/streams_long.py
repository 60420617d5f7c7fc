"""Chapter 12's four residual connections (pre-norm, HC, mHC, attention residuals) trained long
enough to clear the count models' lines, two seeds each. Too long for a book build (tens of
minutes on 2 cores), so ``make experiments`` runs it through :mod:`book.experiments.recorded`
into ``book/results/streams_long.json``, and the chapter reads that record.

Each run is :func:`book.experiments.streams.train` (chapter 11's loop on chapter 12's
``StreamNet``: RMSNorm, 4 blocks of attention and MLP, width 64) with :data:`SETTINGS`: batches of
16 and a 200-step warm-up as in chapter 09's recorded runs; the held-out loss is measured on one
fixed batch of ``held_size`` windows of 64 held-out characters.
"""
from __future__ import annotations

import math

from book.experiments import streams

KINDS = streams.KINDS
SEEDS = (0, 1)
#: the recorded runs' settings (the same for every run); changing them makes the record stale
SETTINGS = {"depth": 4, "n_streams": 4, "bs": 16, "lr": 3e-3, "warmup": 200, "steps": 4000,
            "eval_every": 250, "held_size": 512}
#: a few steps of the same code, for the tests (tests/test_recorded_experiments.py)
SHORT = {**SETTINGS, "steps": 4, "eval_every": 2, "held_size": 8}


def runs() -> list[dict]:
    return [{"variant": k, "seed": s} for k in KINDS for s in SEEDS]


def run(key: dict, settings: dict) -> dict:
    """One run: the held-out loss at each evaluation, the mean training loss over each interval
    between evaluations, and the step count."""
    rec = streams.train(key["variant"], seed=key["seed"], steps=settings["steps"],
                        depth=settings["depth"], lr=settings["lr"], n_streams=settings["n_streams"],
                        bs=settings["bs"], warmup=settings["warmup"],
                        eval_every=settings["eval_every"], held_size=settings["held_size"])
    losses, evals, every = rec["loss"], rec["evals"], settings["eval_every"]
    train_mean = [[min(i + every, len(losses)) - 1, float(sum(chunk) / len(chunk))]
                  for i in range(0, len(losses), every) for chunk in [losses[i:i + every]]]
    return {"evals": [[int(s), float(v)] for s, v in evals], "train_mean": train_mean,
            "final_held": float(evals[-1][1]),
            "finite": all(math.isfinite(x) for x in losses)}


def summary(result: dict) -> str:
    return f"held-out {result['final_held']:.3f}"
