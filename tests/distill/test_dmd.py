"""DMD: ∂L/∂x = g/N, critic loss = flow matching on student samples, CFG conventions, schedules."""
import pytest
import torch

from flowrl.distill.dmd import (
    DMDConfig,
    cfg_combine,
    critic_flow_loss,
    dmd_gradient,
    dmd_loss,
    generator_dmd_loss,
)
from flowrl.distill.rollout import chunk_slices, renoise
from flowrl.distill.schedule import denoising_timesteps, sample_score_timestep, shift_sigma


def test_dmd_loss_gradient_is_g_over_n():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 4, 3, 2, 2, generator=g, requires_grad=True)
    grad = torch.randn(x.shape, generator=g)
    dmd_loss(x, grad).backward()
    assert torch.allclose(x.grad, grad / x.numel(), atol=1e-12, rtol=1e-6)
    w = torch.rand(x.shape, generator=g)
    x.grad = None
    dmd_loss(x, grad, w).backward()
    assert torch.allclose(x.grad, w * grad / x.numel(), atol=1e-12, rtol=1e-6)


def test_dmd_gradient_normaliser():
    x = torch.tensor([[1.0, 3.0], [0.0, 0.0]])
    real = torch.tensor([[0.0, 1.0], [1.0, 1.0]])
    fake = torch.tensor([[2.0, 2.0], [3.0, 0.0]])
    per = dmd_gradient(x, fake, real)                 # row means |x−real|: 1.5, 1.0
    assert torch.allclose(per, torch.tensor([[2 / 1.5, 1 / 1.5], [2.0, -1.0]]))
    glob = dmd_gradient(x, fake, real, "global")      # mean 1.25
    assert torch.allclose(glob, (fake - real) / 1.25)


def test_cfg_conventions():
    c, u = torch.tensor([2.0]), torch.tensor([1.0])
    assert cfg_combine(c, u, 3.0, "dmd2").item() == 2 + 3 * 1          # x_c + w(x_c − x_u)
    assert cfg_combine(c, u, 4.0, "standard").item() == 1 + 4 * 1      # x_u + w(x_c − x_u)
    assert cfg_combine(c, u, 3.0, "dmd2") == cfg_combine(c, u, 4.0, "standard")  # w_dmd2 = w_std − 1
    with pytest.raises(ValueError, match="cfg_convention"):
        DMDConfig(cfg_convention="cfg")


def test_generator_loss_through_tiny_scores_matches_closed_form():
    """With linear toy scores the real/fake x̂ are known; the loss gradient must be g/N."""
    cfg = DMDConfig(guidance_scale=3.0)

    def teacher(x, t, c):
        return x * 0.5 + c.mean()

    def critic(x, t, c):
        return x * 0.2

    x = torch.randn(2, 3, 2, 2, 2, requires_grad=True)
    tc, tu = torch.ones(2, 1), torch.zeros(2, 1)
    gen = torch.Generator().manual_seed(5)
    loss, sc = generator_dmd_loss(x, tc, tu, teacher, critic, cfg, generator=gen)
    gen = torch.Generator().manual_seed(5)
    t = sample_score_timestep(2, 5.0, generator=gen)
    eps = torch.randn(x.shape, generator=gen)
    s = (t / 1000).view(-1, 1, 1, 1, 1)
    xt = (1 - s) * x.detach() + s * eps
    xc, xu = xt - s * (0.5 * xt + 1), xt - s * (0.5 * xt)
    real = xc + 3 * (xc - xu)
    fake = xt - s * 0.2 * xt
    g = (fake - real) / (x.detach() - real).abs().mean(dim=(1, 2, 3, 4), keepdim=True)
    assert torch.allclose(sc.grad, g, atol=1e-5)
    loss.backward()
    assert torch.allclose(x.grad, g / x.numel(), atol=1e-8)


def test_critic_loss_is_flow_matching_on_student_samples():
    critic = torch.nn.Linear(2, 2)

    def f(x, t, c):
        return critic(x.transpose(1, -1)).transpose(1, -1)

    x = torch.randn(3, 2, 2, 2, 2)
    cfg = DMDConfig()
    loss = critic_flow_loss(x, None, f, cfg, torch.Generator().manual_seed(2))
    gen = torch.Generator().manual_seed(2)
    t = sample_score_timestep(3, cfg.timestep_shift, generator=gen)
    eps = torch.randn(x.shape, generator=gen)
    s = (t / 1000).view(-1, 1, 1, 1, 1)
    ref = torch.nn.functional.mse_loss(f((1 - s) * x + s * eps, t, None), eps - x)
    assert torch.allclose(loss, ref)
    loss.backward()
    assert critic.weight.grad is not None


def test_schedule_presets_match_reference():
    assert torch.allclose(denoising_timesteps("self_forcing"), torch.tensor([1000.0, 937.5, 833.3333, 625.0]))
    assert denoising_timesteps("causvid").tolist() == [1000.0, 757.0, 522.0]
    assert torch.allclose(1000 * shift_sigma(torch.tensor([0.75, 0.5, 0.25]), 8.0),
                          torch.tensor([960.0, 888.8889, 727.2727]))
    t = sample_score_timestep(1000, 5.0, generator=torch.Generator().manual_seed(0))
    assert t.min() >= 20 and t.max() <= 980


def test_ode_renoise_is_an_euler_step_and_chunks_absorb_remainder():
    x, v = torch.randn(1, 2, 3), torch.randn(1, 2, 3)
    assert torch.allclose(renoise(x, v, 0.9, 0.6, "ode"), x + (0.6 - 0.9) * v, atol=1e-6)
    assert [(s.start, s.stop) for s in chunk_slices(7, 3)] == [(0, 4), (4, 7)]
    with pytest.raises(ValueError, match="fewer than one chunk"):
        chunk_slices(2, 3)


def test_exit_step_modes():
    from flowrl.distill.rollout import sample_exit_steps

    g = torch.Generator().manual_seed(0)
    shared = sample_exit_steps(7, 4, generator=g)
    assert len(set(shared)) == 1 and 0 <= shared[0] < 4
    assert sample_exit_steps(7, 4, last_step_only=True) == [3] * 7
    per = [sample_exit_steps(7, 4, same_across_chunks=False, generator=g) for _ in range(5)]
    assert any(len(set(p)) > 1 for p in per)
    a = sample_exit_steps(3, 4, generator=torch.Generator().manual_seed(9))
    assert a == sample_exit_steps(3, 4, generator=torch.Generator().manual_seed(9))  # same stream → same exit
