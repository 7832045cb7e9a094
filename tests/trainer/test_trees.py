"""Branching trees in the training loop (``sampler.tree``): the stage grows one tree per prompt and counts
its forwards, a tree draws the same noise whatever its batch companions, the trained edges carry the tree
credit of the balancer's leaf advantages (equal to the credit of the raw rewards for affine-invariant
choices), forward-process objectives train on the leaves, the recipes run end to end on the tiny toy, SD3,
FLUX and Wan policies, and a tree run resumes bitwise."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from conftest import toy_overrides
from test_resume import assert_bitwise, final_state

from flowrl.config import ConfigError, load_config, load_resolved
from flowrl.training.scoring import score_samples
from flowrl.training.trainer import Trainer
from flowrl.training.trees import EdgeRows, TreeSamples
from samplers import tree_spec as ts
from samplers.rng import sample_generator
from samplers.tree import assign_credit, tree_rollout

REPO = Path(__file__).resolve().parents[2]
TREE = ["sampler.steps=4", "sampler.kernel.kind=dance_sde", "train.group_size=4",
        "sampler.tree={preset: branchgrpo, branching: {kind: fixed, steps: [0, 2]}, noise: {scale: 2.0}}"]


def tree_trainer(tmp_path, objective="grpo", extra=()):
    return Trainer(load_config(None, toy_overrides(tmp_path, objective) + TREE + list(extra)))


def count_rows(policy) -> list[int]:
    """Rows of every velocity call of ``policy`` from now on."""
    rows, velocity = [], policy.velocity

    def counted(x, sigma, cond, guidance=None):
        rows.append(x.shape[0])
        return velocity(x, sigma, cond, guidance)

    policy.velocity = counted
    return rows


def test_stage_grows_one_tree_per_prompt_and_counts_its_forwards(tmp_path):
    t = tree_trainer(tmp_path)
    rows = count_rows(t.policy)
    s = t.rollout.run(0)
    per_tree = 1 + 2 + 2 + 4                           # frontier sizes of splits at 0 and 2 on 4 steps
    assert isinstance(s, TreeSamples) and s.rollout_nfe == 2 * per_tree == sum(rows)
    assert s.metrics["rollout/forwards"] == s.rollout_nfe and s.metrics["tree/leaves"] == 8
    assert s.group_ids.tolist() == [0] * 4 + [1] * 4 and s.pixels.shape == (8, 3, 32, 32)
    assert s.tree.leaf_root.tolist() == [0] * 4 + [1] * 4
    assert len(s.prompts) == 8 and s.prompts[:4] == [s.prompts[0]] * 4
    assert torch.equal(t.rollout.run(0).result.latents, s.result.latents)   # a function of (seed, iteration)


def test_a_prompts_tree_is_the_same_alone(tmp_path):
    t = tree_trainer(tmp_path)
    s = t.rollout.run(0)
    policy, cond = t.policy, s.root_cond.select([1])
    gen = [sample_generator(t.cfg.run.seed, 0, 1, 0)]
    x1 = policy.noise(gen, 32, 32)
    spec = t.rollout.strategy.spec
    with torch.no_grad(), policy.adapter("old"):
        alone = tree_rollout(lambda x, sig, r: policy.velocity(x, sig, cond.select(r), 1.0), x1,
                             policy.sigmas(4, x1), t.rollout.plan(0), t.rollout.strategy.branch(0),
                             noise=spec.noise, kernel="dance_sde", generators=gen)
    # the noise is the same draw for draw; the network's matmuls may round differently at other batch sizes
    close = dict(atol=2e-5, rtol=0)
    torch.testing.assert_close(alone.latents, s.result.latents[4:], **close)
    torch.testing.assert_close(alone.x0_pred, s.result.x0_pred[4:], **close)
    nodes = s.tree.nodes
    mine = torch.nonzero(nodes.stochastic & (nodes.root == 1)).flatten()
    theirs = torch.nonzero(alone.nodes.stochastic).flatten()
    a, b = s.tree.edge_batch(mine).traj, alone.edge_batch(theirs).traj
    assert torch.equal(a.noise, b.noise)                       # every edge's ε, bit for bit
    torch.testing.assert_close(a.x_next, b.x_next, **close)
    torch.testing.assert_close(a.log_prob, b.log_prob, **close)


def test_edges_carry_the_tree_credit_of_the_balancer_advantages(tmp_path):
    t = tree_trainer(tmp_path)
    s = t.rollout.run(0)
    R = torch.tensor([0.1, 0.9, 0.4, 0.4, 0.0, 0.2, 0.8, 0.5])
    g = s.group_ids
    mean = torch.stack([R[g == k].mean() for k in (0, 1)])[g]
    std = torch.stack([R[g == k].std() for k in (0, 1)])[g]
    adv = (R - mean) / std                                     # a per-group affine map of R
    rows, edge_adv = s.training_rows(adv)
    assert isinstance(rows, EdgeRows) and edge_adv.shape == (len(rows),) and torch.isfinite(edge_adv).all()
    expected = assign_credit(s.tree, adv, t.rollout.strategy.spec).batch
    assert torch.equal(edge_adv, expected.advantage.float())
    raw = assign_credit(s.tree, R, t.rollout.strategy.spec).batch  # mean backup + depth z-score: invariant
    torch.testing.assert_close(edge_adv, raw.advantage.float(), atol=1e-5, rtol=0)
    no_std = ts.TreeSpec(ts.FixedSplits((0, 2)), advantage=ts.TreeAdvantage(std="none"))
    assert not torch.allclose(assign_credit(s.tree, adv, no_std).batch.advantage,   # not invariant (docs)
                              assign_credit(s.tree, R, no_std).batch.advantage)
    assert s.metrics["train/rows"] == len(rows) == s.metrics["train/forwards"]   # one stored step per edge
    mb = rows.rows(torch.tensor([0, 5]))
    assert mb.result.traj.x.shape[:2] == (2, 1) and mb.cond.prompts == [s.root_cond.prompts[int(r)]
                                                                         for r in rows.batch.root[[0, 5]]]
    stats = t.updater.run(rows, edge_adv, torch.isfinite(edge_adv), 0, 0)
    assert stats.steps == t.cfg.train.updates_per_epoch and stats.skipped_steps == 0


def test_a_non_finite_leaf_advantage_leaves_its_tree_out(tmp_path):
    t = tree_trainer(tmp_path)
    s = t.rollout.run(0)
    adv = torch.tensor([1.0, -1.0, 0.5, float("nan"), 0.3, -0.3, 1.2, -1.2])
    rows, edge_adv = s.training_rows(adv)
    in_tree0 = rows.batch.root == 0
    assert torch.isnan(edge_adv[in_tree0]).all() and torch.isfinite(edge_adv[~in_tree0]).all()


def test_grpo_tree_refuses_a_reward_gradient_balancer(tmp_path):
    s = tree_trainer(tmp_path).rollout.run(0)
    with pytest.raises(ValueError, match="reward_gram"):
        s.rows(torch.tensor([0]))


def test_forward_process_objectives_train_on_the_leaves(tmp_path):
    t = tree_trainer(tmp_path, "nft", ["sampler.kernel.kind=flow_sde",
                                       "sampler.window={kind: fixed, steps: []}"])
    s = t.rollout.run(0)
    assert s.tree.edges is None                         # nothing stored: NFT needs only the leaves' x0
    adv = torch.linspace(-1, 1, 8)
    rows, row_adv = s.training_rows(adv)
    assert rows is s and torch.equal(row_adv, adv)
    mb = s.rows(torch.tensor([1, 6]))
    assert torch.equal(mb.result.latents, s.tree.latents[[1, 6]])
    assert mb.cond.prompts == [s.prompts[1], s.prompts[6]]
    before = {k: v.clone() for k, v in t.policy.adapter_state_dict("train").items()}
    t.iteration(0)
    assert any(not torch.equal(v, t.policy.adapter_state_dict("train")[k]) for k, v in before.items())


@pytest.mark.parametrize("objective, bad, message", [
    ("grpo", ["train.group_size=2"], "train.group_size=4"),
    ("nft", ["sampler.kernel.kind=ode"], "split steps are SDE"),
    ("grpo", ["sampler.tree={preset: tempflow, branching: {kind: every_step, factor: 3, steps: [0]}}"],
     "ODE"),
    ("grpo", ["sampler.tree={preset: branchgrp}"], "preset must be one of"),
])
def test_clear_errors(tmp_path, objective, bad, message):
    with pytest.raises((ValueError, ConfigError), match=message):
        tree_trainer(tmp_path, objective, bad)


def recipe_overrides(tmp_path, iterations=1):
    return [f"run.output_dir={tmp_path}", "run.name=run", 'run.mixed_precision="no"', "policy.tiny=true",
            f"train.iterations={iterations}", "train.prompts_per_iter=2", "eval.before=false",
            "eval.after=false", "log.progress=false", "checkpoint.every=0", "sampler.height=32",
            "sampler.width=32"]


def check_tree_run(t, out):
    assert out["state"]["iteration"] == t.cfg.train.iterations and out["state"]["skipped_updates"] == 0
    s = t.rollout.run(0)
    assert isinstance(s, TreeSamples)
    assert out["state"]["rollout_nfe"] == t.cfg.train.iterations * s.rollout_nfe
    assert s.rollout_nfe == s.tree.forwards * t.cfg.train.prompts_per_iter // s.tree.num_roots


@pytest.mark.parametrize("recipe", sorted(p.name for p in (REPO / "configs/toy/trees").glob("*.yaml")))
def test_toy_tree_recipes_run(tmp_path, recipe):
    ov = recipe_overrides(tmp_path) + ["policy.lora={rank: 2}", "train.micro_batch=4", "sampler.chunk=4"]
    cfg = load_config(REPO / "configs/toy/trees" / recipe, ov)
    t = Trainer(cfg)
    start = {k: v.clone() for k, v in t.policy.adapter_state_dict("train").items()}
    check_tree_run(t, t.run())
    assert any(not torch.equal(v, t.policy.adapter_state_dict("train")[k]) for k, v in start.items())


# family: (recipe, extra overrides); the real-model recipes keep their splits 0, 3, 6, 9 on 10 steps
FAMILIES = {
    "sd3": ("configs/sd35/branchgrpo_hpsv2.yaml", [
        "policy.max_sequence_length=8", "sampler.steps=10", "sampler.height=16", "sampler.width=16",
        "policy.lora={rank: 2, alpha: 4, target_modules: [to_q, to_v]}"]),
    "flux": ("configs/flux/branchgrpo_hpsv2.yaml", ["policy.max_sequence_length=8", "sampler.steps=10",
                                                     "sampler.height=16", "sampler.width=16",
                                                     "policy.gradient_checkpointing=false"]),
    "wan": ("configs/toy/trees/branchgrpo.yaml", [
        "policy.kind=wan", "policy.max_sequence_length=8", "train.micro_batch=4", "sampler.chunk=4",
        "policy.lora={rank: 2, alpha: 4, target_modules: [to_q]}",
        "sampler.height=16", "sampler.width=16", "sampler.num_frames=5",
        "data.train=configs/prompts/video_test.txt", "eval.held_out=[]",
        "rewards={video_frame_mean: {weight: 1.0, kwargs: {reward: jpeg_compressibility}}}"]),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_tiny_families_run_the_tree_recipes(tmp_path, family):
    recipe, extra = FAMILIES[family]
    ov = recipe_overrides(tmp_path) + ["rewards={jpeg_compressibility: 1.0}", "eval.held_out=[]"] + extra
    t = Trainer(load_config(REPO / recipe, ov))
    check_tree_run(t, t.run())


def test_kill_and_resume_a_tree_run_is_bitwise_identical(tmp_path):
    base = toy_overrides(tmp_path, "grpo", iterations=3) + TREE + ["eval.before=false", "eval.after=false"]
    full = Trainer(load_config(None, base + ["run.name=full"]))
    full.run()
    Trainer(load_config(None, base + ["run.name=cut", "train.iterations=2"])).run()
    resumed = Trainer(load_resolved(tmp_path / "cut", ["run.resume=true", "train.iterations=3"]))
    resumed.run()
    assert resumed.state.rollout_nfe == full.state.rollout_nfe == 3 * 2 * 9
    assert_bitwise(final_state(full), final_state(resumed))


def test_scores_see_the_leaves_as_groups(tmp_path):
    t = tree_trainer(tmp_path)
    s = t.rollout.run(0)
    scores = score_samples(t.parts.rewards, t.dist, s)
    assert scores.R.shape == (8, 1)
