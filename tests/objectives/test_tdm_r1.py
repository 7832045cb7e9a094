"""TDM-R1 (flowrl/objectives/tdm_r1.py): each formula against its closed form, its limits, an independent loop
re-derivation of Flow-Factory's definitions, the deterministic path the source trains on, and tiny trainer runs."""
import math

import pytest
import torch

from flowrl.objectives import get_objective
from flowrl.objectives import tdm_r1 as T
from flowrl.objectives.batch import TrainBatch
from tests.objectives.objectives_fakes import make_cond


def _x(b=3, seed=0, shape=(2, 4, 4)):
    return torch.randn(b, *shape, generator=torch.Generator().manual_seed(seed))


def test_registered_with_its_source_and_hooks():
    spec = get_objective("tdm_r1", T.Config())
    assert spec.TRAINS_ON is T.TRAINS_ON and spec.TRAINS_ON.stores_trajectory and spec.TRAINS_ON.together == "group"
    assert spec.end_iteration is T.end_iteration and spec.prepare_advantages is T.prepare_advantages
    c = T.Config()
    assert (c.tdm_weight, c.cfg_reward_scale, c.surrogate_clip_range, c.surrogate_reference_threshold) == \
        (0.3, 3.5, 1e-3, 0.05)


@pytest.mark.parametrize("bad", [{"tdm_weight": 1.5}, {"ttur_fake_updates": -1}, {"slow_decay_max": 1.0},
                                 {"importance_clip": 0.0}])
def test_bad_settings_are_one_line_errors(bad):
    with pytest.raises(ValueError, match="tdm_r1"):
        T.Config(**bad)


def test_renoise_is_a_times_the_stage_state_plus_beta_z():
    x0, eps, z = _x(seed=1), _x(seed=2), _x(seed=3)
    sm, st = torch.tensor([0.2, 0.0, 0.5]), torch.tensor([0.6, 0.3, 0.9])
    x_t, m, _ = T.conditional_renoise(x0, eps, sm, st, z, 20.0)
    a = ((1 - st) / (1 - sm)).view(-1, 1, 1, 1)
    beta = (st ** 2 - (a.flatten() * sm) ** 2).sqrt().view(-1, 1, 1, 1)
    x_mid = (1 - sm.view(-1, 1, 1, 1)) * x0 + sm.view(-1, 1, 1, 1) * eps
    torch.testing.assert_close(x_t, a * x_mid + beta * z)
    torch.testing.assert_close(x_t, (1 - st.view(-1, 1, 1, 1)) * x0 + st.view(-1, 1, 1, 1) * m)


def test_renoise_limit_and_unit_variance_and_guard():
    x0, eps, z = _x(seed=1).double(), _x(seed=2).double(), _x(seed=3).double()
    sm = torch.full((3,), 0.4, dtype=torch.float64)
    _, m, _ = T.conditional_renoise(x0, eps, sm, sm + 1e-12, z, 20.0)
    torch.testing.assert_close(m, eps, atol=1e-5, rtol=0)              # σ_t ↓ σ_mid: β → 0, m → ε̂
    big_eps, big_z = torch.randn(2, 20000), torch.randn(2, 20000)
    _, m, _ = T.conditional_renoise(torch.zeros(2, 20000), big_eps, torch.tensor([0.3, 0.1]),
                                    torch.tensor([0.7, 0.2]), big_z, 20.0)
    assert abs(float(m.var()) - 1.0) < 0.03
    want = torch.exp(-0.5 * (m ** 2).mean(1) + 0.5 * (big_z ** 2).mean(1))
    torch.testing.assert_close(T.conditional_renoise(torch.zeros(2, 20000), big_eps, torch.tensor([0.3, 0.1]),
                                                     torch.tensor([0.7, 0.2]), big_z, 20.0)[2], want)
    with pytest.raises(ValueError, match="sigma_mid < sigma_t"):
        T.conditional_renoise(x0, eps, sm, sm - 0.1, z, 20.0)


def test_importance_is_clipped_at_log_c():
    eps, z = torch.full((1, 8), 10.0), torch.zeros(1, 8)
    _, _, imp = T.conditional_renoise(torch.zeros(1, 8), eps, torch.tensor([0.5]), torch.tensor([0.6]), z, 20.0)
    torch.testing.assert_close(imp, torch.tensor([1 / 20.0]))


