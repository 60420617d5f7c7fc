"""The hidden checks of transformer (instructor side): registered into coursekit's registry when
this package is importable (the grader, stock nbgrader in the course directory, the tests).
Students never get this file: their notebooks only run these checks' visible smoke calls.
"""
from __future__ import annotations

import torch
from torch import nn

from coursekit.checks import CheckFailed, frozen, register
from coursekit.checks.compare import ANY, expect_close, expect_structure, expect_tensor, is_close, paired
from coursekit.checks.seeded import DTYPE, Parts, block_formula, dropped_pattern, make_norm, randn
from coursekit.checks.transformer import (D, FF, H, SHAPE, _judge_block, _judge_stack, _probe_block,
                                          _probe_pre_and_post, _probe_stack, _stack_cases, block_suspects,
                                          block_values, build_block, build_stack, causal_mask, expected_block,
                                          grads_of, inputs, layers_of, no_torch_layers, padding_mask,
                                          run_layers, silence_sublayer, stack_values, TORCH_LAYER_NAMES)
from coursekit.checks.remote import manual_seed


DROPOUT_ON_STREAM = "dropout is applied to the residual stream (x + sublayer); it belongs on the sublayer's output only"


DROPOUT_IN_EVAL = "dropout is still active in eval mode: use nn.Dropout (it is off after .eval())"


@register("transformer_block_postnorm_matches_torch", needs=("TransformerBlock",), forbidden_names=TORCH_LAYER_NAMES)
@no_torch_layers("TransformerBlock")
class BlockPostNorm:
    """A post-norm TransformerBlock computes what nn.TransformerEncoderLayer(norm_first=False, activation='gelu') computes"""

    probe = staticmethod(lambda ns: _probe_block(ns, False))
    judge = staticmethod(torch.no_grad()(lambda out: _judge_block(out, False)))


RMS_CASES = ((110, 1.0, 0.5), (111, 1e-3, 5e-4))  # tiny inputs: eps matters


def _rms_suspects(vals, x, norm_first):
    lnorm = Parts(vals, D, H, FF, "layer")  # LayerNorm with our weights and zero bias
    out = {"norm='rms' is ignored: the norms are LayerNorm (they subtract the mean); use nn.RMSNorm(d_model, eps=1e-6)":
           block_formula(lnorm, x, norm_first=norm_first)}
    for eps, why in ((1e-5, "not 1e-5"), (torch.finfo(DTYPE).eps, "nn.RMSNorm(d_model) without eps uses the dtype's "
                                                              "machine epsilon"), (1e-8, "not 1e-8")):
        out[f"RMSNorm's eps should be 1e-6: {why}"] = block_formula(Parts(vals, D, H, FF, "rms", norm_eps=eps), x,
                                                                    norm_first=norm_first)
    return out


@register("transformer_block_rms", needs=("TransformerBlock",), forbidden_names=TORCH_LAYER_NAMES)
@no_torch_layers("TransformerBlock")
class BlockRMS:
    """With norm='rms' both norms of the block are RMSNorm with eps 1e-6 (pre-norm and post-norm)"""

    @staticmethod
    def probe(ns):
        return [_probe_block(ns, True, "rms", RMS_CASES), _probe_block(ns, False, "rms", RMS_CASES[:1])]

    @staticmethod
    @torch.no_grad()
    def judge(out):
        expect_structure(out, [ANY, ANY])
        _judge_block(out[0], True, "rms", RMS_CASES, lambda v, x: _rms_suspects(v, x, True))
        _judge_block(out[1], False, "rms", RMS_CASES[:1], lambda v, x: _rms_suspects(v, x, False))


@register("transformer_block_padding_mask", needs=("TransformerBlock",), forbidden_names=TORCH_LAYER_NAMES)
@no_torch_layers("TransformerBlock")
class BlockPaddingMask:
    """key_padding_mask reaches the attention: changing padded tokens leaves the other outputs unchanged, as in torch"""

    SEED = 130

    @staticmethod
    def probe(ns):
        s = BlockPaddingMask.SEED
        x, kpm = inputs(s), padding_mask()
        x2 = torch.where(kpm[..., None], inputs(s + 1) * 5, x)
        return _probe_pre_and_post(ns, s, x, x2, key_padding_mask=kpm)

    @staticmethod
    @torch.no_grad()
    def judge(out):
        s = BlockPaddingMask.SEED
        x, kpm, vals = inputs(s), padding_mask(), block_values(s)
        keep = ~kpm
        for first, (y1, y2) in paired((True, False), out, [ANY, ANY]):
            name = "pre" if first else "post"
            y1, y2 = expect_tensor(y1, "the output"), expect_tensor(y2, "the output")
            if y1.shape != x.shape or y2.shape != x.shape:
                raise CheckFailed(f"the block's output has shape {tuple(y1.shape)}, expected {tuple(x.shape)}")
            expected = expected_block(vals, x, first, key_padding_mask=kpm)[keep]
            suspects = {"key_padding_mask is ignored: pass it on to self.attn(..., key_padding_mask=key_padding_mask)":
                        expected_block(vals, x, first)[keep]}
            suspects.update({k: v[keep] for k, v in block_suspects(vals, x, first, key_padding_mask=kpm).items()})
            what = f"the {name}-norm block's output at the unpadded tokens, with a key_padding_mask"
            expect_close(y1[keep], expected, what=what, suspects=suspects)
            expect_close(y2[keep], expected, what=what + ", after changing the padded tokens (attention must skip them)")


