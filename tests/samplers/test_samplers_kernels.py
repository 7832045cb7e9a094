"""Step kernels: log-probs vs torch.distributions, sampling moments, limits, Euler parity with diffusers."""
import math

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from samplers import KERNELS, cps, dance_sde, flow_sde, ode
from samplers.log_prob import gaussian_entropy, gaussian_log_prob
from samplers.schedule import flow_match_sigmas

SDE = ["flow_sde", "dance_sde", "cps"]


def _xv(b=3, shape=(4, 5, 6), seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, *shape, generator=g), torch.randn(b, *shape, generator=g)


@pytest.mark.parametrize("reduce", ["mean", "sum"])
def test_gaussian_log_prob_matches_torch_normal(reduce):
    x_next, mean = _xv()
    std = torch.tensor([0.3, 1.0, 2.5])
    ref = torch.distributions.Normal(mean, std.view(-1, 1, 1, 1)).log_prob(x_next)
    ref = ref.mean((1, 2, 3)) if reduce == "mean" else ref.sum((1, 2, 3))
    torch.testing.assert_close(gaussian_log_prob(x_next, mean, std, reduce), ref, rtol=1e-5, atol=1e-4)


def test_gaussian_log_prob_rejects_zero_std_and_bad_reduce():
    x, m = _xv()
    with pytest.raises(ValueError, match="ODE"):
        gaussian_log_prob(x, m, torch.tensor([0.1, 0.0, 1.0]))
    with pytest.raises(ValueError, match="reduce"):
        gaussian_log_prob(x, m, torch.ones(3), reduce="max")


def test_entropy_matches_torch_normal():
    std = torch.tensor([0.2, 0.9])
    ref = torch.distributions.Normal(torch.zeros(2), std).entropy()
    torch.testing.assert_close(gaussian_entropy(std), ref)
    torch.testing.assert_close(gaussian_entropy(std, numel=10, reduce="sum"), 10 * ref)


@pytest.mark.parametrize("name", SDE)
@pytest.mark.parametrize("reduce", ["mean", "sum"])
def test_kernel_log_prob_is_normal_log_prob(name, reduce):
    k = KERNELS.get(name)
    cfg = k.config(log_prob="gaussian") if name == "cps" else k.config()
    x, v = _xv()
    noise = torch.randn_like(x)
    out = k.step(x, v, 0.6, 0.5, noise, cfg=cfg)
    ref = torch.distributions.Normal(out.mean, out.std.view(-1, 1, 1, 1)).log_prob(out.x_next)
    ref = ref.mean((1, 2, 3)) if reduce == "mean" else ref.sum((1, 2, 3))
    torch.testing.assert_close(k.log_prob(out.x_next, out.mean, out.std, reduce, cfg), ref, rtol=1e-5, atol=1e-4)


def test_cps_anchor_log_prob_drops_constants():
    x, v = _xv()
    out = cps.step(x, v, 0.6, 0.5, torch.randn_like(x))
    torch.testing.assert_close(cps.log_prob(out.x_next, out.mean, out.std),
                               -((out.x_next - out.mean) ** 2).mean((1, 2, 3)))


@pytest.mark.parametrize("name", SDE)
def test_sampled_moments_match_mean_and_std(name):
    k = KERNELS.get(name)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 1, generator=g).expand(2, 200_000).contiguous()
    v = torch.randn(2, 1, generator=g).expand(2, 200_000).contiguous()
    sigma = torch.tensor([0.9, 0.4])
    out = k.step(x, v, sigma, sigma - 0.1, torch.randn(x.shape, generator=g), cfg=k.config())
    torch.testing.assert_close(out.x_next.mean(1), out.mean[:, 0], atol=4 * float(out.std.max()) / 447, rtol=0)
    torch.testing.assert_close(out.x_next.std(1), out.std, rtol=0.01, atol=0)


def test_scoring_a_stored_step_recovers_the_same_transition():
    x, v = _xv()
    noise = torch.randn_like(x)
    out = flow_sde.step(x, v, 0.7, 0.6, noise)
    again = flow_sde.step(x, v, 0.7, 0.6, x_next=out.x_next)
    assert torch.equal(again.mean, out.mean) and torch.equal(again.x_next, out.x_next)
    with pytest.raises(ValueError, match="either noise"):
        flow_sde.step(x, v, 0.7, 0.6, noise, x_next=out.x_next)


@pytest.mark.parametrize("name,zero", [("flow_sde", {"noise_level": 0.0}), ("dance_sde", {"noise_level": 0.0}),
                                       ("cps", {"noise_level": 0.0})])
def test_zero_noise_is_the_ode_step_exactly(name, zero):
    k = KERNELS.get(name)
    x, v = _xv()
    sig = torch.tensor([0.8, 0.5, 0.3])
    ref = ode.step(x, v, sig, sig - 0.05)
    out = k.step(x, v, sig, sig - 0.05, torch.randn_like(x), cfg=k.config(**zero))
    assert torch.equal(out.mean, ref.x_next) and torch.equal(out.x_next, ref.x_next)


