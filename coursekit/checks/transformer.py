"""Checks for exercise 04: ``TransformerBlock`` and ``TransformerStack``.

Probes build small float64 blocks and stacks, copy seeded weights into them by the contract's
parameter names (``norm1``, ``attn``, ``norm2``, ``ffn.0``, ``ffn.3``; ``blocks.<i>.``,
``final_norm``) and return what they compute. Judges load the same weights into
``nn.TransformerEncoderLayer`` (``attn`` -> ``self_attn``, ``ffn.0``/``ffn.3`` ->
``linear1``/``linear2``) and torch's norms, and name the mistake from the outputs of known
wrong blocks on the same input.

*Torch's own layers*: the implementation checks (every check of the block's and the stack's values)
give no points for a block that is torch's layer. Their probes run under :class:`TorchLayerWatch`,
which observes, for the probe's duration, which of torch's transformer layers run (a global forward
pre-hook), which are reachable from the modules that ran (a bounded walk of their attributes,
containers, closures and classes, never a module's globals: a notebook's own comparison layer is
not the block's), and whether the fused encoder-layer kernel runs (a dispatch-level recorder, which
leaves ``nn.MultiheadAttention``'s fast path as it is). The record carries what it saw; the judge
fails on any of it.
"""
from __future__ import annotations

import functools
import gc
import types

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_pre_hook

from coursekit.checks import CheckFailed, frozen, register
from coursekit.checks.compare import ANY, expect_close, expect_structure, expect_tensor, paired
from coursekit.checks.ops import _DispatchSpy
from coursekit.checks.remote import is_remote, remotable
from coursekit.checks.seeded import (Parts, as_module, block_formula, block_spec, load_into, make_norm,
                                     norm_spec, randn, torch_layer, values)

D, H, FF = 16, 4, 32
SHAPE = (3, 6, D)  # 288 elements: enough to see a dropout rate

BLOCK_HINT = ("keep the contract's submodules: norm1, attn (nn.MultiheadAttention), norm2 and "
              "ffn (nn.Sequential(Linear, GELU, Dropout, Linear))")
STACK_HINT = "keep the blocks in self.blocks (an nn.ModuleList) and the final norm in self.final_norm"

POST_INSTEAD_OF_PRE = ("this is post-norm, x = norm(x + sublayer(x)), but norm_first=True asks for pre-norm: "
                       "x = x + sublayer(norm(x))")
PRE_INSTEAD_OF_POST = ("this is pre-norm, x = x + sublayer(norm(x)), but norm_first=False asks for post-norm: "
                       "x = norm(x + sublayer(x))")
RELU = "the FFN uses ReLU; the contract's FFN is Linear, GELU, Dropout, Linear"
TANH_GELU = "the FFN uses the tanh approximation of GELU; use nn.GELU() (exact)"
NO_ATTN_RESIDUAL = "the attention sublayer has no residual connection: add its input x back"
NO_FFN_RESIDUAL = "the FFN sublayer has no residual connection: add its input x back"
NORMED_RESIDUAL = "the residual is added to the normed input: add x, not norm(x)"


def causal_mask(t: int) -> torch.Tensor:
    """True above the diagonal: query i may not look at key j > i."""
    return torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1)


def padding_mask() -> torch.Tensor:
    """True marks a padded token: none in sequence 0, the last 2 in sequence 1, the last 1 in sequence 2."""
    kpm = torch.zeros(SHAPE[0], SHAPE[1], dtype=torch.bool)
    kpm[1, -2:] = True
    kpm[2, -1:] = True
    return kpm


def inputs(seed: int, scale: float = 1.0, offset: float = 0.3) -> torch.Tensor:
    return randn(seed, *SHAPE, scale=scale, offset=offset)


def block_values(seed: int, norm: str = "layer") -> dict:
    return values(block_spec(D, FF, norm), seed + 500)


def stack_spec(n_layers: int, norm: str, norm_first: bool) -> list:
    spec = [s for i in range(n_layers) for s in block_spec(D, FF, norm, f"blocks.{i}.")]
    return spec + (norm_spec(norm, D, "final_norm.") if norm_first else [])


def stack_values(seed: int, n_layers: int, norm: str, norm_first: bool) -> dict:
    return values(stack_spec(n_layers, norm, norm_first), seed + 700)


# --------------------------------------------------------------------------------------------
# Torch's own transformer layers, watched while an implementation check's probe runs
# --------------------------------------------------------------------------------------------

#: torch's transformer layers: a block that is one of them (or runs one) is not the student's block
TORCH_LAYERS = (nn.TransformerEncoderLayer, nn.TransformerDecoderLayer, nn.Transformer, nn.TransformerEncoder,
                nn.TransformerDecoder)
#: the kernels behind them (a whole encoder layer in one op); nn.MultiheadAttention's own
#: (``_native_multi_head_attention``) stays allowed: the contract requires nn.MultiheadAttention
TORCH_LAYER_OPS = frozenset({"_transformer_encoder_layer_fwd"})
#: what the implementation checks forbid, by name (``Check.forbidden_names``, for the static scan)
TORCH_LAYER_NAMES = frozenset(c.__name__ for c in TORCH_LAYERS) | TORCH_LAYER_OPS
WALK_LIMIT = 200_000  # objects the reachability walk visits at most


def _torch_layer_name(obj):
    """The name of the torch layer class ``obj`` is an instance of (a subclass counts), or None."""
    for c in type(obj).__mro__:
        if c in TORCH_LAYERS:
            return c.__name__
    return None


