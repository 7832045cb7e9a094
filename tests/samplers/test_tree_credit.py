"""Tree credit: backups equal their formulas (λ → 0 mean, λ → ∞ max), advantages equal the anchors'
(BranchGRPO depth-wise, Flow-GRPO per prompt), credit lands on the split that decides the reward, pruning
keeps the right edges."""
import math

import pytest
import torch

from flowrl.balancers.advantages import group_advantages
from samplers import tree_spec as ts
from samplers.rng import randn_rows, sample_generator
from samplers.schedule import flow_match_sigmas
from samplers.tree import assign_credit, tree_rollout
from samplers.tree_credit import backup_log_mean_exp, backup_mean, backup_softmax, node_advantages
from samplers.tree_edges import depth_pruned, trained_edges
from samplers.windows import AllSteps
from tests.samplers.gaussian_world import exact_velocity

# an irregular tree: 0 → {1, 2}; 1 → {3, 4, 5}; 2 → {6}; 3 → {7}; 6 → {8, 9}; leaves 4, 5, 7, 8, 9
PARENT = torch.tensor([-1, 0, 0, 1, 1, 1, 2, 3, 6, 6])
LEAF_R = {4: 0.3, 5: -1.2, 7: 2.0, 8: 1.5, 9: 0.9}
LOGP = torch.tensor([math.nan, -1.0, 0.4, 0.2, -0.7, 1.1, math.nan, math.nan, 0.3, -2.0])


def _depth(parent):
    d = torch.zeros_like(parent)
    for i in range(1, parent.numel()):
        d[i] = d[parent[i]] + 1
    return d


def _kids(i):
    return [c for c in range(PARENT.numel()) if int(PARENT[c]) == i]


def _leaf_values():
    v = torch.full((PARENT.numel(),), math.nan)
    for i, r in LEAF_R.items():
        v[i] = r
    return v


def _brute(i, agg):
    return LEAF_R[i] if not _kids(i) else agg(i, [_brute(c, agg) for c in _kids(i)])


def _leaves_below(i):
    return [i] if not _kids(i) else [leaf for c in _kids(i) for leaf in _leaves_below(c)]


def test_mean_backup_is_the_mean_of_descendant_leaves_not_of_children():
    got = backup_mean(PARENT, _depth(PARENT), _leaf_values())
    for i in range(PARENT.numel()):
        want = sum(LEAF_R[leaf] for leaf in _leaves_below(i)) / len(_leaves_below(i))
        assert got[i].item() == pytest.approx(want, abs=1e-6)
    of_children = _brute(0, lambda i, vals: sum(vals) / len(vals))
    assert abs(got[0].item() - of_children) > 0.05           # the irregular tree tells the two apart


def test_softmax_backup_weights_children_by_their_edge_probability():
    got = backup_softmax(PARENT, _depth(PARENT), _leaf_values(), LOGP, alpha=1.0)

    def agg(i, vals):
        if len(vals) == 1:
            return vals[0]
        w = torch.softmax(torch.tensor([LOGP[c].item() for c in _kids(i)], dtype=torch.float64), 0)
        return float((w * torch.tensor(vals, dtype=torch.float64)).sum())

    for i in range(PARENT.numel()):
        assert got[i].item() == pytest.approx(_brute(i, agg), abs=1e-6)
    flat = LOGP.clone()
    flat[2] = math.nan                                         # a sibling without log-prob cannot be weighted
    with pytest.raises(ValueError, match="log-prob"):
        backup_softmax(PARENT, _depth(PARENT), _leaf_values(), flat)


@pytest.mark.parametrize("lam", [0.0, 0.5, 3.0, math.inf])
def test_log_mean_exp_backup_is_the_soft_bellman_formula(lam):
    got = backup_log_mean_exp(PARENT, _depth(PARENT), _leaf_values(), lam)

    def agg(i, vals):
        if lam == 0:
            return sum(vals) / len(vals)
        if math.isinf(lam):
            return max(vals)
        return math.log(sum(math.exp(lam * v) for v in vals) / len(vals)) / lam

    for i in range(PARENT.numel()):
        assert got[i].item() == pytest.approx(_brute(i, agg), abs=1e-6)


def test_log_mean_exp_limits_are_mean_and_max():
    d, v = _depth(PARENT), _leaf_values()
    torch.testing.assert_close(backup_log_mean_exp(PARENT, d, v, 1e-7),
                               backup_log_mean_exp(PARENT, d, v, 0.0),
                               atol=1e-5, rtol=0)
    torch.testing.assert_close(backup_log_mean_exp(PARENT, d, v, 1e4),
                               backup_log_mean_exp(PARENT, d, v, math.inf),
                               atol=1e-3, rtol=0)
    assert backup_log_mean_exp(PARENT, d, v, math.inf)[0].item() == pytest.approx(max(LEAF_R.values()))


