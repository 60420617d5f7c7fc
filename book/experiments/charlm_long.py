"""Chapter 09's character model trained long enough to clear the count models' lines: pre-norm with
LayerNorm, pre-norm with RMSNorm and post-norm, two seeds each, every run with the same linear
warm-up. Too long for a book build (tens of minutes on 2 cores), so ``make experiments`` runs it
through :mod:`book.experiments.recorded` into ``book/results/charlm_long.json``, and the chapter
reads that record.

Each run is :func:`book.experiments.charlm.train` with :data:`SETTINGS`; the held-out loss is
measured on one fixed batch of ``held_size`` windows of 64 held-out characters (the build-time
runs use 64 windows).
"""
from __future__ import annotations

import math

from book.experiments import charlm

VARIANTS = ("pre-norm", "pre-norm RMSNorm", "post-norm")
SEEDS = (0, 1)
#: the recorded runs' settings (the same for every run); changing them makes the record stale
SETTINGS = {"n_layers": 4, "d_model": 64, "ctx": 64, "bs": 16, "lr": 3e-3, "warmup": 200,
            "steps": 8000, "eval_every": 250, "held_size": 512}
#: a few steps of the same code, for the tests (tests/test_recorded_experiments.py)
SHORT = {**SETTINGS, "steps": 4, "eval_every": 2, "held_size": 8}


def runs() -> list[dict]:
    return [{"variant": v, "seed": s} for v in VARIANTS for s in SEEDS]


def run(key: dict, settings: dict) -> dict:
    """One run: the held-out loss at each evaluation, the mean training loss over each interval
    between evaluations, and the step count."""
    assert settings["d_model"] == 64, "charlm.train builds d_model=64 models"
    _, losses, evals = charlm.train(
        key["variant"], settings["n_layers"], settings["warmup"], key["seed"], settings["steps"],
        lr=settings["lr"], bs=settings["bs"], ctx=settings["ctx"],
        eval_every=settings["eval_every"], held_size=settings["held_size"])
    every = settings["eval_every"]
    train_mean = [[min(i + every, len(losses)) - 1, float(sum(chunk) / len(chunk))]
                  for i in range(0, len(losses), every) for chunk in [losses[i:i + every]]]
    return {"evals": [[int(s), float(v)] for s, v in evals], "train_mean": train_mean,
            "final_held": float(evals[-1][1]),
            "finite": all(math.isfinite(x) for x in losses)}


def summary(result: dict) -> str:
    return f"held-out {result['final_held']:.3f}"