def _is_torch_or_builtin(cls) -> bool:
    mod = getattr(cls, "__module__", "") or ""
    return mod == "builtins" or mod == "torch" or mod.startswith("torch.")


def reachable_torch_layers(roots, limit: int = WALK_LIMIT) -> set:
    """Names of torch layers reachable from ``roots``: through attributes, containers, closures,
    default arguments, bound methods and the attributes of the student's classes. Modules, the
    globals of functions and torch's own classes are not entered (they lead to the whole program).
    Visits at most ``limit`` objects."""
    found, seen, todo = set(), set(), list(roots)
    while todo and len(seen) < limit:
        o = todo.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if issubclass(type(o), (types.ModuleType, str, bytes, int, float, complex, bool, type(None))):
            continue
        if issubclass(type(o), type):
            if not _is_torch_or_builtin(o):
                todo += list(vars(o).values()) + list(o.__bases__)
            continue
        name = _torch_layer_name(o)
        if name:
            found.add(name)
        if issubclass(type(o), types.FunctionType):
            owner = _borrowed_layer_code(o)
            if owner:
                found.add(owner)
            todo += [c.cell_contents for c in (o.__closure__ or ()) if _cell_full(c)]
            todo += [o.__defaults__ or (), o.__kwdefaults__ or {}, o.__dict__]
        elif issubclass(type(o), types.MethodType):
            todo += [o.__self__, o.__func__]
        elif issubclass(type(o), (staticmethod, classmethod)):
            todo.append(o.__func__)
        elif issubclass(type(o), property):
            todo += [o.fget, o.fset, o.fdel]
        else:
            todo += gc.get_referents(o)
    return found


def _borrowed_layer_code(fn) -> str | None:
    """The torch layer whose own method ``fn`` is (``TransformerEncoderLayer._sa_block`` taken as a
    plain function by the student's class), or None."""
    if getattr(fn, "__module__", None) != "torch.nn.modules.transformer":
        return None
    owner = (getattr(fn, "__qualname__", "") or "").split(".")[0]
    return owner if owner in {c.__name__ for c in TORCH_LAYERS} and owner != "Transformer" else None


def _cell_full(cell) -> bool:
    try:
        cell.cell_contents
        return True
    except ValueError:
        return False


def _layer_codes() -> dict:
    """The code objects of torch's transformer layers' own methods (``forward``, ``_sa_block``,
    ``_ff_block``, ``_mha_block``, ...): code object -> ``Class.method``."""
    codes = {}
    for c in TORCH_LAYERS:
        for name, v in vars(c).items():
            fn = getattr(v, "__func__", v)
            code = getattr(fn, "__code__", None)
            if isinstance(code, types.CodeType) and name != "__init__":
                codes[code] = f"{c.__name__}.{name}"
    return codes


_LAYER_CODES = _layer_codes()
#: their bytecode and names, for copies of the code objects (``code.replace``, ``FunctionType(code, ...)``)
_LAYER_BYTECODE = {(code.co_code, code.co_names): name for code, name in _LAYER_CODES.items()}


class _CodeWatch:
    """A profile function (this thread, and threads started while it holds) that notes when the
    code of torch's transformer layers runs, however it is called: bound, unbound
    (``nn.TransformerEncoderLayer.forward(block, x)``), as a borrowed ``_sa_block``, or as a copy
    of the code object. ``sys.setprofile`` is audited: switching it off from the notebook is seen
    by the grader's audit hook (autograder/inside/observers.py)."""

    def __init__(self, ran: set):
        self.ran, self.memo = ran, {}

    def __call__(self, frame, event, arg):
        if event != "call":
            return
        code = frame.f_code
        hit = self.memo.get(code)
        if hit is None:
            hit = _LAYER_CODES.get(code) or _LAYER_BYTECODE.get((code.co_code, code.co_names)) or ""
            self.memo[code] = hit
        if hit:
            self.ran.add(hit.split(".")[0])

    def __enter__(self):
        import sys
        import threading
        self._old, self._old_threads = sys.getprofile(), threading.getprofile()
        sys.setprofile(self)
        threading.setprofile(self)
        return self

    def __exit__(self, *exc):
        import sys
        import threading
        still = sys.getprofile() is self
        sys.setprofile(self._old)
        threading.setprofile(self._old_threads)
        if not still:
            self.ran.add("TransformerEncoderLayer (unknown: the watch on torch's layers was switched off)")
        return False


class TorchLayerWatch:
    """``with TorchLayerWatch() as w: probe...`` then ``w.observed()``: the torch layers that ran
    (a module call, or their methods' code, however called), those reachable from the modules that
    ran, and the fused encoder-layer ops that ran."""

    def __enter__(self):
        self.ran, self.modules, self.ops = set(), {}, set()
        self._hook = register_module_forward_pre_hook(self._pre)
        self._spy = _DispatchSpy(self.ops)
        self._spy.__enter__()
        self._code = _CodeWatch(self.ran)
        self._code.__enter__()
        return self

    def _pre(self, module, args):
        self.modules.setdefault(id(module), module)
        name = _torch_layer_name(module)
        if name:
            self.ran.add(name)

    def __exit__(self, *exc):
        self._code.__exit__(*exc)
        self._spy.__exit__(*exc)
        self._hook.remove()
        return False

    def observed(self) -> dict:
        return {"ran": sorted(self.ran), "reached": sorted(reachable_torch_layers(list(self.modules.values()))),
                "ops": sorted(self.ops & TORCH_LAYER_OPS)}


WATCHED = {"ran": ANY, "reached": ANY, "ops": ANY}


