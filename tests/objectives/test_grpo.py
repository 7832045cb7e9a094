"""GRPO (Flow-GRPO / DanceGRPO PPO-clip) against direct computations of flow_grpo ``scripts/train_sd3.py``."""
import pytest
import torch
from objectives_fakes import KERNEL_PATH, LinearPolicy, em_log_prob, em_step, make_cond, rollout

from flowrl.objectives import TrainBatch as _TrainBatch
from flowrl.objectives import get_objective
from flowrl.objectives.grpo import Config, clipped_surrogate, loss, mean_kl
from flowrl.objectives.sources import TRAJECTORY_ROWS

B, D = 6, 8
SIGMAS = torch.tensor([1.0, 0.8, 0.55, 0.3, 0.0])
ADV = torch.tensor([1.5, -0.5, 7.0, -2.0, 0.3, -9.0])


def setup(perturb=0.0, guidance=None, cfg_cond=True):
    pol = LinearPolicy(D, seed=1, perturb=perturb)
    cond = make_cond(B, D, seed=2, cfg=cfg_cond)
    x1 = torch.randn(B, D, generator=torch.Generator().manual_seed(3))
    traj = rollout(pol, cond, x1, SIGMAS[:-1].clone(), guidance=guidance)  # 3 stochastic steps, σ > 0
    return pol, cond, traj


def direct_logp(pol, cond, traj, j, adapter="train", guidance=None):
    with pol.adapter(adapter):
        v = pol.velocity(traj.x[:, j], traj.sigma[:, j], cond, guidance)
    out = em_step(traj.x[:, j], v, traj.sigma[:, j], traj.sigma_next[:, j], x_next=traj.x_next[:, j])
    return em_log_prob(traj.x_next[:, j], out.mean, out.std), out


def cfg(**kw):
    return Config(**kw)


def TrainBatch(*args, **kw):  # noqa: N802  (the rollout's kernel, as the trainer passes it)
    return _TrainBatch(*args, **{"kernel": KERNEL_PATH, **kw})


def test_registry_spec():
    spec = get_objective("grpo")
    c = spec.Config()
    assert spec.TRAINS_ON is TRAJECTORY_ROWS
    assert (c.clip_range, c.adv_clip_max, c.old_update) == (1e-4, 5.0, "on_policy")


