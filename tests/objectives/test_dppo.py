"""Flow-DPPO against arXiv 2606.11025 / UniRL's FlowDPPO README: the mask's truth table, the exact Gaussian KL
(torch.distributions), and the loss value and gradient against a direct computation."""
import itertools

import pytest
import torch
from objectives_fakes import KERNEL_PATH, LinearPolicy, em_log_prob, em_step, make_cond, rollout

from flowrl.objectives import TrainBatch as _TrainBatch
from flowrl.objectives import dppo, get_objective, grpo
from flowrl.objectives.sources import TRAJECTORY_ROWS

B, D = 6, 8
SIGMAS = torch.tensor([1.0, 0.8, 0.55, 0.3])
ADV = torch.tensor([1.5, -0.5, 7.0, -2.0, 0.3, -9.0])


def setup(perturb=0.0):
    pol = LinearPolicy(D, seed=1, perturb=perturb)
    cond = make_cond(B, D, seed=2)
    x1 = torch.randn(B, D, generator=torch.Generator().manual_seed(3))
    return pol, cond, rollout(pol, cond, x1, SIGMAS)


def TrainBatch(*args, **kw):  # noqa: N802
    return _TrainBatch(*args, **{"kernel": KERNEL_PATH, **kw})


@pytest.mark.parametrize("kl,ratio,adv", list(itertools.product([0.5e-5, 1e-5, 2e-5], [0.9, 1.0, 1.1],
                                                                  [-1.0, 0.0, 1.0])))
def test_mask_truth_table(kl, ratio, adv):
    """Dropped only when KL ≥ τ and the step moves further: (r > 1, A > 0) or (r < 1, A < 0)."""
    got = dppo.drop_mask(torch.tensor([kl]), torch.tensor([ratio]), torch.tensor([adv]), 1e-5).item()
    far = kl >= 1e-5
    further = (ratio > 1 and adv > 0) or (ratio < 1 and adv < 0)
    assert got == (far and further)


def test_spec_defaults():
    spec = get_objective("dppo")
    c = spec.Config()
    assert spec.TRAINS_ON is TRAJECTORY_ROWS
    assert (c.kl_threshold, c.beta_kl, c.kl_form, c.adv_clip_max, c.old_update) == (1e-5, 0.0, "gaussian", 5.0,
                                                                                    "on_policy")
    with pytest.raises(ValueError, match="dppo kl_threshold"):
        dppo.Config(kl_threshold=0.0)


def test_kl_is_the_exact_gaussian_kl_per_element():
    g = torch.Generator().manual_seed(0)
    mu, mu_old, s = torch.randn(4, 3, 5, generator=g), torch.randn(4, 3, 5, generator=g), torch.rand(4) + 0.1
    sb = s.view(4, 1, 1).expand_as(mu)
    ref = torch.distributions.kl_divergence(torch.distributions.Normal(mu_old, sb),
                                            torch.distributions.Normal(mu, sb)).flatten(1).mean(1)
    torch.testing.assert_close(dppo.gaussian_kl(mu, mu_old, s), ref)


def direct(pol, cond, traj, steps, tau):
    """UniRL's _flowdppo_kl_adv_loss by hand, averaged over the trained steps."""
    total, masked = 0.0, 0.0
    A = ADV.clamp(-5, 5)
    for j in steps:
        with pol.adapter("train"):
            v = pol.velocity(traj.x[:, j], traj.sigma[:, j], cond)
        out = em_step(traj.x[:, j], v, traj.sigma[:, j], traj.sigma_next[:, j], x_next=traj.x_next[:, j])
        r = torch.exp(em_log_prob(traj.x_next[:, j], out.mean, out.std) - traj.log_prob[:, j])
        kl = ((out.mean.detach() - traj.mean[:, j]) ** 2 / (2 * out.std[:, None] ** 2)).mean(1)
        keep = kl < tau
        pos_rm = ~keep & (r.detach() > 1) & (A > 0)
        neg_rm = ~keep & (r.detach() < 1) & (A < 0)
        drop = pos_rm | neg_rm
        total = total + torch.where(~drop, -A * r, torch.zeros_like(r)).mean() / len(steps)
        masked = masked + drop.float().mean() / len(steps)
    return total, masked


@pytest.mark.parametrize("tau", [1e-9, 1e-5, 1e3])
def test_loss_and_gradient_match_the_formula(tau):
    pol, cond, traj = setup(perturb=0.05)
    out = dppo.loss(pol, TrainBatch(cond, ADV, traj=traj, steps=[0, 2]), dppo.Config(kl_threshold=tau))
    want, masked = direct(pol, cond, traj, [0, 2], tau)
    torch.testing.assert_close(out.loss, want)
    torch.testing.assert_close(out.metrics["masked"], masked)
    for a, b in zip(torch.autograd.grad(out.loss, pol.trainable_parameters()),
                    torch.autograd.grad(want, pol.trainable_parameters())):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    if tau == 1e-9:                       # every step is far: exactly the "further" samples are dropped
        assert 0 < masked < 1
    if tau == 1e3:                        # nothing is far: the unclipped ratio surrogate −A·r
        assert masked == 0


def test_on_policy_nothing_is_masked_and_gradient_is_policy_gradient():
    pol, cond, traj = setup()
    batch = TrainBatch(cond, ADV, traj=traj, steps=[1])
    out = dppo.loss(pol, batch, dppo.Config(kl_threshold=1e-12))
    assert out.metrics["masked"] == 0 and out.metrics["kl_old"] < 1e-10
    plain = grpo.loss(pol, batch, grpo.Config(beta_kl=0.0))
    for a, b in zip(torch.autograd.grad(out.loss, pol.trainable_parameters()),
                    torch.autograd.grad(plain.loss, pol.trainable_parameters())):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-8)


def test_kl_to_the_base():
    pol, cond, traj = setup(perturb=0.05)
    batch = TrainBatch(cond, ADV, traj=traj, steps=[1])
    with_kl = dppo.loss(pol, batch, dppo.Config(beta_kl=0.1))
    no_kl = dppo.loss(pol, batch, dppo.Config())
    with pol.adapter("train"):
        v = pol.velocity(traj.x[:, 1], traj.sigma[:, 1], cond)
    with pol.adapter(None):
        v_ref = pol.velocity(traj.x[:, 1], traj.sigma[:, 1], cond)
    mu = em_step(traj.x[:, 1], v, traj.sigma[:, 1], traj.sigma_next[:, 1]).mean
    mu_ref = em_step(traj.x[:, 1], v_ref, traj.sigma[:, 1], traj.sigma_next[:, 1]).mean
    kl = ((mu - mu_ref) ** 2).mean(1) / (2 * traj.std[:, 1] ** 2)   # gaussian form: the full transition std
    torch.testing.assert_close(with_kl.metrics["kl"], kl.mean())
    torch.testing.assert_close(with_kl.loss, no_kl.loss + 0.1 * kl.mean())
