"""Experiments for the chapter "Beyond one stream" (chapter 12).

The residual stream read as a recurrence over depth, and three ways to change it: hyper-connections
(n parallel streams mixed by learned matrices; Zhu et al., ICLR 2025), manifold-constrained
hyper-connections (mHC: the mixing matrix made doubly stochastic by Sinkhorn-Knopp; DeepSeek-AI,
arXiv 2512.24880) and attention residuals (each sublayer reads a softmax-weighted average of all
earlier outputs; Kimi Team, arXiv 2603.15031). The model is chapter 11's character model
(:mod:`book.experiments.beyond`: its attention, its data, its training loop) with RMSNorm, and with
each of its attention and MLP sublayers wrapped by one of these connections::

    pre-norm:  x  <- x + f(norm(x))                                 one stream, x: [B, T, D]
    HC, mHC:   X  <- H_res X + H_post f(norm(H_pre X))               n streams,  X: [B, T, n, D]
    AttnRes:   v_{l+1} = f_l(norm(h_l)),  h_l = sum_{i<=l} alpha_{i->l} v_i,  v_0 = the embedding

(sublayers l = 0 .. L-1; sublayer l reads the l + 1 sources v_0 .. v_l and writes v_{l+1}; the
final norm reads h_L, over all L + 1 sources.) The course's programming exercise 6 fixes three
names and their formulas (``sinkhorn_knopp``, ``MHCResidual``, ``depth_attention``). The book
prints no answer to an exercise, so the code here computes the same formulas cut differently:
:func:`sinkhorn_scale` scales a positive matrix (the exercise's function also exponentiates the
logits, in float32), :class:`MHCConnection` is given its sublayer at each call instead of at
construction, and the reading step of attention over depth is :func:`attend_depth` with the keys
from :func:`rms_keys`.
"""
from __future__ import annotations

import math
import time

import torch
from torch import nn
from torch.nn import functional as F

from book.experiments import beyond, charlm

KINDS = ("pre-norm", "HC", "mHC", "AttnRes")
# mHC's residual logits start at RES_DIAGONAL * I unless zero_start: H_res = Sinkhorn(exp(4 I)) has
# e^4 / (e^4 + 3) = 0.948 on its diagonal, close to the identity and exactly doubly stochastic
RES_DIAGONAL = 4.0


# --- Sinkhorn-Knopp -----------------------------------------------------------------------------

def positive(logits: torch.Tensor) -> torch.Tensor:
    """exp(logits - max), the max over the last two dimensions: a positive matrix [..., n, n] for
    :func:`sinkhorn_scale`. The shift cancels in the first row normalization; it only keeps exp
    from overflowing."""
    return torch.exp(logits - logits.amax(dim=(-2, -1), keepdim=True))


def sinkhorn_scale(a: torch.Tensor, n_iters: int = 20) -> torch.Tensor:
    """Sinkhorn-Knopp on a positive matrix a [..., n, n], in a's dtype: ``n_iters`` times, divide
    each row by its sum, then each column by its sum. After the last step every column sums to 1
    up to rounding; the rows only approximately (they were exact one half-step earlier).
    mHC applies it to positive(logits), in float32."""
    p = a
    for _ in range(n_iters):
        p = p / p.sum(dim=-1, keepdim=True)  # rows sum to 1
        p = p / p.sum(dim=-2, keepdim=True)  # columns sum to 1
    return p


def stochastic_errors(p: torch.Tensor) -> tuple[float, float]:
    """(largest |row sum - 1|, largest |column sum - 1|) of p [..., n, n]."""
    return ((p.sum(-1) - 1).abs().max().item(), (p.sum(-2) - 1).abs().max().item())


def sinkhorn_convergence(logits: torch.Tensor, n_iters: int) -> dict[str, list[float]]:
    """The deviation from doubly stochastic after each of ``n_iters`` iterations, in float64 so
    that rounding does not hide it: the rows' error (measured after the column step, where the
    rows are off) and the columns' (measured after the row step, where the columns are off)."""
    x = logits.double()
    p = torch.exp(x - x.amax(dim=(-2, -1), keepdim=True))
    rows, cols = [], []
    for _ in range(n_iters):
        p = p / p.sum(-1, keepdim=True)
        cols.append((p.sum(-2) - 1).abs().max().item())
        p = p / p.sum(-2, keepdim=True)
        rows.append((p.sum(-1) - 1).abs().max().item())
    return {"rows": rows, "cols": cols}


