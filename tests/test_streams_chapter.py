"""Chapter 12's experiment code (book/experiments/streams.py): Sinkhorn-Knopp leaves the columns
exact and the rows only near 1, mHC and HC start as the pre-norm residual, products of doubly
stochastic matrices stay bounded while unconstrained ones grow, attention over depth with a zero
query is the mean, and the models of the chapter all start as the same function. Each check also
fails on a plausible wrong version.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from book.experiments import beyond
from book.experiments import streams as st

pytestmark = pytest.mark.book


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Tiny tensors: a second thread only adds synchronization (on a shared machine, a lot)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _sk(logits, n_iters=20, dtype=torch.float32):
    """Exercise 6's sinkhorn_knopp from the chapter's pieces: positive(logits) in ``dtype``, then
    sinkhorn_scale, returned in the logits' dtype."""
    return st.sinkhorn_scale(st.positive(logits.to(dtype)), n_iters).to(logits.dtype)


def _reference_sinkhorn(logits, n_iters):
    """The formula exercise 6 fixes, written out independently, in float64."""
    p = torch.exp(logits.double() - logits.double().max())
    for _ in range(n_iters):
        p = p / p.sum(1, keepdim=True)
        p = p / p.sum(0, keepdim=True)
    return p


def _sublayer(dim=16, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))


def _tiny(**kw) -> beyond.Config:
    return beyond.Config(vocab=11, ctx=8, width=16, heads=2, depth=2, norm="rms", **kw)


# --- Sinkhorn-Knopp -------------------------------------------------------------------------------

@pytest.mark.parametrize("t", [1, 3, 20])
def test_sinkhorn_columns_sum_to_one_exactly_and_rows_only_nearly(t):
    """After t iterations ending with the column step the columns sum to 1 up to float32 rounding;
    the rows are near 1, not exactly, for logits that are far from uniform."""
    g = torch.Generator().manual_seed(t)
    z = 4 * torch.eye(4) + 0.5 * torch.randn(4, 4, generator=g)
    p = _sk(z, t)
    rows, cols = st.stochastic_errors(p)
    assert cols < 1e-6
    assert 1e-5 < rows < 0.1
    assert (p >= 0).all()


def test_sinkhorn_rows_approach_one_as_iterations_grow():
    """The row error shrinks with the iterations, geometrically: far smaller after 60 than after 5."""
    z = 3 * torch.randn(4, 4, generator=torch.Generator().manual_seed(1))
    errs = st.sinkhorn_convergence(z, 60)["rows"]
    assert errs[59] < 1e-3 * errs[4]
    assert all(b <= a * 1.0001 for a, b in zip(errs[5:], errs[6:]))
    p = _sk(z.double(), 200, torch.float64)
    assert max(st.stochastic_errors(p)) < 1e-12


def test_sinkhorn_matches_the_exercise_formula_and_not_the_other_order():
    """Rows then columns, from exp(logits - max), in float32; normalizing the columns first would
    leave the rows exact instead, which the check notices."""
    z = 2 * torch.randn(3, 5, 5, generator=torch.Generator().manual_seed(2))
    p = _sk(z, 4)
    assert p.dtype == torch.float32
    for i in range(3):
        torch.testing.assert_close(p[i].double(), _reference_sinkhorn(z[i], 4), atol=1e-6, rtol=1e-5)
    wrong = torch.exp(z[0])
    for _ in range(4):
        wrong = wrong / wrong.sum(0, keepdim=True)
        wrong = wrong / wrong.sum(1, keepdim=True)
    assert not torch.allclose(p[0], wrong, atol=1e-4)


