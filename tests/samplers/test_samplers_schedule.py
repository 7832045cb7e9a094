"""σ grids equal diffusers' FlowMatchEulerDiscreteScheduler.set_timesteps output bit for bit."""
import numpy as np
import pytest
import torch
from diffusers import FlowMatchEulerDiscreteScheduler
from diffusers.pipelines.flux.pipeline_flux import calculate_shift as diffusers_calculate_shift

from samplers.schedule import (
    calculate_shift,
    check_grid,
    flow_match_sigmas,
    flux_sigmas,
    np_linspace,
    timesteps_from_sigmas,
)


# SD3/SD3.5 scheduler config: shift 3.0. Wan2.1 configs: shift 3.0 (480p) / 5.0 (720p); a non-integer too.
@pytest.mark.parametrize("shift", [1.0, 3.0, 5.0, 7.3])
@pytest.mark.parametrize("steps", [1, 2, 10, 25, 28, 40])
def test_static_shift_grid_equals_diffusers(shift, steps):
    sched = FlowMatchEulerDiscreteScheduler(shift=shift)
    sched.set_timesteps(steps)
    grid = flow_match_sigmas(steps, shift=shift)
    assert torch.equal(grid, sched.sigmas)
    assert torch.equal(timesteps_from_sigmas(grid), sched.timesteps)


# FLUX.1 scheduler config: dynamic shifting, base 0.5 → max 1.15 over 256 → 4096 image tokens.
FLUX_CFG = {"shift": 3.0, "use_dynamic_shifting": True, "base_shift": 0.5, "max_shift": 1.15,
                "base_image_seq_len": 256, "max_image_seq_len": 4096}


@pytest.mark.parametrize("steps", [1, 6, 28])
@pytest.mark.parametrize("seq_len", [16, 256, 1024, 4096, 777])
def test_flux_dynamic_shift_grid_equals_diffusers(steps, seq_len):
    sched = FlowMatchEulerDiscreteScheduler(**FLUX_CFG)
    mu = diffusers_calculate_shift(seq_len, 256, 4096, 0.5, 1.15)
    assert calculate_shift(seq_len) == mu
    sched.set_timesteps(sigmas=np.linspace(1.0, 1 / steps, steps), mu=mu)
    assert torch.equal(flux_sigmas(steps, seq_len), sched.sigmas)


def test_dynamic_shift_without_custom_sigmas_and_terminal_shift():
    sched = FlowMatchEulerDiscreteScheduler(**FLUX_CFG)
    sched.set_timesteps(12, mu=0.8)
    assert torch.equal(flow_match_sigmas(12, use_dynamic_shifting=True, mu=0.8), sched.sigmas)
    sched = FlowMatchEulerDiscreteScheduler(shift=3.0, shift_terminal=0.1)
    sched.set_timesteps(9)
    torch.testing.assert_close(flow_match_sigmas(9, shift=3.0, shift_terminal=0.1), sched.sigmas, rtol=0, atol=1e-7)


def test_np_linspace_is_numpy_linspace():
    for n in (1, 2, 3, 17, 50):
        assert np.array_equal(np_linspace(1000.0, 2.9940, n).numpy(), np.linspace(1000.0, 2.9940, n))


def test_grid_errors():
    with pytest.raises(ValueError, match="mu"):
        flow_match_sigmas(10, use_dynamic_shifting=True)
    with pytest.raises(ValueError, match="num_steps"):
        flow_match_sigmas(0)
    with pytest.raises(ValueError, match="decreasing"):
        check_grid(torch.tensor([0.5, 0.7, 0.0]))
    with pytest.raises(ValueError, match="custom sigmas"):
        flow_match_sigmas(3, sigmas=[1.0, 0.5])
