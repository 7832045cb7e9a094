"""PCGrad from the Gram alone equals direct PCGrad on explicit vectors (Yu et al. 2020, Algorithm 1), and the
balancer's one-backward advantage reproduces PCGrad's direction through an affine objective (MARBLE's trick)."""
import copy
import sys
from pathlib import Path

import pytest
import torch

from flowrl.balancers import get_balancer, pcgrad
from flowrl.balancers.services import FixedGram, NoServices
from samplers.rng import derived_generator

sys.path.insert(0, str(Path(__file__).parents[1] / "objectives"))
from objectives_fakes import LinearPolicy, make_cond  # noqa: E402

from flowrl.objectives import TrainBatch, nft  # noqa: E402


def direct_projected(g: torch.Tensor, orders: list[list[int]]) -> torch.Tensor:
    """Algorithm 1 on the vectors themselves: each g_i projected sequentially, (K, D)."""
    out = []
    for i in range(g.shape[0]):
        gi = g[i].clone()
        for j in orders[i]:
            dot = gi @ g[j]
            if dot < 0:
                gi = gi - dot / (g[j] @ g[j]) * g[j]
        out.append(gi)
    return torch.stack(out)


def direct_pcgrad(g: torch.Tensor, orders: list[list[int]]) -> torch.Tensor:
    """PCGrad's update g = Σ_i g_i'."""
    return direct_projected(g, orders).sum(0)