def _tree(n_roots=2, splits=(0, 2, 4), k=2, steps=6, noise=1.0):
    sig = flow_match_sigmas(steps, shift=3.0)
    gens = [sample_generator(1, 0, r, 0) for r in range(n_roots)]
    x1 = randn_rows((2, 3, 3), gens)
    return tree_rollout(lambda x, s, r: exact_velocity()(x, s), x1, sig, AllSteps().plan(0, steps),
                        ts.FixedSplits(splits, k).plan(0, steps), noise=ts.SplitNoise(noise),
                        kernel="dance_sde",
                        generators=gens)


def test_depth_advantages_equal_branchgrpo_depthwise():
    tree = _tree()
    r = tree.latents.mean((1, 2, 3))
    credit = assign_credit(tree, r, ts.branchgrpo())
    n = tree.nodes
    want = torch.zeros_like(credit.values)                                # BranchGRPO, written out per set
    for key in {(int(a), int(b)) for a, b in zip(n.root, n.depth)}:
        members = (n.root == key[0]) & (n.depth == key[1])
        v = credit.values[members].double()
        if v.numel() > 1 and float(v.std()) >= 1e-6:                     # unbiased std, eps 1e-8
            want[members] = ((v - v.mean()) / (v.std() + 1e-8)).to(want.dtype)
    s = n.stochastic
    torch.testing.assert_close(credit.advantages[s], want[s].clamp(-5, 5), atol=1e-5, rtol=1e-5)
    assert credit.advantages[~s].isnan().all()


def test_flat_tree_gives_every_step_the_flow_grpo_advantage():
    steps, groups = 5, torch.tensor([0, 0, 0, 1, 1, 1])
    sig = flow_match_sigmas(steps, shift=3.0)
    gens = [sample_generator(2, 0, r, 0) for r in range(6)]
    tree = tree_rollout(lambda x, s, r: exact_velocity()(x, s), randn_rows((2, 3, 3), gens), sig,
                        AllSteps().plan(0, steps), None, kernel="flow_sde", generators=gens)
    r = tree.latents.mean((1, 2, 3))
    credit = assign_credit(tree, r, ts.flat_grpo(), root_groups=groups)
    grpo = group_advantages(r, groups, std="global", eps=1e-4, clip=5.0)
    batch = credit.batch
    assert len(batch) == 6 * steps
    torch.testing.assert_close(batch.advantage, grpo[batch.root], atol=1e-5, rtol=1e-5)


def test_sibling_parent_and_leaf_advantages():
    tree = _tree(splits=(1, 3), k=3)
    n = tree.nodes
    r = tree.latents.mean((1, 2, 3))
    values = assign_credit(tree, r, ts.branchgrpo()).values
    group = n.root
    sib = node_advantages(values, n.parent, n.depth, group, n.stochastic,
                          ts.TreeAdvantage("siblings", "group", False, 1e-4, 0.0, None))
    for p in n.parent[n.stochastic].unique().tolist():
        kids = torch.nonzero((n.parent == p) & n.stochastic).flatten()
        v = values[kids].double()
        want = torch.zeros_like(v) if kids.numel() == 1 else (v - v.mean()) / (v.std(unbiased=False) + 1e-4)
        torch.testing.assert_close(sib[kids].double(), want, atol=1e-5, rtol=1e-5)
    par_cfg = ts.TreeAdvantage("parent", "none", clip=None)
    par = node_advantages(values, n.parent, n.depth, group, n.stochastic, par_cfg)
    for leaf in tree.leaf_nodes.tolist():                 # TD errors telescope: Σ_path A = R(leaf) − V(root)
        node, total = leaf, 0.0
        while int(n.parent[node]) >= 0:
            total, node = total + float(par[node]), int(n.parent[node])
        assert total == pytest.approx(float(values[leaf] - values[node]), abs=1e-5)
    leaves = node_advantages(values, n.parent, n.depth, group, n.stochastic,
                             ts.TreeAdvantage("leaves", "group", False, 1e-4, 0.0, None))
    assert leaves.isfinite().sum() == tree.latents.shape[0]
    torch.testing.assert_close(leaves[tree.leaf_nodes], group_advantages(r, tree.leaf_root, std="group"),
                               atol=1e-5, rtol=1e-5)


