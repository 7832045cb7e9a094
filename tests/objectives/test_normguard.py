"""NormGuard: the shared velocity norm, the hinge and its gradient by hand, the wrapper equal to inner loss +
w·penalty around GRPO and NFT, and the inner objective's loop-facing parts passed through."""
import pytest
import torch
from objectives_fakes import KERNEL_PATH, LinearPolicy, make_cond, rollout

from flowrl.config.loader import ConfigError, from_dict
from flowrl.eval.velocity_norm import velocity_norm
from flowrl.objectives import TrainBatch, awr, get_objective, grpo, nft, normguard
from flowrl.objectives.inner import DeferredInnerSource, InnerSource
from flowrl.objectives.sources import FORWARD_PROCESS, TRAJECTORY_ROWS, Rollout
from flowrl.types import RolloutResult

B, D = 4, 6
gen = torch.Generator().manual_seed(0)
X0 = torch.randn(B, D, generator=gen)
EPS = torch.randn(B, D, generator=gen)
T = torch.tensor([0.9, 0.6, 0.35, 0.2])
ADV = torch.tensor([2.0, -1.0, 4.5, -3.0])
COND = make_cond(B, D, seed=1)


def config(inner: dict, **kw) -> normguard.Config:
    return from_dict(normguard.Config, {"inner": inner, **kw})


def test_velocity_norm_is_rms_over_elements():
    v = torch.tensor([[3.0, 4.0], [0.0, 0.0]]).view(2, 1, 2)
    torch.testing.assert_close(velocity_norm(v), torch.tensor([(12.5) ** 0.5, 0.0]))
    with pytest.raises(ValueError, match="velocity_norm"):
        velocity_norm(torch.ones(3))


@pytest.mark.parametrize("power", [1.0, 2.0])
def test_hinge_value_and_gradient(power):
    v = torch.tensor([[2.0, 0.0], [0.5, 0.5], [1.0, 1.0]], requires_grad=True)
    v_ref = torch.tensor([[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]])
    m = 0.1
    h = normguard.norm_hinge(v, v_ref, margin=m, power=power)
    n = v.detach().square().mean(1).sqrt()                  # (√2, 0.5, 1)
    gap = (n - 1.1).clamp(min=0)                             # only sample 0 exceeds (1 + m)·‖v_ref‖ = 1.1
    torch.testing.assert_close(h, gap ** power)
    h.sum().backward()
    dn_dv = v.detach() / (2 * n[:, None])                    # ∂ sqrt(mean v²)/∂v = v / (D·‖v‖), D = 2
    want = (power * gap ** (power - 1))[:, None] * dn_dv * (gap > 0)[:, None]
    torch.testing.assert_close(v.grad, want)


def nft_batch():
    return TrainBatch(COND, ADV, x0=X0, sigma=T, noise=EPS)


@pytest.mark.parametrize("beta_kl", [0.0, 1e-2])
def test_wraps_nft_as_inner_loss_plus_weighted_penalty(beta_kl):
    pol = LinearPolicy(D, seed=3, perturb=0.3)
    cfg = config({"kind": "nft", "beta_kl": beta_kl}, weight=2.5)
    out = normguard.loss(pol, nft_batch(), cfg)
    inner = nft.loss(pol, nft_batch(), cfg.inner.config)
    xt = (1 - T[:, None]) * X0 + T[:, None] * EPS
    with pol.adapter("train"):
        v = pol.velocity(xt, T, COND, 1.0)
    with pol.adapter(None):
        v_ref = pol.velocity(xt, T, COND, 1.0).detach()
    pen = ((v.square().mean(1).sqrt() - v_ref.square().mean(1).sqrt()).clamp(min=0)).mean()
    want = inner.loss + 2.5 * pen
    torch.testing.assert_close(out.loss, want)
    for a, b in zip(torch.autograd.grad(out.loss, pol.trainable_parameters()),
                    torch.autograd.grad(want, pol.trainable_parameters())):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert out.metrics["norm_penalty"] > 0 and set(inner.metrics) <= set(out.metrics)


def test_reuses_the_inner_base_forward():
    pol = LinearPolicy(D, seed=3, perturb=0.3)
    normguard.loss(pol, nft_batch(), config({"kind": "nft", "beta_kl": 1e-2}))
    with_kl = [a for a, _ in pol.calls].count(None)
    pol.calls.clear()
    normguard.loss(pol, nft_batch(), config({"kind": "nft", "beta_kl": 0.0}))
    assert with_kl == 1 and [a for a, _ in pol.calls].count(None) == 1   # one base forward either way


