"""Experiments for the chapter "Beyond the standard block" (chapter 11).

A character model with a block written out by hand, so that its inside can be changed: the norm
(LayerNorm, RMSNorm, or DyT, Zhu et al. 2025), sequential or parallel sublayers (GPT-J, PaLM),
nGPT's model on the unit sphere (Loshchilov et al. 2025, :class:`NGPT`),
QK-norm on queries and keys (Henry et al. 2020, Dehghani et al. 2023), LayerNorm scaling by
1/sqrt(layer index) (Sun et al. 2025) and stochastic depth (Huang et al. 2016). The data, the
held-out batch and the warm-up schedule are those of :mod:`book.experiments.charlm` (chapter 09).

    sequential pre-norm: x = x + attn(n1(x));  x = x + mlp(n2(x))
    parallel:            h = n1(x);  x = x + attn(h) + mlp(h)
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, replace

import torch
from torch import nn
from torch.nn import functional as F

from book.experiments import charlm
from book.experiments.toytask import lr_at


class DyT(nn.Module):
    """Dynamic Tanh: y = gamma * tanh(alpha * x) + beta, elementwise; no statistics of the row.
    alpha is one learned scalar (0.5 at the start, the paper's default), gamma and beta per feature."""

    def __init__(self, width: int, alpha0: float = 0.5):
        super().__init__()
        self.alpha = nn.Parameter(torch.tensor(float(alpha0)))
        self.gamma = nn.Parameter(torch.ones(width))
        self.beta = nn.Parameter(torch.zeros(width))

    def forward(self, x):
        return self.gamma * torch.tanh(self.alpha * x) + self.beta


def make_norm(kind: str, width: int) -> nn.Module:
    """'layer' (LayerNorm), 'rms' (RMSNorm) or 'dyt' (DyT)."""
    return {"layer": lambda: nn.LayerNorm(width), "rms": lambda: nn.RMSNorm(width, eps=1e-6),
            "dyt": lambda: DyT(width)}[kind]()


@dataclass(frozen=True)
class Config:
    vocab: int
    ctx: int = 64
    width: int = 64
    heads: int = 4
    depth: int = 6
    norm: str = "layer"         # 'layer', 'rms' or 'dyt'
    parallel: bool = False      # one shared norm, attn and mlp side by side
    qk_norm: bool = False       # RMS-normalize each head's queries and keys (learned gain)
    depth_scaled: bool = False  # multiply each norm's output by 1/sqrt(l), l = 1, 2, ...
    drop_path: float = 0.0      # stochastic depth: drop each branch with this probability
    ngpt: bool = False          # the whole model as nGPT (NGPT below); the fields above then unused


def drop_branch(branch: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Stochastic depth on one residual branch [B, T, D]: during training each sequence keeps the
    branch with probability 1 - p, scaled by 1/(1 - p) so that its expected value is the branch."""
    if not training or p == 0.0:
        return branch
    keep = (torch.rand(branch.shape[0], 1, 1) >= p).to(branch.dtype)
    return branch * keep / (1.0 - p)


class Attention(nn.Module):
    """Causal multi-head self-attention, no biases; records its largest |logit| when asked."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.heads = cfg.heads
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width, bias=False)
        self.proj = nn.Linear(cfg.width, cfg.width, bias=False)
        hs = cfg.width // cfg.heads
        self.q_gain = nn.Parameter(torch.ones(hs)) if cfg.qk_norm else None
        self.k_gain = nn.Parameter(torch.ones(hs)) if cfg.qk_norm else None
        self.max_logit = None

    def forward(self, x):  # x: [B, T, D]
        B, T, D = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        if self.q_gain is not None:  # QK-norm: each head's query and key rows get RMS 1
            q = F.rms_norm(q, (q.shape[-1],), self.q_gain, eps=1e-6)
            k = F.rms_norm(k, (k.shape[-1],), self.k_gain, eps=1e-6)
        logits = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # [B, heads, T, T]
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        # the largest logit a query actually sees: future positions are masked out below
        self.max_logit = logits.detach().masked_fill(mask, 0.0).abs().max().item()
        att = logits.masked_fill(mask, float("-inf")).softmax(-1)
        return self.proj((att @ v).transpose(1, 2).reshape(B, T, D))


class Layer(nn.Module):
    """One residual layer of :class:`CharNet` (see the module docstring for the two layouts)."""

    def __init__(self, cfg: Config, index: int):
        super().__init__()
        self.cfg = cfg
        self.n1 = make_norm(cfg.norm, cfg.width)
        self.attn = Attention(cfg)
        self.n2 = None if cfg.parallel else make_norm(cfg.norm, cfg.width)
        self.mlp = nn.Sequential(nn.Linear(cfg.width, 4 * cfg.width, bias=False), nn.GELU(),
                                 nn.Linear(4 * cfg.width, cfg.width, bias=False))
        self.scale = 1.0 / math.sqrt(index + 1) if cfg.depth_scaled else 1.0

    def forward(self, x):
        p, tr = self.cfg.drop_path, self.training
        if self.cfg.parallel:
            h = self.scale * self.n1(x)
            return x + drop_branch(self.attn(h) + self.mlp(h), p, tr)
        x = x + drop_branch(self.attn(self.scale * self.n1(x)), p, tr)
        return x + drop_branch(self.mlp(self.scale * self.n2(x)), p, tr)


class CharNet(nn.Module):
    """Token and position embeddings, ``cfg.depth`` layers, a final norm, a linear head."""

    def __init__(self, cfg: Config, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.width)
        self.pos = nn.Embedding(cfg.ctx, cfg.width)
        self.layers = nn.ModuleList(Layer(cfg, i) for i in range(cfg.depth))
        self.final = make_norm(cfg.norm, cfg.width)
        self.head = nn.Linear(cfg.width, cfg.vocab, bias=False)

    def embed(self, tokens):
        return self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))

    def forward(self, tokens):  # [B, T] -> logits [B, T, vocab]
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.final(x))


