"""Balancers by hand (weighted sum, GDPO) and MARBLE's simplex QP vs brute force and scipy."""
import math

import numpy as np
import pytest
import torch

from flowrl.balancers import BALANCERS, gdpo, get_balancer, marble, weighted_sum
from flowrl.balancers.advantages import median_advantages
from flowrl.balancers.min_norm import frank_wolfe, min_norm_pair, solve_min_norm
from flowrl.balancers.services import FixedGram, NoServices

NAN = float("nan")
R = torch.tensor([[1.0, 0.0], [3.0, 2.0], [2.0, NAN], [6.0, NAN]], dtype=torch.float64)
G = torch.tensor([0, 0, 1, 1])


def test_registry_lists_and_resolves():
    assert {"weighted_sum", "gdpo", "marble"} <= set(BALANCERS.names())
    spec = get_balancer("gdpo")
    assert spec.balance is gdpo.balance and spec.Config is gdpo.Config


def test_weighted_sum_by_hand():
    a, _ = weighted_sum.balance(R, G, weights=[1.0, 0.5])
    S = np.array([1.0, 4.0, 2.0, 6.0])  # NaN rewards add nothing
    want = np.array([-1.5, 1.5, -2.0, 2.0]) / (S.std() + 1e-4)
    np.testing.assert_allclose(a.numpy(), want)


def test_weighted_sum_all_nan_row():
    a, _ = weighted_sum.balance(torch.tensor([[NAN], [1.0], [2.0]]), torch.tensor([0, 0, 0]))
    assert math.isnan(a[0]) and torch.isfinite(a[1:]).all()


def test_gdpo_by_hand():
    a, _ = gdpo.balance(R, G, weights=[1.0, 2.0])
    s2 = math.sqrt(2)  # unbiased std of {1,3} = √2, of {0,2} = √2, of {2,6} = 2√2
    A1 = np.array([-1 / (s2 + 1e-4), 1 / (s2 + 1e-4), -2 / (2 * s2 + 1e-4), 2 / (2 * s2 + 1e-4)])
    A2 = np.array([-1 / (s2 + 1e-4), 1 / (s2 + 1e-4), 0.0, 0.0])
    S = A1 + 2 * A2
    want = (S - S.mean()) / (S.std(ddof=1) + 1e-4)
    np.testing.assert_allclose(a.numpy(), want)


def test_bad_shapes():
    with pytest.raises(ValueError, match="weights"):
        gdpo.balance(R, G, weights=[1.0])
    with pytest.raises(ValueError, match=r"\(N, K\)"):
        weighted_sum.balance(R[:, 0], G)


def test_min_norm_pair_matches_sener():
    g1, g2 = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 2.0])
    c = min_norm_pair(float(g1 @ g1), float(g1 @ g2), float(g2 @ g2))
    assert c == pytest.approx(0.8)  # ||c g1 + (1−c) g2||² = c² + 4(1−c)² → c = 4/5
    a = solve_min_norm(torch.stack([g1, g2]) @ torch.stack([g1, g2]).T)
    np.testing.assert_allclose(a.numpy(), [0.8, 0.2], atol=1e-9)


