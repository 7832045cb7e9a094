"""Tree engine: the tree that never splits is the pre-tree flat rollout bit for bit; per-edge log-probs equal
a flat rollout's on the same noise; a node's output does not depend on its batch companions; NFE = Σ frontier
sizes."""
import random

import pytest
import torch

from samplers import KERNELS
from samplers import tree_spec as ts
from samplers.rng import randn_rows, sample_generator
from samplers.rollout import rollout
from samplers.schedule import flow_match_sigmas
from samplers.tree import child_generator, tree_rollout
from samplers.windows import AllSteps, FixedSteps, SlidingWindow, StepPlan
from tests.samplers.flat_reference import reference_rollout
from tests.samplers.gaussian_world import exact_velocity

SHAPE = (3, 4, 4)
FIELDS = ("x", "x_next", "mean", "std", "log_prob", "sigma", "sigma_next", "step_idx", "noise")


def _start(idx, seed=5, iteration=2):
    gens = [sample_generator(seed, iteration, 0, i) for i in idx]
    return randn_rows(SHAPE, gens), gens


def _assert_same(a, b):
    assert torch.equal(a.latents, b.latents) and a.nfe == b.nfe
    assert (a.x0_pred is None) == (b.x0_pred is None)
    assert a.x0_pred is None or torch.equal(a.x0_pred, b.x0_pred)
    assert (a.traj is None) == (b.traj is None)
    if a.traj is not None:
        for name in FIELDS:
            va, vb = getattr(a.traj, name), getattr(b.traj, name)
            assert (va is None and vb is None) or torch.equal(va, vb), name


CASES = [
    ("ode", None, {}),
    ("flow_sde", AllSteps(), {}),
    ("dance_sde", FixedSteps((1, 2, 5)), {}),
    ("cps", FixedSteps((0, 7)), {"keep_noise": False}),
    ("flow_sde", StepPlan(10, (1, 6), (3, 2)), {}),
    ("flow_sde", SlidingWindow(size=3, ode_tail="dpmpp_2m", tail_compress=0.4), {}),
    ("dance_sde", AllSteps(skip_last=True), {"store": False}),
    ("flow_sde", FixedSteps((2,)), {"reduce": "sum"}),
]


@pytest.mark.parametrize("kernel,window,kw", CASES)
def test_flat_rollout_is_the_pre_tree_engine_bit_for_bit(kernel, window, kw):
    sig = flow_match_sigmas(10, shift=3.0)
    plan = window if (window is None or isinstance(window, StepPlan)) else window.plan(0, 10)
    new = rollout(exact_velocity(), *_start(range(4))[:1], sig, plan, kernel, None, _start(range(4))[1], **kw)
    old = reference_rollout(exact_velocity(), *_start(range(4))[:1], sig, plan, kernel, None,
                            _start(range(4))[1], **kw)
    _assert_same(new, old)


def test_non_splitting_tree_with_chunked_model_calls_is_the_flat_rollout():
    sig = flow_match_sigmas(8, shift=3.0)
    plan = FixedSteps((0, 3, 4)).plan(0, 8)
    calls = []

    def vf(x, s, roots):
        calls.append(roots.tolist())
        return exact_velocity()(x, s)

    x1, gens = _start(range(5))
    tree = tree_rollout(vf, x1, sig, plan, ts.NoSplit().plan(0, 8), kernel="flow_sde", generators=gens,
                        max_batch=2)
    flat = reference_rollout(exact_velocity(), *_start(range(5))[:1], sig, plan, "flow_sde", None,
                             _start(range(5))[1])
    _assert_same(tree.result(), flat)
    assert calls[:3] == [[0, 1], [2, 3], [4]] and len(calls) == 8 * 3 and tree.forwards == 8 * 5


