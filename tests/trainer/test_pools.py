"""Candidate pools in the training loop (``sampler.pool``): a scout's score does not depend on its batch
companions, the kept candidates are the selector's choice on the scout scores and are the flat rollouts of
their seeds (a resumed x̂0-exit candidate bit for bit), N = K is the plain recipe bit for bit, the fidelity
metrics are select.py's, the recipes run on the tiny toy and SD3 policies, and a pool run resumes bitwise."""
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from conftest import toy_overrides
from test_resume import assert_bitwise, final_state

from flowrl.config import ConfigError, load_config, load_resolved
from flowrl.pools.scouts import Candidates
from flowrl.pools.stage import PoolStage, fidelity_metrics
from flowrl.training.trainer import Trainer
from samplers.rng import sample_generator
from samplers.select import select

REPO = Path(__file__).resolve().parents[2]
SCOUTS = {"x0_exit": "{kind: x0_exit, fraction: 0.4}", "full": "{kind: full}",
          "steps": "{kind: steps, steps: 2}",
          "fp4": "{kind: fp4, fmt: nvfp4, steps: 2, min_dim: 0, skip: []}"}
VARIED = ["rewards={jpeg_compressibility: 1.0}"]       # a reward that varies on the tiny model's images


def pool_trainer(tmp_path, objective="nft", scout="x0_exit", extra=(), candidates=4):
    pool = f"sampler.pool={{candidates: {candidates}, scout: {SCOUTS[scout]}}}"
    ov = toy_overrides(tmp_path, objective) + ["sampler.steps=4", *VARIED, pool]
    return Trainer(load_config(None, ov + list(extra)))


def cands(t, prompt_ids, n, size=None):
    """Candidates of prompts ``prompt_ids`` in iteration 0's batch of ``size`` prompts (None: the run's)."""
    items = t.parts.train_prompts.batch(0, size or t.cfg.train.prompts_per_iter)
    return Candidates([items[p][0] for p in prompt_ids], [dict(items[p][1]) for p in prompt_ids],
                      list(prompt_ids), n, t.cfg.run.seed, 0)


@pytest.mark.parametrize("scout", sorted(SCOUTS))
def test_a_scout_score_does_not_depend_on_its_batch_companions(tmp_path, scout):
    t = pool_trainer(tmp_path, scout=scout, extra=["train.micro_batch=4", "sampler.chunk=4",
                                                   "train.updates_per_epoch=1"])
    ctx, sc = t.rollout.strategy.context, t.rollout.strategy.scout
    with torch.no_grad():
        a = sc.score(ctx, cands(t, [0, 1], 2, 3), 0).scores     # one chunk of 4 rows: candidates of 0 and 1
        b = sc.score(ctx, cands(t, [0, 1], 2, 3), 0).scores
        c = sc.score(ctx, cands(t, [0, 2], 2, 3), 0).scores     # same shape, other companions
    assert torch.equal(a, b) and torch.equal(a[0], c[0])
    assert not torch.equal(a[0], c[1])                          # the scores do vary (not a vacuous check)


@pytest.mark.parametrize("objective", ["nft", "grpo"])
@pytest.mark.parametrize("scout", ["x0_exit", "full", "steps"])
def test_kept_candidates_are_the_flat_rollouts_of_the_selected_seeds(tmp_path, objective, scout):
    # chunk 1: every model call sees one row, so "bit for bit" holds whatever the batch composition
    t = pool_trainer(tmp_path, objective, scout, ["train.micro_batch=1", "sampler.chunk=1",
                                                  "train.updates_per_epoch=1"], 5)
    stage, n, K = t.rollout, 5, t.cfg.train.group_size
    s = stage.run(0)
    with torch.no_grad():
        scores = stage.strategy.scout.score(stage.strategy.context, cands(t, [0, 1], n), 0).scores
    kept = select(scores, K, "best_worst")
    assert s.group_ids.tolist() == [0] * K + [1] * K
    pairs = [(p, int(j)) for p in (0, 1) for j in kept[p]]
    for r, (p, j) in enumerate(pairs):
        with torch.no_grad():
            alone = stage.engine.sample([s.prompts[r]], [sample_generator(t.cfg.run.seed, 0, p, j)],
                                        stage.plan(0)).result
        assert torch.equal(alone.latents[0], s.result.latents[r])
        if objective == "grpo":                                 # the stored SDE steps, bit for bit
            assert torch.equal(alone.traj.x_next[0], s.result.traj.x_next[r])
            assert torch.equal(alone.traj.log_prob[0], s.result.traj.log_prob[r])
    calls, k = 4, round(0.4 * 4)
    scout_nfe = {"x0_exit": 2 * n * (k + 1), "full": 2 * n * calls, "steps": 2 * n * 2}[scout]
    regen = {"x0_exit": 2 * K * (calls - k - 1), "full": 0, "steps": 2 * K * calls}[scout]
    assert s.metrics["pool/scout_forwards"] == scout_nfe and s.metrics["pool/regen_forwards"] == regen
    assert s.rollout_nfe == scout_nfe + regen


@pytest.mark.parametrize("objective, scout", [("nft", "x0_exit"), ("grpo", "x0_exit"), ("nft", "steps"),
                                              ("grpo", "fp4")])