@register("transformer_block_dropout", needs=("TransformerBlock",), forbidden_names=TORCH_LAYER_NAMES)
@no_torch_layers("TransformerBlock")
class BlockDropout:
    """Dropout acts on each sublayer's output before its residual add, in train mode only, pre-norm and post-norm"""

    SEED, P = 140, 0.5

    @staticmethod
    def probe(ns):
        c = BlockDropout
        x = inputs(c.SEED)
        out = {}
        for silent in ("ffn", "attn"):  # zero one sublayer's output: the other one's dropout is then visible
            blk = silence_sublayer(build_block(ns, c.SEED, dropout=c.P).train(), silent)
            manual_seed(ns, c.SEED)
            out[silent] = blk(x)
        for first in (True, False):
            blk = build_block(ns, c.SEED, dropout=c.P, norm_first=first).eval()
            out[f"eval_{first}"] = [blk(x), blk(x)]
        # post-norm in train mode: both sublayers silenced, the block is norm2(norm1(x)) exactly, whatever dropout
        # draws, unless dropout touches the stream; with attention alone, its dropout must show
        blk = silence_sublayer(silence_sublayer(build_block(ns, c.SEED, dropout=c.P, norm_first=False,
                                                            positional=True).train(), "ffn"), "attn")
        manual_seed(ns, c.SEED)
        out["post_silent"] = blk(x)
        blk = silence_sublayer(build_block(ns, c.SEED, dropout=c.P, norm_first=False, positional=True).train(), "ffn")
        manual_seed(ns, c.SEED)
        out["post_attn"] = blk(x)
        return out

    @staticmethod
    @torch.no_grad()
    def judge(out):
        c = BlockDropout
        expect_structure(out, {"ffn": ANY, "attn": ANY, "eval_True": [ANY, ANY], "eval_False": [ANY, ANY],
                               "post_silent": ANY, "post_attn": ANY})
        x, vals = inputs(c.SEED), block_values(c.SEED)
        p = Parts(vals, D, H, FF)
        branches = {"attn": ("attention", p.sa(p.norm1(x))), "ffn": ("FFN", p.ff(p.norm2(x)))}
        for silent, (name, branch) in (("ffn", branches["attn"]), ("attn", branches["ffn"])):
            what = f"the pre-norm block's output in train mode (dropout={c.P}, only the {name} sublayer active)"
            y = expect_tensor(out[silent], what)
            if y.shape != x.shape:
                raise CheckFailed(f"{what} has shape {tuple(y.shape)}, expected {tuple(x.shape)}")
            if dropped_pattern(y - x, branch, c.P):
                continue
            if _masked_multiple(y, x + branch):
                raise CheckFailed(f"{what} is wrong: {DROPOUT_ON_STREAM}")
            if torch.allclose(y, x + branch, rtol=1e-7, atol=1e-7):
                raise CheckFailed(f"{what} is wrong: dropout is missing on the {name} output: "
                                  f"x + Dropout({name}(norm(x)))")
            raise CheckFailed(f"{what} is wrong: output - x should be Dropout({name}(norm(x))), each element 0 or "
                              "divided by 1 - p, and it is not")
        for first in (True, False):
            name = "pre" if first else "post"
            expected = expected_block(vals, x, first)
            y1, y2 = (expect_tensor(y, "the output") for y in out[f"eval_{first}"])
            what = f"the {name}-norm block's output in eval mode (dropout={c.P})"
            if y1.shape == y2.shape and not torch.equal(y1, y2):
                raise CheckFailed(f"{what} changes from call to call: {DROPOUT_IN_EVAL}")
            expect_close(y1, expected, what=what, suspects=block_suspects(vals, x, first))
        # post-norm in train mode (a block whose dropout hit the stream, Norm(Dropout(x + SA(x))), kept full marks
        # while only its eval mode was probed: the seventeenth red team)
        what = f"the post-norm block's output in train mode (dropout={c.P}, both sublayers' output projections zero)"
        y = expect_tensor(out["post_silent"], what)
        if not is_close(y, p.norm2(p.norm1(x))):
            raise CheckFailed(f"{what} is wrong: it should be norm2(norm1(x)) whatever dropout draws. Dropout acts on "
                              "each sublayer's output (here 0) before its residual add, not on the stream "
                              "(x + sublayer(x)) and not after a norm")
        what = f"the post-norm block's output in train mode (dropout={c.P}, only the attention sublayer active)"
        y = expect_tensor(out["post_attn"], what)
        undropped = p.norm2(p.norm1(x + p.sa(x)))
        if y.shape == undropped.shape and torch.allclose(y, undropped, rtol=1e-7, atol=1e-7):
            raise CheckFailed(f"{what} is wrong: dropout is missing on the attention output: "
                              "norm1(x + Dropout(attention(x)))")


