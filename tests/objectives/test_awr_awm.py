"""AWR (FlowAWR energies, rectified target) and AWM (on-policy advantage-weighted matching) against
scxue/advantage_weighted_matching and Fuzm7/FlowAWR written out directly."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from objectives_fakes import FreeVelocity, LinearPolicy, make_cond

from flowrl.objectives import TrainBatch, awm, awr, get_objective
from flowrl.objectives.sources import FORWARD_PROCESS

B, D = 4, 6
gen = torch.Generator().manual_seed(10)
X0 = torch.randn(B, D, generator=gen)
EPS = torch.randn(B, D, generator=gen)
T = torch.tensor([0.8, 0.5, 0.3, 0.95])
E = torch.tensor([1.5, -0.7, 3.0, -3.0])
COND = make_cond(B, D, seed=11)


def batch(adv=E):
    return TrainBatch(COND, adv, x0=X0, sigma=T, noise=EPS)


# ---------------------------------------------------------------- AWR energies
def test_energies_soft_by_hand():
    A = torch.tensor([1.0, 0.0, -1.0, 2.0], dtype=torch.float64)
    g = torch.tensor([0, 0, 0, 1])
    got = awr.prepare_advantages(A, g, awr.Config())
    p = torch.exp(torch.tensor([1.0, 0.0, -1.0], dtype=torch.float64))
    p = p / p.sum()
    torch.testing.assert_close(got[:3], (3 * (p - 1 / 3)).clamp(-3, 3))
    assert got[3] == 0.0  # a group of one: p = 1, e = 0
    assert got[:3].sum().abs() < 1e-12  # centred


def test_energies_hard_gating_clip_and_nan():
    A = torch.tensor([9.0, -9.0, 0.0, float("nan")], dtype=torch.float64)
    got = awr.prepare_advantages(A, torch.zeros(4, dtype=torch.long), awr.Config(hard_gating=True, temperature=0.5))
    a = torch.tensor([5.0, -5.0, 0.0], dtype=torch.float64) / 0.5  # clip at C=5, then /τ
    e = torch.softmax(a, 0) - 1 / 3
    want = (e / max(float(e.std(unbiased=False)) + 1e-4, 1e-2)).clamp(-3, 3)
    torch.testing.assert_close(got[:3], want)
    assert math.isnan(got[3])


# ---------------------------------------------------------------- AWR loss
def reference_awr(pol, energy, beta_kl):
    t = T[:, None]
    xt = (1 - t) * X0 + t * EPS
    with torch.no_grad(), pol.adapter("old"):
        v_old = pol.velocity(xt, T, COND, 1.0)
    with torch.no_grad(), pol.adapter(None):
        v_ref = pol.velocity(xt, T, COND, 1.0)
    with pol.adapter("train"):
        v = pol.velocity(xt, T, COND, 1.0)
    x0_old = xt - t * v_old
    x0_tgt = x0_old + energy[:, None] * (X0 - x0_old)
    x0_pred = xt - t * v
    w = (x0_pred - X0).abs().mean(1).detach().clamp(min=1e-5)
    return (((x0_pred - x0_tgt) ** 2).mean(1) / w).mean() + beta_kl * ((v - v_ref) ** 2).mean()


def test_awr_matches_anchor_formula_value_and_gradient():
    pol = LinearPolicy(D, seed=12, perturb=0.1)
    out = awr.loss(pol, batch(), awr.Config(beta_kl=1e-2))
    ref = reference_awr(pol, E, 1e-2)
    torch.testing.assert_close(out.loss, ref)
    for a, b in zip(torch.autograd.grad(out.loss, pol.trainable_parameters()),
                    torch.autograd.grad(ref, pol.trainable_parameters())):
        torch.testing.assert_close(a, b)
    assert get_objective("awr").TRAINS_ON is FORWARD_PROCESS


def test_awr_minimiser_is_rectified_target():
    v_old = torch.randn(B, D, generator=torch.Generator().manual_seed(13))
    want = v_old + E[:, None] * (EPS - X0 - v_old)
    pol = FreeVelocity(want, v_old, v_old)
    (g,) = torch.autograd.grad(awr.loss(pol, batch(), awr.Config(beta_kl=0.0)).loss, pol.V)
    assert g.abs().max() < 1e-6  # stationary at v_old + E(v − v_old) whatever the adaptive weight
    pol.V.data.copy_(v_old)
    for _ in range(300):  # and gradient descent from the old policy reaches it
        (g,) = torch.autograd.grad(awr.loss(pol, batch(), awr.Config(beta_kl=0.0)).loss, pol.V)
        pol.V.data -= 0.5 * g * D * B / T[:, None] ** 2  # gradient step preconditioned by the t² scale
    torch.testing.assert_close(pol.V.detach(), want, rtol=1e-3, atol=1e-3)


# ---------------------------------------------------------------- AWM
def reference_awm_policy(pol, adv, cfg):
    """AWM's PPO form with on-policy ratio ≡ 1 (train_sd3_awm.py), gradient-equivalent to ours."""
    t = T[:, None]
    xt = (1 - t) * X0 + t * EPS
    with pol.adapter("train"):
        v = pol.velocity(xt, T, COND, 1.0)
    m = ((v.double() - (EPS - X0).double()) ** 2).mean(1)
    logp = -(((m + 1e-10) ** cfg.ghuber_power - 1e-10**cfg.ghuber_power) * T.double() / cfg.ghuber_power)
    ratio = torch.exp(logp - logp.detach())
    A = adv.double().clamp(-5, 5) / 5
    return torch.maximum(-A * ratio, -A * ratio.clamp(0.0, 2.0)).mean()


