"""The experiment code of chapters 11 and 11b (book/experiments/beyond.py): DyT computes its
formula, weights in front of QK-norm are scale-invariant, the two norms land where chapter 04's
geometry section says, stochastic depth keeps the expected branch, the parallel layout shares one
norm, and AdamW's groups leave gains undecayed. Each check also fails on a plausible wrong
version. The two pages share the runs of ``RUNS`` between them: each trains only the runs it
discusses, LayerNorm alone in both.
"""
from __future__ import annotations

import ast
import math
import re
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

from book.experiments import beyond as by
from book.experiments import charlm

pytestmark = pytest.mark.book


def _tiny(**kw) -> by.Config:
    return by.Config(vocab=11, ctx=8, width=16, heads=2, depth=2, **kw)


def test_dyt_matches_its_formula():
    """DyT(x) = gamma * tanh(alpha * x) + beta, with learned alpha, gamma, beta."""
    torch.manual_seed(0)
    m = by.DyT(6, alpha0=0.7)
    with torch.no_grad():
        m.gamma.copy_(torch.randn(6))
        m.beta.copy_(torch.randn(6))
    x = 3 * torch.randn(4, 5, 6)
    want = m.gamma * torch.tanh(0.7 * x) + m.beta
    torch.testing.assert_close(m(x), want)
    wrong = torch.tanh(0.7 * m.gamma * x) + m.beta  # gain inside the tanh
    assert not torch.allclose(m(x), wrong, atol=1e-3)


def test_dyt_keeps_no_row_statistics():
    """Unlike a norm, DyT is elementwise: changing one entry of a row changes only that output."""
    m = by.DyT(5)
    x = torch.randn(5)
    y = x.clone()
    y[0] += 10.0
    assert torch.equal(m(x)[1:], m(y)[1:])
    ln = F.layer_norm(x, (5,))
    assert not torch.allclose(ln[1:], F.layer_norm(y, (5,))[1:])


def test_query_weights_before_qk_norm_are_scale_invariant():
    """With QK-norm, scaling every W_q by 10 leaves the logits unchanged, the gradient is
    orthogonal to W_q and 10 times smaller; without QK-norm the logits change."""
    tokens = torch.randint(0, 11, (3, 9))
    for qk, invariant in ((True, True), (False, False)):
        model = by.CharNet(_tiny(qk_norm=qk), seed=1).double()
        before = model(tokens[:, :-1]).detach()
        by.lm_loss(model, tokens).backward()
        g1 = [w.grad[:16].clone() for w in [l.attn.qkv.weight for l in model.layers]]
        with torch.no_grad():
            for w in by.query_weights(model):
                w.mul_(10.0)
        after = model(tokens[:, :-1]).detach()
        if not invariant:
            assert (after - before).abs().max() > 1e-3
            continue
        torch.testing.assert_close(after, before, atol=1e-5, rtol=0)  # exact but for eps = 1e-6
        model.zero_grad()
        by.lm_loss(model, tokens).backward()
        for g_old, layer in zip(g1, model.layers):
            g, w = layer.attn.qkv.weight.grad[:16], layer.attn.qkv.weight.detach()[:16]
            assert abs(float((g * w).sum())) < 1e-4 * float(g.norm() * w.norm())
            assert float(g_old.norm() / g.norm()) == pytest.approx(10.0, rel=1e-3)


def test_query_weights_are_the_first_rows_of_qkv():
    """query_weights returns W_q (the rows that make q), not W_k or W_v."""
    model = by.CharNet(_tiny(), seed=0)
    layer = model.layers[0]
    x = torch.randn(1, 3, 16)
    q = layer.attn.qkv(x)[..., :16]
    torch.testing.assert_close(x @ by.query_weights(model)[0].T, q)