# --- nGPT (Loshchilov et al. 2025): the state, the embeddings and every matrix on the sphere ---

def unit(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """x / ||x|| along ``dim``: a point on the unit sphere."""
    return x / x.norm(dim=dim, keepdim=True).clamp_min(1e-12)


class Scale(nn.Module):
    """nGPT's learned per-feature scale s = init * (p / p0), the parameter p starting at p0 =
    ``stored`` (the paper's s_init and s_scale). Adam moves p by about lr per step, so s moves by
    (init / stored) * lr: a stored value below init speeds s up, one above init slows it down."""

    def __init__(self, width: int, init: float, stored: float):
        super().__init__()
        self.ratio = init / stored
        self.p = nn.Parameter(torch.full((width,), stored))

    def forward(self):
        return self.p * self.ratio


class NAttention(nn.Module):
    """Causal attention with unit-norm queries and keys, each feature scaled by s_qk, and the
    softmax scale sqrt(d_head) in place of 1/sqrt(d_head) (a dot of unit vectors is a cosine)."""

    def __init__(self, cfg: Config):
        super().__init__()
        self.heads, hs = cfg.heads, cfg.width // cfg.heads
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width, bias=False)
        self.proj = nn.Linear(cfg.width, cfg.width, bias=False)
        self.s_qk = Scale(hs, 1.0, 1.0 / math.sqrt(cfg.width))
        self.max_logit = None

    def forward(self, h):  # h: [B, T, D], unit rows
        B, T, D = h.shape
        q, k, v = self.qkv(h).view(B, T, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        q, k = unit(q) * self.s_qk(), unit(k) * self.s_qk()
        logits = q @ k.transpose(-2, -1) * math.sqrt(q.shape[-1])
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
        self.max_logit = logits.detach().masked_fill(mask, 0.0).abs().max().item()  # unmasked logits only
        att = logits.masked_fill(mask, float("-inf")).softmax(-1)
        return self.proj((att @ v).transpose(1, 2).reshape(B, T, D))


class NLayer(nn.Module):
    """h <- unit(h + alpha_A * (unit(attn(h)) - h)), then the same with the MLP: each sublayer moves
    the state part of the way toward its own (normalized) output; alpha starts at 0.05 per feature.
    The MLP's hidden pre-activation is scaled by sqrt(D) * s_u (unit rows times a unit state give
    entries of size about 1/sqrt(D))."""

    def __init__(self, cfg: Config):
        super().__init__()
        d = cfg.width
        self.attn = NAttention(cfg)
        self.up = nn.Linear(d, 4 * d, bias=False)
        self.down = nn.Linear(4 * d, d, bias=False)
        self.s_u = Scale(4 * d, 1.0, 1.0)
        self.alpha_a = Scale(d, 0.05, 1.0 / math.sqrt(d))
        self.alpha_m = Scale(d, 0.05, 1.0 / math.sqrt(d))

    def forward(self, h):
        h = unit(h + self.alpha_a() * (unit(self.attn(h)) - h))
        mid = F.gelu(self.up(h) * self.s_u() * math.sqrt(h.shape[-1]))
        return unit(h + self.alpha_m() * (unit(self.down(mid)) - h))


class NGPT(nn.Module):
    """The character model as nGPT: no norm layers; embeddings, the state and the head's rows on
    the unit sphere; logits = s_z * (E h), a cosine per character scaled by a learned s_z.
    :func:`renormalize` puts every matrix back on the sphere after each optimizer step."""

    def __init__(self, cfg: Config, seed: int = 0):
        super().__init__()
        torch.manual_seed(seed)
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab, cfg.width)
        self.pos = nn.Embedding(cfg.ctx, cfg.width)
        self.layers = nn.ModuleList(NLayer(cfg) for _ in range(cfg.depth))
        self.head = nn.Linear(cfg.width, cfg.vocab, bias=False)
        self.s_z = Scale(cfg.vocab, 1.0, 1.0 / math.sqrt(cfg.width))
        renormalize(self)

    def embed(self, tokens):
        return unit(self.tok(tokens) + self.pos(torch.arange(tokens.shape[1])))

    def forward(self, tokens):
        h = self.embed(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.head(h) * self.s_z()


@torch.no_grad()
def renormalize(model: NGPT) -> None:
    """Every matrix back to unit norm along the model's width D: rows of the embeddings, the head,
    qkv and up (they read a D-vector), columns of proj and down (they write one)."""
    writers = {id(m) for layer in model.layers for m in (layer.attn.proj, layer.down)}
    for m in model.modules():
        if isinstance(m, nn.Embedding):
            m.weight.copy_(unit(m.weight, dim=1))
        elif isinstance(m, nn.Linear):
            m.weight.copy_(unit(m.weight, dim=0 if id(m) in writers else 1))


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def lm_loss(model, tokens):
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


def query_weights(model: CharNet) -> list[torch.Tensor]:
    """Each layer's W_q: the first ``width`` rows of its qkv projection (a view)."""
    w = model.cfg.width
    return [layer.attn.qkv.weight[:w] for layer in model.layers]


def gains(model: nn.Module) -> torch.Tensor:
    """Every norm gain (LayerNorm/RMSNorm weight, DyT gamma) of the model, concatenated."""
    out = [m.weight for m in model.modules() if isinstance(m, (nn.LayerNorm, nn.RMSNorm))]
    out += [m.gamma for m in model.modules() if isinstance(m, DyT)]
    return torch.cat([g.detach().flatten() for g in out]) if out else torch.full((1,), math.nan)


def param_groups(model: nn.Module, wd: float, decay_vectors: bool):
    """nanoGPT's split: matrices (dim >= 2, embeddings included) decay; gains, biases and
    scalars (dim < 2) do not, unless ``decay_vectors``."""
    mats = [p for p in model.parameters() if p.dim() >= 2]
    vecs = [p for p in model.parameters() if p.dim() < 2]
    return [{"params": mats, "weight_decay": wd},
            {"params": vecs, "weight_decay": wd if decay_vectors else 0.0}]


def angle(a: torch.Tensor, b: torch.Tensor) -> float:
    """Angle in radians between two tensors seen as vectors."""
    c = (a.flatten() @ b.flatten()) / (a.norm() * b.norm())
    return math.acos(max(-1.0, min(1.0, c.item())))


def train(cfg: Config, steps: int = 300, lr: float = 3e-3, wd: float = 0.1,
          decay_vectors: bool = False, clip: float | None = 1.0, warmup: int = 30, bs: int = 8,
          seed: int = 0, eval_every: int = 50, data=None, spike_at: int | None = None,
          spike_factor: float = 100.0, model: CharNet | None = None, opt=None, start: int = 0,
          held_size: int = 64):
    """AdamW (betas 0.9, 0.95), linear warm-up then constant, global-norm clipping at ``clip``.

    Records per step: the training loss, the gradient norm before clipping, the largest |attention
    logit|, the mean ||W_q|| over layers and the mean angle (radians) each W_q turned in that
    step, and the mean |gain| of the norms. ``spike_at``: at that step the loss is multiplied by
    ``spike_factor`` before the backward pass (a gradient spike). ``model``/``opt``/``start``
    continue a run. Returns a dict (the model and optimizer included)."""
    train_ids, held_ids, _ = charlm.corpus() if data is None else data
    if model is None:
        model = (NGPT if cfg.ngpt else CharNet)(cfg, seed)
    if opt is None:
        opt = torch.optim.AdamW(param_groups(model, wd, decay_vectors), lr=lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(1000 + seed + start)
    held = charlm.held_batch(held_ids, cfg.ctx, held_size)
    rec = {k: [] for k in ("loss", "grad_norm", "max_logit", "wq_norm", "wq_turn", "gain")}
    rec["evals"] = []
    for step in range(start, start + steps):
        if step % eval_every == 0:
            model.eval()
            with torch.no_grad():
                rec["evals"].append((step, lm_loss(model, held).item()))
        model.train()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, lr, warmup)
        loss = lm_loss(model, charlm.batch(train_ids, gen, bs, cfg.ctx))
        rec["max_logit"].append(max(layer.attn.max_logit for layer in model.layers))
        opt.zero_grad(set_to_none=True)
        (loss * (spike_factor if step == spike_at else 1.0)).backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip if clip else math.inf)
        before = [w.detach().clone() for w in query_weights(model)]
        opt.step()
        if isinstance(model, NGPT):
            renormalize(model)
        after = query_weights(model)
        rec["wq_turn"].append(sum(angle(b, a) for b, a in zip(before, after)) / len(before))
        rec["wq_norm"].append(sum(a.norm().item() for a in after) / len(after))
        rec["gain"].append(gains(model).abs().mean().item())
        rec["grad_norm"].append(norm.item())
        rec["loss"].append(loss.item())
    model.eval()
    with torch.no_grad():
        rec["evals"].append((start + steps, lm_loss(model, held).item()))
    rec["model"], rec["opt"] = model, opt
    return rec


