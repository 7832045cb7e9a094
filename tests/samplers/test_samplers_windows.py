"""Step plans: the anchors' step sets (Flow-GRPO, Flow-GRPO-Fast, MixGRPO, E-GRPO) and checkpointable state."""
import math
import random

import pytest
import torch

from samplers import KERNELS, WINDOWS
from samplers.dpm_solver import dpmpp_2m_step, tail_sigmas
from samplers.log_prob import gaussian_entropy
from samplers.schedule import flow_match_sigmas
from samplers.windows import (
    MergedStep,
    SlidingWindow,
    StepPlan,
    merged_step_entropy,
    merged_step_std,
)


def test_all_fixed_and_random_windows():
    assert WINDOWS.get("all")().plan(0, 10).sde_steps == tuple(range(10))
    assert WINDOWS.get("all")(skip_last=True).plan(0, 10).sde_steps == tuple(range(9))
    assert WINDOWS.get("fixed")(steps=(4, 1)).plan(0, 10).sde_steps == (1, 4)
    win = WINDOWS.get("random")()          # Flow-GRPO-Fast: size 2 in range (0, 10)
    rng = random.Random(0)
    starts = {win.plan(0, 10, rng).sde_steps[0] for _ in range(400)}
    assert starts == set(range(9))      # start ~ U{0, …, 10 − 2}
    plan = win.plan(0, 10, random.Random(5))
    assert plan.sde_steps == (plan.sde_steps[0], plan.sde_steps[0] + 1)
    assert win.plan(0, 10, random.Random(5)) == plan
    with pytest.raises(ValueError, match="rng"):
        win.plan(0, 10)
    assert WINDOWS.get("random")(size=0).plan(0, 10).sde_steps == tuple(range(9))   # FG-Fast size 0
    with pytest.raises(ValueError, match="does not fit"):
        WINDOWS.get("random")(size=4, window_range=(0, 3)).plan(0, 10, rng)
    with pytest.raises(ValueError, match="outside"):
        WINDOWS.get("fixed")(steps=(12,)).plan(0, 10)


def test_mixgrpo_sliding_window_anchor_schedule():
    """MixGRPO: 25 steps, window 4, stride 1, advance every 25 iterations, max index 23, roll back."""
    win = SlidingWindow()
    got = {n: win.plan(n, 25).sde_steps for n in range(25 * 24 + 1)}
    assert got[0] == got[24] == (0, 1, 2, 3)
    assert got[25] == (1, 2, 3, 4) and got[49] == (1, 2, 3, 4) and got[50] == (2, 3, 4, 5)
    assert got[25 * 19] == (19, 20, 21, 22)
    assert got[25 * 20] == (20, 21, 22)     # the window is clipped at max_index = 23
    assert got[25 * 22] == (22,)
    assert got[25 * 23] == (0, 1, 2, 3)     # rolled back at the end
    for steps in got.values():
        assert steps and max(steps) < 23


def test_sliding_window_state_round_trip():
    win = SlidingWindow()
    for n in range(137):
        win.plan(n, 25)
    state = win.state_dict()
    fresh = SlidingWindow()
    fresh.load_state_dict(state)
    assert [fresh.plan(n, 25) for n in range(137, 400)] == [win.plan(n, 25) for n in range(137, 400)]
    with pytest.raises(ValueError, match="earlier"):
        win.plan(3, 25)


def test_sliding_window_exp_decay_and_flash_tail():
    win = SlidingWindow(iters_decay="exp", ode_tail="dpmpp_2m", tail_compress=0.4)
    plan = win.plan(0, 25)
    assert plan.ode_tail == "dpmpp_2m" and plan.tail_compress == 0.4
    win._cur = 20
    assert win._iters_here() == math.ceil(25 * math.exp(-0.1 * 7))


def test_step_plan_validation():
    with pytest.raises(ValueError, match="non-overlapping"):
        StepPlan(10, (2, 3), (2, 1))
    with pytest.raises(ValueError, match="within"):
        StepPlan(10, (9,), (2,))
    assert StepPlan(10, (2, 5), (3, 1)).span_at(2) == 3 and StepPlan(10, (2,)).span_at(3) == 0