def judge_torch_layers(seen, owner: str) -> None:
    """Judge side of :class:`TorchLayerWatch`: fails when the student's code used torch's layers."""
    expect_structure(seen, WATCHED)
    if not all(isinstance(v, list) and all(isinstance(n, str) for n in v) for v in seen.values()):
        raise CheckFailed("the probe's record of torch's layers is malformed")
    tail = (f"the {owner}'s implementation checks give no points for torch's own layer. Build the block from "
            "the contract's submodules (norm1, attn, norm2, ffn) and write its forward yourself")
    if seen["ran"]:
        raise CheckFailed(f"your {owner} runs torch's {', '.join('nn.' + n for n in seen['ran'])} (its forward ran "
                          f"during this test): {tail}")
    if seen["ops"]:
        raise CheckFailed(f"your {owner} calls torch's {', '.join(seen['ops'])} (torch's whole encoder layer in "
                          f"one kernel): {tail}")
    if seen["reached"]:
        raise CheckFailed(f"your {owner} holds torch's {', '.join('nn.' + n for n in seen['reached'])} (reachable "
                          f"from the modules that ran): {tail}")


@remotable
def watch_begin(ns) -> TorchLayerWatch:
    """A :class:`TorchLayerWatch` that holds until :func:`watch_end` (the referee's probes: between
    the two, each of its requests runs with the watch on)."""
    return TorchLayerWatch().__enter__()


@remotable
def watch_end(watch: TorchLayerWatch) -> dict:
    if not isinstance(watch, TorchLayerWatch):
        raise CheckFailed("the watch on torch's layers is gone")
    watch.__exit__(None, None, None)
    return watch.observed()


@remotable
def silence_sublayer(blk, silent: str):
    """Exercise 04's dropout probe: torch's own dropouts inside the sublayers off, and the output
    projection of ``silent`` ("ffn" or "attn") zeroed, so that only the other sublayer's dropout shows."""
    if not (isinstance(getattr(blk, "ffn", None), nn.Sequential) and len(blk.ffn) == 4):
        raise CheckFailed("ffn should be nn.Sequential(Linear, GELU, Dropout, Linear)")
    blk.attn.dropout = 0.0  # dropout inside the sublayers is torch's; this check is about the adds
    blk.ffn[2].p = 0.0
    lin = blk.ffn[3] if silent == "ffn" else blk.attn.out_proj
    with torch.no_grad():
        lin.weight.zero_()
        lin.bias.zero_()
    return blk


@remotable
def grads_of(module, x, g, names, **kwargs) -> dict:
    """``module(x, **kwargs)``, then the gradients of ``sum(y * g)`` for ``x`` and the parameters ``names``."""
    x = x.clone().requires_grad_(True)
    y = expect_tensor(module(x, **kwargs), "the output")
    (y * g).sum().backward()
    return {"x": x.grad, **{n: module.get_parameter(n).grad for n in names}}


def no_torch_layers(owner: str):
    """Class decorator, under ``@register``: the probe runs under :class:`TorchLayerWatch` and its
    record carries what the watch saw; the judge fails on it before judging the values."""

    def deco(cls):
        probe, judge = cls.probe, cls.judge

        def watched_probe(ns):
            if is_remote(ns):  # the referee's probe: the watch runs where the student's code runs
                w = watch_begin(ns)
                try:
                    out = probe(ns)
                finally:
                    seen = watch_end(w)
                return {"value": out, "torch_layers": seen}
            with TorchLayerWatch() as w:
                out = probe(ns)
            return {"value": out, "torch_layers": w.observed()}

        def watched_judge(out):
            expect_structure(out, {"value": ANY, "torch_layers": ANY})
            judge_torch_layers(out["torch_layers"], owner)
            judge(out["value"])

        cls.probe, cls.judge = staticmethod(watched_probe), staticmethod(watched_judge)
        return cls

    return deco


# --------------------------------------------------------------------------------------------
# Probe side: the student's modules with our weights
# --------------------------------------------------------------------------------------------

@remotable
def build_block(ns, seed, *, norm="layer", norm_first=True, dropout=0.0, defaults=False, positional=False) -> nn.Module:
    """The student's TransformerBlock in float64 with our weights; ``defaults``: built as
    ``TransformerBlock(d_model, n_heads, d_ff)``, every other argument left to its default;
    ``positional``: every argument by position, in the contract's order."""
    if defaults:
        blk = ns["TransformerBlock"](D, H, FF)
    elif positional:
        blk = ns["TransformerBlock"](D, H, FF, dropout, norm_first, norm)
    else:
        blk = ns["TransformerBlock"](D, H, FF, dropout=dropout, norm_first=norm_first, norm=norm)
    blk = as_module(blk, "TransformerBlock(...)").double()
    load_into(blk, block_values(seed, norm), "TransformerBlock", BLOCK_HINT)
    return blk


