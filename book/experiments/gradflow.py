"""How signals and gradients travel through deep stacks at initialization (chapters 01-03).

A stack of ``depth`` layers maps ``h_0 = x`` to ``h_L``. Four kinds of layer, ``W`` a square
matrix with entries drawn from N(0, gain**2 / width), ``phi`` one of :data:`ACTS`:

    plain      h_{l+1} = phi(W h_l)
    plain_ln   h_{l+1} = phi(LN(W h_l))                 (normalized, no residual)
    residual   h_{l+1} = h_l + alpha * phi(W h_l)        (residual, no norm)
    prenorm    h_{l+1} = h_l + alpha * phi(W LN(h_l))   (residual around a normalized branch)

``relu_centered`` is ReLU minus its mean over the features of each row: the same magnitudes as
ReLU without the positive mean that plain ReLU branches write into the stream at every layer
(chapter 02 measures what that mean does to a residual stack).

:func:`grad_by_layer` back-propagates one fixed gradient of norm 1 from the top and returns
``||dL/dh_l||`` for every layer, so the curve shows only what the layers' Jacobians do
(backprop multiplies by ``dh_{l+1}/dh_l`` once per layer), not how big the loss happens to be.
The norms are computed in float64: a vanished float32 gradient can have every entry non-zero
(around 1e-24) and still a float32 ``.norm()`` of exactly 0, because the squares underflow.

:class:`AttnStack` is a tiny transformer (attention + MLP per layer) with the residual adds
switchable, for the "remove every residual connection" question of chapter 02.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

KINDS = ("plain", "plain_ln", "residual", "prenorm")


def _relu_centered(z: torch.Tensor) -> torch.Tensor:
    r = torch.relu(z)
    return r - r.mean(dim=-1, keepdim=True)


ACTS = {"tanh": torch.tanh, "relu": torch.relu, "relu_centered": _relu_centered}


def run_stack(kind: str, depth: int = 50, width: int = 128, act: str = "tanh",
              gain: float = 1.0, alpha: float = 1.0, batch: int = 256, seed: int = 0):
    """Forward ``batch`` random rows through the stack and back-propagate a fixed gradient of
    norm 1 from the top. Returns ``[h_0, ..., h_L]``, each with its ``.grad`` filled in."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}")
    phi = ACTS[act]
    g = torch.Generator().manual_seed(seed)
    weights = [torch.randn(width, width, generator=g) * gain / math.sqrt(width) for _ in range(depth)]
    x = torch.randn(batch, width, generator=g).requires_grad_(True)
    hs, h = [x], x
    for W in weights:
        if kind == "plain":
            h = phi(h @ W.T)
        elif kind == "plain_ln":
            h = phi(F.layer_norm(h @ W.T, (width,)))
        elif kind == "residual":
            h = h + alpha * phi(h @ W.T)
        else:  # prenorm
            h = h + alpha * phi(F.layer_norm(h, (width,)) @ W.T)
        h.retain_grad()
        hs.append(h)
    g_out = torch.randn(h.shape, generator=g)
    h.backward(g_out / g_out.norm())  # dL/dh_L has norm 1
    return hs


def grad_by_layer(kind: str, depth: int = 50, width: int = 128, act: str = "tanh",
                  gain: float = 1.0, alpha: float = 1.0, batch: int = 256, seed: int = 0):
    """Return (grad_norms, act_norms): ``||dL/dh_l||`` and mean ``||h_l||`` per row, l = 0..depth.

    The gradient norms are computed in float64 (see the module docstring)."""
    hs = run_stack(kind, depth, width, act, gain, alpha, batch, seed)
    grads = [t.grad.double().norm().item() for t in hs]
    norms = [t.detach().norm(dim=-1).mean().item() for t in hs]
    return grads, norms


def mean_share(h: torch.Tensor) -> float:
    """Fraction of ``||h||^2`` that lies along the all-ones direction, averaged over rows:
    ``D * mean_i(h_i)^2 / sum_i h_i^2``. About 1/D for a zero-mean random row, 1 for a constant one."""
    h = h.detach()
    return (h.mean(-1).pow(2) * h.shape[-1] / h.pow(2).sum(-1)).mean().item()


class AttnLayer(nn.Module):
    """Single-head self-attention then a ReLU MLP; ``residual`` switches both adds on or off.

    pre-norm (``norm_first=True``, GPT-2's layout):
        residual:  h = h + attn(LN(h));  h = h + mlp(LN(h))
        plain:     h = attn(LN(h));      h = mlp(LN(h))
    post-norm (``norm_first=False``, BERT's layout):
        residual:  h = LN(h + attn(h));  h = LN(h + mlp(h))
        plain:     h = LN(attn(h));      h = LN(mlp(h))
    """

    def __init__(self, d: int, residual: bool, norm_first: bool = True):
        super().__init__()
        self.residual, self.norm_first = residual, norm_first
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, 1, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.ReLU(), nn.Linear(4 * d, d))

    def forward(self, h):
        if not self.norm_first:
            a = self.attn(h, h, h, need_weights=False)[0]
            h = self.ln1(h + a if self.residual else a)
            m = self.mlp(h)
            return self.ln2(h + m if self.residual else m)
        u = self.ln1(h)
        a = self.attn(u, u, u, need_weights=False)[0]
        h = h + a if self.residual else a
        m = self.mlp(self.ln2(h))
        return h + m if self.residual else m


class AttnStack(nn.Module):
    def __init__(self, n_layers: int, d: int, residual: bool, norm_first: bool = True):
        super().__init__()
        self.layers = nn.ModuleList(AttnLayer(d, residual, norm_first) for _ in range(n_layers))

    def forward(self, h):
        """Return the hidden states after every layer, input first: n_layers + 1 tensors (B, T, D)."""
        out = [h]
        for layer in self.layers:
            h = layer(h)
            out.append(h)
        return out


def token_similarity(h: torch.Tensor) -> float:
    """Mean cosine similarity between the token vectors of each sequence (off-diagonal pairs).

    1.0 means every token carries the same vector: the sequence has collapsed to one point.
    ``h`` is (B, T, D); the mean vector over all tokens is removed first, so that a shared
    offset does not count as similarity.
    """
    B, T, D = h.shape
    u = F.normalize(h - h.mean(dim=(0, 1), keepdim=True), dim=-1)
    sim = u @ u.transpose(1, 2)  # (B, T, T)
    off = ~torch.eye(T, dtype=torch.bool)
    return sim[:, off].mean().item()


def input_sensitivity(stack: AttnStack, x: torch.Tensor, eps: float = 1e-2) -> list[float]:
    """Per layer: ||h_l(x + eps*n) - h_l(x)|| / ||h_l(x)||, divided by eps * ||n|| / ||x||.

    How much of a small change to the input still shows at layer l (1.0: passed on unchanged
    in relative size; near 0: the layer's output no longer depends on it).
    """
    g = torch.Generator().manual_seed(123)
    n = torch.randn(x.shape, generator=g)
    with torch.no_grad():
        a, b = stack(x), stack(x + eps * n)
    rel_in = (eps * n.norm() / x.norm()).item()
    return [((hb - ha).norm() / ha.norm()).item() / rel_in for ha, hb in zip(a, b)]
