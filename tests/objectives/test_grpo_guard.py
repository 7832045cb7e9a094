"""GRPO-Guard against ``train_sd3_GRPO_Guard.py``, written out alone: the per-sample ratio-mean bias (not the batch
mean of flow_grpo#244), RatioNorm, the 1/|dt| re-weighting, their value and gradient, and the bias cancellation."""
import pytest
import torch
from objectives_fakes import KERNEL_PATH, LinearPolicy, em_log_prob, em_step, make_cond, rollout

from flowrl.config.loader import from_dict
from flowrl.objectives import TrainBatch as _TrainBatch
from flowrl.objectives import get_objective, grpo, grpo_guard
from flowrl.objectives.sources import TRAJECTORY_ROWS

B, D = 6, 8
SIGMAS = torch.tensor([1.0, 0.8, 0.55, 0.3])
ADV = torch.tensor([1.5, -0.5, 7.0, -2.0, 0.3, -9.0])


def setup(perturb=0.0):
    pol = LinearPolicy(D, seed=1, perturb=perturb)
    cond = make_cond(B, D, seed=2)
    x1 = torch.randn(B, D, generator=torch.Generator().manual_seed(3))
    return pol, cond, rollout(pol, cond, x1, SIGMAS)


def TrainBatch(*args, **kw):  # noqa: N802  (the rollout's kernel, as the trainer passes it)
    return _TrainBatch(*args, **{"kernel": KERNEL_PATH, **kw})


def direct_step(pol, cond, traj, j, eps):
    """GRPO-Guard per sample i, by hand: b_i, r_i, ℓ_i for stored step j."""
    with pol.adapter("train"):
        v = pol.velocity(traj.x[:, j], traj.sigma[:, j], cond)
    out = em_step(traj.x[:, j], v, traj.sigma[:, j], traj.sigma_next[:, j], x_next=traj.x_next[:, j])
    delta = em_log_prob(traj.x_next[:, j], out.mean, out.std) - traj.log_prob[:, j]
    s = out.std
    bias = torch.stack([((out.mean[i] - traj.mean[i, j]) ** 2).mean() / (2 * s[i] ** 2) for i in range(B)])
    r = torch.exp((delta + bias) * s)
    A = ADV.clamp(-5, 5)
    dt = (traj.sigma_next[:, j] - traj.sigma[:, j]).abs()
    ell = torch.maximum(-A * r, -A * r.clamp(1 - eps, 1 + eps)) / dt
    return ell, bias, delta, out


def test_spec_defaults_are_the_rationorm_recipe():
    spec = get_objective("grpo_guard")
    c = spec.Config()
    assert spec.TRAINS_ON is TRAJECTORY_ROWS
    assert (c.clip_range, c.beta_kl, c.adv_clip_max, c.kl_form, c.old_update) == (2e-6, 0.0, 5.0, "flow_grpo",
                                                                                   "on_policy")
    with pytest.raises(ValueError, match="grpo_guard clip_range"):
        grpo_guard.Config(clip_range=0.0)
    built = from_dict(grpo_guard.Config, {"clip_range": 1e-5, "kl_form": "gaussian", "old_update": "nft"})
    assert (built.clip_range, built.kl_form, built.old_update) == (1e-5, "gaussian", "nft")


def test_bias_is_reduced_per_sample_not_over_the_batch():
    pol, cond, traj = setup(perturb=0.05)
    _, bias, _, out = direct_step(pol, cond, traj, 1, 1e-2)
    got = grpo_guard.ratio_mean_bias(out.mean, traj.mean[:, 1], out.std)
    torch.testing.assert_close(got, bias)
    # the anchor's bug: mean over an empty dim tuple of the 1-D log-prob averages over the whole batch
    buggy = ((out.mean - traj.mean[:, 1]) ** 2).mean() / (2 * out.std.mean() ** 2)
    assert got.std() > 0.1 * got.mean()                      # the samples' biases differ...
    assert not torch.allclose(got, buggy.expand(B))          # ...and differ from the batch-averaged value
    summed = grpo_guard.ratio_mean_bias(out.mean, traj.mean[:, 1], out.std, reduce="sum")
    torch.testing.assert_close(summed, bias * D)


def test_loss_and_gradient_off_policy_match_the_formula():
    pol, cond, traj = setup(perturb=0.05)
    eps = 1e-2
    out = grpo_guard.loss(pol, TrainBatch(cond, ADV, traj=traj, steps=[0, 2]), grpo_guard.Config(clip_range=eps))
    want = sum(direct_step(pol, cond, traj, j, eps)[0].mean() for j in (0, 2)) / 2
    torch.testing.assert_close(out.loss, want)
    g = torch.autograd.grad(out.loss, pol.trainable_parameters())
    gw = torch.autograd.grad(want, pol.trainable_parameters())
    for a, b in zip(g, gw):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-7)
    assert out.metrics["ratio_bias"] > 0 and 0 < out.metrics["clipfrac"] < 1


def test_normalised_log_ratio_has_no_bias():
    """(δ + b)·s = mean_elems((x' − μ_old)(μ_θ − μ_old)) / s: the bias −b of δ cancels exactly."""
    pol, cond, traj = setup(perturb=0.05)
    _, bias, delta, out = direct_step(pol, cond, traj, 1, 1e-2)
    s = out.std
    lhs = grpo_guard.normalised_log_ratio(delta, bias, s)
    rhs = ((traj.x_next[:, 1] - traj.mean[:, 1]) * (out.mean - traj.mean[:, 1])).mean(1) / s
    torch.testing.assert_close(lhs, rhs, rtol=1e-4, atol=1e-6)


def test_on_policy_gradient_is_grpo_gradient_times_s_over_dt():
    """θ = θ_old: r = 1, ∇b = 0, so ∇ℓ = −A·s·∇log π / |dt| = (s/|dt|)·(GRPO's gradient) at one step."""
    pol, cond, traj = setup()
    batch = TrainBatch(cond, ADV, traj=traj, steps=[1])
    guard = grpo_guard.loss(pol, batch, grpo_guard.Config())
    assert guard.metrics["ratio"].item() == pytest.approx(1.0, abs=1e-6)
    plain = grpo.loss(pol, batch, grpo.Config(beta_kl=0.0))
    s = traj.std[0, 1]
    dt = (traj.sigma[0, 1] - traj.sigma_next[0, 1]).abs()
    for a, b in zip(torch.autograd.grad(guard.loss, pol.trainable_parameters()),
                    torch.autograd.grad(plain.loss, pol.trainable_parameters())):
        torch.testing.assert_close(a, b * s / dt, rtol=1e-4, atol=1e-7)


def test_kl_term_is_grpos():
    pol, cond, traj = setup(perturb=0.05)
    batch = TrainBatch(cond, ADV, traj=traj, steps=[1])
    with_kl = grpo_guard.loss(pol, batch, grpo_guard.Config(beta_kl=0.04))
    no_kl = grpo_guard.loss(pol, batch, grpo_guard.Config())
    ref = grpo.loss(pol, batch, grpo.Config(beta_kl=0.04))
    torch.testing.assert_close(with_kl.metrics["kl"], ref.metrics["kl"])
    torch.testing.assert_close(with_kl.loss, no_kl.loss + 0.04 * ref.metrics["kl"])


def test_refuses_the_unnormalised_cps_log_prob():
    pytest.importorskip("samplers.cps")
    pol, cond, traj = setup()
    with pytest.raises(ValueError, match="cps"):
        grpo_guard.loss(pol, _TrainBatch(cond, ADV, traj=traj, kernel="cps"), grpo_guard.Config())