def test_credit_lands_on_the_split_that_decides_the_reward():
    """Reward = +1 / 0 by the first split's choice only. Sibling and parent baselines give the first split's
    edges ±A and every later edge exactly 0; BranchGRPO's depth-wise z-score copies the branch's sign onto
    every later edge (nodes of one depth are compared across first-split branches); flat GRPO would give every
    step of a path the same advantage."""
    tree = _tree(n_roots=1, splits=(0, 2, 4), k=2, steps=6)
    n = tree.nodes
    first = []
    for leaf in tree.leaf_nodes.tolist():
        node = leaf
        while int(n.step[node]) != 0:
            node = int(n.parent[node])
        first.append(node)
    reward = torch.tensor([1.0 if f == min(first) else 0.0 for f in first])
    at_first = n.stochastic & (n.step == 0)
    later = n.stochastic & (n.step > 0)
    for kind in ("siblings", "parent"):
        spec = ts.TreeSpec(advantage=ts.TreeAdvantage(kind, "group" if kind == "siblings" else "global"))
        adv = assign_credit(tree, reward, spec).advantages
        assert (adv[at_first].abs() > 0.5).all() and adv[later].abs().max() < 1e-6, kind
    depth = assign_credit(tree, reward, ts.branchgrpo()).advantages
    assert (depth[later].abs() > 0.5).all()
    for node in torch.nonzero(later).flatten().tolist():
        anc = node
        while int(n.step[anc]) != 0:
            anc = int(n.parent[anc])
        assert math.copysign(1, float(depth[node])) == math.copysign(1, float(depth[anc]))


def test_depth_pruning_fixed_and_sliding_as_branchgrpo():
    cfg = ts.TrainEdges(depth_prune=(15, 16, 17, 18), depth_slide_every=30, depth_stop=9)
    assert depth_pruned(cfg.depth_prune, 0, cfg, (0, 3, 6, 9)) == {15, 16, 17, 18}
    assert depth_pruned(cfg.depth_prune, 59, cfg, (0, 3, 6, 9)) == {14, 15, 16, 17}
    assert depth_pruned(cfg.depth_prune, 10_000, cfg, (0, 3, 6, 9)) == {9, 10, 11, 12}
    tree = _tree(n_roots=1, splits=(0, 2), steps=6)
    spec = ts.TreeSpec(train=ts.TrainEdges(depth_prune=(2, 5)))
    credit = assign_credit(tree, tree.latents.mean((1, 2, 3)), spec)
    assert set(credit.batch.depth.tolist()) == {1, 3, 4, 6}
    late = assign_credit(tree, tree.latents.mean((1, 2, 3)),
                         ts.TreeSpec(train=ts.TrainEdges(depth_prune=(2, 5), prune_until=3)), iteration=4)
    assert set(late.batch.depth.tolist()) == set(range(1, 7))


def test_width_pruning_and_window_only():
    tree = _tree(n_roots=1, splits=(0, 2), steps=6)      # 4 last-split branches × 3 later edges (steps 3–5)
    r = tree.latents.mean((1, 2, 3))
    base = assign_credit(tree, r, ts.branchgrpo())
    n, adv = tree.nodes, base.advantages
    spec = ts.TreeSpec(noise=ts.SplitNoise(4.0), train=ts.TrainEdges(width="per_branch"))
    per = assign_credit(tree, r, spec)
    kept_late = per.batch.node[per.batch.step > 2].tolist()
    assert len(kept_late) == 4 * max(1, int(3 * 0.5))
    for node in kept_late:                                      # each kept edge is its branch's best
        anc = node
        while int(n.step[anc]) != 2:
            anc = int(n.parent[anc])
        branch = [c for c in torch.nonzero(n.stochastic & (n.step > 2)).flatten().tolist()
                  if _ancestor_at(n, c, 2) == anc]
        assert float(adv[node]) == max(float(adv[c]) for c in branch)
    bw = assign_credit(tree, r, ts.TreeSpec(train=ts.TrainEdges(width="best_worst")))
    late = torch.nonzero(n.stochastic & (n.step > 2)).flatten().tolist()
    late_all = sorted(late, key=lambda c: -float(adv[c]))
    assert set(bw.batch.node[bw.batch.step > 2].tolist()) == set(late_all[:3] + late_all[-3:])
    assert len(bw.batch.node[bw.batch.step <= 2]) == 2 + 2 + 4      # edges up to the last split all kept
    win = assign_credit(tree, r, ts.TreeSpec(train=ts.TrainEdges(window_only=True)))
    assert set(win.batch.step.tolist()) == {0, 2}
    torch.testing.assert_close(win.batch.advantage, adv[win.batch.node])


def _ancestor_at(n, node, step):
    while int(n.step[node]) != step:
        node = int(n.parent[node])
    return node


def test_trained_edges_need_stochastic_edges_and_credit_checks_inputs():
    tree = _tree(n_roots=1, splits=(1,), steps=4)
    ids = trained_edges(tree.nodes, torch.zeros(len(tree.nodes)), ts.TrainEdges(), (1,))
    assert bool(tree.nodes.stochastic[ids].all()) and ids.numel() == int(tree.nodes.stochastic.sum())
    with pytest.raises(ValueError, match="rewards for"):
        assign_credit(tree, torch.zeros(3), ts.branchgrpo())
    with pytest.raises(ValueError, match="root_groups"):
        assign_credit(tree, torch.zeros(2), ts.branchgrpo(), root_groups=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="kind"):
        ts.TreeAdvantage("cousins")
