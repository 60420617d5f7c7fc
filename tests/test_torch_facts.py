"""Facts about PyTorch that the book's prose states, checked against the installed version.

Each test is named for the fact it checks; the chapter that states it is in the docstring. If a
PyTorch upgrade breaks one of these, the chapter's sentence has to change with it.
"""
from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

pytestmark = pytest.mark.book


def _eps_used_by_rmsnorm(dtype: torch.dtype) -> float:
    """Recover the eps nn.RMSNorm(eps=None) adds, from a row whose mean square (1e-8) is tiny."""
    row = torch.full((8,), 1e-4)
    out = nn.RMSNorm(8, dtype=dtype)(row.to(dtype)).detach().double()[0].item()
    return (1e-4 / out) ** 2 - 1e-8


# --- norms: defaults and parameters (chapters 03, 04, 07, 09) ---------------------------------

def test_layernorm_default_eps_is_1e_5():
    """Chapters 03, 04, 07: nn.LayerNorm's default eps is 1e-5."""
    assert nn.LayerNorm(8).eps == 1e-5


def test_rmsnorm_default_eps_is_none():
    """Chapters 04, 07: nn.RMSNorm has no numeric default; its eps attribute is None."""
    assert nn.RMSNorm(8).eps is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_rmsnorm_eps_none_uses_float32_machine_eps_for_float32_float16_bfloat16(dtype):
    """Chapters 04, 07, 09: with eps=None the kernel adds float32's machine epsilon (1.19e-7),
    not the 16-bit type's own (9.8e-4 for float16, 7.8e-3 for bfloat16)."""
    used = _eps_used_by_rmsnorm(dtype)
    assert used == pytest.approx(torch.finfo(torch.float32).eps, rel=0.02)
    if dtype != torch.float32:
        assert used < torch.finfo(dtype).eps / 100


def test_rmsnorm_eps_none_uses_float64_machine_eps_for_float64():
    """Chapter 04: float64 inputs get float64's machine epsilon."""
    assert _eps_used_by_rmsnorm(torch.float64) == pytest.approx(torch.finfo(torch.float64).eps, rel=0.05)


def test_rmsnorm_explicit_eps_1e_6_matches_formula():
    """Chapters 04, 07: nn.RMSNorm(d, eps=1e-6) computes x / sqrt(mean(x^2) + 1e-6) * gamma."""
    x = torch.randn(3, 16, dtype=torch.float64)
    ref = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    out = nn.RMSNorm(16, eps=1e-6, dtype=torch.float64)(x)
    assert torch.allclose(out, ref)


def test_elementwise_affine_defaults_true_for_layernorm_and_rmsnorm():
    """Chapters 03, 04: both norms have learned parameters by default."""
    assert nn.LayerNorm(8).elementwise_affine is True
    assert nn.RMSNorm(8).elementwise_affine is True


def test_layernorm_gamma_starts_at_ones_and_beta_at_zeros():
    """Chapter 03: gamma (weight) is initialized to ones, beta (bias) to zeros."""
    ln = nn.LayerNorm(8)
    assert torch.equal(ln.weight.detach(), torch.ones(8))
    assert torch.equal(ln.bias.detach(), torch.zeros(8))


def test_rmsnorm_has_weight_of_ones_and_no_bias():
    """Chapter 04: RMSNorm's only parameter is weight (ones); there is no shift."""
    rms = nn.RMSNorm(8)
    assert torch.equal(rms.weight.detach(), torch.ones(8))
    assert [name for name, _ in rms.named_parameters()] == ["weight"]


def test_parameter_counts_layernorm_4096_is_8192_rmsnorm_4096_is_4096():
    """Chapter 04, exercise: nn.LayerNorm(4096) has 8192 parameters, nn.RMSNorm(4096) 4096."""
    assert sum(p.numel() for p in nn.LayerNorm(4096).parameters()) == 8192
    assert sum(p.numel() for p in nn.RMSNorm(4096).parameters()) == 4096


def test_layernorm_uses_population_variance():
    """Chapter 03: LayerNorm divides by D, not D-1 ((2, 4, 6, 8) has variance 5)."""
    x = torch.tensor([2.0, 4.0, 6.0, 8.0])
    by_hand = (x - x.mean()) / torch.sqrt(((x - x.mean()) ** 2).mean() + 1e-5)
    assert torch.allclose(nn.LayerNorm(4)(x), by_hand, atol=1e-6)
    assert ((x - x.mean()) ** 2).mean().item() == 5.0


