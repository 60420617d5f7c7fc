"""Gradients of a transformer stack at initialization, layer by layer (chapter 05).

The setting of Xiong et al. (2020), at toy size: ``n_layers`` of PyTorch's own
``nn.TransformerEncoderLayer`` (post-norm or pre-norm), every weight matrix Xavier-normal,
a linear head and a cross-entropy loss on random targets. :func:`profile` runs one forward pass
and back-propagates the loss; for a pre-norm stack it does so twice from the same forward
pass, once with the final LayerNorm between the last layer and the head (the usual layout)
and once without it, so the two differ only by that one norm.

What it records, per variant:

    w2         ||dloss/dW_2||_F of every layer's second FFN matrix (``linear2.weight``), bottom first
    stream     ||dloss/dx_l||_F of the residual stream, l = 0 (input) .. L (top), bottom first
    act        mean token norm ||x_l|| of the stream, l = 0 .. L
    loss       the loss at initialization
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

VARIANTS = ("post", "pre", "pre_nofinal")


def build(n_layers: int, norm_first: bool, d_model: int = 64, n_heads: int = 4) -> nn.ModuleList:
    """``n_layers`` encoder layers (d_ff = 4 d_model, no dropout), weight matrices Xavier-normal."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # enable_nested_tensor is irrelevant here
        layers = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, n_heads, 4 * d_model, dropout=0.0, batch_first=True,
                                       norm_first=norm_first)
            for _ in range(n_layers))
    for p in layers.parameters():
        if p.dim() == 2:
            nn.init.xavier_normal_(p)
    return layers


def profile(n_layers: int, norm_first: bool, seed: int = 0, d_model: int = 64, batch: int = 8,
            seq: int = 16, vocab: int = 32) -> dict[str, dict]:
    """Gradient norms at initialization: ``{variant: {"w2", "stream", "act", "loss"}}``.

    Post-norm stacks give the variant ``"post"``; pre-norm stacks give ``"pre"`` (final
    LayerNorm before the head) and ``"pre_nofinal"`` (the head reads the stream directly).
    """
    torch.manual_seed(seed)
    layers = build(n_layers, norm_first, d_model)
    final = nn.LayerNorm(d_model)
    head = nn.Linear(d_model, vocab)
    x = torch.randn(batch, seq, d_model, requires_grad=True)
    target = torch.randint(0, vocab, (batch * seq,))
    xs, h = [x], x
    for layer in layers:
        h = layer(h)
        xs.append(h)
    tops = {"pre": final(h), "pre_nofinal": h} if norm_first else {"post": h}
    w2 = [layer.linear2.weight for layer in layers]
    act = [t.detach().norm(dim=-1).mean().item() for t in xs]
    out = {}
    for name, top in tops.items():
        loss = F.cross_entropy(head(top).flatten(0, 1), target)
        grads = torch.autograd.grad(loss, w2 + xs, retain_graph=True)
        out[name] = {
            "w2": [g.norm().item() for g in grads[:n_layers]],
            "stream": [g.norm().item() for g in grads[n_layers:]],
            "act": act,
            "loss": loss.item(),
        }
    return out


def sweep(depths=(6, 12, 24, 48), seeds=range(6), **kw) -> dict[tuple[str, int], dict[str, torch.Tensor]]:
    """:func:`profile` for every depth and seed: ``{(variant, L): {key: tensor [seeds, ...]}}``."""
    runs: dict[tuple[str, int], dict[str, list]] = {}
    for L in depths:
        for norm_first in (False, True):
            for seed in seeds:
                for name, rec in profile(L, norm_first, seed, **kw).items():
                    slot = runs.setdefault((name, L), {k: [] for k in rec})
                    for k, v in rec.items():
                        slot[k].append(v)
    return {key: {k: torch.tensor(v, dtype=torch.float64) for k, v in rec.items()}
            for key, rec in runs.items()}