def test_sinkhorn_ignores_a_shift_and_does_not_overflow():
    """Adding a constant to every logit changes nothing; logits of 1000 give no inf or NaN, since
    positive() subtracts the max first (exp(1000) alone overflows)."""
    z = torch.randn(4, 4, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(_sk(z + 7.0), _sk(z))
    big = _sk(z + 1000.0)
    assert torch.isfinite(big).all()
    torch.testing.assert_close(big, _sk(z))
    assert not torch.isfinite(st.sinkhorn_scale(torch.exp(z + 1000.0), 3)).all()


def test_mhc_mixing_is_computed_in_float32_and_returned_in_the_logits_dtype():
    m = st.MHCConnection(16, 4, res_diagonal=4.0).to(torch.bfloat16)
    _, _, res = m.mappings()
    assert res.dtype == torch.bfloat16
    torch.testing.assert_close(res.float(), _sk(m.res_logits.float()), atol=1e-2, rtol=0)


def test_sinkhorn_is_coordinate_descent_on_a_convex_function():
    """The half-steps never increase f(u, v) = sum P - sum u - sum v."""
    z = 4 * torch.eye(4) + torch.randn(4, 4, generator=torch.Generator().manual_seed(4))
    f = np.array(st.sinkhorn_objective(z, 15))
    assert (np.diff(f) <= 1e-12).all() and f[-1] < f[0]


def test_gradient_through_unrolled_sinkhorn_matches_finite_differences():
    """Autograd through the iterations is the derivative of what they compute (gradcheck), and the
    unrolled gradient approaches the limit's as the iterations grow."""
    z = torch.randn(3, 3, generator=torch.Generator().manual_seed(5), dtype=torch.float64,
                    requires_grad=True)
    assert torch.autograd.gradcheck(lambda z: _sk(z, 6, torch.float64), (z,))
    w = torch.randn(3, 3, generator=torch.Generator().manual_seed(6))
    ref = st.unrolled_gradient(z, w, 300)
    d2 = (st.unrolled_gradient(z, w, 2) - ref).abs().max()
    d30 = (st.unrolled_gradient(z, w, 30) - ref).abs().max()
    assert d30 < 1e-3 * d2


def test_autograd_keeps_more_for_more_iterations():
    """The unrolled backward stores intermediates of every iteration."""
    z = torch.zeros(4, 4, requires_grad=True)
    one = st.saved_numbers(lambda z: _sk(z, 1), z)
    twenty = st.saved_numbers(lambda z: _sk(z, 20), z)
    assert twenty > 10 * one > 0


# --- doubly stochastic matrices and their products ------------------------------------------------

def test_products_of_doubly_stochastic_matrices_stay_bounded():
    """64 doubly stochastic matrices (Sinkhorn run to convergence): the product's largest row sum
    and spectral norm are 1 at every depth, and its second singular value falls."""
    g = torch.Generator().manual_seed(7)
    logits = 2 * torch.eye(4, dtype=torch.float64) + torch.randn(64, 4, 4, generator=g, dtype=torch.float64)
    mats = _sk(logits, 300, torch.float64)
    assert max(st.stochastic_errors(mats)) < 1e-12
    gains = st.composite_gains(mats)
    assert max(gains["row_sum"]) < 1 + 1e-9 and min(gains["row_sum"]) > 1 - 1e-9
    assert max(gains["spectral"]) < 1 + 1e-9
    assert gains["second"][-1] < 1e-3 * gains["second"][0]


def test_products_of_unconstrained_mixing_matrices_grow():
    """I + 0.2 G, G standard normal: the product's largest row sum grows with depth, to far more
    than at depth 8, in most draws."""
    g = torch.Generator().manual_seed(8)
    grew = 0
    for _ in range(10):
        gains = st.composite_gains(st.perturbed_identities(128, 4, 0.2, g))["row_sum"]
        grew += gains[127] > 10 * gains[7]
    assert grew >= 8


def test_a_doubly_stochastic_matrix_bounds_the_norm_and_keeps_the_mean():
    """||Hx|| <= ||x|| (strictly smaller for most x) and the mean over streams is unchanged;
    a matrix whose rows do not sum to 1 breaks the bound."""
    g = torch.Generator().manual_seed(9)
    h = _sk(torch.randn(4, 4, generator=g, dtype=torch.float64), 300, torch.float64)
    x = torch.randn(4, 500, generator=g, dtype=torch.float64)
    ratio = (h @ x).norm(dim=0) / x.norm(dim=0)
    assert ratio.max() <= 1 + 1e-12 and ratio.median() < 0.99
    torch.testing.assert_close((h @ x).mean(0), x.mean(0))
    col_only = h * torch.tensor([[1.3], [0.7], [1.0], [1.0]], dtype=torch.float64)
    col_only = col_only / col_only.sum(0, keepdim=True)  # columns sum to 1, rows do not
    assert torch.linalg.matrix_norm(col_only, 2) > 1


# --- the connections ------------------------------------------------------------------------------

def test_mhc_starts_with_the_stated_mappings():
    """All logits zero: H_pre = 1/2, H_post = 1, H_res = J/n (exactly doubly stochastic)."""
    m = st.MHCConnection(16, n_streams=4)
    for p in (m.pre_logits, m.post_logits, m.res_logits):
        assert (p == 0).all()
    pre, post, res = m.mappings()
    torch.testing.assert_close(pre, torch.full((4,), 0.5))
    torch.testing.assert_close(post, torch.ones(4))
    torch.testing.assert_close(res, torch.full((4, 4), 0.25))
    assert isinstance(m.norm, nn.RMSNorm) and m.norm.eps == 1e-6


def test_mhc_with_one_stream_is_the_prenorm_residual():
    """n = 1: x + F(norm(x / 2)), which RMSNorm makes x + F(norm(x)) up to its eps. Forgetting the
    norm (x + F(x / 2)) is caught."""
    f = _sublayer(seed=1)
    m = st.MHCConnection(16, n_streams=1)
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(10))
    out = m(x.unsqueeze(-2), f).squeeze(-2)
    want = x + f(F.rms_norm(x, (16,), eps=1e-6))
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(out, x + f(x / 2), atol=1e-3)