def test_fake_loss_snr_weight_closed_form():
    fake, gen = torch.ones(2, 4), torch.zeros(2, 4)
    one = torch.ones(2)
    assert float(T.fake_loss(fake, gen, torch.tensor([0.5, 0.5]), one, 5.0)) == pytest.approx(1.0)   # SNR 1
    assert float(T.fake_loss(fake, gen, torch.tensor([0.1, 0.1]), one, 5.0)) == pytest.approx(5.0)   # 81 → 5
    assert float(T.fake_loss(fake, gen, torch.tensor([0.5, 0.5]), torch.tensor([2.0, 0.0]), 5.0)) == \
        pytest.approx(1.0)


def test_revised_x0_gradient_is_minus_c_over_d_norm():
    x = _x(b=2, seed=4).requires_grad_(True)
    c, r = _x(b=2, seed=5), _x(b=2, seed=6)
    keep = torch.ones(2)
    T.revised_x0_loss(x, c, r, keep).backward()
    d = x[0].numel()
    norm = (x - r).abs().flatten(1).mean(1).detach().view(-1, 1, 1, 1)
    torch.testing.assert_close(x.grad, -c / (d * norm * 2))
    value = T.revised_x0_loss(x, c, r, keep)                          # ½ē(c²)/norm averaged over rows
    torch.testing.assert_close(value, (0.5 * (c ** 2).flatten(1).mean(1) / norm.flatten()).mean())
    x.grad = None
    T.revised_x0_loss(x, torch.zeros_like(c), r, keep).backward()
    assert torch.count_nonzero(x.grad) == 0                            # c = 0: no gradient (teacher == fake)


def test_revised_x0_huber_gradient_and_keep_mask():
    x = _x(b=2, seed=4).requires_grad_(True)
    c, r, kappa = _x(b=2, seed=5), _x(b=2, seed=6), 1e-3
    T.revised_x0_loss(x, c, r, torch.tensor([1.0, 0.0]), huber=kappa).backward()
    norm = (x[0] - r[0]).abs().mean().detach()
    torch.testing.assert_close(x.grad[0], -c[0] / torch.sqrt(c[0] ** 2 + kappa ** 2) / (x[0].numel() * norm))
    assert torch.count_nonzero(x.grad[1]) == 0


def _preference_by_loop(values, ref, adv, groups, beta):
    """Flow-Factory's legacy group preference, written out group by group."""
    total = 0.0
    for i in range(values.shape[0]):
        members = [j for j in range(values.shape[0]) if groups[j] == groups[i]]
        s = beta / len(members) * sum(float(adv[j]) * (float(values[j]) - float(ref[j])) for j in members)
        total = total + (1 / (1 + math.exp(-s))) * adv[i] * values[i]
    return total / values.shape[0]


def test_group_preference_equals_its_loop_rederivation_and_gradient():
    g = torch.Generator().manual_seed(7)
    values = torch.rand(6, generator=g).requires_grad_(True)
    ref, adv = torch.rand(6, generator=g), torch.randn(6, generator=g)
    groups = torch.tensor([3, 3, 3, 8, 8, 8])
    got = T.group_preference(values, ref, adv, groups, 2.0, torch.ones(6))
    torch.testing.assert_close(got, _preference_by_loop(values.detach(), ref, adv, groups, 2.0))
    got.backward()
    s = torch.stack([2.0 / 3 * (adv[groups == k] * (values.detach() - ref)[groups == k]).sum() for k in (3, 8)])
    w = torch.sigmoid(s).repeat_interleave(3)
    torch.testing.assert_close(values.grad, w * adv / 6)              # σ(s_g) is a detached weight
    assert float(T.group_preference(values.detach(), ref, torch.zeros(6), groups, 2.0, torch.ones(6))) == 0.0