def test_ratio_one_and_gradient_is_minus_A_grad_logp():
    pol, cond, traj = setup()
    batch = TrainBatch(cond, ADV, traj=traj, steps=[1])
    out = loss(pol, batch, cfg(beta_kl=0.0))
    assert out.metrics["ratio"].item() == pytest.approx(1.0, abs=1e-6)
    assert out.metrics["clipfrac"].item() == 0.0
    g = torch.autograd.grad(out.loss, pol.trainable_parameters())
    logp, _ = direct_logp(pol, cond, traj, 1)
    want = torch.autograd.grad(-(ADV.clamp(-5, 5) * logp).mean(), pol.trainable_parameters())
    for a, b in zip(g, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_loss_value_off_policy_matches_direct_formula():
    pol, cond, traj = setup(perturb=0.02)  # train ≠ old: ratios away from 1, some clipped
    eps = 0.02
    out = loss(pol, TrainBatch(cond, ADV, traj=traj, steps=[0, 2]), cfg(beta_kl=0.0, clip_range=eps))
    per_step = []
    for j in (0, 2):
        logp, _ = direct_logp(pol, cond, traj, j)
        r = torch.exp(logp - traj.log_prob[:, j])
        A = ADV.clamp(-5, 5)
        per_step.append(torch.maximum(-A * r, -A * r.clamp(1 - eps, 1 + eps)).mean())
    torch.testing.assert_close(out.loss, sum(per_step) / 2)
    assert 0 < out.metrics["clipfrac"].item() < 1


def test_clipping_masks_gradient():
    r = torch.tensor([1.5, 0.5, 1.5, 0.5], requires_grad=True)
    A = torch.tensor([1.0, 1.0, -1.0, -1.0])
    clipped_surrogate(A, r, 0.2).sum().backward()
    # A>0 & r>1+ε and A<0 & r<1−ε are clipped (no gradient); the others keep −A
    torch.testing.assert_close(r.grad, torch.tensor([0.0, -1.0, 1.0, 0.0]))


def test_kl_is_flow_grpo_mean_difference_over_2g2_with_base_adapter():
    pol, cond, traj = setup(perturb=0.02)
    beta = 0.04
    with_kl = loss(pol, TrainBatch(cond, ADV, traj=traj, steps=[1]), cfg(beta_kl=beta))
    no_kl = loss(pol, TrainBatch(cond, ADV, traj=traj, steps=[1]), cfg(beta_kl=0.0))
    _, out = direct_logp(pol, cond, traj, 1)
    _, ref = direct_logp(pol, cond, traj, 1, adapter=None)
    dt = (traj.sigma_next[:, 1] - traj.sigma[:, 1]).abs()
    g2 = out.std**2 / dt  # diffusion coefficient without sqrt(|dt|)
    kl = (((out.mean - ref.mean) ** 2).mean(1) / (2 * g2)).mean()
    torch.testing.assert_close(with_kl.metrics["kl"], kl)
    torch.testing.assert_close(with_kl.loss, no_kl.loss + beta * kl)
    assert kl > 0
    gauss = mean_kl(out.mean, ref.mean, out.std, dt, "gaussian")
    torch.testing.assert_close(gauss, ((out.mean - ref.mean) ** 2).mean(1) / (2 * out.std**2))


def test_mask_and_nan_advantages_excluded():
    pol, cond, traj = setup(perturb=0.02)
    adv = ADV.clone()
    adv[0] = float("nan")
    mask = torch.tensor([True, True, False, True, True, True])
    full = loss(pol, TrainBatch(cond, adv, traj=traj, steps=[0], mask=mask), cfg(beta_kl=0.0))
    keep = [1, 3, 4, 5]
    sub = loss(pol, TrainBatch(cond.select(keep), ADV[keep], traj=traj.select(torch.tensor(keep)), steps=[0]),
               cfg(beta_kl=0.0))
    torch.testing.assert_close(full.loss, sub.loss)


def test_cfg_training_uses_rollout_guidance_and_no_cfg_override():
    pol, cond, traj = setup(guidance=4.5)
    out = loss(pol, TrainBatch(cond, ADV, traj=traj, steps=[0], guidance=4.5), cfg(beta_kl=0.0))
    assert out.metrics["ratio"].item() == pytest.approx(1.0, abs=1e-6)  # same CFG as the rollout
    assert pol.calls[-1] == ("train", 4.5)
    out1 = loss(pol, TrainBatch(cond, ADV, traj=traj, steps=[0], guidance=4.5), cfg(beta_kl=0.0, train_guidance=1.0))
    assert pol.calls[-1] == ("train", 1.0)
    assert abs(out1.metrics["ratio"].item() - 1.0) > 1e-3


def test_real_flow_sde_kernel_through_registry():
    pytest.importorskip("samplers.flow_sde")
    from samplers import KERNELS

    k = KERNELS.get("flow_sde")
    kcfg = k.Config(noise_level=0.7)
    pol, cond, _ = setup()
    x1 = torch.randn(B, D, generator=torch.Generator().manual_seed(3))
    traj = rollout(pol, cond, x1, SIGMAS[:-1].clone(), step=k.step, cfg=kcfg, log_prob=k.log_prob)
    out = loss(pol, TrainBatch(cond, ADV, traj=traj, kernel="flow_sde", kernel_cfg=kcfg), Config())
    assert out.metrics["ratio"].item() == pytest.approx(1.0, abs=1e-5)
    assert out.metrics["kl"].item() > 0  # the base (adapters off) differs from the rollout policy


def test_bad_steps_and_missing_traj():
    pol, cond, traj = setup()
    with pytest.raises(ValueError, match="stored steps"):
        loss(pol, TrainBatch(cond, ADV, traj=traj, steps=[5]), cfg())
    with pytest.raises(ValueError, match="traj is None"):
        loss(pol, TrainBatch(cond, ADV), cfg())
    with pytest.raises(ValueError, match="kernel"):
        loss(pol, _TrainBatch(cond, ADV, traj=traj), cfg())
    with pytest.raises(ValueError, match="kl_form"):
        Config(kl_form="bogus")