@remotable
def build_stack(ns, seed, n_layers, *, norm="layer", norm_first=True, defaults=False, positional=False) -> nn.Module:
    """The student's TransformerStack in float64 with our weights; ``defaults``: built as
    ``TransformerStack(n_layers, d_model, n_heads, d_ff)``, every other argument left to its default;
    ``positional``: every argument by position, in the contract's order."""
    if defaults:
        stk = ns["TransformerStack"](n_layers, D, H, FF)
    elif positional:
        stk = ns["TransformerStack"](n_layers, D, H, FF, 0.0, norm_first, norm)
    else:
        stk = ns["TransformerStack"](n_layers, D, H, FF, dropout=0.0, norm_first=norm_first, norm=norm)
    stk = as_module(stk, "TransformerStack(...)").double()
    if not isinstance(getattr(stk, "blocks", None), nn.ModuleList):
        raise CheckFailed("TransformerStack's blocks should be an nn.ModuleList (a Python list hides the blocks' "
                          "parameters, so the tests cannot load weights into them)")
    if norm_first and not isinstance(getattr(stk, "final_norm", None), nn.Module):
        if defaults:
            raise CheckFailed(f"TransformerStack({n_layers}, d_model, n_heads, d_ff) has no final norm: the defaults are "
                              "dropout=0.0, norm_first=True, norm='layer', and a pre-norm stack ends with final_norm")
        raise CheckFailed("no final norm in the pre-norm stack: final_norm should be a norm of the chosen kind")
    load_into(stk, stack_values(seed, n_layers, norm, norm_first), "TransformerStack", STACK_HINT)
    return stk


# --------------------------------------------------------------------------------------------
# Judge side
# --------------------------------------------------------------------------------------------

def block_suspects(vals, x, norm_first, norm="layer", **masks) -> dict:
    """What known wrong blocks return on ``x`` with the same weights."""
    p = Parts(vals, D, H, FF, norm)
    f = lambda **kw: block_formula(p, x, norm_first=norm_first, **masks, **kw)  # noqa: E731
    return {
        (POST_INSTEAD_OF_PRE if norm_first else PRE_INSTEAD_OF_POST): block_formula(p, x, norm_first=not norm_first, **masks),
        RELU: f(act="relu"),
        TANH_GELU: f(act="tanh"),
        NO_ATTN_RESIDUAL: f(attn_residual=False),
        NO_FFN_RESIDUAL: f(ffn_residual=False),
        **({NORMED_RESIDUAL: f(normed_residual=True)} if norm_first else {}),
        "the block returns x unchanged: both sublayers must be added to it": x,
    }


def expected_block(vals, x, norm_first, norm="layer", attn_mask=None, key_padding_mask=None):
    layer = torch_layer(vals, D, H, FF, norm_first=norm_first, norm=norm)
    return layer(x, src_mask=attn_mask, src_key_padding_mask=key_padding_mask)


def layers_of(vals, n_layers, norm, norm_first):
    return [torch_layer(vals, D, H, FF, norm_first=norm_first, norm=norm, prefix=f"blocks.{i}.")
            for i in range(n_layers)]


def run_layers(layers, x, final=None, **masks):
    for layer in layers:
        x = layer(x, src_mask=masks.get("attn_mask"), src_key_padding_mask=masks.get("key_padding_mask"))
    return x if final is None else final(x)


# --------------------------------------------------------------------------------------------
# TransformerBlock
# --------------------------------------------------------------------------------------------

@register("transformer_block_parameters", needs=("TransformerBlock",))
class BlockParameters:
    """TransformerBlock has the contract's submodules and parameter names, passes dropout to attention and FFN, keeps x's shape"""

    @staticmethod
    def probe(ns):
        out = {}
        for norm in ("layer", "rms"):
            blk = as_module(ns["TransformerBlock"](D, H, FF, dropout=0.25, norm_first=True, norm=norm),
                            "TransformerBlock(...)")
            attn, ffn = getattr(blk, "attn", None), getattr(blk, "ffn", None)
            out[norm] = {
                "keys": sorted(blk.state_dict().keys()),
                "attn": type(attn).__name__,
                "batch_first": getattr(attn, "batch_first", None) is True,
                "attn_dropout": float(getattr(attn, "dropout", -1.0)) if isinstance(attn, nn.MultiheadAttention) else -1.0,
                "ffn": [type(m).__name__ for m in ffn] if isinstance(ffn, nn.Sequential) else type(ffn).__name__,
                "ffn_dropout": float(ffn[2].p) if isinstance(ffn, nn.Sequential) and len(ffn) == 4
                and isinstance(ffn[2], nn.Dropout) else -1.0,
            }
        blk = blk.eval()
        with torch.no_grad():
            out["shape"] = list(blk(torch.randn(2, 5, D)).shape)
        return out

    @staticmethod
    def judge(out):
        described = {"keys": ANY, "attn": ANY, "batch_first": ANY, "attn_dropout": ANY, "ffn": ANY, "ffn_dropout": ANY}
        expect_structure(out, {"layer": described, "rms": described, "shape": ANY})
        for norm in ("layer", "rms"):
            o = out[norm]
            call = f"TransformerBlock(d_model, n_heads, d_ff, dropout=0.25, norm={norm!r})"
            want = sorted(name for name, _, _ in block_spec(D, FF, norm))
            if o["keys"] != want:
                if norm == "rms" and "norm1.bias" in o["keys"]:
                    raise CheckFailed(f"{call}: norm1 has a bias, so norm='rms' is ignored: "
                                      "use nn.RMSNorm(d_model, eps=1e-6), which has a weight only")
                missing = sorted(set(want) - set(o["keys"]))
                extra = sorted(set(o["keys"]) - set(want))
                raise CheckFailed(f"{call} has the wrong parameters: missing {missing or 'none'}, unexpected "
                                  f"{extra or 'none'}. {BLOCK_HINT[0].upper()}{BLOCK_HINT[1:]}.")
            if o["attn"] != "MultiheadAttention":
                raise CheckFailed(f"{call}: attn should be nn.MultiheadAttention, not {o['attn']}")
            if not o["batch_first"]:
                raise CheckFailed(f"{call}: attn should be built with batch_first=True (inputs are [B, T, d_model])")
            if o["attn_dropout"] != 0.25:
                raise CheckFailed(f"{call}: attn's own dropout is {o['attn_dropout']}; pass dropout=dropout to "
                                  "nn.MultiheadAttention")
            if o["ffn"] != ["Linear", "GELU", "Dropout", "Linear"]:
                raise CheckFailed(f"{call}: ffn should be nn.Sequential(Linear, GELU, Dropout, Linear), not {o['ffn']}")
            if o["ffn_dropout"] != 0.25:
                raise CheckFailed(f"{call}: ffn[2] should be nn.Dropout(dropout), its p is {o['ffn_dropout']}")
        if out["shape"] != [2, 5, D]:
            raise CheckFailed(f"the block's output has shape {out['shape']}, expected [2, 5, {D}] (the input's shape)")