def test_trust_clip_sides_follow_the_advantage():
    v = torch.tensor([1.0, 1.0, 1.0, 1.0], requires_grad=True)
    same, clipped = T.trust_clip(v, v.detach(), torch.tensor([1.0, -1.0, 1.0, -1.0]), 1e-3)
    assert not clipped.any() and same.requires_grad                   # surrogate == slow copy: ρ = 1
    slow = torch.tensor([1.1, 1.1, 0.9, 0.9])                          # ρ > 1 on rows 0, 1; ρ < 1 on rows 2, 3
    _, clipped = T.trust_clip(v, slow, torch.tensor([1.0, -1.0, 1.0, -1.0]), 1e-3)
    assert clipped.tolist() == [True, False, False, True]
    _, flipped = T.trust_clip(v, slow, torch.tensor([-1.0, 1.0, -1.0, 1.0]), 1e-3)
    assert flipped.tolist() == [False, True, True, False]
    out, _ = T.trust_clip(v, slow, torch.tensor([1.0, 1.0, 1.0, 1.0]), 1e-3)
    out.sum().backward()
    assert v.grad.tolist() == [0.0, 0.0, 1.0, 1.0]                     # clipped rows get no gradient


def test_runaway_clip_needs_both_the_move_and_the_distance():
    ref = torch.zeros(4)
    v = torch.tensor([-0.5, -0.1, 0.5, 0.5])
    _, clipped = T.runaway_clip(v, ref, torch.tensor([1.0, 1.0, 1.0, -1.0]), 0.05)
    assert clipped.tolist() == [True, False, False, True]


def test_time_weights_are_ffs_ramp():
    w = [T.time_weight(k, 4, True) for k in range(1, 5)]
    assert w == [0.5, 0.75, 1.0, 1.25] and sum(w) == pytest.approx((4 + 3) / 2)
    assert T.time_weight(2, 4, False) == 1.0
    c = T.Config()
    assert T.slow_decay(0, c) == pytest.approx(0.001) and T.slow_decay(10_000, c) == 0.3


def test_ode_rollout_stores_its_path_and_the_source_makes_one_unit_per_boundary():
    from samplers.rollout import rollout
    from samplers.schedule import flow_match_sigmas

    x1, grid = _x(b=2, seed=8), flow_match_sigmas(4)
    vf = lambda x, s: 0.5 * x + s.view(-1, 1, 1, 1)                   # noqa: E731
    res = rollout(vf, x1, grid, store=True)
    assert res.traj is None and res.path.shape == (2, 5, 2, 4, 4)
    torch.testing.assert_close(res.path[:, 0], x1)
    torch.testing.assert_close(res.path[:, -1], res.latents)
    s0, s1 = grid[0], grid[1]
    torch.testing.assert_close(res.path[:, 1], x1 + (s1 - s0) * vf(x1, s0.expand(2)))
    assert rollout(vf, x1, grid, store=False).path is None
    from flowrl.objectives.sources import Rollout

    ro = Rollout(make_cond(2, 3), res.select(torch.tensor([1, 0])), 1.0, None, None, "mean",
                 {"group": torch.tensor([0, 0])}, torch.tensor([5, 4]))
    units = T.TRAINS_ON.batches(ro, torch.tensor([1.0, -1.0]), torch.Generator().manual_seed(0), T.Config())
    assert [u.steps for u in units] == [[1], [2], [3], [4]]
    torch.testing.assert_close(units[0].path[0], res.path[1])
    with pytest.raises(ValueError, match="deterministic path"):
        T.TRAINS_ON.batches(Rollout(ro.cond, res.select(torch.tensor([0])).__class__(res.latents, grid), 1.0,
                                    None, None, "mean"), torch.ones(2), torch.Generator(), T.Config())


def test_source_refuses_a_stochastic_kernel():
    from samplers.kernel import resolve_kernel

    with pytest.raises(ValueError, match="sampler.kernel.kind=ode"):
        T.TRAINS_ON.check_kernel("tdm_r1", resolve_kernel("flow_sde"))
    T.TRAINS_ON.check_kernel("tdm_r1", resolve_kernel("ode"))


def _tiny_unit_batch(policy, k=2, steps=3, b=4):
    from samplers.rollout import rollout

    cond = policy.encode([f"a red circle {i}" for i in range(b)], None, cfg=False)
    x1 = policy.noise([torch.Generator().manual_seed(i) for i in range(b)], 32, 32)
    with torch.no_grad():
        res = rollout(lambda x, s: policy.velocity(x, s, cond, 1.0), x1, policy.sigmas(steps, x1), store=True)
    gens = [torch.Generator().manual_seed(10 + i) for i in range(b)]
    return TrainBatch(cond, torch.tensor([1.0, -1.0, 0.5, -0.5]), steps=[k], guidance=1.0, generator=gens,
                      extras={"group": torch.tensor([0, 0, 1, 1])}, path=res.path, grid=res.sigmas)