@pytest.mark.parametrize("D", [3, 8, 64])
def test_norm_geometry(D):
    """LayerNorm's output (eps 0) is orthogonal to the all-ones vector with norm sqrt(D);
    RMSNorm's has norm sqrt(D) but is not orthogonal to ones; dividing by the uncentered RMS
    after centering (a plausible slip) gives neither the right norm nor the same point."""
    torch.manual_seed(D)
    x = torch.randn(50, D, dtype=torch.float64) + 2.0
    ln = F.layer_norm(x, (D,), eps=0.0)
    rms = F.rms_norm(x, (D,), eps=0.0)
    ones = torch.ones(D, dtype=torch.float64)
    assert (ln @ ones).abs().max() < 1e-10
    torch.testing.assert_close(ln.norm(dim=1), torch.full((50,), math.sqrt(D), dtype=torch.float64))
    torch.testing.assert_close(rms.norm(dim=1), torch.full((50,), math.sqrt(D), dtype=torch.float64))
    assert (rms @ ones).abs().min() > 1e-3  # the shifted inputs do not land on the hyperplane
    wrong = (x - x.mean(1, keepdim=True)) / x.pow(2).mean(1, keepdim=True).sqrt()
    assert not torch.allclose(wrong.norm(dim=1), ln.norm(dim=1))


def test_drop_branch_keeps_the_expected_value():
    """Stochastic depth: drops a fraction p per sequence, scales the rest by 1/(1-p), so the mean
    is the branch; at evaluation it is the identity. Forgetting the 1/(1-p) is caught."""
    torch.manual_seed(0)
    branch = torch.full((40000, 2, 3), 2.0)
    out = by.drop_branch(branch, 0.25, training=True)
    dropped = (out[:, 0, 0] == 0).double().mean().item()
    assert dropped == pytest.approx(0.25, abs=0.01)
    assert (out == 0).all(dim=(1, 2)).eq((out == 0).any(dim=(1, 2))).all()  # whole sequences
    assert out.mean().item() == pytest.approx(2.0, rel=0.02)
    assert torch.equal(by.drop_branch(branch, 0.25, training=False), branch)
    unscaled = branch * (out != 0)  # no 1/(1-p)
    assert unscaled.mean().item() < 1.6


def test_parallel_layer_shares_one_norm_and_adds_both_branches():
    """The parallel layout is x + attn(n1(x)) + mlp(n1(x)): one norm fewer per layer."""
    seq = by.CharNet(_tiny(), seed=0)
    par = by.CharNet(_tiny(parallel=True), seed=0)
    assert by.param_count(seq) - by.param_count(par) == 2 * 16 * 2  # gain + bias, 2 layers
    layer = par.layers[0]
    x = torch.randn(2, 5, 16)
    h = layer.n1(x)
    torch.testing.assert_close(layer(x), x + layer.attn(h) + layer.mlp(h))
    sequential = x + layer.attn(h)
    assert not torch.allclose(layer(x), sequential + layer.mlp(layer.n1(sequential)))


def test_param_groups_decay_matrices_only():
    """nanoGPT's split: every matrix decays, no gain or bias does, unless asked."""
    model = by.CharNet(_tiny(norm="dyt"), seed=0)
    decay, keep = by.param_groups(model, 0.1, decay_vectors=False)
    assert all(p.dim() >= 2 for p in decay["params"]) and decay["weight_decay"] == 0.1
    assert all(p.dim() < 2 for p in keep["params"]) and keep["weight_decay"] == 0.0
    assert len(decay["params"]) + len(keep["params"]) == len(list(model.parameters()))
    assert by.param_groups(model, 0.1, decay_vectors=True)[1]["weight_decay"] == 0.1


def test_decay_shrinks_a_gain_with_no_gradient():
    """AdamW with the gains in the decayed group multiplies a gain that gets no gradient by
    (1 - lr * wd) per step; in the undecayed group it stays 1."""
    for decay_vectors, want in ((True, (1 - 1e-2 * 0.5) ** 20), (False, 1.0)):
        model = by.CharNet(_tiny(), seed=0)
        opt = torch.optim.AdamW(by.param_groups(model, 0.5, decay_vectors), lr=1e-2)
        for _ in range(20):
            for p in model.parameters():
                p.grad = torch.zeros_like(p)
            opt.step()
        assert model.final.weight.mean().item() == pytest.approx(want, rel=1e-6)


