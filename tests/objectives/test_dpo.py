"""Diffusion-DPO (flow form) on tensors: the reference's checks — ln 2 at θ = ref, the gradient formula, swap
antisymmetry, identical arms, β → 0 — and the pairing rules."""
import math

import pytest
import torch
from objectives_fakes import LinearPolicy, make_cond

from flowrl.objectives import TrainBatch, get_objective
from flowrl.objectives.dpo import Config, dpo_terms, loss, prepare_advantages
from flowrl.objectives.pairs import PAIRED_FORWARD, form_pairs
from flowrl.objectives.sources import Rollout
from flowrl.training.update import pack, unit_rows
from flowrl.types import RolloutResult

P, D = 3, 6
g = torch.Generator().manual_seed(0)
XW, XL, EPS = torch.randn(P, D, generator=g), torch.randn(P, D, generator=g), torch.randn(P, D, generator=g)
SIG = torch.tensor([0.8, 0.5, 0.2])
COND = make_cond(2 * P, D, seed=1, cfg=False)
ROLES = torch.cat([torch.ones(P), -torch.ones(P)])


def batch(xw=XW, xl=XL):
    return TrainBatch(COND, ROLES, x0=torch.cat([xw, xl]), sigma=torch.cat([SIG, SIG]), noise=torch.cat([EPS, EPS]))


def at_ref():
    pol = LinearPolicy(D, seed=2)
    with torch.no_grad():
        pol.dW.zero_()
        pol.db.zero_()
    return pol


def errors(pol, b, adapter="train"):
    """e(v) per row, written out: x_σ = (1−σ)x0 + σε, u = ε − x0."""
    s = b.sigma[:, None]
    xt = (1 - s) * b.x0 + s * b.noise
    with pol.adapter(adapter):
        v = pol.velocity(xt, b.sigma, b.cond, 1.0)
    return ((v - (b.noise - b.x0)) ** 2).mean(1)


def test_defaults_and_registry():
    spec = get_objective("dpo")
    c = spec.Config()
    assert spec.TRAINS_ON is PAIRED_FORWARD and PAIRED_FORWARD.together == "group"
    assert (c.beta, c.pairs, c.samples_per_pair, c.sigma_range, c.old_update) == (2000.0, "best_worst", 1, 0.99,
                                                                                   "on_policy")
    with pytest.raises(ValueError, match="pairs must be one of"):
        Config(pairs="random")


def test_at_reference_loss_is_ln2_and_gradient_is_beta_quarter():
    pol, beta = at_ref(), 50.0
    out = loss(pol, batch(), Config(beta=beta))
    torch.testing.assert_close(out.loss, torch.tensor(math.log(2.0)))
    assert float(out.metrics["implicit_acc"]) == 0.0 and float(out.metrics["reward_chosen"]) == 0.0
    grad = torch.autograd.grad(out.loss, pol.trainable_parameters())
    e = errors(pol, batch())
    want = torch.autograd.grad(beta / 4 * (e[:P] - e[P:]).mean(), pol.trainable_parameters())
    for a, b in zip(grad, want):
        torch.testing.assert_close(a, b)


def test_gradient_formula_away_from_reference():
    pol, beta = LinearPolicy(D, seed=3, perturb=0.2), 20.0
    out = loss(pol, batch(), Config(beta=beta))
    e, ref = errors(pol, batch()), errors(pol, batch(), None).detach()
    z = -beta / 2 * ((e[:P] - ref[:P]) - (e[P:] - ref[P:]))
    torch.testing.assert_close(out.loss, -torch.nn.functional.logsigmoid(z).mean())
    want = torch.autograd.grad((beta / 2 * torch.sigmoid(-z.detach()) * (e[:P] - e[P:])).mean(),
                               pol.trainable_parameters())
    for a, b in zip(torch.autograd.grad(out.loss, pol.trainable_parameters()), want):
        torch.testing.assert_close(a, b)