def sinkhorn_objective(logits: torch.Tensor, n_iters: int) -> list[float]:
    """Sinkhorn-Knopp as coordinate descent, in float64. With A = exp(logits) and the scaled
    matrix P_ij = A_ij exp(u_i + v_j), the convex function

        f(u, v) = sum_ij P_ij - sum_i u_i - sum_j v_j

    has gradient (row sum i - 1) in u_i and (column sum j - 1) in v_j: setting the u-gradient to
    0 with v fixed is exactly the row normalization, and the v-gradient the column one. Returns f
    at the start (u = v = 0) and after each half-step (2 n_iters + 1 values): it can only go down."""
    a = logits.double().exp()
    u = torch.zeros(a.shape[-2], dtype=torch.float64)
    v = torch.zeros(a.shape[-1], dtype=torch.float64)
    scaled = lambda: a * (u[:, None] + v[None, :]).exp()
    out = [(scaled().sum() - u.sum() - v.sum()).item()]
    for _ in range(n_iters):
        u = u - scaled().sum(-1).log()      # rows to 1: the minimum of f over u
        out.append((scaled().sum() - u.sum() - v.sum()).item())
        v = v - scaled().sum(-2).log()      # columns to 1: the minimum of f over v
        out.append((scaled().sum() - u.sum() - v.sum()).item())
    return out


# --- products of mixing matrices across depth ---------------------------------------------------

def composite_gains(mats: torch.Tensor) -> dict[str, list[float]]:
    """For the products P_L = A_L ... A_2 A_1 of the first L matrices of ``mats`` [depth, n, n],
    L = 1 .. depth: the largest absolute row sum (the infinity norm: how much one output stream
    can gain over the largest input stream), the spectral norm (largest singular value), the
    second-largest and the smallest singular value, and the largest |column sum - 1| ("col_err":
    0 up to rounding for products of column-stochastic matrices). Computed in float64."""
    out = {"row_sum": [], "spectral": [], "second": [], "smallest": [], "col_err": []}
    p = torch.eye(mats.shape[-1], dtype=torch.float64)
    for a in mats.double():
        p = a @ p
        s = torch.linalg.svdvals(p)
        out["row_sum"].append(p.abs().sum(-1).max().item())
        out["col_err"].append((p.sum(-2) - 1).abs().max().item())
        out["spectral"].append(s[0].item())
        out["second"].append(s[1].item())
        out["smallest"].append(s[-1].item())
    return out


def perturbed_identities(depth: int, n: int, scale: float, gen: torch.Generator) -> torch.Tensor:
    """``depth`` matrices I + scale * G, G with independent standard normal entries: what learned,
    unconstrained hyper-connection matrices look like when they start at the identity."""
    return torch.eye(n) + scale * torch.randn(depth, n, n, generator=gen)


# --- the connections ----------------------------------------------------------------------------

class HCConnection(nn.Module):
    """A static hyper-connection around one sublayer (Zhu et al.), unconstrained:
    h = sum_i a_i x_i;  out_i = sum_j R_ij x_j + b_i * sublayer(norm(h)),  x: [..., n, dim].
    Initialized as the paper does so that it computes the pre-norm residual: a = e_(k mod n)
    (sublayer k reads one stream), R = I, b = 1 (its output goes to every stream)."""

    def __init__(self, dim: int, n_streams: int = 4, layer_index: int = 0):
        super().__init__()
        self.norm = nn.RMSNorm(dim, eps=1e-6)
        pre = torch.zeros(n_streams)
        pre[layer_index % n_streams] = 1.0
        self.pre = nn.Parameter(pre)
        self.post = nn.Parameter(torch.ones(n_streams))
        self.res = nn.Parameter(torch.eye(n_streams))

    def connection_parameters(self):
        return [self.pre, self.post, self.res]

    def forward(self, x, sublayer):
        h = torch.einsum("i,...id->...d", self.pre, x)
        y = sublayer(self.norm(h))
        return torch.einsum("ij,...jd->...id", self.res, x) + self.post[:, None] * y.unsqueeze(-2)