def test_split_edges_equal_a_flat_rollout_on_the_same_noise():
    """Below a split at step 3, child j's path is the flat rollout from the parent latent on σ[3:], drawing
    from the child's generator; its edges (x, x', μ, s, log π, ε) match bit for bit."""
    sig = flow_match_sigmas(8, shift=3.0)
    x1, gens = _start([0])
    branch = ts.FixedSplits((3,), 3).plan(0, 8)
    tree = tree_rollout(lambda x, s, r: exact_velocity()(x, s), x1, sig, AllSteps().plan(0, 8), branch,
                        kernel="dance_sde", generators=gens)
    nodes = tree.nodes
    parent_latent = tree.edge_batch(torch.nonzero(nodes.step == 3).flatten()[:1]).traj.x[:, 0]
    g_root = _start([0])[1][0]
    for _ in range(3):                      # the root's generator drew steps 0, 1, 2 before the split
        torch.randn(SHAPE, generator=g_root)
    for j in range(3):
        flat = reference_rollout(exact_velocity(), parent_latent, sig[3:], AllSteps().plan(0, 5), "dance_sde",
                                 None,
                                 [child_generator(g_root, 3, j)])
        leaf = tree.leaf_nodes[j]
        path = [int(leaf)]
        while int(nodes.step[path[-1]]) > 3:
            path.append(int(nodes.parent[path[-1]]))
        edges = tree.edge_batch(torch.tensor(path[::-1]))
        for name in ("x", "x_next", "mean", "std", "log_prob", "noise", "sigma"):
            assert torch.equal(getattr(edges.traj, name)[:, 0], getattr(flat.traj, name)[0]), (j, name)
        assert torch.equal(tree.latents[j], flat.latents[0])


def test_stored_log_probs_rescore_exactly_and_use_the_nominal_std():
    sig = flow_match_sigmas(8, shift=3.0)
    x1, gens = _start(range(2))
    spec = ts.branchgrpo()
    spec.branching = ts.FixedSplits((0, 2, 4), 2)
    plan, branch = spec.plans(0, 8)
    k = KERNELS.get("dance_sde")
    tree = tree_rollout(lambda x, s, r: exact_velocity()(x, s), x1, sig, plan, branch, noise=spec.noise,
                        kernel=k, generators=gens)
    batch = tree.edge_batch(torch.nonzero(tree.nodes.stochastic).flatten())
    tr = batch.traj
    x, xn, s, sn = tr.x[:, 0], tr.x_next[:, 0], tr.sigma[:, 0], tr.sigma_next[:, 0]
    out = k.step(x, exact_velocity()(x, s), s, sn, x_next=xn)      # the GRPO training path
    assert torch.equal(k.log_prob(xn, out.mean, out.std), tr.log_prob[:, 0])
    ref = torch.distributions.Normal(out.mean, out.std.view(-1, 1, 1, 1)).log_prob(xn).mean((1, 2, 3))
    torch.testing.assert_close(tr.log_prob[:, 0], ref, rtol=1e-5, atol=1e-4)
    eps = tr.noise[:, 0]
    split = torch.isin(batch.step, torch.tensor(branch.splits))
    assert abs(float(eps[split].std()) - 4.0) < 0.2 and abs(float(eps[~split].std()) - 1.0) < 0.1
    torch.testing.assert_close(xn, tr.mean[:, 0] + tr.std[:, 0].view(-1, 1, 1, 1) * eps)


