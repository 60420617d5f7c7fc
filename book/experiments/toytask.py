"""A tiny synthetic task and a short training loop for the placement and debugging chapters.

Copy task: ``a_1 ... a_n SEP a_1 ... a_n``; the model is scored only on the second half, where
every token is predictable by attending back n positions (the input SEP predicts a_1, which
sits n positions earlier; the input a_k predicts a_{k+1}, also n positions earlier). Chance
level is ln(vocab).
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


def copy_batch(gen: torch.Generator, batch: int, n: int = 8, vocab: int = 10):
    """tokens [B, 2n+1] (token id ``vocab`` is SEP) and a loss mask [B, 2n] over next-token targets."""
    a = torch.randint(0, vocab, (batch, n), generator=gen)
    sep = torch.full((batch, 1), vocab)
    tokens = torch.cat([a, sep, a], dim=1)
    mask = torch.zeros(batch, 2 * n, dtype=torch.bool)
    mask[:, n:] = True  # inputs SEP, a_1..a_{n-1} predict a_1..a_n
    return tokens, mask


def lm_loss(model, tokens, mask, **kw):
    """Cross-entropy of next-token predictions at the masked positions."""
    logits = model(tokens[:, :-1], **kw)  # [B, T-1, V]
    return F.cross_entropy(logits[mask], tokens[:, 1:][mask])


def lr_at(step: int, lr: float, warmup: int) -> float:
    """Linear warm-up from lr/warmup to lr over ``warmup`` steps, constant after."""
    return lr * min(1.0, (step + 1) / warmup) if warmup > 0 else lr


def train(model: nn.Module, steps: int, lr: float, warmup: int = 0, batch: int = 16,
          seed: int = 0, n: int = 8, vocab: int = 10, on_step=None) -> list[float]:
    """Adam (betas 0.9, 0.98, as Vaswani et al.), no clipping; returns the loss per step
    (NaN from the first non-finite loss on)."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.98))
    losses = []
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, lr, warmup)
        tokens, mask = copy_batch(gen, batch, n, vocab)
        loss = lm_loss(model, tokens, mask)
        if not math.isfinite(loss.item()):
            losses += [math.nan] * (steps - step)
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if on_step is not None:
            on_step(step, model)
        opt.step()
        losses.append(loss.item())
    return losses