def test_softcap_and_z_loss():
    """Soft-capping stays inside (-cap, cap) and is nearly the identity near 0; z-loss is
    coef * (log Z)^2 and moves with a shift of the logits that leaves cross-entropy unchanged."""
    z = torch.tensor([-1000.0, -5.0, 0.01, 5.0, 1000.0])
    c = by.softcap(z, 30.0)
    assert c.abs().max() <= 30.0 and c[2].item() == pytest.approx(0.01, rel=1e-4)
    assert c[3].item() == pytest.approx(30 * math.tanh(5 / 30))
    logits = torch.randn(7, 5)
    want = 1e-4 * torch.logsumexp(logits, -1).pow(2).mean()
    torch.testing.assert_close(by.z_loss(logits), want)
    t = torch.randint(0, 5, (7,))
    torch.testing.assert_close(F.cross_entropy(logits + 3, t), F.cross_entropy(logits, t))
    assert by.z_loss(logits + 3) > by.z_loss(logits)


def test_relative_updates_of_an_identity_layer_are_zero():
    """relative_updates measures ||layer(x) - x|| / ||x||: zero when every branch writes zero."""
    model = by.CharNet(_tiny(), seed=0)
    with torch.no_grad():
        for layer in model.layers:
            layer.attn.proj.weight.zero_()
            layer.mlp[2].weight.zero_()
    assert by.relative_updates(model, torch.randint(0, 11, (2, 9))) == [0.0, 0.0]


def test_depth_scaled_layer_scales_its_norm_by_inverse_sqrt_index():
    """LayerNorm Scaling: layer l (1-based) multiplies its norms' outputs by 1/sqrt(l)."""
    model = by.CharNet(_tiny(depth_scaled=True), seed=0)
    assert [layer.scale for layer in model.layers] == [1.0, pytest.approx(1 / math.sqrt(2))]


def test_short_training_records_and_learns():
    """A few steps of train(): every trace has one entry per step and the held-out loss falls."""

    data = charlm.corpus()
    rec = by.train(by.Config(vocab=len(data[2]), depth=1, width=32), steps=12, warmup=2,
                   eval_every=100, data=data)
    for k in ("loss", "grad_norm", "max_logit", "wq_norm", "wq_turn", "gain"):
        assert len(rec[k]) == 12
    assert rec["evals"][-1][1] < rec["evals"][0][1]


def _state_norms(model: by.NGPT, tokens: torch.Tensor) -> torch.Tensor:
    """The norm of every token's state after the embedding and after each layer."""
    h = model.embed(tokens)
    out = [h.norm(dim=-1)]
    for layer in model.layers:
        h = layer(h)
        out.append(h.norm(dim=-1))
    return torch.stack(out)


def test_ngpt_keeps_its_state_on_the_unit_sphere():
    """nGPT's hidden state has norm 1 after the embedding and after every layer; a plain
    residual update (h + attn(h), no renormalization) leaves the sphere."""
    model = by.NGPT(_tiny(ngpt=True), seed=2)
    tokens = torch.randint(0, 11, (3, 8))
    torch.testing.assert_close(_state_norms(model, tokens), torch.ones(3, 3, 8))
    h = model.embed(tokens)
    plain = h + model.layers[0].attn(h)
    assert not torch.allclose(plain.norm(dim=-1), torch.ones(3, 8), atol=1e-3)


def test_ngpt_matrices_are_unit_along_the_width_after_each_step():
    """After an optimizer step and renormalize(): rows of what reads the D-wide stream (embeddings,
    qkv, up, head), columns of what writes it (proj, down). Normalizing proj's rows instead
    (the wrong axis) leaves its columns off the sphere."""
    cfg = _tiny(ngpt=True)
    model = by.NGPT(cfg, seed=3)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    by.lm_loss(model, torch.randint(0, 11, (4, 9))).backward()
    opt.step()
    proj = model.layers[0].attn.proj.weight
    assert not torch.allclose(proj.norm(dim=0), torch.ones(16), atol=1e-3)  # the step moved them
    by.renormalize(model)
    ones = lambda n: torch.ones(n)
    for layer in model.layers:
        torch.testing.assert_close(layer.attn.qkv.weight.norm(dim=1), ones(48))
        torch.testing.assert_close(layer.up.weight.norm(dim=1), ones(64))
        torch.testing.assert_close(layer.attn.proj.weight.norm(dim=0), ones(16))
        torch.testing.assert_close(layer.down.weight.norm(dim=0), ones(64))  # 64 columns of length D
    for w in (model.tok.weight, model.pos.weight, model.head.weight):
        torch.testing.assert_close(w.norm(dim=1), ones(w.shape[0]))
    wrong = by.unit(proj.detach() + 0.3 * torch.randn_like(proj), dim=1)
    assert not torch.allclose(wrong.norm(dim=0), ones(16), atol=1e-3)