def _tiny_policy():
    from flowrl.policies.lora import LoraConfig
    from flowrl.policies.toy import Config, ToyPolicy

    lora = LoraConfig(rank=2, alpha=4, names=("train", "old", "fake", "surrogate", "slow"))
    torch.manual_seed(0)
    return ToyPolicy.tiny(0, Config(lora=lora))


def test_limits_zero_advantage_and_pure_tdm():
    zero = _tiny_unit_batch(_tiny_policy())
    zero.advantages = torch.zeros(4)
    out = T.loss(_tiny_policy(), zero, T.Config(ttur_fake_updates=0))
    assert float(out.metrics["surrogate_reward_loss"]) == 0.0       # A = 0: the surrogate stays the reference
    w = T.Config().tdm_weight
    torch.testing.assert_close(out.loss, out.metrics["tdm_loss"] + w * out.metrics["guidance_loss"])
    pure = T.loss(_tiny_policy(), _tiny_unit_batch(_tiny_policy()),
                  T.Config(tdm_weight=1.0, cfg_reward_scale=0.0, ttur_fake_updates=0))
    torch.testing.assert_close(pure.loss, pure.metrics["tdm_loss"])  # λ = 0, w = 1: the base TDM loss alone
    assert float(pure.metrics["guidance_loss"]) == 0.0 and float(pure.metrics["tdm_loss"]) > 0.0


def test_the_generator_gradient_flows_only_into_the_train_adapter():
    policy = _tiny_policy()
    out = T.loss(policy, _tiny_unit_batch(policy), T.Config(ttur_fake_updates=1))
    out.loss.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in policy.adapter_parameters("train"))
    for role in ("fake", "surrogate", "slow", "old"):
        assert all(p.grad is None for p in policy.adapter_parameters(role)), role


def test_loss_needs_the_role_adapters():
    from flowrl.policies.toy import ToyPolicy

    policy = ToyPolicy.tiny(0)
    with pytest.raises(ValueError, match="policy.lora.names"):
        T.loss(policy, _tiny_unit_batch(policy), T.Config())


def test_a_tiny_run_trains_every_role_and_checkpoints_them(tmp_path):
    from flowrl.checkpoint import latest_checkpoint, load_checkpoint
    from flowrl.config import load_config
    from flowrl.training.trainer import Trainer

    ov = ["policy.kind=toy", "policy.tiny=true", "sampler.kernel.kind=ode", "sampler.steps=2",
          "sampler.eval_steps=2", "sampler.height=32", "sampler.width=32", "sampler.guidance=1.0",
          "train.iterations=2", "train.prompts_per_iter=2", "train.group_size=2", "train.micro_batch=4",
          "eval.before=false", "eval.after=false", f"run.output_dir={tmp_path}", "run.name=run",
          "log.progress=false", "checkpoint.every=1", "objective.kind=tdm_r1", "objective.ttur_fake_updates=1",
          "policy.lora={rank: 2, alpha: 4, names: [train, old, fake, surrogate, slow]}", "rewards={shapes: 1.0}"]
    t = Trainer(load_config(None, ov))
    start = {r: t.policy.adapter_state_dict(r) for r in ("train", "fake", "surrogate", "slow")}
    out = t.run()
    assert out["state"]["global_step"] > 0 and t.parts.objective_state["iterations"] == 2
    for role, before in start.items():
        after = t.policy.adapter_state_dict(role)
        assert any(not torch.equal(before[k], after[k]) for k in before), f"{role} did not move"
    tensors, _ = load_checkpoint(latest_checkpoint(tmp_path / "run"))
    assert set(tensors) >= {"train", "old", "fake", "surrogate", "slow"}
    with pytest.raises(ValueError, match="kind=ode"):
        Trainer(load_config(None, [*ov[:2], "sampler.kernel.kind=flow_sde", *ov[3:5], "run.name=sde", *ov[5:]]))