class MHCConnection(nn.Module):
    """A manifold-constrained hyper-connection around one sublayer (mHC), given the sublayer at
    each call (programming exercise 6's MHCResidual holds it instead):

        H_pre = sigmoid(pre_logits)                          (n,)    how much of each stream the sublayer reads
        H_post = 2 sigmoid(post_logits)                      (n,)    how much of its output each stream receives
        H_res = sinkhorn_scale(positive(res_logits), n_iters) (n, n) doubly stochastic mixing of the streams
        h = sum_i H_pre[i] x_i;   out_i = sum_j H_res[i, j] x_j + H_post[i] * sublayer(norm(h))

    All logits start at 0: H_pre = 1/2, H_post = 1, H_res = J/n (every entry 1/n). With n equal
    streams y that is y + sublayer(norm((n/2) y)): the pre-norm residual, up to the norm's eps.
    ``read_stream=k`` starts pre_logits at +3 for stream k mod n and -3 for the others instead
    (this chapter's way to tell the streams apart, see StreamNet); with equal streams the norm
    removes the difference, so the layer still starts as the pre-norm residual.

    ``dynamic=True`` adds mHC's input-dependent part: each logit also gets alpha * (x~ . phi), where
    x~ is the token's n streams flattened to one vector of n*dim and RMS-normalized with no gain
    (F.rms_norm without a weight, eps 1e-6), phi a learned projection [n*dim, 2n + n^2] (zero at
    the start, so the layer starts as the static one) and alpha three learned scalars, one per
    mapping (0.01 at the start here: with phi = 0 and alpha = 0 neither would get a gradient).
    The mappings are then per token: H_pre [..., n], H_post [..., n], H_res [..., n, n].
    """

    def __init__(self, dim: int, n_streams: int = 4, n_iters: int = 20, dynamic: bool = False,
                 read_stream: int | None = None, res_diagonal: float = 0.0):
        super().__init__()
        n = n_streams
        self.n, self.n_iters = n, n_iters
        pre = torch.zeros(n)
        if read_stream is not None:  # start reading mostly one stream: sigmoid(3) = 0.95, sigmoid(-3) = 0.05
            pre.fill_(-3.0)
            pre[read_stream % n] = 3.0
        self.pre_logits = nn.Parameter(pre)
        self.post_logits = nn.Parameter(torch.zeros(n))
        self.res_logits = nn.Parameter(res_diagonal * torch.eye(n))
        self.norm = nn.RMSNorm(dim, eps=1e-6)
        self.dynamic = dynamic
        if dynamic:
            self.phi = nn.Parameter(torch.zeros(n * dim, n + n + n * n))  # pre | post | res
            self.alpha = nn.Parameter(torch.full((3,), 0.01))

    def connection_parameters(self):
        own = [self.pre_logits, self.post_logits, self.res_logits]
        return own + ([self.phi, self.alpha] if self.dynamic else [])

    def logits(self, x):
        """(pre, post, res) logits: the static ones, plus the dynamic part for each token of x."""
        pre, post, res = self.pre_logits, self.post_logits, self.res_logits
        if self.dynamic:
            n = self.n
            flat = F.rms_norm(x.flatten(-2), (x.shape[-2] * x.shape[-1],), eps=1e-6)
            z = flat @ self.phi  # [..., 2n + n^2]
            pre = pre + self.alpha[0] * z[..., :n]
            post = post + self.alpha[1] * z[..., n:2 * n]
            res = res + self.alpha[2] * z[..., 2 * n:].unflatten(-1, (n, n))
        return pre, post, res

    def mappings(self, x=None):
        """(H_pre, H_post, H_res); ``x`` is needed only when the layer is dynamic. H_res is
        computed in float32 and returned in the logits' dtype."""
        pre, post, res = self.logits(x)
        h_res = sinkhorn_scale(positive(res.float()), self.n_iters).to(res.dtype)
        return torch.sigmoid(pre), 2 * torch.sigmoid(post), h_res

    def forward(self, x, sublayer, mappings=None):  # x: [..., n, dim]
        # ``mappings``: (H_pre, H_post, H_res) computed by the caller (StreamNet computes every
        # static layer's at once: one Sinkhorn over a stack of matrices instead of one per layer)
        h_pre, h_post, h_res = self.mappings(x) if mappings is None else mappings
        h = torch.einsum("...i,...id->...d", h_pre, x)            # sum_i H_pre[i] x_i
        y = sublayer(self.norm(h))
        mixed = torch.einsum("...ij,...jd->...id", h_res, x)      # sum_j H_res[i, j] x_j
        return mixed + h_post.unsqueeze(-1) * y.unsqueeze(-2)