def _random_gram(K, D, seed):
    g = torch.randn(K, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return g @ g.T


def _brute(M, K, n):
    """Grid search over the simplex with step 1/n (vectorised)."""
    i, j = np.meshgrid(np.arange(n + 1), np.arange(n + 1) if K == 3 else np.zeros(1), indexing="ij")
    a = np.stack([i / n, 1 - i / n], -1).reshape(-1, 2) if K == 2 else \
        np.stack([i / n, j / n, 1 - (i + j) / n], -1).reshape(-1, 3)
    a = a[(a >= 0).all(1)]
    vals = np.einsum("pk,kl,pl->p", a, M, a)
    return vals.min(), a[vals.argmin()]


@pytest.mark.parametrize("K,seed", [(2, 0), (2, 1), (3, 2), (3, 3), (3, 4)])
@pytest.mark.parametrize("solver", ["exact", "frank_wolfe"])
def test_qp_vs_brute_force(K, seed, solver):
    M = _random_gram(K, 3, seed).numpy()
    best, arg = _brute(M, K, 400)
    a = solve_min_norm(torch.from_numpy(M), solver).numpy()
    assert a.min() >= 0 and a.sum() == pytest.approx(1.0)
    assert a @ M @ a <= best + 1e-9
    assert a @ M @ a == pytest.approx(best, rel=1e-3, abs=1e-6)
    np.testing.assert_allclose(a, arg, atol=5e-3)


@pytest.mark.parametrize("K,D,seed,floor", [(4, 2, 5, 0.0), (5, 8, 6, 0.0), (5, 3, 7, 0.1), (6, 4, 8, 0.0)])
def test_qp_vs_scipy(K, D, seed, floor):
    from scipy.optimize import minimize

    M = _random_gram(K, D, seed).numpy()
    res = minimize(lambda a: 0.5 * a @ M @ a, np.full(K, 1 / K), jac=lambda a: M @ a, method="SLSQP",
                   bounds=[(floor, 1)] * K, constraints=[{"type": "eq", "fun": lambda a: a.sum() - 1}],
                   options={"ftol": 1e-14, "maxiter": 1000})
    for solver in ("exact", "frank_wolfe"):
        a = solve_min_norm(torch.from_numpy(M), solver, floor).numpy()
        assert a.min() >= floor - 1e-9 and a.sum() == pytest.approx(1.0)
        assert 0.5 * a @ M @ a == pytest.approx(res.fun, rel=1e-4, abs=1e-8)


def test_frank_wolfe_conflicting_pair_lands_inside():
    M = torch.tensor([[1.0, -1.0], [-1.0, 1.0]], dtype=torch.float64)  # opposite gradients → α = ½, norm 0
    np.testing.assert_allclose(frank_wolfe(M).numpy(), [0.5, 0.5], atol=1e-9)


def test_marble_asks_for_a_gram_on_its_schedule_and_smooths_alpha():
    Rm = torch.tensor([[1.0, 4.0], [3.0, 0.0], [0.0, 1.0], [2.0, 3.0]], dtype=torch.float64)
    state = {}
    cfg = marble.Config(solve_every=3)
    Ak = torch.stack([(Rm[:, k] - Rm[:, k].view(2, 2).mean(1).repeat_interleave(2)) /
                      (Rm[:, k].std(unbiased=False) + 1e-4) for k in range(2)], 1)
    orth = FixedGram(torch.tensor([[1.0, 0.0], [0.0, 4.0]], dtype=torch.float64))  # cosine Gram = I → ½,½
    a0, d0 = marble.balance(Rm, G, state=state, cfg=cfg, services=orth)
    assert orth.calls == 1 and float(d0["solved"]) == 1.0
    torch.testing.assert_close(state["alpha"], torch.tensor([0.5, 0.5], dtype=torch.float64))
    torch.testing.assert_close(a0, Ak.mean(1))
    for _ in range(2):                                   # calls 1, 2: amortized, no service asked for
        _, d = marble.balance(Rm, G, state=state, cfg=cfg, services=NoServices())
        assert float(d["solved"]) == 0.0
    gram2 = torch.tensor([[1.0, 0.9], [0.9, 4.0]], dtype=torch.float64)
    new = marble.solve_alpha(gram2, cfg)
    a3, d3 = marble.balance(Rm, G, state=state, cfg=cfg, services=FixedGram(gram2))   # call 3: a fresh solve
    want_alpha = 0.7 * torch.tensor([0.5, 0.5], dtype=torch.float64) + 0.3 * new
    torch.testing.assert_close(state["alpha"], want_alpha)
    torch.testing.assert_close(a3, (Ak * want_alpha).sum(1))
    assert float(d3["alpha_0"] + d3["alpha_1"]) == pytest.approx(1.0)


def test_marble_outside_a_trainer_says_what_it_needs():
    Rm = torch.tensor([[1.0, 4.0], [3.0, 0.0], [0.0, 1.0], [2.0, 3.0]], dtype=torch.float64)
    with pytest.raises(RuntimeError, match="reward_gram"):
        marble.balance(Rm, G, state={})


def test_marble_rescaled_and_dead_reward():
    cfg = marble.Config(apply="rescaled")
    gram = torch.diag(torch.tensor([1.0, 4.0, 0.0], dtype=torch.float64))  # reward 2 has no gradient
    a = marble.solve_alpha(gram, cfg)
    # cosine Gram of the live rewards = I → α = ½, ½; rescaled by 1/|g| = (1, ½) → (2/3, 1/3); dead → 0
    torch.testing.assert_close(a, torch.tensor([2 / 3, 1 / 3, 0.0], dtype=torch.float64))


def test_marble_nan_rewards_and_proxy_gram():
    Rm = torch.tensor([[1.0, NAN], [3.0, NAN], [0.0, 1.0], [2.0, 3.0]], dtype=torch.float64)
    A = torch.tensor([[1.0, NAN], [2.0, 1.0]], dtype=torch.float64)
    torch.testing.assert_close(marble.proxy_gram(A, torch.tensor([1.0, 3.0])),
                               torch.tensor([[13.0, 6.0], [6.0, 3.0]], dtype=torch.float64))
    adv, _ = marble.balance(Rm, G, state={}, services=FixedGram(torch.eye(2, dtype=torch.float64)))
    assert torch.isfinite(adv).all()
    with pytest.raises(ValueError, match="gram must be"):
        marble.balance(Rm, G, state={}, services=FixedGram(torch.eye(3)))


def test_mc_grpo_is_the_median_baseline_on_the_weighted_sum_and_drops_the_median():
    R = torch.tensor([[1.0, 0.0], [3.0, 1.0], [0.0, 2.0], [5.0, 5.0], [2.0, 2.0], [9.0, 9.0]], dtype=torch.float64)
    groups = torch.tensor([0, 0, 0, 1, 1, 1])
    w = torch.tensor([1.0, 0.5], dtype=torch.float64)
    spec = get_balancer("mc_grpo")
    adv, diag = spec.balance(R, groups, w, {}, spec.Config(compensate=False))
    S = R @ w                                        # [1, 3.5, 1, 7.5, 3, 13.5]
    want, keep = median_advantages(S, groups, compensate=False)
    torch.testing.assert_close(adv[keep], want[keep])
    assert adv[~keep].isnan().all() and int(diag["dropped_median"]) == 2


def test_mc_grpo_from_yaml(tmp_path):
    from flowrl.config import load_config

    cfg = load_config(None, ["advantage.balancer={kind: mc_grpo, mad_eps: 0.01}"])
    assert cfg.advantage.balancer.kind == "mc_grpo" and cfg.advantage.balancer.config.mad_eps == 0.01
