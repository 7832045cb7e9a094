"""Conflict diagnostics of the advantage stage (cos of each reward's gradient with the applied update,
MARBLE's measurement) against direct gradients, and every balancer's ``alpha_<k>`` effective weights."""
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from flowrl.balancers import dara, gd2po, gdpo, get_balancer, marble, sa_mrpo, weighted_sum
from flowrl.balancers.services import FixedGram
from flowrl.objectives import TrainBatch, get_objective
from flowrl.training.advantage import AdvantageStage, update_cosines

sys.path.insert(0, str(Path(__file__).parents[1] / "objectives"))
from objectives_fakes import LinearPolicy, make_cond  # noqa: E402

B, D, K = 6, 5, 2
gen = torch.Generator().manual_seed(40)
X0, EPS = torch.randn(B, D, generator=gen), torch.randn(B, D, generator=gen)
T = torch.rand(B, generator=gen) * 0.8 + 0.1
COND = make_cond(B, D, seed=41)
NFT = get_objective("nft")
OCFG = NFT.Config(beta=0.1)


class DirectGradients:
    """A ``reward_gram`` service on the linear fake policy: the real per-column NFT gradients, kept."""

    def __init__(self):
        self.pol = LinearPolicy(D, seed=42, perturb=0.1)
        self.calls, self.grads = 0, None

    def grad(self, adv):
        keep = torch.isfinite(adv)
        batch = TrainBatch(COND, torch.nan_to_num(adv).float(), x0=X0, sigma=T, noise=EPS, mask=keep)
        out = NFT.loss(self.pol, batch, OCFG).loss
        grads = torch.autograd.grad(out, self.pol.trainable_parameters())
        return torch.cat([g.flatten() for g in grads]).double()

    def reward_gram(self, A):
        self.calls += 1
        self.grads = torch.stack([self.grad(A[:, k]) for k in range(A.shape[1])])
        return self.grads @ self.grads.T


def stage(name="weighted_sum", every=1, weights=(1.0, 1.0), state=None):
    spec = get_balancer(name)
    return AdvantageStage(spec, spec.Config(), torch.tensor(weights), NFT, OCFG, {} if state is None else
                          state, prompts_per_iter=2, group_size=3, diagnose_every=every,
                          reward_names=["count", "ink"])