@pytest.mark.parametrize("layer", ["mHC", "mHC read", "HC"])
def test_connections_with_equal_streams_start_as_the_prenorm_residual(layer):
    """With n equal streams y, every output stream is y + F(norm(y)) at the start, for mHC (all
    logits zero, or this chapter's start) and for HC's initialization."""
    f = _sublayer(seed=2)
    conn = {"mHC": lambda: st.MHCConnection(16, 4),
            "mHC read": lambda: st.MHCConnection(16, 4, read_stream=5, res_diagonal=4.0),
            "HC": lambda: st.HCConnection(16, 4, layer_index=3)}[layer]()
    y = torch.randn(2, 7, 16, generator=torch.Generator().manual_seed(11))
    out = conn(y.unsqueeze(-2).expand(2, 7, 4, 16), f)
    want = (y + f(F.rms_norm(y, (16,), eps=1e-6))).unsqueeze(-2).expand(2, 7, 4, 16)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


def test_mhc_forward_computes_its_formula_for_any_logits():
    """out_i = sum_j H_res[i, j] x_j + H_post[i] F(norm(sum_i H_pre[i] x_i)) with random logits;
    the transposed mixing sum_j H_res[j, i] x_j is caught."""
    f = _sublayer(seed=3)
    m = st.MHCConnection(16, 4)
    g = torch.Generator().manual_seed(12)
    with torch.no_grad():
        for p in (m.pre_logits, m.post_logits, m.res_logits):
            p.copy_(torch.randn(p.shape, generator=g))
    x = torch.randn(5, 4, 16, generator=g)
    pre, post, res = torch.sigmoid(m.pre_logits), 2 * torch.sigmoid(m.post_logits), _sk(m.res_logits)
    y = f(m.norm((pre[:, None] * x).sum(-2)))
    want = torch.stack([sum(res[i, j] * x[:, j] for j in range(4)) + post[i] * y for i in range(4)], dim=1)
    torch.testing.assert_close(m(x, f), want, atol=1e-5, rtol=1e-5)
    transposed = torch.stack([sum(res[j, i] * x[:, j] for j in range(4)) + post[i] * y for i in range(4)], dim=1)
    assert not torch.allclose(m(x, f), transposed, atol=1e-4)


def test_dynamic_mhc_starts_as_the_static_layer_and_stays_doubly_stochastic():
    """The input-dependent part starts at zero; once its projection moves, each token gets its own
    H_res, whose columns still sum to 1."""
    f = _sublayer(seed=4)
    static, dynamic = st.MHCConnection(16, 4), st.MHCConnection(16, 4, dynamic=True)
    x = torch.randn(3, 4, 16, generator=torch.Generator().manual_seed(13))
    torch.testing.assert_close(dynamic(x, f), static(x, f))
    with torch.no_grad():
        dynamic.phi.normal_(0, 1.0)
        dynamic.alpha.fill_(1.0)
    _, _, res = dynamic.mappings(x)
    assert res.shape == (3, 4, 4)
    assert (res.sum(-2) - 1).abs().max() < 1e-5
    assert (res[0] - res[1]).abs().max() > 1e-3


def test_zero_start_mhc_gets_no_gradient_on_its_mixing():
    """With every logit at zero, copied streams and an averaged readout, the model is symmetric in
    its streams: the residual logits get no gradient, the read logits equal ones. This chapter's
    start (reading one stream) makes the read gradients differ."""
    tokens = torch.randint(0, 11, (4, 9), generator=torch.Generator().manual_seed(14))
    for zero_start in (True, False):
        model = st.StreamNet(_tiny(), "mHC", seed=0, zero_start=zero_start)
        beyond.lm_loss(model, tokens).backward()
        c = model.layers[1].c1
        if zero_start:
            assert c.res_logits.grad.abs().max() < 1e-7
            assert torch.allclose(c.pre_logits.grad, c.pre_logits.grad[0].expand(4), rtol=1e-4, atol=1e-12)
        else:
            assert not torch.allclose(c.post_logits.grad, c.post_logits.grad[0].expand(4), rtol=1e-3)


# --- attention over depth ---------------------------------------------------------------------------

def test_depth_attention_with_zero_query_is_the_mean():
    sources = torch.randn(5, 3, 7, 16, generator=torch.Generator().manual_seed(15))
    out = st.attend_depth(sources, st.rms_keys(sources), torch.zeros(16))
    torch.testing.assert_close(out, sources.mean(0))