CASES = ((100, 1.0, 0.3), (101, 3.0, -1.0))  # (seed, scale, offset)


#: a block or stack built with the defaults (pre-norm, LayerNorm, no dropout), run in train mode and eval mode
DEFAULTS_CASE = (102, 1.0, 0.3)


def _probe_block(ns, norm_first, norm="layer", cases=CASES, defaults=False):
    out = []
    for seed, scale, offset in cases:
        blk = build_block(ns, seed, norm_first=norm_first, norm=norm, defaults=defaults)
        x = inputs(seed, scale, offset)
        y_train = blk.train()(x)
        with torch.no_grad():
            y_eval = blk.eval()(x)  # torch may take its fused attention path here
        out.append([y_train, y_eval])
    return out


def _judge_block(out, norm_first, norm="layer", cases=CASES, extra_suspects=None, defaults=False):
    for (seed, scale, offset), ys in paired(cases, out, [ANY, ANY]):
        vals, x = block_values(seed, norm), inputs(seed, scale, offset)
        expected = expected_block(vals, x, norm_first, norm)
        suspects = block_suspects(vals, x, norm_first, norm)
        suspects.update(extra_suspects(vals, x) if extra_suspects else {})
        first = "pre" if norm_first else "post"
        for y, mode in zip(ys, ("train", "eval")):
            expect_close(y, expected, suspects=suspects,
                         what=f"TransformerBlock(d_model, n_heads, d_ff)'s output ({mode} mode; the defaults are "
                         "dropout=0.0, norm_first=True, norm='layer')" if defaults else
                         f"the {first}-norm block's output (norm={norm!r}, {mode} mode)")


@register("transformer_block_prenorm_matches_torch", needs=("TransformerBlock",), forbidden_names=TORCH_LAYER_NAMES)
@no_torch_layers("TransformerBlock")
class BlockPreNorm:
    """A pre-norm TransformerBlock computes what nn.TransformerEncoderLayer(norm_first=True, activation='gelu') computes with the same weights; TransformerBlock(d_model, n_heads, d_ff), with the defaults, is that block"""

    @staticmethod
    def probe(ns):
        return {"cases": _probe_block(ns, True), "defaults": _probe_block(ns, True, cases=(DEFAULTS_CASE,), defaults=True)}

    @staticmethod
    @torch.no_grad()
    def judge(out):
        expect_structure(out, {"cases": ANY, "defaults": ANY})
        _judge_block(out["cases"], True)
        _judge_block(out["defaults"], True, cases=(DEFAULTS_CASE,), defaults=True)


def _probe_pre_and_post(ns, seed, x, x2, **masks) -> list:
    """A pre-norm and a post-norm block, each on ``x`` and on ``x2`` with the same masks: by keyword to
    the pre-norm block, by position (``forward(x, attn_mask, key_padding_mask)``) to the post-norm one."""
    out = []
    blk = build_block(ns, seed, norm_first=True)
    out.append([blk(x, **masks), blk(x2, **masks)])
    blk = build_block(ns, seed, norm_first=False)
    by_position = (masks.get("attn_mask"), masks.get("key_padding_mask"))
    out.append([blk(x, *by_position), blk(x2, *by_position)])
    return out


@register("transformer_block_causal_mask", needs=("TransformerBlock",), forbidden_names=TORCH_LAYER_NAMES)
@no_torch_layers("TransformerBlock")
class BlockCausalMask:
    """attn_mask reaches the attention: with a causal mask, changing the last tokens leaves earlier outputs unchanged, as in torch"""

    SEED = 120

    @staticmethod
    def probe(ns):
        s = BlockCausalMask.SEED
        x = inputs(s)
        x2 = x.clone()
        x2[:, -2:] = inputs(s + 1)[:, -2:]
        return _probe_pre_and_post(ns, s, x, x2, attn_mask=causal_mask(SHAPE[1]))

    @staticmethod
    @torch.no_grad()
    def judge(out):
        s = BlockCausalMask.SEED
        x, m, vals = inputs(s), causal_mask(SHAPE[1]), block_values(s)
        for first, (y1, y2) in paired((True, False), out, [ANY, ANY]):
            name = "pre" if first else "post"
            expected = expected_block(vals, x, first, attn_mask=m)
            suspects = {"attn_mask is ignored: pass it on to self.attn(..., attn_mask=attn_mask)":
                        expected_block(vals, x, first)}
            suspects.update(block_suspects(vals, x, first, attn_mask=m))
            expect_close(y1, expected, what=f"the {name}-norm block's output with a causal attn_mask",
                         suspects=suspects)
            y2 = expect_tensor(y2, "the output")
            expect_close(y2[:, :-2], expected[:, :-2], what=(
                f"the {name}-norm block's output before the last two tokens, after changing only those "
                "(with a causal mask, earlier tokens cannot see them)"))


