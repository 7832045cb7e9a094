"""SA-MRPO (SA-GDPO), DARA and GD²PO by hand with numpy (NVlabs/GDPO, zhaihaotian/DARA, Qwen-Applications/GD2PO)."""
import numpy as np
import pytest
import torch

from flowrl.balancers import dara, gd2po, get_balancer, sa_mrpo

R = torch.tensor([[0.2, 1.0], [0.6, 3.0], [1.0, 2.0],
                  [0.1, 5.0], [0.4, 5.0], [0.9, 5.0]], dtype=torch.float64)
G = torch.tensor([0, 0, 0, 1, 1, 1])


def hat(col, eps):
    """Group-normalised advantages with unbiased group std, numpy."""
    out = np.zeros(6)
    for g in (0, 1):
        x = col[3 * g: 3 * g + 3]
        out[3 * g: 3 * g + 3] = (x - x.mean()) / (x.std(ddof=1) + eps)
    return out


def bn(s, eps):
    return (s - s.mean()) / (s.std(ddof=1) + eps)


def test_registry_resolves_all():
    for name in ("sa_mrpo", "dara", "gd2po"):
        assert callable(get_balancer(name).balance)


def test_sa_mrpo_by_hand():
    cfg = sa_mrpo.Config(reward_min=(0.0, 0.0), reward_max=(1.0, 10.0), gamma=2.0)
    a, d = sa_mrpo.balance(R, G, weights=[1.0, 0.5], cfg=cfg)
    Rn = R.numpy()
    s = np.array([Rn[:, 0].mean(), Rn[:, 1].mean() / 10])
    w = np.array([1.0, 0.5]) * (1 - s) ** 2
    S = w[0] * hat(Rn[:, 0], 1e-4) + w[1] * hat(Rn[:, 1], 1e-4)
    np.testing.assert_allclose(a.numpy(), bn(S, 1e-4))
    assert float(d["saturation_1"]) == pytest.approx(s[1])
    with pytest.raises(ValueError, match="reward_min"):
        sa_mrpo.balance(R, G, cfg=sa_mrpo.Config(reward_min=(0.0,), reward_max=(1.0, 1.0)))


@pytest.mark.parametrize("variant", ["asym", "sym"])
def test_dara_by_hand(variant):
    a, d = dara.balance(R, G, cfg=dara.Config(variant=variant))
    Rn = R.numpy()
    h1, h2 = hat(Rn[:, 0], 1e-6), hat(Rn[:, 1], 1e-6)  # reward 2 is flat in group 1 → inactive there
    pi = np.array([1.0, 0.5])
    w = np.minimum(5.0, np.sqrt(pi.max() / pi))
    S = h1 + h2 + (w[1] - 1) * np.maximum(h2, 0) if variant == "asym" else w[0] * h1 + w[1] * h2
    np.testing.assert_allclose(a.numpy(), bn(S, 1e-6))
    assert float(d["density_1"]) == 0.5 and float(d["weight_1"]) == pytest.approx(np.sqrt(2))


def test_dara_weight_cap():
    torch.testing.assert_close(dara.density_weights(torch.tensor([1.0, 0.01, 0.0], dtype=torch.float64), 5.0),
                               torch.tensor([1.0, 5.0, 1.0], dtype=torch.float64))


@pytest.mark.parametrize("mode,tau", [("hard", 0.2), ("ratio", 0.2), ("ratio", 0.0)])
def test_gd2po_by_hand(mode, tau):
    Rc = R.clone()
    Rc[3:, 1] = torch.tensor([1.0, 4.0, 2.0], dtype=torch.float64)
    a, d = gd2po.balance(Rc, G, cfg=gd2po.Config(mode=mode, tau=tau))
    Rn = Rc.numpy()
    A = np.stack([hat(Rn[:, 0], 1e-4), hat(Rn[:, 1], 1e-4)], 1)
    conflict = (A > 1e-8).any(1) & (A < -1e-8).any(1)
    rho = A.sum(1) / (np.abs(A).sum(1) + 1e-8)
    keep = ~conflict if mode == "hard" else ~(conflict & (np.abs(rho) < tau))
    q = np.array([keep[:3].mean()] * 3 + [keep[3:].mean()] * 3)
    S = q * A.sum(1)
    want = np.where(keep, (S - S[keep].mean()) / np.sqrt(S[keep].var(ddof=1) + 1e-8), 0.0)
    np.testing.assert_allclose(a.numpy(), want)
    assert d["keep"].tolist() == keep.tolist()
    if mode == "hard":
        assert conflict.any() and not keep.all()
    if tau == 0.0:
        assert keep.all()  # |ρ| < 0 never holds


def test_nan_reward_masked_in_llm_balancers():
    Rn = R.clone()
    Rn[0, 1] = float("nan")
    for mod in (sa_mrpo, dara, gd2po):
        a, _ = mod.balance(Rn, G)
        assert torch.isfinite(a).all(), mod.__name__
