"""Throughput levers (issue 34): asynchronous rewards equal the synchronous run bit for bit; lossy rollout
accelerators are refused under ratio-based objectives without rollout correction, and corrected with the
published TIS / RS formulas; compiled forwards match eager."""
import math
import shutil
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from conftest import toy_overrides

from flowrl.config import ConfigError, load_config
from flowrl.objectives import rollout_correction as rc
from flowrl.training.trainer import Trainer

QUIET = ["eval.before=false", "eval.after=false", "checkpoint.every=0"]


def boom(batch):
    """A reward that fails (the error must name it)."""
    raise RuntimeError("scorer crashed")


def weights(trainer):
    return {k: v.clone() for k, v in trainer.policy.adapter_state_dict("train").items()}


def test_async_rewards_equal_the_synchronous_run_bitwise(tmp_path):
    runs = {}
    for mode in ("false", "true"):
        t = Trainer(load_config(None, toy_overrides(tmp_path, name=f"a{mode}") + QUIET
                                + [f"train.async_rewards={mode}"]))
        metrics = [t.iteration(it) for it in range(2)]
        runs[mode] = (weights(t), [m["reward/total/mean"] for m in metrics])
    (w_sync, r_sync), (w_async, r_async) = runs["false"], runs["true"]
    assert r_sync == r_async
    assert w_sync.keys() == w_async.keys() and all(torch.equal(w_sync[k], w_async[k]) for k in w_sync)


def test_async_reward_failure_names_the_reward(tmp_path):
    ov = toy_overrides(tmp_path) + QUIET + ["train.async_rewards=true",
                                            f"rewards={{boom: {{reward: '{__file__}:boom', weight: 1.0}}}}"]
    t = Trainer(load_config(None, ov))
    with pytest.raises(Exception, match="reward 'boom' raised RuntimeError: scorer crashed"):
        t.iteration(0)


@pytest.mark.parametrize("objective,accel,extra,ok", [
    ("grpo", "cache", [], False),                                        # ratio-based, no correction
    ("grpo", "cache", ["sampler.correction={is_threshold: 2.0}"], True),
    ("dppo", "cache", ["sampler.correction={is_threshold: 2.0}"], False),  # ratio-based, applies none
    ("nft", "cache", [], True),                                          # decoupled: no ratio
    ("nft", "cache", ["sampler.correction={is_threshold: 2.0}"], False),   # correction would do nothing
    ("grpo", "exact", ["sampler.correction={is_threshold: 2.0}"], False),
    ("grpo", "cache", ["sampler.accelerate={kind: cache, fresh_sde: true}"], True),   # stored steps exact
    ("grpo", "cache", ["sampler.accelerate={kind: cache, fresh_sde: true}",           # nothing to correct
                       "sampler.correction={is_threshold: 2.0}"], False),
])
def test_lossy_rollouts_need_correction_under_ratio_objectives(tmp_path, objective, accel, extra, ok):
    kernel = "ode" if objective == "nft" else "flow_sde"
    ov = [f"objective.kind={objective}", f"sampler.kernel.kind={kernel}", f"sampler.accelerate.kind={accel}",
          *extra]
    if ok:
        load_config(None, ov)
        return
    with pytest.raises(ConfigError) as e:
        load_config(None, ov)
    assert "\n" not in str(e.value) and (objective in str(e.value) or accel in str(e.value))


def test_correction_formulas():
    zero = torch.zeros(3, 2)
    w, m = rc.correction_weights(zero, zero, rc.RolloutCorrection(rs="seq_mean_k1", rs_threshold="0.5_2.0"))
    assert torch.equal(w, torch.ones(3, 2))                            # identity: λ = 0
    assert m["rollout_corr/kl"] == 0 and m["rollout_corr/k3_kl"] == 0 and m["rollout_corr/chi2_token"] == 0
    assert m["rollout_corr/eff_sample_size"] == pytest.approx(1.0) and m["rollout_corr/rs_masked_fraction"] == 0
    lam = torch.full((1, 1), math.log(3.0))                            # TIS vs IcePop at U = 2
    assert rc.is_weights(lam, "token", 2.0)[0].item() == pytest.approx(2.0)
    assert rc.is_weights(lam, "token", "0.5_2")[0].item() == 0.0
    keep = rc.rs_keep(torch.tensor([[-0.6, -0.6], [-0.8, -0.8]]), "seq_mean_k1", "0.5_2.0")   # the k1 band
    assert keep.tolist() == [[1.0, 1.0], [0.0, 0.0]]
    lam = torch.tensor([[0.1, -0.3], [0.5, 0.4]])                      # sequence level: exp Σ_j λ, capped at 2
    w, raw = rc.is_weights(lam, "sequence", 2.0)
    assert torch.allclose(raw[:, 0], lam.sum(1).exp()) and torch.allclose(w[:, 1], lam.sum(1).exp().clamp(max=2))
    m = rc.drift_metrics(lam, w, raw, torch.ones_like(lam))
    assert m["rollout_corr/k3_kl"] == pytest.approx(float((lam.exp() - lam - 1).mean()))
    assert m["rollout_corr/chi2_seq"] == pytest.approx(float((2 * lam.sum(1)).exp().mean() - 1))
    assert m["rollout_corr/is_clipped_fraction"] == 0.5
    with pytest.raises(ValueError, match="unknown mode"):
        rc.RolloutCorrection(rs="seq_k9", rs_threshold=2.0)


