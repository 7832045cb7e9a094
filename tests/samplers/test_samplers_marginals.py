"""Marginal preservation on Gaussian data x0 ~ N(m, s²I), where the exact velocity is known in closed form
(tests/samplers/gaussian_world.py). SDE rollouts with the exact velocity must end at N(m, s²); a wrong drift
must not."""
import math

import pytest
import torch

from flowrl.types import StepOut
from samplers import KERNELS
from samplers.kernel import Kernel
from samplers.restart import Config as RestartConfig
from samplers.restart import Interval, forward_jump, restart_sample
from samplers.rng import randn_rows, sample_generator
from samplers.rollout import rollout
from samplers.schedule import flow_match_sigmas
from samplers.windows import AllSteps
from tests.samplers.gaussian_world import M, S, exact_velocity, wrong_velocity

ROWS, DIM, STEPS = 4, 30_000, 300
N = ROWS * DIM
MEAN_TOL = 5 * S / math.sqrt(N)              # 5 standard errors of the mean
VAR_TOL = 5 * S**2 * math.sqrt(2 / N) + 0.004  # 5 standard errors of the variance + O(1/STEPS) discretisation


def _noise(seed=0):
    gens = [sample_generator(seed, 0, 0, i) for i in range(ROWS)]
    return randn_rows((DIM,), gens), gens


def _run(kernel, velocity, steps=STEPS, skip_last=True, cfg=None):
    x1, gens = _noise()
    sig = flow_match_sigmas(steps, shift=3.0)
    plan = AllSteps(skip_last=skip_last).plan(0, steps)
    k = KERNELS.get(kernel) if isinstance(kernel, str) else kernel
    return rollout(velocity, x1, sig, plan, k, cfg if cfg is not None else k.Config(), gens, store=False).latents


def _matches(x, m=M, var=S**2):
    return abs(float(x.mean()) - m) < MEAN_TOL and abs(float(x.var()) - var) < VAR_TOL


@pytest.mark.parametrize("name", ["flow_sde", "dance_sde"])
def test_reverse_sde_preserves_the_data_marginal(name):
    out = _run(name, exact_velocity())
    assert _matches(out), (float(out.mean()), float(out.var()))


@pytest.mark.parametrize("name", ["flow_sde", "dance_sde"])
def test_wrong_drift_fails_the_same_test(name):
    assert not _matches(_run(name, wrong_velocity()))
    assert not _matches(_run(name, exact_velocity(M, 0.7)))   # wrong data scale


def _no_score_step(x, v, sigma, sigma_next, noise=None, *, x_next=None, cfg=None):
    """Euler mean plus Flow-GRPO's noise, without the score correction: inflates the variance."""
    out = KERNELS.get("flow_sde").step(x, v, sigma, sigma_next, noise, cfg=cfg)
    mean = x + (torch.as_tensor(sigma_next) - torch.as_tensor(sigma)).view(-1, 1) * v
    return StepOut(mean + out.std.view(-1, 1) * noise, mean, out.std)


def test_sde_without_score_correction_fails():
    k = KERNELS.get("flow_sde")
    bad = Kernel("no_score", k.Config, _no_score_step, k.log_prob)
    out = _run(bad, exact_velocity())
    assert float(out.var()) > S**2 + 10 * VAR_TOL


def _cps_prediction(steps, eta, m=M, s=S):
    """CPS on Gaussian data with exact x̂0 = m + (1−σ)s²/S²·d and x̂1 = σ/S²·d (d = x − (1−σ)m) is affine:
    x' − (1−σ')m = ((1−σ')(1−σ)s² + c·σ)/S²·d + s_η·z, c = sqrt(σ'² − s_η²). Propagate mean and variance of d."""
    sig = flow_match_sigmas(steps, shift=3.0).double()
    ed, vd = 0.0, 1.0   # d at σ=1 is the noise itself
    for i in range(steps):
        a, b = float(sig[i]), float(sig[i + 1])
        tot = (1 - a) ** 2 * s**2 + a**2
        std = b * math.sin(eta * math.pi / 2) if i < steps - 1 else 0.0
        gain = ((1 - b) * (1 - a) * s**2 + math.sqrt(b * b - std * std) * a) / tot
        ed, vd = gain * ed, gain**2 * vd + std**2
    return m + ed, vd