def rms_keys(sources: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """The keys of attention over depth: each source [S, ..., dim] divided by its root mean square
    over the last dimension, sqrt(mean(sources[s]^2) + eps) (RMSNorm without a gain)."""
    return sources * torch.rsqrt(sources.pow(2).mean(-1, keepdim=True) + eps)


def attend_depth(values: torch.Tensor, keys: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
    """Attention over depth (attention residuals): values [S, ..., dim] (the earlier outputs),
    keys = rms_keys(values), query [dim] (a sublayer's pseudo-query).

    alpha = softmax over s of keys[s] . query    (one weight per source and token)
    returns sum_s alpha_s values[s]
    A zero query gives every source the weight 1/S: the plain mean. StreamNet computes each
    output's key once and reuses it for every later reader."""
    alpha = (keys @ query).softmax(dim=0)                     # [S, ...]
    return (alpha.unsqueeze(-1) * values).sum(0)


def block_sources(outputs: list[torch.Tensor], block: int) -> list[torch.Tensor]:
    """Block attention residuals: the sources a sublayer attends over when the earlier outputs
    (outputs[0] the embedding, then one per sublayer) are grouped ``block`` sublayers at a time.
    The embedding is one source; each completed block is one source, the sum of its outputs; the
    outputs of the unfinished block so far are one more. ``block=1`` gives every output."""
    emb, rest = outputs[0], outputs[1:]
    done = len(rest) // block * block
    out = [emb] + [sum(rest[i:i + block]) for i in range(0, done, block)]
    if done < len(rest):
        out.append(sum(rest[done:]))
    return out


# --- the character model with each kind of connection -------------------------------------------

class StreamLayer(nn.Module):
    """One block of :class:`StreamNet`: chapter 11's attention and MLP, and per sublayer what the
    kind of model needs (a norm, a hyper-connection or a pseudo-query)."""

    def __init__(self, cfg: beyond.Config, index: int, kind: str, n_streams: int, dynamic: bool,
                 zero_start: bool):
        super().__init__()
        d = cfg.width
        self.attn = beyond.Attention(cfg)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d, bias=False), nn.GELU(),
                                 nn.Linear(4 * d, d, bias=False))
        if kind in ("pre-norm", "AttnRes"):
            self.n1, self.n2 = nn.RMSNorm(d, eps=1e-6), nn.RMSNorm(d, eps=1e-6)
        if kind == "AttnRes":  # one pseudo-query per sublayer, zero: the plain mean at the start
            self.q1, self.q2 = nn.Parameter(torch.zeros(d)), nn.Parameter(torch.zeros(d))
        if kind == "HC":
            self.c1 = HCConnection(d, n_streams, layer_index=2 * index)
            self.c2 = HCConnection(d, n_streams, layer_index=2 * index + 1)
        if kind == "mHC":
            read = (None, None) if zero_start else (2 * index, 2 * index + 1)
            diag = 0.0 if zero_start else RES_DIAGONAL
            self.c1 = MHCConnection(d, n_streams, dynamic=dynamic, read_stream=read[0],
                                    res_diagonal=diag)
            self.c2 = MHCConnection(d, n_streams, dynamic=dynamic, read_stream=read[1],
                                    res_diagonal=diag)

    def sublayers(self):
        """[(sublayer, its norm or None, its connection or pseudo-query or None)] x 2."""
        get = lambda name: getattr(self, name, None)
        return [(self.attn, get("n1"), get("c1") or get("q1")),
                (self.mlp, get("n2"), get("c2") or get("q2"))]