@torch.no_grad()
def relative_updates(model: CharNet, tokens: torch.Tensor) -> list[float]:
    """Per layer, the mean over tokens of ||layer(x) - x|| / ||x|| (``tokens`` as a held-out
    batch of ctx + 1 characters; the last one is dropped)."""
    model.eval()
    x = model.embed(tokens[:, :-1])
    out = []
    for layer in model.layers:
        y = layer(x)
        out.append(((y - x).norm(dim=-1) / x.norm(dim=-1)).mean().item())
        x = y
    return out


def spike_recovery(run: dict, cfg: Config, steps: int, at: int, clips=(1.0, None), **kw):
    """Continue a trained run (copies of its model and optimizer) for ``steps`` steps with a
    gradient spike at its first step, once per clipping threshold in ``clips``."""
    out = {}
    for c in clips:
        m, o = copy.deepcopy(run["model"]), None
        o = torch.optim.AdamW(param_groups(m, kw.get("wd", 0.1), False), lr=kw.get("lr", 3e-3),
                              betas=(0.9, 0.95))
        o.load_state_dict(run["opt"].state_dict())
        out[c] = train(cfg, steps=steps, clip=c, model=m, opt=o, start=at, spike_at=at,
                       eval_every=10, **kw)
    return out


# --- small demos, no training ---------------------------------------------------------------

