"""DiffusionNFT against ``train_nft_sd3.py`` L862–971: the anchor's pseudocode, the closed-form optimum, the on-policy
gradient, and affinity in A."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from objectives_fakes import FreeVelocity, LinearPolicy, make_cond

from flowrl.objectives import TrainBatch, get_objective
from flowrl.objectives.nft import Config, loss, optimality_probability
from flowrl.objectives.sources import FORWARD_PROCESS

B, D = 4, 6
gen = torch.Generator().manual_seed(0)
X0 = torch.randn(B, D, generator=gen)
EPS = torch.randn(B, D, generator=gen)
T = torch.tensor([0.9, 0.6, 0.35, 0.2])
ADV = torch.tensor([2.0, -1.0, 4.5, -3.0])
COND = make_cond(B, D, seed=1)


def batch(adv=ADV, **kw):
    return TrainBatch(COND, adv, x0=X0, sigma=T, noise=EPS, **kw)


def reference_nft(pol, adv, beta, beta_kl, C=5.0):
    """The anchor's loop (``train_nft_sd3.py``) as pseudocode, written out independently."""
    t = T[:, None]
    xt = (1 - t) * X0 + t * EPS
    with torch.no_grad(), pol.adapter("old"):
        v_old = pol.velocity(xt, T, COND, 1.0)
    with torch.no_grad(), pol.adapter(None):
        v_ref = pol.velocity(xt, T, COND, 1.0)
    with pol.adapter("train"):
        v = pol.velocity(xt, T, COND, 1.0)
    r = ((adv.clamp(-C, C) / C) / 2 + 0.5).clamp(0, 1)
    vp, vn = beta * v + (1 - beta) * v_old, (1 + beta) * v_old - beta * v
    xp, xn = xt - t * vp, xt - t * vn
    lp = ((xp - X0) ** 2).mean(1) / (xp - X0).abs().mean(1).detach().clamp(min=1e-5)
    ln = ((xn - X0) ** 2).mean(1) / (xn - X0).abs().mean(1).detach().clamp(min=1e-5)
    return (C * (r * lp + (1 - r) * ln) / beta).mean() + beta_kl * ((v - v_ref) ** 2).mean()


def test_spec_defaults():
    spec = get_objective("nft")
    c = spec.Config()
    assert spec.TRAINS_ON is FORWARD_PROCESS
    assert (c.beta, c.beta_kl, c.adv_clip_max, c.train_guidance) == (1.0, 1e-4, 5.0, 1.0)
    # DiffusionNFT's published loop settings come with the objective alone (``train_nft_sd3.py``)
    assert (c.old_update, c.timesteps.kind, c.timesteps.config.fraction) == ("nft", "permuted", 0.99)


@pytest.mark.parametrize("beta", [1.0, 0.1])
def test_matches_anchor_pseudocode_value_and_gradient(beta):
    pol = LinearPolicy(D, seed=3, perturb=0.1)
    out = loss(pol, batch(), Config(beta=beta, beta_kl=1e-2))
    ref = reference_nft(pol, ADV, beta, 1e-2)
    torch.testing.assert_close(out.loss, ref)
    g = torch.autograd.grad(out.loss, pol.trainable_parameters())
    gr = torch.autograd.grad(ref, pol.trainable_parameters())
    for a, b in zip(g, gr):
        torch.testing.assert_close(a, b)
    assert {c[0] for c in pol.calls} == {"old", "train", None} and all(c[1] == 1.0 for c in pol.calls)


def test_optimality_probability_by_hand():
    a = torch.tensor([-7.0, -5.0, -2.5, 0.0, 2.5, 9.0])
    torch.testing.assert_close(optimality_probability(a), torch.tensor([0.0, 0.0, 0.25, 0.5, 0.75, 1.0]))
    torch.testing.assert_close(optimality_probability(a, mode="positive_only"),
                               torch.tensor([0.5, 0.5, 0.5, 0.5, 0.75, 1.0]))
    torch.testing.assert_close(optimality_probability(a, mode="binary"), torch.tensor([0.4, 0.4, 0.4, 0.5, 0.6, 0.6]))