def test_cps_matches_its_closed_form_and_shrinks_variance():
    """CPS preserves the *conditional* marginal q(x_σ'|x0) (its design), not the data marginal: with the exact
    velocity of non-degenerate data its variance falls short of s² by an amount that does not vanish with more
    steps. Check the rollout against the closed-form affine recursion, and that the shortfall is real."""
    eta = 0.8
    out = _run("cps", exact_velocity(), steps=60, cfg=KERNELS.get("cps").config(noise_level=eta))
    mean, var = _cps_prediction(60, eta)
    assert abs(float(out.mean()) - mean) < MEAN_TOL
    assert abs(float(out.var()) - var) < 5 * var * math.sqrt(2 / N)
    assert abs(mean - M) < 1e-9 and var < 0.7 * S**2
    assert _cps_prediction(600, eta)[1] < 0.7 * S**2   # not a discretisation effect


def test_cps_preserves_the_conditional_marginal():
    """Given the true x0 (oracle velocity v = (x − x0)/σ), one CPS step from x_σ ~ q(·|x0) lands on
    q(x_σ'|x0) = N((1−σ')x0, σ'²) for any step size; a wrong drift does not."""
    g = torch.Generator().manual_seed(3)
    x0 = torch.randn(ROWS, DIM, generator=g) * S + M
    s, sn = 0.8, 0.3
    x = (1 - s) * x0 + s * torch.randn(x0.shape, generator=g)
    k = KERNELS.get("cps")
    for v, ok in [((x - x0) / s, True), ((x - x0) / s + 0.2, False)]:
        out = k.step(x, v, s, sn, torch.randn(x0.shape, generator=g), cfg=k.config())
        eps = (out.x_next - (1 - sn) * x0) / sn
        good = abs(float(eps.mean())) < 5 / math.sqrt(N) and abs(float(eps.var()) - 1) < 5 * math.sqrt(2 / N)
        assert good == ok


def test_restart_forward_jump_is_exact():
    g = torch.Generator().manual_seed(4)
    s, t = 0.2, 0.7
    x0 = torch.randn(N, generator=g) * S + M
    xs = (1 - s) * x0 + s * torch.randn(N, generator=g)
    xt = forward_jump(xs, s, t, torch.randn(N, generator=g))
    tot = (1 - t) ** 2 * S**2 + t**2
    assert abs(float(xt.mean()) - (1 - t) * M) < 5 * math.sqrt(tot / N)
    assert abs(float(xt.var()) - tot) < 5 * tot * math.sqrt(2 / N)


def test_restart_preserves_the_marginal_and_k0_is_the_ode():
    x1, gens = _noise()
    sig = flow_match_sigmas(STEPS, shift=3.0)
    ode = rollout(exact_velocity(), x1, sig).latents
    k0 = restart_sample(exact_velocity(), x1, sig, RestartConfig((Interval(0.1, 0.6, 10, 0),)), gens)
    assert torch.equal(k0.latents, ode) and k0.nfe == STEPS
    cfg = RestartConfig((Interval(0.1, 0.6, 100, 2), Interval(0.4, 0.8, 50, 1)))
    res = restart_sample(exact_velocity(), x1, sig, cfg, gens)
    assert res.nfe == STEPS + 2 * 100 + 50
    assert _matches(res.latents), (float(res.latents.mean()), float(res.latents.var()))
    assert not _matches(restart_sample(wrong_velocity(), x1, sig, cfg, gens).latents)