# --------------------------------------------------------------------------------------------
# TransformerStack
# --------------------------------------------------------------------------------------------

STRUCT_CASES = ((3, True, "layer"), (2, False, "layer"), (2, True, "rms"))  # (n_layers, norm_first, norm)


@register("transformer_stack_structure", needs=("TransformerStack",))
class StackStructure:
    """TransformerStack holds n_layers independent blocks in an nn.ModuleList and a final norm only when norm_first, and passes dropout on to every block"""

    @staticmethod
    def probe(ns):
        out = []
        for n, first, norm in STRUCT_CASES:
            stk = as_module(ns["TransformerStack"](n, D, H, FF, dropout=0.0, norm_first=first, norm=norm),
                            "TransformerStack(...)")
            blocks = getattr(stk, "blocks", None)
            out.append({
                "blocks": type(blocks).__name__,
                "n_blocks": len(blocks) if isinstance(blocks, (nn.ModuleList, list, tuple)) else -1,
                "distinct": len({id(b) for b in blocks}) if isinstance(blocks, (nn.ModuleList, list, tuple)) else -1,
                "n_params": sum(p.numel() for p in stk.parameters()),
                "keys": sorted(stk.state_dict().keys()),
                "has_final_norm_attr": hasattr(stk, "final_norm"),
                "final_norm_is_none": getattr(stk, "final_norm", None) is None,
            })
        # dropout reaches every block: each one's attention dropout and ffn[2].p, as the contract names them
        stk = as_module(ns["TransformerStack"](2, D, H, FF, dropout=STACK_DROPOUT), "TransformerStack(...)")
        blocks = getattr(stk, "blocks", None)
        dropouts = [[_float_or(getattr(getattr(b, "attn", None), "dropout", None)),
                     _float_or(getattr(_item(getattr(b, "ffn", None), 2), "p", None))]
                    for b in (blocks if isinstance(blocks, nn.ModuleList) else [])]
        return {"cases": out, "dropout": dropouts}

    @staticmethod
    def judge(out):
        described = {"blocks": ANY, "n_blocks": ANY, "distinct": ANY, "n_params": ANY, "keys": ANY,
                     "has_final_norm_attr": ANY, "final_norm_is_none": ANY}
        expect_structure(out, {"cases": ANY, "dropout": ANY})
        _judge_structure(out["cases"], described)
        call = f"TransformerStack(2, d_model, n_heads, d_ff, dropout={STACK_DROPOUT})"
        dropout = out["dropout"]
        if not isinstance(dropout, list) or len(dropout) != 2 or any(
                not isinstance(got, list) or len(got) != 2 for got in dropout):
            raise CheckFailed(f"{call}: expected 2 blocks in .blocks, each with an attention dropout and an "
                              f"FFN dropout (ffn[2].p); found {dropout!r}")
        for i, got in enumerate(dropout):
            if got != [STACK_DROPOUT, STACK_DROPOUT]:
                raise CheckFailed(f"{call}: block {i} has attention dropout {got[0]} and FFN dropout {got[1]}: "
                                  "pass dropout on to every TransformerBlock")


#: the dropout a stack is built with to see that it reaches the blocks
STACK_DROPOUT = 0.25


def _float_or(v, default=-1.0) -> float:
    """A probe's reading of a number the student's object holds (``default`` when it is not one)."""
    return float(v) if type(v) in (int, float) else default


def _item(seq, i):
    return seq[i] if isinstance(seq, nn.Sequential) and len(seq) > i else None


def _judge_structure(out, described):
    for (n, first, norm), o in paired(STRUCT_CASES, out, described):
        call = f"TransformerStack(n_layers={n}, ..., norm_first={first}, norm={norm!r})"
        if o["blocks"] not in ("ModuleList",):
            if o["blocks"] in ("list", "tuple"):
                raise CheckFailed(f"{call}: blocks is a Python {o['blocks']}; make it an nn.ModuleList so the "
                                  "blocks' parameters are registered (optimizer, state_dict, .to())")
            raise CheckFailed(f"{call}: blocks should be an nn.ModuleList of TransformerBlocks, not {o['blocks']}")
        if o["n_blocks"] != n:
            raise CheckFailed(f"{call}: blocks holds {o['n_blocks']} blocks, expected n_layers = {n}")
        want = sorted(name for name, _, _ in stack_spec(n, norm, first))
        n_want = sum(torch.Size(shape).numel() for _, shape, _ in stack_spec(n, norm, first))
        if o["distinct"] < n or (o["n_params"] < n_want and o["keys"] == want):
            raise CheckFailed(f"{call}: the blocks share one set of weights: make n_layers separate "
                              "TransformerBlock(...) objects (not [block] * n_layers)")
        if not o["has_final_norm_attr"]:
            raise CheckFailed(f"{call}: the stack has no attribute final_norm "
                              "(a norm when norm_first, else None)")
        if first and o["final_norm_is_none"]:
            raise CheckFailed(f"{call}: no final norm in the pre-norm stack: final_norm should be "
                              f"{'nn.LayerNorm(d_model)' if norm == 'layer' else 'nn.RMSNorm(d_model, eps=1e-6)'}")
        if not first and not o["final_norm_is_none"]:
            raise CheckFailed(f"{call}: a final norm in the post-norm stack: every post-norm block already ends "
                              "with a norm, so final_norm should be None")
        if o["keys"] != want:
            if norm == "rms" and "final_norm.bias" in o["keys"]:
                raise CheckFailed(f"{call}: final_norm has a bias, so it ignores norm='rms': "
                                  "use nn.RMSNorm(d_model, eps=1e-6)")
            missing, extra = sorted(set(want) - set(o["keys"])), sorted(set(o["keys"]) - set(want))
            raise CheckFailed(f"{call} has the wrong parameters: missing {missing[:6] or 'none'}, unexpected "
                              f"{extra[:6] or 'none'}. {STACK_HINT[0].upper()}{STACK_HINT[1:]}.")
        if o["n_params"] != n_want:
            raise CheckFailed(f"{call} has {o['n_params']} parameters, expected {n_want}")


