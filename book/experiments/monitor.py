"""Watch the residual stream and the gradients, layer by layer, with forward hooks.

    with StreamMonitor(model.stack.blocks) as mon:
        model(tokens)
    mon.norms        # mean over tokens of ||x||_2 after each block, input first

``grad_norms(blocks)`` gives ||dL/dW||_F per block after ``loss.backward()``.
"""
from __future__ import annotations

import math

import torch
from torch import nn


class StreamMonitor:
    """Records mean_t ||h_t^(l)||_2 at the input of the first block and the output of every block."""

    def __init__(self, blocks, stat=None):
        self.blocks = list(blocks)
        # default statistic: average L2 norm of a token vector, ||x||_2 = sqrt(sum_i x_i^2)
        self.stat = stat or (lambda x: x.detach().float().norm(dim=-1).mean().item())
        self.norms: list[float] = []
        self._handles = []

    def __enter__(self):
        self.norms = []

        def record_input(module, args):
            if not self.norms:
                self.norms.append(self.stat(args[0]))

        def record_output(module, args, output):
            self.norms.append(self.stat(output))

        self._handles.append(self.blocks[0].register_forward_pre_hook(record_input))
        for b in self.blocks:
            self._handles.append(b.register_forward_hook(record_output))
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = []
        return False


def grad_norms(blocks, select=lambda name: name.endswith("weight")) -> list[float]:
    """sqrt(sum of ||grad||_F^2) over each block's selected parameters (default: the weights)."""
    out = []
    for b in blocks:
        sq = sum(p.grad.float().pow(2).sum().item()
                 for n, p in b.named_parameters() if p.grad is not None and select(n))
        out.append(math.sqrt(sq))
    return out


def check_finite(model: nn.Module) -> list[str]:
    """Names of parameters whose value or gradient holds inf or NaN (the first thing to look at)."""
    bad = []
    for n, p in model.named_parameters():
        if not torch.isfinite(p).all() or (p.grad is not None and not torch.isfinite(p.grad).all()):
            bad.append(n)
    return bad