def _minimise(cfg, adv, v0, v_old):
    pol = FreeVelocity(v0, v_old, v_old)
    opt = torch.optim.LBFGS([pol.V], lr=1, max_iter=200, tolerance_grad=1e-12, tolerance_change=1e-14,
                            line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        out = loss(pol, batch(adv), cfg).loss
        out.backward()
        return out

    for _ in range(2):
        opt.step(closure)
    return pol.V.detach()


@pytest.mark.parametrize("form,adaptive", [("two_branch", False), ("target", False)])
@pytest.mark.parametrize("beta", [1.0, 0.3])
def test_numerical_minimiser_is_closed_form(form, adaptive, beta):
    v_old = torch.randn(B, D, generator=torch.Generator().manual_seed(5))
    v = EPS - X0
    cfg = Config(beta=beta, beta_kl=0.0, form=form, adaptive_weight=adaptive)
    got = _minimise(cfg, ADV, v_old + 0.5, v_old)
    want = v_old + (ADV / (5.0 * beta))[:, None] * (v - v_old)
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)


def test_closed_form_is_stationary_with_adaptive_weights():
    v_old = torch.randn(B, D, generator=torch.Generator().manual_seed(5))
    want = v_old + (ADV / (5.0 * 0.3))[:, None] * (EPS - X0 - v_old)
    pol = FreeVelocity(want, v_old, v_old)
    (g,) = torch.autograd.grad(loss(pol, batch(), Config(beta=0.3, beta_kl=0.0, form="target")).loss, pol.V)
    assert g.abs().max() < 1e-6
    pol.V.data += 0.1
    (g,) = torch.autograd.grad(loss(pol, batch(), Config(beta=0.3, beta_kl=0.0, form="target")).loss, pol.V)
    assert g.abs().max() > 1e-3


def test_on_policy_gradient_is_advantage_weighted_flow_matching():
    t = T[:, None]
    xt = (1 - t) * X0 + t * EPS
    v_old = torch.randn(B, D, generator=torch.Generator().manual_seed(6))
    pol = FreeVelocity(v_old, v_old, v_old)
    out = loss(pol, batch(), Config(beta=0.3, beta_kl=0.0))
    (g,) = torch.autograd.grad(out.loss, pol.V)
    V = v_old.clone().requires_grad_(True)
    w = (xt - t * v_old - X0).abs().mean(1)
    fm = (t[:, 0] ** 2 * ((V - (EPS - X0)) ** 2).mean(1) / w)
    (want,) = torch.autograd.grad((ADV * fm).mean(), V)
    torch.testing.assert_close(g, want)


def test_two_branch_and_target_forms_have_equal_gradients_with_equal_weights():
    pol = LinearPolicy(D, seed=3, perturb=0.1)
    outs = [loss(pol, batch(), Config(beta=0.5, beta_kl=0.0, form=f, adaptive_weight=False)) for f in
            ("two_branch", "target")]
    g1, g2 = (torch.autograd.grad(o.loss, pol.trainable_parameters()) for o in outs)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b)


@settings(max_examples=20, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=B, max_size=B), st.lists(st.floats(-5, 5), min_size=B, max_size=B),
       st.floats(0, 1))
def test_loss_affine_in_advantage(a1, a2, lam):
    pol = LinearPolicy(D, seed=3, perturb=0.1)
    a1, a2 = torch.tensor(a1), torch.tensor(a2)
    cfg = Config(beta=0.1)
    mix = loss(pol, batch(lam * a1 + (1 - lam) * a2), cfg).loss
    want = lam * loss(pol, batch(a1), cfg).loss + (1 - lam) * loss(pol, batch(a2), cfg).loss
    torch.testing.assert_close(mix, want, rtol=1e-4, atol=1e-4)


def test_nan_advantage_masked_and_errors():
    pol = LinearPolicy(D, seed=3)
    adv = ADV.clone()
    adv[1] = float("nan")
    out = loss(pol, batch(adv), Config())
    assert torch.isfinite(out.loss)
    with pytest.raises(ValueError, match="x0 is None"):
        loss(pol, TrainBatch(COND, ADV, sigma=T), Config())
    with pytest.raises(ValueError, match="beta"):
        Config(beta=0.0)
