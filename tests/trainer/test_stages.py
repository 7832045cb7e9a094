"""What each stage of the loop hands the next, on the tiny toy policy: rollout → scoring → advantages → rows →
TrainBatches → optimizer steps → old-adapter update."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from conftest import toy_overrides

from flowrl.balancers.services import NoServices
from flowrl.config import load_config
from flowrl.training.scoring import score_samples
from flowrl.training.trainer import Trainer


@pytest.fixture(params=["grpo", "nft"])
def trainer(request, tmp_path):
    return Trainer(load_config(None, toy_overrides(tmp_path, request.param)))


def test_rollout_hands_samples_with_their_trajectory_and_cost(trainer):
    cfg = trainer.cfg
    P, G, steps = cfg.train.prompts_per_iter, cfg.train.group_size, cfg.sampler.steps
    s = trainer.rollout.run(0)
    assert len(s.prompts) == P * G and s.group_ids.tolist() == [0, 0, 1, 1]
    assert s.result.latents.shape[0] == P * G and s.pixels.shape == (P * G, 3, 32, 32)
    assert 0 <= float(s.pixels.min()) and float(s.pixels.max()) <= 1
    assert s.rollout_nfe == steps * P * G                       # one velocity evaluation per step per sample
    if cfg.objective.kind == "grpo":                            # stored SDE steps, scored with the rollout kernel
        assert s.result.traj.x.shape[:2] == (P * G, steps)       # window "all": every step stored
        assert s.how.kernel.name == "flow_sde" and s.how.reduce == "mean"
    else:
        assert s.result.traj is None                            # the forward process needs only x0
    again = trainer.rollout.run(0)                              # a pure function of (seed, iteration)
    assert torch.equal(again.result.latents, s.result.latents)


def test_scores_and_advantages(trainer):
    s = trainer.rollout.run(0)
    scores = score_samples(trainer.parts.rewards, trainer.dist, s)
    assert scores.R.shape == (4, 1) and scores.names == ["shapes"]
    assert {"reward/shapes/mean", "detect/palette_distance", "detect/dark_frac"} <= set(scores.metrics)
    adv, metrics = trainer.advantages.run(scores.R, NoServices())
    assert adv.shape == (4,) and "adv/abs_mean" in metrics
    finite = torch.isfinite(adv)
    for g in (0, 1):                                            # group-centred (weighted sum, global std)
        a = adv[(s.group_ids == g) & finite]
        assert float(a.sum()) == pytest.approx(0.0, abs=1e-5)
    rows, row_adv = s.training_rows(adv)
    assert rows is s and torch.equal(row_adv, adv)


def test_train_batches_follow_the_objective_source(trainer):
    s = trainer.rollout.run(0)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    batches = trainer.updater.train_batches(s, adv, torch.tensor([1, 2]), torch.Generator().manual_seed(0))
    if trainer.cfg.objective.kind == "grpo":                   # one TrainBatch per stored step
        assert len(batches) == s.result.traj.x.shape[1]
        assert all(b.traj is not None and b.kernel is s.how.kernel for b in batches)
    else:                                                       # one per training σ (permuted, fraction 0.7 of 3)
        assert len(batches) == 2 and all(b.x0 is not None and b.sigma.shape == (2,) for b in batches)
    assert all(torch.equal(b.advantages, adv[[1, 2]]) for b in batches)


def test_update_steps_then_old_adapter_follows(trainer):
    s = trainer.rollout.run(0)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.5])
    keep = torch.tensor([True, True, True, False])             # a dropped sample is never trained on
    before = {k: v.clone() for k, v in trainer.policy.adapter_state_dict("train").items()}
    stats = trainer.updater.run(s, adv, keep, 0, 0)
    assert stats.steps == trainer.cfg.train.updates_per_epoch and stats.skipped_steps == 0
    after = trainer.policy.adapter_state_dict("train")
    assert any(not torch.equal(before[k], after[k]) for k in before)
    eta = trainer.parts.objective.old_decay(trainer.parts.objective_cfg, stats.steps)
    assert eta == (0.0 if trainer.cfg.objective.kind == "grpo" else pytest.approx(0.001 * stats.steps))


def test_gram_rows_give_every_applicable_reward_a_sample():
    from flowrl.training.update import gram_rows

    nan = float("nan")
    A = torch.tensor([[1.0, nan, nan], [2.0, nan, nan], [3.0, nan, nan], [nan, 1.0, nan], [nan, nan, nan],
                      [nan, nan, 4.0]])
    assert gram_rows(A, 2).tolist() == [0, 3, 5]          # one row per reward even beyond the micro-batch
    assert gram_rows(A, 4).tolist() == [0, 1, 3, 5]
    assert gram_rows(A[:, :1], 2).tolist() == [0, 1]      # one reward: the first rows, as before