def test_torch_var_default_is_unbiased():
    """Chapter 03: torch.var divides by D-1 by default ((2, 4, 6, 8) gives 6.67)."""
    x = torch.tensor([2.0, 4.0, 6.0, 8.0])
    assert x.var().item() == pytest.approx(20 / 3)
    assert x.var(unbiased=False).item() == pytest.approx(5.0)


def test_layernorm_over_size_one_axis_returns_beta():
    """Chapter 08: LayerNorm over an axis of size 1 outputs beta (zeros) for every input."""
    out = nn.LayerNorm(1)(torch.randn(2, 5, 1))
    assert torch.equal(out.detach(), torch.zeros(2, 5, 1))


def test_batchnorm_training_mode_refuses_a_batch_of_one():
    """Chapter 03: BatchNorm1d in training mode raises on a single value per feature."""
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        nn.BatchNorm1d(8).train()(torch.randn(1, 8))


def test_batchnorm_batch_of_two_gives_plus_minus_d_over_sqrt_d2_plus_eps():
    """Chapter 03: with two rows, BatchNorm's outputs are +-d / sqrt(d^2 + eps), d = half the gap."""
    bn = nn.BatchNorm1d(8).train()
    pair = torch.randn(2, 8)
    out = bn(pair).detach()
    d = (pair[0] - pair[1]) / 2
    assert torch.allclose(out[0], d / torch.sqrt(d ** 2 + bn.eps), atol=1e-6)
    assert torch.allclose(out[1], -out[0], atol=1e-6)


# --- dtype limits and thresholds (chapters 01, 07, 08) ------------------------------------------

def test_float16_largest_finite_is_65504():
    """Chapters 03, 07: float16 overflows above 65504."""
    assert torch.finfo(torch.float16).max == 65504.0


def test_float16_256_squared_overflows_to_inf():
    """Chapters 04, 07: 256**2 = 65536 does not fit in float16."""
    assert torch.isinf(torch.tensor(256.0, dtype=torch.float16) ** 2)


def test_float16_255_9_squared_does_not_overflow():
    """Chapter 07: 255.9 is stored as 255.875 in float16, whose square 65472 fits."""
    v = torch.tensor(255.9, dtype=torch.float16)
    assert v.item() == 255.875
    assert (v ** 2).item() == 65472.0


def test_float16_has_no_number_between_255_875_and_256():
    """Chapter 07: sqrt(65504) ~ 255.94 falls between two adjacent float16 numbers."""
    assert torch.tensor(255.9375, dtype=torch.float16).item() in (255.875, 256.0)
    assert torch.nextafter(torch.tensor(255.875, dtype=torch.float16),
                           torch.tensor(300.0, dtype=torch.float16)).item() == 256.0


def test_naive_float16_rmsnorm_square_overflows_at_256_layernorm_at_deviation_256():
    """Chapter 07: RMSNorm's x^2 overflows once |x| >= 256, LayerNorm's (x - mu)^2 once |x - mu| >= 256."""
    far = torch.tensor([500.0, 100.0] * 4, dtype=torch.float16)     # |x| > 256, |x - mu| = 200
    assert torch.isinf(far.pow(2).mean())
    assert torch.isfinite((far - far.mean()).pow(2).mean())
    wide = torch.tensor([256.0, -256.0] * 4, dtype=torch.float16)   # |x - mu| = 256
    assert torch.isinf((wide - wide.mean()).pow(2).mean())


def test_float16_mean_accumulates_in_float32_but_a_float16_sum_overflows_at_rms_11_5():
    """Chapter 07: at D = 512 and an RMS of 11.5 (largest entry far below 256) the sum of the
    float16 squares is inf once rounded to float16, while mean(x^2) is finite: torch's mean
    accumulates and divides before rounding. The sum passes 65504 at an RMS of sqrt(65504/512)."""
    unit = torch.randn(4, 512, generator=torch.Generator().manual_seed(0))
    x = (unit / unit.pow(2).mean(-1, keepdim=True).sqrt() * 11.5).half()
    assert x.abs().max().item() < 64
    assert torch.isinf(x.pow(2).sum(-1)).all()
    assert torch.isfinite(x.pow(2).mean(-1)).all()
    assert x.pow(2).mean(-1).float().sub(11.5 ** 2).abs().max() < 1
    y = x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) / 512 + 1e-6)
    assert (y == 0).all()
    assert math.sqrt(65504 / 512) == pytest.approx(11.31, abs=0.01)
    at_11 = (unit / unit.pow(2).mean(-1, keepdim=True).sqrt() * 11.0).half()
    assert torch.isfinite(at_11.pow(2).sum(-1)).all()