@pytest.mark.parametrize("weighting", ["ghuber", "t2"])
def test_awm_gradient_equals_ppo_form(weighting):
    pol = LinearPolicy(D, seed=14, perturb=0.1)
    cfg = awm.Config(beta_ref=0.0, ema_beta=0.0, weighting=weighting)
    out = awm.loss(pol, batch(), cfg)
    if weighting == "ghuber":
        ref = reference_awm_policy(pol, E, cfg)
    else:
        with pol.adapter("train"):
            v = pol.velocity((1 - T[:, None]) * X0 + T[:, None] * EPS, T, COND, 1.0)
        ref = (E.clamp(-5, 5) / 5 * T**2 * ((v - (EPS - X0)) ** 2).mean(1)).mean()
    for a, b in zip(torch.autograd.grad(out.loss, pol.trainable_parameters()),
                    torch.autograd.grad(ref, pol.trainable_parameters())):
        torch.testing.assert_close(a.double(), b.double(), rtol=1e-4, atol=1e-6)


def test_awm_regularisers_to_base_and_old():
    pol = LinearPolicy(D, seed=14, perturb=0.1)
    base = awm.loss(pol, batch(), awm.Config(beta_ref=0.0, ema_beta=0.0))
    full = awm.loss(pol, batch(), awm.Config(beta_ref=1e-3, ema_beta=1.0))
    xt = (1 - T[:, None]) * X0 + T[:, None] * EPS
    with torch.no_grad():
        vs = {}
        for name in ("train", "old", None):
            with pol.adapter(name):
                vs[name] = pol.velocity(xt, T, COND, 1.0)
    want = base.loss + 1e-3 * ((vs["train"] - vs[None]) ** 2).mean() + ((vs["train"] - vs["old"]) ** 2).mean()
    torch.testing.assert_close(full.loss, want)


# ---------------------------------------------------------------- affinity in A (MARBLE's premise)
def _grads(mod, cfg, adv):
    pol = LinearPolicy(D, seed=15, perturb=0.1)
    return torch.cat([g.flatten() for g in torch.autograd.grad(mod.loss(pol, batch(adv), cfg).loss,
                                                                pol.trainable_parameters())])


@settings(max_examples=15, deadline=None)
@given(st.lists(st.floats(-3, 3), min_size=B, max_size=B), st.lists(st.floats(-3, 3), min_size=B, max_size=B),
       st.floats(0, 1), st.sampled_from(["awr", "awm"]))
def test_gradient_affine_in_advantage(a1, a2, lam, name):
    mod, cfg = (awr, awr.Config()) if name == "awr" else (awm, awm.Config())
    a1, a2 = torch.tensor(a1), torch.tensor(a2)
    mix = _grads(mod, cfg, lam * a1 + (1 - lam) * a2)
    want = lam * _grads(mod, cfg, a1) + (1 - lam) * _grads(mod, cfg, a2)
    torch.testing.assert_close(mix, want, rtol=1e-4, atol=1e-5)