def vectors(K, D, seed):
    return torch.randn(K, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("K,D,seed", [(2, 3, 0), (3, 2, 1), (4, 5, 2), (5, 3, 3), (6, 8, 4)])
def test_coefficients_reproduce_direct_pcgrad(K, D, seed):
    g = vectors(K, D, seed)
    g[0] = -0.7 * g[1] + 0.1 * g[0]                         # at least one strong conflict
    orders = pcgrad.random_orders(K, derived_generator(seed, namespace="test"))
    C, n = pcgrad.pcgrad_coefficients(g @ g.T, orders)
    assert n >= 1
    torch.testing.assert_close(C @ g, direct_projected(g, orders), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(C.sum(0) @ g, direct_pcgrad(g, orders), rtol=1e-10, atol=1e-10)
    for i in range(K):                 # each projected g_i' no longer conflicts with the last task it met
        if orders[i]:
            assert float((C[i] @ g) @ g[orders[i][-1]]) >= -1e-10


def test_two_opposite_gradients_cancel_and_orthogonal_ones_stay():
    g = torch.tensor([[1.0, 0.0], [-2.0, 0.0]], dtype=torch.float64)
    C, _ = pcgrad.pcgrad_coefficients(g @ g.T, [[1], [0]])
    torch.testing.assert_close(C.sum(0) @ g, torch.zeros(2, dtype=torch.float64))   # g1' = 0, g2' = 0
    h = torch.tensor([[1.0, 0.0], [0.0, 3.0]], dtype=torch.float64)
    C, n = pcgrad.pcgrad_coefficients(h @ h.T, [[1], [0]])
    assert n == 0 and torch.equal(C, torch.eye(2, dtype=torch.float64))


def test_order_matters_and_comes_from_the_state():
    g = torch.tensor([[1.0, 0.0], [-0.6, 0.8], [-0.6, -0.8]], dtype=torch.float64)   # three mutual conflicts
    dirs = {tuple(direct_pcgrad(g, o).round(decimals=9).tolist())
            for o in ([[1, 2], [0, 2], [0, 1]], [[2, 1], [2, 0], [1, 0]])}
    assert len(dirs) == 2                                    # the sequential projection depends on the order
    R = torch.randn(6, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    state = {}
    for _ in range(3):
        pcgrad.balance(R, groups, state=state, services=FixedGram(g @ g.T))
    resumed = copy.deepcopy(state)     # a checkpoint: the next call draws the same orders
    a1, d1 = pcgrad.balance(R, groups, state=state, services=FixedGram(g @ g.T))
    a2, d2 = pcgrad.balance(R, groups, state=resumed, services=FixedGram(g @ g.T))
    assert torch.equal(a1, a2) and torch.equal(state["coef"], resumed["coef"])
    orders = pcgrad.random_orders(3, derived_generator(0, 3, namespace="flowrl-pcgrad"))
    direct = direct_pcgrad(g, orders)
    torch.testing.assert_close(state["coef"] @ g * state["scale"], direct)


def test_balance_mixes_normalised_coefficients_and_reports_scale():
    R = torch.tensor([[1.0, 4.0], [3.0, 0.0], [0.0, 1.0], [2.0, float("nan")]], dtype=torch.float64)
    groups = torch.tensor([0, 0, 1, 1])
    g = torch.tensor([[1.0, 0.0], [-1.0, 1.0]], dtype=torch.float64)
    state = {}
    adv, diag = pcgrad.balance(R, groups, state=state, services=FixedGram(g @ g.T))
    # g1' = g1 + ½ g2 (projected off g2, |g2|² = 2), g2' = g2 + g1: c = (2, 1.5), s = 3.5
    torch.testing.assert_close(state["coef"], torch.tensor([2 / 3.5, 1.5 / 3.5], dtype=torch.float64))
    assert float(diag["scale"]) == pytest.approx(3.5) and float(diag["projections"]) == 2
    A_k = torch.nan_to_num(pcgrad.per_reward_advantages(R, groups, std="global", unbiased=False))
    torch.testing.assert_close(adv, A_k @ state["coef"])
    assert float(diag["alpha_0"] + diag["alpha_1"]) == pytest.approx(1.0)


def test_static_weights_scale_gradients_before_surgery():
    g = vectors(3, 4, 7)
    w = torch.tensor([1.0, 0.5, 2.0], dtype=torch.float64)
    orders = [[1, 2], [2, 0], [0, 1]]
    coef, s, _ = pcgrad.solve_coefficients(g @ g.T, w, orders)
    torch.testing.assert_close(coef @ g * s, direct_pcgrad(w[:, None] * g, orders))


def test_amortized_schedule_and_errors():
    R = torch.randn(4, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    groups = torch.tensor([0, 0, 1, 1])
    state, cfg = {}, pcgrad.Config(solve_every=2)
    fixed = FixedGram(torch.eye(2, dtype=torch.float64))
    pcgrad.balance(R, groups, state=state, cfg=cfg, services=fixed)
    _, d = pcgrad.balance(R, groups, state=state, cfg=cfg, services=NoServices())    # reuses the coefficients
    assert fixed.calls == 1 and float(d["solved"]) == 0.0
    with pytest.raises(RuntimeError, match="reward_gram"):
        pcgrad.balance(R, groups, state={}, services=NoServices())
    with pytest.raises(ValueError, match="weights"):
        pcgrad.balance(R, groups, weights=[1.0, -1.0], state={}, services=fixed)
    with pytest.raises(ValueError, match="solve_every"):
        pcgrad.Config(solve_every=0)
    assert get_balancer("pcgrad").balance is pcgrad.balance


def test_one_backward_gives_pcgrad_direction_through_nft():
    """∇L_NFT(Σ c̄_k A_k) = (1/s)·PCGrad(∇L(A_1), …, ∇L(A_K)): the constant term comes out once."""
    B, D, K = 6, 5, 3
    gen = torch.Generator().manual_seed(30)
    x0, eps = torch.randn(B, D, generator=gen), torch.randn(B, D, generator=gen)
    t = torch.rand(B, generator=gen) * 0.8 + 0.1
    cond = make_cond(B, D, seed=31)
    R = torch.randn(B, K, generator=gen, dtype=torch.float64)
    R[:, 2] = -R[:, 0] + 0.3 * R[:, 2]                       # reward 2 pulls against reward 0
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    cfg = nft.Config(beta=0.1)

    def grad(adv):
        pol = LinearPolicy(D, seed=32, perturb=0.1)
        out = nft.loss(pol, TrainBatch(cond, adv.float(), x0=x0, sigma=t, noise=eps), cfg).loss
        return torch.cat([x.flatten() for x in torch.autograd.grad(out, pol.trainable_parameters())]).double()

    A_k = torch.nan_to_num(pcgrad.per_reward_advantages(R, groups, std="global", unbiased=False))
    gk = torch.stack([grad(A_k[:, k]) for k in range(K)])
    state = {}
    adv, diag = pcgrad.balance(R, groups, state=state, services=FixedGram(gk @ gk.T))
    orders = pcgrad.random_orders(K, derived_generator(0, 0, namespace="flowrl-pcgrad"))
    direct = direct_pcgrad(gk, orders)
    assert float(diag["projections"]) >= 1
    torch.testing.assert_close(grad(adv) * float(diag["scale"]), direct, rtol=1e-4, atol=1e-6)


def test_a_vanishing_gradient_is_not_projected_onto():
    from flowrl.balancers.pcgrad import pcgrad_coefficients

    g = torch.tensor([[1.0, 0.0], [-1e-38, 1e-40]], dtype=torch.float64)    # g_1 opposes g_0 but is ~0
    C, n = pcgrad_coefficients(g @ g.T, [[1], [0]])
    assert torch.isfinite(C).all() and float(C.abs().max()) <= 1.0 + 1e-12