def test_egrpo_merged_step_std_and_entropy():
    sig = flow_match_sigmas(16, shift=3.0)
    eta, k, m = 0.7, 2, 3
    s, sn = float(sig[k]), float(sig[k + m])
    want = eta * math.sqrt(s / (1 - s)) * math.sqrt(s - sn)
    assert math.isclose(float(merged_step_std(sig, k, m, eta)), want, rel_tol=1e-6)
    flow = KERNELS.get("flow_sde")
    x = torch.randn(2, 8)
    out = flow.step(x, torch.randn(2, 8), s, sn, cfg=flow.config(noise_level=eta))
    torch.testing.assert_close(out.std, torch.full((2,), want))
    h = 0.5 * math.log(2 * math.pi * math.e) + math.log(want)
    assert math.isclose(float(merged_step_entropy(sig, k, m, eta)), h, rel_tol=1e-6)
    assert math.isclose(float(gaussian_entropy(out.std)[0]), h, rel_tol=1e-6)
    # merging raises the entropy by ½·log((σ_k − σ_{k+m})/(σ_k − σ_{k+1}))
    gain = float(merged_step_entropy(sig, k, m, eta) - merged_step_entropy(sig, k, 1, eta))
    assert math.isclose(gain, 0.5 * math.log((s - sn) / (s - float(sig[k + 1]))), rel_tol=1e-5)


def test_egrpo_window_plans():
    win = MergedStep(steps=(1, 2, 3), merges=(2, 2, 1))
    assert [win.plan(n, 16).sde_steps for n in range(4)] == [(1,), (2,), (3,), (1,)]
    assert win.plan(0, 16).spans == (2,)
    assert MergedStep(choose="random").plan(0, 16, random.Random(0)).sde_steps[0] in (1, 2, 3)


def test_tail_grid_keeps_endpoints_and_compresses():
    sig = flow_match_sigmas(25, shift=3.0)
    tail = tail_sigmas(sig, 8, 0.4)
    assert tail.numel() - 1 == int((25 - 8) * 0.4)
    assert tail[0] == sig[8] and tail[-1] == 0 and bool((tail[1:] < tail[:-1]).all())
    assert tail_sigmas(sig, 24, 0.2).numel() == 2


def test_dpmpp_2m_is_exact_for_point_mass_data_and_second_order():
    """Point-mass data: x̂0 ≡ c is exact, so both orders land on the exact ODE solution. Gaussian data:
    halving the step roughly quarters the 2M error (second order) while Euler's halves."""
    c = 0.7
    x = torch.randn(5)
    s, sn = 0.8, 0.3
    exact = (sn / s) * (x - (1 - s) * c) + (1 - sn) * c
    torch.testing.assert_close(dpmpp_2m_step(x, torch.full_like(x, c), s, sn), exact)
    torch.testing.assert_close(dpmpp_2m_step(x, torch.full_like(x, c), s, sn, (torch.full_like(x, c), 0.9)), exact)
    from tests.samplers.gaussian_world import exact_ode, exact_velocity
    vf = exact_velocity()

    def solve(n, second):
        grid = torch.linspace(0.9, 0.1, n + 1, dtype=torch.float64)
        z, prev = torch.tensor([[1.3]], dtype=torch.float64), None
        for i in range(n):
            a, b = float(grid[i]), float(grid[i + 1])
            m0 = z - a * vf(z, torch.tensor([a], dtype=torch.float64))
            z = dpmpp_2m_step(z.double(), m0, a, b, prev if second else None).double()
            prev = (m0, a)
        return abs(float(z) - float(exact_ode(torch.tensor(1.3, dtype=torch.float64), 0.9, 0.1)))
    e1, e2 = solve(32, True), solve(64, True)
    assert e2 < e1 / 3
    assert solve(16, True) < solve(16, False)