class StreamNet(nn.Module):
    """Chapter 11's CharNet (token and position embeddings, ``cfg.depth`` blocks, a final RMSNorm,
    a linear head) with one of :data:`KINDS` of residual connection around each sublayer. HC and
    mHC copy the embedding into ``n_streams`` streams and average them before the final norm;
    AttnRes reads the final stream with one more pseudo-query (``attn_block``: the block version,
    that many sublayers per block).

    mHC with every logit at 0 (``zero_start=True``, programming exercise 6's start) treats the n
    streams alike, and so do the copied embedding and the averaged readout: nothing can ever make
    the streams differ. By default sublayer k therefore starts reading mostly stream k mod n, as
    HC's initialization does (``read_stream`` of :class:`MHCConnection`): these read logits are
    what breaks the symmetry. The residual logits start at RES_DIAGONAL * I, which is symmetric
    under permutations of the streams and breaks nothing by itself."""

    def __init__(self, cfg: beyond.Config, kind: str = "pre-norm", n_streams: int = 4,
                 seed: int = 0, dynamic: bool = False, attn_block: int | None = None,
                 zero_start: bool = False):
        super().__init__()
        assert kind in KINDS, kind
        torch.manual_seed(seed)
        self.cfg, self.kind, self.n, self.attn_block = cfg, kind, n_streams, attn_block
        self.tok = nn.Embedding(cfg.vocab, cfg.width)
        self.pos = nn.Embedding(cfg.ctx, cfg.width)
        self.layers = nn.ModuleList(StreamLayer(cfg, i, kind, n_streams, dynamic, zero_start)
                                    for i in range(cfg.depth))
        self.final = nn.RMSNorm(cfg.width, eps=1e-6)
        self.head = nn.Linear(cfg.width, cfg.vocab, bias=False)
        self.q_final = nn.Parameter(torch.zeros(cfg.width)) if kind == "AttnRes" else None

    def embed(self, tokens):
        return self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))

    def connection_parameters(self) -> list[nn.Parameter]:
        """The parameters the connections add (mixing logits and weights, pseudo-queries)."""
        out = [self.q_final] if self.q_final is not None else []
        for layer in self.layers:
            for _, _, conn in layer.sublayers():
                if isinstance(conn, nn.Parameter):
                    out.append(conn)
                elif conn is not None:
                    out += conn.connection_parameters()
        return out

    def sources(self, outputs):
        return outputs if self.attn_block is None else block_sources(outputs, self.attn_block)

    def stream(self, tokens):
        """What the final norm reads: [B, T, D]."""
        x = self.embed(tokens)
        subs = [s for layer in self.layers for s in layer.sublayers()]
        if self.kind == "pre-norm":
            for f, norm, _ in subs:
                x = x + f(norm(x))                      # x_{l+1} = x_l + F_l(x_l)
            return x
        if self.kind in ("HC", "mHC"):
            xs = x.unsqueeze(-2).expand(*x.shape[:-1], self.n, x.shape[-1])  # n equal copies
            maps = [None] * len(subs)
            if self.kind == "mHC" and not subs[0][2].dynamic:  # every H_res in one Sinkhorn call
                conns = [c for _, _, c in subs]
                logits = torch.stack([c.res_logits for c in conns])
                res = sinkhorn_scale(positive(logits), conns[0].n_iters)
                maps = [(torch.sigmoid(c.pre_logits), 2 * torch.sigmoid(c.post_logits), r)
                        for c, r in zip(conns, res)]
            for (f, _, conn), m in zip(subs, maps):
                xs = conn(xs, f) if m is None else conn(xs, f, m)
            return xs.mean(-2)
        outputs = [x]                                   # AttnRes: v_0 = the embedding
        keys = [rms_keys(x)]                            # one key per output, reused by every reader
        for f, norm, q in subs + [(None, None, self.q_final)]:  # sublayer l reads v_0 .. v_l
            if self.attn_block is None:
                h = attend_depth(torch.stack(outputs), torch.stack(keys), q)
            else:                                       # block sums change: keys computed afresh
                src = torch.stack(self.sources(outputs))
                h = attend_depth(src, rms_keys(src), q)
            if f is None:
                return h                                # the final readout
            outputs.append(f(norm(h)))                  # v_{l+1} = f_l(norm(h_l))
            keys.append(rms_keys(outputs[-1]))

    def forward(self, tokens):  # [B, T] -> logits [B, T, vocab]
        return self.head(self.final(self.stream(tokens)))


