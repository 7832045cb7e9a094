"""GARDO's parts against the released script written out by hand (flow_grpo train_sd3_gardo.py, stat_tracking.py
type='gardo'): rank-based uncertainty, percentile gate, RiskCompensator, nearest-neighbour diversity advantages,
the gated mean and the refresh rule; and a third LoRA weight set ("ref") on a real toy policy."""
import numpy as np
import pytest
import torch

from flowrl.objectives import gardo

CFG = gardo.Config()


def test_win_rates_with_ties():
    torch.testing.assert_close(gardo.win_rates(torch.tensor([1.0, 3.0, 3.0, 0.0])),
                               torch.tensor([1 / 3, 2.5 / 3, 2.5 / 3, 0.0], dtype=torch.float64))
    with pytest.raises(ValueError, match="at least 2"):
        gardo.win_rates(torch.tensor([1.0]))


def released_uncertainty(proxy, aux):
    """The script: ranks by descending sort (1 = highest), rank(main) − mean rank(aux)."""
    def ranks(x):
        idx = torch.sort(x, descending=True).indices
        r = torch.empty_like(x).long()
        r[idx] = torch.arange(1, len(x) + 1)
        return r.float()
    return ranks(proxy) - torch.stack([ranks(aux[:, k]) for k in range(aux.shape[1])]).mean(0)


def test_uncertainty_is_the_scripts_rank_difference_over_n_minus_1():
    g = torch.Generator().manual_seed(0)
    proxy, aux = torch.randn(12, generator=g), torch.randn(12, 2, generator=g)
    u = gardo.uncertainty(proxy, aux)
    torch.testing.assert_close(u * 11, released_uncertainty(proxy, aux).double())
    with pytest.raises(ValueError, match="auxiliary"):
        gardo.uncertainty(proxy, aux[:5])


def test_gate_is_the_scripts_percentile_of_the_non_negative():
    u = torch.tensor([-0.5, 0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, -0.2])
    gate = gardo.uncertainty_gate(u, 0.1)
    q = np.percentile([p for p in u.tolist() if p >= 0], 100 - 0.1 * 100)
    assert gate.tolist() == (u > q).tolist() and gate.sum() == 1
    assert not gardo.uncertainty_gate(-u.abs() - 1, 0.1).any()


def test_risk_compensator():
    f, hist = gardo.adapt_fraction(0.1, 0.5, [], CFG)
    assert f == pytest.approx(0.1) and hist == [0.5]
    f, hist = gardo.adapt_fraction(f, 0.6, hist, CFG)        # above every remembered mean: regularise more
    assert f == pytest.approx(0.11)
    f, hist = gardo.adapt_fraction(f, 0.4, hist, CFG)        # below every remembered mean: less
    assert f == pytest.approx(0.099)
    f, _ = gardo.adapt_fraction(0.19, 9.0, hist, CFG)
    assert f == pytest.approx(0.2)                           # clipped to fraction_max
    _, long = gardo.adapt_fraction(0.1, 1.0, list(range(25)), CFG)
    assert len(long) == 20 and long[-1] == 1.0


def released_advantages(prompts, rewards, dists):
    """stat_tracking.update(type='gardo') for one reward column, numpy as released."""
    dists = dists / np.linalg.norm(dists, ord=2, axis=1, keepdims=True)
    adv = np.zeros_like(rewards)
    for p in np.unique(prompts):
        pr, pd = rewards[prompts == p], dists[prompts == p]
        mean = pr.mean()
        dm = 1 - np.dot(pd, pd.T).clip(-1, 1)
        nn = np.array([np.min(dm[i, np.arange(len(dm)) != i]) for i in range(len(dm))])
        w = np.where(pr - mean < 0, np.ones_like(nn), nn / np.mean(nn))
        adv[prompts == p] = (pr - mean) * w
    return adv


def test_diversity_advantages_match_the_released_tracker():
    g = torch.Generator().manual_seed(1)
    groups = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    r, feats = torch.randn(8, generator=g), torch.randn(8, 5, generator=g)
    got = gardo.diversity_advantages(r, groups, feats)
    want = released_advantages(groups.numpy(), r.double().numpy(), feats.double().numpy())
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-10, atol=1e-12)
    assert (got[r.double() < torch.stack([r[:4].mean()] * 4 + [r[4:].mean()] * 4)] < 0).all()


def test_nearest_neighbour_distance_by_hand():
    feats = torch.tensor([[1.0, 0.0], [0.0, 2.0], [1.0, 1.0], [5.0, 5.0]])
    d = gardo.nearest_neighbour_distance(feats, torch.tensor([0, 0, 0, 1]))
    c = 1 - 1 / 2 ** 0.5
    torch.testing.assert_close(d, torch.tensor([c, c, c, 1.0], dtype=torch.float64))


