"""Chapter 09's first character-model experiment, recorded: the short grid (four variants, 2 and
8 blocks, with and without warm-up, three seeds: 48 runs) and the ReZero comparison beside it
(ReZero gates at 8 blocks from the same three seeds, and a learning-rate search over three rates
on seed 0 for ReZero and pre-norm: 7 more runs).

Each run is :func:`book.experiments.charlm.train` for 150 steps on one torch thread, about ten
seconds; the 55 runs took about nine minutes of a book build on 2 cores, most of the build, so
``make experiments`` runs them through :mod:`book.experiments.recorded` into
``book/results/charlm_grid.json`` and the chapter reads that record. The 8-block pre-norm runs
with warm-up also record the residual-stream probe (:func:`book.experiments.charlm.stream_probe`)
of their trained model, since the model itself is not kept.
"""
from __future__ import annotations

import math

from book.experiments import charlm

DEPTHS = (2, 8)
WARMUPS = (0, 50)
SEEDS = (0, 1, 2)
LR = 3e-3
#: the rates of the ReZero/pre-norm search (seed 0, 8 blocks, the 50-step warm-up)
SEARCH_LRS = (1e-3, 3e-3, 1e-2)
#: the recorded runs' settings (the same for every run); changing them makes the record stale
SETTINGS = {"d_model": 64, "ctx": 64, "bs": 8, "steps": 150, "eval_every": 25, "held_size": 64}
#: a few steps of the same code, for the tests (tests/test_recorded_experiments.py)
SHORT = {**SETTINGS, "steps": 4, "eval_every": 2, "held_size": 8}


def runs() -> list[dict]:
    """The grid at the shared rate, then ReZero from every seed at it, then the other two rates
    of the search for both pre-norm and ReZero (seed 0)."""
    grid = [{"variant": v, "n_layers": L, "warmup": w, "seed": s, "lr": LR}
            for v in charlm.VARIANTS for L in DEPTHS for w in WARMUPS for s in SEEDS]
    rezero = [{"variant": charlm.REZERO, "n_layers": 8, "warmup": WARMUPS[1], "seed": s, "lr": LR}
              for s in SEEDS]
    search = [{"variant": v, "n_layers": 8, "warmup": WARMUPS[1], "seed": 0, "lr": lr}
              for lr in SEARCH_LRS if lr != LR for v in ("pre-norm", charlm.REZERO)]
    return grid + rezero + search


def probed(key: dict) -> bool:
    """The runs whose trained model the chapter probes: 8-block pre-norm with warm-up."""
    return (key["variant"] == "pre-norm" and key["n_layers"] == 8 and key["warmup"] == WARMUPS[1]
            and key["lr"] == LR)


def run(key: dict, settings: dict) -> dict:
    """One run: the training loss at every step, the held-out loss at each evaluation, and for
    the probed runs the stream probe (per block ||F(x)|| / ||x||, and the logit-lens loss after
    the embeddings and each block) on the fixed held-out batch."""
    assert settings["d_model"] == 64, "charlm.train builds d_model=64 models"
    data = charlm.corpus()
    model, losses, evals = charlm.train(
        key["variant"], key["n_layers"], key["warmup"], key["seed"], settings["steps"],
        lr=key["lr"], bs=settings["bs"], ctx=settings["ctx"], eval_every=settings["eval_every"],
        data=data, held_size=settings["held_size"])
    out = {"losses": [float(x) for x in losses], "evals": [[int(s), float(v)] for s, v in evals],
           "final_held": float(evals[-1][1]), "finite": all(math.isfinite(x) for x in losses)}
    if probed(key):
        ratios, lens = charlm.stream_probe(model, charlm.held_batch(data[1], settings["ctx"]))
        out["probe"] = {"ratios": ratios, "lens": lens}
    return out


def summary(result: dict) -> str:
    return f"held-out {result['final_held']:.3f}"
