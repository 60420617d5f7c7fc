"""Exercise 04, beyond the shared in-process checks of tests/test_checks_in_process.py: the
solution against torch in float32, in train and eval mode."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from notebook_ns import solution_ns

pytestmark = pytest.mark.transformer


@pytest.fixture(scope="module")
def solution():
    return solution_ns("04_transformer_block")


@pytest.mark.parametrize("norm_first", [True, False])
def test_solution_matches_torch_in_float32_eval_and_train(solution, norm_first):
    """Beyond the float64 checks: float32, torch's fused eval path on its side and maybe on ours."""
    torch.manual_seed(0)
    mine = solution["TransformerBlock"](32, 4, 64, norm_first=norm_first)
    ref = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, activation="gelu", batch_first=True,
                                     norm_first=norm_first)
    rename = {"attn.": "self_attn.", "ffn.0.": "linear1.", "ffn.3.": "linear2."}
    state = {}
    for k, v in mine.state_dict().items():
        for a, b in rename.items():
            k = k.replace(a, b) if k.startswith(a) else k
        state[k] = v
    ref.load_state_dict(state)
    x = torch.randn(3, 7, 32)
    kpm = torch.zeros(3, 7, dtype=torch.bool)
    kpm[1, -3:] = True
    for mode in ("train", "eval"):
        mine.train(mode == "train"), ref.train(mode == "train")
        with torch.no_grad():
            a, b = mine(x, key_padding_mask=kpm), ref(x, src_key_padding_mask=kpm)
        keep = ~kpm
        assert torch.allclose(a[keep], b[keep], atol=1e-5, rtol=1e-5), mode


# --------------------------------------------------------------------------------------------
# Torch's own transformer layers cost the implementation checks (observed while the probe runs)
# --------------------------------------------------------------------------------------------

IMPLEMENTATION = ("transformer_block_prenorm_matches_torch", "transformer_block_causal_mask",
                  "transformer_block_postnorm_matches_torch", "transformer_block_rms",
                  "transformer_block_padding_mask", "transformer_block_dropout",
                  "transformer_stack_prenorm_matches_torch", "transformer_stack_postnorm_matches_torch",
                  "transformer_stack_rms", "transformer_stack_gradients")
NO_POINTS = "implementation checks give no points for torch's own layer"


def test_the_implementation_checks_name_torch_layers_for_the_static_scan():
    from coursekit.checks import load_all
    from coursekit.checks.transformer import TORCH_LAYER_NAMES

    assert TORCH_LAYER_NAMES == {"TransformerEncoderLayer", "TransformerDecoderLayer", "Transformer",
                                 "TransformerEncoder", "TransformerDecoder", "_transformer_encoder_layer_fwd"}
    reg = load_all()
    for gid in IMPLEMENTATION:
        assert reg[gid].forbidden_names == TORCH_LAYER_NAMES, gid
    for gid in ("transformer_block_parameters", "transformer_stack_structure"):
        assert reg[gid].forbidden_names == frozenset(), gid


def _with_torch_layer(solution, how: str) -> dict:
    """The solution's block, plus torch's encoder layer used or held in one way (``how``)."""
    base = solution["TransformerBlock"]

    class TransformerBlock(base):
        held = None

        def __init__(self, d_model, n_heads, d_ff, dropout=0.0, norm_first=True, norm="layer"):
            super().__init__(d_model, n_heads, d_ff, dropout=dropout, norm_first=norm_first, norm=norm)
            layer = nn.TransformerEncoderLayer(d_model, n_heads, d_ff, dropout=dropout, activation="gelu",
                                               batch_first=True, norm_first=norm_first)
            if how == "held in a closure":
                self.spare = lambda: layer
            elif how == "held in a class attribute":
                TransformerBlock.held = {"layer": [layer]}
            elif how == "run on the side":
                self._side = [layer]

        def forward(self, x, attn_mask=None, key_padding_mask=None):
            y = super().forward(x, attn_mask=attn_mask, key_padding_mask=key_padding_mask)
            if how == "run on the side":
                self._side[0].to(x.dtype)(x)
            elif how == "fused kernel" and not torch.is_grad_enabled() and isinstance(self.norm1, nn.LayerNorm):
                a, f = self.attn, self.ffn
                n1, n2 = self.norm1, self.norm2
                d = x.shape[-1]
                torch._transformer_encoder_layer_fwd(
                    x, d, a.num_heads, a.in_proj_weight, a.in_proj_bias, a.out_proj.weight, a.out_proj.bias,
                    True, True, 1e-5, n1.weight, n1.bias, n2.weight, n2.bias, f[0].weight, f[0].bias,
                    f[3].weight, f[3].bias)
            return y

    return dict(solution, TransformerBlock=TransformerBlock)