def _stack_reference(seed, n, norm, first, x, **masks):
    """(expected, suspects) for a stack of torch layers with our weights."""
    vals = stack_values(seed, n, norm, first)
    layers = layers_of(vals, n, norm, first)
    final = make_norm(norm, D, vals, "final_norm.") if first else None
    expected = run_layers(layers, x, final, **masks)
    suspects = {}
    if first:
        suspects["no final norm in the pre-norm stack: finish with H = final_norm(H^(L))"] = run_layers(layers, x, **masks)
        suspects["the blocks share one set of weights (all layers compute the last one)"] = \
            run_layers([layers[-1]] * n, x, final, **masks)
        if norm == "rms":
            lnorm = make_norm("layer", D, vals, "final_norm.")
            suspects["final_norm ignores norm='rms': use nn.RMSNorm(d_model, eps=1e-6)"] = run_layers(layers, x, lnorm, **masks)
    else:
        suspects["a final norm in the post-norm stack: final_norm should be None"] = \
            run_layers(layers, x, make_norm(norm, D), **masks)
        suspects["the blocks share one set of weights (all layers compute the last one)"] = \
            run_layers([layers[-1]] * n, x, **masks)
    if masks:
        suspects["the masks are not passed on to the blocks"] = run_layers(layers, x, final)
    return expected, suspects


def band_mask(t: int, width: int = 2) -> torch.Tensor:
    """True outside a band |i - j| <= width: unlike a causal mask, a query sees later (padded) keys."""
    i = torch.arange(t)
    return (i[:, None] - i[None, :]).abs() > width


def _stack_masks() -> dict:
    return dict(attn_mask=band_mask(SHAPE[1]), key_padding_mask=padding_mask())


def _stack_cases(first):
    # post-norm stacks are built, and given their masks, by position: TransformerStack(n_layers, d_model, n_heads,
    # d_ff, dropout, norm_first, norm) and forward(x, attn_mask, key_padding_mask), the contract's order
    cases = (frozen(seed=200, n=3, first=first, masks=False, positional=not first),
             frozen(seed=201, n=2, first=first, masks=True, positional=not first))
    # pre-norm: also TransformerStack(n_layers, d_model, n_heads, d_ff) with nothing else given, in train mode
    return cases + (frozen(seed=202, n=2, first=True, masks=False, defaults=True),) if first else cases


def _probe_stack(ns, cases, norm="layer"):
    out = []
    for c in cases:
        stk = build_stack(ns, c["seed"], c["n"], norm=norm, norm_first=c["first"], defaults=c.get("defaults", False),
                          positional=c.get("positional", False))
        x = inputs(c["seed"])
        if c["masks"] and c.get("positional"):
            m = _stack_masks()
            out.append(stk(x, m["attn_mask"], m["key_padding_mask"]))
        elif c["masks"]:
            out.append(stk(x, **_stack_masks()))
        else:
            out.append(stk(x))
    return out


def _judge_stack(out, cases, norm="layer"):
    for c, y in paired(cases, out):
        x = inputs(c["seed"])
        masks = _stack_masks() if c["masks"] else {}
        expected, suspects = _stack_reference(c["seed"], c["n"], norm, c["first"], x, **masks)
        keep = ~padding_mask() if c["masks"] else torch.ones(SHAPE[:2], dtype=torch.bool)
        y = expect_tensor(y, "the stack's output")
        if y.shape != x.shape:
            raise CheckFailed(f"the stack's output has shape {tuple(y.shape)}, expected {tuple(x.shape)}")
        what = (f"the {'pre' if c['first'] else 'post'}-norm stack's output (n_layers={c['n']}, norm={norm!r}"
                + (", a banded attn_mask and a key_padding_mask; unpadded tokens)" if c["masks"] else ")"))
        if c.get("defaults"):
            what = (f"TransformerStack({c['n']}, d_model, n_heads, d_ff)'s output in train mode (the defaults are "
                    "dropout=0.0, norm_first=True, norm='layer')")
        expect_close(y[keep], expected[keep], what=what, suspects={k: v[keep] for k, v in suspects.items()})


@register("transformer_stack_prenorm_matches_torch", needs=("TransformerStack",), forbidden_names=TORCH_LAYER_NAMES)
@no_torch_layers("TransformerStack")
class StackPreNorm:
    """A pre-norm TransformerStack equals its blocks applied in turn (masks passed on), then the final LayerNorm, as torch's layers; TransformerStack(n_layers, d_model, n_heads, d_ff), with the defaults, is that stack"""

    probe = staticmethod(lambda ns: _probe_stack(ns, _stack_cases(True)))
    judge = staticmethod(torch.no_grad()(lambda out: _judge_stack(out, _stack_cases(True))))




# --------------------------------------------------------------------------------------------
# Compilers of torch's layers, refused in the grading sandbox
# --------------------------------------------------------------------------------------------

