"""MARBLE's amortized step is exact for the affine-in-A objectives (MARBLE ``train.py`` "Amortized MGDA"): with Σα = 1,
∇L(Σ_k α_k A_k) = Σ_k α_k ∇L(A_k); with apply="rescaled" that gradient points along the min-norm element."""
import pytest
import torch
from objectives_fakes import LinearPolicy, make_cond

from flowrl.balancers import marble
from flowrl.balancers.services import FixedGram
from flowrl.objectives import TrainBatch, awm, awr, nft

B, D, K = 6, 5, 3
gen = torch.Generator().manual_seed(20)
X0, EPS = torch.randn(B, D, generator=gen), torch.randn(B, D, generator=gen)
T = torch.rand(B, generator=gen) * 0.8 + 0.1
COND = make_cond(B, D, seed=21)
R = torch.randn(B, K, generator=gen, dtype=torch.float64)
G = torch.tensor([0, 0, 0, 1, 1, 1])


def test_gradient_gram_matches_direct_per_reward_gradients():
    pol = LinearPolicy(D, seed=22, perturb=0.1)
    A_k = marble.reward_advantages(R, G).float()
    A_k[0, 1] = float("nan")  # reward 1 does not apply to sample 0: masked in its loss

    def loss_of(adv, mask):
        return nft.loss(pol, TrainBatch(COND, adv, x0=X0, sigma=T, noise=EPS, mask=mask), nft.Config()).loss

    gram = marble.gradient_gram(loss_of, A_k, pol.trainable_parameters(), reduce=lambda g: 2 * g)
    rows = []
    for k in range(K):
        keep = torch.isfinite(A_k[:, k])
        idx = torch.nonzero(keep).flatten()
        sub = TrainBatch(COND.select(idx), A_k[idx, k], x0=X0[idx], sigma=T[idx], noise=EPS[idx])
        gs = torch.autograd.grad(nft.loss(pol, sub, nft.Config()).loss, pol.trainable_parameters())
        rows.append(2 * torch.cat([g.flatten() for g in gs]).double())
    g = torch.stack(rows)
    torch.testing.assert_close(gram, g @ g.T, rtol=1e-5, atol=1e-8)


def grad(mod, cfg, adv):
    pol = LinearPolicy(D, seed=22, perturb=0.1)
    out = mod.loss(pol, TrainBatch(COND, adv.float(), x0=X0, sigma=T, noise=EPS), cfg).loss
    return torch.cat([g.flatten() for g in torch.autograd.grad(out, pol.trainable_parameters())]).double()


@pytest.mark.parametrize("mod,cfg", [(nft, nft.Config(beta=0.1)), (awr, awr.Config()), (awm, awm.Config())],
                         ids=["nft", "awr", "awm"])
@pytest.mark.parametrize("apply", ["raw", "rescaled"])
def test_amortized_gradient_is_alpha_mix(mod, cfg, apply):
    mcfg = marble.Config(apply=apply)
    A_k = torch.nan_to_num(marble.reward_advantages(R, G, mcfg))
    gk = torch.stack([grad(mod, cfg, A_k[:, k]) for k in range(K)])
    state = {}
    adv, diag = marble.balance(R, G, state=state, cfg=mcfg, services=FixedGram(gk @ gk.T))
    alpha = state["alpha"]
    assert alpha.sum().item() == pytest.approx(1.0)
    mixed = torch.stack([diag[f"alpha_{k}"] for k in range(K)]).double()
    g_comb = grad(mod, cfg, adv)
    torch.testing.assert_close(g_comb, (mixed[:, None] * gk).sum(0), rtol=1e-4, atol=1e-6)
    if apply == "rescaled":  # ∝ Σ α_k ĝ_k, the min-norm element of the normalised gradients
        ghat = gk / gk.norm(dim=1, keepdim=True)
        direction = (marble.solve_min_norm(ghat @ ghat.T, "exact")[:, None] * ghat).sum(0)
        cos = torch.nn.functional.cosine_similarity(g_comb, direction, dim=0)
        assert cos.item() == pytest.approx(1.0, abs=1e-5)