def test_small_noise_converges_to_ode():
    x, v = _xv()
    ref = ode.step(x, v, 0.5, 0.4).x_next
    for name in SDE:
        k = KERNELS.get(name)
        out = k.step(x, v, 0.5, 0.4, torch.randn_like(x), cfg=k.config(noise_level=1e-6))
        torch.testing.assert_close(out.x_next, ref, atol=2e-5, rtol=0)


def test_ode_step_equals_diffusers_scheduler_step():
    sched = FlowMatchEulerDiscreteScheduler(shift=3.0)
    sched.set_timesteps(7)
    x, v = _xv()
    for i, t in enumerate(sched.timesteps):
        ref = sched.step(v, t, x, return_dict=False)[0]
        mine = ode.step(x, v, sched.sigmas[i], sched.sigmas[i + 1]).x_next
        assert torch.equal(mine, ref)


def test_flow_sde_matches_anchor_formula_and_sigma_one_rule():
    x, v = _xv()
    a, s, sn = 0.9, 0.6, 0.45
    g = a * math.sqrt(s / (1 - s))
    dt = sn - s
    mean = x * (1 + g**2 / (2 * s) * dt) + v * (1 + g**2 * (1 - s) / (2 * s)) * dt
    out = flow_sde.step(x, v, s, sn, cfg=flow_sde.Config(noise_level=a))
    torch.testing.assert_close(out.mean, mean)
    torch.testing.assert_close(out.std, torch.full((3,), g * math.sqrt(-dt)))
    first = flow_sde.step(x, v, 1.0, 0.96, cfg=flow_sde.Config(noise_level=a))
    torch.testing.assert_close(first.std, torch.full((3,), a * math.sqrt(1 / (1 - 0.96)) * math.sqrt(0.04)))
    assert torch.isfinite(first.mean).all()


def test_flow_sde_wan_variant_is_linear_in_sigma():
    grid = flow_match_sigmas(20, shift=5.0)
    cfg = flow_sde.wan_config(grid)
    x, v = _xv()
    s, sn = float(grid[3]), float(grid[4])
    out = flow_sde.step(x, v, s, sn, cfg=cfg)
    g = float(grid[1]) * s   # σ_min = grid[-1] = 0
    torch.testing.assert_close(out.std, torch.full((3,), g * math.sqrt(s - sn)))
    with pytest.raises(ValueError, match="wan_config"):
        flow_sde.Config(variant="wan")


def test_dance_and_cps_match_anchor_formulas():
    x, v = _xv()
    s, sn, eta = 0.7, 0.55, 0.3
    x0, x1 = x - s * v, x + (1 - s) * v
    score = -(x - (1 - s) * x0) / s**2
    out = dance_sde.step(x, v, s, sn)
    torch.testing.assert_close(out.mean, x + (sn - s) * (v - 0.5 * eta**2 * score))
    torch.testing.assert_close(out.std, torch.full((3,), eta * math.sqrt(s - sn)))
    std = sn * math.sin(0.8 * math.pi / 2)
    out = cps.step(x, v, s, sn)
    torch.testing.assert_close(out.mean, (1 - sn) * x0 + math.sqrt(sn**2 - std**2) * x1)
    torch.testing.assert_close(out.std, torch.full((3,), std))


def test_per_sample_sigma_equals_scalar_rows():
    x, v = _xv()
    sig, nxt = torch.tensor([0.9, 0.5, 0.2]), torch.tensor([0.8, 0.3, 0.1])
    noise = torch.randn_like(x)
    for name in SDE:
        k = KERNELS.get(name)
        batch = k.step(x, v, sig, nxt, noise, cfg=k.config())
        for b in range(3):
            row = k.step(x[b:b + 1], v[b:b + 1], float(sig[b]), float(nxt[b]), noise[b:b + 1], cfg=k.config())
            torch.testing.assert_close(batch.x_next[b:b + 1], row.x_next)


def test_low_precision_inputs_are_computed_in_float32():
    x, v = _xv()
    out = flow_sde.step(x.bfloat16(), v.bfloat16(), 0.5, 0.4, torch.randn_like(x))
    assert out.x_next.dtype == out.mean.dtype == out.std.dtype == torch.float32


def test_clear_errors():
    x, v = _xv()
    with pytest.raises(ValueError, match="velocity shape"):
        flow_sde.step(x, v[:, :2], 0.5, 0.4)
    with pytest.raises(ValueError, match="sigma must be a scalar"):
        flow_sde.step(x, v, torch.tensor([0.5, 0.4]), 0.3)
    with pytest.raises(ValueError, match="σ must be > 0"):
        dance_sde.step(x, v, 0.0, 0.0)
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        cps.Config(noise_level=1.5)
    with pytest.raises(ValueError, match="no log-prob"):
        ode.log_prob(x, x, torch.zeros(3))
    with pytest.raises(TypeError, match="unknown config key"):
        KERNELS.get("flow_sde").config(eta=0.3)
    with pytest.raises(KeyError, match="did you mean 'flow_sde'"):
        KERNELS.get("flow_sd")
