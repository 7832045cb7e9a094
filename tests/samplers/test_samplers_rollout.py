"""Rollout engine: per-sample reproducibility, stored steps only, log-probs re-scorable, diffusers Euler loop."""
import hashlib

import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler

from samplers import KERNELS
from samplers.log_prob import trajectory_entropy
from samplers.rng import group_generators, randn_rows, sample_generator, sample_seed
from samplers.rollout import rollout
from samplers.schedule import flow_match_sigmas
from samplers.windows import FixedSteps, SlidingWindow, StepPlan, merged_step_entropy
from tests.samplers.gaussian_world import exact_velocity

SHAPE = (4, 6, 6)


def _start(idx, seed=7, iteration=3):
    gens = [sample_generator(seed, iteration, 0, i) for i in idx]
    return randn_rows(SHAPE, gens), gens


@pytest.mark.parametrize("kernel", ["flow_sde", "dance_sde", "cps"])
def test_rows_reproduce_alone_or_in_a_batch(kernel):
    sig = flow_match_sigmas(10, shift=3.0)
    plan = FixedSteps((1, 2, 5)).plan(0, 10)
    k = KERNELS.get(kernel)
    xb, gb = _start(range(8))
    batch = rollout(exact_velocity(), xb, sig, plan, k, k.Config(), gb)
    xs, gs = _start([3, 7])
    alone = rollout(exact_velocity(), xs, sig, plan, k, k.Config(), gs)
    assert torch.equal(alone.latents, batch.latents[[3, 7]])
    for name in ("x", "x_next", "mean", "std", "log_prob", "noise", "sigma"):
        assert torch.equal(getattr(alone.traj, name), getattr(batch.traj, name)[[3, 7]]), name
    again = rollout(exact_velocity(), *_start([3, 7])[:1], sig, plan, k, k.Config(), _start([3, 7])[1])
    assert torch.equal(again.latents, alone.latents)


def test_trajectory_holds_only_the_stored_steps_and_rescoring_matches():
    sig = flow_match_sigmas(12, shift=3.0)
    plan = StepPlan(12, (2, 3, 7))
    k = KERNELS.get("flow_sde")
    x1, gens = _start(range(3))
    res = rollout(exact_velocity(), x1, sig, plan, k, k.config(noise_level=0.9), gens)
    tr = res.traj
    assert tr.x.shape == (3, 3, *SHAPE) and tr.log_prob.shape == (3, 3) and tr.std.shape == (3, 3)
    assert tr.step_idx.tolist() == [2, 3, 7]
    assert torch.equal(tr.sigma[0], sig[[2, 3, 7]]) and torch.equal(tr.sigma_next[0], sig[[3, 4, 8]])
    assert torch.equal(tr.x_next[:, 0], tr.x[:, 1])
    torch.testing.assert_close(tr.noise, (tr.x_next - tr.mean) / tr.std.view(3, 3, 1, 1, 1), atol=1e-5, rtol=1e-5)
    for j in range(3):   # the training-time path: same kernel, stored x_next, fresh velocity
        x, s = tr.x[:, j], tr.sigma[:, j]
        out = k.step(x, exact_velocity()(x, s), s, tr.sigma_next[:, j], x_next=tr.x_next[:, j],
                     cfg=k.config(noise_level=0.9))
        assert torch.equal(k.log_prob(tr.x_next[:, j], out.mean, out.std), tr.log_prob[:, j])
    assert res.nfe == 12


def test_ode_rollout_equals_the_diffusers_scheduler_loop():
    sched = FlowMatchEulerDiscreteScheduler(shift=3.0)
    sched.set_timesteps(9)
    x1, _ = _start(range(2))
    vf = exact_velocity()
    x = x1.clone()
    for t in sched.timesteps:
        x = sched.step(vf(x, (t / 1000).expand(2)), t, x, return_dict=False)[0]
    res = rollout(vf, x1, sched.sigmas)
    assert torch.equal(res.latents, x) and res.traj is None and res.nfe == 9