def test_float16_row_with_underflowing_variance_gives_inf_not_nan():
    """Chapter 07: with eps 1e-12 (0 in float16) a non-constant row whose squared deviations
    underflow gives +-inf; a constant row gives NaN."""
    def naive(x):
        mu = x.mean(-1, keepdim=True)
        return (x - mu) / torch.sqrt((x - mu).pow(2).mean(-1, keepdim=True) + torch.tensor(1e-12, dtype=x.dtype))

    tiny = torch.tensor([[1e-4, -1e-4] * 4], dtype=torch.float16)
    out = naive(tiny)
    assert torch.isinf(out).all() and not torch.isnan(out).any()
    assert (torch.sign(out) == torch.sign(tiny)).all()
    assert torch.isnan(naive(torch.full((1, 8), 3.0, dtype=torch.float16))).all()


def test_1e_12_flushes_to_zero_in_float16():
    """Chapters 07, 08, 09: BERT's eps 1e-12 becomes 0 in float16."""
    assert torch.tensor(1e-12, dtype=torch.float16).item() == 0.0


def test_1e_12_survives_in_bfloat16_as_1_00187e_12():
    """Chapters 07, 08: bfloat16 keeps 1e-12, as about 1.00187e-12."""
    b = torch.tensor(1e-12, dtype=torch.bfloat16).item()
    assert b != 0.0
    assert f"{b:.6g}" == "1.00187e-12"


def test_1e_5_and_1e_6_are_float16_subnormals():
    """Chapter 07: 1e-5 and 1e-6 survive in float16 only as subnormals (below 6.1e-5)."""
    smallest_normal = torch.finfo(torch.float16).smallest_normal
    for eps in (1e-5, 1e-6):
        stored = torch.tensor(eps, dtype=torch.float16).item()
        assert 0.0 < stored < smallest_normal
    assert f"{torch.tensor(1e-6, dtype=torch.float16).item():.6g}" == "1.01328e-06"


def test_machine_eps_float32_float16_bfloat16():
    """Chapters 04, 07: finfo eps is 1.19e-7 (float32), 9.77e-4 (float16), 7.81e-3 (bfloat16)."""
    assert torch.finfo(torch.float32).eps == 2.0 ** -23
    assert torch.finfo(torch.float16).eps == 2.0 ** -10
    assert torch.finfo(torch.bfloat16).eps == 2.0 ** -7


def test_float32_norm_of_1e_24_entries_underflows_to_zero_float64_does_not():
    """Chapter 01: squares of ~1e-24 are below float32's smallest subnormal (1.4e-45), so a
    float32 .norm() of a non-zero vector returns 0; in float64 it does not."""
    tiny32 = torch.finfo(torch.float32).smallest_normal * torch.finfo(torch.float32).eps
    assert tiny32 == pytest.approx(1.4e-45, rel=0.01)
    g = torch.full((1000,), 1.5e-24, dtype=torch.float32)
    assert (g != 0).all()
    assert g.norm().item() == 0.0
    assert g.double().norm().item() == pytest.approx(1.5e-24 * math.sqrt(1000), rel=1e-5)


def test_layer_norm_on_float16_is_accurate_beyond_the_overflow_threshold():
    """Chapter 07: F.layer_norm on float16 input keeps its statistics in float32 (no overflow
    for entries far above 256) and returns float16."""
    x = (torch.randn(4, 512, dtype=torch.float64) * 3000).to(torch.float16)
    out = F.layer_norm(x, (512,))
    assert out.dtype == torch.float16
    ref = F.layer_norm(x.double(), (512,))
    assert (out.double() - ref).abs().max().item() < 0.01


def test_bfloat16_has_float32_range_and_fewer_significant_digits_than_float16():
    """Chapter 03: bfloat16's largest value is about float32's (3.39e38 against 3.40e38); finfo's
    resolution gives about 2 significant decimal digits for bfloat16, 3 for float16."""
    assert f"{torch.finfo(torch.bfloat16).max:.3g}" == "3.39e+38"
    assert f"{torch.finfo(torch.float32).max:.3g}" == "3.4e+38"
    assert torch.finfo(torch.float16).resolution == pytest.approx(1e-3)
    assert torch.finfo(torch.bfloat16).resolution == pytest.approx(1e-2)


def _rows_of_std_300():
    """Chapter 03's rows: standard deviation 300, like exercise 01's half-precision tests."""
    return 300 * torch.randn(4, 256, generator=torch.Generator().manual_seed(0))


def _normalize_with_statistics_in(x: torch.Tensor, compute: torch.dtype) -> torch.Tensor:
    h = x.to(compute)
    mu = h.mean(-1, keepdim=True)
    var = ((h - mu) ** 2).mean(-1, keepdim=True)
    return ((h - mu) / torch.sqrt(var + 1e-5)).to(x.dtype)