def test_a_node_does_not_depend_on_its_batch_companions():
    sig = flow_match_sigmas(8, shift=3.0)
    plan, branch = AllSteps().plan(0, 8), ts.FixedSplits((1, 4), 2).plan(0, 8)

    def run(idx):
        x1, gens = _start(idx)
        return tree_rollout(lambda x, s, r: exact_velocity()(x, s), x1, sig, plan, branch, kernel="flow_sde",
                            generators=gens, noise=ts.SplitNoise(2.0))

    many, alone = run(range(4)), run([2])
    rows = torch.nonzero(many.leaf_root == 2).flatten()
    assert torch.equal(many.latents[rows], alone.latents) and torch.equal(many.x0_pred[rows], alone.x0_pred)
    mine = torch.nonzero(many.nodes.stochastic & (many.nodes.root == 2)).flatten()
    a, b = many.edge_batch(mine).traj, alone.edge_batch(torch.nonzero(alone.nodes.stochastic).flatten()).traj
    for name in ("x", "x_next", "log_prob", "noise"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name


@pytest.mark.parametrize("steps,splits,k,forwards,leaves", [
    (8, (0, 2, 4), 2, 37, 8), (8, (1, 3, 5), 2, 30, 8), (8, (2, 3, 4), 2, 33, 8), (8, (0, 1, 2), 2, 47, 8),
    (8, (0,), 4, 29, 4), (20, (0, 3, 6, 9), 2, 203, 16),      # forwards = Σ frontier sizes; BranchGRPO 203
])
def test_nfe_is_the_sum_of_frontier_sizes(steps, splits, k, forwards, leaves):
    sig = flow_match_sigmas(steps, shift=3.0)
    rows = []

    def vf(x, s, r):
        rows.append(x.shape[0])
        return exact_velocity()(x, s)

    x1, gens = _start(range(2))
    tree = tree_rollout(vf, x1, sig, AllSteps().plan(0, steps), ts.FixedSplits(splits, k).plan(0, steps),
                        kernel="dance_sde", generators=gens, store=False)
    assert len(rows) == steps and sum(rows) == tree.forwards == 2 * forwards
    assert tree.latents.shape[0] == 2 * leaves and list(tree.frontier_sizes) == rows


def test_trunk_branching_is_tempflow():
    """ODE trunk; at every step but the last K SDE children, each completed by ODE:
    forwards = Σ_i (1 + K·i) = N + K·N(N−1)/2, leaves = 1 + K·(N−1), one stochastic edge per branch."""
    n, K = 6, 3
    sig = flow_match_sigmas(n, shift=3.0)
    x1, gens = _start([0])
    spec = ts.TreeSpec(ts.EveryStep(K), None)
    plan, branch = spec.plans(0, n)
    tree = tree_rollout(lambda x, s, r: exact_velocity()(x, s), x1, sig, plan, branch, kernel="flow_sde",
                        generators=gens)
    assert tree.forwards == n + K * n * (n - 1) // 2 and tree.latents.shape[0] == 1 + K * (n - 1)
    nodes = tree.nodes
    assert set(nodes.step[nodes.stochastic].tolist()) == set(range(n - 1))
    for leaf in tree.leaf_nodes.tolist():
        path, node = [], leaf
        while node > 0:
            path.append(bool(nodes.stochastic[node]))
            node = int(nodes.parent[node])
        assert sum(path) <= 1
    ode = tree_rollout(lambda x, s, r: exact_velocity()(x, s), x1, sig)          # the trunk is the ODE path
    assert torch.equal(tree.latents[0], ode.latents[0])


def test_every_preset_builds_and_runs():
    sig = flow_match_sigmas(20, shift=3.0)
    for name, make in ts.PRESETS.items():
        spec = make()
        plan, branch = spec.plans(0, 20, random.Random(0))
        x1, gens = _start(range(1))
        tree = tree_rollout(lambda x, s, r: exact_velocity()(x, s), x1, sig, plan, branch, noise=spec.noise,
                            kernel="flow_sde", generators=gens, store=False)
        assert torch.isfinite(tree.latents).all(), name


def test_split_windows_slide_and_draw():
    win = ts.SplitWindow(size=3, factor=2, every=2)
    assert [win.plan(it, 8).splits for it in (0, 1, 2, 9)] == [(0, 1, 2), (0, 1, 2), (1, 2, 3), (4, 5, 6)]
    assert win.plan(10, 8).splits == (0, 1, 2)                          # 5 positions: rolls back
    assert ts.SplitWindow(size=3, every=1, roll_back=False).plan(99, 8).splits == (4, 5, 6)
    starts = {ts.RandomSplitWindow(2, 2, (1, 6)).plan(0, 8, random.Random(s)).splits[0] for s in range(200)}
    assert starts == {1, 2, 3, 4}
    geo_window = ts.RandomSplitWindow(2, 2, geometric_p=0.6)
    geo = [geo_window.plan(0, 8, random.Random(s)).splits[0] for s in range(400)]
    assert geo.count(0) > geo.count(1) > geo.count(2)
    assert ts.SplitNoise(4.0, ramp=1.0).at(3, 4) == 8.0 and ts.SplitNoise(4.0).at(2, 4) == 4.0


def test_tree_errors():
    sig = flow_match_sigmas(6)
    x1, gens = _start(range(2))

    def vf(x, s, r):
        return exact_velocity()(x, s)

    with pytest.raises(ValueError, match="merged"):
        tree_rollout(vf, x1, sig, StepPlan(6, (1,), (3,)), ts.FixedSplits((2,)).plan(0, 6), generators=gens)
    with pytest.raises(ValueError, match="ODE trunk"):
        tree_rollout(vf, x1, sig, AllSteps().plan(0, 6), ts.EveryStep(2).plan(0, 6), generators=gens)
    with pytest.raises(ValueError, match="deterministic"):
        tree_rollout(vf, x1, sig, ode_kernel="flow_sde")
    with pytest.raises(ValueError, match="generator"):
        tree_rollout(vf, x1, sig, None, ts.FixedSplits((1,)).plan(0, 6))
    with pytest.raises(ValueError, match="factor"):
        ts.FixedSplits((1,), 1).plan(0, 6)
    with pytest.raises(ValueError, match="outside"):
        ts.FixedSplits((7,)).plan(0, 6)
    with pytest.raises(ValueError, match="rng"):
        ts.RandomSplitWindow().plan(0, 6)