def test_swap_antisymmetry():
    ew, el, rw, rl = torch.rand(5), torch.rand(5), torch.rand(5), torch.rand(5)
    fwd, back = dpo_terms(ew, el, rw, rl, 7.0), dpo_terms(el, ew, rl, rw, 7.0)
    torch.testing.assert_close(fwd["loss"] - back["loss"], -fwd["z"])


def test_identical_arms_through_the_source_give_zero_gradient():
    """The paired source shares σ and ε within a pair, so x0^w = x0^l makes the two errors equal for any θ."""
    pol = LinearPolicy(D, seed=4, perturb=0.3)
    x0 = torch.cat([XW, XW])                               # rows i and i + P are the same image
    groups = torch.arange(P).repeat(2)
    cond = make_cond(P, D, cfg=False).select(torch.arange(P).repeat(2))    # a pair shares its prompt
    ro = Rollout(cond, RolloutResult(x0, torch.linspace(1, 0, 5)), 1.0, None, None, "mean",
                 {"group": groups}, torch.arange(2 * P))
    adv = torch.cat([torch.ones(P), -torch.ones(P)])
    (b,) = PAIRED_FORWARD.batches(ro, adv, torch.Generator().manual_seed(0), Config())
    assert torch.equal(b.sigma[:P], b.sigma[P:]) and torch.equal(b.noise[:P], b.noise[P:])
    out = loss(pol, b, Config(beta=100.0))
    torch.testing.assert_close(out.loss, torch.tensor(math.log(2.0)))
    for grad in torch.autograd.grad(out.loss, pol.trainable_parameters()):   # zero up to float32 rounding
        assert float(grad.abs().max()) < 1e-5


def test_beta_to_zero():
    pol = LinearPolicy(D, seed=5, perturb=0.2)
    norms = []
    for beta in (1e-3, 1e-4):
        out = loss(pol, batch(), Config(beta=beta))
        assert abs(float(out.loss.detach()) - math.log(2.0)) < 10 * beta
        norms.append(sum(float(t.norm()) for t in torch.autograd.grad(out.loss, pol.trainable_parameters())))
    assert norms[0] / norms[1] == pytest.approx(10.0, rel=1e-3)          # linear in β


def test_pairing_rules():
    s, gid = torch.tensor([3.0, 1.0, 2.0, 5.0]), torch.zeros(4, dtype=torch.long)
    w, lo = form_pairs(s, gid, "best_worst")
    assert (w.tolist(), lo.tolist()) == ([3], [1])
    w, lo = form_pairs(s, gid, "all_pairs")
    assert len(w) == 6 and all(s[a] > s[b] for a, b in zip(w, lo))
    tie = torch.tensor([1.0, 1.0, 0.5, 1.0])               # best_worst: the first max vs the last min
    assert [t.tolist() for t in form_pairs(tie, gid, "best_worst")] == [[0], [2]]
    assert len(form_pairs(tie, gid, "all_pairs")[0]) == 3   # strict pairs only
    assert [t.tolist() for t in form_pairs(torch.ones(4), gid)] == [[0], [3]]    # all tied: first vs last
    assert form_pairs(torch.ones(4), gid, "all_pairs")[0].numel() == 0
    out = prepare_advantages(torch.tensor([3.0, 1.0, 2.0, 5.0, 0.1, 0.2]), torch.tensor([0, 0, 0, 0, 1, 1]))
    assert torch.isnan(out[[0, 2]]).all() and torch.isfinite(out[[1, 3, 4, 5]]).all()
    with pytest.raises(ValueError, match="group_size >= 2"):
        prepare_advantages(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 0, 1]))


def test_groups_stay_in_one_micro_batch():
    idx = torch.tensor([0, 1, 4, 5, 6, 7])
    units = unit_rows(idx, torch.tensor([0, 0, 2, 2, 3, 3]))
    assert [u.tolist() for u in units] == [[0, 1], [4, 5], [6, 7]]
    assert [m.tolist() for m in pack(units, 3)] == [[0, 1], [4, 5], [6, 7]]
    assert [m.tolist() for m in pack(unit_rows(idx, None), 4)] == [[0, 1, 4, 5], [6, 7]]
