"""Transformer blocks for the book's experiments (chapters 05-09).

One block class covers both placements of the norm:

    pre-norm  (GPT-2, LLaMA):       x = x + drop(attn(ln_1(x)));  x = x + drop(mlp(ln_2(x)))
    post-norm (Vaswani et al. 2017): x = ln_1(x + drop(attn(x)));  x = ln_2(x + drop(mlp(x)))

Its submodules carry GPT-2's names (``ln_1``, ``attn``, ``ln_2``, ``mlp``, as in nanoGPT), not
the ones exercise 04 asks for: the book shows a block, the exercise is the student's to write.

With ``dropout=0`` and ``norm="layer"`` it computes what ``nn.TransformerEncoderLayer(...,
activation="gelu", batch_first=True, norm_first=...)`` computes once the weights are copied
(:func:`copy_from_torch`); chapter 06 checks that.
"""
from __future__ import annotations

import math

import torch
from torch import nn


def make_norm(kind: str, d_model: int, eps: float | None = None) -> nn.Module:
    """``"layer"``: LayerNorm (default eps 1e-5); ``"rms"``: RMSNorm (default eps 1e-6);
    ``"none"``: the identity (a block with no norm at all, for comparison)."""
    if kind == "none":
        return nn.Identity()
    if kind == "layer":
        return nn.LayerNorm(d_model, eps=1e-5 if eps is None else eps)
    if kind == "rms":
        return nn.RMSNorm(d_model, eps=1e-6 if eps is None else eps)
    raise ValueError(f"norm must be 'layer', 'rms' or 'none', not {kind!r}")


def causal_mask(n_tokens: int) -> torch.Tensor:
    """Boolean [T, T] mask for nn.MultiheadAttention: True = *not allowed* (a future key)."""
    return torch.triu(torch.ones(n_tokens, n_tokens, dtype=torch.bool), diagonal=1)


class Block(nn.Module):
    """Attention sublayer then FFN sublayer, each wrapped in a residual add and a norm."""

    def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=True, norm="layer",
                 eps=None, residual_dropout=True):
        super().__init__()
        self.norm_first = norm_first
        self.ln_1 = make_norm(norm, d_model, eps)
        self.attn = nn.MultiheadAttention(d_model, n_heads, dropout=dropout, batch_first=True)
        self.drop1 = nn.Dropout(dropout if residual_dropout else 0.0)
        self.ln_2 = make_norm(norm, d_model, eps)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, d_ff), nn.GELU(), nn.Dropout(dropout), nn.Linear(d_ff, d_model)
        )
        self.drop2 = nn.Dropout(dropout if residual_dropout else 0.0)

    def _attn(self, x, attn_mask, key_padding_mask):
        out, _ = self.attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                           need_weights=False)
        return self.drop1(out)  # dropout on the sublayer output, before the add

    def forward(self, x, attn_mask=None, key_padding_mask=None):  # x: [B, T, d_model]
        if self.norm_first:
            x = x + self._attn(self.ln_1(x), attn_mask, key_padding_mask)
            x = x + self.drop2(self.mlp(self.ln_2(x)))
        else:
            x = self.ln_1(x + self._attn(x, attn_mask, key_padding_mask))
            x = self.ln_2(x + self.drop2(self.mlp(x)))
        return x  # [B, T, d_model]: same shape, so blocks stack


class Stack(nn.Module):
    """``n_layers`` blocks; pre-norm stacks end with a final norm H = norm(H^(L)) by default."""

    def __init__(self, n_layers, d_model, n_heads, d_ff, dropout=0.0, norm_first=True,
                 norm="layer", final_norm=None, **block_kwargs):
        super().__init__()
        self.blocks = nn.ModuleList(
            Block(d_model, n_heads, d_ff, dropout, norm_first, norm, **block_kwargs)
            for _ in range(n_layers)
        )
        use_final = norm_first if final_norm is None else final_norm
        self.final_norm = make_norm(norm, d_model) if use_final else None

    def forward(self, x, attn_mask=None, key_padding_mask=None):
        for block in self.blocks:
            x = block(x, attn_mask, key_padding_mask)
        return self.final_norm(x) if self.final_norm is not None else x


class TinyLM(nn.Module):
    """Token + position embeddings -> Stack -> linear head: a decoder-only LM for toy tasks."""

    def __init__(self, vocab, n_ctx, n_layers=12, d_model=64, n_heads=4, d_ff=256,
                 norm_first=True, norm="layer", final_norm=None, dropout=0.0, **block_kwargs):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(n_ctx, d_model)
        self.stack = Stack(n_layers, d_model, n_heads, d_ff, dropout, norm_first, norm,
                           final_norm, **block_kwargs)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens, causal=True, attn_mask=None):  # tokens: [B, T] -> logits [B, T, V]
        T = tokens.shape[1]
        x = self.tok(tokens) + self.pos(torch.arange(T, device=tokens.device))
        if attn_mask is None and causal:
            attn_mask = causal_mask(T).to(tokens.device)
        return self.head(self.stack(x, attn_mask=attn_mask))


@torch.no_grad()
def copy_from_torch(block: Block, layer: nn.TransformerEncoderLayer) -> Block:
    """Load the weights of a torch encoder layer into ``block`` (the same math, other names)."""
    block.norm_first = layer.norm_first
    block.attn.load_state_dict(layer.self_attn.state_dict())
    block.ln_1.load_state_dict(layer.norm1.state_dict())
    block.ln_2.load_state_dict(layer.norm2.state_dict())
    block.mlp[0].load_state_dict(layer.linear1.state_dict())
    block.mlp[3].load_state_dict(layer.linear2.state_dict())
    return block


def block_param_count(d_model: int, d_ff: int, norm: str = "layer", bias: bool = True) -> int:
    """Parameters of one block.

    attention: 4 d^2 (+4 d biases); FFN: 2 d d_ff (+ d_ff + d biases);
    norms: 2 x (2 d) for LayerNorm (gain, bias), 2 x d for RMSNorm (gain only).
    """
    d = d_model
    attn = 4 * d * d + (4 * d if bias else 0)
    ffn = 2 * d * d_ff + ((d_ff + d) if bias else 0)
    norms = 2 * (2 * d if norm == "layer" else d)
    return attn + ffn + norms


def gpt2_init(model: nn.Module, n_layers: int, std: float = 0.02, scale_residual: bool = True,
              zero_bias: bool = True) -> None:
    """GPT-2's initialization: weight matrices N(0, std^2), biases 0, norms untouched; with
    ``scale_residual`` the two projections that write into the residual stream (attention
    out_proj, FFN second linear) get N(0, (std / sqrt(2 N))^2), N = number of blocks.
    ``zero_bias=False`` leaves the biases as PyTorch initialized them (for comparison only)."""
    norm_params = {id(p) for m in model.modules() if isinstance(m, (nn.LayerNorm, nn.RMSNorm))
                   for p in m.parameters()}
    for name, p in model.named_parameters():
        if id(p) in norm_params:
            continue
        if p.dim() < 2:
            if zero_bias:
                nn.init.zeros_(p)
        elif scale_residual and (name.endswith("attn.out_proj.weight") or name.endswith("mlp.3.weight")):
            nn.init.normal_(p, 0.0, std / math.sqrt(2 * n_layers))
        else:
            nn.init.normal_(p, 0.0, std)
