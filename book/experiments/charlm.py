"""A character-level language model on real English text, for the real-models chapter.

The corpus is the text of ``pydoc_data.topics`` (Python's own help pages, shipped with every
CPython), so the experiment runs offline. It is cut into pieces of 1000 characters; every tenth
piece is held out, the rest (joined) is the training text. The model is
:class:`book.experiments.blocks.TinyLM`.
"""
from __future__ import annotations

import math
import time

import torch
from torch.nn import functional as F

from torch import nn

from book.experiments.blocks import Block, TinyLM
from book.experiments.toytask import lr_at

# variant name -> (norm_first, norm kind); "none" has no norm anywhere (no final norm either)
VARIANTS = {
    "post-norm": (False, "layer"),
    "pre-norm": (True, "layer"),
    "pre-norm RMSNorm": (True, "rms"),
    "no norm": (True, "none"),
}
REZERO = "no norm, ReZero gates"  # no norm; every branch times a learned gate that starts at 0


class GatedBlock(Block):
    """No norm; x = x + g1 * attn(x); x = x + g2 * mlp(x), with g1 = g2 = 0 at initialization
    (ReZero, Bachlechner et al.; SkipInit, De and Smith, is the same with one gate per block)."""

    def __init__(self, d_model, n_heads, d_ff):
        super().__init__(d_model, n_heads, d_ff, norm="none")
        self.gates = nn.Parameter(torch.zeros(2))

    def forward(self, x, attn_mask=None, key_padding_mask=None):
        x = x + self.gates[0] * self._attn(x, attn_mask, key_padding_mask)
        return x + self.gates[1] * self.mlp(x)


def corpus() -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """(train ids, held-out ids, vocabulary) of the pydoc topics text."""
    from pydoc_data.topics import topics

    text = "".join(topics.values())
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    ids = torch.tensor([index[c] for c in text], dtype=torch.long)
    pieces = ids.split(1000)
    held = torch.cat(pieces[9::10])
    train = torch.cat([p for i, p in enumerate(pieces) if i % 10 != 9])
    return train, held, vocab


def ngram_loss(train: torch.Tensor, held: torch.Tensor, n: int, vocab: int, k: float = 0.1) -> float:
    """Held-out cross-entropy (nats per character) of a count model of order ``n``: each character
    predicted from the ``n - 1`` before it, p = (count(context, c) + k) / (count(context) + k V),
    counted on ``train`` (add-k smoothing; a context never seen gives the uniform guess). The
    baselines a character model must beat before a comparison of its designs means anything."""
    def index(ids: torch.Tensor) -> torch.Tensor:  # one integer per n-gram: its characters in base V
        m = len(ids) - n + 1
        ix = torch.zeros(m, dtype=torch.long)
        for j in range(n):
            ix = ix * vocab + ids[j:j + m]
        return ix
    counts = torch.bincount(index(train), minlength=vocab ** n).double().reshape(-1, vocab) + k
    logp = counts.log() - counts.sum(1, keepdim=True).log()  # log p(c | context), one row a context
    return float(-logp.reshape(-1)[index(held)].mean())


def batch(ids: torch.Tensor, gen: torch.Generator, size: int, ctx: int) -> torch.Tensor:
    """``size`` random windows of ``ctx + 1`` characters: [size, ctx + 1]."""
    start = torch.randint(0, len(ids) - ctx - 1, (size,), generator=gen)
    return torch.stack([ids[s:s + ctx + 1] for s in start.tolist()])


def held_batch(held_ids: torch.Tensor, ctx: int = 64, size: int = 64) -> torch.Tensor:
    """The fixed held-out batch every run is evaluated on."""
    return batch(held_ids, torch.Generator().manual_seed(12345), size, ctx)


def make_model(variant: str, vocab: int, n_layers: int, d_model: int = 64, ctx: int = 64,
               seed: int = 0) -> TinyLM:
    norm_first, norm = VARIANTS["no norm" if variant == REZERO else variant]
    torch.manual_seed(seed)
    model = TinyLM(vocab, ctx, n_layers=n_layers, d_model=d_model, n_heads=4,
                   d_ff=4 * d_model, norm_first=norm_first, norm=norm,
                   final_norm=False if norm == "none" else None)
    if variant == REZERO:  # same embeddings and head; gated blocks drawn from the same seed
        torch.manual_seed(seed)
        model.stack.blocks = nn.ModuleList(
            GatedBlock(d_model, 4, 4 * d_model) for _ in range(n_layers))
    return model


def loss_on(model, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def train(variant: str, n_layers: int, warmup: int, seed: int, steps: int, lr: float = 3e-3,
          bs: int = 16, ctx: int = 64, eval_every: int = 25, data=None, held_size: int = 64):
    """Adam (betas 0.9, 0.98), linear warm-up then a constant rate, no clipping; the held-out
    loss is measured on ``held_size`` fixed held-out sequences every ``eval_every`` steps. Returns
    (model, train losses per step, [(step, held-out loss)]); a non-finite loss stops training
    and fills the rest with NaN."""
    train_ids, held_ids, vocab = corpus() if data is None else data
    model = make_model(variant, len(vocab), n_layers, ctx=ctx, seed=seed)
    gen = torch.Generator().manual_seed(1000 + seed)
    held = held_batch(held_ids, ctx, held_size)  # fixed for all runs
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.98))
    losses, evals = [], []
    for step in range(steps):
        if step % eval_every == 0 or step == steps - 1:
            with torch.no_grad():
                evals.append((step, loss_on(model.eval(), held).item()))
            model.train()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, lr, warmup)
        loss = loss_on(model, batch(train_ids, gen, bs, ctx))
        if not math.isfinite(loss.item()):
            losses += [math.nan] * (steps - step)
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses, evals


@torch.no_grad()
def stream_probe(model: TinyLM, tokens: torch.Tensor):
    """For a pre-norm model: per block, the mean over tokens of ||F(x)|| / ||x|| (what the block
    adds to the stream, relative to the stream it reads), and the loss of the "logit lens"
    readout (final norm, then the head) of the stream after the embeddings and after each block."""
    inp, tgt = tokens[:, :-1], tokens[:, 1:].reshape(-1)
    T = inp.shape[1]
    x = model.tok(inp) + model.pos(torch.arange(T))
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)

    def lens(h):
        h = model.stack.final_norm(h) if model.stack.final_norm is not None else h
        logits = model.head(h)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt).item()

    ratios, lens_loss = [], [lens(x)]
    for block in model.stack.blocks:
        y = block(x, mask)
        ratios.append(((y - x).norm(dim=-1) / x.norm(dim=-1)).mean().item())
        x = y
        lens_loss.append(lens(x))
    return ratios, lens_loss


def run_all(depths=(2, 8), warmups=(0, 50), seeds=(0, 1, 2), steps=300, **kw):
    """Every variant x depth x warm-up x seed. Returns (results, seconds) where results maps
    (variant, depth, warmup, seed) -> dict(losses, evals, model for the pre-norm runs)."""
    torch.set_num_threads(1)
    data = corpus()
    t0 = time.perf_counter()
    results = {}
    for variant in VARIANTS:
        for L in depths:
            for w in warmups:
                for s in seeds:
                    model, losses, evals = train(variant, L, w, s, steps, data=data, **kw)
                    results[(variant, L, w, s)] = dict(
                        losses=losses, evals=evals,
                        model=model if variant == "pre-norm" else None)
    return results, time.perf_counter() - t0