def test_depth_attention_computes_its_formula():
    """Keys are the RMS-normalized sources, values the sources themselves; keys taken without the
    normalization are caught."""
    g = torch.Generator().manual_seed(16)
    sources = torch.randn(4, 6, 16, generator=g) * torch.tensor([1.0, 5.0, 0.2, 2.0])[:, None, None]
    q = torch.randn(16, generator=g)
    keys = sources / sources.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
    alpha = torch.softmax(keys @ q, dim=0)
    want = (alpha[..., None] * sources).sum(0)
    out = st.attend_depth(sources, st.rms_keys(sources), q)
    torch.testing.assert_close(out, want)
    raw = (torch.softmax(sources @ q, dim=0)[..., None] * sources).sum(0)
    assert not torch.allclose(out, raw, atol=1e-3)


def test_block_sources_group_the_outputs():
    """block=1 gives every output; block=2 gives the embedding, the sums of completed pairs and the
    partial sum of the unfinished block."""
    outs = [torch.full((2,), float(i)) for i in range(6)]  # embedding, then 5 outputs
    assert [s[0].item() for s in st.block_sources(outs, 1)] == [0, 1, 2, 3, 4, 5]
    assert [s[0].item() for s in st.block_sources(outs, 2)] == [0, 1 + 2, 3 + 4, 5]


# --- the models of the chapter ----------------------------------------------------------------------

def test_every_kind_starts_as_the_prenorm_model():
    """Same seed, no training: HC, mHC (both starts), AttnRes (full and in blocks) give the pre-norm
    model's logits, up to the norms' eps."""
    tokens = torch.randint(0, 11, (3, 8), generator=torch.Generator().manual_seed(17))
    with torch.no_grad():
        ref = st.StreamNet(_tiny(), "pre-norm", seed=3)(tokens)
        for kind, kw in [("HC", {}), ("mHC", {}), ("mHC", {"zero_start": True}),
                         ("AttnRes", {}), ("AttnRes", {"attn_block": 2})]:
            out = st.StreamNet(_tiny(), kind, seed=3, **kw)(tokens)
            torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4, msg=f"{kind} {kw}")


def test_param_groups_leave_the_connections_undecayed():
    model = st.StreamNet(_tiny(), "HC", seed=0)
    decay, keep = st.param_groups(model, 0.1)
    conn = {id(p) for p in model.connection_parameters()}
    assert conn and not conn & {id(p) for p in decay["params"]}
    assert conn <= {id(p) for p in keep["params"]} and keep["weight_decay"] == 0.0
    assert len(decay["params"]) + len(keep["params"]) == len(list(model.parameters()))


def test_prenorm_trace_shares_sum_to_one_and_the_stream_grows_by_the_writes():
    model = st.StreamNet(_tiny(), "pre-norm", seed=0)
    tokens = torch.randint(0, 11, (4, 9), generator=torch.Generator().manual_seed(18))
    tr = st.prenorm_trace(model, tokens)
    assert len(tr["stream"]) == 5 and len(tr["share"]) == 5
    assert sum(tr["share"]) == pytest.approx(1.0, abs=1e-5)
    assert tr["stream"][0] == pytest.approx(tr["embedding"])


def test_a_few_steps_of_each_kind_train():
    """Chapter 11's loop runs on every kind (with this module's parameter groups) and lowers the
    held-out loss, on a short repeated text."""
    text = "every sublayer reads the sum of all that came before it. " * 30
    chars = sorted(set(text))
    ids = torch.tensor([chars.index(c) for c in text])
    data = (ids[:1400], ids[1400:], chars)
    cfg = beyond.Config(vocab=len(chars), ctx=16, width=16, heads=2, depth=1, norm="rms")
    for kind in st.KINDS:
        model = st.StreamNet(cfg, kind, seed=0)
        opt = torch.optim.AdamW(st.param_groups(model, 0.1), lr=1e-2, betas=(0.9, 0.95))
        rec = beyond.train(cfg, steps=20, lr=1e-2, warmup=2, data=data, model=model, opt=opt,
                           eval_every=10)
        assert rec["evals"][-1][1] < rec["evals"][0][1] - 0.3, kind


def test_residual_bytes_and_parameters():
    c1, c4 = st.residual_bytes(4096, 64, 1, 2), st.residual_bytes(4096, 64, 4, 2)
    assert c1["state"] == 8192 and c4["state"] == 4 * 8192
    assert c4["kept_for_backward"] == 64 * 4 * 8192 and c4["traffic_per_sublayer"] == 2 * 4 * 8192
    assert st.mhc_parameters(4096, 4, dynamic=False) == 24
    assert st.mhc_parameters(4096, 4, dynamic=True) == 24 + 4 * 4096 * 24 + 3
    assert math.isclose(math.exp(4) / (math.exp(4) + 3), _sk(4 * torch.eye(4))[0, 0].item(),
                        rel_tol=1e-6)