def _masked_multiple(y, full) -> bool:
    """Is every element of ``y`` either 0 or the same multiple k > 1 of ``full`` (some of each)?"""
    if y.shape != full.shape:
        return False
    zero = y.abs() <= 1e-9 * (1 + full.abs())
    if zero.all() or not zero.any():
        return False
    k = (y[~zero] / full[~zero])
    return bool(k.min() > 1 and torch.allclose(k, k[0].expand_as(k), rtol=1e-7, atol=0))


@register("transformer_stack_postnorm_matches_torch", needs=("TransformerStack",), forbidden_names=TORCH_LAYER_NAMES)
@no_torch_layers("TransformerStack")
class StackPostNorm:
    """A post-norm TransformerStack equals its blocks applied in turn with no final norm, as torch's layers"""

    probe = staticmethod(lambda ns: _probe_stack(ns, _stack_cases(False)))
    judge = staticmethod(torch.no_grad()(lambda out: _judge_stack(out, _stack_cases(False))))


@register("transformer_stack_rms", needs=("TransformerStack",), forbidden_names=TORCH_LAYER_NAMES)
@no_torch_layers("TransformerStack")
class StackRMS:
    """With norm='rms' the stack's blocks and its final norm are RMSNorm with eps 1e-6"""

    CASES = (frozen(seed=210, n=2, first=True, masks=False),)
    probe = staticmethod(lambda ns: _probe_stack(ns, StackRMS.CASES, "rms"))
    judge = staticmethod(torch.no_grad()(lambda out: _judge_stack(out, StackRMS.CASES, "rms")))


GRAD_NAMES = ("blocks.0.attn.in_proj_weight", "blocks.0.norm1.weight", "blocks.1.ffn.0.weight",
              "blocks.1.norm2.bias", "final_norm.weight", "final_norm.bias")


@register("transformer_stack_gradients", needs=("TransformerStack",), forbidden_names=TORCH_LAYER_NAMES)
@no_torch_layers("TransformerStack")
class StackGradients:
    """Gradients through a pre-norm TransformerStack (float64, causal mask) match torch's, for the input and the weights"""

    SEED = 220

    @staticmethod
    def probe(ns):
        s = StackGradients.SEED
        stk = build_stack(ns, s, 2)
        return grads_of(stk, inputs(s), randn(s + 1, *SHAPE), list(GRAD_NAMES), attn_mask=causal_mask(SHAPE[1]))

    @staticmethod
    def judge(out):
        s = StackGradients.SEED
        expect_structure(out, {"x": ANY, **{n: ANY for n in GRAD_NAMES}})
        vals = stack_values(s, 2, "layer", True)
        layers = layers_of(vals, 2, "layer", True)
        final = make_norm("layer", D, vals, "final_norm.")
        x = inputs(s).requires_grad_()
        y = run_layers(layers, x, final, attn_mask=causal_mask(SHAPE[1]))
        (y * randn(s + 1, *SHAPE)).sum().backward()
        params = {f"blocks.{i}.{k}": p for i, layer in enumerate(layers) for k, p in layer.named_parameters()}
        params.update({f"final_norm.{k}": p for k, p in final.named_parameters()})
        rename = {"attn.": "self_attn.", "ffn.0.": "linear1."}
        for name in ("x", *GRAD_NAMES):
            if name == "x":
                expected = x.grad
            else:
                torch_name = name
                for ours, theirs in rename.items():
                    torch_name = torch_name.replace(ours, theirs)
                expected = params[torch_name].grad
            if out[name] is None:
                raise CheckFailed(f"no gradient reached {name}: is it used in forward, and not detached?")
            expect_close(out[name], expected, what=f"the gradient of the loss with respect to {name}")