def softcap(logits: torch.Tensor, cap: float) -> torch.Tensor:
    """Gemma 2's logit soft-capping: cap * tanh(logits / cap), in (-cap, cap)."""
    return cap * torch.tanh(logits / cap)


def z_loss(logits: torch.Tensor, coef: float = 1e-4) -> torch.Tensor:
    """PaLM's auxiliary loss coef * (log Z)^2, Z = sum_j exp(logit_j), averaged over rows."""
    return coef * torch.logsumexp(logits, dim=-1).pow(2).mean()


def timed(fn, *a, **kw):
    t0 = time.perf_counter()
    out = fn(*a, **kw)
    return out, time.perf_counter() - t0





RUNS = {  # name -> (Config changes, train() keyword changes)
    "LayerNorm": ({}, {}),
    "DyT": ({"norm": "dyt"}, {}),
    "parallel": ({"parallel": True}, {}),
    "QK-norm": ({"qk_norm": True}, {}),
    "QK-norm, no weight decay": ({"qk_norm": True}, {"wd": 0.0}),
    "LayerNorm, gains decayed": ({}, {"decay_vectors": True}),
    "LayerNorm scaled 1/sqrt(l)": ({"depth_scaled": True}, {}),
    # nGPT as its paper trains it: no weight decay, no warm-up; at this learning rate and at a
    # larger one, beside LayerNorm at the larger one (one learning rate alone would favour one)
    "nGPT": ({"ngpt": True}, {"wd": 0.0, "warmup": 0}),
    "nGPT, lr 1e-2": ({"ngpt": True}, {"wd": 0.0, "warmup": 0, "lr": 1e-2}),
    "LayerNorm, lr 1e-2": ({}, {"lr": 1e-2}),
}


def run_all(steps: int = 250, depth: int = 4, names=tuple(RUNS), **kw):
    """Train every run of :data:`RUNS` from seed 0 on the chapter-09 text; returns
    ({name: record}, the data, seconds)."""
    torch.set_num_threads(1)
    data = charlm.corpus()
    t0 = time.perf_counter()
    base = Config(vocab=len(data[2]), depth=depth)
    out = {}
    for name in names:
        cfg_kw, train_kw = RUNS[name]
        out[name] = train(replace(base, **cfg_kw), steps=steps, data=data, **{**kw, **train_kw})
    return out, data, time.perf_counter() - t0