def test_x0_prediction_and_nfe_with_merged_steps():
    sig = flow_match_sigmas(10, shift=3.0)
    x1, gens = _start(range(2))
    vf = exact_velocity()
    res = rollout(vf, x1, sig, StepPlan(10, (1, 6), (3, 2)), "flow_sde", None, gens)
    assert res.nfe == 10 - 2 - 1
    ent = trajectory_entropy(res.traj.std)
    want = torch.stack([merged_step_entropy(sig, 1, 3), merged_step_entropy(sig, 6, 2)])   # E-GRPO formula
    torch.testing.assert_close(ent, want.expand(2, 2))
    assert res.traj.sigma_next[0].tolist() == sig[[4, 8]].tolist()
    ode = rollout(vf, x1, sig)
    # a last Euler step to σ_N = 0 lands exactly on x̂0 = x_{N−1} − σ_{N−1}·v of the last call
    torch.testing.assert_close(ode.x0_pred, ode.latents, atol=1e-6, rtol=0)
    sde = rollout(vf, x1, sig, StepPlan(10, (9,)), "flow_sde", None, _start(range(2))[1])
    x_last, s_last = sde.traj.x[:, 0], sde.traj.sigma[:, 0]
    torch.testing.assert_close(sde.x0_pred, x_last - s_last.view(2, 1, 1, 1) * vf(x_last, s_last))
    assert not torch.allclose(sde.x0_pred, sde.latents)


def test_compressed_dpm_tail_counts_and_lands():
    sig = flow_match_sigmas(25, shift=3.0)
    plan = SlidingWindow(ode_tail="dpmpp_2m", tail_compress=0.4).plan(0, 25)   # window 0..3
    x1, gens = _start(range(2))
    res = rollout(exact_velocity(), x1, sig, plan, "flow_sde", None, gens)
    assert res.traj.step_idx.tolist() == [0, 1, 2, 3]
    assert res.nfe == 4 + int((25 - 4) * 0.4)
    assert torch.isfinite(res.latents).all()
    torch.testing.assert_close(res.x0_pred, res.latents)


def test_rollout_errors():
    sig = flow_match_sigmas(5)
    x1, gens = _start(range(2))
    with pytest.raises(ValueError, match="generator"):
        rollout(exact_velocity(), x1, sig, StepPlan(5, (1,)), "flow_sde")
    with pytest.raises(ValueError, match="6 steps"):
        rollout(exact_velocity(), x1, sig, StepPlan(6, (1,)), "flow_sde", None, gens)
    with pytest.raises(ValueError, match="kernel is 'ode'"):
        rollout(exact_velocity(), x1, sig, StepPlan(5, (1,)), "ode", None, gens)


def test_progress_bar_and_no_store_mode():
    sig = flow_match_sigmas(4)
    x1, gens = _start(range(2))
    a = rollout(exact_velocity(), x1, sig, StepPlan(4, (0, 1)), "dance_sde", None, gens, progress=True)
    b = rollout(exact_velocity(), x1, sig, StepPlan(4, (0, 1)), "dance_sde", None, _start(range(2))[1], store=False)
    assert torch.equal(a.latents, b.latents) and b.traj is None


def test_sample_seed_is_the_documented_hash():
    want = int.from_bytes(hashlib.sha256(b"flowrl|1|2|3|4").digest()[:8], "little") % (1 << 63)
    assert sample_seed(1, 2, 3, 4) == want
    seeds = {sample_seed(0, it, p, s) for it in range(3) for p in range(5) for s in range(5)}
    assert len(seeds) == 75
    gens = group_generators(0, 1, [4, 9], 3)
    assert [g.initial_seed() for g in gens] == [sample_seed(0, 1, p, j) for p in (4, 9) for j in range(3)]
    with pytest.raises(TypeError, match="iteration"):
        sample_seed(0, 1.5, 0, 0)