def param_groups(model: StreamNet, wd: float):
    """Chapter 11's split (matrices decay, vectors do not), with every parameter of the
    connections left undecayed: decay would pull HC's R toward 0 and mHC's logits toward J/n."""
    conn = {id(p) for p in model.connection_parameters()}
    params = [p for p in model.parameters() if id(p) not in conn]
    return [{"params": [p for p in params if p.dim() >= 2], "weight_decay": wd},
            {"params": [p for p in params if p.dim() < 2] + model.connection_parameters(),
             "weight_decay": 0.0}]


def train(kind: str, seed: int = 0, steps: int = 250, depth: int = 4, lr: float = 3e-3,
          wd: float = 0.1, data=None, n_streams: int = 4, bs: int = 8, warmup: int = 30,
          eval_every: int = 50, held_size: int = 64, **model_kw):
    """Chapter 11's training loop (:func:`book.experiments.beyond.train`: AdamW, betas 0.9 and
    0.95, by default 30 warm-up steps, clipping at 1, batches of 8) on a :class:`StreamNet`. The
    seed sets the initialization and the order of the batches. Returns beyond.train's record."""
    data = charlm.corpus() if data is None else data
    cfg = beyond.Config(vocab=len(data[2]), depth=depth, norm="rms")
    model = StreamNet(cfg, kind, n_streams=n_streams, seed=seed, **model_kw)
    opt = torch.optim.AdamW(param_groups(model, wd), lr=lr, betas=(0.9, 0.95))
    return beyond.train(cfg, steps=steps, lr=lr, wd=wd, seed=seed, data=data, model=model, opt=opt,
                        bs=bs, warmup=warmup, eval_every=eval_every, held_size=held_size)


def run_all(kinds=KINDS, seeds=(0, 1), steps: int = 250, depth: int = 4, **kw):
    """Every kind from every seed; returns ({(kind, seed): record}, the data, seconds)."""
    torch.set_num_threads(1)
    data = charlm.corpus()
    t0 = time.perf_counter()
    out = {(k, s): train(k, seed=s, steps=steps, depth=depth, data=data, **kw)
           for k in kinds for s in seeds}
    return out, data, time.perf_counter() - t0


# --- measurements on a trained model ------------------------------------------------------------

def rms(x: torch.Tensor) -> torch.Tensor:
    """Root mean square over the last dimension (one number per token)."""
    return x.pow(2).mean(-1).sqrt()


@torch.no_grad()
def prenorm_trace(model: StreamNet, tokens: torch.Tensor) -> dict[str, list[float]]:
    """A pre-norm model's stream over depth, on ``tokens`` [B, ctx + 1] (the last one dropped):
    the RMS of the stream x_l before sublayer l and after the last (mean over tokens), the RMS of
    each branch output v_l = F_l(x_l), and each term's share of the final stream
    x_L = v_0 + v_1 + ... (v_0 the embedding): <v_i, x_L> / ||x_L||^2 per token, averaged. The
    shares of one token sum to 1."""
    assert model.kind == "pre-norm"
    x = model.embed(tokens[:, :-1])
    terms, stream = [x], [rms(x).mean().item()]
    for layer in model.layers:
        for f, norm, _ in layer.sublayers():
            v = f(norm(x))
            x = x + v
            terms.append(v)
            stream.append(rms(x).mean().item())
    sq = x.pow(2).sum(-1)
    share = [((t * x).sum(-1) / sq).mean().item() for t in terms]
    return {"stream": stream, "branch": [rms(t).mean().item() for t in terms[1:]],
            "embedding": rms(terms[0]).mean().item(), "share": share}