def test_ngpt_learned_scales_start_at_their_init_and_move_slowly():
    """Scale(init, stored) starts at init; Adam's first step (size lr on the stored value) moves it
    by lr * init / stored, not by lr."""
    s = by.Scale(4, init=0.05, stored=0.125)
    torch.testing.assert_close(s(), torch.full((4,), 0.05))
    opt = torch.optim.Adam(s.parameters(), lr=0.01)
    s().sum().backward()
    opt.step()
    torch.testing.assert_close(s(), torch.full((4,), 0.05 - 0.01 * 0.05 / 0.125))


def test_ngpt_trains_through_the_chapters_loop():
    """train() builds nGPT from the config, renormalizes after each step and records its logits."""
    text = "the residual stream carries every layer's update. " * 40
    chars = sorted(set(text))
    ids = torch.tensor([chars.index(c) for c in text])
    data = (ids[:1500], ids[1500:], chars)
    cfg = by.Config(vocab=len(chars), ctx=16, width=16, heads=2, depth=2, ngpt=True)
    rec = by.train(cfg, steps=30, data=data, wd=0.0, warmup=0, lr=1e-2, eval_every=10)
    assert isinstance(rec["model"], by.NGPT)
    assert rec["evals"][-1][1] < rec["evals"][0][1] - 0.3
    torch.testing.assert_close(rec["model"].head.weight.norm(dim=1), torch.ones(len(chars)))


def test_the_recorded_largest_logit_leaves_out_masked_future_positions():
    """The plotted largest attention logit is one a query sees: a huge logit with a future key,
    which the causal mask removes, must not be recorded."""
    from book.experiments import beyond as by
    torch.manual_seed(0)
    attn = by.Attention(by.Config(vocab=10, width=8, heads=1))
    x = torch.zeros(1, 3, 8)
    x[0, 0, 0] = 1.0   # query of position 0
    x[0, 2, 1] = 1.0   # key of position 2: in position 0's future
    with torch.no_grad():
        w = torch.zeros(24, 8)
        w[0, 0] = 100.0   # q = 100 * x[0] for position 0
        w[8, 1] = 100.0   # k = 100 * x[1] for position 2
        attn.qkv.weight.copy_(w)
    full = (100.0 * 100.0) / math.sqrt(8)  # the future logit, q(0) . k(2) / sqrt(d_h)
    attn(x)
    assert attn.max_logit < 1.0 < full, attn.max_logit


# --- which runs each page trains -------------------------------------------------------------------

PAGES = [Path(__file__).resolve().parent.parent / "chapters" / f
         for f in ("11_beyond.md", "11b_block_variants.md")]


def _cells(page: Path) -> list[str]:
    """The code of the page's code cells, without their options (a YAML block or :key: lines)."""
    out = []
    for body in re.findall(r"```\{code-cell\}[^\n]*\n(.*?)^```", page.read_text(), re.S | re.M):
        if body.startswith("---\n"):
            body = body.split("\n---\n", 1)[1]
        out.append("\n".join(l for l in body.splitlines() if not re.match(r"^:[a-z_-]+:", l)))
    return out


def _page_runs(page: Path) -> tuple[set[str], set[str]]:
    """(the page's NAMES, the names of RUNS its code cells mention)."""
    names, mentioned = set(), set()
    for cell in _cells(page):
        for node in ast.walk(ast.parse(cell)):
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "NAMES" for t in node.targets):
                names = set(ast.literal_eval(node.value))
            if isinstance(node, ast.Constant) and node.value in by.RUNS:
                mentioned.add(node.value)
    return names, mentioned


def test_each_page_trains_the_runs_it_discusses_and_no_run_twice_but_the_baseline():
    """Each page's NAMES covers every run its code names; together the pages train every run of
    RUNS, and only the short LayerNorm baseline on both (the build's time: issue 27, pacing)."""
    trained = []
    for page in PAGES:
        names, mentioned = _page_runs(page)
        assert names and mentioned <= names, (page.name, mentioned - names)
        assert "run_all(steps=STEPS, depth=4, names=NAMES)" in page.read_text(), page.name
        trained.append(names)
    assert set.union(*trained) == set(by.RUNS)
    assert set.intersection(*trained) == {"LayerNorm"}
