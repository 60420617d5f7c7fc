"""The degradation problem on a task small enough to train at build time (chapters 01-02).

He et al. (2016) saw a 56-layer plain CNN reach a *higher training error* than a 20-layer one.
Here: three interleaved spirals in the plane (3 classes), fully connected ReLU nets of a given
depth, plain or residual, trained on the same data with the same optimizer:

    plain     h_{l+1} = relu(W_l h_l + b_l)
    residual  h_{l+1} = h_l + relu(W_l h_l + b_l)      (W_l scaled by 1/sqrt(depth) at init)

The residual net's branch scaling is part of what makes it train: without it
(``scale_branches=False``) each ReLU branch adds a non-negative output about as large as the
stream, the stream grows geometrically with depth, and the 48-layer net's loss is NaN after one
step (chapter 01 shows it).

Both use He initialization (std sqrt(2 / width)), the right scale for ReLU, so what remains is
the optimization difficulty of depth itself, not a badly chosen init.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def spirals(n: int = 512, arms: int = 3, seed: int = 0):
    """(x, y): n points in 2-D on ``arms`` interleaved spirals, labels 0..arms-1."""
    g = torch.Generator().manual_seed(seed)
    k = torch.arange(n) % arms
    r = torch.rand(n, generator=g)
    t = 3 * math.pi * r + 2 * math.pi * k / arms
    x = torch.stack([r * torch.cos(t), r * torch.sin(t)], 1)
    x = x + 0.1 * r[:, None] * torch.randn(n, 2, generator=g)
    return 2 * x, k


class MLP(nn.Module):
    """``depth`` hidden ReLU layers of ``width`` units between a 2-D input and the class logits."""

    def __init__(self, depth: int, width: int = 32, residual: bool = False, n_out: int = 3,
                 scale_branches: bool = True):
        super().__init__()
        self.residual = residual
        self.inp = nn.Linear(2, width)
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.out = nn.Linear(width, n_out)
        for lin in self.layers:
            nn.init.kaiming_normal_(lin.weight, nonlinearity="relu")
            nn.init.zeros_(lin.bias)
            if residual and scale_branches:
                # 1/sqrt(depth) would bound the stream's variance by (1 + 1/depth)^depth < e if
                # every branch output were uncorrelated with the stream. ReLU outputs are
                # non-negative, so their means add up layer after layer and the stream still
                # grows: about 26x in norm (686x in mean square) over 48 layers at
                # initialization. Chapter 02 measures this mean drift; the net trains well all
                # the same (chapter 01).
                lin.weight.data /= math.sqrt(depth)

    def forward(self, x):
        return self.out(self.stream(x)[-1])

    def stream(self, x) -> list[torch.Tensor]:
        """The hidden state before the first layer and after every layer: depth + 1 tensors."""
        hs = [self.inp(x)]
        for lin in self.layers:
            u = F.relu(lin(hs[-1]))
            hs.append(hs[-1] + u if self.residual else u)
        return hs


def train(model: nn.Module, x, y, steps: int = 300, lr: float = 0.02, momentum: float = 0.9,
          seed: int = 0) -> list[float]:
    """Full-batch SGD with momentum on cross-entropy; returns the training loss at every step."""
    torch.manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def accuracy(model: nn.Module, x, y) -> float:
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()