@torch.no_grad()
def attnres_trace(model: StreamNet, tokens: torch.Tensor) -> dict[str, list]:
    """An AttnRes model on ``tokens``: the RMS of each sublayer's input h_l, l = 0 .. L-1 (and of
    h_L, what the final norm reads), and the mean attention weights alpha_{i->l}, i = 0 .. l, of
    each reader l (a list of l + 1 weights per reader; without blocks)."""
    assert model.kind == "AttnRes"
    outputs = [model.embed(tokens[:, :-1])]
    readers = [(f, norm, q) for layer in model.layers for f, norm, q in layer.sublayers()]
    inputs, weights = [], []
    for f, norm, q in readers + [(None, None, model.q_final)]:
        src = torch.stack(model.sources(outputs))
        keys = rms_keys(src)
        weights.append((keys @ q).softmax(0).mean(dim=(1, 2)).tolist())
        h = attend_depth(src, keys, q)
        inputs.append(rms(h).mean().item())
        if f is not None:
            outputs.append(f(norm(h)))
    return {"inputs": inputs, "weights": weights}


@torch.no_grad()
def stream_spread(model: StreamNet, tokens: torch.Tensor) -> list[float]:
    """An HC or mHC model's n streams after each sublayer, on ``tokens`` [B, ctx + 1]: how far
    they are apart, mean over tokens of sqrt(mean_i ||x_i - mean_j x_j||^2) / ||mean_j x_j||
    (0 when the streams are equal copies)."""
    assert model.kind in ("HC", "mHC")
    x = model.embed(tokens[:, :-1])
    xs = x.unsqueeze(-2).expand(*x.shape[:-1], model.n, x.shape[-1])
    out = []
    for layer in model.layers:
        for f, _, conn in layer.sublayers():
            xs = conn(xs, f)
            mean = xs.mean(-2)
            spread = (xs - mean.unsqueeze(-2)).pow(2).sum(-1).mean(-1).sqrt()
            out.append((spread / mean.norm(dim=-1)).mean().item())
    return out


def mixing_matrices(model: StreamNet) -> torch.Tensor:
    """The residual mixing matrix of every sublayer of a (static) HC or mHC model: [2 depth, n, n]."""
    mats = []
    for layer in model.layers:
        for _, _, conn in layer.sublayers():
            mats.append(conn.res.detach() if isinstance(conn, HCConnection)
                        else conn.mappings()[2].detach())
    return torch.stack(mats)


# --- what the wider state costs -----------------------------------------------------------------

def residual_bytes(width: int, sublayers: int, n_streams: int = 1, bytes_per: int = 2) -> dict:
    """Per token, for a model of ``width`` and ``sublayers`` residual sublayers, in bytes:
    the residual state itself (n_streams * width numbers), the inputs a training step keeps for the
    backward pass (the state in front of every sublayer), and the least traffic one sublayer
    causes on the state (read it once, write it once)."""
    state = n_streams * width * bytes_per
    return {"state": state, "kept_for_backward": sublayers * state, "traffic_per_sublayer": 2 * state}


def mhc_parameters(width: int, n_streams: int, dynamic: bool) -> int:
    """Parameters one mHC connection adds: n + n + n^2 static logits; the dynamic part adds a
    projection of the flattened n*width state to the 2n + n^2 logits, and 3 scalars."""
    n = n_streams
    static = 2 * n + n * n
    return static + ((n * width) * (2 * n + n * n) + 3 if dynamic else 0)


# --- the gradient through Sinkhorn-Knopp --------------------------------------------------------

def saved_numbers(fn, *args) -> int:
    """How many numbers autograd keeps for the backward pass while ``fn(*args)`` runs: the elements
    of every tensor an operation saves, each storage counted once."""
    seen: dict[tuple, int] = {}

    def pack(t):
        seen[(t.untyped_storage().data_ptr(), t.dtype)] = t.untyped_storage().nbytes() // t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(*args)
    return sum(seen.values())


def unrolled_gradient(logits: torch.Tensor, weights: torch.Tensor, n_iters: int) -> torch.Tensor:
    """d/d logits of sum(weights * sinkhorn_scale(positive(logits), n_iters)), by autograd
    through the ``n_iters`` unrolled iterations, in float64."""
    x = logits.detach().double().requires_grad_(True)
    (weights.double() * sinkhorn_scale(positive(x), n_iters)).sum().backward()
    return x.grad