def test_gated_mean_and_refresh_rule():
    kl = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert gardo.gated_mean(kl, torch.tensor([False, True, False, True])).item() == pytest.approx(3.0)
    assert gardo.gated_mean(kl, torch.zeros(4, dtype=torch.bool)).item() == 0.0
    assert gardo.should_refresh(1e-3, 1, CFG) and gardo.should_refresh(0.0, 101, CFG)
    assert not gardo.should_refresh(1e-4, 100, CFG)
    with pytest.raises(ValueError, match="fraction"):
        gardo.Config(fraction=0.5)


def test_a_third_lora_weight_set_serves_as_refreshable_reference():
    from flowrl.policies.lora import SD3_TARGETS, LoraConfig
    from flowrl.policies.toy import Config, ToyPolicy

    pol = ToyPolicy.tiny(seed=0, config=Config(lora=LoraConfig(rank=2, alpha=4, target_modules=SD3_TARGETS,
                                                              names=("train", "old", "ref"))))
    assert pol.weights.names() == ["train", "old", "ref", None]
    with torch.no_grad():
        for p in pol.trainable_parameters():
            p.add_(0.1)
    cond = pol.encode(["a red circle"], None, cfg=False)
    x = pol.noise([torch.Generator().manual_seed(0)], 32, 32, None)
    sigma = torch.full((1,), 0.5)

    def v(name):
        with torch.no_grad(), pol.adapter(name):
            return pol.velocity(x, sigma, cond, 1.0)

    assert torch.equal(v("ref"), v(None)) and not torch.equal(v("train"), v("ref"))
    pol.copy_adapter("train", "ref")                          # GARDO's refresh, ref ← θ
    assert torch.equal(v("ref"), v("train"))
    assert all(not p.requires_grad for p in pol.weights.parameters("ref"))


# ---- in the loop ----------------------------------------------------------------------------------------------
def _context(R, weights, images, state=None):
    from flowrl.objectives.context import AdvantageContext

    return AdvantageContext(R, weights, [f"r{k}" for k in range(R.shape[1])], lambda: images, state or {})


def test_prepare_advantages_gates_and_reshapes_from_the_loops_context():
    from flowrl.objectives.gardo import GATE, image_features, prepare_advantages, proxy_and_auxiliary

    g = torch.Generator().manual_seed(0)
    R = torch.rand(8, 3, generator=g)
    weights = torch.tensor([1.0, 0.5, 0.0])                      # two trained rewards, one auxiliary
    images = torch.rand(8, 3, 16, 16, generator=g)
    groups = torch.arange(2).repeat_interleave(4)
    ctx = _context(R, weights, images)
    adv = prepare_advantages(torch.zeros(8), groups, gardo.Config(), ctx)
    r, aux = proxy_and_auxiliary(R, weights)
    torch.testing.assert_close(r, R[:, 0] + 0.5 * R[:, 1])
    want_gate = gardo.uncertainty_gate(gardo.uncertainty(r, aux), 0.1)
    assert torch.equal(ctx.extras[GATE].bool(), want_gate)
    want = gardo.diversity_advantages(r, groups, image_features(images)).float()
    torch.testing.assert_close(adv, want)
    assert "fraction" in ctx.state and len(ctx.state["history"]) == 1
    with pytest.raises(ValueError, match="weight 0"):
        prepare_advantages(torch.zeros(8), groups, gardo.Config(), _context(R, torch.ones(3), images))


def test_gardo_trains_refreshes_its_reference_and_resumes_it(tmp_path):
    from flowrl.checkpoint import latest_checkpoint, load_checkpoint
    from flowrl.config import load_config
    from flowrl.training.trainer import Trainer

    ov = ["policy.kind=toy", "policy.tiny=true", "sampler.kernel.kind=flow_sde", "sampler.steps=3",
          "sampler.eval_steps=2", "sampler.height=32", "sampler.width=32", "sampler.guidance=1.0",
          "train.iterations=2", "train.prompts_per_iter=2", "train.group_size=4", "train.micro_batch=4",
          "train.updates_per_epoch=2", "eval.before=false", "eval.after=false", f"run.output_dir={tmp_path}",
          "run.name=run", "log.progress=false", "checkpoint.every=1",
          "objective.kind=gardo", "objective.reset_every=1", "objective.beta_kl=0.04",
        "policy.lora={rank: 2, alpha: 4, names: [train, old, ref]}", "rewards={shapes: 1.0, shapes_clean: 0.0}"]
    t = Trainer(load_config(None, ov))
    out = t.run()
    assert out["state"]["global_step"] > 0
    st = t.parts.objective_state
    assert st["refreshes"] >= 1 and "fraction" in st
    train, ref = t.policy.adapter_state_dict("train"), t.policy.adapter_state_dict("ref")
    assert all(torch.equal(train[k], ref[k]) for k in train)          # refreshed after the last iteration
    tensors, _ = load_checkpoint(latest_checkpoint(tmp_path / "run"))
    assert set(tensors) >= {"train", "old", "ref"}
    with pytest.raises(ValueError, match="ref"):
        Trainer(load_config(None, ov[:-2] + ["rewards={shapes: 1.0, shapes_clean: 0.0}",
                                             "run.name=noref"])).run()
