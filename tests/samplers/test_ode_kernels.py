"""The configured ODE kernel runs every deterministic step: DPM-Solver++(2M) against diffusers and the
closed-form flow, its history along each path (reset after SDE steps), and Euler unchanged as the default."""
import pytest
import torch
from diffusers import DPMSolverMultistepScheduler

from samplers import KERNELS
from samplers import tree_spec as ts
from samplers.dpm_solver import dpmpp_2m_step
from samplers.kernel import data_prediction
from samplers.rng import randn_rows, sample_generator
from samplers.rollout import rollout
from samplers.schedule import flow_match_sigmas
from samplers.tree import tree_rollout
from samplers.windows import FixedSteps
from tests.samplers.gaussian_world import exact_ode, exact_velocity

SHAPE = (3, 4, 4)


def _start(idx, seed=3):
    gens = [sample_generator(seed, 0, 0, i) for i in idx]
    return randn_rows(SHAPE, gens), gens


@pytest.mark.parametrize("steps", [10, 20])
def test_dpmpp_2m_kernel_matches_diffusers_flow_dpm_solver(steps):
    sched = DPMSolverMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                        flow_shift=3.0,
                                        solver_order=2, algorithm_type="dpmsolver++", solver_type="midpoint")
    sched.set_timesteps(steps)
    vf = exact_velocity()
    x1, _ = _start(range(2))
    x = x1.clone()
    for i, t in enumerate(sched.timesteps):
        x = sched.step(vf(x, sched.sigmas[i].expand(2)), t, x, return_dict=False)[0]
    ours = rollout(vf, x1, sched.sigmas, ode_kernel="dpmpp_2m")
    torch.testing.assert_close(ours.latents, x, atol=2e-5, rtol=1e-5)
    euler = rollout(vf, x1, sched.sigmas)
    assert (euler.latents - x).abs().max() > 10 * (ours.latents - x).abs().max()


def test_dpmpp_2m_converges_at_second_order_to_the_exact_flow():
    """Gaussian data: the exact ODE map is closed form; halving the step cuts DPM++(2M)'s error ~4×, Euler's
    ~2×."""
    x1, _ = _start(range(2))
    x_start = x1 * 0.9 + 0.3            # start at σ_0 < 1 so every step is a λ-space step
    err = {}
    for kern in ("ode", "dpmpp_2m"):
        for n in (16, 32):
            sig = torch.linspace(0.9, 0.05, n + 1, dtype=torch.float64).float()
            res = rollout(exact_velocity(), x_start, sig, ode_kernel=kern)
            err[kern, n] = float((res.latents.double() - exact_ode(x_start.double(), 0.9, 0.05)).abs().max())
    assert 3.0 < err["dpmpp_2m", 16] / err["dpmpp_2m", 32] < 5.0
    assert 1.6 < err["ode", 16] / err["ode", 32] < 2.5
    assert err["dpmpp_2m", 32] < err["ode", 32] / 5


def test_a_deterministic_rollout_kernel_is_the_ode_kernel_not_silently_euler():
    sig = flow_match_sigmas(8, shift=3.0)
    x1, _ = _start(range(2))
    by_kernel = rollout(exact_velocity(), x1, sig, None, "dpmpp_2m")
    by_ode_kernel = rollout(exact_velocity(), x1, sig, ode_kernel="dpmpp_2m")
    euler = rollout(exact_velocity(), x1, sig)
    assert torch.equal(by_kernel.latents, by_ode_kernel.latents)
    assert not torch.equal(by_kernel.latents, euler.latents)
    first_order = KERNELS.get("dpmpp_2m").config(order=1)
    order1 = rollout(exact_velocity(), x1, sig, ode_kernel="dpmpp_2m", ode_kernel_cfg=first_order)
    torch.testing.assert_close(order1.latents, euler.latents, atol=1e-5, rtol=1e-5)   # DPM++(1) = Euler
    with pytest.raises(ValueError, match="no log-prob"):
        KERNELS.get("dpmpp_2m").log_prob(x1, x1, torch.zeros(2))
    with pytest.raises(ValueError, match="order"):
        KERNELS.get("dpmpp_2m").config(order=3)


def test_history_runs_along_ode_steps_and_resets_after_an_sde_step():
    sig = flow_match_sigmas(8, shift=3.0)
    vf = exact_velocity()
    x1, gens = _start(range(2))
    res = rollout(vf, x1, sig, FixedSteps((3,)).plan(0, 8), "flow_sde", None, gens, ode_kernel="dpmpp_2m")
    x, prev, (_, g2) = x1.clone(), None, _start(range(2))
    for i in range(8):
        s, sn = float(sig[i]), float(sig[i + 1])
        v = vf(x, sig[i].expand(2))
        m0 = data_prediction(x, v, sig[i].expand(2))
        if i == 3:
            eps = randn_rows(SHAPE, g2)
            x = KERNELS.get("flow_sde").step(x, v, sig[i].expand(2), sig[i + 1].expand(2), eps).x_next
            prev = None
        else:
            x, prev = dpmpp_2m_step(x, m0, s, sn, prev), (m0, s)
    assert torch.equal(res.latents, x)


def test_trunk_tree_with_dpm_solver_completes_each_branch_from_a_fresh_history():
    n = 6
    sig = flow_match_sigmas(n, shift=3.0)
    x1, gens = _start([0])
    plan, branch = ts.TreeSpec(ts.EveryStep(2), None).plans(0, n)
    vf = exact_velocity()
    tree = tree_rollout(lambda x, s, r: vf(x, s), x1, sig, plan, branch, kernel="flow_sde", generators=gens,
                        ode_kernel="dpmpp_2m")
    assert torch.equal(tree.latents[0], rollout(vf, x1, sig, ode_kernel="dpmpp_2m").latents[0])   # the trunk
    nodes = tree.nodes
    for leaf_row, leaf in enumerate(tree.leaf_nodes.tolist()):
        node = leaf
        while node > 0 and not bool(nodes.stochastic[node]):
            node = int(nodes.parent[node])
        if node <= 0:
            continue
        step = int(nodes.step[node])
        start = tree.edge_batch(torch.tensor([node])).traj.x_next[:, 0]
        done = rollout(vf, start, sig[step + 1:], ode_kernel="dpmpp_2m")
        assert torch.equal(tree.latents[leaf_row], done.latents[0]), (leaf_row, step)
