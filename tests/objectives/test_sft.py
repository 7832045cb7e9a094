"""SFT / RAFT on tensors: the top-k rule, and RAFT's gradient = 1/K × SFT's on the winner alone."""
import pytest
import torch
from objectives_fakes import LinearPolicy, make_cond

from flowrl.objectives import TrainBatch, get_objective
from flowrl.objectives.pairs import LOGIT_NORMAL_FORWARD
from flowrl.objectives.sft import Config, loss, prepare_advantages, top_k_mask

K, D = 4, 5
g = torch.Generator().manual_seed(0)
X0, EPS = torch.randn(K, D, generator=g), torch.randn(K, D, generator=g)
SIG = torch.tensor([0.9, 0.6, 0.4, 0.1])
COND = make_cond(K, D, seed=2, cfg=False)


def test_defaults():
    spec = get_objective("sft")
    assert spec.TRAINS_ON is LOGIT_NORMAL_FORWARD
    c = spec.Config()
    assert (c.top_k, c.sigma_range, c.old_update) == (1, 0.99, "on_policy")
    with pytest.raises(ValueError, match="top_k must be > 0"):
        Config(top_k=0)


def test_top_k_rule():
    s = torch.tensor([0.2, 0.9, 0.5, 0.9, 1.0, 0.0, float("nan"), 0.3])
    gid = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    assert top_k_mask(s, gid, 1)[:4].tolist() == [0, 1, 0, 1]          # ties at the top are all kept
    out = top_k_mask(s, gid, 2)
    assert out[[4, 5, 7]].tolist() == [1, 0, 1] and torch.isnan(out[6])
    assert prepare_advantages(s, gid, Config(top_k=1)).tolist()[:4] == [0, 1, 0, 1]


def test_raft_gradient_is_one_over_k_of_sft_on_the_winner():
    pol = LinearPolicy(D, seed=1, perturb=0.1)
    adv = torch.tensor([0.0, 0.0, 1.0, 0.0])                            # one-hot argmax of the group
    raft = loss(pol, TrainBatch(COND, adv, x0=X0, sigma=SIG, noise=EPS)).loss
    w = torch.tensor([2])
    sft = loss(pol, TrainBatch(COND.select(w), torch.ones(1), x0=X0[w], sigma=SIG[w], noise=EPS[w])).loss
    torch.testing.assert_close(raft, sft / K)
    for a, b in zip(torch.autograd.grad(raft, pol.trainable_parameters()),
                    torch.autograd.grad(sft, pol.trainable_parameters())):
        torch.testing.assert_close(a, b / K)


def test_sft_is_the_flow_matching_loss():
    pol = LinearPolicy(D, seed=3)
    out = loss(pol, TrainBatch(COND, torch.ones(K), x0=X0, sigma=SIG, noise=EPS))
    xt = (1 - SIG[:, None]) * X0 + SIG[:, None] * EPS
    with pol.adapter("train"):
        v = pol.velocity(xt, SIG, COND, 1.0)
    torch.testing.assert_close(out.loss, ((v - (EPS - X0)) ** 2).mean())