def test_wraps_grpo_at_every_trained_stored_step():
    pol = LinearPolicy(D, seed=1, perturb=0.3)
    cond = make_cond(B, D, seed=2)
    traj = rollout(pol, cond, torch.randn(B, D, generator=torch.Generator().manual_seed(3)),
                   torch.tensor([1.0, 0.8, 0.55, 0.3]))
    batch = TrainBatch(cond, ADV, traj=traj, steps=[0, 2], kernel=KERNEL_PATH)
    cfg = config({"kind": "grpo", "beta_kl": 0.0}, weight=0.7, power=2.0)
    out = normguard.loss(pol, batch, cfg)
    pen = 0.0
    for j in (0, 2):
        with pol.adapter("train"):
            v = pol.velocity(traj.x[:, j], traj.sigma[:, j], cond)
        with pol.adapter(None):
            v_ref = pol.velocity(traj.x[:, j], traj.sigma[:, j], cond)
        pen = pen + normguard.norm_hinge(v, v_ref, power=2.0).mean() / 2
    want = grpo.loss(pol, batch, cfg.inner.config).loss + 0.7 * pen
    torch.testing.assert_close(out.loss, want)
    for a, b in zip(torch.autograd.grad(out.loss, pol.trainable_parameters()),
                    torch.autograd.grad(want, pol.trainable_parameters())):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_masked_samples_do_not_count():
    pol = LinearPolicy(D, seed=3, perturb=0.3)
    adv = ADV.clone()
    adv[1] = float("nan")
    cfg = config({"kind": "nft", "beta_kl": 0.0})
    full = normguard.loss(pol, TrainBatch(COND, adv, x0=X0, sigma=T, noise=EPS), cfg)
    keep = [0, 2, 3]
    sub = normguard.loss(pol, TrainBatch(COND.select(keep), ADV[keep], x0=X0[keep], sigma=T[keep],
                                         noise=EPS[keep]), cfg)
    torch.testing.assert_close(full.loss, sub.loss)


def test_loop_sees_the_inner_objective():
    cfg = config({"kind": "awr", "temperature": 0.5})
    spec = get_objective("normguard", cfg)
    assert isinstance(spec.TRAINS_ON, InnerSource) and spec.TRAINS_ON.source is FORWARD_PROCESS
    assert not spec.TRAINS_ON.stores_trajectory
    assert spec.old_decay(cfg, 200) == pytest.approx(0.2)                 # awr's "nft" schedule
    adv, groups = torch.tensor([1.0, -1.0, 0.5, 2.0]), torch.tensor([0, 0, 1, 1])
    torch.testing.assert_close(spec.prepare_advantages(adv, groups, cfg),
                               awr.prepare_advantages(adv, groups, cfg.inner.config))
    grpo_cfg = config({"kind": "grpo"})
    grpo_spec = get_objective("normguard", grpo_cfg)
    assert grpo_spec.TRAINS_ON.source is TRAJECTORY_ROWS and grpo_spec.old_decay(grpo_cfg, 200) == 0.0
    state: dict = {}
    spec.end_iteration(None, cfg, state, 3)
    assert state == {"inner": {}}


def test_source_uses_the_inner_config():
    from samplers import KERNELS

    cfg = config({"kind": "nft", "timesteps": {"kind": "permuted", "fraction": 0.5}})
    res = RolloutResult(X0, torch.linspace(1, 0, 5), None, None, 4)
    roll = Rollout(COND, res, 1.0, KERNELS.get("ode"), None, "mean")
    for source in (get_objective("normguard", cfg).TRAINS_ON, DeferredInnerSource()):
        batches = source.batches(roll, ADV, torch.Generator().manual_seed(0), cfg)
        assert len(batches) == 2 and batches[0].x0 is X0            # int(4·0.5) σ columns of the inner Config
    grpo_cfg = config({"kind": "grpo"})
    with pytest.raises(ValueError, match="stored SDE steps"):
        DeferredInnerSource().batches(roll, ADV, torch.Generator(), grpo_cfg)


def test_config_errors_and_yaml():
    with pytest.raises(ConfigError, match="inner.clip_rnage"):
        config({"kind": "grpo", "clip_rnage": 1.0})
    with pytest.raises(ConfigError, match="power"):
        config({"kind": "grpo"}, power=3.0)
    assert normguard.Config().inner.kind == "grpo"