def test_corrected_cache_rollout_stores_exact_log_probs_and_weights(tmp_path):
    from flowrl.accelerators import exact_log_probs

    base = toy_overrides(tmp_path) + QUIET
    exact = Trainer(load_config(None, base + ["run.name=exact"]))
    s = exact.rollout.run(0)                                           # identity: the recompute is the rollout
    assert torch.equal(exact_log_probs(exact.rollout.engine, s.cond, s.result.traj), s.result.traj.log_prob)
    t = Trainer(load_config(None, base + ["run.name=cache", "sampler.accelerate={kind: cache, every: 2}",
                                          "sampler.correction={is_threshold: 2.0}"]))
    s = t.rollout.run(0)
    traj = s.result.traj
    assert s.metrics["rollout/forwards"] == 4 * 2 + 4 * traj.x.shape[1]   # ⌈3 calls / 2⌉ + the recompute
    assert not torch.equal(traj.log_prob, traj.rollout_log_prob)
    w, _ = rc.correction_weights(traj.log_prob, traj.rollout_log_prob, t.rollout.correction)
    assert torch.equal(traj.is_weight, w)
    metrics = t.iteration(0)
    assert metrics["rollout_corr/log_ratio_abs_mean"] > 0 and "rollout_corr/rs_seq_masked_fraction" in metrics


def test_cache_with_fresh_sde_steps_stores_the_exact_policys_transitions(tmp_path):
    from flowrl.accelerators import VelocityCache, exact_log_probs

    base = toy_overrides(tmp_path) + QUIET + ["sampler.window={kind: all, skip_last: true}"]
    exact = Trainer(load_config(None, base + ["run.name=exact"])).rollout.run(0)
    t = Trainer(load_config(None, base + ["run.name=fresh", "sampler.accelerate={kind: cache, fresh_sde: true}"]))
    s = t.rollout.run(0)
    sde = t.rollout.engine.stochastic_calls(t.rollout.plan(0))
    assert sde == [True, True, False]                       # 3 steps, the last one ODE (skip_last)
    assert s.metrics["rollout/forwards"] == 4 * 2           # the ODE call reuses the last SDE step's velocity
    assert torch.equal(exact_log_probs(t.rollout.engine, s.cond, s.result.traj), s.result.traj.log_prob)
    assert torch.equal(s.result.traj.x, exact.result.traj.x)                  # the same SDE steps ...
    assert not torch.equal(s.result.latents, exact.result.latents)           # ... then the cached ODE step
    assert t.rollout.accelerator.fresh_calls([False] * 5) == [True, False, True, False, True]   # i % 2 = 0
    sde = [False, True, False, False, True, False]
    assert t.rollout.accelerator.fresh_calls(sde) == [True, True, False, True, True, False]
    warm = VelocityCache(every=2, fresh_first=3)                       # 3 fresh, then every other call
    assert warm.fresh_calls([False] * 7) == [True, True, True, False, True, False, True]
    with pytest.raises(ValueError, match="fresh_first"):
        VelocityCache(fresh_first=-1)


def test_grpo_loss_scales_with_the_correction_weight(tmp_path):
    from flowrl.objectives import grpo
    from flowrl.objectives.batch import TrainBatch

    t = Trainer(load_config(None, toy_overrides(tmp_path) + QUIET))
    s = t.rollout.run(0)
    traj, adv = s.result.traj, torch.tensor([1.0, -1.0, 0.5, -0.5])

    def policy_loss(traj):
        b = TrainBatch(s.cond, adv, traj=traj, steps=[0], guidance=s.how.guidance, kernel=s.how.kernel,
                       kernel_cfg=s.how.kernel_cfg, reduce=s.how.reduce)
        return grpo.loss(t.policy, b, grpo.Config(beta_kl=0.0)).metrics["policy_loss"]

    plain = policy_loss(traj)
    traj.is_weight = torch.full_like(traj.log_prob, 2.0)
    assert torch.allclose(policy_loss(traj), 2 * plain)


@pytest.mark.slow                                  # inductor's first compile takes ~40 s on a shared CPU
def test_compiled_velocity_matches_eager(tmp_path):
    if shutil.which("c++") is None and shutil.which("g++") is None:
        pytest.skip("no C++ compiler: inductor cannot compile on this machine")
    from flowrl.policies.toy import ToyPolicy
    from flowrl.training.parts import compile_policy

    policy = ToyPolicy.tiny(seed=0)
    cond = policy.encode(["a red circle"], None, cfg=False)
    x, sigma = torch.randn(1, *policy.latent_shape(32, 32), generator=torch.Generator().manual_seed(0)), \
        torch.tensor([0.7])
    with torch.no_grad():
        eager = policy.velocity(x, sigma, cond, 1.0)
        compile_policy(policy, type("O", (), {"ratio_based": False})(), None)
        try:
            compiled = policy.velocity(x, sigma, cond, 1.0)
        except Exception as e:                                          # inductor unavailable here
            pytest.skip(f"torch.compile failed on this machine: {type(e).__name__}: {str(e)[:120]}")
    assert (compiled - eager).abs().max().item() <= 1e-5


def test_async_rewards_refused_for_an_offline_objective():
    """Offline DPO trains on its dataset without rewards: async scoring has nothing to overlap."""
    with pytest.raises(ConfigError) as e:
        recipe = Path(__file__).resolve().parents[2] / "configs/toy/dpo_offline.yaml"
        load_config(str(recipe), ["train.async_rewards=true"])
    assert "\n" not in str(e.value) and "train.async_rewards" in str(e.value) and "dpo" in str(e.value)