@pytest.mark.parametrize("how", ["held in a closure", "held in a class attribute", "run on the side", "fused kernel"])
def test_torch_layers_used_or_held_by_the_block_lose_its_implementation_checks(solution, how):
    from notebook_ns import outcome

    ns = _with_torch_layer(solution, how)
    msg = outcome("transformer_block_prenorm_matches_torch", ns)
    assert msg is not None and NO_POINTS in msg, msg
    want = {"run on the side": "runs torch's nn.TransformerEncoderLayer",
            "fused kernel": "calls torch's _transformer_encoder_layer_fwd"}.get(how, "holds torch's nn.TransformerEncoderLayer")
    assert want in msg, msg
    assert outcome("transformer_block_parameters", ns) is None  # the contract's structure is still there


def test_a_torch_layer_in_the_notebook_beside_the_block_costs_nothing(solution):
    """A comparison cell's nn.TransformerEncoderLayer (a notebook global, run before the test) is not the block's."""
    from notebook_ns import outcome

    ns = dict(solution, ref=nn.TransformerEncoderLayer(16, 4, 32, batch_first=True))
    ns["ref"](torch.randn(2, 3, 16))
    for gid in ("transformer_block_prenorm_matches_torch", "transformer_stack_prenorm_matches_torch"):
        assert outcome(gid, ns) is None, gid


@pytest.mark.parametrize("how", ["unbound forward", "borrowed _sa_block", "copied code object"])
def test_torch_layers_code_is_seen_however_it_is_called(solution, how):
    """nn.TransformerEncoderLayer's own code, run without a module call (no forward pre-hook fires):
    unbound, its _sa_block/_ff_block borrowed, or a copy of its code object under another name."""
    import types as _types

    from notebook_ns import outcome

    TEL = nn.TransformerEncoderLayer
    base = solution["TransformerBlock"]
    code = TEL.forward.__code__.replace(co_name="my_forward")
    fwd = _types.FunctionType(code, TEL.forward.__globals__, "my_forward", TEL.forward.__defaults__)

    class TransformerBlock(base):
        self_attn = property(lambda self: self.attn)
        linear1 = property(lambda self: self.ffn[0])
        dropout = property(lambda self: self.ffn[2])
        linear2 = property(lambda self: self.ffn[3])
        activation = property(lambda self: self.ffn[1])
        activation_relu_or_gelu = 0
        _sa_block, _ff_block = TEL._sa_block, TEL._ff_block

        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            self.dropout1, self.dropout2 = nn.Dropout(0.0), nn.Dropout(0.0)

        def forward(self, x, attn_mask=None, key_padding_mask=None):
            if how == "unbound forward":
                return TEL.forward(self, x, attn_mask, key_padding_mask)
            if how == "copied code object":
                return fwd(self, x, attn_mask, key_padding_mask)
            n = self.norm1 if self.norm_first else (lambda t: t)
            x = x + self._sa_block(n(x), attn_mask, key_padding_mask)
            return x + self._ff_block(self.norm2(x) if self.norm_first else x)

    ns = dict(solution, TransformerBlock=TransformerBlock)
    msg = outcome("transformer_block_prenorm_matches_torch", ns)
    assert msg is not None and "runs torch's nn.TransformerEncoderLayer" in msg, msg


def test_the_walk_for_torch_layers_reads_types_only():
    """A dead ``weakref.proxy`` raises on ``isinstance`` (it asks the object for ``__class__``), and a
    ``__class__`` property is the student's code: the walk from the block meets both and still finds
    the layer beside them."""
    import weakref

    from coursekit.checks.transformer import reachable_torch_layers

    class Gone:
        pass

    class Touchy:
        @property
        def __class__(self):
            raise RuntimeError("the walk asked for __class__")

    g = Gone()
    proxy = weakref.proxy(g)
    del g
    assert reachable_torch_layers([[proxy, Touchy(), {"layer": nn.TransformerEncoderLayer(8, 2)}]]) \
        == {"TransformerEncoderLayer"}