def _is_torch_layer(obj, depth: int = 0) -> bool:
    """Whether ``obj`` is, holds or runs torch's transformer layers: a layer class, a module with
    one among its submodules, a layer's method (bound or borrowed), a partial of one."""
    if depth > 4 or obj is None:
        return False
    if isinstance(obj, type):
        return issubclass(obj, TORCH_LAYERS)
    if isinstance(obj, nn.Module):
        return any(isinstance(m, TORCH_LAYERS) for m in obj.modules())
    if isinstance(obj, types.MethodType):
        return _is_torch_layer(obj.__self__, depth + 1) or _is_torch_layer(obj.__func__, depth + 1)
    if isinstance(obj, functools.partial):
        return _is_torch_layer(obj.func, depth + 1) or any(_is_torch_layer(a, depth + 1) for a in obj.args)
    code = getattr(obj, "__code__", None)
    if isinstance(code, types.CodeType):
        return bool(_borrowed_layer_code(obj) or _LAYER_CODES.get(code)
                    or _LAYER_BYTECODE.get((code.co_code, code.co_names)))
    return False


def _refusing(fn, what: str, arg: int = 0, key: str | None = None):
    @functools.wraps(fn)
    def guarded(*args, **kwargs):
        target = kwargs.get(key) if key and key in kwargs else (args[arg] if len(args) > arg else None)
        if _is_torch_layer(target):
            raise RuntimeError(f"{what} of torch's transformer layers is switched off while grading: torch's layer "
                               "would compute the block for you. Build the block from its parts (exercise 04)")
        return fn(*args, **kwargs)
    guarded.__resnorm_guard__ = True
    return guarded


def _refusing_any(fn, what: str):
    """``fn`` switched off: a compiled archive (TorchScript, an exported program) holds code that runs
    outside Python, and what it holds cannot be told from a name (torch's own transformer layer
    scripted and saved elsewhere loads as any module: the twelfth red team's route)."""
    @functools.wraps(fn)
    def refused(*args, **kwargs):
        raise RuntimeError(f"{what} is switched off while grading: a compiled archive runs its code outside "
                           "Python, where the grader cannot see what it computes. Build the code in the notebook")
    refused.__resnorm_guard__ = True
    return refused


def block_layer_compilers() -> list:
    """In the grading sandbox, before any student code: TorchScript, tracing, ``torch.compile``,
    ``torch.export`` and ``torch.fx`` refuse torch's transformer layers (their compiled forms run
    the layer's code outside Python, where no watch sees it), and loading a compiled archive
    (``torch.jit.load``, ``torch.export.load``, the lite interpreter and torch._C's importers) is
    refused whatever it holds. Every place the entry points live is patched; returns
    ``[(owner, name)]`` for the observers' identity checks."""
    import torch.export
    import torch.fx
    import torch.jit._recursive
    import torch.jit._script
    import torch.jit._trace
    import torch.fx._symbolic_trace
    import torch._dynamo
    import torch._dynamo.eval_frame

    # dynamo wraps torch.jit.trace, trace_module and Tracer.trace once, at its first compile
    # (TorchPatcher.patch, cached): done now, so that the guards below wrap its versions and stay
    # in place when the notebook compiles its own code
    torch._dynamo.eval_frame.TorchPatcher.patch()
    patched = []

    def patch(owners, name, what, arg=0, key=None):
        original = getattr(owners[0], name, None)
        if original is None or getattr(original, "__resnorm_guard__", False):
            return
        guarded = _refusing(original, what, arg, key)
        for owner in owners:
            if getattr(owner, name, None) is original:
                setattr(owner, name, guarded)
                patched.append((owner, name))

    patch([torch.jit._script, torch.jit], "script", "torch.jit.script", 0, "obj")
    patch([torch.jit._recursive], "create_script_module", "torch.jit.script", 0, "nn_module")
    patch([torch.jit._trace, torch.jit], "trace", "torch.jit.trace", 0, "func")
    patch([torch.jit._trace, torch.jit], "trace_module", "torch.jit.trace_module", 0, "mod")
    patch([torch], "compile", "torch.compile", 0, "model")
    patch([torch._dynamo.eval_frame._TorchDynamoContext], "__call__", "torch._dynamo", 1, "fn")  # optimize(...)(layer)
    patch([torch.export], "export", "torch.export.export", 0, "mod")
    patch([torch.fx._symbolic_trace, torch.fx], "symbolic_trace", "torch.fx.symbolic_trace", 0, "root")
    import torch.jit._serialization
    import torch.jit.mobile
    loaders = [([torch.jit._serialization, torch.jit], "load", "torch.jit.load"),
               ([torch.export], "load", "torch.export.load"),
               ([torch.jit.mobile], "_load_for_lite_interpreter", "torch.jit.mobile's loader")]
    loaders += [([torch._C], name, f"torch._C.{name}") for name in (
        "import_ir_module", "import_ir_module_from_buffer", "_import_ir_module_from_package",
        "_load_for_lite_interpreter", "_load_for_lite_interpreter_from_buffer",
        "_load_jit_module_from_bytes", "_load_jit_module_from_file")]
    for owners, name, what in loaders:
        original = getattr(owners[0], name, None)
        if original is None or getattr(original, "__resnorm_guard__", False):
            continue
        refused = _refusing_any(original, what)
        for owner in owners:
            if getattr(owner, name, None) is original:
                setattr(owner, name, refused)
                patched.append((owner, name))
    original_trace = torch.fx._symbolic_trace.Tracer.trace
    if not getattr(original_trace, "__resnorm_guard__", False):
        torch.fx._symbolic_trace.Tracer.trace = _refusing(original_trace, "torch.fx tracing", 1, "root")
        patched.append((torch.fx._symbolic_trace.Tracer, "trace"))
    return patched