def test_update_cosines_from_the_gram():
    g = torch.randn(4, 7, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    g[1] = 0.0                                               # a reward with no gradient on the micro-batch
    cos = update_cosines(g @ g.T)
    want = F.cosine_similarity(g[:3], g[3:].expand(3, -1), dim=1)
    torch.testing.assert_close(cos[[0, 2]], want[[0, 2]])
    assert torch.isnan(cos[1])


@pytest.mark.parametrize("name", ["weighted_sum", "gdpo", "pcgrad"])
def test_stage_cosines_equal_direct_gradients(name):
    R = torch.tensor([[1.0, 0.9], [0.0, 0.1], [0.5, 0.2], [0.2, 0.8], [0.9, 0.1], [0.4, 0.6]])
    R[:, 1] = 1.0 - R[:, 0] + 0.1 * R[:, 1]                  # the two rewards pull against each other
    services = DirectGradients()
    adv, metrics = stage(name).run(R, services, iteration=0)
    g = services.grads
    cos = F.cosine_similarity(g[:K], g[K:].expand(K, -1), dim=1)
    torch.testing.assert_close(torch.tensor([metrics["balance/cos_count"], metrics["balance/cos_ink"]],
                                            dtype=torch.float64), cos)
    torch.testing.assert_close(g[K], services.grad(adv))    # the last column is the applied update
    A_k = marble.reward_advantages(R, torch.tensor([0, 0, 0, 1, 1, 1]))
    torch.testing.assert_close(g[0], services.grad(A_k[:, 0]))
    assert metrics["balance/neg_cos_any"] == float((cos < 0).any())
    assert metrics["balance/cos_min"] == pytest.approx(float(cos.min()))
    assert metrics["balance/diagnose_s"] >= 0


def test_diagnostics_follow_the_schedule_and_leave_advantages_alone():
    R = torch.rand(6, 2, generator=torch.Generator().manual_seed(3))
    plain, diagnosed = stage(every=0), stage(every=2)
    services = DirectGradients()
    for it in range(4):
        a0, m0 = plain.run(R, services, iteration=it)
        a1, m1 = diagnosed.run(R, services, iteration=it)
        assert torch.equal(a0, a1)
        assert ("balance/neg_cos_any" in m1) == (it % 2 == 0) and "balance/neg_cos_any" not in m0
    assert services.calls == 2
    no_iteration = stage(every=3)                            # without an iteration the stage counts its calls
    hits = ["balance/neg_cos_any" in no_iteration.run(R, services)[1] for _ in range(4)]
    assert hits == [True, False, False, True]
    with pytest.raises(ValueError, match="diagnose_every"):
        stage(every=-1)


def test_unnamed_rewards_and_a_reward_absent_from_the_micro_batch():
    nan = float("nan")
    R = torch.tensor([[1.0, nan], [0.0, nan], [0.5, nan], [0.2, nan], [0.9, nan], [0.4, nan]])
    spec = get_balancer("gdpo")
    st = AdvantageStage(spec, spec.Config(), torch.ones(2), NFT, OCFG, {}, prompts_per_iter=2, group_size=3,
                        diagnose_every=1)
    _, metrics = st.run(R, DirectGradients(), iteration=0)
    assert "balance/cos_0" in metrics and "balance/cos_1" not in metrics   # no gradient, no cosine
    assert metrics["balance/neg_cos_any"] == 0.0


R4 = torch.tensor([[0.1, 2.0], [0.5, 0.0], [0.9, 4.0], [0.3, 1.0], [0.6, 3.0], [0.2, 2.0]],
                  dtype=torch.float64)
G4 = torch.tensor([0, 0, 0, 1, 1, 1])


def test_weighted_sum_alpha_is_the_weight_on_standardised_advantages():
    w = torch.tensor([2.0, 0.5], dtype=torch.float64)
    adv, diag = weighted_sum.balance(R4, G4, weights=w)
    s = R4.std(0, unbiased=False)
    alpha = torch.tensor([float(diag["alpha_0"]), float(diag["alpha_1"])], dtype=torch.float64)
    torch.testing.assert_close(alpha, w * s / (w * s).sum(), rtol=1e-6, atol=0)
    means = R4.view(2, 3, 2).mean(1).repeat_interleave(3, 0)
    A_hat = (R4 - means) / s                                  # (R_k − mean_group R_k)/s_k
    mixed = A_hat @ alpha                                     # the same direction as the weighted sum's A
    assert float(F.cosine_similarity(mixed, adv, dim=0)) == pytest.approx(1.0, abs=1e-6)


def test_other_balancers_report_normalised_alpha():
    w = [3.0, 1.0]
    for mod in (gdpo, gd2po):
        _, d = mod.balance(R4, G4, weights=w)
        assert float(d["alpha_0"]) == pytest.approx(0.75) and float(d["alpha_1"]) == pytest.approx(0.25)
    _, d = sa_mrpo.balance(R4, G4, weights=w)
    assert float(d["alpha_0"]) == pytest.approx(float(d["weight_0"]) / float(d["weight_0"] + d["weight_1"]))
    _, d = dara.balance(R4, G4, weights=w, cfg=dara.Config(variant="sym"))
    wd = torch.tensor([float(d["weight_0"]) * 3, float(d["weight_1"])])
    assert float(d["alpha_0"]) == pytest.approx(float(wd[0] / wd.sum()))
    _, d = dara.balance(R4, G4, weights=w)                   # asym: no single weight per reward
    assert "alpha_0" not in d
    _, d = marble.balance(R4, G4, state={}, services=FixedGram(torch.eye(2, dtype=torch.float64)))
    assert float(d["alpha_0"] + d["alpha_1"]) == pytest.approx(1.0)