def test_float16_layernorm_of_values_near_300_overflows_to_a_variance_of_inf_and_outputs_zeros():
    """Chapter 03: (x - mu)^2 of values near 300 overflows float16, the variance is inf and every
    output is (signed) zero, without NaN or an error."""
    assert torch.isinf(torch.tensor(300.0, dtype=torch.float16) ** 2)
    x = _rows_of_std_300().half()
    mu = x.mean(-1, keepdim=True)
    assert torch.isinf((x - mu) ** 2).any()
    assert torch.isinf(((x - mu) ** 2).mean(-1)).all()
    y = _normalize_with_statistics_in(x, torch.float16)
    assert (y == 0).all() and not torch.isnan(y).any()


@pytest.mark.parametrize("dtype, bound", [(torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
def test_layernorm_with_float32_statistics_cast_back_is_accurate_for_16_bit_inputs(dtype, bound):
    """Chapter 03: with the statistics in float32 and the result cast back, the error against
    float64 is that of rounding the output (below 2e-3 for float16, 1e-2 for bfloat16)."""
    x = _rows_of_std_300().to(dtype)
    exact = F.layer_norm(x.double(), (256,))
    y = _normalize_with_statistics_in(x, torch.float32)
    assert y.dtype == dtype
    assert (y.double() - exact).abs().max().item() < bound


def test_bfloat16_statistics_do_not_overflow_but_are_less_accurate_than_float32_ones():
    """Chapter 03: computed in bfloat16 the variance of these rows is finite, and the error is
    larger than with float32 statistics."""
    x = _rows_of_std_300().bfloat16()
    exact = F.layer_norm(x.double(), (256,))
    err16 = (_normalize_with_statistics_in(x, torch.bfloat16).double() - exact).abs().max().item()
    err32 = (_normalize_with_statistics_in(x, torch.float32).double() - exact).abs().max().item()
    assert math.isfinite(err16) and err16 > 2 * err32


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_layer_norm_on_16_bit_input_equals_layer_norm_in_float32_cast_back(dtype):
    """Chapter 03: F.layer_norm on a float16 or bfloat16 input returns that dtype, bit for bit the
    result of the same call in float32 cast back."""
    x = _rows_of_std_300().to(dtype)
    out = F.layer_norm(x, (256,))
    assert out.dtype == dtype
    assert torch.equal(out, F.layer_norm(x.float(), (256,)).to(dtype))


def test_cpu_autocast_bfloat16_runs_linear_and_layer_norm_in_bfloat16():
    """Chapter 07: under CPU autocast(bfloat16), linear returns bfloat16 and so does layer_norm."""
    lin, ln = nn.Linear(64, 64), nn.LayerNorm(64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = lin(torch.randn(4, 64))
        y = ln(h)
    assert h.dtype == torch.bfloat16
    assert y.dtype == torch.bfloat16


# --- nn.TransformerEncoderLayer defaults (chapters 05, 06) ---------------------------------------

def _encoder_layer(**kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return nn.TransformerEncoderLayer(16, 2, **kw)


def test_transformer_encoder_layer_norm_first_defaults_false():
    """Chapter 05: PyTorch's layer is post-norm unless norm_first=True."""
    assert _encoder_layer().norm_first is False


def test_transformer_encoder_layer_activation_defaults_relu():
    """Chapters 05, 06: the default activation is ReLU (the book passes activation="gelu" to match its Block)."""
    assert _encoder_layer().activation is F.relu


def test_transformer_encoder_layer_layer_norm_eps_defaults_1e_5():
    """Chapters 05, 06: the layer's two LayerNorms use eps 1e-5, like nn.LayerNorm."""
    assert _encoder_layer().norm1.eps == 1e-5
    assert _encoder_layer().norm2.eps == 1e-5


def test_transformer_encoder_layer_dropout_defaults_0_1():
    """Chapters 05, 06: dropout defaults to 0.1, so the book passes dropout=0.0 explicitly."""
    assert _encoder_layer().dropout.p == 0.1


def test_transformer_encoder_layer_submodule_names():
    """Chapter 06: the layer's parts are self_attn, linear1, linear2, norm1, norm2."""
    names = dict(_encoder_layer().named_children())
    for name in ("self_attn", "linear1", "linear2", "norm1", "norm2"):
        assert name in names


# --- nn.MultiheadAttention masks and initialization (chapters 06, 08, 09) -------------------------

def _mha():
    torch.manual_seed(0)
    return nn.MultiheadAttention(16, 2, batch_first=True)


def test_multihead_attention_boolean_mask_true_means_blocked():
    """Chapters 06, 08: with a causal mask (True above the diagonal) changing later tokens does
    not change earlier outputs."""
    mha = _mha().eval()
    x = torch.randn(1, 6, 16)
    y = x.clone()
    y[0, 4:] = torch.randn(2, 16)
    causal = torch.triu(torch.ones(6, 6, dtype=torch.bool), diagonal=1)
    with torch.no_grad():
        a = mha(x, x, x, attn_mask=causal, need_weights=False)[0]
        b = mha(y, y, y, attn_mask=causal, need_weights=False)[0]
    assert torch.allclose(a[0, :4], b[0, :4], atol=1e-6)
    assert not torch.allclose(a[0, 4:], b[0, 4:])


def _fully_blocked_last_row():
    m = torch.zeros(6, 6, dtype=torch.bool)
    m[-1, :] = True
    return m


def test_fully_blocked_row_is_nan_on_eval_no_grad_fast_path():
    """Chapter 08: in eval mode without gradients, a query row with every key blocked gives NaN."""
    mha = _mha().eval()
    x = torch.randn(1, 6, 16)
    with torch.no_grad():
        out = mha(x, x, x, attn_mask=_fully_blocked_last_row(), need_weights=False)[0]
    assert torch.isnan(out[0, -1]).all()
    assert torch.isfinite(out[0, :-1]).all()


def test_fully_blocked_row_is_zero_in_training_with_need_weights_false():
    """Chapter 08: in training mode with need_weights=False the fully blocked row is 0, not NaN,
    and its gradients are finite."""
    mha = _mha().train()
    x = torch.randn(1, 6, 16, requires_grad=True)
    out = mha(x, x, x, attn_mask=_fully_blocked_last_row(), need_weights=False)[0]
    assert torch.equal(out[0, -1].detach(), torch.zeros(16))
    out.sum().backward()
    assert torch.isfinite(x.grad).all()


def test_fully_blocked_row_is_nan_with_need_weights_true():
    """Chapter 08: with need_weights=True (the default) the fully blocked row gives NaN."""
    mha = _mha().train()
    x = torch.randn(1, 6, 16)
    out = mha(x, x, x, attn_mask=_fully_blocked_last_row())[0]
    assert torch.isnan(out[0, -1]).all()


def test_all_padding_sequence_is_zero_in_training_nan_on_fast_path():
    """Chapter 08 exercise: a sequence whose key_padding_mask is all True gives 0 in training
    (need_weights=False) and NaN on the eval/no_grad fast path."""
    mha = _mha()
    x = torch.randn(2, 5, 16)
    kpm = torch.zeros(2, 5, dtype=torch.bool)
    kpm[1] = True
    mha.train()
    out = mha(x, x, x, key_padding_mask=kpm, need_weights=False)[0]
    assert torch.equal(out[1].detach(), torch.zeros(5, 16))
    mha.eval()
    with torch.no_grad():
        out = mha(x, x, x, key_padding_mask=kpm, need_weights=False)[0]
    assert torch.isnan(out[1]).all()


def test_multihead_attention_biases_start_at_zero_linear_biases_do_not():
    """Chapter 09: attention's projection biases start at 0; nn.Linear's bias is random."""
    mha = nn.MultiheadAttention(16, 2)
    assert torch.equal(mha.in_proj_bias.detach(), torch.zeros(48))
    assert torch.equal(mha.out_proj.bias.detach(), torch.zeros(16))
    assert nn.Linear(16, 16).bias.abs().max().item() > 0


# --- dropout and embeddings (chapters 02, 07, 08) --------------------------------------------------

def test_dropout_is_identity_in_eval_and_rescales_by_1_over_1_minus_p_in_training():
    """Chapters 02, 08: eval-mode dropout returns its input; train mode zeroes entries and scales
    the rest by 1 / (1 - p)."""
    drop = nn.Dropout(p=0.1)
    x = torch.ones(10_000)
    drop.eval()
    assert torch.equal(drop(x), x)
    drop.train()
    y = drop(x)
    kept = y[y != 0]
    assert torch.allclose(kept, torch.full_like(kept, 1 / 0.9))
    assert 0.08 < (y == 0).float().mean().item() < 0.12


def test_embedding_padding_idx_row_is_zero():
    """Chapter 07: nn.Embedding(padding_idx=0) initializes that row to zeros."""
    emb = nn.Embedding(10, 8, padding_idx=0)
    assert torch.equal(emb.weight[0].detach(), torch.zeros(8))