def test_n_equal_k_is_the_plain_recipe_bitwise(tmp_path, objective, scout):
    base = toy_overrides(tmp_path, objective) + ["sampler.steps=4", *VARIED, "eval.before=false",
                                                 "eval.after=false"]
    plain = Trainer(load_config(None, base + ["run.name=plain"]))
    plain.run()
    extra = ["eval.before=false", "eval.after=false", "run.name=pool"]
    pooled = pool_trainer(tmp_path, objective, scout, extra, candidates=2)
    pooled.run()
    assert_bitwise(final_state(plain), final_state(pooled))
    moved = plain.policy.adapter_state_dict("train")
    assert any(v.abs().sum() > 0 for k, v in moved.items() if "lora_B" in k)   # training did move the weights


def test_fidelity_metrics_are_select_pys():
    scout = torch.tensor([[0.1, 0.5, 0.9, 0.3], [1.0, 2.0, 3.0, 4.0]])
    same = fidelity_metrics(scout, scout.clone())
    assert same["pool/kendall_tau"] == pytest.approx(1.0) and same["pool/contrast"] == pytest.approx(1.0)
    assert same["pool/top_hit"] == same["pool/bottom_hit"] == 1.0
    rev = fidelity_metrics(scout, -scout)
    assert rev["pool/kendall_tau"] == pytest.approx(-1.0) and rev["pool/contrast"] == pytest.approx(-1.0)
    assert rev["pool/top_hit"] == rev["pool/bottom_hit"] == 0.0
    assert same["pool/kept_reward_std"] == pytest.approx(float(scout.std(dim=1, unbiased=False).mean()))


def test_fp4_scout_refreshes_from_the_old_adapter(tmp_path):
    t = pool_trainer(tmp_path, scout="fp4")
    sc, ctx = t.rollout.strategy.scout, t.rollout.strategy.context
    with torch.no_grad():
        before = sc.score(ctx, cands(t, [0], 4), 0)
        for p in t.policy.adapter_parameters("old"):
            p.add_(0.05 * torch.randn_like(p))
        after = sc.score(ctx, cands(t, [0], 4), 0)
    assert before.metrics["pool/scout_refresh_s"] >= 0 and not torch.equal(before.scores, after.scores)


@pytest.mark.parametrize("bad, message", [
    (["sampler.pool={candidates: 1}"], "must be >= train.group_size"),
    (["sampler.pool={select: best}"], "pool.select must be one of"),
    (["sampler.pool={scout: {kind: x0_exit, fraction: 1.0}}"], "fraction must lie in"),
    (["sampler.tree={preset: branchgrpo}", "sampler.pool={candidates: 4}"], "cannot be combined"),
])
def test_clear_errors(tmp_path, bad, message):
    with pytest.raises((ValueError, ConfigError), match=message):
        Trainer(load_config(None, toy_overrides(tmp_path, "grpo") + bad))


def test_a_pool_without_the_reward_set_says_so(tmp_path):
    pool = pool_trainer(tmp_path).rollout.strategy
    with pytest.raises(ValueError, match="rewards=parts.rewards"):
        PoolStage(pool.engine, pool.cfg, pool.layout, pool.context.plan, None)


def recipe_overrides(tmp_path):
    return [f"run.output_dir={tmp_path}", "run.name=run", 'run.mixed_precision="no"', "policy.tiny=true",
            "train.iterations=1", "train.prompts_per_iter=2", "eval.before=false", "eval.after=false",
            "log.progress=false", "checkpoint.every=0", "sampler.height=32", "sampler.width=32",
            "sampler.pool.candidates=10", "train.micro_batch=4", "sampler.chunk=4", *VARIED, "eval.held_out=[]"]


@pytest.mark.parametrize("recipe", ["configs/toy/pools/pool_nft.yaml", "configs/toy/pools/naive_nft.yaml",
                                    "configs/sd35/sol_rl_pickscore.yaml"])
def test_pool_recipes_run(tmp_path, recipe):
    ov = recipe_overrides(tmp_path)
    if "sd35" in recipe:       # the tiny SD3 has no layer above Sol-RL's min_dim 2432
        ov += ["policy.max_sequence_length=8", "sampler.pool.scout.min_dim=0", "train.group_size=8",
               "sampler.height=16", "sampler.width=16", "sampler.steps=4",   # 256 latent tokens, 4 steps
               "train.updates_per_epoch=1", "policy.lora={rank: 2, alpha: 4, target_modules: [to_q, to_v]}"]
    t = Trainer(load_config(REPO / recipe, ov))
    start = {k: v.clone() for k, v in t.policy.adapter_state_dict("train").items()}
    out = t.run()
    assert out["state"]["iteration"] == 1 and out["state"]["skipped_updates"] == 0
    assert any(not torch.equal(v, t.policy.adapter_state_dict("train")[k]) for k, v in start.items())
    s = t.rollout.run(0)
    assert out["state"]["rollout_nfe"] == s.rollout_nfe == s.metrics["rollout/forwards"]
    assert 0 < s.metrics["pool/scout_nfe_share"] <= 1


def test_kill_and_resume_a_pool_run_is_bitwise_identical(tmp_path):
    scout = SCOUTS["x0_exit"]
    base = toy_overrides(tmp_path, "nft", iterations=3) + ["sampler.steps=4", *VARIED, "eval.before=false",
                                                          "eval.after=false",
                                                          f"sampler.pool={{candidates: 4, scout: {scout}}}"]

    def run(cfg):
        t = Trainer(cfg)
        t.run()
        return t

    full = run(load_config(None, base + ["run.name=full"]))
    run(load_config(None, base + ["run.name=cut", "train.iterations=2"]))
    resumed = run(load_resolved(tmp_path / "cut", ["run.resume=true", "train.iterations=3"]))
    assert resumed.state.rollout_nfe == full.state.rollout_nfe
    assert_bitwise(final_state(full), final_state(resumed))
