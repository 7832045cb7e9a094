"""The flat rollout (samplers.rollout, the readable loop every flat caller runs) equals the tree engine
(samplers.tree) with no branch plan, bit for bit, on every step plan, kernel and ODE kernel."""
import pytest
import torch

from samplers import tree_spec as ts
from samplers.rollout import rollout
from samplers.schedule import flow_match_sigmas
from samplers.tree import tree_rollout
from samplers.windows import AllSteps, FixedSteps, SlidingWindow, StepPlan
from tests.samplers.gaussian_world import exact_velocity
from tests.samplers.test_tree_engine import _assert_same, _start

CASES = [
    ("ode", None, None, {}),
    ("dpmpp_2m", None, None, {}),
    ("flow_sde", AllSteps(), None, {}),
    ("flow_sde", FixedSteps((2, 5)), "dpmpp_2m", {}),
    ("dance_sde", FixedSteps((1, 2, 5)), None, {}),
    ("cps", FixedSteps((0, 7)), None, {"keep_noise": False}),
    ("flow_sde", StepPlan(10, (1, 6), (3, 2)), None, {}),
    ("flow_sde", SlidingWindow(size=3, ode_tail="dpmpp_2m", tail_compress=0.4), None, {}),
    ("flow_sde", SlidingWindow(size=2, ode_tail="dpmpp_2m", tail_compress=0.5), "dpmpp_2m", {}),
    ("dance_sde", AllSteps(skip_last=True), None, {"store": False}),
    ("flow_sde", FixedSteps((2,)), None, {"reduce": "sum"}),
]


@pytest.mark.parametrize("kernel,window,ode_kernel,kw", CASES)
def test_flat_rollout_equals_the_non_splitting_tree(kernel, window, ode_kernel, kw):
    sig = flow_match_sigmas(10, shift=3.0)
    plan = window if (window is None or isinstance(window, StepPlan)) else window.plan(3, 10)
    x1, gens = _start(range(4))
    flat = rollout(exact_velocity(), x1, sig, plan, kernel, None, gens, ode_kernel=ode_kernel, **kw)
    x1, gens = _start(range(4))
    tree = tree_rollout(lambda x, s, r: exact_velocity()(x, s), x1, sig, plan, ts.NoSplit().plan(0, 10),
                        kernel=kernel, ode_kernel=ode_kernel, generators=gens, **kw)
    _assert_same(flat, tree.result())
    assert flat.nfe == tree.forwards // 4


def test_flat_rollout_draws_each_rows_noise_from_its_own_generator():
    """Row b alone equals row b of the batch: a sample never depends on its batch companions."""
    sig, plan = flow_match_sigmas(6, shift=3.0), AllSteps().plan(0, 6)
    x1, gens = _start(range(3))
    batch = rollout(exact_velocity(), x1, sig, plan, "flow_sde", None, gens)
    x1, gens = _start([1])
    alone = rollout(exact_velocity(), x1, sig, plan, "flow_sde", None, gens)
    assert torch.allclose(batch.latents[1:2], alone.latents, atol=0, rtol=1e-6)
    assert torch.allclose(batch.traj.log_prob[1:2], alone.traj.log_prob, atol=1e-6)
